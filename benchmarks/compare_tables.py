"""Our measured tables beside aiconfigurator-core's for the same shapes.

    .venv/bin/python benchmarks/compare_tables.py CALIBRATION_DIR [CALIBRATION_DIR ...]
        [--hardware h200] [--engine vllm] [--limit 25] [--csv PATH]

Rows are joined on each table's shape columns. `aic_ms` is the shipped latency for the same
dtype (the fastest kernel there, as the engine would pick), `aic_any_ms` the fastest over every
dtype with its dtype beside it (the shipped DeepSeek-V3 MoE rows are fp8 only, say), and
`ratio` ours / aic_ms. Per table: how many of our rows found a partner and the geometric-mean
ratio.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.calibration.tables import Calibration
from simulator.specs.hardware import load_hardware

# op -> (dtype column or None, shape columns)
JOIN: dict[str, tuple[str | None, list[str]]] = {
    "gemm": ("gemm_dtype", ["m", "n", "k"]),
    "moe": ("moe_dtype", ["num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
                          "moe_ep_size", "moe_tp_size", "distribution"]),
    "attention_generation": ("kv_cache_dtype", ["batch_size", "step", "num_heads",
                                                "num_key_value_heads", "head_dim",
                                                "window_size"]),
    "attention_context": ("kv_cache_dtype", ["batch_size", "isl", "num_heads",
                                             "num_key_value_heads", "head_dim", "window_size"]),
    "mla_generation": ("kv_cache_dtype", ["gemm_type", "batch_size", "step", "num_heads"]),
    "mla_context": ("kv_cache_dtype", ["gemm_type", "batch_size", "isl", "num_heads"]),
    "nccl": (None, ["op_name", "num_gpus", "message_size"]),
}


def compare(ours_dir: Path, hardware: str, engine: str) -> dict[str, pd.DataFrame]:
    """Per table, our rows joined with the shipped ones (only tables both sides have)."""
    hw = load_hardware(hardware)
    if hw.system is None:
        raise SystemExit(f"hardware {hardware!r} ships no measured tables; pick one with a "
                         "system (h100, h200, b200, ...)")
    ours_cal = Calibration(load_hardware("cpu"), engine, user_dir=ours_dir)
    shipped_cal = Calibration(hw, engine)
    out: dict[str, pd.DataFrame] = {}
    for op, (dtype, keys) in JOIN.items():
        ours, theirs = ours_cal.frame(op), shipped_cal.frame(op)
        if ours is None or theirs is None:
            continue
        mine, ref = ours[0], theirs[0]
        if not set(keys) <= set(ref.columns):
            continue
        cols = [*keys, dtype] if dtype else keys
        same = (ref.groupby(cols, as_index=False)["latency"].min()
                .rename(columns={"latency": "aic_ms"}))
        best = ref.loc[ref.groupby(keys)["latency"].idxmin(), [*keys, "latency"]
                       + ([dtype] if dtype else [])]
        best = best.rename(columns={"latency": "aic_any_ms", **({dtype: "aic_any_dtype"}
                                                               if dtype else {})})
        left = mine[[*cols, "latency"]].rename(columns={"latency": "ours_ms"})
        joined = left.merge(same, on=cols, how="left").merge(best, on=keys, how="left")
        joined["ratio"] = joined["ours_ms"] / joined["aic_ms"]
        joined.insert(0, "table", op)
        out[op] = joined
    return out


def geomean(x: pd.Series) -> float:
    x = x.dropna()
    return float(np.exp(np.log(x).mean())) if len(x) else math.nan


def report(tables: dict[str, pd.DataFrame], limit: int, ours: str, ref: str) -> str:
    lines = [f"ours: {ours}   reference: {ref}"]
    for op, df in tables.items():
        matched = int(df["aic_ms"].notna().sum())
        any_match = int(df["aic_any_ms"].notna().sum())
        lines.append(f"\n== {op}: {len(df)} of our rows, {matched} with a same-dtype partner, "
                     f"{any_match} with any-dtype partner; geomean ours/aic "
                     f"{geomean(df['ratio']):.3g}")
        shown = df.sort_values("aic_ms", na_position="last").head(limit).drop(columns="table")
        lines.append(shown.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if not tables:
        lines.append("no table on both sides")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calibration", type=Path, nargs="+",
                    help="folders written by rackplan calibrate")
    ap.add_argument("--hardware", default="h200", help="shipped tables of this preset")
    ap.add_argument("--engine", default="vllm", help="engine folder of both sides")
    ap.add_argument("--limit", type=int, default=25, help="rows printed per table")
    ap.add_argument("--csv", type=Path, help="write every joined row here")
    args = ap.parse_args(argv)
    joined = []
    for folder in args.calibration:
        if not folder.is_dir():
            print(f"compare_tables: {folder} is not a folder", file=sys.stderr)
            return 2
        tables = compare(folder, args.hardware, args.engine)
        print(report(tables, args.limit, str(folder), f"{args.hardware} (aiconfigurator-core)"))
        joined += [df.assign(calibration=str(folder)) for df in tables.values()]
    if args.csv and joined:
        tmp = args.csv.with_suffix(args.csv.suffix + ".tmp")
        pd.concat(joined, ignore_index=True).to_csv(tmp, index=False)
        tmp.replace(args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
