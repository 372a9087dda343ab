"""The search's answer: a summary of its trials, and plan.yaml.

plan.yaml holds the chosen deployment under ``deployment:`` in the DESIGN.md format, the
workload, the SLOs, the metrics the simulation predicts, provenance (rackplan and
aiconfigurator-core versions, calibration tables, seed, study), the top alternatives and the
Pareto front. `rackplan simulate plan.yaml` reads the deployment (and the workload, unless
--workload is given) and prints the predicted metrics again. Every metric here comes from a
simulation: screened-out points never enter a summary.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from planner.evaluate import calibration_for, overhead_for
from planner.load import at_load
from planner.objectives import (
    SLO,
    THROUGHPUT,
    USER_SPEED,
    metric_value,
    pareto_front,
    violation,
)
from simulator.cost.step import Batch, step_time
from simulator.resolve import resolve
from simulator.specs.deployment import Deployment
from simulator.specs.errors import SpecError
from simulator.specs.loading import dump_workload, load_deployment, load_workload, read_yaml
from simulator.specs.workload import Workload

PLAN_FORMAT = 1
"""Version of the plan.yaml layout."""
ALTERNATIVES = 3
"""Feasible plans listed after the best one."""


@dataclass(frozen=True)
class Summary:
    """What a search found, from its trial records (see `planner.search.records`)."""

    trials: int
    """Finished trials."""
    rejected: int
    """Trials rejected before any estimate (budget, vLLM rules, memory, topology)."""
    screened_out: int
    """Trials the analytic screen kept from simulation."""
    simulations: int
    """Simulations run (a deployment seen again reuses its simulation)."""
    failed: int
    """Trials whose evaluation raised an error."""
    feasible: int
    """Distinct simulated points (deployment, and load where swept) that meet every SLO."""
    best: dict[str, Any] | None
    """Record of the chosen plan: the most throughput per GPU among feasible ones (for the
    pareto objective: the front's point with the most throughput; for gpus: the fewest GPUs,
    then the most throughput per GPU); None when none is feasible."""
    alternatives: list[dict[str, Any]]
    """Next-best feasible records in the same order, each another deployment (at its best
    load)."""
    pareto: list[dict[str, Any]]
    """Feasible records on the front of throughput per GPU vs median tokens/s per user."""
    closest: dict[str, Any] | None
    """When nothing is feasible: the simulated record closest to meeting the SLOs."""
    reasons: dict[str, dict[str, int]]
    """Why trials did not become the plan: per stage (rejected, screened_out, missed_slo,
    failed), trials per reason (see `REASONS`)."""
    standing: list[dict[str, Any]]
    """The SLOs against the chosen plan (or, when none is feasible, the closest one), tightest
    first (`slo_standing`)."""


DRAFT_NAMES = {"mtp": "MTP", "dspark": "DSpark"}
"""How a plan's short description names each speculative method."""


def _rank_throughput(r: dict[str, Any]) -> tuple[float, ...]:
    return (-(metric_value(r["metrics"], THROUGHPUT) or 0.0), r["number"])


def _rank_gpus(r: dict[str, Any]) -> tuple[float, ...]:
    return (float(r["metrics"].get("gpus") or 0), *_rank_throughput(r))


RANKS: dict[str, Callable[[dict[str, Any]], tuple[float, ...]]] = {
    "slo": _rank_throughput, "pareto": _rank_throughput, "gpus": _rank_gpus}
"""Objective -> the order of feasible records, best first."""


def summarize(records: list[dict[str, Any]], slos: tuple[SLO, ...] = (),
              objective: str = "slo") -> Summary:
    """Summary of trial records (each a `record` attribute plus its trial `number`)."""
    sims = [r for r in records if r["stage"] == "simulated"]
    distinct: dict[str, dict[str, Any]] = {}
    for r in sorted(sims, key=lambda r: r["number"]):
        distinct.setdefault(json.dumps([r["deployment"], r.get("load")], sort_keys=True), r)
    unique = list(distinct.values())
    ok = sorted((r for r in unique if r.get("meets_slo")), key=RANKS[objective])
    others: dict[str, dict[str, Any]] = {}
    for r in ok[1:]:
        key = json.dumps(r["deployment"], sort_keys=True)
        if r["deployment"] != ok[0]["deployment"]:
            others.setdefault(key, r)
    points = [[metric_value(r["metrics"], k) or 0.0 for k in (THROUGHPUT, USER_SPEED)]
              for r in ok]
    front = [ok[i] for i in pareto_front(points)]
    closest = None
    if not ok and unique:
        closest = min(unique, key=lambda r: (violation(r["metrics"], slos), r["number"]))
    best = ok[0] if ok else None
    shown = best or closest
    return Summary(
        reasons=reasons(records, slos),
        standing=slo_standing(shown["metrics"], slos) if shown else [],
        trials=len(records),
        rejected=sum(r["stage"] == "rejected" for r in records),
        screened_out=sum(r["stage"] == "screened_out" for r in records),
        simulations=sum(r["stage"] == "simulated" and "reused" not in r for r in records),
        failed=sum(r["stage"] == "failed" for r in records),
        feasible=len(ok), best=best, alternatives=list(others.values())[:ALTERNATIVES],
        pareto=front,
        closest=closest)


REASONS: tuple[tuple[str, str, re.Pattern[str]], ...] = tuple(
    (stage, label, re.compile(pattern, re.IGNORECASE)) for stage, label, pattern in (
        ("rejected", "over the GPU budget", r"but the budget is"),
        ("rejected", "more GPUs than a feasible plan", r"a feasible plan needs only"),
        ("rejected", "weights or KV do not fit memory", r"memory|HBM|does not fit|KV cache"),
        ("rejected", "placement on the topology", r"topology|NVLink|scale-up|domain|placement"),
        ("rejected", "a vLLM rule", r"vLLM|must divide|divisible|multiple of|can place"),
        ("screened_out", "estimate below the best", r"of the best (?:simulated|screened)"),
        ("screened_out", "estimate misses {0}", r"^screen: (\w+) (?:~.*\(SLO\)|unbounded)"),
        ("screened_out", "same estimate as a simulated plan", r"same estimate as simulated"),
        ("screened_out", "dominated by a simulated plan", r"dominated"),
        ("screened_out", "screen warming up", r"warming up"),
    ))
"""(stage, label, pattern) in order: a trial's reason takes the first row of its stage whose
pattern it matches (a label's {0} is the pattern's first group); others count as 'other'."""


def reasons(records: list[dict[str, Any]], slos: tuple[SLO, ...] = ()) -> dict[
        str, dict[str, int]]:
    """Trials per reason and stage: rejected and screened-out trials by their reason (REASONS),
    simulated ones that miss an SLO by each SLO they miss, failed ones by error type."""
    out: dict[str, dict[str, int]] = {}

    def count(stage: str, label: str) -> None:
        out.setdefault(stage, {})
        out[stage][label] = out[stage].get(label, 0) + 1

    for r in records:
        stage, why = r["stage"], str(r.get("reason", ""))
        if stage == "simulated":
            for slo in slos:
                if slo.violation(r["metrics"]) > 0:
                    count("missed_slo", str(slo))
            continue
        if stage == "failed":
            count("failed", why.split(":")[0] or "error")
            continue
        label = next((lab.format(*m.groups()) for st, lab, pat in REASONS
                      if st == stage and (m := pat.search(why))), "other")
        count(stage, label)
    return {k: dict(sorted(v.items(), key=lambda kv: (-kv[1], kv[0]))) for k, v in out.items()}


def slo_standing(metrics: dict[str, Any], slos: tuple[SLO, ...]) -> list[dict[str, Any]]:
    """Each SLO against a simulated plan's metrics: its value, and its margin relative to the
    bound (> 0: met with that headroom, < 0: missed by that much), tightest first."""
    out = []
    for slo in slos:
        v = metric_value(metrics, slo.metric)
        margin = -slo.violation(metrics)
        out.append({"slo": str(slo), "metric": slo.metric, "bound": slo.value, "value": v,
                    "margin": margin})
    return sorted(out, key=lambda e: e["margin"])


def standing_text(e: dict[str, Any]) -> str:
    """One SLO's standing in words: `ttft_p90_ms 2,397 against <= 3000: 20 % headroom`."""
    v = "none" if e["value"] is None else f"{e['value']:,.4g}"
    word = "headroom" if e["margin"] >= 0 else "short"
    return f"{e['metric']} {v} against {e['slo'].split(' ', 1)[1]}: {abs(e['margin']):.0%} {word}"


def why_chosen(summary: Summary, objective: str = "slo") -> str:
    """Why the chosen plan beat the next alternative, and which SLO binds it ('' without a
    plan)."""
    best = summary.best
    if best is None:
        return ""
    parts = []
    if summary.alternatives:
        alt = summary.alternatives[0]
        if objective == "gpus":
            mine, theirs = best["metrics"].get("gpus"), alt["metrics"].get("gpus")
            parts.append(f"{mine} GPUs, the next alternative ({describe(alt['deployment'])}) "
                         f"{theirs}")
        else:
            a, b = (metric_value(r["metrics"], THROUGHPUT) or 0.0 for r in (best, alt))
            if b > 0 and a / b - 1 < 0.005:
                parts.append(f"as many tok/s/GPU as the next alternative "
                             f"({describe(alt['deployment'])}), found first")
            else:
                gain = f"{a / b - 1:.0%} more" if b > 0 else "more"
                parts.append(f"{gain} tok/s/GPU than the next alternative "
                             f"({describe(alt['deployment'])})")
    if summary.standing:
        parts.append(f"binding: {standing_text(summary.standing[0])}")
    return "; ".join(parts)


def advice(summary: Summary, swept: tuple[float, ...], gpus: int, unit: str = "") -> list[str]:
    """When no plan meets the SLOs, what would, in numbers: the bound that admits the closest
    plan for each SLO it misses (when one was simulated), the load (searched or not), more
    GPUs; [] with a plan."""
    if summary.best is not None:
        return []
    out = [] if summary.closest is not None else [
        "none reached a simulation: every screen estimate missed (see the reasons)"]
    for e in summary.standing:
        if e["margin"] < 0 and e["value"] is not None:
            op = e["slo"].split(" ")[1]
            out.append(f"a looser SLO: {e['metric']} {op} {e['value']:,.4g} admits the closest "
                       "plan")
    if not swept:
        out.append("a lower load: search it with --loads auto (the workload's own load "
                   "times 2 down to 1/32)")
    else:
        lowest = f"{min(swept):,.4g} {unit}".strip()
        out.append(f"a load below {lowest}, the lowest searched (--loads), if the tokens/s "
                   "per user SLO is the one missed")
    out.append(f"more GPUs than {gpus} (--gpus {2 * gpus}), or a faster --hardware")
    return out


def describe(d: dict[str, Any]) -> str:
    """One line for a deployment's plain data: P 2xDEP8 (8192 tok) + D 1xDEP32 (R32, seqs 4,
    MTP3, allgather)."""
    parts = []
    for role, tag in (("prefill", "P"), ("decode", "D"), ("aggregated", "A")):
        r = d.get(role)
        if r is None:
            continue
        extra = [f"R{r['redundant_experts']}"] if r.get("redundant_experts") else []
        if role != "prefill":
            extra.append(f"seqs {r.get('max_num_seqs', 256)}")
            if r.get("speculative"):
                spec = r["speculative"]
                name = DRAFT_NAMES.get(spec.get("method", "mtp"), "MTP")
                extra.append(f"{name}{spec.get('tokens', 1)}")
            if r.get("all2all_backend"):
                extra.append(r["all2all_backend"].split("_")[0])
        if role != "decode":
            extra.append(f"{r.get('max_num_batched_tokens', 8192)} tok")
        parts.append(f"{tag} {r.get('instances', 1)}xDEP{r.get('dep')} ({', '.join(extra)})")
    return " + ".join(parts)


def _entry(record: dict[str, Any]) -> dict[str, Any]:
    out = {"deployment": record["deployment"], "metrics": record["metrics"],
           "trial": record["number"]}
    if record.get("load") is not None:
        out["load"] = record["load"]
    return out


def to_json(summary: Summary) -> dict[str, Any]:
    """The `search --json` object."""
    return {
        "best": _entry(summary.best) if summary.best else None,
        "trials": summary.trials, "feasible": summary.feasible,
        "rejected": summary.rejected, "screened_out": summary.screened_out,
        "simulations": summary.simulations, "failed": summary.failed,
        "alternatives": [_entry(r) for r in summary.alternatives],
        "pareto": [_entry(r) for r in summary.pareto],
        "reasons": summary.reasons,
        "closest": _entry(summary.closest) if summary.closest else None,
        "slo_standing": summary.standing,
    }


def build_plan(summary: Summary, workload: Workload, slos: tuple[SLO, ...], objective: str,
               seed: int, study: str, storage: str,
               sweep: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan.yaml document for the summary's best record (SpecError when there is none):
    its workload at the load the plan was found at, and with a load sweep, the curves."""
    if summary.best is None:
        raise SpecError("no feasible plan to write")
    best = summary.best
    deployment = load_deployment(best["deployment"])
    if best.get("load") is not None:
        workload = at_load(workload, best["load"])
    extra = {"curves": sweep} if sweep and sweep.get("curves") else {}
    return {
        "format": PLAN_FORMAT,
        "deployment": best["deployment"],
        "workload": dump_workload(workload),
        "slo": {s.metric: s.value for s in slos},
        "objective": objective,
        "predicted": best["metrics"],
        "provenance": provenance(deployment, seed, study, storage),
        "search": {k: v for k, v in to_json(summary).items()
                   if k in ("trials", "feasible", "rejected", "screened_out", "simulations",
                            "failed")},
        "alternatives": [_entry(r) for r in summary.alternatives],
        "pareto": [_entry(r) for r in summary.pareto],
        **extra,
    }


def provenance(deployment: Deployment, seed: int, study: str, storage: str) -> dict[str, Any]:
    """Where the prediction comes from: versions, calibration tables, serving overheads,
    seed and study."""
    o = overhead_for(deployment)
    return {
        "rackplan": _version("rackplan"),
        "aiconfigurator_core": _version("aiconfigurator-core"),
        "engine": deployment.engine, "engine_version": deployment.engine_version,
        "calibration_tables": calibration_tables(deployment),
        "serving_overhead_ms": {"api": o.api_overhead_ms, "step": o.step_overhead_ms,
                                "handoff": o.handoff_ms,
                                **({"step_per_request": o.step_overhead_per_seq_ms}
                                   if o.step_overhead_per_seq_ms else {}),
                                **({"api_per_1k_prompt_tokens": o.api_per_ktoken_ms}
                                   if o.api_per_ktoken_ms else {}),
                                **({"step_per_layer": o.step_overhead_per_layer_ms}
                                   if o.step_overhead_per_layer_ms else {})},
        "predicted_by": "discrete-event simulation (rackplan simulate)",
        "seed": seed, "study": study, "storage": storage,
    }


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


_TABLE = re.compile(r"\(([^()]+/[^()]+)\)")


def calibration_tables(deployment: Deployment) -> list[str]:
    """The measured tables that price the deployment's steps (system/op/engine/version)."""
    res = resolve(deployment, calibration_for(deployment))
    found: set[str] = set()
    for role in res.roles.values():
        inst = role.instance
        for batch in (Batch.decode(inst.dp, 8, 4096), Batch.prefill(inst.dp, 4096)):
            st = step_time(inst, batch, res.calibration)
            for text in st.provenance.values():
                found.update(_TABLE.findall(text))
    return sorted(found)


class _PlainDumper(yaml.SafeDumper):
    """Safe YAML without anchors and aliases (the best plan also sits on the Pareto front)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def write_plan(plan: dict[str, Any], path: str | Path) -> Path:
    """Write plan.yaml atomically (a temporary file in the same folder, then a rename)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("# rackplan plan: `rackplan simulate` reads its deployment and workload.\n")
            yaml.dump(plan, f, Dumper=_PlainDumper, sort_keys=False, default_flow_style=None,
                      width=100)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a plan is an ordinary file
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def is_plan(data: Any) -> bool:
    """Whether parsed YAML is a plan (a deployment sits under `deployment:`)."""
    return isinstance(data, dict) and isinstance(data.get("deployment"), dict)


def load_plan_or_deployment(path: str | Path) -> tuple[Deployment, Workload | None]:
    """A deployment YAML, or a plan.yaml's deployment and workload."""
    data = read_yaml(Path(path))
    if not is_plan(data):
        return load_deployment(Path(path)), None
    workload = data.get("workload")
    return (load_deployment(data["deployment"]),
            load_workload(workload) if isinstance(workload, dict) else None)


COMPARED: tuple[tuple[str, Callable[[dict[str, Any]], Any]], ...] = (
    ("model", lambda p: p["deployment"].get("model")),
    ("hardware", lambda p: p["deployment"].get("hardware")),
    ("GPUs used", lambda p: p.get("predicted", {}).get("gpus")),
    ("deployment", lambda p: describe(p["deployment"])),
    ("workload", lambda p: json.dumps(p.get("workload"), sort_keys=True)),
    ("SLOs", lambda p: ", ".join(f"{k} {v:g}" for k, v in sorted(p.get("slo", {}).items()))),
    ("tok/s per GPU", lambda p: metric_value(p.get("predicted", {}), THROUGHPUT)),
    ("tok/s per user, p50", lambda p: metric_value(p.get("predicted", {}), "tok_s_user_p50")),
    ("tok/s per user, 90 % of requests at least",
     lambda p: metric_value(p.get("predicted", {}), "tok_s_user_p90")),
    ("TTFT p90 ms", lambda p: metric_value(p.get("predicted", {}), "ttft_p90_ms")),
    ("TPOT p90 ms", lambda p: metric_value(p.get("predicted", {}), "tpot_p90_ms")),
    ("$ per million tokens", lambda p: p.get("predicted", {}).get("cost_per_mtok_usd")),
    ("seed", lambda p: p.get("provenance", {}).get("seed")),
)
"""What `rackplan compare` shows of each plan: (row label, value from the plan document)."""


def compare(paths: list[str | Path]) -> dict[str, Any]:
    """Plans side by side: each row of COMPARED per plan, and the labels of the rows whose
    values differ; SpecError for a file that is not a plan.yaml."""
    plans = []
    for path in paths:
        data = read_yaml(Path(path))
        if not is_plan(data):
            raise SpecError(f"{path}: not a plan.yaml (no deployment: mapping); compare takes "
                            "plans written by rackplan search")
        plans.append(data)
    rows = {label: [get(p) for p in plans] for label, get in COMPARED}
    differ = [label for label, values in rows.items() if len({json.dumps(v) for v in values}) > 1]
    return {"plans": [str(p) for p in paths], "rows": rows, "differences": differ}
