"""What a run records, and the metrics it reports (the `simulate --json` key contract)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.cost import StepTime

DEPTH_BUCKETS = (("0", 0, 0), ("1-3", 1, 3), ("4-15", 4, 15), ("16-63", 16, 63),
                 ("64+", 64, 2**62))
"""Turn-depth buckets of `ttft_by_depth_ms` (turn index within its agent): name, first, last."""
BREAKDOWN = ("moe", "attention", "communication", "other")
"""Shares of step time reported; the cost model's `dense` (dense MLP, lm_head) counts as other."""


def percentiles(values: np.ndarray, qs: tuple[int, ...]) -> dict[str, float | None]:
    """{"p50": ..., ..., "mean": ...} of `values` (NaN dropped); None for each when there are
    none."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if not v.size:
        return {**{f"p{q}": None for q in qs}, "mean": None}
    return {**{f"p{q}": float(np.percentile(v, q)) for q in qs}, "mean": float(v.mean())}


def weighted_percentiles(values: np.ndarray, weights: np.ndarray,
                         qs: tuple[int, ...]) -> dict[str, float | None]:
    """Percentiles of `values` where each value counts `weights` times (lower percentile), and
    the weighted mean."""
    v, w = np.asarray(values, dtype=float), np.asarray(weights, dtype=float)
    keep = w > 0
    v, w = v[keep], w[keep]
    if not v.size:
        return {**{f"p{q}": None for q in qs}, "mean": None}
    mean = float(np.average(v, weights=w))
    order = np.argsort(v, kind="stable")
    v, cum = v[order], np.cumsum(w[order])
    out: dict[str, float | None] = {}
    for q in qs:
        i = int(np.searchsorted(cum, q / 100.0 * cum[-1], side="left"))
        out[f"p{q}"] = float(v[min(i, len(v) - 1)])
    out["mean"] = mean
    return out


@dataclass(frozen=True)
class Timeline:
    """One instance over time, one point per engine step (at the step's start)."""

    time: np.ndarray
    """Simulated seconds."""
    queue: np.ndarray
    """Requests routed to the instance and not yet admitted."""
    batch: np.ndarray
    """Requests in the step: decoding plus prefill chunks, over all ranks."""
    kv_use: np.ndarray
    """Share of the instance's KV space reserved, in [0, 1]."""


@dataclass(frozen=True)
class InstanceInfo:
    """Static facts about one simulated instance."""

    role: str
    ranks: int
    gpus: tuple[int, ...]
    """GPU ids the topology placed it on."""
    kv_tokens_per_rank: int
    a2a_gb_s: float
    expert_imbalance: float
    """Expected (max - mean) / mean of tokens per EP rank; 0 without expert parallelism."""


class ExactSum:
    """A sum of finite floats kept exactly, as a whole number of 2^-1074 (the least float), so
    that it does not depend on the order of its terms and a term counted k times is the term
    added k times; `value` rounds it once."""

    __slots__ = ("_units",)

    def __init__(self) -> None:
        self._units = 0

    def add(self, x: float, times: int = 1) -> None:
        num, den = float(x).as_integer_ratio()  # den: a power of two, at most 2^1074
        self._units += (num * times) << (1075 - den.bit_length())

    @property
    def value(self) -> float:
        return self._units / (1 << 1074)  # int / int rounds correctly


class Recorder:
    """Accumulates per-step facts while a run goes.

    Its sums are exact (`ExactSum`), so they do not depend on the order in which the instances'
    steps are recorded, and a run of k identical steps recorded at once (a macro-step) sums to
    what its steps recorded one by one do.
    """

    def __init__(self) -> None:
        self._points: dict[str, list[tuple[float, int, int, float, int, float]]] = {}
        """Instance -> (time, queue, batch, KV use, steps, seconds between them): `steps`
        points, the first at `time`, each the next `seconds` after the one before."""
        self._busy: dict[tuple[int, int], list[Any]] = {}
        """(id of a StepTime, ranks) -> [the StepTime, ranks, steps of it]."""
        self._imb_sum, self._imb_tokens = ExactSum(), ExactSum()
        self._dp: dict[str, tuple[ExactSum, list[int]]] = {}
        """Instance -> (wait GPU-ms of its sampled steps, [sampled steps, steps])."""
        self._itl: dict[float, int] = {}
        """Decode step seconds -> requests that waited that long for an output token."""
        self._kv_steps: dict[str, dict[int, np.ndarray]] = {}
        """Instance -> index of an entry of its points -> the KV use of each of its steps (where
        it grows step by step)."""
        self.steps = 0

    def step(self, name: str, t: float, queue: int, batch: int, kv_use: float | np.ndarray,
             st: StepTime, ranks: int, steps: int = 1, every: float = 0.0) -> None:
        """`steps` steps of instance `name` (of `ranks` ranks) priced `st`, the first at `t` and
        each of the others `every` seconds after the one before, each with `queue` requests
        waiting, `batch` in the step and `kv_use` of the KV space in use (or one for each
        step)."""
        self.steps += steps
        points = self._points.setdefault(name, [])
        if isinstance(kv_use, np.ndarray):
            self._kv_steps.setdefault(name, {})[len(points)] = kv_use
            kv_use = 0.0
        points.append((t, queue, batch, kv_use, steps, every))
        busy = self._busy.get((id(st), ranks))
        if busy is None:
            self._busy[(id(st), ranks)] = [st, ranks, steps]
        else:
            busy[2] += steps

    @property
    def breakdown_ms(self) -> dict[str, float]:
        """GPU-milliseconds per category (step time x ranks of the instance)."""
        sums = {k: ExactSum() for k in BREAKDOWN}
        for st, ranks, steps in self._busy.values():
            for k, ms in st.breakdown.items():
                sums[k if k in sums else "other"].add(float(ms) * ranks, steps)
        return {k: v.value for k, v in sums.items()}

    def _dp_entry(self, name: str) -> tuple[ExactSum, list[int]]:
        got = self._dp.get(name)
        if got is None:
            got = self._dp[name] = (ExactSum(), [0, 0])
        return got

    def dp_step(self, name: str, steps: int = 1) -> None:
        """`steps` steps of DP instance `name`, whose attention is set by its busiest DP
        rank."""
        self._dp_entry(name)[1][1] += steps

    def dp_waits(self, name: str, waits: list[tuple[float, int]]) -> None:
        """Priced waits of sampled steps of DP instance `name` (its steps counted by
        `dp_step`): (how long the other ranks wait in all, in ms: the sum over ranks of the
        busiest rank's attention ms less their own; how many sampled steps had it)."""
        total, counts = self._dp_entry(name)
        for wait_ms, sampled in waits:
            total.add(wait_ms, sampled)
            counts[0] += sampled

    @property
    def dp_wait_ms(self) -> float:
        """GPU-ms DP ranks spent waiting in lock-step for a busier rank's attention: each
        instance's sampled waits scaled to all its steps."""
        return sum(w.value * n / k for _, (w, (k, n)) in sorted(self._dp.items()) if k)

    def imbalance(self, value: float, tokens: float, steps: int = 1) -> None:
        """`steps` steps' EP imbalance, weighted by their tokens."""
        self._imb_sum.add(value * tokens, steps)
        self._imb_tokens.add(tokens, steps)

    def itl(self, seconds: float, requests: int, steps: int = 1) -> None:
        """`steps` decode steps of `seconds` each gave `requests` requests their next
        (non-first) output."""
        if requests:
            self._itl[seconds] = self._itl.get(seconds, 0) + requests * steps

    @property
    def expert_imbalance(self) -> float:
        tokens = self._imb_tokens.value
        return self._imb_sum.value / tokens if tokens else 0.0

    def itl_samples(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct decode step durations, in order, and how many outputs waited each."""
        seconds = sorted(self._itl)
        return (np.array(seconds, dtype=float),
                np.array([self._itl[s] for s in seconds], dtype=float))

    def timelines(self) -> dict[str, Timeline]:
        out = {}
        for name, pts in self._points.items():
            a = np.array(pts, dtype=float).reshape(-1, 6)
            steps = a[:, 4].astype(np.int64)
            a = np.repeat(a, steps, axis=0)
            time = a[:, 0].copy()
            first = np.cumsum(steps) - steps  # each entry's first point
            for i in range(1, int(steps.max(initial=1))):  # later points: one more `every`
                at = first[steps > i] + i
                time[at] = time[at - 1] + a[at, 5]
            kv = a[:, 3].copy()
            for entry, uses in self._kv_steps.get(name, {}).items():
                kv[first[entry]:first[entry] + len(uses)] = uses
            out[name] = Timeline(time, a[:, 1].astype(np.int64), a[:, 2].astype(np.int64), kv)
        return out


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


@dataclass(frozen=True)
class SimResult:
    """The outcome of one simulation; `metrics()` gives the JSON contract."""

    gpus: int
    """GPUs the throughput and cost are spread over (the running roles' in isolated modes)."""
    prefill_gpus: int | None
    """GPUs of the prefill role, when it ran."""
    decode_gpus: int | None
    """GPUs of the decode role, when it ran."""
    usd_per_gpu_hour: float
    duration_s: float
    """Simulated seconds from the start to the last completion."""
    ttft_s: np.ndarray
    """Per completed request."""
    tpot_s: np.ndarray
    """Per completed request with more than one output token; NaN otherwise."""
    e2e_s: np.ndarray
    cached_input_tokens: int
    uncached_input_tokens: int
    output_tokens: int
    itl_s: np.ndarray
    """Decode step durations seen by requests past their first token (distinct, in order)..."""
    itl_weight: np.ndarray
    """...and how many times a request waited each (a step's requests, summed over the steps
    that took that long)."""
    breakdown_ms: dict[str, float]
    expert_imbalance: float
    kv_admission_wait_s: float
    timelines: dict[str, Timeline] = field(repr=False)
    instances: dict[str, InstanceInfo] = field(repr=False)
    steps: int = 0
    """Engine steps simulated over all instances."""
    priced_steps: int = 0
    """Distinct (rounded) step rows whose steps the cost model composed."""
    expert_loads: int = 0
    """Distinct signatures (rows and most-loaded EP rank) finished from a composed step with
    one routed-experts price (simulator/des/pricing.py)."""
    dp_wait_ms: float = 0.0
    """GPU-milliseconds DP ranks waited for a busier rank's attention."""
    depth: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)
    """Per completed request: its turn index within its agent (0 without sessions)."""
    session_tok_s: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    """Per session tree: output tokens per second over its measured span."""
    host_loaded_tokens: int = 0
    """Prompt tokens loaded from the host-memory tier instead of computed."""
    warmup_requests: int = 0
    """Warmup turns sent before the measured window (in no other figure)."""
    preempted_requests: int = 0
    """Times an instance took a running request's KV back to make room (optimistic admission,
    `slots.KV_ADMISSION`); each such request computes its prompt and output so far again."""

    @property
    def completed(self) -> int:
        return len(self.ttft_s)

    @property
    def total_tokens(self) -> int:
        return self.cached_input_tokens + self.uncached_input_tokens + self.output_tokens

    def metrics(self) -> dict[str, Any]:
        """The `simulate --json` object (DESIGN.md): plain numbers, None for absent roles."""
        d = self.duration_s if self.duration_s > 0 else float("nan")
        inputs = self.cached_input_tokens + self.uncached_input_tokens
        per_gpu = self.total_tokens / d / self.gpus
        gpu_hours = self.gpus * d / 3600.0
        cost = (self.usd_per_gpu_hour * gpu_hours / (self.total_tokens / 1e6)
                if self.total_tokens else None)
        busy = sum(self.breakdown_ms.values())
        tpot_ms = self.tpot_s * 1e3
        with np.errstate(divide="ignore", invalid="ignore"):
            user = np.where(self.tpot_s > 0, 1.0 / self.tpot_s, np.nan)
        qs = (50, 90, 99)
        out: dict[str, Any] = {
            "gpus": self.gpus,
            "duration_s": _num(self.duration_s),
            "completed": self.completed,
            "throughput_tok_s_gpu": _num(per_gpu),
            "output_tok_s_gpu": _num(self.output_tokens / d / self.gpus),
            "prefill_input_tok_s_gpu": (_num(inputs / d / self.prefill_gpus)
                                        if self.prefill_gpus else None),
            "prefill_computed_tok_s_gpu": (_num(self.uncached_input_tokens / d
                                                / self.prefill_gpus)
                                           if self.prefill_gpus else None),
            "decode_output_tok_s_gpu": (_num(self.output_tokens / d / self.decode_gpus)
                                        if self.decode_gpus else None),
            "ttft_ms": percentiles(self.ttft_s * 1e3, qs),
            "tpot_ms": percentiles(tpot_ms, qs),
            "itl_ms": weighted_percentiles(self.itl_s * 1e3, self.itl_weight, qs),
            "tok_s_user": percentiles(user, (50, 90)),
            "step_breakdown": {k: (self.breakdown_ms[k] / busy if busy else 0.0)
                               for k in BREAKDOWN},
            "expert_imbalance": float(self.expert_imbalance),
            "dp_imbalance": float(self.dp_wait_ms / busy) if busy else 0.0,
            "cost_per_mtok_usd": _num(cost),
            "cached_input_tokens": self.cached_input_tokens,
            "uncached_input_tokens": self.uncached_input_tokens,
            "output_tokens": self.output_tokens,
            "kv_admission_wait_s": float(self.kv_admission_wait_s),
            "cache_hit_share": _num(self.cached_input_tokens / inputs) if inputs else 0.0,
            "host_loaded_tokens": self.host_loaded_tokens,
            "warmup_requests": self.warmup_requests,
            "preempted_requests": self.preempted_requests,
            "ttft_by_depth_ms": self._ttft_by_depth(),
            "session_tok_s": percentiles(self.session_tok_s, (50,)),
        }
        return out

    def _ttft_by_depth(self) -> dict[str, dict[str, float | None]]:
        """TTFT percentiles per bucket of turn depth (DEPTH_BUCKETS) that has requests."""
        out = {}
        depth = self.depth if len(self.depth) == len(self.ttft_s) else np.zeros(
            len(self.ttft_s), dtype=np.int64)
        for name, lo, hi in DEPTH_BUCKETS:
            mask = (depth >= lo) & (depth <= hi)
            if mask.any():
                out[name] = percentiles(self.ttft_s[mask] * 1e3, (50, 90))
        return out
