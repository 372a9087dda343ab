"""Macro-steps: a run of identical engine steps taken as one SimPy event.

A decode batch changes only when a request joins or finishes, and a step's price only when a
rank's rounded row moves on (`simulator.des.pricing`), so when a decode instance plans, its next
steps are known: the same requests, each `accepted` tokens further on, at the same price. The
engine takes them as one `Run`: it waits once for their end, then applies and records them all.
What would change a step when steps go one by one still does, at the same step boundary:

- a slot that turns active during the run (its KV arrived: `Engine.poke`) interrupts it; the
  step in progress ends as it would have, the steps up to it are applied, and the engine plans
  again, so the slot joins the next step, as a slot activated during a step does;
- a request queued or admitted during the run changes what the later steps record (their queue
  and KV use: `Run.mark`);
- a run ends with the step in which its first request finishes, or after MAX_RUN steps.

The clock adds the run's step times one by one, as the step-by-step timeouts do, so every time
(first tokens, finishes, the timeline) is the same float. An event of another instance at the
very time of a step boundary inside a run counts as coming before that boundary.
"""

from __future__ import annotations

import math

import numpy as np

MAX_RUN = 256
"""Most steps in one run (bounds the per-step arrays a run plans with)."""


def delay_to(now: float, t: float) -> float:
    """The largest delay d >= 0 for which the clock's `now + d` is at most `t` (>= now): `t`
    exactly, except where every sum from `now` rounds past it (0.0977... + d skips 0.2329...
    between two neighbouring d); `hops_to` lands there in two."""
    d = t - now
    while now + d < t:
        d = math.nextafter(d, math.inf)
    while d > 0 and now + d > t:
        d = math.nextafter(d, 0.0)
    return d


def hops_to(now: float, t: float) -> list[float]:
    """Delays whose timeouts, one after another from `now`, put the clock at exactly `t`
    (>= now): one, or a second from just below `t`, where `t` minus the clock is exact
    (Sterbenz: the two are within a factor of 2)."""
    hops: list[float] = []
    at = now
    while at < t and len(hops) < 3:
        d = delay_to(at, t)
        hops.append(d)
        at = at + d
    return hops or [0.0]


class Run:
    """`steps` steps of `seconds` each from `start`, and what each of them records."""

    def __init__(self, start: float, seconds: float, steps: int, queue: int, kv_used: np.ndarray,
                 stepped: np.ndarray | None = None) -> None:
        self.start, self.seconds, self.steps = start, seconds, steps
        self.stepped = stepped
        """The decode slots in the steps (a mask of the instance's slot arrays)."""
        times = np.full(steps + 1, seconds)
        times[0] = start
        self.ends: np.ndarray = np.cumsum(times)[1:]
        """Each step's end: the start plus the step time, added one step at a time."""
        self.marks: list[tuple[int, int, np.ndarray]] = [(0, queue, kv_used)]
        """(first step, queue, KV reserved per rank): what the steps from there on record."""

    @property
    def end(self) -> float:
        return float(self.ends[-1])

    def done_by(self, now: float) -> int:
        """Steps that ended before `now`."""
        return int(np.searchsorted(self.ends, now, side="left"))

    def mark(self, now: float, queue: int, kv_used: np.ndarray) -> None:
        """The instance's queue and KV reserved changed at `now`: the steps that start from
        then on record these."""
        self.marks.append((self.done_by(now) + 1, queue, kv_used))

    def pieces(self, steps: int) -> list[tuple[float, int, int, int, np.ndarray]]:
        """The first `steps` steps as (time of the first, its index, steps, queue, KV reserved
        per rank), one piece per mark that reaches them."""
        out = []
        for i, (first, queue, kv_used) in enumerate(self.marks):
            last = min(self.marks[i + 1][0] if i + 1 < len(self.marks) else steps, steps)
            if last > first:
                t = self.start if first == 0 else float(self.ends[first - 1])
                out.append((t, first, last - first, queue, kv_used))
        return out
