"""`rackplan calibrate --from-run RUN_DIR --out DIR`: serving latencies fitted from a bench run.

A measured TTFT and TPOT hold more than the kernels a calibration folder times: a fixed cost per
engine step (scheduling, launches), the API server's, and for P/D the handoff between prefill
and decode (simulator/calibration/serving.py). This fits them from any `rackplan bench --out
RUN_DIR` run in serve mode (its report.json, or a sweep's load-*/report.json, of which the
lowest concurrency is used: queueing is least there):
- an aggregated plan: the step overhead is the measured median TPOT minus the simulated TPOT
  without any overhead (the kernels alone), the API overhead the measured median TTFT minus the
  simulated one with that step overhead (`fit_overheads`);
- a P/D plan: the step and API overheads of DIR's serving_overhead.json when it has them (fit an
  aggregated run first), else the step overhead from the TPOT as above and no API overhead; the
  handoff is what is left of the TTFT (`fit_handoff`).
All are floored at 0. The simulation uses DIR's kernel tables when DIR holds any (as `rackplan
simulate --calibration DIR` would), and the traffic the run sent (its settings). The result goes
to DIR/serving_overhead.json for the plan's hardware and engine, where `rackplan simulate
--calibration DIR` reads it. benchmarks/closed_loop.py fits with the same two functions.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from simulator.specs.errors import SpecError

Simulate = Callable[[float, float, float], dict[str, Any]]
"""(step overhead, API overhead, handoff) in ms -> `simulate --json` metrics of the run's
traffic."""
REPORT = "report.json"


def fit_overheads(engine_tpot_ms: float, ttft_p50_ms: float,
                  simulate: Simulate) -> dict[str, float]:
    """Step and API overhead from a low-concurrency run: the measured TPOT minus the simulated
    TPOT without any overhead (the calibrated kernels alone), then the measured TTFT p50 minus
    the simulated one with that step overhead. Both floored at 0."""
    _check_ms("TPOT", engine_tpot_ms)
    _check_ms("TTFT p50", ttft_p50_ms)
    kernels = float(simulate(0.0, 0.0, 0.0)["tpot_ms"]["p50"])
    step = max(0.0, engine_tpot_ms - kernels)
    engine_ttft = float(simulate(step, 0.0, 0.0)["ttft_ms"]["p50"])
    return {"step_overhead_ms": step, "api_overhead_ms": max(0.0, ttft_p50_ms - engine_ttft),
            "kernel_tpot_ms": kernels, "simulated_ttft_ms": engine_ttft}


def fit_handoff(ttft_p50_ms: float, step_ms: float, api_ms: float, simulate: Simulate) -> float:
    """The P/D handoff from a low-concurrency P/D run: measured TTFT p50 minus the simulated
    one with the step and API overheads and no handoff, floored at 0."""
    _check_ms("TTFT p50", ttft_p50_ms)
    return max(0.0, ttft_p50_ms - float(simulate(step_ms, api_ms, 0.0)["ttft_ms"]["p50"]))


def _check_ms(what: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise SpecError(f"the measured {what} is {value!r}; the fit needs a finite number "
                        "of ms >= 0")


def run_reports(run_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The serve-mode reports of a bench run folder (its own report.json, else each load's of
    a sweep); SpecError naming the folder when it holds none."""
    paths = [run_dir / REPORT] if (run_dir / REPORT).is_file() else sorted(
        run_dir.glob(f"load-*/{REPORT}"))
    if not paths:
        raise SpecError(f"--from-run {str(run_dir)!r} holds no {REPORT}: give the --out folder "
                        "of a `rackplan bench` run")
    out = []
    for path in paths:
        try:
            report = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise SpecError(f"{path} cannot be read as a bench report ({e})") from None
        if not isinstance(report, dict) or not isinstance(report.get("settings"), dict):
            raise SpecError(f"{path} has no benchmark settings: it is not a report `rackplan "
                            "bench` wrote of a run it made")
        if report.get("mode", "serve") != "serve":
            raise SpecError(f"{path} is a {report['mode']} bench; the serving latencies are "
                            "fitted from an end-to-end (serve mode) run")
        out.append((path, report))
    return out


def _measured(report: dict[str, Any], metric: str, path: Path) -> float:
    for row in report.get("comparison", []):
        if isinstance(row, dict) and row.get("metric") == metric:
            value = row.get("measured")
            if isinstance(value, int | float) and math.isfinite(value):
                return float(value)
    raise SpecError(f"{path} has no measured {metric}")


@contextlib.contextmanager
def _tables_of(folder: Path) -> Iterator[None]:
    """DIR's kernel tables active while fitting, when it holds any."""
    from simulator.calibration.tables import calibration_dir

    has_tables = folder.is_dir() and any(p.is_dir() for p in folder.iterdir())
    if not has_tables:
        yield
        return
    with calibration_dir(folder):
        yield


def fit_from_run(run_dir: str | Path, out: str | Path) -> dict[str, Any]:
    """Fit the serving latencies from the bench run in `run_dir` and write them into
    `out`/serving_overhead.json; returns what was fitted and from what."""
    from planner.plan import load_plan_or_deployment
    from simulator.calibration.serving import user_serving_overhead, write_user_serving_overhead
    from simulator.des import SimOptions, simulate
    from simulator.specs.hardware import load_hardware
    from simulator.specs.workload import Workload

    run_dir, out = Path(run_dir), Path(out)
    reports = run_reports(run_dir)
    path, report = min(reports, key=lambda r: r[1]["settings"].get("max_concurrency") or 1e9)
    s = report["settings"]
    plan = Path(str(report.get("plan", "")))
    if not plan.is_file():
        raise SpecError(f"{path} names the plan {str(plan)!r}, which is not a file here; run "
                        "the fit where the plan is")
    deployment, _ = load_plan_or_deployment(plan)
    arrival = ({"kind": "closed", "concurrency": int(s["max_concurrency"])}
               if s.get("max_concurrency") else {"kind": "poisson", "rate": s["request_rate"]})
    total_in = int(s["input_len"]) + int(s.get("prefix_len") or 0)
    workload = Workload.model_validate({
        "arrival": arrival, "requests": int(s["num_prompts"]), "seed": int(s.get("seed", 0)),
        "input_tokens": {"kind": "fixed", "value": total_in},
        "output_tokens": {"kind": "fixed", "value": int(s["output_len"])},
        "prefix_hit_rate": int(s.get("prefix_len") or 0) / total_in})
    tpot = _measured(report, "tpot_ms.p50", path)
    ttft = _measured(report, "ttft_ms.p50", path)
    out.mkdir(parents=True, exist_ok=True)
    hardware, engine = load_hardware(deployment.hardware).name, deployment.engine

    def sim(step: float, api: float, handoff: float) -> dict[str, Any]:
        with _tables_of(out):
            from planner.evaluate import calibration_for

            return simulate(deployment, workload, calibration=calibration_for(deployment),
                            options=SimOptions(step_overhead_ms=step, api_overhead_ms=api,
                                               handoff_ms=handoff)).metrics()

    fitted: dict[str, Any] = {"run": str(path), "plan": str(plan),
                              "concurrency": s.get("max_concurrency"),
                              "measured_tpot_ms": tpot, "measured_ttft_ms": ttft}
    latencies: dict[str, float | None]
    if not deployment.disaggregated:
        got = fit_overheads(tpot, ttft, sim)
        fitted.update(got)
        latencies = {"step_overhead_ms": got["step_overhead_ms"],
                     "api_overhead_ms": got["api_overhead_ms"], "handoff_ms": None}
    else:
        known = user_serving_overhead(out, hardware, engine, True) if out.is_dir() else None
        if known is not None and known.step_overhead_ms is not None:
            step, api = known.step_overhead_ms, known.api_overhead_ms
            fitted["from_folder"] = "step and API overheads"
        else:
            step, api = fit_overheads(tpot, ttft, sim)["step_overhead_ms"], 0.0
            fitted["from_folder"] = "nothing: step overhead from this run's TPOT, no API overhead"
        handoff = fit_handoff(ttft, step, api, sim)
        fitted.update(step_overhead_ms=step, api_overhead_ms=api, handoff_ms=handoff)
        latencies = {"step_overhead_ms": step, "api_overhead_ms": api, "handoff_ms": handoff}
    about = {"fitted": datetime.now(UTC).date().isoformat(),
             "command": f"rackplan calibrate --from-run {run_dir}",
             "rule": "lowest-concurrency serve-mode run: step = measured TPOT p50 - simulated "
                     "kernels; api = TTFT p50 - simulated; P/D handoff = TTFT p50 - simulated"}
    fitted["file"] = str(write_user_serving_overhead(out, hardware, engine, latencies, about))
    return fitted
