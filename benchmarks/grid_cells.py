"""Would a grid of step or operation prices make composing rarer? The default search's composed
steps, counted by the grid cells they fall in.

An interpolating price grid pays where many points share a cell: a cell needs its corners (up
to 2^d of them) and a check point priced before any point in it is answered without the cost
model. This script takes the steps the default search composes (`benchmarks/compose_speed.py
--record FILE` writes them; without --record they are recorded here first, about a minute),
prices them again from empty operation prices as the search did, and counts:
- step level: the distinct rank rows they hold, prefill rows (requests, prompt tokens a
  request, cached context) and decode rows (query rows, context), and the cells of a grid
  with knots at B significant bits on every axis that those rows fall in;
- operation level: the distinct points each operation was priced at (its varying arguments,
  as `simulator.cost.price_cache` keys them) and their cells.
Points per cell near 1 mean a grid prices as many points as the cost model does today, plus
its corners. Prints one line per level and kind, for each of --bits.

Run: .venv/bin/python benchmarks/grid_cells.py [--record FILE] [--bits 3 4 5]
"""

from __future__ import annotations

import argparse
import math
import pickle
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "benchmarks"))


def knot_below(value: float, bits: int) -> float:
    """The largest number of `bits` significant bits at or below `value` (>= 0)."""
    if value <= 0:
        return 0.0
    step = 2.0 ** (math.frexp(value)[1] - bits)
    return math.floor(value / step) * step


def cell(point: tuple[float, ...], bits: int) -> tuple[float, ...]:
    return tuple(knot_below(v, bits) for v in point)


def rank_rows(recorded: list[Any]) -> dict[str, set[tuple[Any, ...]]]:
    """Distinct prefill and decode rank rows of the recorded steps, per instance shape."""
    from simulator.cost.step import _rank_columns

    rows: dict[str, set[tuple[Any, ...]]] = defaultdict(set)
    for inst, batch, _, _ in recorded:
        dec_b, dec_ctx, pre_tok, pre_req, pre_ctx = _rank_columns(batch, inst.dp)
        shape = (inst.model.name, inst.dp, inst.spec_tokens)
        for i in range(len(dec_b)):
            if dec_b[i] > 0:
                rows["decode"].add((shape, float(dec_b[i] * (1 + inst.spec_tokens)),
                                    float(dec_ctx[i])))
            if pre_tok[i] > 0:
                rows["prefill"].add((shape, float(pre_req[i]),
                                     float(pre_tok[i] / max(pre_req[i], 1.0)),
                                     float(pre_ctx[i])))
    return rows


def operation_points(recorded: list[Any]) -> dict[str, list[tuple[Any, ...]]]:
    """The points each operation was priced at, composing the recorded steps from empty
    operation prices (one price cache per table set, as the search keeps)."""
    import simulator.cost.price_cache as pc
    from simulator.calibration import load_calibration
    from simulator.cost.step import open_step

    points: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    fill = pc.CachedCalibration._fill

    def counted(self: Any, memo: Any, method: Any, varying: Any, args: Any, kwargs: Any,
                keys: Any, rows: Any) -> bool:
        points[method.__name__] += [(id(memo), *r) for r in rows.tolist()]
        return bool(fill(self, memo, method, varying, args, kwargs, keys, rows))

    pc.CachedCalibration._fill = counted  # type: ignore[method-assign]
    try:
        cals: dict[tuple[Any, ...], Any] = {}
        for inst, batch, engine, version in recorded:
            key = (inst.hardware.name, engine, version)
            if key not in cals:
                cals[key] = pc.CachedCalibration(load_calibration(inst.hardware, engine,
                                                                  version))
            open_step(inst, batch, cals[key])
    finally:
        pc.CachedCalibration._fill = fill  # type: ignore[method-assign]
    return points


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", type=Path,
                    help="the composed steps (`compose_speed.py --record FILE`; recorded here "
                         "when it does not exist)")
    ap.add_argument("--bits", type=int, nargs="+", default=[3, 4, 5])
    args = ap.parse_args()
    if any(not 1 <= b <= 52 for b in args.bits):
        ap.error(f"--bits {args.bits}: each must be 1 to 52")
    with tempfile.TemporaryDirectory() as folder:
        path = args.record or Path(folder) / "steps.pkl"
        if not path.exists():
            import compose_speed

            print("recording the default search's composed steps ...", file=sys.stderr,
                  flush=True)
            compose_speed.record(path)
        with path.open("rb") as f:
            recorded = pickle.load(f)
    print(f"{len(recorded):,} composed steps")
    rows = rank_rows(recorded)
    points = operation_points(recorded)
    for bits in args.bits:
        for kind, found in sorted(rows.items()):
            cells = {(r[0], *cell(r[1:], bits)) for r in found}
            print(f"{bits} bits, step level, {kind} rows: {len(found):,} in {len(cells):,} "
                  f"cells ({len(found) / max(len(cells), 1):.2f} a cell)")
        for name, pts in sorted(points.items(), key=lambda kv: -len(kv[1])):
            cells = {(p[0], *cell(tuple(p[1:]), bits)) for p in pts}
            print(f"{bits} bits, operation {name}: {len(pts):,} points in {len(cells):,} "
                  f"cells ({len(pts) / max(len(cells), 1):.2f} a cell)")


if __name__ == "__main__":
    main()
