"""`import planner.cli` stays light: the heavy libraries load in the commands that use them."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("pandas", "pyarrow", "scipy", "sqlalchemy", "optuna", "streamlit", "plotly",
         "networkx", "simpy", "torch", "vllm")


def test_importing_the_cli_loads_no_heavy_library():
    code = ("import json, sys; import planner.cli; "
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []


def test_a_warm_step_of_the_reports_model_loads_no_heavy_library(tmp_path):
    """`rackplan step` on DeepSeek-V4.1-Flash at 128K, whose kernels fall back to a table's
    nearest measured cell, once the calibration cache is warm: no pandas, no scipy."""
    deck = ROOT / "examples" / "deepseek-v4.1-flash-gb300-dep.yaml"
    argv = ["step", str(deck), "--batch", "64", "--context", "131072", "--json"]
    code = ("import json, sys; from planner.cli import main; main(sys.argv[1:]); "
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    env = {**os.environ, "RACKPLAN_CACHE_DIR": str(tmp_path)}
    for _ in range(2):  # the first run fills the cache
        r = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True,
                           text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []
