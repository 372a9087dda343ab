"""docs/cost-model.md's worked example is recomputed, so its numbers stay true."""

import json
import re
from pathlib import Path

import pytest

from planner.stepcalc import step_report

ROOT = Path(__file__).resolve().parents[2]


def documented() -> dict:
    text = (ROOT / "docs" / "cost-model.md").read_text()
    block = re.search(r"<!-- worked-example -->\s*```json\n(.*?)```", text, re.S)
    assert block, "docs/cost-model.md lost its worked-example block"
    return json.loads(block.group(1))


def test_worked_example_matches_the_model():
    doc = documented()
    got = step_report(ROOT / "examples" / "deepseek-v3-h200-dep8.yaml", "decode", 128, 4096)
    assert got["total_ms"] == pytest.approx(doc["total_ms"], abs=1e-3)
    assert got["tokens_per_s_per_gpu"] == pytest.approx(doc["tokens_per_s_per_gpu"], abs=0.1)
    assert set(got["parts_ms"]) == set(doc["parts_ms"])
    for op, ms in doc["parts_ms"].items():
        assert got["parts_ms"][op] == pytest.approx(ms, abs=1e-3), op
