"""Fit the serving stack's fixed latencies (simulator/calibration/serving.py) per engine.

On the measured rows of the fitting half at concurrency <= 8 (and, for the time per request, its
loaded aggregated rows), in four passes: the per-step
overhead is a time per decoder layer of the model, the median over all rows of the cost model's
default plus (measured - simulated) TPOT, divided by the row's layers (per engine, and per
engine and layer signature, the sorted attention kinds of the model's layers, where that has
at least MIN_SIGNATURE_ROWS rows); then a time per request the busiest rank runs in a step (the
engine's CPU work per request: scheduling, inputs, sampling, output), the Theil-Sen slope of
the TPOT residual against those requests over the fitting half's aggregated rows above 8 users
(up to FIT_MAX_LOADED_CONCURRENCY), and apart from it on its P/D rows (their decode instances'
busiest rank; their steps carry no prompts, where the aggregated rows' slope also stands for the
prompt work of mixed steps): the median slope between every two rows of one deployment at
different loads (P/D rows are few per engine and span deployments whose other errors differ);
the API overhead is the
median line (Theil-Sen: the median of the pairwise slopes, then the median intercept) of
(measured - simulated) TTFT against the mean prompt length over aggregated rows with that step
overhead: a fixed part and a part per 1,000 prompt tokens (the engine's), the fixed part also
per hardware preset where the engine has at least MIN_HARDWARE_ROWS rows on that system (the
median residual there at the engine's slope), and an offset to it per layer signature where the
engine has at least MIN_SIGNATURE_API_ROWS rows of it (the median of what those rows leave
above their fixed part, either sign); the P/D handoff is the median of that residual
over P/D rows once all are in. All but the offsets are floored at 0. Writes
simulator/calibration/data/serving_overhead.json (temp file, then rename).

    .venv/bin/python benchmarks/fit_serving_overhead.py [--workers 2] [--pd]

--pd fits the P/D rows' time per request and handoff alone, on the shipped fit's other
latencies, and updates those entries of the shipped file alone (--pd-per-request, its older
name, does the same).
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
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from simulator.calibration.serving import (
    DISAGGREGATED,
    FIT_MAX_CONCURRENCY,
    FIT_MAX_LOADED_CONCURRENCY,
    HARDWARE_KEY,
    LAYERS_KEY,
    ServingOverhead,
    in_fit_half,
    layer_signature,
)
from simulator.cost.step import STEP_OVERHEAD_MS
from simulator.specs.errors import SpecError
from simulator.specs.model import load_model
from simulator.validate import (
    SYSTEMS,
    case_from_row,
    client_lengths,
    load_rows,
    model_source,
    simulate_with,
)

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


def model_layers(model_path: str) -> float:
    """Decoder layers of a measured row's model (NaN for one the model specs cannot read)."""
    try:
        return float(load_model(model_source(model_path)).layers)
    except SpecError:
        return float("nan")


def model_signature(model_path: str) -> str:
    """The layer signature of a measured row's model ('' for one the model specs cannot
    read)."""
    try:
        return layer_signature(load_model(model_source(model_path)))
    except SpecError:
        return ""


MIN_SIGNATURE_ROWS = 8
"""Rows a layer signature needs on an engine for a per-layer step overhead of its own."""


PerLayer = tuple[dict[str, tuple[float, int]], dict[str, dict[str, tuple[float, int]]]]


def per_layer_steps(rows: pd.DataFrame, workers: int) -> PerLayer:
    """Per engine: the per-step overhead per decoder layer (floored at 0) and its rows; and
    per engine and layer signature with at least MIN_SIGNATURE_ROWS rows, the same over that
    signature's rows."""
    res = _residuals(rows, {}, "tpot", workers)
    layers = rows.model_path.map(model_layers).to_numpy(dtype=float)
    signature = rows.model_path.map(model_signature).to_numpy()
    per = (STEP_OVERHEAD_MS["gpu"] + res) / layers
    out, by_layers = {}, {}
    for engine in sorted(rows.backend.unique()):
        ok = (rows.backend == engine).to_numpy() & ~np.isnan(per)
        if not ok.any():
            continue
        out[engine] = (max(0.0, float(np.median(per[ok]))), int(ok.sum()))
        kinds = {}
        for sig in sorted(set(signature[ok]) - {""}):
            mine = ok & (signature == sig)
            if mine.sum() >= MIN_SIGNATURE_ROWS:
                kinds[sig] = (max(0.0, float(np.median(per[mine]))), int(mine.sum()))
        by_layers[engine] = kinds
    return out, by_layers


DECODING_ROLE = {"agg": "aggregated", "disagg": "decode"}
"""Per row mode: the role whose steps a row's TPOT times."""


def requests_per_rank(row: pd.Series) -> float:
    """Requests the busiest rank of the instances that decode a row's requests (aggregated, or
    a P/D row's decode instances) runs at full load: the concurrency over their DP ranks (NaN
    for a row validate does not cover)."""
    try:
        role = case_from_row(row).deployment.roles[DECODING_ROLE[row["mode"]]]
    except SpecError:
        return float("nan")
    return float(row.concurrency) / ((role.dep or 1) * role.instances)


def per_request_steps(rows: pd.DataFrame, overheads: Overheads, workers: int,
                      layered: Layered) -> dict[str, tuple[float, int]]:
    """Per engine: the step overhead per running request of the busiest rank (ms, floored at
    0) and its rows: the Theil-Sen slope of the TPOT residual against the requests a rank runs,
    over loaded rows of one mode (the fixed and per-layer parts already in)."""
    res = _residuals(rows, overheads, "tpot", workers, layered)
    running = rows.apply(requests_per_rank, axis=1).to_numpy(dtype=float)
    out = {}
    for engine in sorted(rows.backend.unique()):
        ok = (rows.backend == engine).to_numpy() & ~np.isnan(res) & ~np.isnan(running)
        if ok.sum() >= 2:
            _, slope = median_line(running[ok], res[ok])
            out[engine] = (max(0.0, slope), int(ok.sum()))
    return out


DEPLOYMENT_COLUMNS = ("backend", "backend_version", "model_path", "system", "precision", "mode",
                      "isl", "osl", "gemm_quant_mode", "moe_quant_mode", "tp_size", "pp_size",
                      "attention_dp_size", "moe_tp_size", "moe_ep_size", "prefill_num_workers",
                      "prefill_tp_size", "prefill_pp_size", "prefill_attention_dp_size",
                      "prefill_moe_tp_size", "prefill_moe_ep_size", "decode_num_workers",
                      "decode_tp_size", "decode_pp_size", "decode_attention_dp_size",
                      "decode_moe_tp_size", "decode_moe_ep_size")
"""What makes measured rows one deployment measured at several loads (their batch sizes and
concurrency aside)."""


def per_request_within(rows: pd.DataFrame, overheads: Overheads, workers: int,
                       layered: Layered) -> dict[str, tuple[float, int]]:
    """Per engine: the step overhead per running request of the busiest rank (ms, floored at
    0) and the row pairs it is read from: the median, over every two rows of one deployment
    (DEPLOYMENT_COLUMNS) at different loads of at most FIT_MAX_LOADED_CONCURRENCY requests a
    rank, of the slope of the TPOT residual against the requests a rank runs. Pairs within a
    deployment leave out what differs between deployments (a line through rows of several
    would take their other errors for a time per request)."""
    keys = np.array(["|".join(map(str, t))
                     for t in rows[list(DEPLOYMENT_COLUMNS)].itertuples(index=False)])
    res = _residuals(rows, overheads, "tpot", workers, layered)
    running = rows.apply(requests_per_rank, axis=1).to_numpy(dtype=float)
    ok = ~np.isnan(res) & (running <= FIT_MAX_LOADED_CONCURRENCY)  # NaN compares False
    slopes: dict[str, list[np.ndarray]] = {}
    for key in np.unique(keys[ok]):
        at = np.flatnonzero(ok & (keys == key))
        slopes.setdefault(str(rows.backend.iloc[at[0]]), []).append(
            pair_slopes(running[at], res[at]))
    out = {}
    for engine, parts in sorted(slopes.items()):
        every = np.concatenate(parts)
        if len(every):
            out[engine] = (max(0.0, float(np.median(every))), len(every))
    return out


def prompt_ktokens(row: Mapping[str, Any]) -> float:
    """The mean prompt of a row's replayed client, in thousands of tokens."""
    lengths = client_lengths(int(row["isl"]))
    return (lengths["low"] + lengths["high"]) / 2 / 1e3


def pair_slopes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The slopes between every two points of different x."""
    i, j = np.triu_indices(len(x), 1)
    dx = x[j] - x[i]
    apart = dx != 0
    return np.asarray((y[j] - y[i])[apart] / dx[apart], dtype=float)


def median_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Theil-Sen: (intercept, slope) with the slope the median of the slopes between every two
    points of different x, the intercept the median of y - slope * x; slope 0 when all x are
    equal. Robust to the rows a stray measurement puts far off the line."""
    slopes = pair_slopes(x, y)
    slope = float(np.median(slopes)) if len(slopes) else 0.0
    return float(np.median(y - slope * x)), slope


MIN_HARDWARE_ROWS = 10
"""An engine's fixed API overhead is fitted on one system's own rows where it has at least this
many; the others take the engine's."""


MIN_SIGNATURE_API_ROWS = 10
"""Aggregated rows a layer signature needs on an engine for an offset of its own to the fixed
API overhead."""


class ApiFit(NamedTuple):
    """An engine's fitted API overhead."""

    fixed_ms: float
    per_ktoken_ms: float
    rows: int
    on_hardware: dict[str, tuple[float, int]]
    """Per hardware preset with enough rows: its own fixed ms, and its rows."""
    by_layers: dict[str, tuple[float, int]]
    """Per layer signature with enough rows: its offset to the fixed part (ms, either sign),
    and its rows."""


NO_API_FIT = ApiFit(0.0, 0.0, 0, {}, {})


def api_lines(rows: pd.DataFrame, overheads: Overheads, workers: int,
              layered: Layered) -> dict[str, ApiFit]:
    """Per engine: the API overhead's fixed part and part per 1,000 prompt tokens, each floored
    at 0 (with the slope floored, a fixed part is the median residual at that slope); the fixed
    part per hardware preset with enough rows; then per layer signature with enough rows, the
    median of what the rows' residuals leave above their fixed part (hardware's or engine's)."""
    res = _residuals(rows, overheads, "ttft", workers, layered)
    x = rows.apply(prompt_ktokens, axis=1).to_numpy(dtype=float)
    preset = rows.system.map(SYSTEMS).to_numpy()
    signature = rows.model_path.map(model_signature).to_numpy()
    out = {}
    for engine in sorted(rows.backend.unique()):
        ok = (rows.backend == engine).to_numpy() & ~np.isnan(res)
        if not ok.any():
            continue
        _, slope = median_line(x[ok], res[ok])
        slope = max(slope, 0.0)
        left = res - slope * x
        fixed = max(float(np.median(left[ok])), 0.0)
        own = {}
        for hw in sorted(set(preset[ok])):
            on = ok & (preset == hw)
            if on.sum() >= MIN_HARDWARE_ROWS:
                own[hw] = (max(float(np.median(left[on])), 0.0), int(on.sum()))
        row_fixed = np.array([own.get(hw, (fixed, 0))[0] for hw in preset])
        kinds = {}
        for sig in sorted(set(signature[ok]) - {""}):
            mine = ok & (signature == sig)
            if mine.sum() >= MIN_SIGNATURE_API_ROWS:
                kinds[sig] = (float(np.median((left - row_fixed)[mine])), int(mine.sum()))
        out[engine] = ApiFit(fixed, slope, int(ok.sum()), own, kinds)
    return out


Overheads = dict[str | tuple[str, str], ServingOverhead]
"""Per engine, or per (engine, hardware preset) where that has its own."""
Layered = Mapping[tuple[str, str], float]
"""Per (engine, layer signature) that has its own: its per-layer step overhead or API offset."""


def _residuals(rows: pd.DataFrame, overheads: Overheads, metric: str, workers: int,
               layered: Layered | None = None,
               api_offsets: Layered | None = None) -> np.ndarray:
    items = []
    for _, row in rows.iterrows():
        o = overheads.get((row.backend, SYSTEMS.get(row.system, "")),
                          overheads.get(row.backend, ServingOverhead()))
        key = (row.backend, model_signature(row.model_path))
        own = (layered or {}).get(key)
        if own is not None:
            o = replace(o, step_overhead_per_layer_ms=own)
        offset = (api_offsets or {}).get(key)
        if offset is not None:
            o = replace(o, api_overhead_ms=max(0.0, o.api_overhead_ms + offset))
        items.append((row, o, metric))
    start, res_list = time.monotonic(), []
    with ProcessPoolExecutor(workers) as pool:
        for i, r in enumerate(pool.map(residual, items, chunksize=2), 1):
            res_list.append(r)
            if i % 50 == 0 or i == len(items):  # progress, also when stderr is not a terminal
                print(f"  {metric}: {i}/{len(items)} rows ({time.monotonic() - start:.0f} s)",
                      file=sys.stderr, flush=True)
    return np.array(res_list)


def median_residuals(rows: pd.DataFrame, overheads: Overheads, metric: str, workers: int,
                     layered: Layered, api_offsets: Layered) -> dict[str, tuple[float, int]]:
    """Per engine: the median residual of `metric` floored at 0, and its rows."""
    res = _residuals(rows, overheads, metric, workers, layered, api_offsets)
    out = {}
    for engine in sorted(rows.backend.unique()):
        r = res[(rows.backend == engine).to_numpy() & ~np.isnan(res)]
        if len(r):
            out[engine] = (max(0.0, float(np.median(r))), len(r))
    return out


def layer_entries(steps: Mapping[str, tuple[float, int]],
                  api: Mapping[str, tuple[float, int]]) -> dict[str, dict[str, Any]]:
    """An engine's LAYERS_KEY entries: per layer signature its step overhead per layer and its
    API offset, where each was fitted, with their rows."""
    out: dict[str, dict[str, Any]] = {}
    for sig, (v, n) in steps.items():
        out.setdefault(sig, {}).update({"step_overhead_per_layer_ms": round(v, 4), "rows": n})
    for sig, (v, n) in api.items():
        out.setdefault(sig, {}).update({"api_offset_ms": round(v, 1), "api_rows": n})
    return dict(sorted(out.items()))


def pd_entry(fit: tuple[float, int]) -> dict[str, Any]:
    """An engine's DISAGGREGATED entry: the P/D rows' time per request and the row pairs it
    is read from."""
    return {"step_overhead_per_seq_ms": round(fit[0], 4), "pairs": fit[1]}


def shipped_steps(table: Mapping[str, Any]) -> tuple[Overheads, Layered]:
    """The step overheads of a fit as written (per engine, and per engine and layer
    signature), without their time per request."""
    engines = table.get("engines", {})
    base: Overheads = {e: ServingOverhead(step_overhead_ms=0.0,
                                          step_overhead_per_layer_ms=v["step_overhead_per_layer_ms"])
                       for e, v in engines.items() if "step_overhead_per_layer_ms" in v}
    layered = {(e, sig): k["step_overhead_per_layer_ms"] for e, v in engines.items()
               for sig, k in v.get(LAYERS_KEY, {}).items() if "step_overhead_per_layer_ms" in k}
    return base, layered


def write(doc: Mapping[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=OUT.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, OUT)


def shipped_api(table: Mapping[str, Any]) -> tuple[Overheads, Layered]:
    """The aggregated fit as written: per engine (and engine and hardware preset where it has
    its own fixed API part) its step and API latencies, and the API offsets per layer
    signature."""
    base, _ = shipped_steps(table)
    engines = table.get("engines", {})
    api: Overheads = {}
    for e, v in engines.items():
        api[e] = replace(base.get(e, ServingOverhead()),
                         step_overhead_per_seq_ms=v.get("step_overhead_per_seq_ms", 0.0),
                         api_overhead_ms=v.get("api_overhead_ms", 0.0),
                         api_per_ktoken_ms=v.get("api_per_ktoken_ms", 0.0))
        for hw, k in v.get(HARDWARE_KEY, {}).items():
            api[e, hw] = replace(api[e], api_overhead_ms=k["api_overhead_ms"])
    offsets = {(e, sig): k["api_offset_ms"] for e, v in engines.items()
               for sig, k in v.get(LAYERS_KEY, {}).items() if "api_offset_ms" in k}
    return api, offsets


def with_pd_per_request(api: Overheads,
                        pd_seq: Mapping[str, tuple[float, int]]) -> Overheads:
    """`api` with each engine's P/D time per request where the P/D rows gave one."""
    out = dict(api)
    for k, o in api.items():
        engine = k if isinstance(k, str) else k[0]
        if engine in pd_seq:
            out[k] = replace(o, step_overhead_per_seq_ms=pd_seq[engine][0])
    return out


def refit_pd(pd_rows: pd.DataFrame, workers: int) -> None:
    """--pd: the P/D rows' time per request and handoff on the shipped fit's other latencies,
    written into the shipped file's DISAGGREGATED entries and handoffs alone."""
    doc = json.loads(OUT.read_text())
    base, layered = shipped_steps(doc)
    pd_seq = per_request_within(pd_rows, base, workers, layered)
    api, offsets = shipped_api(doc)
    pd_ = median_residuals(pd_rows[pd_rows.concurrency <= FIT_MAX_CONCURRENCY],
                           with_pd_per_request(api, pd_seq), "ttft", workers, layered, offsets)
    for e, entry in doc["engines"].items():
        if e in pd_seq:
            entry[DISAGGREGATED] = pd_entry(pd_seq[e])
        entry["handoff_ms"] = round(pd_.get(e, (0.0, 0))[0], 1)
        entry["rows"]["disagg"] = pd_.get(e, (0, 0))[1]
    doc["command"] = ("benchmarks/fit_serving_overhead.py; the P/D rows' time per request and "
                      "handoff: benchmarks/fit_serving_overhead.py --pd")
    doc["rule"] = doc["rule"].split("; P/D rows")[0] + (
        f"; P/D rows ({date.today()}): per request, the median slope of the TPOT residual "
        f"against the requests of the decode instances' busiest rank between every two of "
        f"the fitting half's P/D rows of one deployment at different loads of at most "
        f"{FIT_MAX_LOADED_CONCURRENCY} requests a rank; the handoff, the median TTFT residual "
        f"of those at concurrency <= {FIT_MAX_CONCURRENCY} with that time per request")
    write(doc)
    print(json.dumps({e: {**pd_entry(pd_seq[e]), "handoff_ms": round(pd_[e][0], 1)}
                      if e in pd_seq and e in pd_ else {} for e in doc["engines"]}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--pd", "--pd-per-request", dest="pd", action="store_true",
                        help="fit the P/D rows' time per request and handoff alone (module "
                             "doc)")
    args = parser.parse_args()
    half = load_rows()
    half = half[half.id.map(in_fit_half)]
    rows = half[half.concurrency <= FIT_MAX_CONCURRENCY]
    loaded = half[(half.concurrency > FIT_MAX_CONCURRENCY)
                  & (half.concurrency <= FIT_MAX_LOADED_CONCURRENCY)]
    pd_rows = half[half["mode"] == "disagg"]  # P/D loads spread over many decode ranks
    if args.pd:
        refit_pd(pd_rows, args.workers)
        return
    tpot, by_layers = per_layer_steps(rows, args.workers)
    step = {e: v for e, (v, _) in tpot.items()}
    layered = {(e, sig): v for e, kinds in by_layers.items() for sig, (v, _) in kinds.items()}
    base: Overheads = {e: ServingOverhead(step_overhead_ms=0.0, step_overhead_per_layer_ms=v)
                       for e, v in step.items()}
    per_seq = per_request_steps(loaded[loaded["mode"] == "agg"], base, args.workers, layered)
    pd_seq = per_request_within(pd_rows, base, args.workers, layered)
    base = {e: replace(o, step_overhead_per_seq_ms=per_seq.get(e, (0.0, 0))[0])
            for e, o in base.items()}
    agg = api_lines(rows[rows["mode"] == "agg"], base, args.workers, layered)
    api: Overheads = {}
    for e in set(step) | set(agg):
        fit = agg.get(e, NO_API_FIT)
        api[e] = replace(base.get(e, ServingOverhead()), api_overhead_ms=fit.fixed_ms,
                         api_per_ktoken_ms=fit.per_ktoken_ms)
        for hw, (hw_fixed, _) in fit.on_hardware.items():
            api[e, hw] = replace(api[e], api_overhead_ms=hw_fixed)
    offsets = {(e, sig): v for e, fit in agg.items() for sig, (v, _) in fit.by_layers.items()}
    pd_ = median_residuals(rows[rows["mode"] == "disagg"], with_pd_per_request(api, pd_seq),
                           "ttft", args.workers, layered, offsets)
    engines = {}
    for e in sorted(set(agg) | set(pd_) | set(step)):
        fit = agg.get(e, NO_API_FIT)
        engines[e] = {**({"step_overhead_ms": 0.0, "step_overhead_per_layer_ms":
                          round(step[e], 4), "step_overhead_per_seq_ms":
                          round(per_seq.get(e, (0.0, 0))[0], 4)} if e in step else {}),
                      "api_overhead_ms": round(fit.fixed_ms, 1),
                      "api_per_ktoken_ms": round(fit.per_ktoken_ms, 2),
                      LAYERS_KEY: layer_entries(by_layers.get(e, {}), fit.by_layers),
                      HARDWARE_KEY: {hw: {"api_overhead_ms": round(v, 1), "rows": n}
                                     for hw, (v, n) in fit.on_hardware.items()},
                      "handoff_ms": round(pd_.get(e, (0.0, 0))[0], 1),
                      **({DISAGGREGATED: pd_entry(pd_seq[e])} if e in pd_seq else {}),
                      "rows": {"tpot": tpot.get(e, (0, 0))[1],
                               "tpot_loaded": per_seq.get(e, (0.0, 0))[1], "agg": fit.rows,
                               "disagg": pd_.get(e, (0, 0))[1]}}
    doc = {"fitted": str(date.today()), "aiconfigurator_core": version("aiconfigurator-core"),
           "rule": f"step: median of (default + TPOT residual) per decoder layer, per engine "
                   f"and per layer signature with >= {MIN_SIGNATURE_ROWS} rows; per request of "
                   f"the busiest rank: Theil-Sen slope of the TPOT residual against it on "
                   f"aggregated rows at {FIT_MAX_CONCURRENCY} < users <= "
                   f"{FIT_MAX_LOADED_CONCURRENCY}, and on P/D rows the median slope between "
                   f"every two rows of one deployment at different loads (the requests those of "
                   f"the decode instances' busiest rank, at most "
                   f"{FIT_MAX_LOADED_CONCURRENCY}); API: "
                   f"Theil-Sen line of the TTFT residual in prompt length, the fixed part per "
                   f"hardware with >= {MIN_HARDWARE_ROWS} rows, an offset per layer signature "
                   f"with >= {MIN_SIGNATURE_API_ROWS} rows; fitting half, concurrency <= "
                   f"{FIT_MAX_CONCURRENCY}",
           "command": "benchmarks/fit_serving_overhead.py", "engines": engines}
    write(doc)
    print(json.dumps(engines, indent=2))


if __name__ == "__main__":
    main()
