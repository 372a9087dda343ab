"""The what-if page's work: simulate one deployment under one workload, and derive what the page
draws from the result (metric cards, throughput over time, timelines, step time per role, expert
load per EP rank before and after EPLB).

The simulation runs exactly as `rackplan simulate` runs it (same calibration tables and serving
overheads), so the page's numbers are the CLI's numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.evaluate import calibration_for, check_workload_fits, overhead_for
from simulator.cost.step import Batch, StepTime, step_time
from simulator.des import SimOptions, SimResult, Timeline, simulate
from simulator.des.experts import ExpertLoad, power_law_popularity
from simulator.eplb import Placement, imbalance
from simulator.resolve import Resolved, resolve
from simulator.specs.deployment import Deployment
from simulator.specs.model import load_model
from simulator.specs.workload import Workload

Progress = Callable[[float], None]
"""Called with the share of requests completed, in [0, 1]."""


@dataclass(frozen=True)
class Card:
    """One metric card: a label, the formatted value and a tooltip."""

    label: str
    value: str
    help: str


@dataclass(frozen=True)
class StepView:
    """One engine step of one instance of a role, priced by the cost model."""

    role: str
    batch: str
    """The batch priced, in words."""
    step: StepTime


@dataclass(frozen=True)
class ExpertView:
    """Tokens per EP rank of one role's instances, per MoE layer, before and after EPLB."""

    role: str
    ranks: int
    redundant: int
    before: np.ndarray
    """(layers, ranks) share of each layer's tokens per rank with the initial linear placement
    (logical experts in order, redundant slots on experts 0..R-1)."""
    after: np.ndarray
    """(layers, ranks) the same with the placement the simulator uses (EPLB when R > 0)."""

    @property
    def imbalance_before(self) -> float:
        """(max - mean) / mean tokens per rank, averaged over layers, before EPLB."""
        return imbalance(self.before)

    @property
    def imbalance_after(self) -> float:
        """The same after EPLB."""
        return imbalance(self.after)


@dataclass(frozen=True)
class WhatIf:
    """One simulation and everything the page shows of it."""

    deployment: Deployment
    workload: Workload
    result: SimResult
    metrics: dict[str, Any]
    steps: dict[str, StepView]
    experts: dict[str, ExpertView]
    wall_s: float

    @property
    def cache(self) -> CacheView:
        """Prefix-cache use per tier and TTFT by turn depth."""
        return cache_view(self.result)


def run_whatif(deployment: Deployment, workload: Workload,
               progress: Progress | None = None) -> WhatIf:
    """Simulate `deployment` under `workload` as `rackplan simulate` does; SpecError for a
    deployment or workload that cannot run."""
    start = time.monotonic()
    check_workload_fits(workload, load_model(deployment.model))
    calibration = calibration_for(deployment)
    overhead = overhead_for(deployment)
    options = SimOptions.serving(overhead)  # as sim_options gives them
    result = simulate(deployment, workload, calibration=calibration, progress=progress,
                      options=options)
    resolved = resolve(deployment, calibration, overhead=overhead)
    return WhatIf(deployment=deployment, workload=workload, result=result,
                  metrics=result.metrics(), steps=step_views(resolved, result),
                  experts=expert_views(resolved, workload, options),
                  wall_s=time.monotonic() - start)


# --- metric cards ------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str, unit: str) -> str:
    return "-" if value is None else f"{format(value, spec)} {unit}".strip()


def metric_cards(metrics: dict[str, Any]) -> list[Card]:
    """The headline figures of a `simulate --json` object, formatted."""
    ttft, tpot, user = metrics["ttft_ms"], metrics["tpot_ms"], metrics["tok_s_user"]
    return [
        Card("Throughput / GPU", _fmt(metrics["throughput_tok_s_gpu"], ",.0f", "tok/s"),
             "All tokens (cached + uncached input + output) per second over all GPUs."),
        Card("Output / GPU", _fmt(metrics["output_tok_s_gpu"], ",.0f", "tok/s"),
             "Output tokens per second over all GPUs."),
        Card("TTFT p50", _fmt(ttft["p50"], ",.0f", "ms"), "Median time to first token."),
        Card("TTFT p90", _fmt(ttft["p90"], ",.0f", "ms"), "90th percentile time to first token."),
        Card("TPOT p50", _fmt(tpot["p50"], ",.1f", "ms"), "Median time per output token."),
        Card("TPOT p90", _fmt(tpot["p90"], ",.1f", "ms"),
             "90th percentile time per output token."),
        Card("tok/s/user p50", _fmt(user["p50"], ",.1f", ""),
             "Median output tokens per second seen by one request (1 / TPOT)."),
        Card("tok/s/user p90", _fmt(user["p90"], ",.1f", ""),
             "90th percentile of tokens per second per request."),
        Card("$ / M tokens", _fmt(metrics["cost_per_mtok_usd"], ",.3f", ""),
             "GPU-hours times the hardware's price, per million tokens (all tokens)."),
        Card("Prefix-cache hits", _fmt(100 * (metrics.get("cache_hit_share") or 0.0), ".1f",
                                       "%"),
             "Share of input tokens served from the prefix cache (HBM or host tier) instead "
             "of computed."),
    ]


# --- series over time ----------------------------------------------------------------------------


def throughput_series(result: SimResult, bins: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """Output tokens per second per GPU over simulated time: (bin centres in s, values).

    Output is made in decode steps, each request in a step advancing by the same expected number
    of tokens, so each step's share of the output is its share of the decode request-steps
    (aggregated instances also count their prefill chunks in a step's batch). The series is
    scaled so that its time-average over the run equals the reported output per GPU.
    """
    decoding = [n for n, info in result.instances.items() if info.role != "prefill"]
    names = [n for n in decoding if n in result.timelines] or list(result.timelines)
    if not names or result.duration_s <= 0 or result.output_tokens <= 0:
        return np.zeros(0), np.zeros(0)
    times = np.concatenate([result.timelines[n].time for n in names])
    weight = np.concatenate([result.timelines[n].batch for n in names]).astype(float)
    edges = np.linspace(0.0, result.duration_s, max(bins, 1) + 1)
    summed, _ = np.histogram(np.clip(times, 0.0, result.duration_s), bins=edges, weights=weight)
    total = summed.sum()
    if total <= 0:
        return np.zeros(0), np.zeros(0)
    width = edges[1] - edges[0]
    values = summed / total * result.output_tokens / width / result.gpus
    return (edges[:-1] + edges[1:]) / 2, values


def downsample(timeline: Timeline, max_points: int = 1500) -> Timeline:
    """Every k-th step of a timeline so that at most `max_points` remain (the last kept)."""
    n = len(timeline.time)
    if n <= max_points:
        return timeline
    idx = np.unique(np.r_[np.arange(0, n, -(-n // max_points)), n - 1])
    return Timeline(timeline.time[idx], timeline.queue[idx], timeline.batch[idx],
                    timeline.kv_use[idx])


def sample(timeline: Timeline, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(queue, batch, KV use) of one instance at the times of `grid`: each the value of its
    last step at or before that time (0 before its first step)."""
    idx = np.searchsorted(timeline.time, grid, side="right") - 1
    ok = idx >= 0
    at = np.clip(idx, 0, None)

    def pick(v: np.ndarray) -> np.ndarray:
        return np.where(ok, v[at], 0).astype(float) if len(v) else np.zeros(len(grid))

    return pick(timeline.queue), pick(timeline.batch), pick(timeline.kv_use)


@dataclass(frozen=True)
class RoleSeries:
    """One role's instances together over simulated time."""

    role: str
    instances: int
    time: np.ndarray
    queue: np.ndarray
    """Requests queued at all of the role's instances."""
    batch: np.ndarray
    """Requests in the step, summed over the role's instances."""
    kv_use: np.ndarray
    """KV-cache use, the mean over the role's instances (0..1)."""


def role_series(result: SimResult, points: int = 300) -> dict[str, RoleSeries]:
    """Per role: its instances' queue and batch summed and KV use averaged on one time grid
    (over every step simulated, warmup turns included), so that a role of many instances reads
    as one line."""
    ends = [float(t.time[-1]) for t in result.timelines.values() if len(t.time)]
    grid = np.linspace(0.0, max([*ends, result.duration_s, 1e-9]), max(points, 2))
    out: dict[str, RoleSeries] = {}
    for role in dict.fromkeys(info.role for info in result.instances.values()):
        names = [n for n, info in result.instances.items()
                 if info.role == role and n in result.timelines]
        if not names:
            continue
        q, b, kv = (np.sum(parts, axis=0) for parts in zip(
            *(sample(result.timelines[n], grid) for n in names), strict=True))
        out[role] = RoleSeries(role, len(names), grid, q, b, kv / len(names))
    return out


def instances_by_role(result: SimResult) -> dict[str, list[str]]:
    """Instance names that have a timeline, per role, in the simulator's order."""
    out: dict[str, list[str]] = {}
    for name, info in result.instances.items():
        if name in result.timelines:
            out.setdefault(info.role, []).append(name)
    return out


@dataclass(frozen=True)
class CacheView:
    """Where the input tokens came from, and TTFT by how deep in a session a turn is."""

    hit_share: float
    """Share of input tokens served from the prefix cache (either tier)."""
    tiers: dict[str, int]
    """Input tokens per source: the HBM prefix cache, the host tier, computed."""
    ttft_by_depth: dict[str, dict[str, float | None]]
    """TTFT percentiles (ms) per bucket of turn depth (`simulate --json`'s ttft_by_depth_ms)."""


def cache_view(result: SimResult) -> CacheView:
    """The prefix cache's use per tier and TTFT by turn depth of a simulation."""
    m = result.metrics()
    host = result.host_loaded_tokens
    return CacheView(hit_share=float(m.get("cache_hit_share") or 0.0),
                     tiers={"HBM cache": max(result.cached_input_tokens - host, 0),
                            "host tier": host,
                            "computed": result.uncached_input_tokens},
                     ttft_by_depth=dict(m.get("ttft_by_depth_ms") or {}))


# --- step time per role ------------------------------------------------------------------------


def _mean_batch_per_rank(result: SimResult, role: str, ranks: int) -> float:
    """Mean requests per rank in the steps of a role's instances (0 when none ran)."""
    batches = [result.timelines[n].batch for n, info in result.instances.items()
               if info.role == role and n in result.timelines]
    steps = np.concatenate(batches) if batches else np.zeros(0)
    return float(steps.mean()) / ranks if steps.size else 0.0


def step_views(resolved: Resolved, result: SimResult) -> dict[str, StepView]:
    """Each role's step at the batch its instances ran on average, priced by the cost model
    (experts evenly loaded)."""
    done = max(result.completed, 1)
    mean_in = (result.cached_input_tokens + result.uncached_input_tokens) / done
    mean_cached = result.cached_input_tokens / done
    mean_out = result.output_tokens / done
    out: dict[str, StepView] = {}
    for name, role in resolved.roles.items():
        inst, spec = role.instance, role.spec
        per_rank = _mean_batch_per_rank(result, name, inst.ranks)
        if name == "prefill":
            chunks = max(per_rank, 1.0)
            tokens = min(float(spec.max_num_batched_tokens),
                         chunks * max(mean_in - mean_cached, 1.0))
            batch = Batch.prefill(inst.dp, tokens=tokens, requests=chunks, context=mean_cached)
            words = (f"{tokens:,.0f} prompt tokens in {chunks:.1f} chunks per rank, "
                     f"{mean_cached:,.0f} cached")
        else:
            requests = max(min(per_rank, float(spec.max_num_seqs)), 1.0)
            context = mean_in + mean_out / 2
            batch = Batch.decode(inst.dp, requests=requests, context=context)
            words = f"{requests:.1f} decoding requests per rank at {context:,.0f} tokens of KV"
        out[name] = StepView(name, words, step_time(inst, batch, resolved.calibration))
    return out


# --- expert load -------------------------------------------------------------------------------


def linear_placement(layers: int, experts: int, redundant: int) -> Placement:
    """The placement before any rebalancing: slot i holds expert i, and the R redundant slots
    hold experts 0..R-1 again (vLLM's initial layout)."""
    slots = np.r_[np.arange(experts), np.arange(redundant) % experts].astype(np.int64)
    replicas = np.bincount(slots, minlength=experts).astype(np.int64)
    width = int(replicas.max())
    log2phy = np.full((experts, width), -1, dtype=np.int64)
    seen = np.zeros(experts, dtype=np.int64)
    for slot, expert in enumerate(slots):
        log2phy[expert, seen[expert]] = slot
        seen[expert] += 1
    return Placement(phy2log=np.tile(slots, (layers, 1)),
                     log2phy=np.tile(log2phy, (layers, 1, 1)),
                     replicas=np.tile(replicas, (layers, 1)))


def expert_popularity(resolved: Resolved, workload: Workload, options: SimOptions) -> np.ndarray:
    """The per-layer expert popularity the simulator draws for this workload's seed."""
    m = resolved.model
    seeds = np.random.SeedSequence(workload.seed).spawn(3)
    return power_law_popularity(np.random.default_rng(seeds[1]), m.moe_layers,
                                m.n_routed_experts, options.expert_alpha,
                                options.expert_max_ratio)


def expert_views(resolved: Resolved, workload: Workload,
                 options: SimOptions) -> dict[str, ExpertView]:
    """Per expert-parallel role: tokens per rank before and after EPLB (none for dense
    models)."""
    m = resolved.model
    roles = {n: r for n, r in resolved.roles.items() if m.is_moe and r.instance.ep > 1}
    if not roles:
        return {}
    popularity = expert_popularity(resolved, workload, options)
    out: dict[str, ExpertView] = {}
    for name, role in roles.items():
        ranks, redundant = role.instance.ep, role.spec.redundant_experts
        load = ExpertLoad(popularity, ranks, redundant, m.top_k)
        before = linear_placement(m.moe_layers, m.n_routed_experts, redundant)
        out[name] = ExpertView(name, ranks, redundant,
                               before=before.rank_load(popularity, ranks),
                               after=load.placement.rank_load(popularity, ranks))
    return out
