"""What composing a step costs: the default search's composed steps, priced again apart.

A step the step memo has not seen is composed by the cost model (`open_step`), the largest
part of the default search's CPU time. This script records every step the default search
(`make demo`: `rackplan search` on its built-in defaults, one worker) composes, then prices them
again in a fresh process from empty operation prices, as the search did, and prints the CPU
seconds and the milliseconds per composed step. With --root OLD_TREE the same recorded steps
are also priced by another checkout's code (an older commit, say), the two interleaved, so that
the shared machine's changing speed falls on both; the figure to read is the lowest of each.

Run: .venv/bin/python benchmarks/compose_speed.py [--repeat 3] [--root OLD_TREE]
     [--steps N] [--record FILE]

--record keeps the recorded steps in FILE (default: a temporary file, removed at the end); a
FILE that exists is read instead of running the search again. --steps prices only the first N.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]


def record(path: Path) -> int:
    """Run the default search in this process, keeping every step it composes: (instance,
    batch, the engine and version of the tables that priced it)."""
    sys.path.insert(0, str(HERE))
    import simulator.des.pricing as pricing
    from planner.cli import main as cli

    steps: list[tuple[object, object, str, str | None]] = []
    compose = pricing.open_step

    def kept(inst: Any, batch: Any, cal: Any) -> Any:
        tables = cal.calibration  # the CachedCalibration's wrapped tables
        steps.append((inst, batch, tables.engine, tables.version))
        return compose(inst, batch, cal)

    pricing.open_step = kept
    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(io.StringIO()):
        cli(["search", "--storage", f"sqlite:///{folder}/demo.db", "--out",
             f"{folder}/plan.yaml", "--workers", "1", "--json"])
    pricing.open_step = compose
    tmp = path.with_suffix(".partial")
    with tmp.open("wb") as f:
        pickle.dump(steps, f)
    tmp.replace(path)
    return len(steps)


def price(path: Path, steps: int) -> None:
    """(In a child process, the tree to time first on sys.path.) Compose the recorded steps
    from empty operation prices; print CPU seconds and the count."""
    from simulator.calibration import load_calibration
    from simulator.cost.price_cache import CachedCalibration
    from simulator.cost.step import open_step
    from simulator.des import SimOptions

    with path.open("rb") as f:
        recorded = pickle.load(f)[:steps]
    cals: dict[tuple[str, str, str | None], Any] = {}
    bits = SimOptions().price_bits  # the lattice a simulation's step memo prices ahead on
    for inst, batch, engine, version in recorded[:20]:  # tables loaded, grids built: untimed
        open_step(inst, batch, load_calibration(inst.hardware, engine, version))
    start = time.process_time()
    for inst, batch, engine, version in recorded:
        key = (inst.hardware.name, engine, version)
        if key not in cals:
            cals[key] = CachedCalibration(load_calibration(inst.hardware, engine, version))
            cals[key].lattice_bits = bits
        open_step(inst, batch, cals[key])
    print(f"{time.process_time() - start:.3f} {len(recorded)}")


def timed(root: Path, path: Path, steps: int) -> tuple[float, int]:
    code = (f"import sys; sys.path.insert(0, {str(root)!r}); "
            f"sys.path.insert(1, {str(HERE / 'benchmarks')!r}); import compose_speed; "
            f"compose_speed.price(__import__('pathlib').Path({str(path)!r}), {steps})")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(root)}).stdout
    cpu, n = out.split()[-2:]
    return float(cpu), int(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--root", type=Path, help="another checkout to time beside this one")
    parser.add_argument("--steps", type=int, default=10**9)
    parser.add_argument("--record", type=Path, help="keep (or reuse) the recorded steps here")
    args = parser.parse_args()
    if args.repeat < 1 or args.steps < 1:
        parser.error(f"--repeat {args.repeat} and --steps {args.steps} must be at least 1")
    if args.root is not None and not (args.root / "simulator" / "cost" / "step.py").is_file():
        parser.error(f"--root {args.root} is not a rackplan checkout (no simulator/cost/step.py)")
    with tempfile.TemporaryDirectory() as folder:
        path = args.record or Path(folder) / "steps.pkl"
        if path.exists():
            print(f"recorded steps: {path}")
        else:
            print("recording the default search's composed steps ...", file=sys.stderr,
                  flush=True)
            print(f"recorded {record(path):,} composed steps")
        trees = [("this tree", HERE)] + ([("--root", args.root)] if args.root else [])
        best: dict[str, float] = {}
        for r in range(args.repeat):
            for name, root in trees:
                cpu, n = timed(root, path, args.steps)
                best[name] = min(best.get(name, cpu), cpu)
                print(f"run {r + 1} {name}: {n:,} composed steps, {cpu:.2f} CPU s, "
                      f"{1e3 * cpu / n:.3f} ms each", flush=True)
        for name, cpu in best.items():
            print(f"lowest, {name}: {cpu:.2f} CPU s")


if __name__ == "__main__":
    main()
