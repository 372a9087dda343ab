"""Throughput-interactivity curves of a load sweep: the chart serving benchmarks draw.

A search with `--loads` simulates deployments at several offered loads; after its trials it
simulates every load for its best few deployments (`curve_deployments`, run by
`planner.search.Loop.sweep`). `curves` turns the records into one curve per such deployment
(tokens/s per GPU against tokens/s per user, one point per load, ascending) and the envelope:
the points over all deployments and loads that no other point beats on both axes (Pareto),
whether or not they meet the SLOs, so the chart shows what each interactivity costs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from planner.objectives import SLO, THROUGHPUT, USER_SPEED, metric_value, pareto_front

if TYPE_CHECKING:
    from planner.plan import Summary


def _deployment_key(d: dict[str, Any]) -> str:
    return json.dumps(d, sort_keys=True)


def curve_deployments(summary: Summary, n: int) -> list[int]:
    """Trial numbers of the deployments to sweep: the chosen plan and its alternatives (each
    a distinct deployment), or the closest plan when none meets the SLOs; at most n."""
    chosen = [summary.best, *summary.alternatives] if summary.best else [summary.closest]
    return [r["number"] for r in chosen if r is not None][:max(n, 0)]


def _point(r: dict[str, Any]) -> dict[str, Any]:
    m = r["metrics"]
    return {"load": r.get("load"), "trial": r["number"],
            "throughput_tok_s_gpu": metric_value(m, THROUGHPUT),
            "tok_s_user_p50": metric_value(m, USER_SPEED),
            "tok_s_user_p90": metric_value(m, "tok_s_user_p90"),
            "ttft_p90_ms": metric_value(m, "ttft_p90_ms"),
            "meets_slo": bool(r.get("meets_slo"))}


def user_axis(slos: Sequence[SLO]) -> str:
    """The tokens/s-per-user statistic a chart and its envelope use: the slow tail
    (tok_s_user_p90) where an SLO bounds it, else the median."""
    return "tok_s_user_p90" if any(s.metric == "tok_s_user_p90" for s in slos) else USER_SPEED


def curves(summary: Summary, records: list[dict[str, Any]], n: int,
           axis: str = USER_SPEED) -> dict[str, Any]:
    """{"curves": [{"label", "deployment", "points"}], "envelope": [...], "user_axis"} from the
    search's records (see `planner.search.records`), the envelope on throughput per GPU
    against the `axis` statistic of tokens/s per user; empty lists when no load was swept."""
    from planner.plan import describe

    sims: dict[tuple[str, float], dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: r["number"]):
        if r["stage"] == "simulated" and r.get("load") is not None:
            sims.setdefault((_deployment_key(r["deployment"]), r["load"]), r)
    if not sims:
        return {"curves": [], "envelope": [], "user_axis": axis}
    by_number = {r["number"]: r for r in records}
    out = []
    for number in curve_deployments(summary, n):
        key = _deployment_key(by_number[number]["deployment"])
        rows = sorted((r for (k, _), r in sims.items() if k == key), key=lambda r: r["load"])
        out.append({"label": describe(by_number[number]["deployment"]),
                    "deployment": by_number[number]["deployment"],
                    "points": [_point(r) for r in rows]})
    pts = list(sims.values())
    front = pareto_front([[metric_value(r["metrics"], k) or 0.0 for k in (THROUGHPUT, axis)]
                          for r in pts])
    envelope = sorted(({"label": describe(pts[i]["deployment"]), **_point(pts[i])}
                       for i in front), key=lambda p: p[axis] or 0.0)
    return {"curves": out, "envelope": envelope, "user_axis": axis}
