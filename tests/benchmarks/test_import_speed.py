"""benchmarks/import_speed.py runs and prints each command's cold wall time (no timing asserted)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_speed_prints_every_command():
    r = subprocess.run([sys.executable, "benchmarks/import_speed.py", "--runs", "1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for name in ("rackplan --help", "rackplan step (cache cold)", "rackplan step (cache warm)",
                 "rackplan models"):
        line = next(line for line in r.stdout.splitlines() if line.startswith(name))
        assert float(line[len(name):].split()[0]) > 0
