"""Accuracy on the TensorRT-LLM attention-DP rows of the silicon sample (wide EP: a DeepEP-style
exchange with the experts behind it, priced from SGLang's wide-EP tables; docs/accuracy.md says
why TensorRT-LLM's own `wideep_moe_perf` table is not used). About 4 minutes on 2 cores.

    .venv/bin/python benchmarks/trtllm_wide_ep.py [--workers 2] [--out runs/trtllm-wide-ep.csv]

Prints TPOT and TTFT MAPE over the covered rows, by system and mode, and the median signed
TPOT error; the per-row CSV resumes like `rackplan validate`'s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.validate import load_rows, summarize, validate  # noqa: E402


def attention_dp_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """TensorRT-LLM rows with attention DP in any role."""
    dp = rows[["attention_dp_size", "prefill_attention_dp_size",
               "decode_attention_dp_size"]].fillna(1).max(axis=1)
    return rows[(rows.backend == "trtllm") & (dp > 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "trtllm-wide-ep.csv")
    args = ap.parse_args()
    if args.workers < 1:
        raise SystemExit(f"--workers={args.workers} must be at least 1")
    rows = attention_dp_rows(load_rows())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    df = validate(rows, workers=args.workers, journal=args.out)
    report = summarize(df)  # the MAPE as `rackplan validate` reports it
    ok = df[df.covered.astype(bool)]
    signed = (ok.pred_tpot_ms - ok.tpot_ms) / ok.tpot_ms

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}%"

    print(f"{len(rows)} TensorRT-LLM attention-DP rows, {report['covered']} covered")
    print(f"all: TPOT MAPE {pct(report['overall']['tpot_mape'])} (median {signed.median():+.1%}), "
          f"TTFT MAPE {pct(report['overall']['ttft_mape'])}")
    for g in report["groups"]:
        if not g["covered"]:
            continue
        median = signed[(ok.system == g["system"]) & (ok["mode"] == g["mode"])].median()
        print(f"  {g['system']:10s} {g['mode']:6s} {g['covered']:3d} rows: TPOT MAPE "
              f"{pct(g['tpot_mape']):>6} (median {median:+6.1%}), TTFT MAPE "
              f"{pct(g['ttft_mape']):>6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
