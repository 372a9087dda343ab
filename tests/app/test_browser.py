"""End to end in a real browser: `rackplan ui` on a free localhost port, driven by Playwright
with the system's Chromium through a what-if simulation, a small search and the deploy page.

Screenshots go to $RACKPLAN_UI_SCREENSHOTS (default: the test's temporary folder).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from app.browser import CHROMIUM_VAR, chromium, serve, tour

EXECUTABLE = chromium()
pytestmark = pytest.mark.skipif(
    EXECUTABLE is None,
    reason=f"no Chromium on this machine (apt-get install chromium, or set {CHROMIUM_VAR})")


def test_what_if_search_and_deploy_in_a_browser(tmp_path: Path) -> None:
    assert EXECUTABLE is not None
    out = Path(os.environ.get("RACKPLAN_UI_SCREENSHOTS") or tmp_path / "screenshots")
    with serve(tmp_path) as url:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
        seen = tour(url, EXECUTABLE, out)

    # what-if: every headline card, with numbers, and the charts of every tab
    assert set(seen.cards) >= {"Throughput / GPU", "TTFT p50", "TTFT p90", "TPOT p50",
                               "TPOT p90", "tok/s/user p50", "tok/s/user p90"}
    assert re.fullmatch(r"[\d,]+ tok/s", seen.cards["Throughput / GPU"])
    assert re.fullmatch(r"[\d,.]+ ms", seen.cards["TPOT p90"])
    assert seen.charts == 6
    # search: a chosen plan, the reasons, its table and the diff of two plans; study in the cwd
    assert re.match(r"Chosen plan \(trial \d+\): ", seen.chosen), seen.chosen
    assert seen.plan_rows == 3  # the reasons, the top plans and the diff of two plans
    assert (tmp_path / "runs" / "rackplan.db").is_file()
    # deploy: the chosen plan's vllm serve commands, rendered for Kubernetes' hosts
    assert "vllm serve deepseek-v4-flash" in seen.commands
    assert "--enable-expert-parallel" in seen.commands
    assert "--data-parallel-address host0" in seen.commands
    for name in ("whatif", "whatif-timelines", "whatif-step-time", "whatif-experts", "search",
                 "deploy"):
        png = seen.screenshots[name]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
