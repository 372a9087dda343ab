"""Timing one kernel call: triton's `do_bench` on a GPU, a robust median timer on the CPU.

Both give the median, the inter-quartile range and how many samples they took, in milliseconds.
The CPU timer warms up, batches calls shorter than `min_sample_s` into one sample so the clock's
resolution does not show, and stops early once a shape has used its time budget (after at least
`min_repeats` samples).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Timing:
    """Latency of one call."""

    median_ms: float
    iqr_ms: float
    """75th minus 25th percentile."""
    samples: int

    def columns(self) -> dict[str, float | int]:
        """The table columns of a measured row: latency (ms), its IQR and sample count."""
        return {"latency": self.median_ms, "latency_iqr": self.iqr_ms, "samples": self.samples}


@dataclass(frozen=True)
class CpuTimer:
    """Median of repeated wall-clock samples (time.perf_counter)."""

    warmup: int = 3
    repeats: int = 25
    min_repeats: int = 5
    min_sample_s: float = 2e-4
    budget_s: float = 1.0
    """Stop sampling one shape after this long (min_repeats samples are always taken)."""

    def __call__(self, fn: Callable[[], object]) -> Timing:
        for _ in range(self.warmup):
            fn()
        t0 = time.perf_counter()
        fn()
        once = max(time.perf_counter() - t0, 1e-9)
        inner = max(1, math.ceil(self.min_sample_s / once))
        samples: list[float] = []
        start = time.perf_counter()
        for i in range(self.repeats):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) / inner)
            if i + 1 >= self.min_repeats and time.perf_counter() - start > self.budget_s:
                break
        return summarize(samples)


@dataclass(frozen=True)
class CudaTimer:
    """triton.testing.do_bench: CUDA events around each call, the L2 cache flushed in between."""

    warmup_ms: float = 5.0
    rep_ms: float = 20.0

    def __call__(self, fn: Callable[[], object]) -> Timing:
        from triton.testing import do_bench

        q25, q50, q75 = do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms,
                                 quantiles=[0.25, 0.5, 0.75])
        samples = max(1, int(self.rep_ms / max(q50, 1e-6)))
        return Timing(float(q50), float(q75 - q25), samples)


Timer = Callable[[Callable[[], object]], Timing]


def summarize(samples_s: list[float]) -> Timing:
    """Median and IQR of samples given in seconds, as milliseconds."""
    ms = np.asarray(samples_s, dtype=float) * 1e3
    q25, q50, q75 = np.percentile(ms, [25, 50, 75])
    return Timing(float(q50), float(q75 - q25), len(ms))


def timer_for(kind: str, quick: bool) -> Timer:
    """The timer a device kind uses; `quick` trades repeats for wall time."""
    if kind == "cuda":
        return CudaTimer(2.0, 8.0) if quick else CudaTimer()
    return CpuTimer(warmup=1, repeats=7, min_repeats=3, budget_s=0.15) if quick else CpuTimer()
