"""A launch backend and a benchmark that start nothing, for the deploy page's tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from executor.backends.base import LaunchError


class FakeBackend:
    """Records what the deploy page asks of a backend; `fail` makes wait_ready fail."""

    calls: ClassVar[list[str]] = []
    fail: ClassVar[str | None] = None

    def __init__(self, rendered: Any, run_dir: Path) -> None:
        self.rendered, self.run_dir = rendered, run_dir

    def render(self) -> list[Path]:
        FakeBackend.calls.append("render")
        return []

    def launch(self) -> None:
        FakeBackend.calls.append("launch")

    def wait_ready(self, timeout_s: float) -> None:
        FakeBackend.calls.append(f"wait {timeout_s:g}")
        if FakeBackend.fail:
            raise LaunchError(FakeBackend.fail)

    def teardown(self) -> None:
        FakeBackend.calls.append("teardown")


class FakeReport:
    """What executor.bench.run_bench returns, reduced to the part the page reads."""

    def __init__(self, plan: Path, url: str) -> None:
        self.plan, self.url = plan, url

    def to_dict(self) -> dict[str, Any]:
        return {"plan": str(self.plan), "url": self.url, "comparison": [
            {"metric": "ttft_ms.p50", "predicted": 100.0, "measured": 125.0, "rel_error": 0.25},
            {"metric": "tpot_ms.p50", "predicted": 20.0, "measured": 19.0, "rel_error": -0.05}]}


def fake_bench(plan_path: Path, url: str, run_dir: Path) -> FakeReport:
    """Checks the plan file the page wrote, then reports."""
    assert Path(plan_path).is_file() and Path(plan_path).parent == Path(run_dir)
    return FakeReport(Path(plan_path), url)
