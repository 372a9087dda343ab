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
Aggregated instances interleave short decode steps with long steps that carry a rank's prompt
chunk, which every rank of the instance waits for (`_Aggregated`): the mean step, hence TPOT,
is the mix of the two, and a prompt's TTFT is its own chunk steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.calibration.serving import ServingOverhead
from simulator.cost.memory import kv_split
from simulator.cost.step import Batch, Instance, step_time
from simulator.des.prefix_cache import BLOCK_TOKENS
from simulator.des.pricing import instance_key, operation_prices
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
        raise SpecError("the screen cannot estimate trace arrivals; search with --no-screen "
                        "(every feasible point simulated)")
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
                prefill: float, cached: float, prefilling: int | None = None) -> float:
        """Step ms of `inst` with `decode` requests at `context` on every rank and `prefill`
        new tokens after `cached` ones on `prefilling` ranks (None: every rank; memoized; its
        operations priced through the prices per point the simulations share, the same
        floats)."""
        ranks = inst.dp if prefilling is None else min(prefilling, inst.dp)
        key = (instance_key(inst), round(decode, 2), round(context), round(prefill),
               round(cached), ranks)
        if key not in self._memo:
            on = np.arange(inst.dp) < ranks if prefill else np.zeros(inst.dp, dtype=bool)
            batch = Batch(np.full(inst.dp, decode), np.full(inst.dp, context),
                          np.where(on, prefill, 0.0), on.astype(float),
                          np.where(on, cached, 0.0))
            self._memo[key] = step_time(inst, batch,
                                        operation_prices(resolved.calibration)).total_ms
        return self._memo[key]

    def __call__(self, resolved: Resolved) -> dict[str, Any]:
        """The estimate: throughput_tok_s_gpu, output_tok_s_gpu, ttft_ms / tpot_ms / itl_ms /
        tok_s_user (every percentile set to the steady-state value), plus keeps_up (prefill
        capacity covers the load), request_rate and decode_batch (per rank), and for open loop
        offered_rate (the rate asked for; request_rate is at most the capacity)."""
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
            **({} if t.rate is None else {"offered_rate": float(t.rate)}),
        }


def _kv_cost(resolved: Resolved, role: str) -> Callable[[float], float]:
    """KV pool tokens a request of a given context takes on a rank of `role` (windows,
    compressed entries, per-request state)."""
    p = resolved.deployment.precision
    spec = resolved.roles[role].spec
    return resolved.model.kv_token_cost(p.kv_cache, p.indexer_cache,
                                        kv_split(resolved.model, spec, p.weights))


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
        kv_cap = dec.memory.kv_tokens / _kv_cost(resolved, "decode")(t.prompt + t.output)
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
        fixed_ms = screen.overhead.api_ms(self.uncached) + screen.overhead.handoff_ms
        self.fixed_s = fixed_ms / 1e3 + kv_bytes / (gb_s * 1e9)

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
    """Mixed steps. A rank prefills a prompt in chunks of up to the room its decode batch
    leaves in the token budget; a step that carries chunks is priced as a decode step plus
    those chunks minus the fixed overhead, with as many ranks carrying one as on average do
    (between one rank and all: the instance's ranks step in lockstep, so every rank's step
    takes that long when any rank prefills). Steps are thus short decode steps and long chunk
    steps, not a mean prompt share on every step. A chunk step follows a step during which a
    prompt arrived: arrivals come in time (open loop, think time), so a long chunk step
    gathers more of them and chunk steps cluster, or, in a closed loop without think time, as
    requests finish, i.e. at the same mean per step. The share of chunk steps is the
    stationary one of that two-state chain; a prompt longer than the room takes several
    consecutive chunk steps."""

    def __init__(self, screen: Screen, resolved: Resolved) -> None:
        t, self.screen, self.resolved = screen.traffic, screen, resolved
        role = resolved.roles["aggregated"]
        inst = self.inst = role.instance
        self.instances = role.spec.instances
        self.ranks = self.instances * inst.dp
        self.output, self.accepted = t.output, _accepted(inst)
        self.in_time = t.users is None or t.think_s > 0
        """Whether prompts arrive at random times (else as requests finish, per step)."""
        self.cached = min(t.cached(self.ranks, role.spec.router_policy("aggregated")),
                          t.prompt)
        self.uncached = max(t.prompt - self.cached, 1.0)
        context = t.prompt + t.output / 2
        self.budget = float(role.spec.max_num_batched_tokens)
        kv_cap = role.memory.kv_tokens / _kv_cost(resolved, "aggregated")(t.prompt + t.output)
        self.cap = max(min(float(role.spec.max_num_seqs), kv_cap), 0.0)
        self.bs = _grid(max(self.cap, 1.0), 1.0, 2.0)
        self.ts = np.array([screen.step_ms(inst, resolved, b, context, 0, 0) / 1e3
                            for b in self.bs])
        self.ps = np.log(_grid(self.budget, 16.0, 4.0))
        self.one, self.every = (
            np.log([screen.step_ms(inst, resolved, 0, 0, p, self.cached, ranks) / 1e3
                    for p in np.exp(self.ps)]) for ranks in (1, inst.dp))
        self.base_s = inst.step_overhead_ms / 1e3
        self.fixed_s = screen.overhead.api_ms(self.uncached) / 1e3
        self._states: dict[float, tuple[float, float, float]] = {}

    def decode_s(self, b: float) -> float:
        """Step seconds with b decode requests per rank and no prompt tokens."""
        return float(np.interp(b, self.bs, self.ts))

    def chunk_s(self, c: float, k: float) -> float:
        """What chunks of c prompt tokens on k ranks at once add to a step (seconds; linear
        in k between one rank and every rank)."""
        if c <= 0:
            return 0.0
        lc = math.log(max(c, 1.0))
        one = math.exp(float(np.interp(lc, self.ps, self.one)))
        every = math.exp(float(np.interp(lc, self.ps, self.every)))
        share = (k - 1) / (self.inst.dp - 1) if self.inst.dp > 1 else 1.0
        return max(one + (every - one) * min(max(share, 0.0), 1.0) - self.base_s, 0.0)

    def steps(self, x: float, b: float, mean_s: float) -> tuple[float, float, float]:
        """(share of steps that carry chunks, ranks carrying one in such a step, mean step
        seconds) at x requests/s with b decode requests per rank and mean step `mean_s`."""
        rate = x / max(self.instances, 1)
        d, room = self.decode_s(b), max(self._room(b), 1.0)
        n, c = math.ceil(self.uncached / room), min(self.uncached, room)
        k, busy, mean = 1.0, 0.0, d
        for _ in range(4):  # the chunk's price depends on k, k on the chunk's length
            run = n * (d + self.chunk_s(c, k))
            after_d, after_c = (rate * d, rate * run) if self.in_time else (
                rate * mean_s, rate * mean_s * n)
            enter, stay = -math.expm1(-after_d), -math.expm1(-after_c)
            if enter <= 0:
                return 0.0, 1.0, d
            runs = enter / (1 - stay + enter)
            k = after_c + (1 - stay) * after_d / enter  # E[arrivals | some], either way
            k = min(max(k, 1.0), float(self.inst.dp))
            busy = runs * n / (1 - runs + runs * n)
            mean = ((1 - runs) * d + runs * run) / (1 - runs + runs * n)
        return busy, k, mean

    def _state(self, x: float) -> tuple[float, float, float]:
        """(decode batch, prompt tokens per step, step s) per rank at x requests/s
        (memoized: latency and load read it at the same rates)."""
        if x not in self._states:
            b, s = 1.0, self.decode_s(1.0)
            for _ in range(12):
                s = self.steps(x, b, s)[2]
                b = min(max(x * self.output * s / self.accepted / self.ranks, 1.0), self.cap)
            s = self.steps(x, b, s)[2]
            self._states[x] = (b, x * self.uncached * s / self.ranks, s)
        return self._states[x]

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
        """TTFT: the rest of the step in progress when prompts arrive in time (E[S^2] / 2E[S]:
        a long chunk step is the likelier one to arrive in; none when they arrive as requests
        finish, at a step's end), the M/D/1 wait for the prompts ahead, then the request's own
        chunk steps, each a decode step plus the chunks of the ranks prefilling with it (not
        the mean step, which is mostly decode)."""
        b, _p, s = self._state(x)
        busy, k, _mean = self.steps(x, b, s)
        d, room = self.decode_s(b), max(self._room(b), 1.0)
        n = math.ceil(self.uncached / room)
        own = d + self.chunk_s(min(self.uncached, room), k)
        residual = 0.0
        if self.in_time and s > 0:
            squares = (1 - busy) * d * d + busy * own * own
            residual = squares / (2 * s)
        rho = min(self.prefill_load(x), 0.99)
        wait = own * rho / (2 * (1 - rho))
        return self.fixed_s + residual + wait + n * own, s / self.accepted, b
