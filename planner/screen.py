"""A cheap analytic steady-state estimate of a deployment under a workload (the search's screen).

From the step time of the decode and prefill instances at their steady-state batch it estimates
TPOT, tokens/s per user, TTFT, throughput per GPU, and whether prefill capacity keeps up. It
prices a handful of steps (memoized across calls) instead of simulating thousands, so it is
~100x cheaper than `simulate` and much rougher: it ignores DP and expert imbalance, variance of
lengths and of queues. The search only uses it to decide which points to simulate; its numbers
are never reported as a plan's metrics.

Steady state: X requests/s. Decode holds X x output x TPOT requests (Little's law), spread over
its ranks; TPOT is the step time at that batch over the tokens a step yields. Prefill serves
X x uncached tokens/s against its capacity at full chunks, with an M/D/1 queueing delay. Closed
loop: X solves users = X x (TTFT + output x TPOT + think time); open loop: X is the rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.calibration.serving import ServingOverhead
from simulator.cost.step import Batch, Instance, step_time
from simulator.des.prefix_cache import BLOCK_TOKENS
from simulator.des.pricing import instance_key
from simulator.des.replay import load_corpus
from simulator.des.sessions import SessionTrace
from simulator.resolve import Resolved
from simulator.specs.errors import SpecError
from simulator.specs.routing import POLICIES
from simulator.specs.workload import ClosedArrival, SessionsArrival, TraceArrival, Workload

SATURATED_TTFT_MS = 1e7
"""TTFT reported when an open-loop rate exceeds the deployment's capacity (queues grow)."""


@dataclass(frozen=True)
class Traffic:
    """Per-request means of a workload, as its steady state sees them."""

    prompt: float
    """Prompt tokens (cached and uncached)."""
    session_cached: float
    """Tokens of the prompt that the session's previous turn left in a prefix cache."""
    hit_rate: float
    """Share of a prompt served from cache for requests outside sessions."""
    output: float
    """Output tokens."""
    think_s: float
    """Think time after a request (none after a session's last turn)."""
    users: int | None
    """Closed loop: requests in flight or thinking; None for open loop."""
    rate: float | None
    """Open loop: requests per second; None for closed loop."""

    def cached(self, places: int, policy: str) -> float:
        """Cached prompt tokens when requests spread over `places` prefix caches: a router that
        knows where KV lives sends a session's turn to its previous turn's cache; any other
        finds it there about 1/places of the time."""
        if self.session_cached:
            if POLICIES[policy].uses_prefix:
                return self.session_cached
            return self.session_cached / max(places, 1)
        return self.hit_rate * self.prompt


def traffic(workload: Workload) -> Traffic:
    """The steady-state means of `workload`; SpecError for what the screen cannot read (traces,
    isolated-role modes)."""
    if isinstance(workload.arrival, TraceArrival):
        raise SpecError("the screen cannot estimate trace arrivals; search without screening")
    if workload.mode != "serve":
        raise SpecError(f"search needs workload mode 'serve', not {workload.mode!r}")
    a = workload.arrival
    if isinstance(a, SessionsArrival):
        return _session_traffic(a, load_corpus(a, workload.seed))
    new, out = workload.input_tokens.mean, workload.output_tokens.mean
    users = a.concurrency if isinstance(a, ClosedArrival) else None
    rate = None if isinstance(a, ClosedArrival) else float(a.rate)
    s = workload.sessions
    if s is None:
        return Traffic(new, 0.0, workload.prefix_hit_rate, out, 0.0, users, rate)
    prompts = [k * (new + out) + new for k in range(s.turns)]
    cached = [0.0] + [max(p - BLOCK_TOKENS / 2, 0.0) for p in prompts[:-1]]
    return Traffic(float(np.mean(prompts)), float(np.mean(cached)), 0.0, out,
                   s.think_time_s * (s.turns - 1) / s.turns, users, rate)


def _session_traffic(a: SessionsArrival, corpus: list[SessionTrace]) -> Traffic:
    """Means over every turn of the corpus (the measured mix of lanes replaying it): the cached
    part is what the agent's previous turn left (its whole prompt but the last partial block);
    users are the lanes times the requests a tree keeps in flight or thinking, from the
    recorded service and think times over the root's span."""
    prompts, cached, outs, thinks = [], [], [], []
    busy = span = 0.0
    for trace in corpus:
        block = trace.block_tokens
        span += max(trace.root.turns[-1].t_s + (trace.root.turns[-1].api_s or 0.0), 1e-3)
        for agent in trace.agents:
            before = 0
            for turn in agent.turns:
                prompts.append(turn.input_len)
                cached.append(max(min(before, turn.input_len - 1), 0))
                before = turn.input_len // block * block
                outs.append(turn.output_len)
                thinks.append(turn.think_s)
                busy += (turn.api_s or 0.0) + turn.think_s
    users = max(round(a.concurrency * max(busy / span, 1.0)), a.concurrency)
    return Traffic(float(np.mean(prompts)), float(np.mean(cached)), 0.0, float(np.mean(outs)),
                   float(np.mean(thinks)), users, None)


class Screen:
    """Estimates `simulate`-shaped metrics of resolved deployments under one workload."""

    def __init__(self, workload: Workload, overhead: ServingOverhead | None = None) -> None:
        self.traffic = traffic(workload)
        self.overhead = overhead or ServingOverhead()
        self._memo: dict[tuple[Any, ...], float] = {}

    def step_ms(self, inst: Instance, resolved: Resolved, decode: float, context: float,
            prefill: float, cached: float) -> float:
        """Step ms of `inst` with `decode` requests at `context` and `prefill` new tokens after
        `cached` ones, on every rank (memoized)."""
        key = (instance_key(inst), round(decode, 2), round(context), round(prefill),
               round(cached))
        if key not in self._memo:
            z = np.zeros(inst.dp)
            batch = Batch(np.full(inst.dp, decode), np.full(inst.dp, context),
                          np.full(inst.dp, prefill), np.full(inst.dp, 1.0 if prefill else 0.0),
                          np.full(inst.dp, cached) if prefill else z)
            self._memo[key] = step_time(inst, batch, resolved.calibration).total_ms
        return self._memo[key]

    def __call__(self, resolved: Resolved) -> dict[str, Any]:
        """The estimate: throughput_tok_s_gpu, output_tok_s_gpu, ttft_ms / tpot_ms / itl_ms /
        tok_s_user (every percentile set to the steady-state value), plus keeps_up (prefill
        capacity covers the load), request_rate and decode_batch (per rank)."""
        t, roles = self.traffic, resolved.roles
        model: _Model
        if "aggregated" in roles:
            model = _Aggregated(self, resolved)
        else:
            model = _Disaggregated(self, resolved)
        x_max = model.capacity()
        if t.users is None:
            x, queue_s = min(float(t.rate or 0.0), x_max), 0.0
            saturated = float(t.rate or 0.0) > x_max
        else:
            x, queue_s = _closed_loop(model, t.users, t.think_s, x_max)
            saturated = False
        ttft_s, tpot_s, b = model.latency(x)
        ttft_ms = SATURATED_TTFT_MS if saturated else 1e3 * (ttft_s + queue_s)
        gpus = resolved.gpus
        speed = 1.0 / tpot_s if tpot_s > 0 else 0.0
        return {
            "throughput_tok_s_gpu": x * (t.prompt + t.output) / gpus,
            "output_tok_s_gpu": x * t.output / gpus,
            "ttft_ms": _stats(ttft_ms), "tpot_ms": _stats(1e3 * tpot_s),
            "itl_ms": _stats(1e3 * tpot_s * model.accepted),
            "tok_s_user": {"p50": speed, "p90": speed, "mean": speed},
            "keeps_up": bool(model.prefill_load(x) < 1.0 and not saturated),
            "request_rate": x, "decode_batch": b,
        }


def _kv_cost(resolved: Resolved) -> Callable[[float], float]:
    """KV pool tokens a request of a given context takes (windows, compressed entries)."""
    p = resolved.deployment.precision
    return resolved.model.kv_token_cost(p.kv_cache, p.indexer_cache)


def _stats(v: float) -> dict[str, float]:
    return {"p50": v, "p90": v, "p99": v, "mean": v}


def _closed_loop(model: _Model, users: int, think_s: float,
                 x_max: float) -> tuple[float, float]:
    """(requests/s, extra queueing s per request) of `users` closed-loop users."""

    def cycle(x: float) -> float:
        ttft, tpot, _ = model.latency(x)
        return ttft + model.output * tpot + think_s

    if x_max <= 0:
        return 0.0, 0.0
    if x_max * cycle(x_max) <= users:  # saturated: the surplus users queue in front
        return x_max, users / x_max - cycle(x_max)
    lo, hi = 0.0, x_max
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mid * cycle(mid) < users else (lo, mid)
    return lo, 0.0


class _Model:
    """Steady-state queueing view of one layout."""

    output: float
    accepted: float

    def capacity(self) -> float:
        """Most requests/s the layout sustains."""
        raise NotImplementedError

    def latency(self, x: float) -> tuple[float, float, float]:
        """(TTFT s, TPOT s, decode batch per rank) at x requests/s."""
        raise NotImplementedError

    def prefill_load(self, x: float) -> float:
        """Utilization of prefill capacity at x requests/s."""
        raise NotImplementedError


def _accepted(inst: Instance) -> float:
    return 1.0 + sum(inst.spec_acceptance ** i for i in range(1, inst.spec_tokens + 1))


def _grid(high: float, base: float, factor: float) -> np.ndarray:
    """base, base*factor, ... below `high`, and `high` itself."""
    n = max(int(math.log(max(high / base, 1.0), factor)) + 1, 1)
    return np.unique([*np.minimum(base * factor ** np.arange(n), high).tolist(), high])


class _Disaggregated(_Model):
    def __init__(self, screen: Screen, resolved: Resolved) -> None:
        t, self.screen, self.resolved = screen.traffic, screen, resolved
        pre, dec = resolved.roles["prefill"], resolved.roles["decode"]
        self.pre, self.dec = pre.instance, dec.instance
        self.pre_ranks = pre.spec.instances * self.pre.dp
        self.dec_ranks = dec.spec.instances * self.dec.dp
        self.output, self.accepted = t.output, _accepted(self.dec)
        self.cached = min(t.cached(self.pre_ranks, pre.spec.router_policy("prefill")),
                          t.prompt)
        self.uncached = max(t.prompt - self.cached, 1.0)
        context = t.prompt + t.output / 2
        kv_cap = dec.memory.kv_tokens / _kv_cost(resolved)(t.prompt + t.output)
        self.cap = max(min(float(dec.spec.max_num_seqs), kv_cap), 0.0)
        self.bs = _grid(max(self.cap, 1.0), 1.0, 2.0)
        self.ts = np.array([screen.step_ms(self.dec, resolved, b, context, 0, 0) / 1e3
                            for b in self.bs])
        self.chunk = float(pre.spec.max_num_batched_tokens)
        self.full_s = screen.step_ms(self.pre, resolved, 0, 0, self.chunk, self.cached) / 1e3
        self.prefill_tok_s = self.pre_ranks * self.chunk / self.full_s
        u = self.uncached
        self.prefill_s = math.ceil(u / self.chunk) * screen.step_ms(
            self.pre, resolved, 0, 0, min(u, self.chunk), self.cached) / 1e3
        names = resolved.placement.gpus
        src = next(n for n in names if n.startswith("prefill"))
        dst = next(n for n in names if n.startswith("decode"))
        gb_s = resolved.placement.transfer_gb_s(src, dst)
        precision = resolved.deployment.precision
        kv_bytes = resolved.model.kv_bytes(t.prompt, precision.kv_cache, precision.indexer_cache)
        self.fixed_s = (screen.overhead.api_overhead_ms + screen.overhead.handoff_ms) / 1e3 + (
            kv_bytes / (gb_s * 1e9))

    def step_s(self, b: float) -> float:
        """Decode step seconds at b requests per rank (interpolated)."""
        return float(np.interp(b, self.bs, self.ts))

    def capacity(self) -> float:
        if self.cap < 1:
            return 0.0
        decode = self.dec_ranks * self.cap * self.accepted / (self.output * self.step_s(self.cap))
        return min(decode, self.prefill_tok_s / self.uncached)

    def batch(self, x: float) -> float:
        """Decode requests per rank at x requests/s: b = x * output * TPOT(b) / ranks."""
        lo, hi = 0.0, self.cap
        for _ in range(20):
            mid = (lo + hi) / 2
            need = x * self.output * self.step_s(mid) / self.accepted / self.dec_ranks
            lo, hi = (mid, hi) if need > mid else (lo, mid)
        return max(hi, 1.0)

    def prefill_load(self, x: float) -> float:
        return x * self.uncached / self.prefill_tok_s

    def latency(self, x: float) -> tuple[float, float, float]:
        b = self.batch(x)
        step = self.step_s(b)
        rho = min(self.prefill_load(x), 0.99)
        wait = self.full_s * rho / (2 * (1 - rho))
        return self.fixed_s + wait + self.prefill_s + step, step / self.accepted, b


class _Aggregated(_Model):
    """Mixed steps, priced as a decode step plus a prompt chunk minus the fixed overhead."""

    def __init__(self, screen: Screen, resolved: Resolved) -> None:
        t, self.screen, self.resolved = screen.traffic, screen, resolved
        role = resolved.roles["aggregated"]
        inst = self.inst = role.instance
        self.ranks = role.spec.instances * inst.dp
        self.output, self.accepted = t.output, _accepted(inst)
        self.cached = min(t.cached(self.ranks, role.spec.router_policy("aggregated")),
                          t.prompt)
        self.uncached = max(t.prompt - self.cached, 1.0)
        context = t.prompt + t.output / 2
        self.budget = float(role.spec.max_num_batched_tokens)
        kv_cap = role.memory.kv_tokens / _kv_cost(resolved)(t.prompt + t.output)
        self.cap = max(min(float(role.spec.max_num_seqs), kv_cap), 0.0)
        self.bs = _grid(max(self.cap, 1.0), 1.0, 2.0)
        self.ts = np.array([screen.step_ms(inst, resolved, b, context, 0, 0) / 1e3
                            for b in self.bs])
        self.ps = _grid(self.budget, 256.0, 4.0)
        self.tp = np.array([screen.step_ms(inst, resolved, 0, 0, p, self.cached) / 1e3
                            for p in self.ps])
        self.base_s = inst.step_overhead_ms / 1e3
        self.fixed_s = screen.overhead.api_overhead_ms / 1e3

    def step_s(self, b: float, p: float) -> float:
        """Mixed step seconds: b decode requests and p prompt tokens per rank."""
        d = float(np.interp(b, self.bs, self.ts))
        if p <= 0:
            return d
        lp = float(np.interp(math.log(max(p, 1.0)), np.log(self.ps), np.log(self.tp)))
        return d + math.exp(lp) - self.base_s

    def _state(self, x: float) -> tuple[float, float, float]:
        """(decode batch, prompt tokens per step, step s) per rank at x requests/s."""
        b, p = 1.0, 0.0
        for _ in range(12):
            s = self.step_s(b, p)
            b = min(max(x * self.output * s / self.accepted / self.ranks, 1.0), self.cap)
            p = x * self.uncached * s / self.ranks
        return b, p, self.step_s(b, p)

    def _room(self, b: float) -> float:
        return self.budget - b * (1 + self.inst.spec_tokens)

    def capacity(self) -> float:
        if self.cap < 1:
            return 0.0
        lo, hi = 0.0, self.ranks * self.budget / self.uncached * 1e3
        for _ in range(25):
            mid = (lo + hi) / 2
            b, p, s = self._state(mid)
            ok = (p <= self._room(b)
                  and mid * self.output * s / self.accepted / self.ranks <= self.cap)
            lo, hi = (mid, hi) if ok else (lo, mid)
        return lo

    def prefill_load(self, x: float) -> float:
        b, p, _ = self._state(x)
        room = self._room(b)
        return p / room if room > 0 else math.inf

    def latency(self, x: float) -> tuple[float, float, float]:
        b, _p, s = self._state(x)
        steps = math.ceil(self.uncached / max(self._room(b), 1.0))
        rho = min(self.prefill_load(x), 0.99)
        wait = s * rho / (2 * (1 - rho))
        return self.fixed_s + wait + steps * s, s / self.accepted, b
