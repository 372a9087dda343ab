"""Multi-fidelity: which screened points are worth a simulation.

The screen's estimates are biased (they ignore ramp-up, imbalance and queueing variance), so
the gate first corrects them by how simulation compared with the screen on the points simulated
so far: per layout and metric, the median ratio simulated / screened (`Fit.factor`). What is
left after the correction is the screen's measured error: over the same pairs, the largest
amount by which a simulated value came out above its corrected estimate (`Fit.over`, in log) and
below it (`Fit.under`). Before pairs measure it the error is taken to be `prior` either way, and
it only gives way to the measured one as pairs accumulate: the bound is the measured largest
deviation, pulled up toward the prior as if the prior had been seen `prior_pairs` times.

A point is simulated only when it can plausibly meet every SLO and it is not clearly worse than
the best so far. Plausible: no SLO is missed by more than the screen's error, so that a point the
simulation would accept is not screened out (the screen never contradicts the simulation). An
upper bound (latency) is missed when the corrected estimate exceeds the bound times exp(under)
— the simulation has come out that much below its estimate — and a lower bound (tokens/s per
user, rates) when it is below the bound times exp(-over); never tighter than the configured
`slack`. An open-loop rate above the screen's capacity is "unbounded" only when the
capacity, raised by the throughput error, still falls short of it.

Not clearly worse, objective slo: its corrected throughput is within `margin` of the best of
(a) the feasible simulated plans and (b) the corrected estimates of SLO-plausible points not
simulated yet — so simulations go to the points the screen ranks highest (the search re-enqueues
a screened point that blocks others, so that it is simulated in turn, and asks again the points
a blocker kept out once its simulation lets them through) — or within the measured
throughput error (exp(-over), without the prior: this rule orders the simulations, it does not
decide feasibility) where that is wider. Objective pareto: it is not dominated by a feasible
simulated plan on both axes by `margin`, or by the measured error of that axis where wider. A
point whose estimate matches one already simulated (it differs only in what the screen cannot
see, such as redundant experts or an unreached batch limit) is not simulated again — unless
that one missed the SLOs by at most `near` (10 %), where what the screen cannot see may tip it
over, and then for at most `near_twins` twins of one estimate with different outcomes (twice as
many in all). The first
`warmup` screened points are only screened, so that the first simulation goes to the best of
them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from planner.objectives import SLO, THROUGHPUT, USER_SPEED, metric_value, violation
from planner.screen import SATURATED_TTFT_MS

Side = Literal["over", "under"]
"""Which way a simulation came out of its corrected estimate: above (over) or below (under)."""
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
class Fit:
    """How the simulation compared with the screen on one metric: the correction and the error
    that is left after it."""

    factor: float = 1.0
    """Median simulated / screened over the pairs (1 without `min_pairs` of them)."""
    over: float = 0.0
    """Largest log(simulated / corrected estimate) over the pairs, at least 0."""
    under: float = 0.0
    """Largest log(corrected estimate / simulated) over the pairs, at least 0."""
    pairs: int = 0
    """Screen/simulation pairs it comes from."""


@dataclass(frozen=True)
class Gate:
    """Decides from a screen estimate whether to simulate a point."""

    slos: tuple[SLO, ...]
    objective: str = "slo"
    """slo or pareto."""
    slack: float = 0.15
    """Least relative slack on each SLO bound for corrected estimates (the measured error of
    the screen widens it)."""
    margin: float = 0.15
    """How much worse than the best so far (relative) a corrected estimate may look."""
    same: float = 0.01
    """Estimates this close (relative, on every metric the gate reads) to a simulated point's
    count as the same point: simulating it again would teach nothing — unless that point
    missed the SLOs by at most `near`, then up to `near_twins` of them are simulated."""
    near: float = 0.10
    """Relative SLO miss (summed) of a simulated point within which its twins still run."""
    near_twins: int = 3
    """Most simulated twins of one estimate while they all miss by at most `near`, counted by
    their different outcomes (twins that came out alike count once: redundant experts that
    change nothing leave room for a batch limit the screen cannot see), and twice as many in
    all."""
    warmup: int = 8
    """Screened points to see before the first simulation, so that it goes to the best of them
    rather than to the first plausible one."""
    min_pairs: int = 3
    """Screen/simulation pairs needed before a correction is used (else 1)."""
    window: int = 25
    """Most recent pairs a correction is the median of (and its error the largest of)."""
    prior: float = 1.5
    """Factor a corrected estimate is taken to be off by, either way, before pairs measure it."""
    prior_pairs: int = 3
    """Weight of `prior` in pairs: with n pairs the error bound is the measured largest
    deviation e, raised toward log(prior) to (prior_pairs x log(prior) + n x e) / (prior_pairs
    + n)."""

    def correction(self, metric: str, layout: str, history: Sequence[Seen]) -> float:
        """Median of simulated / screened `metric` over recent pairs of this layout (of all
        layouts when this one has too few), clipped to [0.2, 5]; 1 without enough pairs."""
        return self.fit(metric, layout, history).factor

    def fit(self, metric: str, layout: str, history: Sequence[Seen]) -> Fit:
        """The correction of `metric` for `layout` and the measured error left after it, over
        the recent pairs of this layout (of all layouts when this one has too few; the raw
        errors against a factor of 1 when all of them are too few)."""
        ratios: list[float] = []
        for same in (True, False):
            ratios = []
            for h in history:
                if h.screen is None or h.metrics is None or (same and h.layout != layout):
                    continue
                s, m = metric_value(h.screen, metric), metric_value(h.metrics, metric)
                if s and m and 0 < s < SATURATED_TTFT_MS and m > 0:
                    ratios.append(m / s)
            ratios = ratios[-self.window:]
            if len(ratios) >= self.min_pairs:
                break
        factor = 1.0
        if len(ratios) >= self.min_pairs:
            factor = min(max(statistics.median(ratios), 0.2), 5.0)
        logs = [math.log(r / factor) for r in ratios]
        return Fit(factor, max([0.0, *logs]), max([0.0, *(-x for x in logs)]), len(ratios))

    def error(self, fit: Fit, side: Side) -> float:
        """The log error bound on one side ('over' or 'under') of a fit: the measured largest
        deviation, raised toward the prior while pairs are few."""
        seen = fit.over if side == "over" else fit.under
        k, n = self.prior_pairs, fit.pairs
        return max(seen, (k * math.log(self.prior) + n * seen) / (k + n)) if k + n else seen

    def implausible(self, layout: str, estimate: Mapping[str, Any],
                    history: Sequence[Seen]) -> str:
        """Why a point of `layout` with screen `estimate` cannot plausibly meet the SLOs given
        what `history` measured of the screen ('' when it can)."""
        return self._implausible(layout, estimate, _Corrections(self, history))

    def decide(self, layout: str, estimate: Mapping[str, Any],
               history: Sequence[Seen]) -> Decision:
        """Whether to simulate a point of `layout` with screen `estimate`."""
        fix = _Corrections(self, history)
        twins = self._twins(layout, estimate, history)
        if twins and (self._outcomes(twins) >= self.near_twins
                      or len(twins) >= 2 * self.near_twins
                      or any(not self.near_miss(h) for h in twins)):
            return Decision(False, f"screen: {TWIN} {twins[0].number}")
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
            if tput < ref * min(1 - self.margin, math.exp(-fix.fit(THROUGHPUT, layout).over)):
                what = "best simulated" if ref == best else "best screened"
                return Decision(False, f"screen: throughput ~{tput:,.0f} tok/s/GPU < "
                                       f"{1 - self.margin:.0%} of the {what} {ref:,.0f}",
                                None if ref == best else number)
            return Decision(True)
        user = fix.value(estimate, USER_SPEED, layout)
        high_t = tput * max(1 + self.margin, math.exp(fix.fit(THROUGHPUT, layout).over))
        high_u = user * max(1 + self.margin, math.exp(fix.fit(USER_SPEED, layout).over))
        for m in feasible:
            t, u = metric_value(m, THROUGHPUT) or 0.0, metric_value(m, USER_SPEED) or 0.0
            if t >= high_t and u >= high_u:
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
                if self._overloaded(layout, estimate, fix):
                    return f"screen: {slo.metric} unbounded (capacity below the load)"
                continue  # the capacity may be enough: only a simulation can tell the latency
            fit = fix.fit(slo.metric, layout)
            v = raw * fit.factor
            if slo.bound == "upper":
                limit = slo.value * max(1 + self.slack, math.exp(self.error(fit, "under")))
                if v > limit:
                    return (f"screen: {slo.metric} ~{v:,.0f} > {slo.value:g} (SLO) beyond "
                            f"the screen's error ({limit:,.0f})")
            else:
                limit = slo.value * min(1 - self.slack, math.exp(-self.error(fit, "over")))
                if v < limit:
                    return (f"screen: {slo.metric} ~{v:,.1f} < {slo.value:g} (SLO) beyond "
                            f"the screen's error ({limit:,.1f})")
        return ""

    def _overloaded(self, layout: str, estimate: Mapping[str, Any], fix: _Corrections) -> bool:
        """Whether an open-loop rate above the screen's capacity stays above it when the
        capacity is raised by the throughput error (True when the estimate does not say the
        offered rate)."""
        offered, carried = estimate.get("offered_rate"), estimate.get("request_rate")
        if not isinstance(offered, int | float) or not isinstance(carried, int | float):
            return True
        fit = fix.fit(THROUGHPUT, layout)
        return carried * fit.factor * math.exp(self.error(fit, "over")) < offered

    def _twins(self, layout: str, estimate: Mapping[str, Any],
               history: Sequence[Seen]) -> list[Seen]:
        """The simulated points of this layout whose screen estimate matches this one."""
        return [h for h in history if h.screen is not None and h.metrics is not None
                and h.layout == layout and self.same_estimate(estimate, h.screen)]

    def _outcomes(self, twins: Sequence[Seen]) -> int:
        """How many different outcomes the simulated `twins` came to: a twin whose metrics
        match an earlier twin's (within `same`) showed that what it changed does not matter
        here, and taught nothing about the knobs still untried."""
        kept: list[Mapping[str, Any]] = []
        for h in twins:
            if h.metrics is not None and not any(self.same_estimate(h.metrics, k)
                                                 for k in kept):
                kept.append(h.metrics)
        return len(kept)

    def near_miss(self, h: Seen) -> bool:
        """A simulated point that missed its SLOs by at most `near` in all: what the screen
        cannot see (redundant experts, batch limits) may tip a twin of it either way."""
        return (not h.feasible and h.metrics is not None
                and violation(h.metrics, self.slos) <= self.near)

    def same_estimate(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
        """Whether two screen estimates are the same point to the screen (within `same` on
        throughput, median user speed and every SLO metric)."""
        keys = {THROUGHPUT, USER_SPEED, *(s.metric for s in self.slos)}
        return all(_close(metric_value(a, k), metric_value(b, k), self.same) for k in keys)


class _Corrections:
    """The gate's fits for one decision, each computed once."""

    def __init__(self, gate: Gate, history: Sequence[Seen]) -> None:
        self.gate, self.history = gate, history
        self._cache: dict[tuple[str, str], Fit] = {}

    def fit(self, metric: str, layout: str) -> Fit:
        key = (metric, layout)
        if key not in self._cache:
            self._cache[key] = self.gate.fit(metric, layout, self.history)
        return self._cache[key]

    def value(self, estimate: Mapping[str, Any], metric: str, layout: str) -> float:
        """The corrected estimate of a metric (0 when absent)."""
        return (metric_value(estimate, metric) or 0.0) * self.fit(metric, layout).factor


def _close(a: float | None, b: float | None, tol: float) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-9)
