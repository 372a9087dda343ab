"""A search survives kills: a SIGKILLed `rackplan search` leaves no worker process behind, and
running the same command again retries the trials it left running and ends with exactly the
asked number of finished trials; ^C with workers prints one line and exits 130. Below the
processes: stale trials (owner gone, or silent) are failed and asked again, and a ^C'd search
resumes to its budget."""

import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
import yaml

import planner.storage
from planner.search import Interrupted, SearchConfig, finished, records, run_search
from planner.space import build_space, suggest
from planner.storage import OWNER, open_storage, retried
from simulator.specs.workload import ClosedArrival, FixedLength, Workload
from tests.planner.fakes import Sleepy, constant

TRIALS = 40
KILL_AFTER = 4
"""Finished trials the first search holds when it is killed."""
DEADLINE_S = 300
"""How long to wait for anything a test waits for (generous: a loaded 2-core machine)."""
TrialState = optuna.trial.TrialState


def search_args(tmp_path: Path, storage: str) -> list[str]:
    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump({"arrival": {"kind": "closed", "concurrency": 8},
                                  "requests": 16, "input_tokens": {"kind": "fixed", "value": 512},
                                  "output_tokens": {"kind": "fixed", "value": 16}}))
    return [sys.executable, "-m", "planner.cli", "search", "--hardware", "h200", "--gpus", "16",
            "--workload", str(wl), "--slo", "tok_s_user_p50=1", "--trials", str(TRIALS),
            "--no-screen", "--batch", "4", "--workers", "2", "--storage", storage,
            "--refine", "0",  # the budget of trials alone: the rounds after it add their own
            "--out", str(tmp_path / "plan.yaml"), "--json"]


def url(tmp_path: Path, kind: str) -> str:
    return f"journal:{tmp_path}/study.log" if kind == "journal" else f"sqlite:///{tmp_path}/s.db"


def stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def children(pid: int) -> dict[int, str]:
    """Child processes of `pid`: pid -> start time (to tell a reused pid apart)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := stat(int(entry.name))) and fields[1] == str(pid):
            out[int(entry.name)] = fields[19]
    return out


def alive(pid: int, start: str) -> bool:
    """Whether that process still runs (a zombie has ended)."""
    fields = stat(pid)
    return fields is not None and fields[0] not in ("Z", "X") and fields[19] == start


def workers(pid: int) -> dict[int, str]:
    """The search's spawned worker processes."""
    out = {}
    for child, start in children(pid).items():
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"multiprocessing.spawn" in cmdline:
            out[child] = start
    return out


def wait_for(what: str, condition, deadline_s: float = DEADLINE_S):
    """Poll `condition` until it returns something true; fail after `deadline_s`."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = condition()
        if got:
            return got
        time.sleep(0.2)
    pytest.fail(f"waited {deadline_s} s for {what}")


def trials_of(storage: optuna.storages.BaseStorage) -> list[optuna.trial.FrozenTrial]:
    names = optuna.get_all_study_names(storage)
    if not names:
        return []
    study = optuna.load_study(study_name=names[0], storage=storage)
    return study.get_trials(deepcopy=False)


def start_search(tmp_path: Path, storage: str, **popen) -> tuple[subprocess.Popen[bytes],
                                                                   dict[int, str]]:
    """Start `rackplan search`, wait until its workers run and it holds KILL_AFTER finished
    trials; the process and every child it has then."""
    with (tmp_path / "first.err").open("wb") as err:
        proc = subprocess.Popen(search_args(tmp_path, storage), stdout=subprocess.DEVNULL,
                                stderr=err, **popen)

    def running() -> bool:
        assert proc.poll() is None, (tmp_path / "first.err").read_text()  # ended first
        return len(workers(proc.pid)) == 2

    wait_for("two workers", running)
    store = open_storage(storage)

    def some_finished() -> bool:
        running()
        return sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED)
                   for t in trials_of(store)) >= KILL_AFTER

    wait_for(f"{KILL_AFTER} finished trials", some_finished)
    return proc, children(proc.pid)


def assert_all_gone(processes: dict[int, str]) -> None:
    wait_for("the workers to end", lambda: not any(alive(p, s) for p, s in processes.items()))


def assert_the_budget_finished(storage: str) -> None:
    """No trial running, exactly TRIALS finished, and every failed one interrupted and asked
    again."""
    store = open_storage(storage)
    study = optuna.load_study(study_name=optuna.get_all_study_names(store)[0], storage=store)
    trials = study.get_trials(deepcopy=False)
    assert TrialState.RUNNING not in [t.state for t in trials]
    assert sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials) == TRIALS
    assert len(records(finished(study))) == TRIALS
    assert {t.number for t in trials if t.state == TrialState.FAIL} <= retried(trials)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_killed_search_leaves_no_worker_and_resumes_to_the_budget(tmp_path, kind):
    storage = url(tmp_path, kind)
    proc, kids = start_search(tmp_path, storage)
    assert len(kids) >= 2
    proc.kill()
    proc.wait(timeout=DEADLINE_S)
    assert_all_gone(kids)  # the workers (and multiprocessing's resource tracker) died with it
    again = subprocess.run(search_args(tmp_path, storage), capture_output=True, text=True,
                           timeout=DEADLINE_S)
    assert again.returncode == 0, again.stderr
    assert_the_budget_finished(storage)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_ctrl_c_with_workers_prints_one_line_and_keeps_the_trials(tmp_path):
    storage = url(tmp_path, "sqlite")
    proc, kids = start_search(tmp_path, storage, start_new_session=True)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: the whole process group
    assert proc.wait(timeout=DEADLINE_S) == 130
    assert_all_gone(kids)
    err = (tmp_path / "first.err").read_text()
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "interrupt" in line]
    assert len(lines) == 1, err
    m = re.fullmatch(r"rackplan: interrupted; (\d+) trials kept in (\S+), run the same command "
                     r"again to resume", lines[0])
    assert m and m[2] == storage, lines[0]
    trials = trials_of(open_storage(storage))
    assert TrialState.RUNNING not in [t.state for t in trials]
    assert int(m[1]) == sum("record" in t.user_attrs for t in trials) >= KILL_AFTER
    again = subprocess.run(search_args(tmp_path, storage), capture_output=True, text=True,
                           timeout=DEADLINE_S)
    assert again.returncode == 0, again.stderr
    assert_the_budget_finished(storage)


TINY = Workload(arrival=ClosedArrival(concurrency=8), requests=16,
                input_tokens=FixedLength(value=512), output_tokens=FixedLength(value=16))


def config(storage: str, trials: int) -> SearchConfig:
    space = build_space("deepseek-r1", "h200", 32, deps=(8, 16), max_num_seqs=(16, 32, 64, 128),
                        max_num_batched_tokens=(8192,), mtp_tokens=(0, 1),
                        all2all=("deepep_low_latency",))
    return SearchConfig(space=space, workload=TINY, trials=trials, seed=0, screen=False,
                        storage=storage, startup_trials=4, batch=2)


def left_running(cfg: SearchConfig, who: dict) -> optuna.trial.FrozenTrial:
    """A trial with drawn parameters left RUNNING by the search `who`."""
    store = open_storage(cfg.storage)
    study = optuna.load_study(study_name=cfg.study_name(), storage=store)
    trial = study.ask()
    suggest(trial, cfg.space)
    store.set_trial_system_attr(trial._trial_id, OWNER, who)
    return study.get_trials(deepcopy=False)[trial.number]


def assert_retried_to_the_budget(study: optuna.Study, lost: optuna.trial.FrozenTrial,
                                 trials: int) -> None:
    all_ = study.get_trials(deepcopy=False)
    assert all_[lost.number].state == TrialState.FAIL
    assert retried(all_) == {lost.number}
    again = next(t for t in all_ if lost.number in t.system_attrs.get("retry_history", ()))
    assert again.state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert again.params == lost.params  # the same point, asked again
    assert sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in all_) == trials
    assert len(records(finished(study))) == trials
    assert TrialState.RUNNING not in [t.state for t in all_]


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_trial_whose_search_is_gone_is_failed_and_asked_again(tmp_path, kind):
    cfg = config(url(tmp_path, kind), trials=4)
    run_search(cfg, evaluate=constant)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    lost = left_running(cfg, {"host": socket.gethostname(), "pid": int(gone.stdout)})
    bigger = dataclasses.replace(cfg, trials=8)
    assert_retried_to_the_budget(run_search(bigger, evaluate=constant), lost, 8)


def test_a_trial_killed_between_its_record_and_its_tell_is_asked_again_not_counted(tmp_path):
    """A SIGKILL can land after a trial's record is written and before it is told complete:
    the stale trial then fails holding a simulated record, and is still an interruption."""
    cfg = config(url(tmp_path, "sqlite"), trials=4)
    run_search(cfg, evaluate=constant)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    lost = left_running(cfg, {"host": socket.gethostname(), "pid": int(gone.stdout)})
    store = open_storage(cfg.storage)
    store.set_trial_user_attr(lost._trial_id, "record", {
        "deployment": {}, "layout": "pd", "stage": "simulated", "metrics": {}})
    bigger = dataclasses.replace(cfg, trials=8)
    assert_retried_to_the_budget(run_search(bigger, evaluate=constant), lost, 8)


def test_a_silent_trial_of_another_host_is_failed_and_asked_again(tmp_path, monkeypatch):
    cfg = config(url(tmp_path, "journal"), trials=4)
    run_search(cfg, evaluate=constant)
    lost = left_running(cfg, {"host": "another-host", "pid": os.getpid()})
    monkeypatch.setattr(planner.storage, "GRACE_S", 0.0)  # its last sign of life is too old
    bigger = dataclasses.replace(cfg, trials=8)
    assert_retried_to_the_budget(run_search(bigger, evaluate=constant), lost, 8)


class Interrupting:
    """`constant`, until the n-th evaluation: a ^C there."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self, d):
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        return constant(d)


def test_an_interrupted_search_keeps_its_trials_and_resumes_to_its_budget(tmp_path):
    cfg = config(url(tmp_path, "sqlite"), trials=10)
    with pytest.raises(Interrupted) as e:
        run_search(cfg, evaluate=Interrupting(5))
    store = open_storage(cfg.storage)
    study = optuna.load_study(study_name=cfg.study_name(), storage=store)
    trials = study.get_trials(deepcopy=False)
    assert e.value.kept == len(records(finished(study))) >= 4
    assert TrialState.RUNNING not in [t.state for t in trials]
    interrupted = {t.number for t in trials if t.state == TrialState.FAIL}
    assert interrupted and interrupted == retried(trials)
    study = run_search(cfg, evaluate=constant)
    trials = study.get_trials(deepcopy=False)
    assert sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials) == 10
    assert TrialState.RUNNING not in [t.state for t in trials]


def test_a_slow_trial_stays_alive_while_others_look_for_stale_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(planner.storage, "HEARTBEAT_S", 0.25)
    monkeypatch.setattr(planner.storage, "GRACE_S", 2.0)  # far shorter than an evaluation
    cfg = config(url(tmp_path, "journal"), trials=2)
    store = open_storage(cfg.storage)
    planner.storage.open_study(store, cfg.study_name(), cfg.directions)
    study = optuna.load_study(study_name=cfg.study_name(), storage=store)
    stop = threading.Event()

    def another_search() -> None:  # looks for stale trials, as a search sharing the study does
        while not stop.wait(0.1):
            planner.storage.fail_stale(study)

    looking = threading.Thread(target=another_search)
    looking.start()
    try:
        done = run_search(cfg, evaluate=Sleepy(4.0))
    finally:
        stop.set()
        looking.join()
    trials = done.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2


class TakenForStale:
    """`constant`; during the first evaluation another search takes the round's trials for
    stale: fails them and enqueues them again."""

    def __init__(self, storage: str, name: str) -> None:
        self.storage, self.name, self.calls = storage, name, 0

    def __call__(self, d):
        self.calls += 1
        if self.calls == 1:
            study = optuna.load_study(study_name=self.name, storage=open_storage(self.storage))
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
                planner.storage.retry(study, study._storage.get_trial(t._trial_id))
        return constant(d)


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_search_whose_trial_another_failed_goes_on_to_its_budget(tmp_path, kind):
    cfg = config(url(tmp_path, kind), trials=6)
    study = run_search(cfg, evaluate=TakenForStale(cfg.storage, cfg.study_name()))
    trials = study.get_trials(deepcopy=False)
    assert retried(trials)
    assert sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials) == 6
    assert TrialState.RUNNING not in [t.state for t in trials]
