"""Where the predicted TTFT of a loaded row comes from: the client's first wave or the rest.

`rackplan validate` replays InferenceX's client (simulator.validate): every user sends its first
request at once, then a new one as each ends, ten requests a user (WAVES), and the row's TTFT is
the mean over all of them. At high concurrency the first wave queues behind a burst of prompts
(users x prompt tokens through the engine's prefill), so a few of the requests carry most of the
mean. For a seeded sample of aggregated MoE rows at --min-users or more this prints, per engine:
the measured and predicted TTFT and TPOT (medians of the rows' errors), the share of the
predicted mean TTFT that the first wave's requests carry, and the first-wave mean the measurement
implies if the later waves were as predicted (measured mean x waves - predicted later mean x
(waves - 1)) over the predicted first-wave mean: above 1 where the measured burst took longer to
drain than the simulated one.

    .venv/bin/python benchmarks/ttft_waves.py [--min-users 128] [--sample 40] [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.calibration.serving import fitted_overhead
from simulator.specs.errors import SpecError
from simulator.validate import WAVES, case_from_row, is_moe_model, load_rows


def waves(row: pd.Series) -> dict[str, Any] | None:
    """One row's measured and predicted TTFT and TPOT, and its predicted first-wave split
    (None when the row is not covered)."""
    from simulator.des import SimOptions, simulate

    try:
        case = case_from_row(row)
        dep = case.deployment
        res = simulate(dep, case.workload, options=SimOptions.serving(fitted_overhead(dep)))
    except SpecError:
        return None
    ttft = res.ttft_s * 1e3  # in request order: the first `users` are the first wave
    users = int(row.concurrency)
    first, later = float(ttft[:users].mean()), float(ttft[users:].mean())
    measured = float(row.silicon_ttft_ms)
    implied = measured * WAVES - later * (WAVES - 1)
    return {"backend": row.backend, "users": users, "isl": int(row.isl),
            "ttft_error": float(ttft.mean()) / measured - 1,
            "tpot_error": float(res.metrics()["tpot_ms"]["mean"]) / float(row.silicon_tpot_ms) - 1,
            "first_share": first * users / float(ttft.sum()),
            "later_ms": later, "first_ms": first, "implied_first": implied / first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-users", type=int, default=128, help="rows at this concurrency or more")
    ap.add_argument("--sample", type=int, default=40, help="rows per engine (seeded)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    if args.min_users < 1 or args.sample < 1 or args.workers < 1:
        ap.error(f"--min-users={args.min_users}, --sample={args.sample} and "
                 f"--workers={args.workers} must be >= 1")
    rows = load_rows()
    rows = rows[(rows["mode"] == "agg") & (rows.concurrency >= args.min_users)
                & rows.model_path.map(is_moe_model)]
    picked = pd.concat(g.sample(n=min(args.sample, len(g)), random_state=args.seed)
                       for _, g in rows.groupby("backend"))
    with ProcessPoolExecutor(args.workers) as pool:
        got = [r for r in pool.map(waves, [r for _, r in picked.iterrows()], chunksize=2) if r]
    df = pd.DataFrame(got)
    print(f"aggregated MoE rows at {args.min_users}+ users, {len(df)} covered of {len(picked)} "
          f"sampled (medians; {WAVES} requests a user)")
    print(f"{'engine':8} {'rows':>4} {'TTFT err':>9} {'TPOT err':>9} {'first wave':>11} "
          f"{'later ms':>9} {'first ms':>9} {'implied/pred':>13}")
    for engine, g in df.groupby("backend"):
        print(f"{engine:8} {len(g):4d} {np.median(g.ttft_error):+9.1%} "
              f"{np.median(g.tpot_error):+9.1%} {np.median(g.first_share):11.0%} "
              f"{np.median(g.later_ms):9.0f} {np.median(g.first_ms):9.0f} "
              f"{np.median(g.implied_first):13.2f}")


if __name__ == "__main__":
    main()
