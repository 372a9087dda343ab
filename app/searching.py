"""The search page's work: a search from the form's values, run with progress, and what the page
shows of it (the Pareto chart's points, the table of top plans, the difference of two plans,
plan.yaml).

The search is `rackplan search`'s own loop (`planner.search.run_search`) with the same storage
semantics: a study is named after what defines it, so running the same search again resumes it.
"""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from app.formatting import flatten, show
from planner import defaults
from planner.evaluate import check_workload_fits
from planner.load import at_load, ladder, load_kind
from planner.objectives import SLO, merge_slos, metric_value, parse_slo
from planner.plan import (
    COMPARED,
    Summary,
    advice,
    compare,
    describe,
    summarize,
    why_chosen,
)
from planner.search import SearchConfig, conclude, past_drawn, records, run_search
from planner.space import LAYOUTS, build_space
from simulator.specs.errors import SpecError
from simulator.specs.loading import dump_workload
from simulator.specs.model import load_model
from simulator.specs.workload import Workload

SearchProgress = Callable[[int, int, str], None]
"""Called after each trial with the finished trials, the target, and the best plan so far."""

ROLES = ("prefill", "decode", "aggregated")
COMMON_KNOBS = ("model", "hardware", "engine", "gpus", "precision")
"""Deployment keys outside the roles that a diff lists first."""
CHOSEN_LABELS = {"slo": "chosen: the most tok/s/GPU within the SLOs",
                 "pareto": "plan.yaml: the front's most tok/s/GPU",
                 "gpus": "chosen: the fewest GPUs within the SLOs"}
"""What the chosen plan's marker says, per objective (what the objective picked)."""


@dataclass(frozen=True)
class SearchForm:
    """What the search form holds."""

    model: str
    hardware: str
    gpus: int
    workload: Workload
    ttft_p90_ms: float = 0.0
    """Upper bound on P90 TTFT; 0: none."""
    tok_s_user_p90: float = 0.0
    """Lower bound on P90 tokens/s per user; 0: none."""
    extra_slos: str = ""
    """More SLOs, one NAME=VALUE per line (as `rackplan search --slo`)."""
    objective: str = "slo"
    trials: int = 30
    refine: int = defaults.REFINE
    """Rounds of local search around the best plan after the trials (`rackplan search
    --refine`; 0: the trials alone)."""
    seed: int = 0
    layouts: tuple[str, ...] = LAYOUTS
    storage: str = "sqlite:///runs/rackplan.db"
    study: str = ""
    """Study name; empty: derived from the search, so the same search resumes."""
    loads: str = ""
    """Offered loads to search too (as `rackplan search --loads`: auto or a list); empty:
    the workload's own load only."""


def slos_of(form: SearchForm) -> tuple[SLO, ...]:
    """The form's SLOs, one per metric (a line of extra_slos overrides the fields above it)."""
    slos = [SLO("ttft_p90_ms", form.ttft_p90_ms)] if form.ttft_p90_ms > 0 else []
    if form.tok_s_user_p90 > 0:
        slos.append(SLO("tok_s_user_p90", form.tok_s_user_p90))
    slos += [parse_slo(line) for line in form.extra_slos.splitlines() if line.strip()]
    return merge_slos(slos)


def search_config(form: SearchForm) -> SearchConfig:
    """The SearchConfig of the form; SpecError naming a bad value."""
    if not form.layouts:
        raise SpecError(f"pick at least one layout: {', '.join(LAYOUTS)}")
    if form.trials < 1:
        raise SpecError(f"trials={form.trials} must be >= 1")
    if form.refine < 0:
        raise SpecError(f"refinement rounds={form.refine} must be >= 0 (0: the trials alone)")
    if not form.storage.strip():
        raise SpecError("storage is empty; give sqlite:///PATH, another Optuna RDB URL, or "
                        "journal:PATH")
    space = build_space(form.model, form.hardware, form.gpus, layouts=tuple(form.layouts))
    check_workload_fits(form.workload, load_model(space.model))  # as `rackplan search` does
    return SearchConfig(
        space=space,
        workload=form.workload, slos=slos_of(form), objective=form.objective,
        trials=form.trials, refine=form.refine, seed=form.seed, storage=form.storage.strip(),
        study=form.study.strip() or None,
        loads=ladder(form.workload, form.loads) if form.loads.strip() else ())


@dataclass(frozen=True)
class SearchOutcome:
    """A finished search and what the page shows of it."""

    config: SearchConfig
    summary: Summary
    records: list[dict[str, Any]]
    """Every finished trial's record (with its number)."""
    plan: dict[str, Any] | None
    """plan.yaml of the chosen plan; None when no plan met the SLOs."""
    study: str
    storage: str
    """The storage URL with any password hidden."""
    ran: int
    """Trials this run added (0: the study already held them all)."""
    wall_s: float
    sweep: Mapping[str, Any] | None = None
    """The throughput-interactivity curves (`planner.curves.curves`); None: not computed."""

    @property
    def why(self) -> str:
        """Why the chosen plan won ('' without one)."""
        return why_chosen(self.summary, self.config.objective)

    @property
    def advice(self) -> list[str]:
        """What would make an infeasible search feasible ([] with a plan)."""
        unit = load_kind(self.config.workload).unit if self.config.loads else ""
        return advice(self.summary, self.config.loads, self.config.space.gpus, unit)


def progress_text(done: int, total: int, best: str) -> str:
    """A search's progress line: trials done of the drawn ones, then the refinement's and the
    load sweep's past them (as `rackplan search` counts them), and the best plan so far."""
    return f"{past_drawn(done, total) or f'trial {done} of {total}'} · {best}"


def best_text(summary: Summary) -> str:
    """The best plan so far, in a few words."""
    best = summary.best
    if best is None:
        return "no plan meets the SLOs yet"
    return (f"best {metric_value(best['metrics'], 'throughput_tok_s_gpu') or 0:,.0f} tok/s/GPU "
            f"(trial {best['number']})")


def run(config: SearchConfig, progress: SearchProgress | None = None) -> SearchOutcome:
    """Run the search to `config.trials` finished trials and summarize it."""
    start = time.monotonic()
    counted: list[int] = []

    def report(done: int, trials: list[Any]) -> None:
        counted.append(done)
        if progress is not None:
            progress(done, config.trials, best_text(summarize(records(trials), config.slos)))

    done = conclude(run_search(config, progress=report), config)
    return SearchOutcome(config, done.summary, done.records, done.plan, done.study,
                         done.storage, ran=len(counted), wall_s=time.monotonic() - start,
                         sweep=done.sweep)


def reason_rows(summary: Summary) -> list[dict[str, Any]]:
    """Why trials did not become the plan: one row per stage and reason, with its count."""
    titles = {"rejected": "rejected", "screened_out": "screened out",
              "missed_slo": "simulated, missed", "failed": "failed"}
    return [{"stage": titles.get(stage, stage), "reason": label, "trials": n}
            for stage, got in summary.reasons.items() for label, n in got.items()]


def simulated(recs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Distinct simulated deployments, each once (its first trial), by trial number."""
    seen: dict[str, dict[str, Any]] = {}
    for r in sorted((r for r in recs if r["stage"] == "simulated"), key=lambda r: r["number"]):
        seen.setdefault(json.dumps(r["deployment"], sort_keys=True), dict(r))
    return list(seen.values())


def front_points(outcome: SearchOutcome) -> list[dict[str, Any]]:
    """One point per simulated plan for the Pareto chart."""
    front = {r["number"] for r in outcome.summary.pareto}
    return [{"trial": r["number"], "label": describe(r["deployment"]),
             "throughput": metric_value(r["metrics"], "throughput_tok_s_gpu") or 0.0,
             "user": metric_value(r["metrics"], "tok_s_user_p50") or 0.0,
             "feasible": bool(r.get("meets_slo")), "front": r["number"] in front}
            for r in simulated(outcome.records)]


def standing(r: Mapping[str, Any], chosen: int | None, front: set[int]) -> str:
    """A simulated plan's place in the search, in a word or two."""
    if r["number"] == chosen:
        return "chosen"
    if r["number"] in front:
        return "Pareto front"
    return "meets SLOs" if r.get("meets_slo") else "misses SLOs"


def top_plans(outcome: SearchOutcome, n: int = 10) -> list[dict[str, Any]]:
    """Table rows of the simulated plans, those meeting the SLOs first, by throughput per GPU:
    the short columns first and the plan's description last, so a narrow page cuts off words,
    not numbers."""
    front = {r["number"] for r in outcome.summary.pareto}
    chosen = outcome.summary.best["number"] if outcome.summary.best else None
    rows = sorted(simulated(outcome.records), key=lambda r: (
        not r.get("meets_slo"), -(metric_value(r["metrics"], "throughput_tok_s_gpu") or 0.0),
        r["number"]))
    out = []
    for r in rows[:n]:
        m = r["metrics"]
        out.append({
            "trial": r["number"],
            "standing": standing(r, chosen, front),
            "GPUs": m.get("gpus"),
            "tok/s/GPU": _round(metric_value(m, "throughput_tok_s_gpu"), 0),
            "tok/s/user p50": _round(metric_value(m, "tok_s_user_p50"), 1),
            "tok/s/user p90": _round(metric_value(m, "tok_s_user_p90"), 1),
            "TTFT p90 ms": _round(metric_value(m, "ttft_p90_ms"), 0),
            "TPOT p90 ms": _round(metric_value(m, "tpot_p90_ms"), 1),
            "plan": describe(r["deployment"]),
        })
    return out


def _round(v: float | None, digits: int) -> float | None:
    return None if v is None else round(v, digits)


def _roles(d: Mapping[str, Any]) -> list[str]:
    return [r for r in ROLES if isinstance(d.get(r), Mapping)]


def role_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Two trial records' deployments by role and knob: one row per knob, one column per
    plan and role ("A · prefill", "A · decode", "B · aggregated"...), so a P/D plan and an
    aggregated one stand side by side. `differs`: the knob differs between plans of the same
    layout (for different layouts, whether the values of the roles differ at all)."""
    da, db = a["deployment"], b["deployment"]
    cols = [(tag, role, d) for tag, d in (("A", da), ("B", db)) for role in _roles(d)]
    rows: list[dict[str, Any]] = []
    for knob in COMMON_KNOBS:
        va, vb = flatten({knob: da.get(knob)}), flatten({knob: db.get(knob)})
        for key in sorted(set(va) | set(vb)):
            if va.get(key) is None and vb.get(key) is None:
                continue
            row: dict[str, Any] = {"role": "all", "knob": key}
            for tag, role, _ in cols:
                row[f"{tag} · {role}"] = show((va if tag == "A" else vb).get(key))
            row["differs"] = va.get(key) != vb.get(key)
            rows.append(row)
    knobs = sorted({k for _, role, d in cols for k in flatten(d[role])})
    same_layout = _roles(da) == _roles(db)
    for knob in knobs:
        values = {(tag, role): flatten(d[role]).get(knob) for tag, role, d in cols}
        row = {"role": "per role", "knob": knob}
        for (tag, role), v in values.items():
            row[f"{tag} · {role}"] = show(v)
        if same_layout:
            row["differs"] = any(values[("A", r)] != values[("B", r)] for r in _roles(da))
        else:
            row["differs"] = len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1
        rows.append(row)
    return rows


def plan_document(r: Mapping[str, Any], config: SearchConfig) -> dict[str, Any]:
    """A trial record as the parts of a plan.yaml that `rackplan compare` reads."""
    workload = config.workload if r.get("load") is None else at_load(config.workload,
                                                                     r["load"])
    return {"deployment": r["deployment"], "predicted": r["metrics"],
            "workload": dump_workload(workload), "slo": {s.metric: s.value for s in config.slos},
            "provenance": {"seed": config.seed}}


def compare_rows(a: Mapping[str, Any], b: Mapping[str, Any],
                 config: SearchConfig) -> list[dict[str, Any]]:
    """Two trials as `rackplan compare` shows two plans: its rows (COMPARED), A and B, and
    whether they differ."""
    docs = [plan_document(r, config) for r in (a, b)]
    out = []
    for label, get in COMPARED:
        va, vb = (get(d) for d in docs)
        out.append({"": label, f"A: trial {a['number']}": show(va),
                    f"B: trial {b['number']}": show(vb),
                    "differs": json.dumps(va, sort_keys=True) != json.dumps(vb, sort_keys=True)})
    return out


def compare_files(files: list[tuple[str, bytes]], folder: Path) -> list[dict[str, Any]]:
    """Plan files side by side, exactly as `rackplan compare A.yaml B.yaml ...` reads them
    (`planner.plan.compare`): one row per compared figure, a column per file, and whether the
    values differ; SpecError for a file that is not a plan.yaml."""
    if len(files) < 2:
        raise SpecError(f"compare needs two plan.yaml files or more, not {len(files)}")
    folder.mkdir(parents=True, exist_ok=True)
    paths: list[str | Path] = []
    for n, (name, data) in enumerate(files):
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(name).stem)[:60] or "plan"
        path = folder / f"{n}-{stem}.yaml"
        path.write_bytes(data)
        paths.append(path)
    got = compare(paths)
    heads = [f"{chr(ord('A') + n)}: {name}" for n, (name, _) in enumerate(files)]
    return [{"": label, **{h: show(v) for h, v in zip(heads, values, strict=True)},
             "differs": label in got["differences"]} for label, values in got["rows"].items()]


def closest_rows(summary: Summary) -> list[dict[str, Any]]:
    """When nothing met the SLOs: each SLO against the closest plan, tightest first."""
    if summary.best is not None or summary.closest is None:
        return []
    return [{"SLO": e["slo"], "closest plan": show(e["value"]),
             "short by": f"{-e['margin']:.0%}" if e["margin"] < 0 else "met"}
            for e in summary.standing]


def has_points(sweep: Mapping[str, Any] | None) -> bool:
    """Whether a load sweep has any point to draw."""
    if not sweep:
        return False
    axis = sweep.get("user_axis", "tok_s_user_p50")
    return any(p.get(axis) is not None and p.get("throughput_tok_s_gpu") is not None
               for c in sweep.get("curves", []) for p in c["points"])


def plan_yaml(plan: Mapping[str, Any]) -> str:
    """plan.yaml's text (what `write_plan` writes, without the header comment)."""
    buf = io.StringIO()
    yaml.safe_dump(json.loads(json.dumps(plan)), buf, sort_keys=False, width=100)
    return buf.getvalue()
