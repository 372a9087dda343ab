"""End to end in a real browser: `rackplan ui` on a free localhost port, driven by Playwright
with the system's Chromium through a what-if simulation of DeepSeek-V4-Flash on AgentX
sessions, a small search over two loads, and the deploy page for each Kubernetes flavor.

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

    # what-if: every headline card, with numbers, the charts of every tab, all in view
    assert set(seen.cards) >= {"Throughput / GPU", "TTFT p50", "TTFT p90", "TPOT p50",
                               "TPOT p90", "tok/s/user p50", "tok/s/user p90",
                               "Prefix-cache hits"}
    assert re.fullmatch(r"[\d,]+ tok/s", seen.cards["Throughput / GPU"])
    assert re.fullmatch(r"[\d,.]+ ms", seen.cards["TPOT p90"])
    assert re.fullmatch(r"[\d.]+ %", seen.cards["Prefix-cache hits"])
    # latency, throughput, per role, per instance, prefix cache, step time, 2 x experts
    assert seen.charts == 8
    assert seen.whatif_in_view  # the results start within the first viewport
    # search: a chosen plan in view, the load curves and the front, the reasons, the tables
    assert re.match(r"Chosen plan \(trial \d+\): ", seen.chosen), seen.chosen
    assert seen.search_in_view
    assert seen.search_charts == 2  # the curves across load, and the Pareto front
    assert "reason" in seen.reasons and "trials" in seen.reasons
    assert seen.tables == 4  # the reasons, the top plans, the diff by role, compare's rows
    assert (tmp_path / "runs" / "rackplan.db").is_file()
    # deploy: each flavor's manifests of the chosen plan (not host command lines), a zip
    for flavor, kind in (("llm-d", "LeaderWorkerSet"), ("dynamo", "DynamoGraphDeployment"),
                         ("kserve", "LLMInferenceService")):
        assert f"kind: {kind}" in seen.manifests[flavor], seen.manifests[flavor][:300]
        assert "host0" not in seen.manifests[flavor]
    assert seen.zip_button
    for name in ("whatif", "whatif-timelines", "whatif-prefix-cache", "whatif-step-time",
                 "whatif-experts", "search", "deploy"):
        png = seen.screenshots[name]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
