"""Multi-fidelity: which screened points are worth a simulation.

The screen's estimates are biased (they ignore ramp-up, imbalance and queueing variance), so
the gate first corrects them by how simulation compared with the screen on the points simulated
so far: per layout and metric, the median ratio simulated / screened. A point is simulated only
when, corrected and with some slack, it can plausibly meet every SLO, and it is not clearly
worse than the best so far. Objective slo: its corrected throughput is within `margin` of the
best of (a) the feasible simulated plans and (b) the corrected estimates of SLO-plausible points
not simulated yet — so simulations go to the points the screen ranks highest (the search
re-enqueues a screened point that blocks others, so that it is simulated in turn). Objective pareto:
it is not dominated by `margin` on both axes by a feasible simulated plan. A point whose
estimate matches one already simulated (it differs only in what the screen cannot see, such as
redundant experts or an unreached batch limit) is not simulated again. The first `warmup`
screened points are only screened, so that the first simulation goes to the best of them.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner.objectives import SLO, THROUGHPUT, USER_SPEED, metric_value
from planner.screen import SATURATED_TTFT_MS

TWIN = "same estimate as simulated trial"
"""How the reason for skipping a twin of a simulated point starts (after 'screen: ')."""


@dataclass(frozen=True)
class Seen:
    """A point the search has screened and/or simulated: what the gate learns from."""

    number: int
    """Trial number."""
    layout: str
    """pd or aggregated."""
    screen: Mapping[str, Any] | None
    """The screen's estimate (None when it was not screened)."""
    metrics: Mapping[str, Any] | None = None
    """The simulation's metrics (None when it was not simulated)."""
    feasible: bool = False
    """Whether the simulated metrics meet every SLO."""


@dataclass(frozen=True)
class Decision:
    """Whether to simulate a point, and why not."""

    simulate: bool
    reason: str = ""
    """Why not ('' when simulated)."""
    blocker: int | None = None
    """The screened, never simulated trial whose estimate kept this point out; worth
    simulating itself (the search re-enqueues it)."""


@dataclass(frozen=True)
class Gate:
    """Decides from a screen estimate whether to simulate a point."""

    slos: tuple[SLO, ...]
    objective: str = "slo"
    """slo or pareto."""
    slack: float = 0.15
    """Relative slack on each SLO bound for corrected estimates."""
    margin: float = 0.15
    """How much worse than the best so far (relative) a corrected estimate may look."""
    same: float = 0.01
    """Estimates this close (relative, on every metric the gate reads) to a simulated point's
    count as the same point: simulating it again would teach nothing."""
    warmup: int = 8
    """Screened points to see before the first simulation, so that it goes to the best of them
    rather than to the first plausible one."""
    min_pairs: int = 3
    """Screen/simulation pairs needed before a correction is used (else 1)."""
    window: int = 25
    """Most recent pairs a correction is the median of."""

    def correction(self, metric: str, layout: str, history: Sequence[Seen]) -> float:
        """Median of simulated / screened `metric` over recent pairs of this layout (of all
        layouts when this one has too few), clipped to [0.2, 5]; 1 without enough pairs."""
        for same in (True, False):
            ratios = []
            for h in history:
                if h.screen is None or h.metrics is None or (same and h.layout != layout):
                    continue
                s, m = metric_value(h.screen, metric), metric_value(h.metrics, metric)
                if s and m and s < SATURATED_TTFT_MS:
                    ratios.append(m / s)
            ratios = ratios[-self.window:]
            if len(ratios) >= self.min_pairs:
                return min(max(statistics.median(ratios), 0.2), 5.0)
        return 1.0

    def decide(self, layout: str, estimate: Mapping[str, Any],
               history: Sequence[Seen]) -> Decision:
        """Whether to simulate a point of `layout` with screen `estimate`."""
        fix = _Corrections(self, history)
        twin = self._twin(layout, estimate, history)
        if twin is not None:
            return Decision(False, f"screen: {TWIN} {twin}")
        why = self._implausible(layout, estimate, fix)
        if why:
            return Decision(False, why)
        screened = sum(h.screen is not None for h in history)
        if screened < self.warmup:
            return Decision(False, f"screen: warming up ({screened + 1} of {self.warmup} "
                                   "screened)")
        tput = fix.value(estimate, THROUGHPUT, layout)
        feasible = [h.metrics for h in history if h.feasible and h.metrics is not None]
        if self.objective == "slo":
            best = max((metric_value(m, THROUGHPUT) or 0.0 for m in feasible), default=0.0)
            hopes = [(fix.value(h.screen, THROUGHPUT, h.layout), h.number) for h in history
                     if h.metrics is None and h.screen is not None
                     and not self._implausible(h.layout, h.screen, fix)]
            hope, number = max(hopes, default=(0.0, None))
            ref = max(best, hope)
            if tput < ref * (1 - self.margin):
                what = "best simulated" if ref == best else "best screened"
                return Decision(False, f"screen: throughput ~{tput:,.0f} tok/s/GPU < "
                                       f"{1 - self.margin:.0%} of the {what} {ref:,.0f}",
                                None if ref == best else number)
            return Decision(True)
        user = fix.value(estimate, USER_SPEED, layout)
        for m in feasible:
            t, u = metric_value(m, THROUGHPUT) or 0.0, metric_value(m, USER_SPEED) or 0.0
            if t >= tput * (1 + self.margin) and u >= user * (1 + self.margin):
                return Decision(False, f"screen: dominated by a simulated plan ({t:,.0f} "
                                       f"tok/s/GPU, {u:,.0f} tok/s/user)")
        return Decision(True)

    def _implausible(self, layout: str, estimate: Mapping[str, Any],
                     fix: _Corrections) -> str:
        """Why a corrected estimate cannot plausibly meet the SLOs ('' when it can)."""
        for slo in self.slos:
            raw = metric_value(estimate, slo.metric)
            if raw is None:
                continue
            if slo.bound == "upper" and raw >= SATURATED_TTFT_MS:
                return f"screen: {slo.metric} unbounded (capacity below the load)"
            v = raw * fix.factor(slo.metric, layout)
            if slo.bound == "upper" and v > slo.value * (1 + self.slack):
                return f"screen: {slo.metric} ~{v:,.0f} > {slo.value:g} (SLO)"
            if slo.bound == "lower" and v < slo.value * (1 - self.slack):
                return f"screen: {slo.metric} ~{v:,.1f} < {slo.value:g} (SLO)"
        return ""

    def _twin(self, layout: str, estimate: Mapping[str, Any],
              history: Sequence[Seen]) -> int | None:
        """A simulated point of this layout whose screen estimate matches this one."""
        keys = {THROUGHPUT, USER_SPEED, *(s.metric for s in self.slos)}
        for h in history:
            if h.screen is None or h.metrics is None or h.layout != layout:
                continue
            if all(_close(metric_value(estimate, k), metric_value(h.screen, k), self.same)
                   for k in keys):
                return h.number
        return None


class _Corrections:
    """The gate's corrections for one decision, each computed once."""

    def __init__(self, gate: Gate, history: Sequence[Seen]) -> None:
        self.gate, self.history = gate, history
        self._cache: dict[tuple[str, str], float] = {}

    def factor(self, metric: str, layout: str) -> float:
        key = (metric, layout)
        if key not in self._cache:
            self._cache[key] = self.gate.correction(metric, layout, self.history)
        return self._cache[key]

    def value(self, estimate: Mapping[str, Any], metric: str, layout: str) -> float:
        """The corrected estimate of a metric (0 when absent)."""
        return (metric_value(estimate, metric) or 0.0) * self.factor(metric, layout)


def _close(a: float | None, b: float | None, tol: float) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-9)
