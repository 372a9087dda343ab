"""Proposals: of the deployments the search's sampler proposes for the default question
(planner/defaults: DeepSeek-V4-Flash on 72 GB300), how many are over the GPU budget and how many
repeat an earlier proposal, with the drawn points taken as they are (one over the budget is
rejected, as the search did before the repair) and with their repair (`deployment_from_params`).

Only the sampler runs: the search's TPE (`make_sampler`) draws through `suggest` in rounds of
`--batch` evaluations, asked as the search asks them, and a fake objective stands in for the
screen and the simulation, so a run takes seconds: `hash`, a fixed pseudo-random value per
deployment, or `edge`, which also rewards GPUs given to decode and so pulls the sampler to the
budget's edge, where drawn points are over it. A repeat costs a trial but no simulation (the
search reuses the earlier metrics); "by repair" counts the repeats where the proposal or the
earlier one is a repaired point, "same draw" those whose drawn params equal an earlier
proposal's (the sampler repeating itself, which no mapping of params to deployments avoids).

Run: .venv/bin/python benchmarks/proposals.py [--trials 100] [--seeds 0 1 2] [--batch 4]
     [--objective hash edge]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner import defaults
from planner.search import SearchConfig, make_sampler
from planner.space import SearchSpace, build_space, deployment_key, suggest
from simulator.specs.deployment import Deployment

Objective = Callable[[SearchSpace, Deployment], float]


def noise(space: SearchSpace, deployment: Deployment) -> float:
    """A fixed pseudo-random value per deployment, in [0, 1)."""
    digest = hashlib.sha256(deployment_key(deployment).encode()).hexdigest()
    return int(digest[:12], 16) / 16 ** 12


def edge(space: SearchSpace, deployment: Deployment) -> float:
    """The share of the budget that decodes (decode or aggregated instances), plus a quarter of
    the noise: the best plans of the default question give decode most GPUs too."""
    role = deployment.decode or deployment.aggregated
    assert role is not None
    return role.gpus / space.gpus + noise(space, deployment) / 4


OBJECTIVES: dict[str, Objective] = {"hash": noise, "edge": edge}
"""Fake objective name -> value of a deployment."""


@dataclass
class Count:
    """What one run of the sampler proposed."""

    proposals: int = 0
    over_budget: int = 0
    """Drawn points over the budget, rejected (as drawn)."""
    repaired: int = 0
    """Drawn points over the budget, repaired to fit (with the repair)."""
    repeats: int = 0
    """Proposals of a deployment proposed before."""
    by_repair: int = 0
    """Repeats where this proposal or the first of its deployment is a repaired point."""
    same_draw: int = 0
    """Repeats whose drawn params equal an earlier proposal's (the sampler's own repeats)."""
    distinct: int = 0
    """Distinct deployments evaluated."""


def over_drawn(space: SearchSpace, params: dict[str, Any]) -> bool:
    """Whether a drawn point is over the budget as drawn: one prefill and one decode instance of
    the drawn DEP sizes exceed it (instance counts alone were cut to fit before the repair)."""
    return params["layout"] == "pd" and params["prefill_dep"] + params["decode_dep"] > space.gpus


def run(space: SearchSpace, objective: Objective, trials: int, seed: int, batch: int,
        repair: bool) -> Count:
    """Ask `trials` proposals in rounds of `batch` evaluations and count them."""
    config = SearchConfig(space=space, workload=defaults.load_workload_arg(None), seed=seed,
                          batch=batch, trials=trials)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(config))
    count = Count()
    values: dict[str, float] = {}  # deployment key -> value, once evaluated
    repaired: dict[str, bool] = {}  # deployment key -> whether its first proposal was repaired
    draws: set[str] = set()
    while count.proposals < trials:
        pending: dict[str, tuple[Deployment, list[optuna.Trial]]] = {}  # this round's runs
        while len(pending) < batch and count.proposals < trials:
            trial = study.ask()
            deployment = suggest(trial, space)
            assert deployment.gpus_used <= space.gpus, deployment
            count.proposals += 1
            over = over_drawn(space, trial.params)
            if over and not repair:
                count.over_budget += 1
                study.tell(trial, state=TrialState.PRUNED)
                continue
            count.repaired += over
            key, draw = deployment_key(deployment), repr(sorted(trial.params.items()))
            if key in repaired:
                count.repeats += 1
                count.by_repair += over or repaired[key]
                count.same_draw += draw in draws
            else:
                repaired[key] = over
            draws.add(draw)
            if key in values:  # evaluated in an earlier round: told at once
                study.tell(trial, values[key])
            else:  # evaluated, once, when the round ends
                pending.setdefault(key, (deployment, []))[1].append(trial)
        for key, (deployment, asked) in pending.items():
            values[key] = objective(space, deployment)
            for trial in asked:
                study.tell(trial, values[key])
    count.distinct = len(repaired)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=defaults.TRIALS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--batch", type=int, default=defaults.BATCH)
    parser.add_argument("--objective", nargs="+", choices=sorted(OBJECTIVES),
                        default=["hash", "edge"])
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    space = build_space(defaults.MODEL, defaults.HARDWARE, defaults.GPUS)
    print(f"{defaults.MODEL} on up to {defaults.GPUS} x {defaults.HARDWARE}, {args.trials} "
          f"proposals per seed, rounds of {args.batch} evaluations")
    print(f"{'objective':<9} {'points':<8} {'seed':>4} {'over budget':>11} {'repaired':>8} "
          f"{'repeats':>7} {'by repair':>9} {'same draw':>9} {'distinct':>8}")
    for name in args.objective:
        for repair in (False, True):
            for seed in args.seeds:
                c = run(space, OBJECTIVES[name], args.trials, seed, args.batch, repair)
                print(f"{name:<9} {'repaired' if repair else 'as drawn':<8} {seed:>4} "
                      f"{c.over_budget:>11} {c.repaired:>8} {c.repeats:>7} {c.by_repair:>9} "
                      f"{c.same_draw:>9} {c.distinct:>8}")


if __name__ == "__main__":
    main()
