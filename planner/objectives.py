"""Service-level objectives and what the search optimizes.

An SLO bounds one metric of a `simulate --json` object: latency keys (``ttft_p90_ms``,
``tpot_p50_ms``, ``itl_p99_ms``...) from above, tokens per second per user (``tok_s_user_p90``...)
from below. A bound at pNN holds for NN % of requests: ``ttft_p90_ms <= 2000`` means 90 % of
requests see their first token within 2 s, and ``tok_s_user_p90 >= 196`` means 90 % of requests
get at least 196 tokens/s, i.e. the slow tail: 1000 / TPOT p90 (not the 90th percentile of
per-request speed, which is the fast tail). `parse_slo` reads the CLI form ``NAME=VALUE``
(``NAME<=VALUE`` / ``NAME>=VALUE`` also accepted when the direction matches the metric),
`load_slo_file` a YAML mapping of the same.

A rate the deployment must carry is a lower bound too: ``request_rate`` (completed requests/s)
or ``token_rate`` (all tokens/s over the whole deployment); `parse_target_rate` reads
``--target-rate 12`` (requests/s) or ``--target-rate 50000tok/s``.

Three objectives: ``slo`` maximizes throughput per GPU among plans that meet every SLO; ``pareto``
keeps the front of throughput per GPU against median tokens/s per user, also among plans that
meet the SLOs; ``gpus`` (what `--target-rate` asks for) picks the fewest GPUs among plans that
meet them, the most throughput per GPU among equals.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from simulator.specs.errors import SpecError
from simulator.specs.loading import read_yaml

Bound = Literal["upper", "lower"]

LATENCY_FAMILIES = ("ttft", "tpot", "itl")
"""Metrics bounded from above, in ms, with percentiles LATENCY_STATS."""
LATENCY_STATS = ("p50", "p90", "p99", "mean")
USER_STATS = ("p50", "p90", "mean")
"""Statistics of tok_s_user (tokens per second per user), bounded from below."""

THROUGHPUT = "throughput_tok_s_gpu"
"""The metric the search maximizes: all tokens (cached + uncached input + output) per s per GPU."""
USER_SPEED = "tok_s_user_p50"
"""The second axis of the Pareto front: median tokens per second per user."""

OBJECTIVES: dict[str, tuple[str, ...]] = {
    "slo": (THROUGHPUT,),
    "pareto": (THROUGHPUT, USER_SPEED),
    "gpus": (THROUGHPUT,),
}
"""Objective name -> the metrics the sampler maximizes (SLOs are constraints for all); for
``gpus`` the chosen plan is the feasible one on the fewest GPUs (`plan.summarize`)."""

RATES: dict[str, str] = {"req/s": "request_rate", "tok/s": "token_rate"}
"""Unit of `--target-rate` -> the metric that must reach it."""


def slo_metric_names() -> list[str]:
    """Every metric name an SLO may bound."""
    names = [f"{f}_{s}_ms" for f in LATENCY_FAMILIES for s in LATENCY_STATS]
    return names + [f"tok_s_user_{s}" for s in USER_STATS] + list(RATES.values())


def bound_of(name: str) -> Bound:
    """upper for latency metrics, lower for tokens/s per user; SpecError for unknown names."""
    if name.endswith("_ms") and name in slo_metric_names():
        return "upper"
    if name in slo_metric_names():
        return "lower"
    raise SpecError(f"unknown SLO metric {name!r}; {_valid_hint()}")


def _valid_hint() -> str:
    latency = ", ".join(f"{f}_{{{','.join(LATENCY_STATS)}}}_ms" for f in LATENCY_FAMILIES)
    return (f"valid: NAME=VALUE with NAME one of {latency} (upper bounds, ms) or "
            f"tok_s_user_{{{','.join(USER_STATS)}}} (lower bounds, tokens/s), or "
            "request_rate / token_rate (lower bounds: requests/s, tokens/s carried), "
            "e.g. ttft_p90_ms=2000 or tok_s_user_p90=20")


@dataclass(frozen=True)
class SLO:
    """One bound on one metric."""

    metric: str
    """Metric name, e.g. ttft_p90_ms or tok_s_user_p90 (see `slo_metric_names`)."""
    value: float
    """The bound: the metric must be at most this (latency) or at least this (tokens/s)."""

    @property
    def bound(self) -> Bound:
        """upper (metric <= value) or lower (metric >= value)."""
        return bound_of(self.metric)

    def __str__(self) -> str:
        return f"{self.metric} {'<=' if self.bound == 'upper' else '>='} {self.value:g}"

    def violation(self, metrics: Mapping[str, Any]) -> float:
        """How far the metric is on the wrong side of the bound, relative to it (<= 0: met).

        A missing metric (no request completed) counts as a violation of 1.
        """
        v = metric_value(metrics, self.metric)
        if v is None:
            return 1.0
        scale = abs(self.value) or 1.0
        return (v - self.value) / scale if self.bound == "upper" else (self.value - v) / scale


_FORM = re.compile(r"^\s*([A-Za-z0-9_]+)\s*(<=|>=|=)\s*(\S+)\s*$")


def parse_slo(text: str) -> SLO:
    """An SLO from ``NAME=VALUE`` (or ``NAME<=VALUE`` / ``NAME>=VALUE``); SpecError naming the
    bad text and what would be valid."""
    m = _FORM.match(text)
    if not m:
        raise SpecError(f"--slo {text!r} is not NAME=VALUE; {_valid_hint()}")
    name, op, raw = m.groups()
    if name not in slo_metric_names():
        raise SpecError(f"--slo {text!r}: unknown metric {name!r}; {_valid_hint()}")
    return _slo(name, raw, op, f"--slo {text!r}")


def _slo(name: str, raw: Any, op: str, where: str) -> SLO:
    if isinstance(raw, bool):  # YAML's true/false would count as 1/0
        raise SpecError(f"{where}: {str(raw).lower()} is not a number; {_valid_hint()}")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise SpecError(f"{where}: {raw!r} is not a number; {_valid_hint()}") from None
    if not math.isfinite(value) or value <= 0:
        raise SpecError(f"{where}: the bound must be a positive number, not {raw!r}")
    want = "<=" if bound_of(name) == "upper" else ">="
    if op not in ("=", want):
        raise SpecError(f"{where}: {name} takes {'an upper' if want == '<=' else 'a lower'} "
                        f"bound; write {name}{want}{raw} or {name}={raw}")
    return SLO(name, value)


def load_slo_file(path: str | Path) -> tuple[SLO, ...]:
    """SLOs from a YAML file: a mapping {metric: bound}, or a list of NAME=VALUE strings."""
    data = read_yaml(Path(path))
    if isinstance(data, Mapping):
        for name in data:
            if name not in slo_metric_names():
                raise SpecError(f"{path}: unknown SLO metric {name!r}; {_valid_hint()}")
        return tuple(_slo(str(k), v, "=", f"{path}: {k}") for k, v in data.items())
    if isinstance(data, list) and all(isinstance(x, str) for x in data):
        return tuple(parse_slo(x) for x in data)
    raise SpecError(f"{path}: an SLO file is a mapping like {{ttft_p90_ms: 2000, "
                    f"tok_s_user_p90: 20}}, not {type(data).__name__}")


_RATE = re.compile(r"^\s*([0-9.eE+-]+)\s*([a-z/]*)\s*$")


def parse_target_rate(text: str) -> SLO:
    """The bound `--target-rate TEXT` sets: a positive number of requests/s, or of tokens/s
    with the suffix tok/s (``12``, ``12req/s``, ``50000tok/s``); SpecError naming the text."""
    m = _RATE.match(text)
    unit = (m.group(2) or "req/s") if m else ""
    if not m or unit not in RATES:
        raise SpecError(f"--target-rate {text!r} is not a rate; write requests/s as 12 or "
                        f"12req/s, tokens/s as 50000tok/s")
    return _slo(RATES[unit], m.group(1), "=", f"--target-rate {text!r}")


SHORTHAND_STAT = "p90"
"""The percentile `--ttft`, `--tpot` and `--goodput` bound: 90 % of requests within."""
GOODPUT_KEYS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl"}
"""vLLM `bench serve --goodput KEY:MS` keys -> our latency families (e2el has no SLO here)."""


def shorthand_slo(flag: str, value: str) -> SLO:
    """The SLO `--ttft MS` or `--tpot MS` sets: a p90 latency bound (SpecError naming it)."""
    return _slo(f"{flag}_{SHORTHAND_STAT}_ms", value, "=", f"--{flag} {value!r}")


def goodput_slos(items: Sequence[str]) -> tuple[SLO, ...]:
    """SLOs from vLLM's `--goodput KEY:MS ...` form (``ttft:2000 tpot:50``), each a p90 bound:
    a request counts as good for vLLM when it meets every threshold, here 90 % of requests
    must meet each. SpecError naming a bad item."""
    out = []
    for item in (x for text in items for x in text.replace(",", " ").split()):
        key, sep, raw = item.partition(":")
        if not sep or key not in GOODPUT_KEYS:
            raise SpecError(f"--goodput {item!r} is not KEY:MS with KEY one of "
                            f"{', '.join(GOODPUT_KEYS)} (e.g. ttft:2000 tpot:50)")
        name = f"{GOODPUT_KEYS[key]}_{SHORTHAND_STAT}_ms"
        out.append(_slo(name, raw, "=", f"--goodput {item!r}"))
    return tuple(out)


def merge_slos(slos: Iterable[SLO]) -> tuple[SLO, ...]:
    """One SLO per metric (the last given wins), sorted by metric name."""
    out = {s.metric: s for s in slos}
    return tuple(out[k] for k in sorted(out))


def metric_value(metrics: Mapping[str, Any], name: str) -> float | None:
    """A flat metric name's value in a `simulate --json` object: ttft_p90_ms ->
    metrics["ttft_ms"]["p90"], tok_s_user_p90 -> 1000 / metrics["tpot_ms"]["p90"] (the speed
    90 % of requests reach), tok_s_user_mean -> metrics["tok_s_user"]["mean"]; plain keys as
    they are. None when absent or not finite."""
    value: Any
    if name in metrics:
        value = metrics[name]
    elif name == "request_rate":
        done, span = metrics.get("completed"), metrics.get("duration_s")
        value = done / span if isinstance(done, int | float) and span else None
    elif name == "token_rate":
        tput, gpus = metrics.get(THROUGHPUT), metrics.get("gpus")
        value = tput * gpus if isinstance(tput, int | float) and gpus else None
    elif name.endswith("_ms") and name.count("_") >= 2:
        family, stat = name[: -len("_ms")].rsplit("_", 1)
        value = (metrics.get(f"{family}_ms") or {}).get(stat)
    elif name.startswith("tok_s_user_"):
        stat = name[len("tok_s_user_"):]
        tpot = (metrics.get("tpot_ms") or {}).get(stat) if stat != "mean" else None
        if isinstance(tpot, int | float) and tpot > 0:
            value = 1000.0 / tpot  # the speed NN % of requests reach at least
        else:
            value = (metrics.get("tok_s_user") or {}).get(stat)
    else:
        value = None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def violation(metrics: Mapping[str, Any], slos: Sequence[SLO]) -> float:
    """Sum of the positive relative violations of the SLOs (0: every SLO met)."""
    return sum(max(s.violation(metrics), 0.0) for s in slos)


def meets(metrics: Mapping[str, Any], slos: Sequence[SLO]) -> bool:
    """Whether every SLO is met."""
    return all(s.violation(metrics) <= 0 for s in slos)


def objective_values(metrics: Mapping[str, Any], objective: str) -> list[float]:
    """The values an objective maximizes, from metrics (0 where a metric is missing)."""
    return [metric_value(metrics, k) or 0.0 for k in objective_metrics(objective)]


def objective_metrics(objective: str) -> tuple[str, ...]:
    """The metrics an objective maximizes; SpecError for an unknown objective."""
    try:
        return OBJECTIVES[objective]
    except KeyError:
        raise SpecError(f"unknown objective {objective!r}; valid: "
                        f"{', '.join(OBJECTIVES)}") from None


def pareto_front(points: Sequence[Sequence[float]]) -> list[int]:
    """Indices of the points no other point dominates (all coordinates maximized), in the order
    of the first coordinate descending; exact duplicates keep the first."""
    order = sorted(range(len(points)), key=lambda i: tuple(-x for x in points[i]))
    front: list[int] = []
    for i in order:
        p = points[i]
        if not any(all(a >= b for a, b in zip(points[j], p, strict=True)) for j in front):
            front.append(i)
    return front
