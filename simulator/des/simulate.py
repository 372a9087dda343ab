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
from simulator.des.arrivals import Traffic
from simulator.des.engines import (
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
from simulator.des.metrics import InstanceInfo, Recorder, SimResult
from simulator.des.prefix_cache import BLOCK_TOKENS, BlockLRU
from simulator.des.pricing import StepPricer
from simulator.des.requests import RequestTable
from simulator.des.routers import ROUTERS, Router
from simulator.des.traces import Trace, read_trace
from simulator.des.transfer import KvNetwork
from simulator.resolve import resolve
from simulator.specs.deployment import Deployment
from simulator.specs.errors import SpecError
from simulator.specs.model import ModelSpec
from simulator.specs.workload import ClosedArrival, TraceArrival, Workload


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
    step_overhead_ms: float | None = None
    """Fixed cost of every engine step (scheduling, launches not hidden by the GPU); None: the
    cost model's default for the hardware kind."""
    handoff_ms: float = 0.0
    """P/D: fixed latency of a prefill-to-decode handoff besides moving the KV bytes (proxy
    hop, transfer setup, the decode side picking the request up)."""

    @classmethod
    def serving(cls, overhead: ServingOverhead) -> SimOptions:
        """Options that apply a serving stack's fixed latencies."""
        return cls(api_overhead_ms=overhead.api_overhead_ms,
                   step_overhead_ms=overhead.step_overhead_ms, handoff_ms=overhead.handoff_ms)


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
        self.calibration, self.placement = resolved.calibration, resolved.placement
        self.kv_tokens = {role: r.memory.kv_tokens for role, r in resolved.roles.items()}
        if workload.sessions is not None and isinstance(workload.arrival, TraceArrival):
            raise SpecError("sessions cannot be combined with trace arrival; a trace carries "
                            "its own prefix blocks (hash_ids)")
        seeds = np.random.SeedSequence(workload.seed).spawn(3)
        traffic_rng, popularity_rng = (np.random.default_rng(s) for s in seeds[:2])
        self._step_seeds = seeds[2]

        trace = self._trace()
        n = workload.requests if trace is None else min(workload.requests, len(trace))
        self.env = simpy.Environment()
        self.table = RequestTable(n)
        self.recorder = Recorder()
        self.popularity = self._popularity(popularity_rng, expert_counts)
        self.engines: dict[str, list[Engine]] = {}
        self.infos: dict[str, InstanceInfo] = {}
        self.pricers: dict[tuple[str, float], StepPricer] = {}
        self.shared = Shared(self.env, self.table, self.recorder, self,
                             workload.prefix_hit_rate,
                             self.model.kv_token_cost(deployment.precision.kv_cache,
                                                      deployment.precision.indexer_cache))
        for role in self._running_roles():
            self.engines[role] = [self._engine(role, i) for i in
                                  range(deployment.roles[role].instances)]
        self.routers: dict[str, Router] = {
            role: ROUTERS[deployment.roles[role].router_policy(role)]()
            for role in self.engines}
        self.network = KvNetwork(self.env, self.placement.transfer_gb_s)
        self.traffic = Traffic(self.env, workload, self.table, self.submit, traffic_rng, trace)
        a = workload.arrival
        if isinstance(a, ClosedArrival) and a.start == "spread":
            self.traffic.spread_s = self._request_seconds(a.concurrency)
        self._source: dict[int, tuple[PrefillEngine, int]] = {}
        """Request id -> the prefill instance and rank holding its KV until the transfer."""
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
        return read_trace(a.path, a.time_scale, self.workload.requests)

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
        cache = BlockLRU(kv_tokens * pricer.instance.dp // BLOCK_TOKENS)
        only_prefill = self.workload.mode == "prefill_only"
        if role == "prefill":
            return PrefillEngine(self.shared, name, spec, pricer, experts, kv_tokens, cache,
                                 finish_at_prefill=only_prefill)
        if role == "decode":
            return DecodeEngine(self.shared, name, spec, pricer, experts, kv_tokens)
        return AggregatedEngine(self.shared, name, spec, pricer, experts, kv_tokens, cache,
                                finish_at_prefill=only_prefill)

    # ---- the pipeline (engines call these) -------------------------------------------------

    def _pick(self, role: str) -> Engine:
        engines = self.engines[role]
        return engines[self.routers[role].pick(engines)]

    def submit(self, rid: int) -> None:
        """A request arrived; it reaches the scheduler after the API overhead."""
        delay = self.opts.api_overhead_ms / 1e3
        if delay > 0:
            self.env.timeout(delay).callbacks.append(lambda _: self._route(rid))
        else:
            self._route(rid)

    def _route(self, rid: int) -> None:
        role = next(iter(self.engines))
        target = self._pick(role)
        if self.workload.mode == "decode_only":
            assert isinstance(target, DecodeEngine)
            self.table.cached[rid] = self.table.input_len[rid]  # KV comes from the connector
            target.take(rid, float(self.table.input_len[rid]))
        elif isinstance(target, AggregatedEngine):
            target.take_prompt(rid)
        else:
            assert isinstance(target, PrefillEngine)
            target.take(rid)

    def prefilled(self, engine: PrefillEngine, rank: int, rid: int) -> None:
        decode = self._pick("decode")
        assert isinstance(decode, DecodeEngine)
        self._source[rid] = (engine, rank)
        decode.take(rid, float(self.table.input_len[rid]))

    def admitted(self, engine: DecodeEngine, rank: int, slot: int, rid: int) -> None:
        source = self._source.pop(rid, None)
        if source is None:
            engine.activate(rank, slot)
            return
        prefill, prefill_rank = source
        nbytes = self.model.kv_bytes(float(self.table.input_len[rid]),
                                     self.deployment.precision.kv_cache,
                                     self.deployment.precision.indexer_cache)

        def activate(_: simpy.Event) -> None:
            engine.activate(rank, slot)

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
        return self._collect()

    def _collect(self) -> SimResult:
        t, d = self.table, self.deployment
        done = t.done()
        ran = list(self.engines)
        gpus = (d.gpus or d.gpus_used) if self.workload.mode == "serve" else sum(
            d.roles[r].gpus for r in ran)
        ttft = (t.first_token - t.arrival)[: t.count][done]
        e2e = (t.finish - t.arrival)[: t.count][done]
        out = t.output_len[: t.count][done]
        decode_time = (t.finish - t.first_token)[: t.count][done]
        with np.errstate(divide="ignore", invalid="ignore"):
            tpot = np.where(out > 1, decode_time / (out - 1), np.nan)
        itl, weight = self.recorder.itl_samples()
        kv_wait = sum(e.kv.wait_s for es in self.engines.values() for e in es)
        return SimResult(
            gpus=gpus,
            prefill_gpus=d.roles["prefill"].gpus if "prefill" in ran else None,
            decode_gpus=d.roles["decode"].gpus if "decode" in ran else None,
            usd_per_gpu_hour=self.hardware.usd_per_gpu_hour,
            duration_s=float(np.nanmax(t.finish[: t.count], initial=0.0)),
            ttft_s=ttft, tpot_s=tpot, e2e_s=e2e,
            cached_input_tokens=int(t.cached[: t.count][done].sum()),
            uncached_input_tokens=int(t.uncached[: t.count][done].sum()),
            output_tokens=int(out.sum()),
            itl_s=itl, itl_weight=weight,
            breakdown_ms=dict(self.recorder.breakdown_ms),
            expert_imbalance=self.recorder.expert_imbalance,
            kv_admission_wait_s=kv_wait,
            timelines=self.recorder.timelines(),
            instances=dict(self.infos),
            steps=self.recorder.steps,
            priced_steps=sum(p.misses for p in self.pricers.values()),
            dp_wait_ms=self.recorder.dp_wait_ms,
        )
