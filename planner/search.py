"""The planner's search: an Optuna ask/tell loop that we own (STYLE rule 7).

Each trial draws a deployment from the space and goes as far as it deserves:

1. rejected: over the GPU budget, against a vLLM rule, out of memory or unplaceable
   (`space.check`) — never simulated; told PRUNED with the reason;
2. screened out: the analytic screen's estimate, corrected by what simulation has shown so far,
   cannot plausibly meet the SLOs or is clearly worse than the best plan so far (`Gate`) —
   told PRUNED, the estimate reported as an intermediate value (single objective);
3. simulated: the evaluation function (discrete-event simulation) gives the metrics; told
   COMPLETE with the objective values and the SLO violation as a constraint. A deployment
   simulated before reuses its metrics instead of running again. An evaluation that raises
   (other than for bad input) is told FAIL with its error, and the search goes on.

Every trial carries one user attribute, ``record``: its stage, reason, deployment, screen
estimate and metrics. The study lives in an Optuna storage, so a search resumes where it
stopped (`trials` counts the study's finished trials) and N worker processes can share it.
"""

from __future__ import annotations

import json
import multiprocessing
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from planner.evaluate import Evaluate, Simulator, calibration_for, overhead_for
from planner.fidelity import TWIN, Gate, Seen
from planner.objectives import SLO, meets, objective_metrics, objective_values, violation
from planner.screen import Screen
from planner.space import SearchSpace, check, suggest
from planner.storage import (
    DEFAULT_STORAGE,
    Direction,
    open_storage,
    open_study,
    study_name,
)
from simulator.calibration.serving import ServingOverhead
from simulator.specs.errors import SpecError
from simulator.specs.loading import dump_deployment, dump_workload
from simulator.specs.workload import Workload

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
REJECTED_VIOLATION = 1e3
"""Constraint value of a rejected point: worse than any SLO miss."""
Progress = Callable[[int, list[FrozenTrial]], None]
"""Called after each trial with the finished count and the study's trials."""


@dataclass(frozen=True)
class SearchConfig:
    """Everything that defines one search (picklable, sent to worker processes)."""

    space: SearchSpace
    workload: Workload
    slos: tuple[SLO, ...] = ()
    objective: str = "slo"
    """slo: most throughput per GPU within the SLOs; pareto: throughput/GPU vs tokens/s/user."""
    trials: int = 100
    """Finished trials the study should hold; a resumed study runs only the rest."""
    seed: int = 0
    """TPE sampler seed (worker i uses seed + i)."""
    storage: str = DEFAULT_STORAGE
    study: str | None = None
    """Study name; None: derived from the space, workload, SLOs and objective."""
    workers: int = 1
    """Local processes running the loop on the shared storage."""
    screen: bool = True
    """Screen points analytically before simulating (multi-fidelity)."""
    slack: float = 0.15
    """Relative slack on SLO bounds for corrected screen estimates (see Gate)."""
    margin: float = 0.15
    """How far below the best so far a corrected estimate may be and still be simulated."""
    warmup: int | None = None
    """Screened points before the first simulation (see Gate); None: a tenth of the trials,
    at most 8."""
    max_simulations: int | None = None
    """Stop once the study holds this many simulations (None: trials alone bound the search)."""
    startup_trials: int = 16
    """Random trials before TPE models the space."""

    def study_name(self) -> str:
        """The given study name, or one derived from what defines the search."""
        if self.study:
            return self.study
        defining = {"space": self.space.describe(), "workload": dump_workload(self.workload),
                    "slos": [str(s) for s in self.slos], "screen": self.screen,
                    "gate": [self.slack, self.margin]}
        s = self.space
        return study_name(s.model, s.hardware, s.gpus, self.objective, defining)

    @property
    def directions(self) -> list[Direction]:
        return ["maximize"] * len(objective_metrics(self.objective))


def records(trials: list[FrozenTrial]) -> list[dict[str, Any]]:
    """The `record` attribute of each finished trial, with its number."""
    out = []
    for t in trials:
        rec = t.user_attrs.get("record")
        if t.state in FINISHED and rec is not None:
            out.append({"number": t.number, **rec})
    return out


def simulations(trials: list[FrozenTrial]) -> int:
    """Simulations the trials ran (reused ones not counted)."""
    return sum(r["stage"] == "simulated" and "reused" not in r for r in records(trials))


def finished(study: optuna.Study) -> list[FrozenTrial]:
    """The study's finished trials."""
    return study.get_trials(deepcopy=False, states=FINISHED)


def make_sampler(config: SearchConfig, worker: int) -> optuna.samplers.TPESampler:
    """Seeded multivariate TPE that models conditional parameters in groups."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=config.seed + worker, multivariate=True,
                                          group=True, n_startup_trials=config.startup_trials)


class Loop:
    """One worker's loop over one study."""

    def __init__(self, config: SearchConfig, evaluate: Evaluate | None = None,
                 worker: int = 0) -> None:
        self.config = config
        self.evaluate = evaluate or Simulator(config.workload)
        self.study = open_study(open_storage(config.storage), config.study_name(),
                                config.directions, make_sampler(config, worker))
        warmup = min(8, config.trials // 10) if config.warmup is None else config.warmup
        self.gate = Gate(config.slos, config.objective, slack=config.slack,
                         margin=config.margin, warmup=warmup)
        self._screens: dict[bool, Screen] = {}
        self._enqueued: set[int] = set()
        self.simulations = 0
        """Evaluations this loop ran (reuses not counted)."""

    def run(self, quota: int, progress: Progress | None = None) -> None:
        """Run up to `quota` trials, stopping once the study holds `config.trials` (or
        `config.max_simulations` simulations)."""
        cap = self.config.max_simulations
        for _ in range(quota):
            done = finished(self.study)
            if len(done) >= self.config.trials:
                break
            if cap is not None and simulations(done) >= cap:
                break
            self.step(done)
            if progress is not None:
                trials = finished(self.study)
                progress(len(trials), trials)

    def step(self, history: list[FrozenTrial]) -> FrozenTrial:
        """Ask one trial, take it as far as it deserves, tell it."""
        trial = self.study.ask()
        deployment = suggest(trial, self.config.space)
        record: dict[str, Any] = {"deployment": dump_deployment(deployment),
                                  "layout": "pd" if deployment.disaggregated else "aggregated"}
        overhead = overhead_for(deployment)
        try:
            resolved = check(deployment, self.config.space, calibration_for(deployment),
                             overhead_ms=overhead.step_overhead_ms)
        except SpecError as e:
            return self._prune(trial, {**record, "stage": "rejected", "reason": str(e)},
                               REJECTED_VIOLATION)
        past = records(history)
        key = _key(record["deployment"])
        earlier = next((r for r in past if r["stage"] == "simulated"
                        and _key(r["deployment"]) == key), None)
        if earlier is not None:
            record.update(stage="simulated", metrics=earlier["metrics"],
                          screen=earlier.get("screen"), reused=earlier["number"])
            return self._complete(trial, record)
        if self.config.screen:
            estimate = self._screen(deployment.disaggregated, overhead)(resolved)
            record["screen"] = estimate
            decision = self.gate.decide(record["layout"], estimate, _seen(past))
            if not decision.simulate:
                self._enqueue(decision.blocker, history)
                value = objective_values(estimate, self.config.objective)[0]
                if len(self.config.directions) == 1:
                    trial.report(value, step=0)
                return self._prune(trial, {**record, "stage": "screened_out",
                                           "reason": decision.reason},
                                   violation(estimate, self.config.slos))
        try:
            metrics = self.evaluate(deployment)
        except SpecError as e:
            return self._prune(trial, {**record, "stage": "rejected", "reason": str(e)},
                               REJECTED_VIOLATION)
        except Exception as e:  # a simulator bug on one point should not end the search
            trial.set_user_attr("record", _plain(
                {**record, "stage": "failed", "reason": f"{type(e).__name__}: {e}"}))
            return self.study.tell(trial, state=TrialState.FAIL)
        except BaseException:  # interrupted: leave no trial running
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        self.simulations += 1
        record.update(stage="simulated", metrics=metrics)
        return self._complete(trial, record)

    def _enqueue(self, number: int | None, history: list[FrozenTrial]) -> None:
        """Ask again, next, for a screened point that keeps others out, so it is simulated."""
        if number is None or number in self._enqueued:
            return
        self._enqueued.add(number)
        params = next(t.params for t in history if t.number == number)
        self.study.enqueue_trial(params, skip_if_exists=False)

    def _screen(self, disaggregated: bool, overhead: ServingOverhead) -> Screen:
        if disaggregated not in self._screens:
            self._screens[disaggregated] = Screen(self.config.workload, overhead)
        return self._screens[disaggregated]

    def _prune(self, trial: optuna.Trial, record: dict[str, Any],
               constraint: float) -> FrozenTrial:
        trial.set_user_attr("record", _plain(record))
        trial.set_constraint("slo", constraint)
        return self.study.tell(trial, state=TrialState.PRUNED)

    def _complete(self, trial: optuna.Trial, record: dict[str, Any]) -> FrozenTrial:
        metrics = record["metrics"]
        record["meets_slo"] = meets(metrics, self.config.slos)
        trial.set_user_attr("record", _plain(record))
        trial.set_constraint("slo", violation(metrics, self.config.slos))
        return self.study.tell(trial, objective_values(metrics, self.config.objective))


def _key(deployment: dict[str, Any]) -> str:
    return json.dumps(deployment, sort_keys=True)


def _plain(obj: Any) -> Any:
    """JSON-safe copy (numpy scalars to floats)."""
    return json.loads(json.dumps(obj, default=float))


def _seen(past: list[dict[str, Any]]) -> list[Seen]:
    """What the gate learns from: simulations (not reuses) and screened-out points (not those
    screened out as twins of a simulated one)."""
    out = []
    for r in past:
        if r["stage"] == "simulated" and "reused" not in r:
            out.append(Seen(r["number"], r["layout"], r.get("screen"), r["metrics"],
                            bool(r.get("meets_slo"))))
        elif r["stage"] == "screened_out" and TWIN not in r["reason"]:
            out.append(Seen(r["number"], r["layout"], r.get("screen")))
    return out


def _worker(config: SearchConfig, quota: int, worker: int, evaluate: Evaluate | None) -> None:
    Loop(config, evaluate, worker).run(quota)


def run_search(config: SearchConfig, evaluate: Evaluate | None = None,
               progress: Progress | None = None) -> optuna.Study:
    """Run the search to `config.trials` finished trials and return its study.

    One worker runs in this process; more run as spawned processes, each with a share of the
    remaining trials (so together they finish exactly that many), polled for `progress`.
    `evaluate` must be picklable when workers > 1.
    """
    if config.workers < 1:
        raise SpecError(f"--workers={config.workers} must be >= 1")
    if config.trials < 1:
        raise SpecError(f"--trials={config.trials} must be >= 1")
    if config.workload.mode != "serve":
        raise SpecError(f"search needs workload mode 'serve', not {config.workload.mode!r}")
    if config.workers == 1:
        loop = Loop(config, evaluate)
        loop.run(max(config.trials - len(finished(loop.study)), 0), progress)
        return loop.study
    study = open_study(open_storage(config.storage), config.study_name(), config.directions)
    remaining = max(config.trials - len(finished(study)), 0)
    shares = [remaining // config.workers + (i < remaining % config.workers)
              for i in range(config.workers)]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(config, n, i, evaluate), daemon=True)
             for i, n in enumerate(shares) if n]
    for p in procs:
        p.start()
    try:
        while any(p.is_alive() for p in procs):
            time.sleep(0.5)
            if progress is not None:
                trials = finished(study)
                progress(len(trials), trials)
    finally:
        for p in procs:
            p.join()
    failed = [p.exitcode for p in procs if p.exitcode]
    if failed:
        raise RuntimeError(f"{len(failed)} search worker(s) failed (exit codes {failed})")
    return study
