"""How well the measured benchmark agrees with itself: the noise floor under `rackplan validate`.

silicon_sample.csv holds some configurations measured more than once (same backend, system,
model, precision, layout, ISL/OSL and concurrency; different runs or engine versions). Rows that
repeat a result exactly are copies of one measurement and are counted once. Predicting each
distinct measurement by another of the same configuration gives the error that a perfect
simulator would still show on those rows. Prints the groups, and the TTFT and TPOT MAPE (median,
p90) between distinct measurements.
Run: .venv/bin/python benchmarks/silicon_repeatability.py
"""

from __future__ import annotations

import numpy as np

from simulator.validate import load_rows

RESULT = ("silicon_ttft_ms", "silicon_tpot_ms")
NOT_CONFIG = ("id", "silicon_data_source", "backend_version", *RESULT)


def pairwise_errors(values: np.ndarray) -> list[float]:
    """|other / this - 1| for every ordered pair of repeats."""
    return [abs(values[j] / values[i] - 1) for i in range(len(values))
            for j in range(len(values)) if i != j]


def main() -> None:
    df = load_rows()
    config = [c for c in df.columns if c not in NOT_CONFIG]
    keyed = df[config].astype(str).fillna("-")
    ttft: list[float] = []
    tpot: list[float] = []
    groups = rows = 0
    for _, idx in keyed.groupby(config, sort=True, dropna=False).groups.items():
        if len(idx) < 2:
            continue
        grp = df.loc[idx].drop_duplicates(list(RESULT))
        if len(grp) < 2:
            continue
        groups += 1
        rows += len(grp)
        ttft += pairwise_errors(grp.silicon_ttft_ms.to_numpy(float))
        tpot += pairwise_errors(grp.silicon_tpot_ms.to_numpy(float))
    print(f"rows: {len(df)}; configurations with more than one distinct "
          f"measurement: {groups} ({rows} measurements, {len(ttft)} ordered pairs)")
    for name, errs in (("TTFT", ttft), ("TPOT", tpot)):
        e = 100 * np.asarray(errs)
        print(f"{name} between repeats: MAPE {e.mean():.1f}%, median {np.median(e):.1f}%, "
              f"p90 {np.percentile(e, 90):.1f}%")


if __name__ == "__main__":
    main()
