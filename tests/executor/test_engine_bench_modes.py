"""`rackplan bench --mode decode_only --sweep` on the real engine (vLLM's CPU build serving
tiny-moe): the decode role deployed alone with DecodeBenchConnector, a two-point sweep whose
measured TPOT and throughput stand beside the simulator's, both curves written, nothing left
running. Skipped only when the engine environment (.venv-engine, `make engine`) is missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from executor.backends.local import default_vllm, free_base_port, group_members
from tests.executor.local_helpers import TINY_PD

pytestmark = pytest.mark.skipif(
    not default_vllm().exists(),
    reason=f"the engine environment is missing ({default_vllm()} not found); run `make engine`")

ROOT = Path(__file__).resolve().parents[2]


def test_a_decode_only_sweep_measures_tpot_beside_the_prediction(tmp_path):
    out = tmp_path / "bench"
    r = subprocess.run(
        [sys.executable, "-m", "planner.cli", "bench", str(TINY_PD), "--mode", "decode_only",
         "--context", "256", "--sweep", "1,2", "--num-prompts", "4", "--out", str(out),
         "--base-port", str(free_base_port(1)), "--plot", str(tmp_path / "sweep.png")],
        capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    sweep = json.loads((out / "sweep.json").read_text())
    for point in sweep["points"]:
        rows = {row["metric"]: row for row in point["comparison"]}
        assert rows["tpot_ms.p50"]["measured"] > 0 and rows["tpot_ms.p50"]["predicted"] > 0
        assert rows["output_throughput_tok_s"]["measured"] > 0
    assert [p["load"] for p in sweep["measured"]] == [1.0, 2.0]
    assert (tmp_path / "sweep.png").stat().st_size > 0
    log = (out / "deploy" / "logs" / "decode-0-h0.log").read_text()
    assert "DecodeBenchConnector" in log
    pids = json.loads((out / "deploy" / "pids.json").read_text())
    assert not any(group_members(row["pgid"]) for row in pids)
