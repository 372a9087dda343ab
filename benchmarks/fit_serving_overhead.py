"""Fit the serving stack's fixed latencies (simulator/calibration/serving.py) per engine.

On the measured rows of the fitting half, in three passes, each a median line (Theil-Sen: the
median of the pairwise slopes, floored at 0, then the median intercept) of (measured - simulated):
- TPOT against the requests a decoding rank runs, over all rows: the per-step overhead (the
  cost model's default plus the intercept) and the overhead per request of the step (the slope);
- TTFT against the mean prompt length, over the aggregated rows at concurrency <= 8 with those:
  the API overhead, a fixed part and a part per 1,000 prompt tokens;
- the P/D handoff: the median TTFT residual over the P/D rows at concurrency <= 8 once all
  are in.
Latencies are floored at 0. Writes simulator/calibration/data/serving_overhead.json (temp
file, then rename).

    .venv/bin/python benchmarks/fit_serving_overhead.py [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from datetime import date
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.calibration.serving import FIT_MAX_CONCURRENCY, ServingOverhead, in_fit_half
from simulator.cost.step import STEP_OVERHEAD_MS
from simulator.specs.errors import SpecError
from simulator.validate import case_from_row, client_lengths, load_rows, simulate_with

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


def prompt_ktokens(row: Mapping[str, Any]) -> float:
    """The mean prompt of a row's replayed client, in thousands of tokens."""
    lengths = client_lengths(int(row["isl"]))
    return (lengths["low"] + lengths["high"]) / 2 / 1e3


def median_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Theil-Sen: (intercept, slope) with the slope the median of the slopes between every two
    points of different x (0 when all x are equal) floored at 0, the intercept the median of
    y - slope * x. Robust to the rows a stray measurement puts far off the line."""
    i, j = np.triu_indices(len(x), 1)
    dx = x[j] - x[i]
    apart = dx != 0
    slope = float(np.median((y[j] - y[i])[apart] / dx[apart])) if apart.any() else 0.0
    slope = max(slope, 0.0)
    return float(np.median(y - slope * x)), slope


def requests_per_rank(row: pd.Series) -> float:
    """The requests a decoding rank of the row's deployment runs (its clients spread over the
    decode or aggregated ranks, at most max_num_seqs); NaN when the row is not covered."""
    try:
        roles = case_from_row(row).deployment.roles
    except SpecError:
        return float("nan")
    spec = roles.get("decode") or roles["aggregated"]
    ranks = spec.instances * (spec.dep or 1)
    return min(float(row.concurrency) / ranks, float(spec.max_num_seqs))


def lines(rows: pd.DataFrame, overheads: dict[str, ServingOverhead], metric: str,
          x: np.ndarray, workers: int) -> dict[str, tuple[float, float, int]]:
    """Per engine: the median line of (measured - simulated) `metric` against `x`, as
    (intercept ms, slope, rows)."""
    res = _residuals(rows, overheads, metric, workers)
    out = {}
    for engine in sorted(rows.backend.unique()):
        ok = (rows.backend == engine).to_numpy() & ~np.isnan(res) & ~np.isnan(x)
        if ok.any():
            out[engine] = (*median_line(x[ok], res[ok]), int(ok.sum()))
    return out


def _residuals(rows: pd.DataFrame, overheads: dict[str, ServingOverhead], metric: str,
               workers: int) -> np.ndarray:
    items = [(row, overheads.get(row.backend, ServingOverhead()), metric)
             for _, row in rows.iterrows()]
    start, res_list = time.monotonic(), []
    with ProcessPoolExecutor(workers) as pool:
        for i, r in enumerate(pool.map(residual, items, chunksize=2), 1):
            res_list.append(r)
            if i % 50 == 0 or i == len(items):  # progress, also when stderr is not a terminal
                print(f"  {metric}: {i}/{len(items)} rows ({time.monotonic() - start:.0f} s)",
                      file=sys.stderr, flush=True)
    return np.array(res_list)


def median_residuals(rows: pd.DataFrame, overheads: dict[str, ServingOverhead], metric: str,
                     workers: int) -> dict[str, tuple[float, int]]:
    res = _residuals(rows, overheads, metric, workers)
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
    rows = rows[rows.id.map(in_fit_half)]
    per_rank = rows.apply(requests_per_rank, axis=1).to_numpy(dtype=float)
    tpot = lines(rows, {}, "tpot", per_rank, args.workers)
    base = {e: ServingOverhead(step_overhead_ms=max(0.0, STEP_OVERHEAD_MS["gpu"] + fixed),
                               step_overhead_per_seq_ms=slope)
            for e, (fixed, slope, _) in tpot.items()}
    low = rows[rows.concurrency <= FIT_MAX_CONCURRENCY]
    agg_rows = low[low["mode"] == "agg"]
    agg = lines(agg_rows, base, "ttft",
                agg_rows.apply(prompt_ktokens, axis=1).to_numpy(dtype=float), args.workers)
    api = {e: replace(base.get(e, ServingOverhead()), api_overhead_ms=max(0.0, fixed),
                      api_per_ktoken_ms=slope) for e, (fixed, slope, _) in agg.items()}
    pd_ = median_residuals(low[low["mode"] == "disagg"], api, "ttft", args.workers)
    engines = {}
    for e in sorted(set(agg) | set(pd_) | set(base)):
        o = api.get(e, base.get(e, ServingOverhead()))
        engines[e] = {"step_overhead_ms": round(o.step_overhead_ms or STEP_OVERHEAD_MS["gpu"],
                                                2),
                      "step_overhead_per_seq_ms": round(o.step_overhead_per_seq_ms, 4),
                      "api_overhead_ms": round(o.api_overhead_ms, 1),
                      "api_per_ktoken_ms": round(o.api_per_ktoken_ms, 2),
                      "handoff_ms": round(pd_.get(e, (0.0, 0))[0], 1),
                      "rows": {"tpot": tpot.get(e, (0, 0, 0))[2], "agg": agg.get(e, (0, 0, 0))[2],
                               "disagg": pd_.get(e, (0, 0))[1]}}
    doc = {"fitted": str(date.today()), "aiconfigurator_core": version("aiconfigurator-core"),
           "rule": "Theil-Sen lines of the residuals on the fitting half: TPOT against requests "
                   "per rank (all rows), TTFT against the prompt (aggregated rows at "
                   f"concurrency <= {FIT_MAX_CONCURRENCY}); the P/D handoff the median TTFT "
                   "residual there",
           "command": "benchmarks/fit_serving_overhead.py", "engines": engines}
    fd, tmp = tempfile.mkstemp(dir=OUT.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, OUT)
    print(json.dumps(engines, indent=2))


if __name__ == "__main__":
    main()
