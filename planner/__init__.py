"""rackplan: planner — search space, objectives and SLOs, the Optuna search, and plan.yaml.

Public names are imported on first use, so `rackplan` subcommands that do not search do not pay
for importing Optuna.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.chart import write_chart
    from planner.curves import curves
    from planner.evaluate import Evaluate, Simulator
    from planner.fidelity import Gate
    from planner.load import at_load, ladder
    from planner.objectives import SLO, load_slo_file, meets, pareto_front, parse_slo
    from planner.plan import Summary, build_plan, summarize, write_plan
    from planner.screen import Screen
    from planner.search import SearchConfig, run_search
    from planner.space import SearchSpace, build_space, check, suggest

_WHERE = {
    "write_chart": "chart", "curves": "curves", "at_load": "load", "ladder": "load",
    "Evaluate": "evaluate", "Simulator": "evaluate", "Gate": "fidelity",
    "SLO": "objectives", "load_slo_file": "objectives", "meets": "objectives",
    "pareto_front": "objectives", "parse_slo": "objectives",
    "Summary": "plan", "build_plan": "plan", "summarize": "plan", "write_plan": "plan",
    "Screen": "screen", "SearchConfig": "search", "run_search": "search",
    "SearchSpace": "space", "build_space": "space", "check": "space", "suggest": "space",
}

__all__ = [
    "SLO", "Evaluate", "Gate", "Screen", "SearchConfig", "SearchSpace", "Simulator", "Summary",
    "at_load", "build_plan", "build_space", "check", "curves", "ladder", "load_slo_file", "meets",
    "pareto_front", "parse_slo", "run_search", "suggest", "summarize", "write_chart",
    "write_plan",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    return getattr(importlib.import_module(f"planner.{_WHERE[name]}"), name)
