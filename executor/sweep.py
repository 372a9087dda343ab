"""Benches at several loads, and of one role alone: measured points beside predicted ones.

`bench_points` runs `vllm bench serve` once per load (a closed loop's users, or an open loop's
requests/s, in the unit of the plan's workload) and predicts each point with the simulator at
the same load (planner/load.py `at_load`, what the planner's sweep simulates). Each load sends
prompts of its own (the workload's seed plus the load's index): an engine serving a prompt
again would find it in its prefix cache. With `repeats` each load runs that many times on the
same deployment (run-1, run-2, ... under the load's folder, each with prompts of its own: the
workload's seed plus REPEAT_SEEDS x the repeat) and the median of the runs' figures is compared
(`executor.bench.median_result`). In serve mode it
measures the deployment at `url`; in an isolated mode (executor/isolated.py) it deploys the role
alone on this machine, benches it at each concurrency and tears it down. Each point is a
`Report` (the comparison rows, report.json and report.md in run_dir/<load>/); `SweepReport`
adds the two curves: tokens/s per GPU against tokens/s per user, predicted and measured, with
per-point relative errors (sweep.json, sweep.md, and a chart when asked).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from executor.backends.base import write_atomic
from executor.backends.local import default_vllm, local_client_cores
from executor.bench import (
    BenchError,
    Comparison,
    Report,
    _summary,
    _write_report,
    bench_settings,
    compare,
    load_prediction,
    measure,
    median_result,
    served_model,
)
from executor.isolated import launch_alone, mode_for, predict_alone, serve_workload
from simulator.specs.errors import SpecError
from simulator.specs.workload import Workload

MAX_POINTS = 16
"""Loads one sweep may ask for: each is a benchmark run of its own on the real engine."""
MAX_REPEATS = 20
"""Runs of one load at most (`repeats`)."""
REPEAT_SEEDS = 1000
"""The seed step between a load's repeats (its loads' seeds step by one)."""
CURVE_METRICS = ("ttft_ms.p50", "tpot_ms.p50", "itl_ms.p50", "output_throughput_tok_s",
                 "total_throughput_tok_s")


def parse_loads(text: str) -> tuple[float, ...]:
    """'1,4,16' -> (1.0, 4.0, 16.0): positive, finite, distinct, at most MAX_POINTS."""
    from planner.load import positive_numbers

    loads = positive_numbers("--sweep", text, "loads like 1,4,16", ", finite load")
    if len(set(loads)) != len(loads):
        raise SpecError(f"--sweep {text!r} repeats a load")
    if len(loads) > MAX_POINTS:
        raise SpecError(f"--sweep {text!r} asks for {len(loads)} loads; at most {MAX_POINTS}")
    return tuple(sorted(loads))


@dataclass(frozen=True)
class SweepReport:
    """The points of a sweep (one Report per load) and the files written."""

    plan: str
    mode: str
    loads: tuple[float, ...]
    points: tuple[Report, ...]
    paths: tuple[Path, ...] = ()

    def curve(self, which: str) -> list[dict[str, Any]]:
        """The predicted or measured curve: per load, tokens/s per user (median) and per GPU
        (output tokens in decode_only, all tokens otherwise)."""
        key = "output_throughput_tok_s" if self.mode == "decode_only" else \
            "total_throughput_tok_s"
        out = []
        for load, report in zip(self.loads, self.points, strict=True):
            row = {r.metric: getattr(r, which) for r in report.rows}
            tpot, tput = row.get("tpot_ms.p50"), row.get(key)
            out.append({"load": load, "meets_slo": True,
                        "tok_s_user_p50": 1000.0 / tpot if tpot else None,
                        "throughput_tok_s_gpu": tput / report.gpus if tput else None})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan, "mode": self.mode, "loads": list(self.loads),
                "predicted": self.curve("predicted"), "measured": self.curve("measured"),
                "points": [{"load": load, "comparison": [
                    {"metric": r.metric, "predicted": r.predicted, "measured": r.measured,
                     "rel_error": r.rel_error} for r in p.rows]}
                    for load, p in zip(self.loads, self.points, strict=True)]}

    def metrics(self) -> list[str]:
        return [m for m in CURVE_METRICS if all(any(r.metric == m for r in p.rows)
                                                for p in self.points)]

    def table(self) -> str:
        """Per load and metric: predicted, measured, error (plain text)."""
        head = ["load", *(f"{m} pred/meas (err)" for m in self.metrics())]
        rows = [head]
        for load, p in zip(self.loads, self.points, strict=True):
            cells = [f"{load:g}"]
            for m in self.metrics():
                r = p.row(m)
                cells.append(f"{_n(r.predicted)}/{_n(r.measured)} ({_e(r)})")
            rows.append(cells)
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True))
                         for r in rows)

    def to_markdown(self) -> str:
        lines = [f"# Sweep, predicted vs measured: {self.plan}", "",
                 f"- mode: {self.mode}; loads: {', '.join(f'{x:g}' for x in self.loads)}", "",
                 "| load | " + " | ".join(self.metrics()) + " |",
                 "|---:|" + "---:|" * len(self.metrics())]
        for load, p in zip(self.loads, self.points, strict=True):
            cells = [f"{_n(p.row(m).predicted)} / {_n(p.row(m).measured)} ({_e(p.row(m))})"
                     for m in self.metrics()]
            lines.append(f"| {load:g} | " + " | ".join(cells) + " |")
        lines += ["", "Each cell: predicted / measured (relative error)."]
        return "\n".join(lines) + "\n"


def _n(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def _e(r: Comparison) -> str:
    return "n/a" if r.rel_error is None else f"{r.rel_error:+.1%}"


def bench_points(plan_path: str | Path, run_dir: str | Path, loads: Sequence[float], *,
                 mode: str = "serve", url: str | None = None, context: int | None = None,
                 num_prompts: int | None = None, model: str | None = None,
                 base_port: int | None = None, vllm: str | Path | None = None,
                 ready_timeout_s: float = 1800.0, timeout_s: float | None = None,
                 repredict: bool = False, repeats: int = 1) -> SweepReport:
    """One benchmark per load, each beside the simulator's prediction at that load; see the
    module. serve mode needs `url`; an isolated mode needs `context` and deploys the role on
    this machine, serving `model` (a model folder). `repeats`: runs of each load, compared by
    their median."""
    if not 1 <= repeats <= MAX_REPEATS:
        raise SpecError(f"repeats={repeats} must be between 1 and {MAX_REPEATS}")
    plan_path, run_dir = Path(plan_path), Path(run_dir)
    exe = Path(vllm) if vllm is not None else default_vllm()
    if not exe.exists():
        raise BenchError(f"the engine executable {exe} does not exist; run `make engine`")
    if mode == "serve":
        if url is None:
            raise SpecError("a serve-mode bench needs the deployment's --url")
        return _serve_points(plan_path, run_dir, loads, url, num_prompts, exe, timeout_s,
                             repredict, repeats)
    if context is None or context < 1:
        raise SpecError(f"--mode {mode} needs --context TOKENS (>= 1): the prompt, and in "
                        "decode_only the KV each request starts with")
    if model is None:
        raise SpecError(f"--mode {mode} needs the model folder the engine serves")
    return _alone_points(plan_path, run_dir, loads, mode, context, num_prompts, model,
                         base_port, exe, ready_timeout_s, timeout_s, repeats)


def _serve_points(plan_path: Path, run_dir: Path, loads: Sequence[float], url: str,
                  num_prompts: int | None, exe: Path, timeout_s: float | None,
                  repredict: bool, repeats: int) -> SweepReport:
    from planner.evaluate import calibration_for, sim_options
    from planner.load import at_load
    from simulator.des import simulate

    deployment, workload, _ = load_prediction(plan_path, repredict=False)
    del repredict  # every point is simulated now: the plan holds one load's prediction
    url = url.rstrip("/")
    model = served_model(url)
    cores = local_client_cores(deployment, url)
    points = []
    for i, load in enumerate(loads):
        traffic = own_prompts(at_load(workload, load), i)
        predicted = simulate(deployment, traffic, calibration=calibration_for(deployment),
                             options=sim_options(deployment)).metrics()
        points.append(_point(plan_path, run_dir, load, traffic, predicted, url, model, exe,
                             deployment.gpus_used, num_prompts, timeout_s, mode="serve",
                             cores=cores, repeats=repeats))
    return _write_sweep(SweepReport(str(plan_path), "serve", tuple(loads), tuple(points)),
                        run_dir)


def _alone_points(plan_path: Path, run_dir: Path, loads: Sequence[float], mode_name: str,
                  context: int, num_prompts: int | None, model: str, base_port: int | None,
                  exe: Path, ready_timeout_s: float, timeout_s: float | None,
                  repeats: int) -> SweepReport:
    from planner.plan import load_plan_or_deployment

    mode = mode_for(mode_name)
    deployment, workload = load_plan_or_deployment(plan_path)
    workload = workload or Workload()
    if any(load != int(load) for load in loads):
        raise SpecError(f"--mode {mode_name} runs closed loops: its loads are whole numbers of "
                        f"users, not {', '.join(f'{x:g}' for x in loads)}")
    alone = [predict_alone(deployment, own_prompts(workload, i), mode, context, int(c),
                           num_prompts) for i, c in enumerate(loads)]
    longest = context + max(_longest(a.workload) for a in alone) + 1
    backend = launch_alone(alone[0], model, run_dir / "deploy", base_port=base_port,
                           vllm=exe, ready_timeout_s=ready_timeout_s, room=longest)
    try:
        heads = backend.rendered.router.get("aggregated_urls")
        # one instance: benched directly, as vLLM's isolated benches are (no router hop, one
        # process less on the machine); several: through the router, least requests first
        url = str(heads[0]) if isinstance(heads, list) and len(heads) == 1 else backend.url
        served = served_model(url)
        cores = local_client_cores(deployment, url)
        points = [_point(plan_path, run_dir, load, serve_workload(a.workload), a.predicted,
                         url, served, exe, a.deployment.gpus_used, num_prompts,
                         timeout_s, mode=mode.name, keep=mode.metrics, cores=cores,
                         repeats=repeats)
                  for load, a in zip(loads, alone, strict=True)]
    finally:
        backend.teardown()
    return _write_sweep(SweepReport(str(plan_path), mode_name, tuple(loads), tuple(points)),
                        run_dir)


def own_prompts(workload: Workload, index: int) -> Workload:
    """The workload of a sweep's `index`-th load, with prompts of its own (seed + index): the
    loads run one after another on one deployment, whose prefix cache holds the prompts an
    earlier load sent, which the prediction of this load does not count as hits."""
    return workload if index == 0 else workload.model_copy(
        update={"seed": workload.seed + index})


def _longest(workload: Workload) -> int:
    spec = workload.output_tokens
    for attr in ("value", "high"):
        if isinstance(getattr(spec, attr, None), int):
            return int(getattr(spec, attr))
    return round(getattr(spec, "mean", 1) * 4)


def _point(plan_path: Path, run_dir: Path, load: float, traffic: Workload,
           predicted: dict[str, Any], url: str, model: str, exe: Path, gpus: int,
           num_prompts: int | None, timeout_s: float | None, mode: str,
           keep: tuple[str, ...] | None = None,
           cores: tuple[int, ...] | None = None, repeats: int = 1) -> Report:
    settings = bench_settings(traffic, num_prompts)
    folder = run_dir / f"load-{load:g}"
    runs = [  # each run with prompts of its own (its seed, its file): a prompt sent again
        # would hit the prefix cache
        measure(replace(settings, seed=settings.seed + REPEAT_SEEDS * k), url, model,
                folder if repeats == 1 else folder / f"run-{k + 1}", exe, timeout_s=timeout_s,
                cores=cores)
        for k in range(repeats)]
    command, _, settings = runs[0]  # the report's settings and command: the first run's
    results = [got for _, got, _ in runs]
    result = results[0] if repeats == 1 else median_result(results)
    rows = compare(predicted, result, gpus)
    if keep is not None:
        rows = tuple(r for r in rows if r.metric in keep)
    return _write_report(Report(plan=str(plan_path), url=url, gpus=gpus, settings=settings,
                                command=tuple(command), rows=rows, measured=_summary(result),
                                mode=mode),
                         folder)


def _write_sweep(report: SweepReport, run_dir: Path) -> SweepReport:
    paths = (write_atomic(run_dir / "sweep.json", json.dumps(report.to_dict(), indent=2) + "\n"),
             write_atomic(run_dir / "sweep.md", report.to_markdown()))
    return replace(report, paths=paths)


def write_plot(report: SweepReport, path: str | Path) -> Path:
    """The predicted and measured curves as a chart (planner/chart.py)."""
    from planner.chart import write_chart

    curves = [{"label": f"{which} ({report.mode})",
               "points": [p for p in report.curve(which)
                          if p["tok_s_user_p50"] is not None
                          and p["throughput_tok_s_gpu"] is not None]}
              for which in ("predicted", "measured")]
    return write_chart(path, curves, [], title=f"{Path(report.plan).name}: predicted vs "
                                               "measured across load", load_unit="users")
