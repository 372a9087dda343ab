"""Offered load as something the search answers, not only an input.

A workload's shape (lengths, sessions, prefix reuse) is what the user knows; the load it is
offered at (users in a closed loop, session lanes, requests/s of open arrivals) is what a plan
should say. `LOADS` names, per arrival kind, the field a load sweep turns; `ladder` reads the
`--loads` argument into the loads to try; `at_load` gives the workload at one of them.

The requests a run sends scale with the load from the workload's own (the same requests per
user in a closed loop or per lane, the same simulated time for open arrivals), at least
`MIN_REQUESTS`, so that a light load is not a thousand-step-per-request run and a heavy one
still reaches its steady state; a trace replayed at a concurrency sends its rows at every load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.specs.errors import SpecError
from simulator.specs.workload import Workload

AUTO_STEPS = 7
"""Loads of `--loads auto`: the workload's own load times 2, 1, 1/2, ... 1/32."""
MIN_REQUESTS = 64
"""Fewest requests a run at a swept load sends (percentiles need some)."""


@dataclass(frozen=True)
class LoadKind:
    """The knob of one arrival kind."""

    field: str
    """The arrival's field that sets the load."""
    unit: str
    """What one unit of it is (for people)."""
    integer: bool
    """Whether the field takes whole numbers."""
    per_user: bool
    """Closed-loop-like: requests scale per user (else per second of open arrivals)."""
    whole: bool = False
    """Every load replays the same requests (a trace's rows, as AIPerf replays the whole file
    at each concurrency) instead of scaling them."""


LOADS: dict[str, LoadKind] = {
    "closed": LoadKind("concurrency", "users", True, True),
    "sessions": LoadKind("concurrency", "session lanes", True, True),
    "trace": LoadKind("concurrency", "users", True, True, whole=True),
    "poisson": LoadKind("rate", "requests/s", False, False),
    "bursty": LoadKind("rate", "requests/s", False, False),
}
"""Arrival kind -> the load a sweep turns (a trace only where it replays at a concurrency: at
its own timestamps it has no load to turn)."""


def load_kind(workload: Workload) -> LoadKind:
    """The load knob of the workload's arrival; SpecError for an arrival without one."""
    kind = workload.arrival.kind
    if kind not in LOADS:
        raise SpecError(f"a {kind} arrival has no load to sweep; --loads needs one of "
                        f"{', '.join(LOADS)} arrivals")
    if getattr(workload.arrival, LOADS[kind].field) is None:
        raise SpecError(f"a {kind} arrival replayed at its timestamps has no load to sweep; "
                        f"give it a {LOADS[kind].field} (arrival: {{kind: {kind}, "
                        f"{LOADS[kind].field}: N}}) to sweep {LOADS[kind].unit}")
    return LOADS[kind]


def offered(workload: Workload) -> float:
    """The workload's own load (users, lanes or requests/s)."""
    return float(getattr(workload.arrival, load_kind(workload).field))


def positive_numbers(flag: str, text: str, hint: str, what: str) -> list[float]:
    """The comma list `text` of a flag as positive, finite numbers, in its order; SpecError
    naming the flag and the bad entry (`hint`: what to give instead; `what`: how a valid
    entry reads after "must be a positive")."""
    values = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            raise SpecError(f"{flag} {text!r}: {part.strip()!r} is not a number; give "
                            f"{hint}") from None
        if not math.isfinite(v) or v <= 0:
            raise SpecError(f"{flag} {text!r}: {part.strip()!r} must be a positive{what}")
        values.append(v)
    return values


def ladder(workload: Workload, text: str) -> tuple[float, ...]:
    """The loads `--loads TEXT` asks for, ascending: ``auto`` (the workload's own load times
    2, 1, 1/2 ... down `AUTO_STEPS` halvings, whole where the knob is) or a comma list of
    positive numbers; SpecError naming the bad value."""
    kind = load_kind(workload)
    if text.strip() == "auto":
        own = offered(workload)
        values = [own * 2.0 ** (1 - k) for k in range(AUTO_STEPS)]
    else:
        values = positive_numbers("--loads", text, "'auto' or a comma list such as 8,16,32",
                                  f" number of {kind.unit}")
    if kind.integer:
        values = [float(max(round(v), 1)) for v in values]
        bad = [v for v in values if v > 1_000_000]
        if bad:
            raise SpecError(f"--loads: {bad[0]:g} {kind.unit} is more than 1,000,000")
    return tuple(sorted(set(values)))


def at_load(workload: Workload, load: float) -> Workload:
    """The workload offered `load` instead of its own, its requests scaled alike (at least
    `MIN_REQUESTS`); the workload itself when `load` is its own."""
    kind = load_kind(workload)
    own = offered(workload)
    if load == own:
        return workload
    value: float | int = int(load) if kind.integer else float(load)
    arrival = type(workload.arrival).model_validate(
        {**workload.arrival.model_dump(), kind.field: value})
    floor = max(MIN_REQUESTS, 2 * int(load)) if kind.per_user else MIN_REQUESTS
    requests = (workload.requests if kind.whole
                else max(round(workload.requests * load / own), floor))
    return Workload.model_validate({**workload.model_dump(), "arrival": arrival.model_dump(),
                                    "requests": min(requests, 10_000_000)})


def load_text(workload: Workload, load: float) -> str:
    """A load for people: '64 users', '12.5 requests/s'."""
    kind = load_kind(workload)
    return f"{load:,.0f} {kind.unit}" if kind.integer else f"{load:,.3g} {kind.unit}"


def for_target(workload: Workload, metric: str, rate: float,
               loads: tuple[float, ...]) -> tuple[Workload, tuple[float, ...]]:
    """The workload and loads a search for the fewest GPUs carrying `rate` of `metric`
    (request_rate or token_rate) runs: open arrivals are offered the rate itself (in requests/s,
    from the workload's mean tokens per request for a token rate) unless loads are given;
    closed loops and session lanes sweep `--loads auto` unless loads are given."""
    kind = load_kind(workload)
    if loads:
        return workload, loads
    if kind.per_user:
        return workload, ladder(workload, "auto")
    if metric == "token_rate":
        from planner.screen import traffic

        t = traffic(workload)
        rate = rate / max(t.prompt + t.output, 1.0)
    return at_load(workload, rate), ()
