"""rackplan's accuracy beside aiconfigurator's own predictions on the same measured rows.

Reads benchmarks/data/aic_predictions.csv (aiconfigurator 0.12.0's TTFT/TPOT per row of
aiconfigurator-core's silicon_sample.csv, written by benchmarks/aic_predict.py in .venv-aic),
runs `rackplan validate`'s per-row prediction (simulator.validate) on exactly the rows
aiconfigurator predicted, and prints, per backend x system x mode and overall, the rows both
predict and each tool's TPOT and TTFT MAPE there (validate's MAPE: mean |pred - measured| /
measured, in %).
Run: .venv/bin/python benchmarks/compare_aic.py [--workers 2] [--json] [--rows-out FILE.csv]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
PREDICTIONS = Path("benchmarks/data/aic_predictions.csv")
NEEDED = ("id", "aic_ttft_ms", "aic_tpot_ms")
GROUP = ["backend", "system", "mode"]


class InputError(Exception):
    """Bad input, said in one line."""


def read_predictions(path: Path) -> pd.DataFrame:
    """The rows aiconfigurator predicted (a finite TTFT and TPOT), by id."""
    if not path.is_file():
        raise InputError(f"{path}: no aiconfigurator predictions; run "
                         ".venv-aic/bin/python benchmarks/aic_predict.py first (it writes them)")
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not a predictions CSV ({e})") from None
    missing = [c for c in NEEDED if c not in df.columns]
    if missing:
        raise InputError(f"{path}: columns {', '.join(missing)} missing; rerun "
                         "benchmarks/aic_predict.py")
    df = df[list(NEEDED)].copy()
    df["aic_ttft_ms"] = pd.to_numeric(df.aic_ttft_ms, errors="coerce")
    df["aic_tpot_ms"] = pd.to_numeric(df.aic_tpot_ms, errors="coerce")
    return df[df.aic_ttft_ms.notna() & df.aic_tpot_ms.notna()].drop_duplicates("id")


def compare(preds: pd.DataFrame, workers: int = 1,
            progress: Callable[[int, int], None] | None = None,
            journal: Path | None = None) -> pd.DataFrame:
    """Per-row figures: validate's record for each predicted row joined with aiconfigurator's."""
    from simulator.validate import load_rows, validate

    rows = load_rows()
    unknown = sorted(set(preds.id) - set(rows.id))
    if unknown:
        raise InputError(f"{len(unknown)} ids not in silicon_sample.csv (first: {unknown[0]})")
    picked = rows[rows.id.isin(set(preds.id))]
    df = validate(picked, progress=progress, workers=workers, journal=journal)
    df = df.merge(preds, on="id", how="left")
    df["both"] = df.covered & df.aic_tpot_ms.notna()
    return df


def block(sub: pd.DataFrame) -> dict[str, Any]:
    from simulator.validate import _mape

    b = sub[sub.both]
    return {"aic_rows": len(sub), "rows": len(b),
            "rackplan_tpot_mape": _mape(b.pred_tpot_ms, b.tpot_ms),
            "aic_tpot_mape": _mape(b.aic_tpot_ms, b.tpot_ms),
            "rackplan_ttft_mape": _mape(b.pred_ttft_ms, b.ttft_ms),
            "aic_ttft_mape": _mape(b.aic_ttft_ms, b.ttft_ms)}


def summarize(df: pd.DataFrame) -> dict[str, Any]:
    groups = [{"backend": k[0], "system": k[1], "mode": k[2], **block(g)}
              for k, g in df.groupby(GROUP, sort=True)]
    return {"groups": groups, "overall": block(df),
            "moe": block(df[df.moe]) if "moe" in df else None}


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} %"


def line(name: str, b: dict[str, Any]) -> str:
    return (f"{name:<28} {b['rows']:>5} rows both predict (of {b['aic_rows']}): "
            f"TPOT MAPE rackplan {_pct(b['rackplan_tpot_mape'])} / aiconfigurator "
            f"{_pct(b['aic_tpot_mape'])}; TTFT MAPE rackplan {_pct(b['rackplan_ttft_mape'])} / "
            f"aiconfigurator {_pct(b['aic_ttft_mape'])}")


ROW_COLUMNS = ["id", "backend", "system", "mode", "model", "isl", "osl", "concurrency",
               "ttft_ms", "tpot_ms", "pred_ttft_ms", "pred_tpot_ms", "aic_ttft_ms",
               "aic_tpot_ms", "covered", "reason", "both"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--predictions", type=Path, default=PREDICTIONS,
                   help=f"aiconfigurator's predictions (default {PREDICTIONS})")
    p.add_argument("--workers", type=int, default=1, choices=range(1, 9), metavar="N",
                   help="processes for rackplan's simulations (default 1)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    p.add_argument("--rows-out", type=Path, help="per-row figures to this CSV")
    p.add_argument("--journal", type=Path,
                   help="validate's journal: finished rows kept there, a rerun resumes")
    args = p.parse_args(argv)
    path = args.predictions if args.predictions.is_absolute() else ROOT / args.predictions
    try:
        preds = read_predictions(path)
        if preds.empty:
            raise InputError(f"{args.predictions}: no row has an aiconfigurator prediction")

        def progress(done: int, total: int) -> None:
            if done % 50 == 0 or done == total:
                print(f"rackplan: {done}/{total} rows", file=sys.stderr)

        df = compare(preds, workers=args.workers, progress=progress, journal=args.journal)
    except InputError as e:
        print(f"compare_aic: {e}", file=sys.stderr)
        return 2
    summary = summarize(df)
    if args.rows_out:
        df[ROW_COLUMNS].to_csv(args.rows_out, index=False)
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    for g in summary["groups"]:
        print(line(f"{g['backend']} {g['system']} {g['mode']}", g))
    if summary["moe"] is not None and summary["moe"]["aic_rows"] != summary["overall"]["aic_rows"]:
        print(line("MoE", summary["moe"]))
    print(line("overall", summary["overall"]))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
