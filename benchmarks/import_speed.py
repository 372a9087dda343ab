"""Cold start of the CLI (target: `rackplan --help` and `rackplan step` under 0.5 s): the wall
time of fresh processes, the median over `--runs` of each.

`step` runs twice per try against a new, empty calibration cache ($RACKPLAN_CACHE_DIR): the first
run reads the measured tables and fills the cache (cold), the second finds it warm.

    .venv/bin/python benchmarks/import_speed.py [--runs 5] [--root DIR]

`--root DIR` times the `planner.cli` of another source tree (`python -m planner.cli` run in DIR),
e.g. an older commit unpacked with `git archive`, to compare before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP = ["step", str(ROOT / "examples" / "deepseek-v3-h200-pd.yaml"), "--role", "decode",
        "--batch", "64", "--context", "4096"]
STEP_V41 = ["step", str(ROOT / "examples" / "deepseek-v4.1-flash-gb300-dep.yaml"), "--batch", "64",
            "--context", "131072"]
"""The report's model at 128K: its kernels fall back to a table's nearest measured cell."""
TARGET_S = 0.5


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    """Wall seconds of one fresh process running `argv` (it must succeed)."""
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="fresh processes per command (median)")
    ap.add_argument("--root", type=Path, default=None,
                    help="source tree whose planner.cli to time (default: the installed one)")
    args = ap.parse_args()
    if args.runs < 1:
        raise SystemExit(f"--runs={args.runs} must be >= 1")
    if args.root is None:
        script = Path(sys.executable).with_name("rackplan")
        cli = [str(script)] if script.is_file() else [sys.executable, "-m", "planner.cli"]
        cwd = ROOT
    else:
        cli, cwd = [sys.executable, "-m", "planner.cli"], args.root.resolve()
    times: dict[str, list[float]] = {"rackplan --help": [], "rackplan step (cache cold)": [],
                                     "rackplan step (cache warm)": [],
                                     "rackplan step V4.1 (warm)": [], "rackplan models": []}
    with tempfile.TemporaryDirectory(prefix="rackplan-import-speed-") as tmp:
        for i in range(args.runs):
            env = {**os.environ, "RACKPLAN_CACHE_DIR": str(Path(tmp) / f"cache{i}")}
            times["rackplan --help"].append(timed([*cli, "--help"], cwd, env))
            times["rackplan step (cache cold)"].append(timed([*cli, *STEP], cwd, env))
            times["rackplan step (cache warm)"].append(timed([*cli, *STEP], cwd, env))
            timed([*cli, *STEP_V41], cwd, env)  # fills the cache with its tables
            times["rackplan step V4.1 (warm)"].append(timed([*cli, *STEP_V41], cwd, env))
            times["rackplan models"].append(timed([*cli, "models"], cwd, env))
    print(f"cold start, median of {args.runs} fresh processes ({' '.join(cli)}; "
          f"step = {' '.join(STEP[:2])} ...)")
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("(PYTHONDONTWRITEBYTECODE is set: no .pyc is written, every process compiles the "
              "sources it imports)")
    for name, walls in times.items():
        med = statistics.median(walls)
        note = ""
        if name == "rackplan --help" or "warm" in name:
            note = f"  target {TARGET_S:.1f} s: {'met' if med <= TARGET_S else 'MISSED'}"
        print(f"{name:28s} {med:6.3f} s  (min {min(walls):.3f}, max {max(walls):.3f}){note}")


if __name__ == "__main__":
    main()
