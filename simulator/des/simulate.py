"""`simulate(deployment, workload)`: build the instances on the topology, run the traffic through
them, and collect a `SimResult`.

Request path (mode serve, P/D): arrival -> prefill router -> prefill instance (prefix cache,
chunked prefill) -> decode router -> decode rank (waits for a slot and KV space) -> KV transfer
over the topology -> continuous batching -> completion. Without P/D an aggregated instance does
both in mixed steps. prefill_only runs only the instances that prefill, and a request ends with
its prefill; decode_only starts requests in decode with `context_tokens` of KV already there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import simpy

from simulator.calibration import Calibration
from simulator.calibration.serving import ServingOverhead
from simulator.cost import Batch, instance_from_role, step_time
from simulator.cost.memory import kv_split
from simulator.des.apiserver import SharedServer
from simulator.des.arrivals import Traffic
from simulator.des.engines import (
    BATCHING,
    AggregatedEngine,
    DecodeEngine,
    Engine,
    PrefillEngine,
    Shared,
)
from simulator.des.experts import (
    ExpertLoad,
    Sampling,
    power_law_popularity,
    read_expert_counts,
)
from simulator.des.kvpool import KvPool
from simulator.des.metrics import InstanceInfo, Recorder, SimResult
from simulator.des.prefix_cache import Holders, RankCaches, cached_tokens, rate_cached_tokens
from simulator.des.pricing import StepPricer
from simulator.des.replay import load_corpus
from simulator.des.requests import RequestTable
from simulator.des.slots import KV_ADMISSION
from simulator.des.traces import Trace, arrival_trace
from simulator.des.transfer import KvNetwork
from simulator.resolve import resolve
from simulator.specs.deployment import Deployment, RoleSpec
from simulator.specs.errors import SpecError
from simulator.specs.handoff import handoff_for
from simulator.specs.model import ModelSpec
from simulator.specs.routing import Candidate, Candidates, Router
from simulator.specs.workload import ClosedArrival, SessionsArrival, TraceArrival, Workload


@dataclass(frozen=True)
class SimOptions:
    """Knobs of the simulation itself (not of the deployment or the traffic)."""

    expert_sampling: Sampling = "expected"
    """expected: step assignments follow expert popularity exactly; multinomial: drawn."""
    expert_alpha: float = 1.1
    """Power-law exponent of the per-layer expert popularity."""
    expert_max_ratio: float = 32.0
    """Truncation of that power law: the most an expert's weight can exceed the least's."""
    price_bits: int = 6
    """Significant bits kept of each per-rank batch figure when memoizing step prices."""
    api_overhead_ms: float = 0.0
    """Time from a request's arrival to the engine's scheduler (HTTP, tokenization, routing)."""
    api_per_ktoken_ms: float = 0.0
    """Time from arrival to the scheduler for every 1,000 tokens of the request's prompt that
    the prefix cache does not hold, on top of `api_overhead_ms` (a pure delay)."""
    api_serial_ms: float = 0.0
    """The part of `api_overhead_ms` that is the instance's API server's own work on each
    request, its time shared among the requests it holds (`apiserver.SharedServer`: n arriving
    together each take n times it); 0: all of it is a pure delay."""
    step_overhead_ms: float | None = None
    """Fixed cost of every engine step (scheduling, launches not hidden by the GPU); None: the
    cost model's default for the hardware kind."""
    step_overhead_per_layer_ms: float = 0.0
    """Cost of every engine step for each decoder layer of the model, on top of
    `step_overhead_ms` (0: none)."""
    step_overhead_per_seq_ms: float = 0.0
    """Cost of every engine step for each request its busiest rank runs (measured; 0: none)."""
    handoff_ms: float = 0.0
    """P/D: fixed latency of a prefill-to-decode handoff besides moving the KV bytes (proxy
    hop, transfer setup, the decode side picking the request up)."""
    dp_wait_every: int = 32
    """`dp_imbalance`: an instance prices how long its DP ranks wait for the one with the most
    work of its own (attention, mHC, shared experts, router, logits: `rank_work_ms`) on its
    first step and every this-many-th after it, scaled to all its steps (pricing each rank's
    work on every step costs as much as the steps themselves); 1 prices every step."""
    schedule_ahead: bool = True
    """Each engine plans its next step while the current one runs, as all three serving engines
    do by default (vLLM's async scheduling, SGLang's and TensorRT-LLM's overlap schedulers):
    work that reaches a busy instance (a prompt, a decode request whose KV arrived) first runs
    in the step after the next; False: in the next step."""
    macro_steps: bool = True
    """Take a run of decode steps that repeat the same batch at the same price (until a
    request joins or finishes) as one event: the same results as stepping one by one (every
    metric, tested), in a fraction of the time; False steps one by one."""

    @classmethod
    def serving(cls, overhead: ServingOverhead) -> SimOptions:
        """Options that apply a serving stack's fixed latencies."""
        return cls(api_overhead_ms=overhead.api_overhead_ms,
                   api_per_ktoken_ms=overhead.api_per_ktoken_ms,
                   api_serial_ms=overhead.api_serial_ms,
                   step_overhead_ms=overhead.step_overhead_ms,
                   step_overhead_per_seq_ms=overhead.step_overhead_per_seq_ms,
                   step_overhead_per_layer_ms=overhead.step_overhead_per_layer_ms,
                   handoff_ms=overhead.handoff_ms)


def simulate(deployment: Deployment, workload: Workload, *,
             calibration: Calibration | None = None,
             progress: Callable[[float], None] | None = None,
             expert_counts: str | Path | np.ndarray | None = None,
             options: SimOptions | None = None) -> SimResult:
    """Simulate `workload` on `deployment`; deterministic for a given workload seed.

    `calibration`: kernel tables (default: those of the deployment's hardware and engine).
    `progress`: called with the share of requests completed, in [0, 1].
    `expert_counts`: recorded token counts per expert ((layers, experts) or (experts,), an
    array or a .npy/.csv path) instead of the seeded power-law popularity.
    """
    return _Run(deployment, workload, calibration, progress, expert_counts,
                options or SimOptions()).result()


ISOLATED_MODE = {"prefill": "prefill_only", "decode": "decode_only"}
"""A deployment of one role alone runs this workload mode only."""


class _Run:
    """One simulation: the objects it builds and the pipeline between them."""

    def __init__(self, deployment: Deployment, workload: Workload,
                 calibration: Calibration | None, progress: Callable[[float], None] | None,
                 expert_counts: str | Path | np.ndarray | None, opts: SimOptions) -> None:
        self.deployment, self.workload, self.opts, self.progress = (
            deployment, workload, opts, progress)
        resolved = resolve(deployment, calibration)
        self.model, self.hardware = resolved.model, resolved.hardware
        self.handoff = handoff_for(self.hardware.name)
        """The P/D KV connector the deployment would hand prompts over with."""
        self.calibration, self.placement = resolved.calibration, resolved.placement
        self.kv_tokens = {role: r.memory.kv_tokens for role, r in resolved.roles.items()}
        if workload.sessions is not None and isinstance(workload.arrival, TraceArrival):
            raise SpecError("sessions cannot be combined with trace arrival; a trace carries "
                            "its own prefix blocks (hash_ids)")
        seeds = np.random.SeedSequence(workload.seed).spawn(3)
        traffic_rng, popularity_rng = (np.random.default_rng(s) for s in seeds[:2])
        self._step_seeds = seeds[2]

        trace = self._trace()
        corpus = None
        n = workload.requests if trace is None else min(workload.requests, len(trace))
        if isinstance(workload.arrival, SessionsArrival):
            corpus = load_corpus(workload.arrival, workload.seed)
            n = workload.requests + workload.arrival.concurrency  # one warmup turn per lane
        self.env = simpy.Environment()
        self.table = RequestTable(n)
        if corpus:
            self.table.block_tokens = corpus[0].block_tokens
        self.recorder = Recorder()
        self.popularity = self._popularity(popularity_rng, expert_counts)
        self.engines: dict[str, list[Engine]] = {}
        self.infos: dict[str, InstanceInfo] = {}
        self.pricers: dict[tuple[str, float], StepPricer] = {}
        p = deployment.precision
        self.kv_costs = {role: self.model.kv_token_cost(
            p.kv_cache, p.indexer_cache, kv_split(self.model, spec, p.weights))
            for role, spec in deployment.roles.items()}
        """Per role: the KV pool tokens a request of a given context takes on a rank."""
        self.shared = Shared(self.env, self.table, self.recorder, self,
                             workload.prefix_hit_rate,
                             {role: cost if cost is float else remembered(cost)
                              for role, cost in self.kv_costs.items()},
                             max(int(opts.dp_wait_every), 1), opts.macro_steps,
                             opts.schedule_ahead, KV_ADMISSION[deployment.engine],
                             BATCHING[deployment.engine])
        self._kv_bytes = remembered(lambda context: self.model.kv_bytes(
            context, p.kv_cache, p.indexer_cache))
        """KV bytes a request of a given context sends from prefill to decode."""
        self._holders: dict[str, Holders] = {}
        """Per role: which ranks of its instances hold a run starting at a block."""
        self._offsets: dict[str, tuple[dict[int, int], int]] = {}
        """Per role, once routed: id(an instance's caches) -> its first rank's candidate index,
        and the candidates."""
        for role in self._running_roles():
            self.engines[role] = [self._engine(role, i) for i in
                                  range(deployment.roles[role].instances)]
        self.routers: dict[str, Router] = {
            role: Router(deployment.roles[role].router_policy(role)) for role in self.engines}
        self.network = KvNetwork(self.env, self.placement.transfer_gb_s)
        self.traffic = Traffic(self.env, workload, self.table, self.submit, traffic_rng, trace,
                               corpus=corpus)
        a = workload.arrival
        if isinstance(a, ClosedArrival) and a.start == "spread":
            self.traffic.spread_s = self._request_seconds(a.concurrency)
        self._source: dict[int, tuple[PrefillEngine, int]] = {}
        """Request id -> the prefill instance and rank holding its KV until the transfer."""
        self._api_servers: dict[int, SharedServer] = {}
        """id(an instance) -> its API server, made at its first request."""
        self._done = 0
        self._reported = -1

    # ---- building ------------------------------------------------------------------------

    def _request_seconds(self, concurrency: int) -> float:
        """One request's predicted duration at `concurrency` (mean lengths): its prompt as one
        prefill step on an idle rank, then its output at the decode step of a full batch."""
        prompt = float(np.mean(self.traffic.new_input)) if len(self.traffic.new_input) else 1.0
        output = float(np.mean(self.traffic.output)) if len(self.traffic.output) else 1.0
        first = next(iter(self.engines))
        last = "decode" if "decode" in self.engines else first
        pre = self.engines[first][0].pricer.instance
        dec = self.engines[last][0].pricer.instance
        ranks = self.deployment.roles[last].instances * dec.dp
        per_rank = max(concurrency / max(ranks, 1), 1.0)
        ttft = step_time(pre, Batch.prefill(pre.dp, prompt, 1.0), self.calibration).total_ms
        st = step_time(dec, Batch.decode(dec.dp, per_rank, prompt + output / 2),
                       self.calibration)
        per_token = st.total_ms * dec.dp * per_rank / max(st.tokens, 1e-9)
        return (ttft + max(output - 1, 0.0) * per_token) / 1e3

    def _trace(self) -> Trace | None:
        a = self.workload.arrival
        if not isinstance(a, TraceArrival):
            return None
        return arrival_trace(a, self.workload.requests)

    def _running_roles(self) -> list[str]:
        mode, roles = self.workload.mode, self.deployment.roles
        alone = self.deployment.single_role
        if alone is not None:
            want = ISOLATED_MODE[alone]
            if mode != want:
                raise SpecError(f"the deployment has only {alone} instances, which run the "
                                f"isolated-role bench mode {want}; the workload's mode is "
                                f"{mode} (give mode: {want}, or add "
                                f"{'decode' if alone == 'prefill' else 'prefill'} instances)")
            return [alone]
        if "aggregated" in roles:
            return ["aggregated"]
        if mode == "prefill_only":
            return ["prefill"]
        if mode == "decode_only":
            return ["decode"]
        return ["prefill", "decode"]

    def _popularity(self, rng: np.random.Generator,
                    counts: str | Path | np.ndarray | None) -> np.ndarray | None:
        m: ModelSpec = self.model
        if not m.is_moe:
            return None
        if counts is not None:
            return read_expert_counts(counts, m.moe_layers, m.n_routed_experts)
        return power_law_popularity(rng, m.moe_layers, m.n_routed_experts,
                                    self.opts.expert_alpha, self.opts.expert_max_ratio)

    def _engine(self, role: str, index: int) -> Engine:
        d, m, hw = self.deployment, self.model, self.hardware
        spec = d.roles[role]
        name = f"{role}-{index}"
        a2a = self.placement.all_to_all_gb_s(name)
        pricer = self.pricers.get((role, a2a))
        if pricer is None:
            inst = instance_from_role(m, hw, role, spec, d.precision.weights,
                                      d.precision.kv_cache, a2a_gb_s=a2a,
                                      overhead_ms=self.opts.step_overhead_ms,
                                      overhead_per_seq_ms=self.opts.step_overhead_per_seq_ms,
                                      overhead_per_layer_ms=self.opts.step_overhead_per_layer_ms,
                                      indexer_cache=d.precision.indexer_cache)
            pricer = self.pricers[(role, a2a)] = StepPricer(inst, self.calibration,
                                                            self.opts.price_bits)
        kv_tokens = self.kv_tokens[role]
        experts = None
        if self.popularity is not None and pricer.instance.ep > 1:
            rng = np.random.default_rng(self._step_seeds.spawn(1)[0])
            experts = ExpertLoad(self.popularity, pricer.instance.ep, spec.redundant_experts,
                                 m.top_k, self.opts.expert_sampling, rng)
        self.infos[name] = InstanceInfo(
            role=role, ranks=spec.ranks, gpus=self.placement.gpus[name],
            kv_tokens_per_rank=kv_tokens, a2a_gb_s=a2a,
            expert_imbalance=experts.expected_imbalance if experts else 0.0)
        only_prefill = self.workload.mode == "prefill_only"
        if role == "decode":
            return DecodeEngine(self.shared, name, spec, pricer, experts, kv_tokens)
        cls = PrefillEngine if role == "prefill" else AggregatedEngine
        engine = cls(self.shared, name, spec, pricer, experts, kv_tokens, None,
                     finish_at_prefill=only_prefill)
        engine.cache = self._caches(role, spec, engine.kv) if spec.prefix_caching else None
        return engine

    def _caches(self, role: str, spec: RoleSpec, pool: KvPool) -> RankCaches:
        """Per-rank prefix caches of an instance that prefills: HBM within what the requests
        running on each rank leave of its KV `pool`, and the host tier of `host_cache_gb` per
        GPU priced over the host link."""
        p, block = self.deployment.precision, self.table.block_tokens

        def per_block(of_context: Callable[[float], float]) -> float:
            """What one more block of a long prompt adds to `of_context` (its slope there)."""
            return (of_context(2.0 ** 20) - of_context(2.0 ** 19)) / 2.0 ** 19 * block

        pool_per_block = max(per_block(self.kv_costs[role]), 1e-9)

        def free_blocks(rank: int) -> int:
            return int(max(pool.capacity - float(pool.used[rank]), 0.0) // pool_per_block)

        split = kv_split(self.model, spec, p.weights)  # a rank holds and moves its share
        bytes_per_block = per_block(lambda ctx: self.model.kv_bytes(ctx, p.kv_cache,
                                                                    p.indexer_cache, split))
        host_blocks = int(spec.host_cache_gb * 2 ** 30 // max(bytes_per_block, 1.0))
        link = self.hardware.host_link_gb_s * 1e9
        return RankCaches(len(pool.used), free_blocks, host_blocks, block,
                          bytes_per_block / link if link > 0 else 0.0,
                          self._holders.setdefault(role, Holders()))

    # ---- the pipeline (engines call these) -------------------------------------------------

    def _pick(self, role: str, session: int | None = None) -> Engine:
        """An instance of `role` by its router's policy over the instances' loads."""
        engines = self.engines[role]
        if len(engines) == 1:  # every policy picks the only one
            return engines[0]
        router = self.routers[role]
        active = router.policy.uses_active
        cands = [Candidate(queued_tokens=e.load_tokens(), requests=e.load_requests(),
                           active_tokens=float(e.rank_active().sum()) if active else 0.0)
                 for e in engines]
        return engines[router.pick(cands, session)]

    def _place_prompt(self, role: str, rid: int) -> tuple[Engine, int | None]:
        """Where a prompt goes: with a policy that knows the prefix caches, the (instance, DP
        rank) whose cache and queue make it cheapest, each rank being its own engine core with
        its own cache; else an instance, which then picks its rank."""
        router = self.routers[role]
        session = int(self.table.session[rid])
        key = session if session >= 0 else None
        if not router.policy.uses_prefix:
            return self._pick(role, key), None
        places = self._prompt_places(role)
        cols = Candidates(
            np.concatenate([e.rank_queued() for e in places]),
            np.concatenate([e.rank_requests() for e in places]),
            self._cached(role, places, rid),
            float(self.table.input_len[rid]),
            np.concatenate([e.rank_active() for e in places]) if router.policy.uses_active
            else 0.0)
        i = router.pick(cols, key)
        for e in places:  # candidate i is rank i of the instances' ranks in order
            if i < e.dp:
                return e, i
            i -= e.dp
        raise AssertionError("a router picked a candidate it was not given")

    def _prompt_places(self, role: str) -> list[PrefillEngine | AggregatedEngine]:
        """The instances of `role` that compute prompts (and so hold prefix caches)."""
        return [e for e in self.engines[role] if isinstance(e, PrefillEngine | AggregatedEngine)]

    def _cached(self, role: str, places: list[PrefillEngine | AggregatedEngine],
                rid: int) -> np.ndarray:
        """Per candidate rank of `places`: prompt tokens of `rid` held there (what each
        instance's `rank_cached` says), looked up only on the ranks the role's holders index
        names for the prompt's first block (the others can have no hit)."""
        known = self._offsets.get(role)
        if known is None:
            at, n = {}, 0
            for e in places:
                if e.cache is not None:
                    at[id(e.cache)] = n
                n += e.dp
            known = self._offsets[role] = (at, n)
        at, total = known
        out = np.zeros(total)
        blocks, holders = self.table.blocks[rid], self._holders.get(role)
        if blocks is None or holders is None:
            return out
        n, bt = int(self.table.input_len[rid]), self.table.block_tokens
        for caches, rank in holders.of(blocks):
            out[at[id(caches)] + rank] = cached_tokens(caches.peek(rank, blocks), n, bt)
        return out

    def submit(self, rid: int) -> None:
        """A request arrived; it reaches the scheduler after the API overhead (its pure delay
        here, with the part per prompt token the prefix cache does not hold; its serial part at
        the instance's API server once routed)."""
        delay = max(self.opts.api_overhead_ms - self.opts.api_serial_ms, 0.0) / 1e3
        if self.opts.api_per_ktoken_ms > 0:
            delay += self.opts.api_per_ktoken_ms * self._uncached_estimate(rid) / 1e6
        if delay > 0:
            self.env.timeout(delay).callbacks.append(lambda _: self._route(rid))
        else:
            self._route(rid)

    def _uncached_estimate(self, rid: int) -> float:
        """Prompt tokens of `rid` no prefix cache holds on arrival: none for a decode-only
        bench (its KV comes from the connector), else the prompt less what the rank holding
        most of it holds (the share `prefix_hit_rate` says where requests carry no blocks)."""
        n = float(self.table.input_len[rid])
        if self.workload.mode == "decode_only":
            return 0.0
        role = next(iter(self.engines))
        if self.table.blocks[rid] is None:
            return n - rate_cached_tokens(self.engines[role][0].prefix_hit_rate, n)
        held = self._cached(role, self._prompt_places(role), rid)
        return n - (float(held.max()) if held.size else 0.0)

    def _route(self, rid: int) -> None:
        role = next(iter(self.engines))
        if self.workload.mode == "decode_only":
            target = self._pick(role)
            assert isinstance(target, DecodeEngine)
            self.table.cached[rid] = self.table.input_len[rid]  # KV comes from the connector
            decode = target.take
            self._api_serial(target, lambda: decode(rid, float(self.table.input_len[rid])))
            return
        target, rank = self._place_prompt(role, rid)
        if isinstance(target, AggregatedEngine):
            prompt = target.take_prompt
            self._api_serial(target, lambda: prompt(rid, rank))
        else:
            assert isinstance(target, PrefillEngine)
            prefill = target.take
            self._api_serial(target, lambda: prefill(rid, rank))

    def _api_serial(self, target: Engine, then: Callable[[], None]) -> None:
        """`then` once the instance's API server has done its serial part of the request,
        sharing its time with the other requests it holds (`SharedServer`)."""
        serial = self.opts.api_serial_ms / 1e3
        if serial <= 0:
            then()
            return
        server = self._api_servers.get(id(target))
        if server is None:
            server = self._api_servers[id(target)] = SharedServer(self.env)
        server.take(serial, then)

    def prefilled(self, engine: PrefillEngine, rank: int, rid: int) -> None:
        """A prompt is computed: the request goes on to a decode instance, through that
        instance's API server (its serial part, as at the prefill instance's: the proxy sends
        the request to the decode engine's own API server, which takes it in anew)."""
        decode = self._pick("decode")
        assert isinstance(decode, DecodeEngine)
        self._source[rid] = (engine, rank)
        take = decode.take
        self._api_serial(decode, lambda: take(rid, float(self.table.input_len[rid])))

    def admitted(self, engine: DecodeEngine, rank: int, slot: int, rid: int) -> None:
        source = self._source.pop(rid, None)
        if source is None:
            engine.activate(rank, slot)
            return
        prefill, prefill_rank = source
        prompt = float(self.table.input_len[rid])
        tail = self.handoff.tail(prompt)
        nbytes = self._kv_bytes(prompt - tail)  # the tail is computed there, not sent

        def activate(_: simpy.Event) -> None:
            engine.activate(rank, slot, tail)

        def arrived(event: simpy.Event) -> None:
            prefill.release(prefill_rank, rid)
            handoff = self.opts.handoff_ms / 1e3
            if handoff > 0:
                self.env.timeout(handoff).callbacks.append(activate)
            else:
                activate(event)

        self.network.send(prefill.name, engine.name, nbytes).callbacks.append(arrived)

    def finished(self, rid: int) -> None:
        self._done += 1
        self.traffic.done(rid)
        if self.progress is not None:
            pct = 100 * self._done // self.table.capacity
            if pct > self._reported:
                self._reported = pct
                self.progress(pct / 100.0)

    # ---- running -------------------------------------------------------------------------

    def result(self) -> SimResult:
        self.traffic.start()
        self.env.run()
        for engines in self.engines.values():
            for e in engines:
                e.settle_dp_waits()
        return self._collect()

    def _collect(self) -> SimResult:
        t, d = self.table, self.deployment
        done = t.measured()
        ran = list(self.engines)
        gpus = (d.gpus or d.gpus_used) if self.workload.mode == "serve" else sum(
            d.roles[r].gpus for r in ran)
        n = t.count
        ttft = (t.first_token - t.arrival)[:n][done]
        e2e = (t.finish - t.arrival)[:n][done]
        out = t.output_len[:n][done]
        decode_time = (t.finish - t.first_token)[:n][done]
        with np.errstate(divide="ignore", invalid="ignore"):
            tpot = np.where(out > 1, decode_time / (out - 1), np.nan)
        itl, weight = self.recorder.itl_samples()
        kv_wait = sum(e.kv.wait_s for es in self.engines.values() for e in es)
        end = float(np.nanmax(t.finish[:n][done], initial=0.0))
        start, stop = self.traffic.window
        counted = done  # requests whose tokens the throughput counts
        if stop is not None and stop > start:  # served in the window, over the window
            counted = done & (t.finish[:n] <= stop)
            end = stop
        return SimResult(
            gpus=gpus,
            prefill_gpus=d.roles["prefill"].gpus if "prefill" in ran else None,
            decode_gpus=d.roles["decode"].gpus if "decode" in ran else None,
            usd_per_gpu_hour=self.hardware.usd_per_gpu_hour,
            duration_s=max(end - start, 0.0),
            ttft_s=ttft, tpot_s=tpot, e2e_s=e2e,
            cached_input_tokens=int(t.cached[:n][counted].sum()),
            uncached_input_tokens=int(t.uncached[:n][counted].sum()),
            output_tokens=int(t.output_len[:n][counted].sum()),
            itl_s=itl, itl_weight=weight,
            breakdown_ms=dict(self.recorder.breakdown_ms),
            expert_imbalance=self.recorder.expert_imbalance,
            kv_admission_wait_s=kv_wait,
            timelines=self.recorder.timelines(),
            instances=dict(self.infos),
            steps=self.recorder.steps,
            priced_steps=sum(p.misses for p in self.pricers.values()),
            expert_loads=sum(p.expert_loads for p in self.pricers.values()),
            dp_wait_ms=self.recorder.dp_wait_ms,
            depth=t.depth[:n][done],
            session_tok_s=_session_speeds(t, done),
            host_loaded_tokens=int(t.host_loaded[:n][done].sum()),
            warmup_requests=int(t.warmup[:n].sum()),
            preempted_requests=sum(e.preempted for es in self.engines.values() for e in es
                                   if isinstance(e, AggregatedEngine)),
        )


def remembered(fn: Callable[[float], float],
               limit: int = 100_000) -> Callable[[float], float]:
    """`fn` remembering its results by argument (up to `limit`, then afresh): a request's KV
    size is asked for when it is admitted and again when it leaves, and prompt lengths recur."""
    memo: dict[float, float] = {}

    def get(x: float) -> float:
        got = memo.get(x)
        if got is None:
            if len(memo) >= limit:
                memo.clear()
            got = memo[x] = fn(x)
        return got
    return get


def _session_speeds(t: RequestTable, done: np.ndarray) -> np.ndarray:
    """Output tokens per second of each session tree over its measured span (first measured
    arrival to last measured completion); empty without session trees."""
    n = t.count
    tree = t.tree[:n][done]
    if not tree.size or tree.max() < 0:
        return np.zeros(0)
    keep = tree >= 0
    tree = tree[keep]
    arrival, finish = t.arrival[:n][done][keep], t.finish[:n][done][keep]
    out = t.output_len[:n][done][keep].astype(float)
    ids, inverse = np.unique(tree, return_inverse=True)
    first = np.full(len(ids), np.inf)
    last = np.zeros(len(ids))
    np.minimum.at(first, inverse, arrival)
    np.maximum.at(last, inverse, finish)
    tokens = np.bincount(inverse, weights=out, minlength=len(ids))
    span = last - first
    return tokens[span > 0] / span[span > 0]
