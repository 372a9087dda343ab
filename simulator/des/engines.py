"""Engine instances as SimPy processes: one event per engine step, the work of a step in numpy.

All DP ranks of an instance step in lock-step. Each step the engine plans every rank's batch
(per-rank arrays), prices it with the cost model (slowest rank for attention, most-loaded EP
rank for the MoE), waits that long, then applies the step to its requests. Decode steps that
would repeat the same batch at the same price go as one event (a macro-step,
`simulator.des.runs`), with the same outcome.

- `PrefillEngine`: chunked prefill; hands finished prompts to the pipeline (KV transfer) and
  keeps their KV until the pipeline releases it.
- `DecodeEngine`: continuous batching in slot arrays.
- `AggregatedEngine`: both in mixed steps: decode tokens first, prompt chunks in what is left of
  max_num_batched_tokens.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np
import simpy

from simulator.cost import StepTime
from simulator.cost.step import prefix_rewind
from simulator.des.chunks import Chunking, ChunkPlan, ChunkScheduler
from simulator.des.experts import ExpertLoad
from simulator.des.kvpool import KvPool
from simulator.des.metrics import Recorder
from simulator.des.prefix_cache import RankCaches, cached_tokens, rate_cached_tokens
from simulator.des.pricing import StepPricer
from simulator.des.requests import RequestTable
from simulator.des.runs import MAX_RUN, Run, hops_to
from simulator.des.slots import DONE_EPS, DecodeSlots
from simulator.specs.deployment import ADP_BALANCE_TIMEOUT_STEPS, RoleSpec

WAITS_HELD = 4_096
"""Distinct sampled steps an engine keeps before pricing their DP waits together (the memory
they hold stays bounded however long the run)."""


class Sink(Protocol):
    """Where an engine hands requests on (the run's pipeline)."""

    def prefilled(self, engine: PrefillEngine, rank: int, rid: int) -> None:
        """A P/D prefill finished; its KV stays on `rank` until `engine.release`."""

    def admitted(self, engine: DecodeEngine, rank: int, slot: int, rid: int) -> None:
        """A decode slot and KV space are reserved; call `engine.activate` once KV is there."""

    def finished(self, rid: int) -> None:
        """The request's last token is out (table.finish is set)."""


class Batching(NamedTuple):
    """How an engine's aggregated instance takes its work in (BATCHING)."""

    mixed_steps: bool
    """Prompt chunks ride beside decode rows in one step; False: a step that can take prompts
    computes only them, and the running requests decode in the other steps."""
    waiting_weight: float
    """Where a new request picks its DP rank: the least waiting_weight x waiting + running
    requests."""


BATCHING: dict[str, Batching] = {
    "vllm": Batching(mixed_steps=True, waiting_weight=4.0),
    "sglang": Batching(mixed_steps=False, waiting_weight=1.0),
    "trtllm": Batching(mixed_steps=True, waiting_weight=1.0),
}
"""Per engine: vLLM's chunked prefill and TensorRT-LLM's in-flight batching mix prompts into
decode steps; SGLang runs a step of prompts alone whenever it can form one (its scheduler's
prefill first; mixing needs --enable-mixed-chunk, which InferenceX's recipes do not pass).
vLLM's DP client scores each engine core 4 x waiting + running; TensorRT-LLM's attention DP
hands new requests to the ranks with the fewest active requests; SGLang's DP attention (round
robin by default) is taken as the fewest requests too."""

MIXED_BY_REQUESTS = Batching(mixed_steps=True, waiting_weight=1.0)
"""Mixed steps, and a new request's rank by the fewest requests (`Shared`'s default)."""


@dataclass(frozen=True)
class Shared:
    """What every engine of a run shares."""

    env: simpy.Environment
    table: RequestTable
    recorder: Recorder
    sink: Sink
    prefix_hit_rate: float
    """Share of a prompt served from cache when the request carries no block ids."""
    kv_costs: dict[str, Callable[[float], float]] = field(default_factory=dict)
    """Per role: KV pool tokens a request of a given context takes on a rank (the model's
    windows, compressed entries and per-request state, in units of one full token's KV there);
    a role not listed: its context."""
    dp_wait_every: int = 1
    """Steps of an instance per one whose DP wait is priced (SimOptions.dp_wait_every)."""
    macro_steps: bool = True
    """Take runs of identical decode steps as one event (SimOptions.macro_steps)."""
    schedule_ahead: bool = True
    """Work reaching a busy instance first runs in the step after the next
    (SimOptions.schedule_ahead)."""
    kv_admission: str = "whole"
    """How the engine admits requests against the KV cache of an aggregated instance
    (`slots.KV_ADMISSION`)."""
    batching: Batching = MIXED_BY_REQUESTS
    """How an aggregated instance takes its work in (BATCHING)."""


class Engine:
    """One instance: its ranks, pricer, KV pool, and the step loop."""

    def __init__(self, shared: Shared, name: str, spec: RoleSpec, pricer: StepPricer,
                 experts: ExpertLoad | None, kv_tokens: int) -> None:
        self.shared, self.env, self.table = shared, shared.env, shared.table
        self.name, self.spec, self.pricer, self.experts = name, spec, pricer, experts
        self.dp = pricer.instance.dp
        self.spec_tokens = pricer.instance.spec_tokens
        self.kv = KvPool(self.dp, kv_tokens, lambda: self.env.now,
                         shared.kv_costs.get(pricer.instance.role, float))
        self._wake = self.env.event()
        self._idle = False
        self._waking = False
        """Woken from idle and not yet planned: work arriving now joins the first step."""
        self._run: Run | None = None
        """The run of steps in progress (a macro-step), if any."""
        self._interruptible = False
        """Whether `poke` ends the run at its step in progress."""
        self._step_end = 0.0
        """When the step (or run of steps) in progress ends."""
        self._recv_every = spec.recv_interval
        """SGLang's --scheduler-recv-interval (`RoleSpec.recv_interval`; 1: every step)."""
        self._recv_count = 0
        """Decode steps since the scheduler last took in new requests."""
        self._unseen: list[tuple[float, Callable[[], None]]] = []
        """Work that came while the scheduler was not taking any: (when, what queues it)."""
        self._steps = 0
        """Steps priced so far (every `dp_wait_every`-th also prices the DP wait)."""
        self._waits: dict[bytes, np.ndarray] = {}
        """Sampled steps whose DP wait is not priced yet, by their rounded rows."""
        self._sampled: Counter[bytes] = Counter()
        """How many sampled steps had each of those rows."""
        self.rewind = prefix_rewind(pricer.instance)
        """Tokens of each prefix-cache hit computed again (`prefix_rewind`)."""
        self._process = self.env.process(self._loop())

    # ---- the step loop -------------------------------------------------------------------

    def _loop(self) -> Generator[Any, Any, None]:
        while True:
            plan = self.plan()
            if plan is None:
                self._idle, self._wake = True, self.env.event()
                if self._unseen:  # an idle scheduler takes requests in at once
                    self._take_in(self.env.now)
                yield self._wake
                self._waking = False
                continue
            steps = self.repeats(plan) if self.shared.macro_steps else 1
            if self._unseen:  # the run ends where the scheduler next takes them in
                steps = min(steps, self._recv_every - self._recv_count)
            if steps > 1:
                yield from self._take_run(plan, steps)
                continue
            st = self.price(plan)
            self._step_end = self.env.now + st.total_ms / 1e3
            yield self.env.timeout(st.total_ms / 1e3)
            self.apply(plan, st.total_ms / 1e3)
            self._received(plan, [self.env.now])

    def _take_run(self, plan: StepPlan, steps: int) -> Generator[Any, Any, None]:
        """Up to `steps` steps of `plan` as one event: all of them, or, when `poke` comes
        during the run, those up to the one in progress then (`simulator.des.runs`)."""
        cost = self._cost(plan)
        seconds = cost[0].total_ms / 1e3
        run = self._run = Run(self.env.now, seconds, steps, self.waiting(),
                              self.kv.used.copy(), plan.stepped)
        self._step_end = run.end
        self._interruptible = True
        try:
            for d in hops_to(self.env.now, run.end):
                yield self.env.timeout(d)
        except simpy.Interrupt:
            now = self.env.now
            steps = run.done_by(now) + 1  # those that ended before now, and the one running
            if run.ends[steps - 1] > now:
                for d in hops_to(now, float(run.ends[steps - 1])):
                    yield self.env.timeout(d)
        self._interruptible, self._run = False, None
        self._record(plan, cost, self._pieces(plan, run, steps), seconds)
        self.apply(plan, seconds, steps)
        self._received(plan, run.ends[:steps].tolist())

    def poke(self) -> None:
        """New work may be possible: wake the loop if it sleeps, and end a run of steps at the
        step in progress."""
        if self._idle:
            self._idle, self._waking = False, True
            self._wake.succeed()
        elif self._interruptible:
            self._interruptible = False
            self._process.interrupt()

    def when_planned(self, arrive: Callable[[], None]) -> None:
        """New work (`arrive` queues it and pokes): an idle instance takes it at once. A busy
        one has already planned the step after the one in progress (`Shared.schedule_ahead`),
        so the work comes just after that step begins and first runs in the step after it."""
        if self._idle or self._waking:
            arrive()
            return
        if self._recv_every > 1:
            self._hold(arrive)
            return
        if not self.shared.schedule_ahead:
            arrive()
            return
        now, run = self.env.now, self._run
        end = self._step_end if run is None else float(run.ends[min(run.done_by(now),
                                                                    run.steps - 1)])
        self._deliver(arrive, max(end, now))

    def _deliver(self, arrive: Callable[[], None], boundary: float) -> None:
        """`arrive` as the scheduler takes it in at step boundary `boundary` (>= now): planning
        ahead, just after it (the step from there already planned); else at it."""
        now = self.env.now
        at = math.nextafter(boundary, math.inf) if self.shared.schedule_ahead else boundary
        if at <= now and not self.shared.schedule_ahead:
            arrive()
            return
        self._call_at(max(at, now), arrive)

    def _call_at(self, t: float, fn: Callable[[], None]) -> None:
        """Call `fn` when the clock reads exactly `t` (>= now), after the timeouts `hops_to`
        gives (a second where no delay from now lands on `t`)."""
        self._after(hops_to(self.env.now, t), fn)

    def _after(self, hops: list[float], fn: Callable[[], None]) -> None:
        first, rest = hops[0], hops[1:]
        self.env.timeout(first).callbacks.append(
            (lambda _: self._after(rest, fn)) if rest else (lambda _: fn()))

    # ---- SGLang's --scheduler-recv-interval -----------------------------------------------

    def _hold(self, arrive: Callable[[], None]) -> None:
        """Keep work until the scheduler next takes in requests: after `recv_interval` decode
        steps since it last did, or after a step that computed prompt tokens (SGLang's
        SchedulerRecvSkipper). During a run of decode steps that boundary is known: the run is
        cut there."""
        now, run = self.env.now, self._run
        self._unseen.append((now, arrive))
        if run is None:
            return
        j = self._recv_every - self._recv_count - 1  # the run's step whose end takes them in
        while j < run.steps and run.ends[j] < now:
            j += self._recv_every
        if j < run.steps:
            boundary = float(run.ends[j])
            self._call_at(boundary, lambda: self._take_in(boundary))

    def _take_in(self, boundary: float) -> None:
        """The scheduler takes in, at `boundary`, what came by then."""
        keep = []
        for t, arrive in self._unseen:
            if t <= boundary:
                self._deliver(arrive, boundary)
            else:
                keep.append((t, arrive))
        self._unseen = keep

    def _received(self, plan: StepPlan, ends: list[float]) -> None:
        """Count the steps just applied (ending at `ends`) toward the next time the scheduler
        takes in requests, and let in what came before the last such boundary among them."""
        every = self._recv_every
        if every <= 1:
            return
        if plan.chunks is not None or plan.tails:  # a step with prompt work: take in next
            self._recv_count = 0
            last = len(ends) - 1
        else:
            first = every - self._recv_count - 1
            self._recv_count = (self._recv_count + len(ends)) % every
            if first >= len(ends):
                return
            last = first + (len(ends) - 1 - first) // every * every
        if self._unseen:
            self._take_in(ends[last])

    def _changed(self) -> None:
        """The queue or the KV use changed: the steps of a run from now on record the new."""
        if self._run is not None:
            self._run.mark(self.env.now, self.waiting(), self.kv.used.copy())

    def _pieces(self, plan: StepPlan, run: Run, steps: int
                ) -> list[tuple[float, int, int, float | np.ndarray]]:
        """The first `steps` steps of `run` as `_record` takes them: (time of the first, steps,
        queue, KV use), a piece per mark; where the KV grows step by step, the use of each step
        of the piece, as a step taken alone records it at its start."""
        out: list[tuple[float, int, int, float | np.ndarray]] = []
        for t, first, n, queue, used in run.pieces(steps):
            grown = self._grown_over(plan, first, n)
            out.append((t, n, queue, self.kv.use_of(used, self.kv.grown) if grown is None
                        else self.kv.uses_of(used, grown)))
        return out

    def _grown_over(self, plan: StepPlan, first: int, steps: int) -> np.ndarray | None:
        """Per rank (a row for each of `steps` steps of a run of `plan` from step `first`
        on), the KV the admitted requests have grown by at that step's start; None where the
        KV in use does not grow step by step (it does under optimistic admission)."""
        return None

    def price(self, plan: StepPlan) -> StepTime:
        """Price one step of `plan` and record it, as starting now."""
        cost = self._cost(plan)
        self._record(plan, cost, [(self.env.now, 1, self.waiting(), self.kv.use())], 0.0)
        return cost[0]

    def _cost(self, plan: StepPlan) -> tuple[StepTime, float, float | None]:
        """A step of `plan`: its price, its tokens, and its EP imbalance (None without EP)."""
        work = plan.decode_requests * (1 + self.spec_tokens) + plan.tokens  # tokens per rank
        tokens = float(work.sum())
        expert_tokens, imb = None, None
        if self.experts is not None:
            expert_tokens, imb = self.experts.step(tokens)
        st = self.pricer.price(plan.decode_requests, plan.decode_context, plan.tokens,
                               plan.requests, plan.context, expert_tokens)
        return st, tokens, imb

    def _record(self, plan: StepPlan, cost: tuple[StepTime, float, float | None],
                pieces: Sequence[tuple[float, int, int, float | np.ndarray]],
                every: float) -> None:
        """Record steps of `plan` priced `cost`, as `pieces`: (time of the first, steps, queue,
        KV use), each step `every` seconds after the one before."""
        st, tokens, imb = cost
        recorder, steps = self.shared.recorder, sum(p[1] for p in pieces)
        if imb is not None:
            recorder.imbalance(imb, tokens, steps)
        batch = int(plan.decode_count() + plan.requests.sum())
        for t, n, queue, kv_use in pieces:
            recorder.step(self.name, t, queue, batch, kv_use, st, self.pricer.instance.ranks,
                          n, every)
        if self.dp > 1:
            self._dp_wait(plan, steps)

    def _dp_wait(self, plan: StepPlan, steps: int) -> None:
        """Count `steps` steps of `plan`, and for the first and every `dp_wait_every`-th after
        it among them, keep its ranks' rows to price how long they wait for the one with the
        most work of its own. The wait is a metric the run does not depend on, so the kept
        steps are priced together, WAITS_HELD at a time and at the end (`settle_dp_waits`)."""
        every, first = self.shared.dp_wait_every, self._steps
        sampled = (first + steps - 1) // every - (first - 1) // every  # multiples of `every`
        self._steps += steps
        self.shared.recorder.dp_step(self.name, steps)
        if sampled:
            rows = self.pricer.rounded_columns(plan.decode_requests, plan.decode_context,
                                               plan.tokens, plan.requests, plan.context)
            key = rows.tobytes()
            self._waits.setdefault(key, rows)
            self._sampled[key] += sampled
            if len(self._waits) >= WAITS_HELD:
                self.settle_dp_waits()

    def settle_dp_waits(self) -> None:
        """Price the DP waits of the sampled steps kept so far and record them."""
        if not self._waits:
            return
        held, counts = self._waits, self._sampled
        self._waits, self._sampled = {}, Counter()
        waits = self.pricer.dp_waits(list(held.values()))
        self.shared.recorder.dp_waits(self.name, [(w, counts[k]) for w, k in
                                                  zip(waits, held, strict=True)])

    # ---- what subclasses give ------------------------------------------------------------

    def plan(self) -> StepPlan | None:
        """The next step's work, or None when there is none."""
        raise NotImplementedError

    def repeats(self, plan: StepPlan) -> int:
        """Steps of `plan` that can go as one run (1: this one alone)."""
        return 1

    def apply(self, plan: StepPlan, seconds: float, steps: int = 1) -> None:
        """The `steps` steps of `plan` (more than one where `repeats` allowed) just ended."""
        raise NotImplementedError

    def waiting(self) -> int:
        """Requests routed here and not admitted yet."""
        raise NotImplementedError

    def load_tokens(self) -> float:
        raise NotImplementedError

    def load_requests(self) -> float:
        raise NotImplementedError

    def rank_active(self) -> np.ndarray:
        """Per rank: the KV (context tokens) the requests routed here hold, for a router that
        counts it (`kv_router`)."""
        raise NotImplementedError

    # ---- helpers -------------------------------------------------------------------------

    def _init_prompts(self, spec: RoleSpec, cache: RankCaches | None, finish_at_prefill: bool,
                      admit: Callable[[int, int], int | None]) -> None:
        """Set up a prompt queue (instances that prefill): chunked prefill under the batch
        limits, the per-rank prefix caches, and the ranks blocked on admission."""
        self.cache, self.finish_at_prefill = cache, finish_at_prefill
        self.chunks = ChunkScheduler(self.dp, spec.max_num_batched_tokens, spec.max_num_seqs,
                                     admit, spec.long_prefill_token_threshold)
        self._blocked: set[int] = set()
        self._loading = np.zeros(self.dp)
        """Per rank: prompt tokens of requests not queued yet (their blocks still coming from
        the host tier, or the instance's next step already planned: `when_planned`)."""
        self._arriving = np.zeros(self.dp)
        """Per rank: how many requests those tokens are."""

    @property
    def prefix_hit_rate(self) -> float:
        """Share of a prompt that carries no block ids served from this instance's cache: the
        workload's, or none where the role's prefix caching is off."""
        return self.shared.prefix_hit_rate if self.spec.prefix_caching else 0.0

    def rank_queued(self) -> np.ndarray:
        """Per rank: prompt tokens still to compute, loads from the host tier included."""
        out: np.ndarray = self.chunks.outstanding + self._loading
        return out

    def rank_requests(self) -> np.ndarray:
        """Per rank: requests queued and prefilling (and decoding, where it decodes)."""
        return self.chunks.requests() + self._arriving

    def rank_cached(self, rid: int) -> np.ndarray:
        """Per rank: prompt tokens of request `rid` held there (HBM or host tier), for a
        router."""
        blocks = self.table.blocks[rid]
        if blocks is None or self.cache is None:
            return np.zeros(self.dp)
        n, bt = int(self.table.input_len[rid]), self.table.block_tokens
        return np.array([cached_tokens(self.cache.peek(r, blocks), n, bt)
                         for r in range(self.dp)], dtype=float)

    def _least_busy_rank(self) -> int:
        """The rank a prompt goes to when no router named one: the least prompt work."""
        return int(np.argmin(self.chunks.outstanding + self._loading))

    def _enqueue_prompt(self, rid: int, rank: int | None = None) -> None:
        """Queue a request's uncached prompt tokens for chunked prefill, on `rank` (default:
        `_least_busy_rank`); blocks held only in the host tier are loaded first."""
        t = self.table
        n, blocks = int(t.input_len[rid]), t.blocks[rid]
        if rank is None:
            rank = self._least_busy_rank()
        load = 0
        if blocks is not None and self.cache is not None:
            hbm, host = self.cache.lookup(rank, blocks)
            cached = cached_tokens(hbm + host, n, t.block_tokens)
            load = cached - cached_tokens(hbm, n, t.block_tokens)
        else:
            cached = rate_cached_tokens(self.prefix_hit_rate, n)
        if self.rewind:  # the hit's last window is computed again (V4.1's bounded replay)
            cached, load = max(cached - self.rewind, 0), max(load - self.rewind, 0)
        t.cached[rid] = cached
        self._loading[rank] += n - cached
        self._arriving[rank] += 1

        def queue() -> None:
            self._loading[rank] -= n - cached
            self._arriving[rank] -= 1
            self.chunks.enqueue(rid, n - cached, cached, rank)
            self.poke()

        if load <= 0:
            self.when_planned(queue)
            return
        assert self.cache is not None
        t.host_loaded[rid] = load
        done = self.cache.load_done(rank, -(-load // t.block_tokens), self.env.now)
        self.env.timeout(done - self.env.now).callbacks.append(
            lambda _: self.when_planned(queue))

    def _cache_prompt(self, rank: int, rid: int) -> None:
        """The prompt of `rid` is in `rank`'s KV: later prompts may hit it."""
        blocks = self.table.blocks[rid]
        if self.cache is not None and blocks is not None:
            self.cache.insert(rank, blocks)

    def _finish(self, rids: np.ndarray | list[int]) -> None:
        now = self.env.now
        for rid in rids:
            self.table.finish[rid] = now
            self.shared.sink.finished(int(rid))


@dataclass(frozen=True)
class StepPlan:
    """One step's per-rank work: decode part and prefill part."""

    decode_requests: np.ndarray
    decode_context: np.ndarray
    tokens: np.ndarray
    """Prompt tokens of the prefill chunks."""
    requests: np.ndarray
    """Prefill chunks."""
    context: np.ndarray
    """Mean tokens already in KV for those chunks."""
    chunks: ChunkPlan | None = None
    stepped: np.ndarray | None = None
    """Decode slots in the step (a snapshot: slots activated during the step wait)."""
    fresh: np.ndarray | None = None
    """Of those, the slots whose first decode step this is."""
    decode_total: float | None = None
    """decode_requests summed, when the plan knew it."""
    tails: int = 0
    """Of the `fresh` slots, those that compute the rest of their prompt in this step (a
    prefill chunk each, in tokens/requests/context: what the P/D handoff left them) instead
    of a decode row."""

    def decode_count(self) -> float:
        """Decode requests over all ranks."""
        if self.decode_total is not None:
            return self.decode_total
        return float(self.decode_requests.sum())


def _prefill_only(chunks: ChunkPlan, dp: int) -> StepPlan:
    z = np.zeros(dp)
    return StepPlan(z, z, chunks.tokens, chunks.requests, chunks.context, chunks)


class PrefillEngine(Engine):
    """A P/D prefill instance (or any instance in prefill_only mode, with `finish_at_prefill`)."""

    def __init__(self, shared: Shared, name: str, spec: RoleSpec, pricer: StepPricer,
                 experts: ExpertLoad | None, kv_tokens: int, cache: RankCaches | None,
                 finish_at_prefill: bool = False) -> None:
        super().__init__(shared, name, spec, pricer, experts, kv_tokens)
        self._init_prompts(spec, cache, finish_at_prefill, self._admit)
        self._held = np.zeros(self.dp)
        """Per rank: prompt tokens whose KV is reserved here (prefilling, or waiting to be
        sent)."""

    def take(self, rid: int, rank: int | None = None) -> None:
        """A request routed here (to `rank`, or the rank with the least prompt work)."""
        self._enqueue_prompt(rid, rank)

    def rank_active(self) -> np.ndarray:
        return self._held.copy()

    def _admit(self, rank: int, rid: int) -> int | None:
        need = float(self.table.input_len[rid])
        if not self.kv.fits(rank, need):
            self._blocked.add(rank)
            return None
        self.kv.take(rank, need)
        self._held[rank] += need
        return 0

    def _give(self, rank: int, rid: int) -> None:
        need = float(self.table.input_len[rid])
        self.kv.give(rank, need)
        self._held[rank] = max(self._held[rank] - need, 0.0)

    def release(self, rank: int, rid: int) -> None:
        """The request's KV left this instance."""
        self._give(rank, rid)
        self.poke()

    def plan(self) -> StepPlan | None:
        if not self.chunks.has_work():
            return None
        self._blocked.clear()
        chunks = self.chunks.plan()
        for r in range(self.dp):
            self.kv.note(r, r in self._blocked, len(self.chunks.queues[r]))
        if not chunks.tokens.any():
            return None  # all ranks wait for KV space; `release` wakes us
        return _prefill_only(chunks, self.dp)

    def apply(self, plan: StepPlan, seconds: float, steps: int = 1) -> None:
        assert plan.chunks is not None and steps == 1
        now = self.env.now
        for rank, entry in self.chunks.advance(plan.chunks):
            rid = entry.rid
            self.table.prefill_done[rid] = now
            self._cache_prompt(rank, rid)
            if self.finish_at_prefill:
                self.table.first_token[rid] = now
                self._give(rank, rid)
                self._finish([rid])
            else:
                self.shared.sink.prefilled(self, rank, rid)

    def waiting(self) -> int:
        return self.chunks.waiting()

    def load_tokens(self) -> float:
        return float(self.rank_queued().sum())

    def load_requests(self) -> float:
        return float(self.rank_requests().min())


class DecodeEngine(Engine):
    """A P/D decode instance (or a decode_only bench instance)."""

    def __init__(self, shared: Shared, name: str, spec: RoleSpec, pricer: StepPricer,
                 experts: ExpertLoad | None, kv_tokens: int, admission: str = "whole") -> None:
        super().__init__(shared, name, spec, pricer, experts, kv_tokens)
        self.accepted = pricer.accepted_per_request
        self.slots = DecodeSlots(self.dp, spec.max_num_seqs, self.kv, self.accepted, admission)
        self._zeros = np.zeros(self.dp)
        self._zeros.flags.writeable = False  # the prefill part of every decode-only plan
        self._tail = np.zeros((self.dp, spec.max_num_seqs))
        """Per slot: prompt tokens its first step computes (`activate`'s `tail`)."""

    def rank_active(self) -> np.ndarray:
        """Per rank: the contexts of the requests holding a slot (prefilling or decoding) and
        of those queued for one: the KV a router counts as held there."""
        slots = self.slots
        out: np.ndarray = np.where(slots.rid >= 0, slots.context, 0.0).sum(axis=1)
        for r in np.flatnonzero(slots.queued):
            out[r] += sum(context for _, context, _ in slots.queues[r])
        return out

    def take(self, rid: int, context: float) -> None:
        """A request whose KV (`context` tokens) is to come here."""
        rank = int(np.argmin(self.slots.requests()))
        self.slots.enqueue(rank, rid, context, float(self.table.output_len[rid]))
        self._admit(rank)
        self._changed()

    def _admit(self, rank: int) -> None:
        for rid, slot in self.slots.admit(rank):
            self.shared.sink.admitted(self, rank, slot, rid)

    def activate(self, rank: int, slot: int, tail: float = 0.0) -> None:
        """The request's KV is in place; `tail`: tokens at the end of its prompt that it
        computes in its first step (a prefill chunk; 0: its first step is a decode row)."""
        def arrive() -> None:
            self.slots.activate(rank, slot)
            self._tail[rank, slot] = tail
            self.poke()

        self.when_planned(arrive)

    def plan(self) -> StepPlan | None:
        n, ctx = self.slots.batch()
        total = float(n.sum())
        if total == 0:
            return None
        stepped, fresh = self._snapshot()
        tails = fresh & (self._tail > 0)
        if tails.any():
            return self._with_tails(stepped, fresh, tails)
        z = self._zeros
        return StepPlan(n, ctx, z, z, z, None, stepped, fresh, decode_total=total)

    def _with_tails(self, stepped: np.ndarray, fresh: np.ndarray,
                    tails: np.ndarray) -> StepPlan:
        """A step in which the slots of mask `tails` compute the rest of their prompts (one
        chunk each, after the KV handed over) and the other stepped slots decode."""
        n, ctx = self.slots.run_batch(stepped & ~tails, 1)
        chunks = tails.sum(axis=1, dtype=float)
        tokens = self._tail.sum(axis=1, where=tails)
        handed = (self.slots.context0 - self._tail).sum(axis=1, where=tails)
        return StepPlan(n, ctx[0], tokens, chunks, handed / np.maximum(chunks, 1.0), None,
                        stepped, fresh, tails=int(chunks.sum()))

    def _snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        return self.slots.active.copy(), self.slots.fresh.copy()

    def _grown_over(self, plan: StepPlan, first: int, steps: int) -> np.ndarray | None:
        if not self.slots.optimistic or plan.stepped is None:
            return None
        return self.slots.grown_over(plan.stepped, first, steps)

    def repeats(self, plan: StepPlan) -> int:
        """Decode-only steps without a first token go as a run while no request finishes
        (the step where the first does is the run's last), at most MAX_RUN, and while the
        step's rounded rows, so its price, stay those of the first (`StepPricer.repeats`).
        Drawn expert loads differ step by step: with them every step goes alone."""
        if (plan.chunks is not None or plan.stepped is None or plan.fresh is None
                or plan.fresh.any() or (self.experts is not None
                                        and self.experts.sampling != "expected")):
            return 1
        steps = min(self.slots.steps_to_finish(plan.stepped), MAX_RUN)
        if steps == 1:
            return 1
        _, context = self.slots.run_batch(plan.stepped, steps)
        return self.pricer.repeats(plan.decode_requests, context)

    def apply(self, plan: StepPlan, seconds: float, steps: int = 1) -> None:
        assert plan.stepped is not None and plan.fresh is not None
        fresh = int(plan.fresh.sum())
        assert steps == 1 or not fresh  # a first token comes from a step alone
        self.shared.recorder.itl(seconds, int(plan.decode_count()) - fresh + plan.tails, steps)
        first, finished, ranks = self.slots.advance(plan.stepped, plan.fresh if fresh else None,
                                                    steps)
        if first.size:
            self.table.first_token[first] = self.env.now
        self._finish(finished)
        for r in ranks:
            self._admit(r)

    def waiting(self) -> int:
        return self.slots.waiting()

    def load_tokens(self) -> float:
        run = self._run
        if run is None:
            return self.slots.remaining()
        return self.slots.remaining(run.stepped, run.done_by(self.env.now))

    def load_requests(self) -> float:
        return float(self.slots.requests().min())


class AggregatedEngine(DecodeEngine):
    """An instance that prefills and decodes (no P/D), in mixed steps where its engine mixes
    them (BATCHING)."""

    def __init__(self, shared: Shared, name: str, spec: RoleSpec, pricer: StepPricer,
                 experts: ExpertLoad | None, kv_tokens: int, cache: RankCaches | None,
                 finish_at_prefill: bool = False) -> None:
        super().__init__(shared, name, spec, pricer, experts, kv_tokens, shared.kv_admission)
        self._init_prompts(spec, cache, finish_at_prefill, self._reserve)
        self._balance_clock = 0
        """TensorRT-LLM's attention-DP waiting count (attention_dp_balance): steps since it last
        released or found a prompt on every rank (`_hold_prompts`)."""
        self._clock_counted = False
        """Whether `plan` counted the planned step on the clock (`apply` counts the others)."""
        self._resumed: dict[int, float] = {}
        """Preempted requests queued to compute their KV again: id -> output tokens they had."""
        self.preempted = 0
        """Requests whose KV this instance took back to make room (optimistic admission)."""

    def take_prompt(self, rid: int, rank: int | None = None) -> None:
        """A request to prefill (and then decode) here (on `rank`, or the least busy)."""
        self._enqueue_prompt(rid, rank)

    def rank_requests(self) -> np.ndarray:
        return super().rank_requests() + self.slots.requests()

    def _least_busy_rank(self) -> int:
        """The DP rank a new request goes to: the least `Batching.waiting_weight` x waiting +
        running requests (vLLM's DP load balancer scores 4 x waiting + running; first of equals), so
        that a rank whose slots are all decoding is not handed a prompt while another has
        room. (By prompt work alone, every rank without a queued prompt ties and the first
        takes each new request, to wait there for one of its own to end.)"""
        running = self.slots.held
        waiting = self.chunks.requests() + self._arriving - np.array(
            [len(r) for r in self.chunks.running])
        return int(np.argmin(self.shared.batching.waiting_weight * waiting + running))

    def _reserve(self, rank: int, rid: int) -> int | None:
        output = 0.0 if self.finish_at_prefill else float(self.table.output_len[rid])
        had = self._resumed.get(rid, 0.0)  # a resumed request holds its output so far too
        slot = self.slots.reserve(rank, rid, float(self.table.input_len[rid]) + had, output)
        if slot is None and self.slots.has_free(rank):
            self._blocked.add(rank)
        return slot

    def plan(self) -> StepPlan | None:
        n, ctx = self.slots.batch()
        self._clock_counted = False
        if not self.chunks.has_work() or self._hold_prompts(n):
            return self._decode_step(n, ctx)
        alone = not self.shared.batching.mixed_steps  # prompts first, in steps of their own
        rows = np.zeros_like(n) if alone else n
        budget = np.maximum(self.spec.max_num_batched_tokens - rows * (1 + self.spec_tokens), 0)
        self._blocked.clear()
        chunks = self.chunks.plan(budget)
        for r in range(self.dp):
            self.kv.note(r, r in self._blocked, len(self.chunks.queues[r]))
        if alone and not chunks.tokens.any():  # no prompt fits: the decode rows step
            return self._decode_step(n, ctx)
        if not rows.any() and not chunks.tokens.any():
            return None
        return StepPlan(rows, ctx, chunks.tokens, chunks.requests, chunks.context, chunks,
                        *self._snapshot())

    def _decode_step(self, n: np.ndarray, ctx: np.ndarray) -> StepPlan | None:
        """A step of the decode rows alone (None when no rank decodes)."""
        if not n.any():
            return None
        z = np.zeros(self.dp)
        return StepPlan(n, ctx, z, z, z, None, *self._snapshot())

    def _hold_prompts(self, decoding: np.ndarray) -> bool:
        """Whether this step holds the queued prompts (TensorRT-LLM's attention-DP balance,
        its executor's `_balance_adp_requests`): a step that finds a prompt to start on every
        rank, or a prompt half done, starts them and sets the waiting count to 0; any other
        step adds one to the count and holds the prompts, unless the count reaches
        ADP_BALANCE_TIMEOUT_STEPS or a rank with a prompt has nothing to decode (ranks with
        nothing at all decode a dummy request there), which start them and set it to 0. The
        count runs in steps with nothing queued too (`_count_steps`), so a prompt waits until
        the count next reaches the timeout: half of it on average, not all of it."""
        if not self.spec.attention_dp_balance or self.dp == 1:
            return False
        self._clock_counted = True
        queued = [bool(q) for q in self.chunks.queues]
        if all(queued) or any(self.chunks.running):
            self._balance_clock = 0
            return False
        self._balance_clock += 1
        starved = any(q and not d for q, d in zip(queued, decoding.tolist(), strict=True))
        if self._balance_clock >= ADP_BALANCE_TIMEOUT_STEPS or starved:
            self._balance_clock = 0
            return False
        return True

    def _count_steps(self, plan: StepPlan, steps: int) -> None:
        """The attention-DP waiting count over `steps` steps that `plan` did not count: steps
        with no prompt queued, each adding one, back to 0 at the timeout (nothing to release),
        or at 0 where no rank decodes (no dummy requests then)."""
        if self._clock_counted or not self.spec.attention_dp_balance or self.dp == 1:
            return
        if not plan.decode_requests.any():
            self._balance_clock = 0
            return
        self._balance_clock = (self._balance_clock + steps) % ADP_BALANCE_TIMEOUT_STEPS

    def repeats(self, plan: StepPlan) -> int:
        """As a decode instance's, while no prompt is queued or held, and (optimistic
        admission) while every rank's KV holds the run."""
        if self.chunks.has_work():
            return 1
        steps = super().repeats(plan)
        full = None if plan.stepped is None else self.slots.steps_to_full(plan.stepped)
        return steps if full is None else min(steps, full)

    def apply(self, plan: StepPlan, seconds: float, steps: int = 1) -> None:
        self._count_steps(plan, steps)
        if plan.decode_requests.any():
            super().apply(plan, seconds, steps)
            if self.slots.optimistic:
                self._preempt()
        if plan.chunks is not None:
            for rank, entry in self.chunks.advance(plan.chunks):
                self._prompt_done(rank, entry)

    def _preempt(self) -> None:
        """Make room on every rank whose KV the step's new tokens overflowed: the requests
        admitted last go back to the head of the rank's prompt queue, to compute their prompt
        and output so far again (vLLM's recompute preemption)."""
        for rank in self.kv.over():
            r = int(rank)
            for rid, had in self.slots.preempt(r):
                self.preempted += 1
                self._resumed[rid] = had
                self.chunks.enqueue(rid, int(self.table.input_len[rid] + math.ceil(had)), 0, r,
                                    front=True)

    def _prompt_done(self, rank: int, entry: Chunking) -> None:
        rid, slot, now = entry.rid, entry.ref, self.env.now
        had = self._resumed.pop(rid, None)
        if had is not None:  # a preempted request's KV again, and its next token
            self._resumed_done(rank, slot, rid, had + 1.0)
            return
        self.table.prefill_done[rid] = now
        self.table.first_token[rid] = now  # the last chunk's step samples the first token
        self._cache_prompt(rank, rid)
        if self.finish_at_prefill or self.table.output_len[rid] <= 1:
            self.slots.finish_now(rank, slot)
            self._finish([rid])
            self._admit(rank)
            self.poke()
        else:
            self.slots.activate(rank, slot, generated=1.0)

    def _resumed_done(self, rank: int, slot: int, rid: int, had: float) -> None:
        """A resumed request's recompute ended with `had` output tokens: it decodes on, or is
        done."""
        if had >= float(self.table.output_len[rid]) - DONE_EPS:
            self.slots.finish_now(rank, slot)
            self._finish([rid])
            self._admit(rank)
            self.poke()
        else:  # its context is its prompt and the output it has (`activate` adds the latter)
            self.slots.context0[rank, slot] = float(self.table.input_len[rid])
            self.slots.activate(rank, slot, generated=had)

    def waiting(self) -> int:
        return self.slots.waiting() + self.chunks.waiting()

    def load_tokens(self) -> float:
        return super().load_tokens() + float(self.rank_queued().sum())

    def load_requests(self) -> float:
        queued = np.array([len(q) for q in self.chunks.queues])
        return float((self.slots.requests() + queued + self._arriving).min())
