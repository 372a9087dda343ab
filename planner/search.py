"""The planner's search: an Optuna ask/tell loop that we own (STYLE rule 7).

Each trial draws a deployment from the space and goes as far as it deserves:

1. rejected: over the GPU budget, against a vLLM rule, out of memory or unplaceable
   (`space.check`) — never simulated; told PRUNED with the reason;
2. screened out: the analytic screen's estimate, corrected by what simulation has shown so far,
   cannot plausibly meet the SLOs or is clearly worse than the best plan so far (`Gate`) —
   told PRUNED, the estimate reported as an intermediate value (single objective). A point kept
   out by the estimate of another point of its round is asked again, once, when that point's
   simulation lets it through (`Loop._unblock`);
3. simulated: the evaluation function (discrete-event simulation) gives the metrics; told
   COMPLETE with the objective values and the SLO violation as a constraint. A deployment
   simulated before reuses its metrics instead of running again. An evaluation that raises
   (other than for bad input) is told FAIL with its error, and the search goes on.

The loop runs in rounds. A round asks trials until `batch` of them wait for an evaluation (the
rejected and screened-out ones are told at once), evaluates those — in parallel over `workers`
processes — and tells them in the order they were asked. Every decision in a round sees the same
finished trials however many workers evaluate, so for a fixed seed and batch the study, trial by
trial, is the same with 1 worker or N; workers change only the wall time.

With `loads` the offered load is searched too: each trial also draws one of them (parameter
``load``), and is screened and simulated at that load (`planner.load.at_load`); a point is then
a deployment at a load. After the trials, `planner.curves` sweeps every load for the best few
deployments (the throughput-interactivity curves), keeping what it simulates in the study.

Objective ``gpus`` (`--target-rate`): a point on more GPUs than a feasible plan already found is
rejected without a simulation, and the screen only judges whether a point can meet the SLOs
(throughput per GPU is not what is minimized).

Every trial carries one user attribute, ``record``: its stage, reason, deployment, screen
estimate and metrics. The study lives in an Optuna storage, so a search resumes where it
stopped, and searches on several machines can share one study (each its own seed). The budget
is the study's first `trials` trial numbers: a search asks only while the study holds fewer
trials (or some of those wait, enqueued), and gives a trial numbered beyond it back as WAITING,
so however many searches share a study, exactly `trials` trials finish and none is run twice.

A search that is killed leaves the trials of its round RUNNING; one stopped by ^C tells them
FAIL. Either way they are interrupted, not finished: the next search on the study fails the
stale ones (`planner.storage.fail_stale`), asks each interrupted trial's parameters again (a
retry, enqueued), and widens the budget by one per interrupted trial, so the study still ends
with `trials` finished ones. A search whose budget is taken waits for the trials other searches
still run below it, failing and retrying those that go stale. An uninterrupted search never
sees any of this: its trials are the same as before.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, get_args

import optuna
from optuna.trial import FrozenTrial, TrialState

from planner.defaults import BATCH
from planner.evaluate import Evaluate, Simulator, at_workload, calibration_for, overhead_for
from planner.fidelity import TWIN, Gate, Seen
from planner.load import at_load
from planner.objectives import SLO, meets, objective_metrics, objective_values, violation
from planner.screen import Screen
from planner.space import SearchSpace, check, deployment_from_params, suggest
from planner.storage import (
    DEFAULT_STORAGE,
    Direction,
    Heartbeat,
    fail_stale,
    open_storage,
    open_study,
    predictor_digest,
    redact,
    retried,
    retry,
    study_name,
)
from simulator.calibration.serving import ServingOverhead
from simulator.specs.deployment import Deployment, Role
from simulator.specs.errors import SpecError
from simulator.specs.loading import dump_deployment, dump_workload
from simulator.specs.workload import Workload
from simulator.workers import LazyPool

if TYPE_CHECKING:
    from planner.plan import Summary

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
REJECTED_VIOLATION = 1e3
"""Constraint value of a rejected point: worse than any SLO miss."""
Progress = Callable[[int, list[FrozenTrial]], None]
"""Called after each trial with the finished count and the finished trials."""
WAIT_S = 1.0
"""Seconds between two looks at trials other searches run, once a search's budget is taken."""

class Guard:
    """A search's ^C: raised at once while the search waits for evaluations (or runs one), and
    held until the next such moment, or the next trial, while it talks to the storage — a
    database call cut short leaves the libraries' tracebacks on stderr, and a half-written
    trial. Not installed (outside the main thread, or never), ^C raises anywhere, as usual; a
    process that ignores SIGINT (started in the background by a shell, nohup) goes on ignoring
    it."""

    def __init__(self) -> None:
        self.safe = True
        self.pending = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if (threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
            yield
            return
        previous = signal.signal(signal.SIGINT, self._handle)
        self.safe = False
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
            self.safe, self.pending = True, False

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """Where ^C may stop the search at once."""
        self.check()
        was, self.safe = self.safe, True
        try:
            yield
        finally:
            self.safe = was

    def check(self) -> None:
        """Raise a ^C held so far."""
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt

    def _handle(self, signum: int, frame: Any) -> None:
        if self.safe:
            raise KeyboardInterrupt
        self.pending = True


class Interrupted(KeyboardInterrupt):
    """A search stopped by ^C; its finished trials are kept in its storage."""

    def __init__(self, kept: int, storage: str) -> None:
        super().__init__(f"interrupted; {kept} trials kept in {storage}, run the same command "
                         "again to resume")
        self.kept, self.storage = kept, storage


@dataclass(frozen=True)
class SearchConfig:
    """Everything that defines one search (picklable)."""

    space: SearchSpace
    workload: Workload
    slos: tuple[SLO, ...] = ()
    objective: str = "slo"
    """slo: most throughput per GPU within the SLOs; pareto: throughput/GPU vs tokens/s/user."""
    trials: int = 100
    """Trials the study should hold, finished; a resumed study runs only the rest."""
    seed: int = 0
    """TPE sampler seed; searches sharing one study from several machines each need their own."""
    storage: str = DEFAULT_STORAGE
    study: str | None = None
    """Study name; None: derived from the space, workload, SLOs and objective."""
    batch: int = BATCH
    """Evaluations per round: chosen together from the trials finished before the round, then
    evaluated in parallel; the answer depends on the seed and batch, never on workers."""
    workers: int = 1
    """Local processes evaluating a round's points (1: in this process); at most batch."""
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
    loads: tuple[float, ...] = ()
    """Offered loads to search (users, lanes or requests/s, per `planner.load.LOADS`); empty:
    the workload's own load only."""
    curves: int = 3
    """Deployments whose every load is simulated after the trials (with `loads`)."""
    refine: int = 0
    """Rounds around the best plan after the trials (the CLI's default: `defaults.REFINE`):
    its one-knob neighbours (`adjacent_points`), screened and simulated like the others; the
    rounds stop early when one finds nothing better."""

    def study_name(self) -> str:
        """The given study name, or one derived from what defines the search."""
        if self.study:
            return self.study
        defining = {"space": self.space.describe(), "workload": dump_workload(self.workload),
                    "slos": [str(s) for s in self.slos], "screen": self.screen,
                    "gate": [self.slack, self.margin], "predictor": predictor_digest()}
        if self.loads:
            defining["loads"] = list(self.loads)
        s = self.space
        return study_name(s.model, s.hardware, s.gpus, self.objective, defining)

    @property
    def directions(self) -> list[Direction]:
        return ["maximize"] * len(objective_metrics(self.objective))


def interrupted(trial: FrozenTrial) -> bool:
    """A failed trial whose evaluation did not fail: killed, or gone stale, before its outcome
    was told (it may hold the record written just before the tell). It is asked again, not
    counted; only an evaluation's failure records the stage "failed"."""
    rec = trial.user_attrs.get("record")
    return trial.state == TrialState.FAIL and (rec is None or rec.get("stage") != "failed")


def records(trials: list[FrozenTrial]) -> list[dict[str, Any]]:
    """The `record` attribute of each finished trial, with its number (interrupted ones
    left out)."""
    out = []
    for t in trials:
        rec = t.user_attrs.get("record")
        if t.state in FINISHED and rec is not None and not interrupted(t):
            out.append({"number": t.number, **rec})
    return out


NEAR_MISSES = 2
"""Near misses whose neighbours a refinement's repair round tries (the best by the objective
first): each brings up to twice the knobs' count of trials."""
WALK = 2
"""Steps of a refinement's pattern move simulated together (`Loop._walk`): two, so that the
two workers of a 2-core machine take two steps in the wall time of one; a walk that overshoots
costs one simulation the next round would mostly have run anyway."""


def past_drawn(done: int, drawn: int) -> str | None:
    """How progress names `done` finished trials once they pass the `drawn` ones (the
    refinement's and the load sweep's, enqueued after them); None while within them."""
    if done <= drawn:
        return None
    return f"{drawn} trials and {done - drawn} more around the best plans"


def near_misses(simulated: list[dict[str, Any]], best: int, objective: str,
                most: int) -> list[int]:
    """Trial numbers of the simulated records (each deployment's first) that rank above the
    record of trial `best` by the objective but miss an SLO, best first, at most `most`."""
    from planner.plan import RANKS

    rank = RANKS[objective]
    top = next((r for r in simulated if r["number"] == best), None)
    if top is None:
        return []
    above = sorted((r for r in simulated
                    if not r.get("meets_slo") and r.get("metrics") and rank(r) < rank(top)),
                   key=rank)
    return [int(r["number"]) for r in above[:most]]


def simulations(trials: list[FrozenTrial]) -> int:
    """Simulations the trials ran (reused ones not counted)."""
    return sum(r["stage"] == "simulated" and "reused" not in r for r in records(trials))


def finished(study: optuna.Study) -> list[FrozenTrial]:
    """The study's finished trials."""
    return study.get_trials(deepcopy=False, states=FINISHED)


@dataclass(frozen=True)
class Conclusion:
    """What a finished search concluded, as `rackplan search` and the UI's search page show
    it."""

    records: list[dict[str, Any]]
    """Every finished trial's record (with its number)."""
    summary: Summary
    sweep: dict[str, Any]
    """The throughput-interactivity curves (`planner.curves.curves`)."""
    study: str
    storage: str
    """The storage URL with any password hidden."""
    plan: dict[str, Any] | None
    """plan.yaml of the chosen plan; None when no plan met the SLOs."""


def conclude(study: optuna.Study, config: SearchConfig) -> Conclusion:
    """The finished trials of `study` summarized under `config`'s SLOs and objective, the
    curves of its best deployments, and the plan of the best one."""
    from planner.curves import curves, user_axis
    from planner.plan import build_plan, summarize

    recs = records(finished(study))
    summary = summarize(recs, config.slos, config.objective)
    sweep = curves(summary, recs, config.curves, user_axis(config.slos))
    name, storage = config.study_name(), redact(config.storage)
    plan = None if summary.best is None else build_plan(
        summary, config.workload, config.slos, config.objective, config.seed, name, storage,
        sweep)
    return Conclusion(recs, summary, sweep, name, storage, plan)


def make_sampler(config: SearchConfig) -> optuna.samplers.TPESampler:
    """Seeded multivariate TPE that models conditional parameters in groups, over finished
    trials only (no constant liar: a round's points are chosen from what has finished, and TPE
    reads the study once per trial instead of once per parameter group)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=config.seed, multivariate=True, group=True,
                                          n_startup_trials=config.startup_trials,
                                          constant_liar=False)


@dataclass
class _Pending:
    """An asked trial waiting in its round for an evaluation."""

    trial: optuna.Trial
    deployment: Deployment
    record: dict[str, Any]
    key: str
    load: float | None = None
    """The offered load it is evaluated at (None: the workload's own)."""
    first: int | None = None
    """Number of the earlier pending trial of the same deployment (evaluated once for both)."""


@dataclass
class _History:
    """The finished trials one loop knows, kept as they finish (never re-read per trial)."""

    trials: list[FrozenTrial] = field(default_factory=list)
    numbers: set[int] = field(default_factory=set)
    params: dict[int, dict[str, Any]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    """What the gate learns from (see `_seen`)."""
    simulated: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The first simulation of each deployment (by key)."""
    keys: dict[str, int] = field(default_factory=dict)
    """Point key -> the first trial of it, whatever its stage."""
    key_of: dict[int, str] = field(default_factory=dict)
    """Trial number -> its point key."""
    simulations: int = 0

    def add(self, trial: FrozenTrial) -> None:
        if trial.number in self.numbers or trial.state not in FINISHED or interrupted(trial):
            return  # running, or interrupted (retried, not part of the search)
        self.trials.append(trial)
        self.numbers.add(trial.number)
        self.params[trial.number] = trial.params
        for r in records([trial]):
            key = _key(r["deployment"], r.get("load"))
            self.keys.setdefault(key, trial.number)
            self.key_of[trial.number] = key
            fresh = r["stage"] == "simulated" and "reused" not in r
            if fresh and key not in self.simulated:
                # a screened estimate of a point now simulated teaches nothing more, and
                # is no longer a hope to simulate
                self.seen = [h for h in self.seen
                             if h.metrics is not None or self.key_of.get(h.number) != key]
            if r["stage"] != "screened_out" or key not in self.simulated:
                self.seen.extend(_seen([r]))
            if fresh:
                self.simulations += 1
                self.simulated.setdefault(key, r)


class Loop:
    """One search's loop over one study."""

    def __init__(self, config: SearchConfig, evaluate: Evaluate | None = None,
                 guard: Guard | None = None) -> None:
        self.config = config
        self.guard = guard or Guard()
        self.evaluate = evaluate or Simulator(config.workload)
        self.study = open_study(open_storage(config.storage), config.study_name(),
                                config.directions, make_sampler(config))
        warmup = min(8, config.trials // 10) if config.warmup is None else config.warmup
        fewest = config.objective == "gpus"  # the screen judges the SLOs only
        self.gate = Gate(config.slos, "slo" if fewest else config.objective,
                         slack=config.slack, margin=1.0 if fewest else config.margin,
                         warmup=warmup)
        self._evaluators: dict[float | None, Evaluate] = {None: self.evaluate}
        self.history = _History()
        self._screens: dict[tuple[bool, float | None], Screen] = {}
        self._enqueued: set[int] = set()
        self._deferred: dict[int, list[tuple[int, str]]] = {}
        """Pending trial number -> (number, deployment without redundant experts,
        `_unreplicated`) of the trials screened out this round as twins of it."""
        self._blocked: dict[int, list[tuple[int, str, dict[str, Any]]]] = {}
        """Pending trial number -> (number, layout, screen estimate) of the trials screened out
        this round because its estimate looked better (see `_unblock`)."""
        self._reasked: set[str] = set()
        """Point keys asked again after their blocker's simulation (once each)."""
        self._count = 0
        """Trials the study holds, as far as this loop knows."""
        self._waiting: set[int] = set()
        """Numbers below the budget of trials waiting to be asked (enqueued)."""
        self.simulations = 0
        """Evaluations this loop ran (reuses not counted)."""
        self.budget = config.trials
        """Trial numbers this loop may fill: the trials (and one more per interrupted trial),
        then the load sweep's on top."""
        self._sweeping = False
        self._capped = False
        """Whether `max_simulations` ended the rounds."""
        self.beats = Heartbeat(self.study._storage)
        """Keeps the trials of a round alive in the storage while they wait."""

    def close(self) -> None:
        """Stop the heartbeat thread."""
        self.beats.close()

    def run(self, progress: Progress | None = None, pool: LazyPool | None = None) -> None:
        """Run rounds until the study's budget of trials is taken (or `max_simulations`
        reached), evaluating on `pool` when given (once a round has two evaluations or more),
        else in this process; then wait for the trials other searches run within the budget
        (retrying those that go stale)."""
        while self._round(progress, pool) or self._others_running():
            pass

    def _others_running(self) -> bool:
        """Whether trials of the budget still run elsewhere (after a pause of WAIT_S)."""
        if self._capped or not any(
                t.number < self.budget for t in self.study.get_trials(
                    deepcopy=False, states=(TrialState.RUNNING,))):
            return False
        with self.guard.interruptible():
            time.sleep(WAIT_S)
        return True

    def sweep(self, progress: Progress | None = None, pool: LazyPool | None = None) -> None:
        """Simulate every load of `loads` for the best `curves` deployments found (the closest
        one when none meets the SLOs): each missing point is enqueued as a trial of the study
        (no screen), so the curves live in the study like the rest and a resumed search skips
        what is done; the best point of any curve may become the plan."""
        from planner.curves import curve_deployments
        from planner.plan import summarize

        self._sync()
        have = set(self.history.simulated)
        todo = []
        summary = summarize(records(self.history.trials), self.config.slos,
                            self.config.objective)
        for number in curve_deployments(summary, self.config.curves):
            params = self.history.params[number]
            deployment = dump_deployment(deployment_from_params(self.config.space, params))
            todo += [{**params, "load": load} for load in self.config.loads
                     if _key(deployment, load) not in have]
        self._run_enqueued(todo, {"curve": True, "fixed": True}, progress, pool)

    def refine(self, progress: Progress | None = None, pool: LazyPool | None = None) -> None:
        """Up to `refine` rounds of local search around the best plan: each enqueues the best's
        one-knob neighbours not simulated yet (at its load) as trials of the study, which are
        screened and simulated like the sampler's, so a resumed search skips what is done;
        the next round starts from the best plan then. TPE lands on different regions from
        seed to seed; a few steps downhill from where it stopped reach plans it missed.

        A round that finds nothing better is followed by a repair round: the neighbours of its
        near misses (`near_misses`: simulated plans that beat the best on the objective but
        miss an SLO), one more knob away from the best, which reach a better plan that needs
        two knobs moved together (a larger prefill step that brings the TTFT a smaller DP size
        cost back under its SLO, say). A round or repair that finds a better plan one knob away
        from where it started is walked on in that knob's direction (`_walk`) before the next
        round. The rounds stop once a round and its repair find nothing better or nothing
        new."""
        from planner.space import adjacent_points

        space = self.config.space
        attrs = {"fixed": True, "refine": True}
        for _ in range(self.config.refine):
            self._sync()
            start = self._best()
            if start is None or self._capped:
                return
            have = set(self.history.simulated)
            todo = self._unseen(adjacent_points(space, self.history.params[start],
                                                self._running(start)), have)
            if todo:
                self._run_enqueued(todo, attrs, progress, pool)
                self._sync()
                if (best := self._best()) != start:
                    if best is not None:
                        self._walk(start, best, attrs, progress, pool)
                    continue
            misses = near_misses(list(self.history.simulated.values()), start,
                                 self.config.objective, NEAR_MISSES)
            repair: list[dict[str, Any]] = []
            origin: dict[str, int] = {}  # a repair point's key -> the near miss it moves from
            for n in misses:
                for p in self._unseen(adjacent_points(space, self.history.params[n],
                                                      self._running(n)), have):
                    repair.append(p)
                    origin[self._point_key(p)] = n
            if not repair:
                return
            self._run_enqueued(repair, {**attrs, "repair": True}, progress, pool)
            self._sync()
            if (best := self._best()) == start:
                return
            came = None if best is None else origin.get(self.history.key_of.get(best, ""))
            if came is not None and best is not None:
                self._walk(came, best, attrs, progress, pool)

    def _walk(self, origin: int, best: int, attrs: dict[str, Any], progress: Progress | None,
              pool: LazyPool | None) -> None:
        """Pattern moves after a refinement round: while the one-knob move from trial `origin`
        to the best plan `best` keeps paying, take it again from the new best (`continued`),
        `WALK` steps at a time (simulated together, so two workers take two steps in the wall
        time of one), without a round of every neighbour at each step. A straight descent (one
        prefill instance fewer at a time, say) costs a simulation or two a step instead of a
        round of all the neighbours, and no refinement round. It stops at the first batch
        that finds nothing better, a move of several knobs (a twin asked again), a knob's end,
        or a point simulated before; the next round explores around where it stopped."""
        from planner.space import continued

        space = self.config.space
        have = set(self.history.simulated)
        before, after = self.history.params[origin], self.history.params[best]
        while True:
            steps: list[dict[str, Any]] = []
            a, b, running = before, after, self._running(best)
            while len(steps) < WALK and (step := continued(space, a, b, running)) is not None:
                steps.append(step)
                a, b, running = b, step, None
            if not steps or self._point_key(steps[0]) in have:
                return
            todo = self._unseen(steps, have)
            self._run_enqueued(todo, {**attrs, "walk": True}, progress, pool)
            self._sync()
            now = self._best()
            if now is None or now == best:
                return
            before, after, best = self.history.params[best], self.history.params[now], now

    def _point_key(self, params: dict[str, Any]) -> str:
        """The point key (`_key`) of trial params."""
        return _key(dump_deployment(deployment_from_params(self.config.space, params)),
                    params.get("load"))

    def _unseen(self, points: list[dict[str, Any]], have: set[str]) -> list[dict[str, Any]]:
        """`points` whose keys are not in `have` (added to it as they are taken), first of
        each key."""
        todo = []
        for params in points:
            if (key := self._point_key(params)) not in have:
                have.add(key)
                todo.append(params)
        return todo

    def _running(self, number: int) -> float | None:
        """The requests a decode rank of trial `number`'s point holds, as its screen estimated
        them (None unscreened)."""
        record = self.history.simulated.get(self.history.key_of.get(number, ""), {})
        held = (record.get("screen") or {}).get("decode_batch")
        return float(held) if isinstance(held, int | float) else None

    def _run_enqueued(self, todo: list[dict[str, Any]], attrs: dict[str, Any],
                      progress: Progress | None, pool: LazyPool | None) -> None:
        """Enqueue `todo` (trial params) as trials with `attrs` and run them all, past the
        budget of drawn trials (nothing when `todo` is empty)."""
        if not todo:
            return
        for params in todo:
            self.study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=False)
        self._sync()
        self.budget, self._sweeping = self._count, True
        try:
            self.run(progress, pool)
        finally:
            self._sweeping = False

    def _best(self) -> int | None:
        """The trial number of the best plan so far (None: no simulated plan meets the
        SLOs)."""
        from planner.plan import summarize

        best = summarize(records(self.history.trials), self.config.slos,
                         self.config.objective).best
        return None if best is None else int(best["number"])

    def _sync(self) -> None:
        """Read the study once, stale trials failed and retried first: trials other searches
        finished, and what is left to ask."""
        fail_stale(self.study)
        trials = self.study.get_trials(deepcopy=False)
        for t in trials:
            self.history.add(t)
        self._count = len(trials)
        if not self._sweeping:
            self.budget = self.config.trials + len(retried(trials))
        self._waiting = {t.number for t in trials
                         if t.state == TrialState.WAITING and t.number < self.budget}

    def _round(self, progress: Progress | None, pool: LazyPool | None) -> bool:
        """One round; False when nothing more is to be asked."""
        self._sync()
        cap, batch = self.config.max_simulations, self.config.batch
        pending: list[_Pending] = []
        trial: optuna.Trial | None = None
        more = True
        try:
            while (runs := sum(p.first is None for p in pending)) < batch:
                self.guard.check()
                if (cap is not None and not self._sweeping
                        and self.history.simulations + runs >= cap):
                    more, self._capped = False, True
                    break
                trial = self._ask()
                if trial is None:
                    more = False
                    break
                told = self._step(trial, pending)
                trial = None
                if told is not None:
                    self._told(told, progress)
            for told in self._evaluate(pending, pool):
                self._told(told, progress)
            self._near_twins(pending)
            self._unblock(pending)
        except BaseException as e:  # interrupted, or a worker died: leave no trial running,
            for t in [*(p.trial for p in pending), *([trial] if trial else [])]:
                told = self.study.tell(t, state=TrialState.FAIL, skip_if_finished=True)
                if interrupted(told):
                    retry(self.study, told)  # and ask it again when the search resumes
            if isinstance(e, BrokenProcessPool):
                raise RuntimeError(f"a search worker process died ({e})") from None
            raise
        finally:
            self.beats.release()
        # points the round's results asked again (`_near_twins`, `_unblock`) run next, within
        # the budget
        return (more or bool(self._waiting)) and not self._capped

    def _ask(self) -> optuna.Trial | None:
        """A trial within the budget, or None when the budget is taken (a trial asked beyond
        it, because another search took the last ones meanwhile, goes back to WAITING)."""
        if self._count >= self.budget and not self._waiting:
            return None
        with warnings.catch_warnings():  # the heartbeat is ours, not Study.optimize's
            warnings.filterwarnings("ignore", "Heartbeat of storage", UserWarning)
            trial = self.study.ask()
        self.beats.hold(trial._trial_id)
        self._waiting.discard(trial.number)
        self._count = max(self._count, trial.number + 1)
        if trial.number >= self.budget:
            # Trial ids are private in Optuna's Trial; the storage API needs one.
            self.study._storage.set_trial_state_values(trial._trial_id, TrialState.WAITING)
            self._waiting.clear()
            return None
        return trial

    def _told(self, trial: FrozenTrial, progress: Progress | None) -> None:
        self.beats.release(trial._trial_id)
        self.history.add(trial)
        if progress is not None:
            progress(len(self.history.trials), self.history.trials)

    def _step(self, trial: optuna.Trial, pending: list[_Pending]) -> FrozenTrial | None:
        """Take an asked trial as far as can be decided now: told (rejected, reused, screened
        out) or left pending in the round for an evaluation (None)."""
        deployment = suggest(trial, self.config.space)
        load = (float(trial.suggest_categorical("load", list(self.config.loads)))
                if self.config.loads else None)
        dumped = dump_deployment(deployment)
        moved: dict[str, Any] = {}
        if not trial.user_attrs.get("fixed"):  # drawn by the sampler, not enqueued by us
            deployment, dumped, load, moved = self._novel(trial, deployment, dumped, load,
                                                          pending)
        record: dict[str, Any] = {"deployment": dumped,
                                  "layout": "pd" if deployment.disaggregated else "aggregated",
                                  **moved}
        if load is not None:
            record["load"] = load
        curve = bool(trial.user_attrs.get("curve"))
        if curve:
            record["curve"] = True
        overhead = overhead_for(deployment)
        try:
            resolved = check(deployment, self.config.space, calibration_for(deployment),
                             overhead=overhead)
        except SpecError as e:
            return self._prune(trial, {**record, "stage": "rejected", "reason": str(e)},
                               REJECTED_VIOLATION)
        fewer = "" if curve else self._fewer_gpus(deployment.gpus_used)
        if fewer:
            return self._prune(trial, {**record, "stage": "rejected", "reason": fewer},
                               REJECTED_VIOLATION)
        key = _key(record["deployment"], load)
        earlier = self.history.simulated.get(key)
        if earlier is not None:
            record.update(stage="simulated", metrics=earlier["metrics"],
                          screen=earlier.get("screen"), reused=earlier["number"])
            return self._complete(trial, record)
        twin = next((p for p in pending if p.key == key and p.first is None), None)
        if twin is not None:
            record["screen"] = twin.record.get("screen")
            pending.append(_Pending(trial, deployment, record, key, load, twin.trial.number))
            return None
        if self.config.screen and not curve:
            estimate = {**self._screen(deployment.disaggregated, overhead, load)(resolved),
                        "gpus": resolved.gpus}
            record["screen"] = estimate
            same = next((p for p in pending if p.first is None and not p.record.get("curve")
                         and p.record["layout"] == record["layout"] and p.record.get("screen")
                         and self.gate.same_estimate(estimate, p.record["screen"])), None)
            if same is not None:  # simulated in this round: one simulation teaches enough
                self._deferred.setdefault(same.trial.number, []).append(
                    (trial.number, _unreplicated(dumped)))
                return self._prune(trial, {**record, "stage": "screened_out",
                                           "reason": f"screen: {TWIN} {same.trial.number}"},
                                   violation(estimate, self.config.slos))
            waiting = [Seen(p.trial.number, p.record["layout"], p.record.get("screen"))
                       for p in pending]
            decision = self.gate.decide(record["layout"], estimate,
                                        [*self.history.seen, *waiting])
            if not decision.simulate:
                blocker = decision.blocker
                if blocker is not None and any(blocker == p.trial.number for p in pending):
                    self._blocked.setdefault(blocker, []).append(
                        (trial.number, record["layout"], estimate))
                else:
                    self._enqueue(decision.blocker)
                value = objective_values(estimate, self.config.objective)[0]
                if len(self.config.directions) == 1:
                    trial.report(value, step=0)
                return self._prune(trial, {**record, "stage": "screened_out",
                                           "reason": decision.reason},
                                   violation(estimate, self.config.slos))
        pending.append(_Pending(trial, deployment, record, key, load))
        return None

    def _novel(self, trial: optuna.Trial, deployment: Deployment, dumped: dict[str, Any],
               load: float | None, pending: list[_Pending],
               ) -> tuple[Deployment, dict[str, Any], float | None, dict[str, Any]]:
        """The drawn point, or when it repeats one the search has (any stage, or pending in
        this round), the first point it has not among: its neighbours (one parameter changed;
        a changed DEP size keeps the instance count where it can and takes that size's first
        redundant-expert count), then up to `NOVEL_DRAWS` points drawn uniformly from the space
        — each list in an order seeded by the trial number. The trial's params stay as drawn;
        the record says which point it repeated and what changed. A point with nothing novel
        found stays. Returns the point's deployment, its plain data, its load and what the
        record says of the move."""
        waiting = {p.key: p.trial.number for p in pending}
        key = _key(dumped, load)
        first = self.history.keys.get(key, waiting.get(key))
        if first is None:
            return deployment, dumped, load, {}
        rng = random.Random(f"{self.config.seed}/{trial.number}")
        space, loads = self.config.space, self.config.loads
        candidates = _neighbours(space, trial.params, trial.distributions, rng)
        candidates += [_drawn(space, loads, rng) for _ in range(NOVEL_DRAWS)]
        for point in candidates:
            there = float(point["load"]) if "load" in point else load
            other = deployment_from_params(space, point)
            plain = dump_deployment(other)
            here = _key(plain, there)
            if here not in self.history.keys and here not in waiting:
                changed = {k: v for k, v in point.items() if trial.params.get(k) != v}
                return other, plain, there, {"repeats": first, "changed": changed}
        return deployment, dumped, load, {}

    def _near_twins(self, pending: list[_Pending]) -> None:
        """After a round: the twins screened out beside a point that then missed its SLOs
        narrowly (`Gate.near`) are asked again (up to `Gate.near_twins` in all), since what
        the screen cannot see may tip them over. Twins that differ from it in more than
        redundant experts go first: the simulations have shown those alone change nothing
        where twins came out alike (`Gate._outcomes`), while a batch limit the screen takes
        for unreached may bind."""
        for p in pending:
            twins = self._deferred.pop(p.trial.number, [])
            seen = next((h for h in self.history.seen if h.number == p.trial.number), None)
            if not twins or seen is None or not self.gate.near_miss(seen):
                continue
            mine = _unreplicated(p.record["deployment"])
            twins.sort(key=lambda twin: twin[1] == mine)
            for number, _ in twins[: self.gate.near_twins - 1]:
                self._enqueue(number)

    def _unblock(self, pending: list[_Pending]) -> None:
        """After a round: a point screened out because a point of this round looked better was
        judged against that point's estimate, not its simulation. Once the blocker is
        simulated, each point it kept out that the gate would now let through (the blocker
        missed an SLO, or came out below its estimate) is asked again, once: a refinement's
        neighbours are otherwise lost for good to a pending neighbour that disappoints."""
        for p in pending:
            for number, layout, estimate in self._blocked.pop(p.trial.number, []):
                key = self.history.key_of.get(number)
                if key is None or key in self._reasked or key in self.history.simulated:
                    continue
                if self.gate.decide(layout, estimate, self.history.seen).simulate:
                    self._reasked.add(key)
                    self._enqueue(number)

    def _fewer_gpus(self, gpus: int) -> str:
        """Objective gpus: why a point on `gpus` GPUs need not run ('' when it may)."""
        if self.config.objective != "gpus":
            return ""
        need = min((int(h.metrics.get("gpus") or 0) for h in self.history.seen
                    if h.feasible and h.metrics is not None), default=None)
        if need is None or gpus <= need:
            return ""
        return f"uses {gpus} GPUs but a feasible plan needs only {need}"

    def evaluator(self, load: float | None) -> Evaluate:
        """The evaluation at an offered load (None: the workload's own)."""
        if load not in self._evaluators:
            assert load is not None
            self._evaluators[load] = at_workload(self.evaluate,
                                                 at_load(self.config.workload, load))
        return self._evaluators[load]

    def _evaluate(self, pending: list[_Pending], pool: LazyPool | None) -> list[FrozenTrial]:
        """Evaluate the round's distinct deployments (on the pool when given) and tell every
        pending trial, in the order they were asked."""
        runs = [p for p in pending if p.first is None]
        with self.guard.interruptible():
            outcomes = evaluate_all([(self.evaluator(p.load), p.deployment) for p in runs],
                                    pool.for_tasks(len(runs)) if pool is not None else None)
        by_number = {p.trial.number: o for p, o in zip(runs, outcomes, strict=True)}
        told = []
        for p in pending:
            try:
                told.append(self._outcome(p, *by_number[p.trial.number if p.first is None
                                                         else p.first]))
            except Exception:
                frozen = self.study._storage.get_trial(p.trial._trial_id)
                if not interrupted(frozen):
                    raise
                told.append(frozen)  # taken for stale by another search: its retry runs
        return told

    def _outcome(self, p: _Pending, kind: str, value: Any) -> FrozenTrial:
        """Tell a pending trial its evaluation's outcome."""
        if kind == "rejected":
            return self._prune(p.trial, {**p.record, "stage": "rejected", "reason": value},
                               REJECTED_VIOLATION)
        if kind == "failed":
            p.trial.set_user_attr("record", _plain(
                {**p.record, "stage": "failed", "reason": value}))
            return self.study.tell(p.trial, state=TrialState.FAIL)
        record = {**p.record, "stage": "simulated", "metrics": value}
        if p.first is not None:
            record["reused"] = p.first
        else:
            self.simulations += 1
        return self._complete(p.trial, record)

    def _enqueue(self, number: int | None) -> None:
        """Ask again, next, for a screened point that keeps others out, so it is simulated."""
        if number is None or number in self._enqueued or number not in self.history.params:
            return
        if self.history.key_of.get(number) in self.history.simulated:
            return  # that point has been simulated meanwhile
        self._enqueued.add(number)
        self.study.enqueue_trial(self.history.params[number], user_attrs={"fixed": True},
                                 skip_if_exists=False)
        if self._sweeping:  # the refinement and the load sweep run every trial they enqueue
            self.budget += 1
        if self._count < self.budget:
            self._waiting.add(self._count)
        self._count += 1

    def _screen(self, disaggregated: bool, overhead: ServingOverhead,
                load: float | None) -> Screen:
        key = (disaggregated, load)
        if key not in self._screens:
            workload = self.config.workload if load is None else at_load(self.config.workload,
                                                                         load)
            self._screens[key] = Screen(workload, overhead)
        return self._screens[key]

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


NOVEL_DRAWS = 32
"""Uniform draws `Loop._novel` tries once a repeated point has no novel neighbour."""


def _neighbours(space: SearchSpace, params: dict[str, Any],
                dists: dict[str, optuna.distributions.BaseDistribution],
                rng: random.Random) -> list[dict[str, Any]]:
    """The points one parameter away from `params`, shuffled by `rng`."""
    out: list[dict[str, Any]] = []
    for name in sorted(params):
        d = dists[name]
        if isinstance(d, optuna.distributions.CategoricalDistribution):
            values: Sequence[Any] = d.choices
        elif isinstance(d, optuna.distributions.IntDistribution):
            values = range(d.low, d.high + 1)
        else:
            continue
        for v in values:
            if v == params[name] or name == "layout":
                continue
            point = {**params, name: v}
            if name.endswith("_dep"):  # the names that depend on the size, for the new size
                role, old = name[: -len("_dep")], params[name]
                low, high = space.instance_range(role, int(v))
                count = params.get(f"{role}_instances_dep{old}", low)
                point.setdefault(f"{role}_instances_dep{v}", min(max(count, low), high))
                point.setdefault(f"{role}_redundant_dep{v}", space.redundant[int(v)][0])
            out.append(point)
    rng.shuffle(out)
    return out


class _Uniform:
    """A trial double that draws every parameter uniformly (for `_drawn`)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.params: dict[str, Any] = {}

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        self.params[name] = self.rng.choice(list(choices))
        return self.params[name]

    def suggest_int(self, name: str, low: int, high: int) -> int:
        self.params[name] = self.rng.randint(low, high)
        return self.params[name]


def _drawn(space: SearchSpace, loads: tuple[float, ...], rng: random.Random) -> dict[str, Any]:
    """The params of one point drawn uniformly from the space (and its loads)."""
    trial = _Uniform(rng)
    suggest(trial, space)
    if loads:
        trial.suggest_categorical("load", loads)
    return trial.params


def evaluate_all(runs: Sequence[tuple[Evaluate, Deployment]],
                 pool: Executor | None) -> list[tuple[str, Any]]:
    """`_outcome` of each (evaluation, deployment), on the pool when given, in order."""
    if pool is None:
        return [_outcome(evaluate, d) for evaluate, d in runs]
    futures: list[Future[tuple[str, Any]]] = [pool.submit(_outcome, evaluate, d)
                                              for evaluate, d in runs]
    return [f.result() for f in futures]


def _outcome(evaluate: Evaluate, deployment: Deployment) -> tuple[str, Any]:
    """("simulated", metrics), ("rejected", reason) or ("failed", reason); runs in a worker
    process, so exceptions come back as plain data."""
    try:
        return "simulated", evaluate(deployment)
    except SpecError as e:
        return "rejected", str(e)
    except Exception as e:  # a simulator bug on one point should not end the search
        return "failed", f"{type(e).__name__}: {e}"


def _unreplicated(deployment: dict[str, Any]) -> str:
    """A deployment's plain data without its roles' redundant experts, as a key."""
    plain = {k: ({**v, "redundant_experts": 0} if k in get_args(Role) and isinstance(v, dict)
                 else v)
             for k, v in deployment.items()}
    return json.dumps(plain, sort_keys=True)


def _key(deployment: dict[str, Any], load: float | None = None) -> str:
    """A point's key: its deployment, and its load where the search sweeps one."""
    text = json.dumps(deployment, sort_keys=True)
    return text if load is None else f"{text} @ {load!r}"


def _plain(obj: Any) -> Any:
    """JSON-safe copy (numpy scalars to floats)."""
    return json.loads(json.dumps(obj, default=float))


def _seen(past: Sequence[dict[str, Any]]) -> list[Seen]:
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


def run_search(config: SearchConfig, evaluate: Evaluate | None = None,
               progress: Progress | None = None) -> optuna.Study:
    """Run the search until the study holds `config.trials` trials and return its study.

    With workers > 1 a round's evaluations run in that many spawned processes, started at the
    first round with two evaluations or more (`evaluate` must then be picklable); the trials
    are the same as with one.
    """
    if config.trials < 1:
        raise SpecError(f"--trials={config.trials} must be >= 1")
    if config.batch < 1:
        raise SpecError(f"--batch={config.batch} must be >= 1")
    if not 1 <= config.workers <= config.batch:
        raise SpecError(f"--workers={config.workers} must be between 1 and --batch="
                        f"{config.batch} (a round evaluates at most batch points at once)")
    if config.workload.mode != "serve":
        raise SpecError(f"search needs workload mode 'serve', not {config.workload.mode!r}")
    guard = Guard()
    with guard.installed():
        loop = Loop(config, evaluate, guard)
        pool, done = LazyPool(config.workers), False
        try:
            loop.run(progress, pool)
            loop.refine(progress, pool)
            if config.loads:
                loop.sweep(progress, pool)
            guard.check()
            done = True
        except KeyboardInterrupt:
            kept = len(records(finished(loop.study)))
            raise Interrupted(kept, redact(config.storage)) from None
        finally:
            loop.close()
            pool.stop(kill=not done)
    return loop.study
