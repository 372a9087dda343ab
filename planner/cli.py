"""The `rackplan` command line.

Every subcommand prints for people by default and one JSON object with `--json`. Bad input gives
one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from app.cli import register as register_ui
from executor.cli import register as register_executor
from kernels.cli import register as register_calibrate
from planner import defaults
from planner.objectives import metric_value
from simulator.specs.errors import SpecError
from simulator.specs.limits import (
    MAX_BATCH,
    MAX_CONTEXT_TOKENS,
    MAX_GPUS,
    MAX_NUM_SEQS,
    MAX_REFINE,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_TRIALS,
    MAX_WORKERS,
)
from simulator.specs.paths import writable

EXIT_BAD_INPUT = 2
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE, what a shell reports for a writer whose reader closed the pipe."""
CALIBRATION_HELP = ("tables written by `rackplan calibrate --out DIR`, preferred over the shipped "
                    "ones (default: $RACKPLAN_CALIBRATION_DIR, else none)")


def check_range(flag: str, value: int | None, low: int, high: int, what: str = "") -> None:
    """SpecError naming `flag` and its value unless low <= value <= high (None: not given)."""
    if value is not None and not low <= value <= high:
        raise SpecError(f"{flag}={value} must be between {low:,} and {high:,}"
                        + (f" ({what})" if what else ""))


def _console() -> Console:
    """Rich console; wide enough for the tables when stdout is a file or a pipe."""
    return Console() if sys.stdout.isatty() else Console(width=160)


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def cmd_models(args: argparse.Namespace) -> int:
    from simulator.specs.model import load_model, preset_names

    rows: list[dict[str, Any]] = []
    for name in preset_names():
        m = load_model(name)
        rows.append({
            "name": name, "architecture": m.architecture, "params_b": m.total_params() / 1e9,
            "active_params_b": m.active_params() / 1e9, "layers": m.layers,
            "attention": m.attention, "routed_experts": m.n_routed_experts, "top_k": m.top_k,
            "mtp_layers": m.mtp_layers, "draft": "dspark" if m.dspark_block else "mtp",
            "kv_bytes_per_token_fp8": m.kv_bytes_per_token("fp8"),
        })
    if args.json:
        _print_json({"models": rows})
        return 0
    t = Table(title="model presets")
    for col in ("name", "architecture", "params", "active", "layers", "attention", "experts",
                "top-k", "draft layers", "KV B/token (fp8)"):
        t.add_column(col, justify="left" if col in ("name", "architecture") else "right")
    for r in rows:
        t.add_row(r["name"], r["architecture"], f"{r['params_b']:.1f}B",
                  f"{r['active_params_b']:.2f}B", str(r["layers"]), r["attention"],
                  str(r["routed_experts"]), str(r["top_k"]),
                  f"{r['mtp_layers']} {r['draft']}" if r["mtp_layers"] else "0",
                  f"{r['kv_bytes_per_token_fp8']:,.0f}")
    _console().print(t)
    return 0


def _length_text(spec: Any) -> str:
    """A token-length distribution in a few words."""
    kind = spec.kind
    if kind == "fixed":
        return f"{spec.value:,}"
    if kind == "uniform":
        return f"{spec.low:,}-{spec.high:,}"
    return f"~{spec.median:,.0f} ({kind}, max {spec.max:,})"


def _arrival_text(a: Any) -> str:
    """An arrival process in a few words."""
    if hasattr(a, "concurrency"):
        return f"{a.kind}, concurrency {a.concurrency:,}"
    if hasattr(a, "rate"):
        return f"{a.kind}, {a.rate:g} req/s"
    return str(a.kind)


def cmd_workloads(args: argparse.Namespace) -> int:
    from importlib import resources

    rows: list[dict[str, Any]] = []
    for name in defaults.workload_presets():
        w = defaults.load_workload_arg(name)
        text = resources.files("planner").joinpath(f"presets/{name}.yaml").read_text()
        comment = " ".join(line.lstrip("#").strip() for line in text.splitlines()
                           if line.startswith("#"))
        first = comment.split(". ")[0].rstrip(".") + "." if comment else ""
        sessions = w.arrival.kind == "sessions"
        rows.append({
            "name": name, "summary": first, "arrival": _arrival_text(w.arrival),
            "requests": w.requests,
            "input_tokens": "session traces" if sessions else _length_text(w.input_tokens),
            "output_tokens": "session traces" if sessions else _length_text(w.output_tokens),
        })
    if args.json:
        _print_json({"workloads": rows})
        return 0
    t = Table(title="workload presets (rackplan search --workload NAME)")
    for col in ("name", "arrival", "requests", "input tokens", "output tokens"):
        t.add_column(col, justify="right" if col == "requests" else "left")
    for r in rows:
        t.add_row(r["name"], r["arrival"], f"{r['requests']:,}", r["input_tokens"],
                  r["output_tokens"])
    _console().print(t)
    _console().print("what each is: the comment at the top of planner/presets/NAME.yaml "
                     "(--json: summary)", highlight=False)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from planner.plan import compare

    got = compare(args.plans)
    if args.json:
        _print_json(got)
        return 0
    t = Table(title=f"{len(got['plans'])} plans side by side (* differs)")
    t.add_column("")
    for i, path in enumerate(got["plans"]):
        t.add_column(f"{chr(ord('A') + i)}: {path}", justify="right")
    for label, values in got["rows"].items():
        mark = "* " if label in got["differences"] else "  "
        t.add_row(mark + label, *(_cell(v) for v in values))
    _console().print(t)
    return 0


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def cmd_hardware(args: argparse.Namespace) -> int:
    from simulator.specs.hardware import HARDWARE

    rows = [h.model_dump() for h in HARDWARE.values()]
    if args.json:
        _print_json({"hardware": rows})
        return 0
    t = Table(title="hardware presets (dense peak per GPU)")
    for col in ("name", "bf16 TF/s", "fp8 TF/s", "fp4 TF/s", "HBM GB", "HBM TB/s",
                "scale-up", "NVLink GB/s", "NIC GB/s", "$/GPU-h", "measured tables"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for h in HARDWARE.values():
        pk = h.peak_tflops
        t.add_row(h.name, *(f"{pk[d]:,.0f}" if d in pk else "-" for d in ("bf16", "fp8", "fp4")),
                  f"{h.hbm_gb:.0f}", f"{h.hbm_tb_s:.2f}", str(h.scaleup_domain),
                  f"{h.scaleup_gb_s:.0f}", f"{h.nic_gb_s:.0f}", f"{h.usd_per_gpu_hour:.2f}",
                  h.system or "none (calibrate)")
    _console().print(t)
    return 0


def cmd_step(args: argparse.Namespace) -> int:
    from planner.stepcalc import step_report

    check_range("--batch", args.batch, 1, MAX_NUM_SEQS, "vLLM's max_num_seqs at most")
    if args.context is not None:
        check_range("--context", args.context, 1, MAX_CONTEXT_TOKENS, "the longest context")
    check_range("--cached", args.cached, 0, MAX_CONTEXT_TOKENS, "the longest context")
    check_range("--ranks-busy", args.ranks_busy, 1, MAX_GPUS, "the largest cluster")
    report = step_report(args.deployment, args.role, args.batch, args.context, args.cached,
                         args.ranks_busy)
    if args.json:
        _print_json(report)
        return 0
    c = _console()
    c.print(f"[bold]{report['model']}[/] on {report['hardware']} ({report['engine']}), "
            f"{report['role']} instance {report['layout']}: {args.batch} requests per rank, "
            f"context {report['context']}")
    t = Table(title=f"step time {report['total_ms']:.3f} ms "
                    f"({report['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU)")
    t.add_column("part")
    t.add_column("ms", justify="right")
    t.add_column("share", justify="right")
    for k, v in report["breakdown_ms"].items():
        t.add_row(k, f"{v:.3f}", f"{v / report['total_ms']:.1%}")
    c.print(t)
    p = Table(title="provenance")
    p.add_column("operation")
    p.add_column("source")
    for k, v in report["provenance"].items():
        p.add_row(k, v)
    c.print(p)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from planner.evaluate import check_workload_fits, sim_options
    from planner.plan import load_plan_or_deployment
    from simulator.des import SimOptions, simulate
    from simulator.specs.deployment import check_against_model
    from simulator.specs.hardware import load_hardware
    from simulator.specs.model import load_model

    deployment, planned = load_plan_or_deployment(args.deployment)
    workload = (defaults.load_workload_arg(args.workload) if args.workload
                else planned or _default_workload(deployment))
    if args.workload or planned:  # the built-in default is not the user's; check theirs
        model = load_model(deployment.model)
        load_hardware(deployment.hardware)  # the deployment's own errors come first
        check_against_model(deployment, model)
        check_workload_fits(workload, model)
    options = SimOptions() if args.engine_only else sim_options(deployment)
    with _progress("simulating", total=1.0) as advance:
        result = simulate(deployment, workload, progress=advance, options=options)
    metrics = result.metrics()
    if args.json:
        _print_json(metrics)
        return 0
    _print_metrics(metrics)
    return 0


def _default_workload(deployment: Any) -> Any:
    """The built-in workload `simulate` runs without --workload: serve end to end, or for a
    deck of one role alone the isolated-role mode that role runs (`ISOLATED_MODE`: a prefill
    deck prefill_only, a decode deck decode_only), said on stderr. A decode deck is benched
    at the batch it holds (its sequences over all ranks, at most the default's users), as
    DecodeBenchConnector benches a decode instance at a concurrency, with
    `defaults.BENCH_REQUESTS_PER_USER` requests a user up to the default count."""
    from simulator.des.simulate import ISOLATED_MODE
    from simulator.specs.workload import ClosedArrival, Workload

    base = Workload()
    alone = deployment.single_role
    if alone is None:
        return base
    mode = ISOLATED_MODE[alone]
    users = cast(ClosedArrival, base.arrival).concurrency
    requests = base.requests
    if mode == "decode_only":
        role = deployment.roles[alone]
        users = min(role.instances * (role.dep or 1) * role.max_num_seqs, users)
        requests = min(defaults.BENCH_REQUESTS_PER_USER * users, requests)
    print(f"the deployment has only {alone} instances: simulating the default workload in "
          f"mode {mode}: {users:,} user{'s' * (users != 1)}, {requests:,} requests "
          "(--workload for another)", file=sys.stderr)
    return base.model_copy(update={"mode": mode, "arrival": ClosedArrival(concurrency=users),
                                   "requests": requests})


def _print_metrics(m: dict[str, Any]) -> None:
    c = _console()
    t = Table(title=f"{m['completed']} requests in {m['duration_s']:.1f} simulated s on "
                    f"{m['gpus']} GPUs")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [
        ("throughput per GPU (all tokens)", f"{m['throughput_tok_s_gpu']:,.0f} tok/s"),
        ("output per GPU", f"{m['output_tok_s_gpu']:,.0f} tok/s"),
        ("prefill input per prefill GPU", _fmt(m.get("prefill_input_tok_s_gpu"), "tok/s")),
        ("decode output per decode GPU", _fmt(m.get("decode_output_tok_s_gpu"), "tok/s")),
        ("TTFT p50 / p90 / p99", _pct(m["ttft_ms"], "ms")),
        ("TPOT p50 / p90 / p99", _pct(m["tpot_ms"], "ms")),
        ("ITL p50 / p90 / p99", _pct(m["itl_ms"], "ms")),
        ("tokens/s per user: median / 90 % of requests at least", " / ".join(
            _num(metric_value(m, f"tok_s_user_{k}"), ",.1f") for k in ("p50", "p90"))),
        ("expert imbalance (max-mean)/mean", _num(m["expert_imbalance"], ".3f")),
        ("$ per million tokens", _num(m["cost_per_mtok_usd"], ".3f")),
    ]
    inputs = m["cached_input_tokens"] + m["uncached_input_tokens"]
    if m["cached_input_tokens"]:
        rows.append(("input tokens from the prefix cache",
                     f"{_num(m.get('cache_hit_share'), '.1%')} of {inputs:,}"))
    if m.get("host_loaded_tokens"):
        rows.append(("of which loaded from the host tier", f"{m['host_loaded_tokens']:,}"))
    if m.get("warmup_requests"):
        rows.append(("warmup turns (not in these figures)", f"{m['warmup_requests']:,}"))
    if m.get("preempted_requests"):
        rows.append(("requests preempted for KV space (recomputed)",
                     f"{m['preempted_requests']:,}"))
    for k, v in rows:
        t.add_row(k, v)
    share = ", ".join(f"{k} {_num(v, '.0%')}" for k, v in m["step_breakdown"].items())
    t.add_row("step time shares", share)
    c.print(t)


def _num(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _fmt(v: float | None, unit: str) -> str:
    return "-" if v is None else f"{v:,.0f} {unit}"


def _pct(d: dict[str, float | None], unit: str) -> str:
    return " / ".join(_num(d[k], ",.1f") for k in ("p50", "p90", "p99")) + f" {unit}"


def cmd_validate(args: argparse.Namespace) -> int:
    from simulator.validate import load_rows, summarize, validate

    check_range("--sample", args.sample, 0, MAX_REQUESTS)
    check_range("--seed", args.seed, 0, MAX_SEED)
    check_range("--workers", args.workers, 1, MAX_WORKERS, "processes on this machine")
    rows = load_rows()
    for col, want in (("backend", args.backend), ("system", args.system), ("mode", args.mode)):
        if want:
            if want not in set(rows[col]):
                raise SpecError(f"--{col}={want!r} matches no row; valid: "
                                f"{', '.join(sorted(set(rows[col])))}")
            rows = rows[rows[col] == want]
    if args.sample and args.sample < len(rows):
        rows = rows.sample(args.sample, random_state=args.seed).sort_index()
    out = writable(args.out, "--out")
    out.parent.mkdir(parents=True, exist_ok=True)
    journal = out.with_name(out.name + ".partial")
    if args.restart:
        journal.unlink(missing_ok=True)
    elif journal.is_file():
        print(f"resuming from {journal} (--restart to start over)", file=sys.stderr)
    with _progress("validating", total=float(len(rows))) as advance:
        df = validate(rows, progress=lambda done, _total: advance(float(done)),
                      workers=args.workers, journal=journal)
    report = summarize(df)
    tmp = out.with_suffix(out.suffix + ".tmp")
    df.to_csv(tmp, index=False)
    tmp.replace(out)
    journal.unlink(missing_ok=True)
    report["csv"] = str(out)
    if args.json:
        _print_json(report)
        return 0
    c = _console()
    t = Table(title=f"accuracy on {report['rows']} measured rows ({report['covered']} covered)")
    for col in ("backend", "system", "mode", "rows", "covered", "TPOT MAPE %", "TTFT MAPE %"):
        t.add_column(col, justify="left" if col in ("backend", "system", "mode") else "right")
    for g in report["groups"]:
        t.add_row(g["backend"], g["system"], g["mode"], str(g["rows"]), str(g["covered"]),
                  _fmt_pct(g["tpot_mape"]), _fmt_pct(g["ttft_mape"]))
    for name, blk in (("MoE rows", report["moe"]),
                      ("MoE rows that record their layout and load", report["moe_describable"]),
                      ("all rows", {**report["overall"],
                      "rows": report["rows"], "covered": report["covered"]})):
        t.add_row(f"[bold]{name}[/]", "", "", str(blk["rows"]), str(blk["covered"]),
                  _fmt_pct(blk["tpot_mape"]), _fmt_pct(blk["ttft_mape"]))
    c.print(t)
    c.print(f"per-row results: {out}")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from planner.chart import check_chart_path
    from planner.load import for_target, ladder, load_kind
    from planner.objectives import (
        goodput_slos,
        load_slo_file,
        merge_slos,
        parse_slo,
        parse_target_rate,
        shorthand_slo,
    )
    from planner.plan import (
        advice,
        describe,
        standing_text,
        summarize,
        to_json,
        why_chosen,
        write_plan,
    )
    from planner.search import SearchConfig, conclude, records, run_search
    from planner.space import build_space

    check_range("--gpus", args.gpus, 1, MAX_GPUS, "the largest cluster built")
    check_range("--trials", args.trials, 1, MAX_TRIALS)
    check_range("--batch", args.batch, 1, MAX_BATCH)
    if args.workers is None:
        args.workers = defaults.workers(args.batch)
    check_range("--workers", args.workers, 1, MAX_WORKERS, "processes on this machine")
    check_range("--seed", args.seed, 0, MAX_SEED, "numpy's and Optuna's seeds")
    check_range("--max-simulations", args.max_simulations, 1, MAX_TRIALS * MAX_BATCH)
    check_range("--refine", args.refine, 0, MAX_REFINE)
    given = [parse_slo(text) for text in args.slo or []]
    if args.slo_file:
        given = [*load_slo_file(args.slo_file), *given]
    given += goodput_slos(args.goodput or [])
    given += [shorthand_slo(flag, value) for flag, value in
              (("ttft", args.ttft), ("tpot", args.tpot)) if value is not None]
    slos = merge_slos(given) if given or args.slo_file else defaults.SLOS
    workload = defaults.load_workload_arg(args.workload)
    loads = ladder(workload, args.loads) if args.loads else ()
    objective = args.objective or "slo"
    if args.target_rate:
        if args.objective not in (None, "gpus"):
            raise SpecError(f"--target-rate asks for the fewest GPUs; it cannot go with "
                            f"--objective {args.objective}")
        target = parse_target_rate(args.target_rate)
        slos = merge_slos([*slos, target])
        workload, loads = for_target(workload, target.metric, target.value, loads)
        objective = "gpus"
    plot = check_chart_path(args.plot) if args.plot else None
    writable(args.out, "--out")
    config = SearchConfig(
        space=build_space(args.model, args.hardware, args.gpus), workload=workload,
        slos=slos, objective=objective, trials=args.trials, seed=args.seed,
        storage=args.storage, study=args.study, batch=args.batch, workers=args.workers,
        screen=not args.no_screen, max_simulations=args.max_simulations, loads=loads,
        refine=args.refine)
    from planner.evaluate import check_workload_fits
    from simulator.specs.model import load_model

    check_workload_fits(workload, load_model(config.space.model))
    with _search_progress(config.trials) as update:
        study = run_search(config, progress=lambda n, trials: update(
            n, _best_text(summarize(records(trials), config.slos, config.objective))))
    concluded = conclude(study, config)
    summary, sweep, name, storage = (concluded.summary, concluded.sweep, concluded.study,
                                     concluded.storage)
    out = None if concluded.plan is None else write_plan(concluded.plan, args.out)
    if not args.json:
        _print_search(summary, config, name, storage, out)
        why = why_chosen(summary, config.objective)
        if why:
            _console().print(f"why this plan: {why}", highlight=False)
        _print_curves(sweep, config)
    drawn = _draw(plot, sweep, config) if plot is not None else None
    unit = load_kind(config.workload).unit if config.loads else ""
    hints = advice(summary, config.loads, config.space.gpus, unit)
    if args.json:
        _print_json({**to_json(summary), "plan": str(out) if out else None, "study": name,
                     "storage": storage, "curves": sweep, "chart": drawn,
                     "why": why_chosen(summary, config.objective), "advice": hints})
    elif drawn:
        _console().print(f"chart written to {drawn}")
    if summary.best is None:
        near = summary.closest
        hint = f"; closest: {describe(near['deployment'])}" if near else ""
        missed = [standing_text(e) for e in summary.standing if e["margin"] < 0]
        if missed:
            hint += f" ({'; '.join(missed)})"
        print(f"rackplan: no plan met the SLOs ({', '.join(str(s) for s in config.slos)}) in "
              f"{summary.trials} trials{hint}; what would: {'; '.join(hints)}",
              file=sys.stderr)
        return 1
    return 0


def _draw(path: Path, sweep: dict[str, Any], config: Any) -> str | None:
    """Write the load sweep's chart (None when nothing was swept)."""
    from planner.chart import write_chart
    from planner.load import load_kind

    if not sweep["curves"]:
        print("rackplan: --plot: nothing to plot, the search swept no load (give --loads)",
              file=sys.stderr)
        return None
    axis = sweep["user_axis"]
    floor = next((s.value for s in config.slos if s.metric == axis), None)
    s = config.space
    return str(write_chart(path, sweep["curves"], sweep["envelope"], user_axis=axis,
                           user_floor=floor, load_unit=load_kind(config.workload).unit,
                           title=f"{s.model} on up to {s.gpus} x {s.hardware}"))


def _print_curves(sweep: dict[str, Any], config: Any) -> None:
    """The throughput-interactivity curves, one table per swept deployment."""
    from planner.load import load_kind

    if not sweep["curves"]:
        return
    unit, axis = load_kind(config.workload).unit, sweep["user_axis"]
    c = _console()
    for curve in sweep["curves"]:
        t = Table(title=f"across load: {curve['label']}")
        for col in (unit, "tok/s/GPU", f"tok/s/user {axis.rsplit('_', 1)[1]}", "TTFT p90 ms",
                    "meets SLOs"):
            t.add_column(col, justify="right")
        for p in curve["points"]:
            t.add_row(f"{p['load']:,.4g}", _num(p["throughput_tok_s_gpu"], ",.0f"),
                      _num(p[axis], ",.1f"), _num(p["ttft_p90_ms"], ",.0f"),
                      "yes" if p["meets_slo"] else "no")
        c.print(t)
    t = Table(title="envelope: the most tok/s/GPU at each tok/s/user, any deployment and load")
    for col in (f"tok/s/user {axis.rsplit('_', 1)[1]}", "tok/s/GPU", unit, "deployment",
                "meets SLOs"):
        t.add_column(col, justify="left" if col == "deployment" else "right")
    for p in sweep["envelope"]:
        t.add_row(_num(p[axis], ",.1f"), _num(p["throughput_tok_s_gpu"], ",.0f"),
                  f"{p['load']:,.4g}", p["label"], "yes" if p["meets_slo"] else "no")
    c.print(t)


def _best_text(summary: Any) -> str:
    best = summary.best
    if best is None:
        return "no feasible plan yet"
    return f"best {best['metrics']['throughput_tok_s_gpu']:,.0f} tok/s/GPU"


def _print_search(summary: Any, config: Any, name: str, storage: str,
                  out: Path | None) -> None:
    from planner.plan import describe, standing_text

    c = _console()
    s = config.space
    c.print(f"[bold]search[/] {s.model} on up to {s.gpus} x {s.hardware}, objective "
            f"{config.objective}, SLOs: {', '.join(str(x) for x in config.slos) or 'none'}")
    c.print(f"{summary.trials} trials: {summary.rejected} rejected before simulation, "
            f"{summary.screened_out} screened out, {summary.simulations} simulated, "
            f"{summary.feasible} feasible"
            + (f", {summary.failed} failed" if summary.failed else "")
            + f" (study {name} in {storage})")
    for stage, title in (("rejected", "rejected"), ("screened_out", "screened out"),
                         ("missed_slo", "simulated, missed"), ("failed", "failed")):
        got = summary.reasons.get(stage)
        if got:
            c.print(f"  {title}: " + ", ".join(f"{label} {n}" for label, n in got.items()),
                    highlight=False)
    if summary.standing:
        who = "chosen plan" if summary.best is not None else "closest plan"
        c.print(f"  SLOs against the {who}, tightest first: "
                + "; ".join(standing_text(e) for e in summary.standing), highlight=False)
    if summary.best is None:
        return
    d = summary.best["deployment"]
    at = ""
    if summary.best.get("load") is not None:
        from planner.load import load_text

        at = f", at {load_text(config.workload, summary.best['load'])}"
    t = Table(title=f"chosen plan (trial {summary.best['number']}{at})")
    for col in ("role", "instances", "DEP", "GPUs", "max_num_seqs", "max_num_batched_tokens",
                "redundant experts", "draft tokens", "all2all"):
        t.add_column(col, justify="left" if col in ("role", "all2all") else "right")
    for role in ("prefill", "decode", "aggregated"):
        r = d.get(role)
        if r is None:
            continue
        n, dep = r.get("instances", 1), r.get("dep", 1)
        spec = r.get("speculative")
        t.add_row(role, str(n), str(dep), str(n * dep),
                  "-" if role == "prefill" else str(r.get("max_num_seqs", 256)),
                  "-" if role == "decode" else str(r.get("max_num_batched_tokens", 8192)),
                  str(r.get("redundant_experts", 0)),
                  "-" if role == "prefill" else str(spec.get("tokens", 1) if spec else 0),
                  r.get("all2all_backend") or "default")
    c.print(t)
    _print_metrics(summary.best["metrics"])
    others = [("alternative", r) for r in summary.alternatives] + [
        ("pareto", r) for r in summary.pareto]
    if others:
        a = Table(title="alternatives and Pareto front (simulated)")
        for col in ("kind", "trial", "deployment", "tok/s/GPU", "tok/s/user p50", "TTFT p90 ms"):
            a.add_column(col, justify="left" if col in ("kind", "deployment") else "right")
        for kind, r in others:
            m = r["metrics"]
            a.add_row(kind, str(r["number"]), describe(r["deployment"]),
                      _num(m["throughput_tok_s_gpu"], ",.0f"), _num(m["tok_s_user"]["p50"], ",.1f"),
                      _num(m["ttft_ms"]["p90"], ",.0f"))
        c.print(a)
    if out is not None:
        c.print(f"plan written to {out}")


@contextmanager
def _search_progress(total: int) -> Iterator[Callable[[int, str], None]]:
    """A progress bar on stderr: trials done and the best plan so far (a line every
    LOG_EVERY_S when stderr is not a terminal); the trials past `total` (the refinement's and
    the load sweep's) are counted as such, not as more than all of them."""
    from planner.search import past_drawn

    log = _LogLines("searching")
    with Progress(TextColumn("searching"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[best]}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty(),
                  ) as bar:
        task = bar.add_task("search", total=total, best="")

        def update(done: int, best: str) -> None:
            bar.update(task, completed=done, total=max(total, done), best=best)
            count = past_drawn(done, total) or f"{done}/{total} trials"
            log(count + (f", {best}" if best else ""))

        yield update


LOG_EVERY_S = 10.0
"""Seconds between progress lines when stderr is not a terminal (logs, CI, pipes)."""


class _LogLines:
    """Progress as plain lines on stderr, at most one every LOG_EVERY_S, when stderr is not a
    terminal (where the progress bar shows instead)."""

    def __init__(self, label: str) -> None:
        self.label, self.start = label, time.monotonic()
        self.last = self.start
        self.on = not sys.stderr.isatty()

    def __call__(self, text: str) -> None:
        now = time.monotonic()
        if self.on and now - self.last >= LOG_EVERY_S:
            self.last = now
            print(f"{self.label}: {text} ({now - self.start:.0f} s)", file=sys.stderr,
                  flush=True)


def _fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


@contextmanager
def _progress(label: str, total: float) -> Iterator[Callable[[float], None]]:
    """A progress bar on stderr that appears only when the work outlasts a second."""
    with Progress(TextColumn(label), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty(),
                  ) as bar:
        task = bar.add_task(label, total=total, visible=False)
        start = time.monotonic()
        log = _LogLines(label)

        def advance(done: float) -> None:
            bar.update(task, completed=done, visible=time.monotonic() - start > 1.0)
            log(f"{done / total:.0%}" if total else f"{done:g}")

        yield advance


@contextmanager
def _calibration(args: argparse.Namespace) -> Iterator[None]:
    """--calibration DIR: load_calibration prefers those tables while the command runs."""
    if getattr(args, "calibration", None) is None:
        yield
        return
    from simulator.calibration.tables import calibration_dir

    with calibration_dir(args.calibration):
        yield


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rackplan",
        description="Plan, predict and deploy P/D-disaggregated, wide-EP MoE serving on vLLM.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("models", help="list the model presets")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("hardware", help="list the hardware presets")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_hardware)

    p = sub.add_parser("compare", help="plans side by side (budget A against B), their "
                                       "differences marked")
    p.add_argument("plans", nargs="+", metavar="PLAN", help="plan.yaml files (rackplan search)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("workloads", help="list the workload presets")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_workloads)

    p = sub.add_parser("step", help="price one engine step of one instance of a deployment")
    p.add_argument("deployment", help="deployment YAML (DESIGN.md format), or a plan.yaml")
    p.add_argument("--role", choices=["prefill", "decode", "aggregated"], default=None,
                   help="which role's instance to price (default: decode, else the "
                        "deployment's aggregated or prefill role)")
    p.add_argument("--batch", type=int, default=128,
                   help="requests per rank in the step (default 128)")
    p.add_argument("--context", type=int, default=None,
                   help="decode: KV length per request; prefill: prompt tokens per request "
                        "(default 4096, or the model's whole context when shorter)")
    p.add_argument("--cached", type=int, default=0,
                   help="prefill: tokens of each request already in the prefix cache before its "
                        "prompt chunk (default 0)")
    p.add_argument("--ranks-busy", type=int, default=None, metavar="N",
                   help="only the first N ranks of the instance get the batch, the others idle "
                        "in lock-step (default: every rank)")
    p.add_argument("--calibration", metavar="DIR", help=CALIBRATION_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_step)

    p = sub.add_parser("simulate", help="simulate a deployment under a workload")
    p.add_argument("deployment", help="deployment YAML (DESIGN.md format), or a plan.yaml")
    p.add_argument("--workload", help="workload YAML or preset name (`rackplan workloads`); "
                                      "default: a plan's own workload, else closed loop at "
                                      "2048, 4000 requests of 2000 in / 1000 out (in mode "
                                      "prefill_only or decode_only for a deck of one role)")
    p.add_argument("--engine-only", action="store_true",
                   help="leave out the serving stack's fitted fixed latencies (API server, P/D "
                        "handoff) and time the engine alone")
    p.add_argument("--calibration", metavar="DIR", help=CALIBRATION_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("search", help="search deployments for the best plan under SLOs")
    p.add_argument("--model", default=defaults.MODEL,
                   help=f"model preset (`rackplan models`), Hugging Face id such as "
                        f"deepseek-ai/DeepSeek-V4-Flash (resolved offline: our preset, "
                        f"aiconfigurator-core's config.json, or the local Hugging Face cache), "
                        f"or a config.json path (default {defaults.MODEL})")
    p.add_argument("--hardware", default=defaults.HARDWARE,
                   help=f"hardware preset (default {defaults.HARDWARE})")
    p.add_argument("--gpus", type=int, default=defaults.GPUS,
                   help=f"GPU budget (default {defaults.GPUS})")
    p.add_argument("--workload", help=f"workload YAML or preset name: "
                                      f"{', '.join(defaults.workload_presets())} (default "
                                      f"{defaults.WORKLOAD}: AgentX session trees; see "
                                      "`rackplan workloads`)")
    p.add_argument("--slo", action="append", metavar="NAME=VALUE",
                   help="an SLO, repeatable: ttft_p90_ms=2000 (upper bound), "
                        "tok_s_user_p90=20 (lower bound); default: "
                        + " and ".join(f"{s.metric}={s.value:g}" for s in defaults.SLOS))
    p.add_argument("--slo-file", help="YAML mapping of SLOs, e.g. {ttft_p90_ms: 2000}")
    p.add_argument("--ttft", metavar="MS", help="shorthand: --slo ttft_p90_ms=MS (90 %% of "
                                               "requests see their first token within MS)")
    p.add_argument("--tpot", metavar="MS", help="shorthand: --slo tpot_p90_ms=MS")
    p.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="vLLM bench serve's form, e.g. --goodput ttft:2000 tpot:50 (keys ttft, "
                        "tpot, itl; each a p90 bound)")
    p.add_argument("--objective", choices=["slo", "pareto", "gpus"], default=None,
                   help="slo: most throughput per GPU within the SLOs; pareto: the front of "
                        "throughput per GPU vs tokens/s per user; gpus: the fewest GPUs "
                        "(what --target-rate asks for) (default slo)")
    p.add_argument("--loads", metavar="auto|L1,L2,...",
                   help="search the offered load too: users (closed loop), session lanes "
                        "(sessions) or requests/s (poisson, bursty); auto: the workload's own "
                        "times 2, 1, 1/2 ... 1/32; the best deployments are then simulated at "
                        "every load (the throughput-interactivity curves)")
    p.add_argument("--target-rate", metavar="R",
                   help="the fewest GPUs (up to --gpus) that carry R within the SLOs: "
                        "requests/s (12 or 12req/s) or tokens/s (50000tok/s); open arrivals "
                        "are offered R, closed loops sweep --loads (default auto)")
    p.add_argument("--plot", metavar="OUT.png",
                   help="draw the throughput-interactivity chart of the load sweep "
                        "(.png, .svg or .pdf)")
    p.add_argument("--trials", type=int, default=defaults.TRIALS,
                   help="finished trials the study should hold; a resumed study runs the rest "
                        f"(default {defaults.TRIALS})")
    p.add_argument("--storage", default=defaults.STORAGE,
                   help="Optuna storage: sqlite:///PATH, another RDB URL, or journal:PATH "
                        f"(default {defaults.STORAGE})")
    p.add_argument("--study", help="study name (default: derived from the search, so the same "
                                   "search resumes)")
    p.add_argument("--batch", type=int, default=defaults.BATCH,
                   help="evaluations per round, chosen together; the answer depends on the "
                        f"seed and batch, not on --workers (default {defaults.BATCH})")
    p.add_argument("--workers", type=int,
                   help="local processes evaluating a round's points, at most --batch; "
                        "started at the first round with two simulations (default: the "
                        "machine's cores, at most --batch)")
    p.add_argument("--seed", type=int, default=0,
                   help="sampler seed; searches sharing a study from several machines each "
                        "need their own (default 0)")
    p.add_argument("--max-simulations", type=int, metavar="N",
                   help="stop once the study has run N simulations (default: no limit)")
    p.add_argument("--refine", type=int, default=defaults.REFINE, metavar="N",
                   help="rounds of local search around the best plan after the trials: its "
                        "one-knob neighbours, screened and simulated, and where they find "
                        "nothing better, the neighbours of the faster plans that missed an SLO; "
                        f"stops early when neither finds anything better (0: none; default "
                        f"{defaults.REFINE})")
    p.add_argument("--no-screen", action="store_true",
                   help="simulate every feasible point (no analytic screening)")
    p.add_argument("--out", default=defaults.OUT, help=f"plan file (default {defaults.OUT})")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("validate", help="accuracy against published measured deployments")
    p.add_argument("--backend", help="only rows of this backend (vllm, sglang, trtllm)")
    p.add_argument("--system", help="only rows of this system (e.g. h200_sxm)")
    p.add_argument("--mode", help="only agg or disagg rows")
    p.add_argument("--sample", type=int, default=0, help="a seeded random sample of N rows")
    p.add_argument("--seed", type=int, default=0, help="seed of --sample (default 0)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="processes to spread the rows over (default: all cores)")
    p.add_argument("--out", default="runs/validate.csv", help="per-row CSV "
                                                               "(default runs/validate.csv)")
    p.add_argument("--restart", action="store_true",
                   help="drop the rows a killed run left in OUT.partial instead of resuming "
                        "from them")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_validate)
    register_ui(sub)
    register_executor(sub)
    register_calibrate(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        with _calibration(args):
            code = func(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return code
    except SpecError as e:
        print(f"rackplan: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as e:  # a search says what it kept (planner.search.Interrupted)
        print(f"rackplan: {str(e) or 'interrupted'}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`rackplan ... | head`): stop quietly
        quiet = os.open(os.devnull, os.O_WRONLY)  # the interpreter's own flush at exit too
        os.dup2(quiet, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
