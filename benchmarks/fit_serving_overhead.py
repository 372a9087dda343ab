"""Fit the serving stack's fixed latencies (simulator/calibration/serving.py) per engine.

On the measured rows of the fitting half at concurrency <= 8, in three passes: the per-step
overhead is the cost model's default plus the median of (measured - simulated) TPOT over all
rows; the API overhead is the median of (measured - simulated) TTFT over aggregated rows with that
step overhead; the P/D handoff is the same median over P/D rows once both are in. All are floored
at 0. Writes
simulator/calibration/data/serving_overhead.json (temp file, then rename).

    .venv/bin/python benchmarks/fit_serving_overhead.py [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.calibration.serving import FIT_MAX_CONCURRENCY, ServingOverhead, in_fit_half
from simulator.cost.step import STEP_OVERHEAD_MS
from simulator.specs.errors import SpecError
from simulator.validate import case_from_row, load_rows, simulate_with

OUT = Path(__file__).resolve().parents[1] / "simulator/calibration/data/serving_overhead.json"


def residual(args: tuple[pd.Series, ServingOverhead, str]) -> float:
    """Measured minus simulated TTFT or TPOT (ms) of one row; NaN when it is not covered."""
    row, overhead, metric = args
    try:
        case = case_from_row(row)
        pred = simulate_with(case.deployment, case.workload, overhead)[f"{metric}_ms"]["mean"]
    except SpecError:
        return float("nan")
    return float(row[f"silicon_{metric}_ms"]) - float(pred)


def median_residuals(rows: pd.DataFrame, overheads: dict[str, ServingOverhead], metric: str,
                     workers: int) -> dict[str, tuple[float, int]]:
    items = [(row, overheads.get(row.backend, ServingOverhead()), metric)
             for _, row in rows.iterrows()]
    start, res_list = time.monotonic(), []
    with ProcessPoolExecutor(workers) as pool:
        for i, r in enumerate(pool.map(residual, items, chunksize=2), 1):
            res_list.append(r)
            if i % 50 == 0 or i == len(items):  # progress, also when stderr is not a terminal
                print(f"  {metric}: {i}/{len(items)} rows ({time.monotonic() - start:.0f} s)",
                      file=sys.stderr, flush=True)
    res = np.array(res_list)
    out = {}
    for engine in sorted(rows.backend.unique()):
        r = res[(rows.backend == engine).to_numpy() & ~np.isnan(res)]
        if len(r):
            out[engine] = (float(np.median(r)) if metric == "tpot" else
                           max(0.0, float(np.median(r))), len(r))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    rows = load_rows()
    rows = rows[rows.id.map(in_fit_half) & (rows.concurrency <= FIT_MAX_CONCURRENCY)]
    tpot = median_residuals(rows, {}, "tpot", args.workers)
    step = {e: max(0.0, STEP_OVERHEAD_MS["gpu"] + v) for e, (v, _) in tpot.items()}
    base = {e: ServingOverhead(step_overhead_ms=v) for e, v in step.items()}
    agg = median_residuals(rows[rows["mode"] == "agg"], base, "ttft", args.workers)
    api = {e: ServingOverhead(api_overhead_ms=agg.get(e, (0.0, 0))[0],
                              step_overhead_ms=step.get(e)) for e in set(step) | set(agg)}
    pd_ = median_residuals(rows[rows["mode"] == "disagg"], api, "ttft", args.workers)
    engines = {}
    for e in sorted(set(agg) | set(pd_) | set(step)):
        engines[e] = {"step_overhead_ms": round(step.get(e, STEP_OVERHEAD_MS["gpu"]), 2),
                      "api_overhead_ms": round(agg.get(e, (0.0, 0))[0], 1),
                      "handoff_ms": round(pd_.get(e, (0.0, 0))[0], 1),
                      "rows": {"tpot": tpot.get(e, (0, 0))[1], "agg": agg.get(e, (0, 0))[1],
                               "disagg": pd_.get(e, (0, 0))[1]}}
    doc = {"fitted": str(date.today()), "aiconfigurator_core": version("aiconfigurator-core"),
           "rule": f"median TTFT residual, fitting half, concurrency <= {FIT_MAX_CONCURRENCY}",
           "command": "benchmarks/fit_serving_overhead.py", "engines": engines}
    fd, tmp = tempfile.mkstemp(dir=OUT.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, OUT)
    print(json.dumps(engines, indent=2))


if __name__ == "__main__":
    main()
