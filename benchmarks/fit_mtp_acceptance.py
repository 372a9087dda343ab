"""Fit the draft acceptance of the rows InferenceX measured with MTP (simulator.validate.MTP_RUNS).

The rows do not record how many drafted tokens were accepted: the benchmark's prompts are random
tokens and the recipes chain the model's one MTP layer up to three times, so the DeepSeek-V3
report's 85-90 % (for the first drafted token, on real text) is only an upper bound. For each
candidate acceptance this validates every MTP row (one process per candidate, the rows one after
another in it) and prints the TPOT median error and MAPE on the fitting half (in_fit_half) and
the MAPE on the other half; the fitted value is the candidate whose fitting-half median error is
nearest zero.

    .venv/bin/python benchmarks/fit_mtp_acceptance.py [--acceptance 0.7,0.75,0.85] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import pandas as pd

import simulator.validate as v
from simulator.calibration.serving import in_fit_half


def mtp_rows() -> pd.DataFrame:
    rows = v.load_rows()
    keep = [v.measured_with_mtp(r, 1) and v.is_moe_model(r.model_path)
            for _, r in rows.iterrows()]
    return rows[keep]


def score(candidate: tuple[float, pd.DataFrame]) -> dict[str, float]:
    """TPOT errors of the MTP `rows` with `acceptance` per draft token."""
    acceptance, rows = candidate
    v.MTP_ACCEPTANCE = acceptance  # this process only
    start = time.monotonic()

    def progress(done: int, total: int) -> None:  # also when stderr is not a terminal
        if done % 40 == 0 or done == total:
            print(f"  acceptance {acceptance}: {done}/{total} rows "
                  f"({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)

    df = v.validate(rows, progress=progress, workers=1)
    df = df[df.covered]
    err = df.pred_tpot_ms / df.tpot_ms - 1
    fit = df.id.map(in_fit_half).astype(bool)
    return {"acceptance": acceptance, "rows": float(len(df)),
            "fit_median": float(err[fit].median()), "fit_mape": float(err[fit].abs().mean()),
            "held_mape": float(err[~fit].abs().mean()), "mape": float(err.abs().mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--acceptance", default="0.7,0.75,0.85",
                        help="comma-separated candidates in (0, 1]")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    try:
        grid = [float(a) for a in args.acceptance.split(",")]
    except ValueError:
        parser.error(f"--acceptance {args.acceptance!r}: give numbers in (0, 1], e.g. 0.7,0.85")
    bad = [a for a in grid if not 0 < a <= 1]
    if bad:
        parser.error(f"--acceptance {bad[0]}: each candidate must be in (0, 1]")
    rows = mtp_rows()  # read once; each candidate's process gets the same rows
    print(f"{len(rows)} MTP rows; {len(grid)} candidates on {args.workers} processes "
          "(about 4 min each)", file=sys.stderr, flush=True)
    with ProcessPoolExecutor(min(args.workers, len(grid))) as pool:
        results = list(pool.map(score, [(a, rows) for a in grid]))
    for r in results:
        print(f"acceptance {r['acceptance']:.3f}: {r['rows']:.0f} rows, TPOT MAPE "
              f"{100 * r['mape']:.1f} %; fitting half median {100 * r['fit_median']:+.1f} %, "
              f"MAPE {100 * r['fit_mape']:.1f} %; other half MAPE {100 * r['held_mape']:.1f} %")
    best = min(results, key=lambda r: abs(r["fit_median"]))
    print(f"fitted: {best['acceptance']:.3f} (fitting-half median error "
          f"{100 * best['fit_median']:+.1f} %)")


if __name__ == "__main__":
    main()
