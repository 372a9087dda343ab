"""`rackplan calibrate --from-run RUN_DIR --out DIR`: serving latencies fitted from a bench run.

A measured TTFT and TPOT hold more than the kernels a calibration folder times: a fixed cost per
engine step (scheduling, launches), the API server's, and for P/D the handoff between prefill
and decode (simulator/calibration/serving.py). This fits them from any `rackplan bench --out
RUN_DIR` run in serve mode (its report.json, or a sweep's load-*/report.json, of which the
two lowest concurrencies are used: queueing is least there):
- the step overhead (`fit_step`): what the kernels leave of the measured median TPOT (measured
  minus the simulated TPOT without any overhead) is a fixed part plus a part per request the
  step runs; one run fits the fixed part alone, two runs at different loads both. The part per
  request is the serving stack's work for each running request (output processing, and the
  streaming of an API server that shares the engine's core, as on a small CPU host);
- an aggregated plan: then the API overhead, the measured median TTFT minus the simulated one
  with that step overhead (`fit_overheads`);
- a P/D plan: its own step overhead as above (the decode engine's, which may differ from an
  aggregated one's), the API overhead of DIR's aggregated fit when it has one (else none), and
  the handoff, what is left of the TTFT (`fit_handoff`); written to the entry's
  `disaggregated` part, which P/D plans read.
All are floored at 0. The simulation uses DIR's kernel tables when DIR holds any (as `rackplan
simulate --calibration DIR` would), and the traffic the run sent (its settings). The result goes
to DIR/serving_overhead.json for the plan's hardware and engine, where `rackplan simulate
--calibration DIR` reads it. benchmarks/closed_loop.py fits with the same functions.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.calibration.serving import ServingOverhead
from simulator.specs.errors import SpecError

if TYPE_CHECKING:
    from simulator.specs.workload import Workload

Simulate = Callable[[ServingOverhead], dict[str, Any]]
"""The run's traffic simulated with these serving latencies -> `simulate --json` metrics."""
REPORT = "report.json"
SERIAL_STEPS = 20
"""Bisections of the API server's serial time (to 1e-6 of the API overhead)."""


def _tpot(metrics: dict[str, Any]) -> float:
    return float(metrics["tpot_ms"]["p50"])


def _ttft(metrics: dict[str, Any]) -> float:
    return float(metrics["ttft_ms"]["p50"])


def fit_step(runs: Sequence[tuple[float, Simulate]]) -> dict[str, float]:
    """The step overhead from runs at different loads, each (measured TPOT, the simulation of
    its traffic). What the kernels leave of each TPOT (measured minus simulated without any
    overhead) is fixed + per request x the requests a step runs (as the simulation runs them:
    how much its TPOT grows with 1 ms per request). One run fits the fixed part alone; more
    fit both by least squares, the per-request part floored at 0, then the fixed part."""
    for tpot, _ in runs:
        _check_ms("TPOT", tpot)
    bare = ServingOverhead(step_overhead_ms=0.0)
    kernels = [_tpot(sim(bare)) for _, sim in runs]
    left = [tpot - k for (tpot, _), k in zip(runs, kernels, strict=True)]
    per_request = 0.0
    if len(runs) > 1:
        one = replace(bare, step_overhead_per_seq_ms=1.0)
        weights = [_tpot(sim(one)) - k for (_, sim), k in zip(runs, kernels, strict=True)]
        w_mean, l_mean = sum(weights) / len(weights), sum(left) / len(left)
        spread = sum((w - w_mean) ** 2 for w in weights)
        if spread > 1e-9:
            per_request = max(0.0, sum((w - w_mean) * (x - l_mean)
                                       for w, x in zip(weights, left, strict=True)) / spread)
        fixed = max(0.0, l_mean - per_request * w_mean)
    else:
        fixed = max(0.0, left[0])
    return {"step_overhead_ms": fixed, "step_overhead_per_seq_ms": per_request,
            "kernel_tpot_ms": kernels[0]}


def fit_overheads(engine_tpot_ms: float, ttft_p50_ms: float, simulate: Simulate,
                  more: Sequence[tuple[float, Simulate]] = (),
                  busy: tuple[float, Simulate] | None = None) -> dict[str, float]:
    """Step and API overhead from a low-concurrency run (and `more` runs at other loads,
    each (TPOT, simulation)): the step overhead by `fit_step`, then the measured TTFT p50
    minus the simulated one with that step overhead. Floored at 0. `busy`: (TTFT p50, its
    simulation) of a run where requests arrive together, which fits the API server's serial
    part of that overhead (`fit_api_serial`)."""
    _check_ms("TTFT p50", ttft_p50_ms)
    step = fit_step([(engine_tpot_ms, simulate), *more])
    latencies = ServingOverhead(step_overhead_ms=step["step_overhead_ms"],
                                step_overhead_per_seq_ms=step["step_overhead_per_seq_ms"])
    engine_ttft = _ttft(simulate(latencies))
    api = max(0.0, ttft_p50_ms - engine_ttft)
    out = {**step, "api_overhead_ms": api, "simulated_ttft_ms": engine_ttft}
    if busy is not None:
        out["api_serial_ms"] = fit_api_serial(busy[0], busy[1],
                                              replace(latencies, api_overhead_ms=api))
    return out


def fit_api_serial(ttft_p50_ms: float, simulate: Simulate, latencies: ServingOverhead) -> float:
    """How much of the API overhead the API server spends on each request one at a time: the
    share at which the simulated TTFT p50 of a run whose requests arrive together meets the
    measured one (bisection; 0 when even a pure delay over-predicts it, all of it when even
    fully serial work under-predicts it). Serial time moves the TTFT of requests that wait for
    each other, not of a lone one, so the API overhead fitted at one user stands."""
    _check_ms("TTFT p50", ttft_p50_ms)
    api = latencies.api_overhead_ms

    def ttft(serial: float) -> float:
        return _ttft(simulate(replace(latencies, api_serial_ms=serial)))

    if api <= 0 or ttft(0.0) >= ttft_p50_ms:
        return 0.0
    if ttft(api) <= ttft_p50_ms:
        return api
    lo, hi = 0.0, api
    for _ in range(SERIAL_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ttft(mid) < ttft_p50_ms else (lo, mid)
    return (lo + hi) / 2


def fit_handoff(ttft_p50_ms: float, latencies: ServingOverhead, simulate: Simulate) -> float:
    """The P/D handoff from a low-concurrency P/D run: measured TTFT p50 minus the simulated
    one with the other latencies and no handoff, floored at 0."""
    _check_ms("TTFT p50", ttft_p50_ms)
    return max(0.0, ttft_p50_ms - _ttft(simulate(replace(latencies, handoff_ms=0.0))))


FitRun = tuple[float, float, Simulate]
"""One load's fitting runs: (measured TPOT, measured TTFT p50, the simulation of its traffic)."""


def fit_serving(runs: Sequence[FitRun], disaggregated: bool,
                api: ServingOverhead | None = None
                ) -> tuple[dict[str, float], dict[str, float | None]]:
    """The serving latencies from runs at one load or more, the lowest first: (what was
    fitted, the latencies to write). Aggregated: `fit_overheads`, the API server's serial part
    from the highest load when there are two. P/D: its own step overhead (`fit_step`), the API
    latencies of `api` (an aggregated fit; None: none), and the handoff at the lowest load."""
    (tpot, ttft, sim), rest = runs[0], runs[1:]
    more = [(t, s) for t, _, s in rest]
    if not disaggregated:
        busy = (rest[-1][1], rest[-1][2]) if rest else None
        got = fit_overheads(tpot, ttft, sim, more, busy)
        latencies: dict[str, float | None] = {k: got.get(k, 0.0) for k in (
            "step_overhead_ms", "step_overhead_per_seq_ms", "api_overhead_ms", "api_serial_ms")}
        latencies["handoff_ms"] = None  # a handoff fitted before belongs to older latencies
        return got, latencies
    step = fit_step([(tpot, sim), *more])
    base = api or ServingOverhead()
    pd = ServingOverhead(api_overhead_ms=base.api_overhead_ms, api_serial_ms=base.api_serial_ms,
                         step_overhead_ms=step["step_overhead_ms"],
                         step_overhead_per_seq_ms=step["step_overhead_per_seq_ms"])
    handoff = fit_handoff(ttft, pd, sim)
    return ({**step, "api_overhead_ms": pd.api_overhead_ms, "handoff_ms": handoff},
            {"step_overhead_ms": pd.step_overhead_ms,
             "step_overhead_per_seq_ms": pd.step_overhead_per_seq_ms, "handoff_ms": handoff})


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

    run_dir, out = Path(run_dir), Path(out)
    reports = sorted(run_reports(run_dir),
                     key=lambda r: r[1]["settings"].get("max_concurrency") or 1e9)
    path, report = reports[0]
    s = report["settings"]
    plan = Path(str(report.get("plan", "")))
    if not plan.is_file():
        raise SpecError(f"{path} names the plan {str(plan)!r}, which is not a file here; run "
                        "the fit where the plan is")
    deployment, _ = load_plan_or_deployment(plan)
    out.mkdir(parents=True, exist_ok=True)
    hardware, engine = load_hardware(deployment.hardware).name, deployment.engine

    def sim_of(settings: dict[str, Any]) -> Simulate:
        workload = _workload(settings)

        def sim(latencies: ServingOverhead) -> dict[str, Any]:
            with _tables_of(out):
                from planner.evaluate import calibration_for

                return simulate(deployment, workload, calibration=calibration_for(deployment),
                                options=SimOptions.serving(latencies)).metrics()
        return sim

    # the next closed-loop load, if any, fits the per-request part of the step overhead and
    # the API server's serial part
    used = [(path, report)] + [
        (p, r) for p, r in reports[1:2] if r["settings"].get("max_concurrency")
        and s.get("max_concurrency") and r["settings"]["max_concurrency"] != s["max_concurrency"]]
    runs = [(_measured(r, "tpot_ms.p50", p), _measured(r, "ttft_ms.p50", p),
             sim_of(r["settings"])) for p, r in used]
    fitted: dict[str, Any] = {"run": str(path), "plan": str(plan),
                              "concurrency": s.get("max_concurrency"),
                              "measured_tpot_ms": runs[0][0], "measured_ttft_ms": runs[0][1]}
    if len(used) > 1:
        fitted.update(second_run=str(used[1][0]),
                      second_concurrency=used[1][1]["settings"]["max_concurrency"],
                      second_tpot_ms=runs[1][0], second_ttft_ms=runs[1][1])
    known = None
    if deployment.disaggregated:  # the API latencies of an aggregated fit, when there is one
        known = user_serving_overhead(out, hardware, engine, False) if out.is_dir() else None
        fitted["api_from"] = ("the folder's aggregated fit" if known is not None else
                              "nothing: no aggregated fit in the folder, no API overhead")
    got, latencies = fit_serving(runs, deployment.disaggregated, known)
    fitted.update(got)
    about = {"fitted": datetime.now(UTC).date().isoformat(),
             "command": f"rackplan calibrate --from-run {run_dir}",
             "rule": RULE}
    fitted["file"] = str(write_user_serving_overhead(out, hardware, engine, latencies, about,
                                                     disaggregated=deployment.disaggregated))
    return fitted


RULE = ("the two lowest-concurrency serve-mode runs: measured TPOT p50 - simulated kernels = "
        "fixed + per request x requests a step runs (one run: fixed only); api = TTFT p50 - "
        "simulated at the lowest load, its serial part from the TTFT p50 at the other "
        "(aggregated); P/D: its own step overhead, the aggregated API latencies, handoff = "
        "TTFT p50 - simulated")


def _workload(s: dict[str, Any]) -> Workload:
    """The traffic a bench run sent, from its settings."""
    from simulator.specs.workload import Workload

    arrival = ({"kind": "closed", "concurrency": int(s["max_concurrency"])}
               if s.get("max_concurrency") else {"kind": "poisson", "rate": s["request_rate"]})
    total_in = int(s["input_len"]) + int(s.get("prefix_len") or 0)
    return Workload.model_validate({
        "arrival": arrival, "requests": int(s["num_prompts"]), "seed": int(s.get("seed", 0)),
        "input_tokens": {"kind": "fixed", "value": total_in},
        "output_tokens": {"kind": "fixed", "value": int(s["output_len"])},
        "prefix_hit_rate": int(s.get("prefix_len") or 0) / total_in})
