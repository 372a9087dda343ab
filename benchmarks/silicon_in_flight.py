"""How many requests each loaded aggregated row kept in flight, read off its own figures.

In a closed loop of C clients, each request spends TTFT waiting for its first token and about
0.9 x OSL x TPOT decoding (InferenceX draws output lengths from [0.8 OSL, OSL]), so by Little's
law C / (1 + TTFT / (0.9 x OSL x TPOT)) requests decode at once on average. A server whose KV
memory or slots are full keeps the rest queued, which shows as a small share; the simulator
should then queue them too. With a validate CSV (`rackplan validate --out FILE`), the same share
is printed from the predicted TTFT and TPOT beside the measured one, so a row whose measured
share the simulator does not reproduce stands out. CAPPED_RUNS in simulator/validate.py names
the runs this finds held back by something outside their deployment.

Run: .venv/bin/python benchmarks/silicon_in_flight.py [--validate runs/validate.csv]
     [--min-concurrency 128] [--rows 30]
"""

from __future__ import annotations

import argparse

import pandas as pd

from simulator.validate import capped_run, in_flight, load_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validate", help="a validate CSV: print the predicted share beside")
    ap.add_argument("--min-concurrency", type=float, default=128.0)
    ap.add_argument("--rows", type=int, default=30, help="rows to print, fewest in flight first")
    args = ap.parse_args()
    df = load_rows()
    df = df[(df["mode"] == "agg") & (df.concurrency >= args.min_concurrency)].copy()
    df["in_flight"] = in_flight(df.concurrency, df.osl, df.silicon_ttft_ms, df.silicon_tpot_ms)
    df["share"] = df.in_flight / df.concurrency
    df["capped"] = df.apply(capped_run, axis=1)
    cols = ["id", "concurrency", "in_flight", "share", "capped"]
    if args.validate:
        pred = pd.read_csv(args.validate)[["id", "pred_ttft_ms", "pred_tpot_ms"]]
        df = df.merge(pred, on="id", how="left")
        df["pred_share"] = in_flight(df.concurrency, df.osl, df.pred_ttft_ms,
                                     df.pred_tpot_ms) / df.concurrency
        cols.append("pred_share")
    out = df.sort_values("share")[cols].head(args.rows)
    with pd.option_context("display.width", 200, "display.max_colwidth", 80):
        print(out.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"{len(df)} aggregated rows at {args.min_concurrency:g} users or more; "
          f"{int(df.capped.sum())} in CAPPED_RUNS")


if __name__ == "__main__":
    main()
