"""A launch backend and a benchmark that start nothing, for the deploy page's tests; made-up
search records and outcomes for the search page's."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from app.searching import SearchOutcome
from executor.backends.base import LaunchError
from planner.objectives import SLO
from planner.plan import summarize
from planner.search import SearchConfig
from planner.space import build_space
from simulator.specs.workload import Workload


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


def record(n: int, throughput: float, user: float, ok: bool, dep: int,
            aggregated: bool = False) -> dict[str, Any]:
    """A simulated trial's record (as planner.search.records gives it), made up."""
    roles: dict[str, Any] = ({"aggregated": {"instances": 2, "dep": dep, "max_num_seqs": 64}}
                             if aggregated else {"prefill": {"instances": 1, "dep": 8},
                                                 "decode": {"instances": 1, "dep": dep}})
    return {"number": n, "stage": "simulated", "meets_slo": ok,
            "layout": "aggregated" if aggregated else "pd",
            "deployment": {"model": "deepseek-v3", "hardware": "h200", **roles},
            "metrics": {"throughput_tok_s_gpu": throughput, "gpus": 8 + dep,
                        "tok_s_user": {"p50": user, "p90": user},
                        "ttft_ms": {"p50": 100.0, "p90": 200.0},
                        "tpot_ms": {"p50": 1e3 / user, "p90": 1e3 / user}}}


def outcome_of(recs: list[dict[str, Any]], slos: tuple[SLO, ...] = (),
               objective: str = "slo") -> SearchOutcome:
    """A finished search's outcome from made-up trial records (nothing simulated)."""
    config = SearchConfig(space=build_space("deepseek-v3", "h200", 16), workload=Workload(),
                          slos=slos, objective=objective)
    return SearchOutcome(config, summarize(recs, slos, objective), recs, None, "s",
                         "sqlite:///x.db", ran=len(recs), wall_s=1.0)
