"""`import planner.cli` stays light: the heavy libraries load in the commands that use them."""

import json
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
