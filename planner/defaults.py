"""What `rackplan search` (and `make demo`) plans when told nothing: the question of vLLM's
DeepSeek-V4.1-Flash report, DeepSeek-V4.1-Flash on one GB300 NVL72 rack under SemiAnalysis
AgentX traffic at 196 tokens/s per user for 90 % of requests."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from planner.objectives import SLO
from simulator.specs.errors import SpecError
from simulator.specs.loading import load_spec, load_workload, read_yaml
from simulator.specs.workload import Workload

MODEL = "deepseek-v4.1-flash"
HARDWARE = "gb300"
GPUS = 72
"""One GB300 NVL72 rack."""
WORKLOAD = "agentx"
"""Workload preset: AgentX session trees (planner/presets/agentx.yaml)."""
SLOS = (SLO("tok_s_user_p90", 196.0), SLO("ttft_p90_ms", 3000.0))
"""90 % of requests at >= 196 tokens/s per user (the report's P90), and P90 TTFT <= 3 s so
that no plan wins by letting requests queue."""
TRIALS = 50
"""TPE trials of a search unless told (`--trials`). The refinement after them finds most of the
default search's answer (docs/search.md, "Pattern moves"): with 50 trials instead of 100 seeds
0-2 of it chose plans 4 %, 0 % and 1 % below (247,387 / 250,886 / 238,023 tok/s/GPU) in 58 %,
80 % and 73 % of the wall time, within the demo's two minutes on two cores (2026-12-06)."""
REFINE = 10
"""Rounds of local search around the best plan after the trials (`--refine`), until one finds
nothing better: the default search's best plan went from 78,409 to 240,411 tok/s/GPU with
them (docs/search.md)."""
BATCH = 4
"""Evaluations a search round chooses together (planner/search.py: the answer depends on it and
on the seed, not on the workers)."""
STORAGE = "sqlite:///runs/rackplan.db"
"""Optuna storage: an SQLite file under runs/ in the working directory."""
OUT = "runs/plan.yaml"
"""Where the plan is written."""


def workload_presets() -> list[str]:
    """Names of the shipped workload presets."""
    folder = resources.files("planner").joinpath("presets")
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir()
                  if p.name.endswith(".yaml"))


def load_workload_arg(value: str | None) -> Workload:
    """A workload from a YAML path (a workload, or a plan.yaml: its workload) or a preset name
    (default: the agentic preset)."""
    name = value or WORKLOAD
    if Path(name).exists() or name.endswith((".yaml", ".yml")):
        from planner.plan import is_plan

        data = read_yaml(Path(name))
        if is_plan(data):
            if not isinstance(data.get("workload"), dict):
                raise SpecError(f"{name}: a plan without a workload; give a workload YAML, a "
                                f"plan that has one, or a preset: {', '.join(workload_presets())}")
            return load_spec(Workload, data["workload"], f"{name}: workload")
        return load_spec(Workload, data, name)
    if name not in workload_presets():
        raise SpecError(f"--workload {name!r} is neither a file nor a preset; presets: "
                        f"{', '.join(workload_presets())}")
    text = resources.files("planner").joinpath(f"presets/{name}.yaml")
    with resources.as_file(text) as path:
        return load_workload(path)


def workers(batch: int) -> int:
    """A search's worker processes unless told: the cores this process may run on, at most
    `batch` (a round evaluates no more at once)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, batch))


BENCH_REQUESTS_PER_USER = 10
"""Requests a user sends in a default isolated-role bench (`rackplan simulate` of a decode deck
without --workload): ten, as InferenceX's client sends `--num-prompts` ten times
`--max-concurrency` (`simulator.validate.WAVES` replays its runs so)."""
