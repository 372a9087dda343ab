"""Where a search keeps its trials, and what its study is called.

Storage URLs: an Optuna RDB URL (``sqlite:///runs/rackplan.db``, ``postgresql://...``) or
``journal:PATH`` for an append-only journal file (optuna's JournalStorage with a
JournalFileBackend) that processes on one file system share. The default is an SQLite file under
``runs/`` in the working directory, created when missing. A study's default name is derived from
everything that defines the search (model, hardware, GPUs, objective, and a hash of the space,
workload, SLOs and the predictor: rackplan's own sources and data and the versions of the
packages its numbers come from), so running the same search again with the same rackplan
resumes it, while another version of rackplan starts a study of its own instead of mixing its
predictions with the old ones.

A search that dies leaves its trials RUNNING. Every trial carries its owner (host and process
id), and the search keeps the trials it holds alive with a heartbeat (Optuna's own for RDB
storage, a trial system attribute for the journal). A running trial is stale once its owner on
this host is gone, or once it has not beaten for `GRACE_S` (its owner elsewhere);
`fail_stale` fails stale trials and enqueues their parameters again
(`RetryHeartbeatStaleTrialCallback`'s convention: the retry names them in ``retry_history``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import optuna
import sqlalchemy
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from planner.defaults import STORAGE
from simulator.calibration.cache import code_digest
from simulator.specs.errors import SpecError
from simulator.specs.paths import writable

Direction = Literal["maximize", "minimize"]
DEFAULT_STORAGE = STORAGE
"""SQLite file under runs/ in the working directory."""
SQLITE_TIMEOUT_S = 60
"""How long a process waits for another's write lock on an SQLite file."""
SCHEMA_ATTEMPTS = 5
"""Tries at opening a database whose tables another process is creating at the same moment."""
HEARTBEAT_S = 10
"""Seconds between two heartbeats of a trial a search holds (asked, not yet told)."""
GRACE_S = 60
"""A running trial that has not beaten for this long is taken for one a dead search left."""
CLOSE_S = 5
"""How long closing a search waits for a heartbeat being written."""
OWNER = "rackplan:owner"
"""Trial system attribute: the host and process id of the search that runs it."""
BEAT = "rackplan:heartbeat"
"""Trial system attribute of journal storage: the time of its last heartbeat (epoch seconds)."""
RETRIED = "retry_history"
"""System attribute of a retry: the numbers of the interrupted trials it repeats."""
StaleCallback = Callable[[optuna.Study, FrozenTrial], None]


def open_storage(url: str) -> BaseStorage:
    """The Optuna storage for `url` (parent folders of a file created); SpecError for a URL
    Optuna cannot open."""
    if url.startswith("journal:"):
        path = Path(url[len("journal:"):]).expanduser()
        if not path.name:
            raise SpecError(f"--storage {url!r} names no file; use journal:PATH")
        writable(path, "--storage").parent.mkdir(parents=True, exist_ok=True)
        return _Journal(JournalFileBackend(str(path)))
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite:///"):
        raw = url[len("sqlite:///"):]
        if not raw:
            raise SpecError(f"--storage {url!r} names no file; use sqlite:///PATH (or "
                            "sqlite:///:memory: for a study that is not kept)")
        path = Path(raw)
        if raw != ":memory:":
            writable(path, "--storage").parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    elif "://" not in url:
        raise SpecError(f"--storage {url!r} is not a storage URL; use sqlite:///PATH, another "
                        "Optuna RDB URL (postgresql://...), or journal:PATH")
    try:
        storage = _rdb_storage(url, engine_kwargs)
    except (ImportError, ValueError) as e:
        raise SpecError(f"--storage {redact(url)!r} cannot be opened: "
                        f"{str(e).splitlines()[0]}") from None
    except Exception as e:  # SQLAlchemy's own errors: bad dialect, unreachable server
        raise SpecError(f"--storage {redact(url)!r} cannot be opened: "
                        f"{type(e).__name__}: {str(e).splitlines()[0]}") from None
    if url.startswith("sqlite:"):
        _fast_sqlite(storage)
    return storage


def _rdb_storage(url: str, engine_kwargs: dict[str, Any]) -> RDBStorage:
    """RDBStorage, tried again when another process created the same tables at the same
    moment (searches started together on a new database)."""
    callback = ("heartbeat_stale_trial_callback"
                if "heartbeat_stale_trial_callback" in inspect.signature(RDBStorage).parameters
                else "failed_trial_callback")  # Optuna before 4.9
    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return _Rdb(url, engine_kwargs=engine_kwargs, heartbeat_interval=HEARTBEAT_S,
                            grace_period=GRACE_S, **{callback: retry})  # type: ignore[arg-type]
        except sqlalchemy.exc.SQLAlchemyError as e:
            text = str(e).lower()
            if attempt + 1 == SCHEMA_ATTEMPTS or not any(
                    s in text for s in ("already exists", "duplicate", "unique constraint")):
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _fast_sqlite(storage: RDBStorage) -> None:
    """Write-ahead logging without an fsync per commit: a trial makes ~20 small commits, which
    otherwise cost ~10 ms each. A crash may lose the last trials, never corrupt the file."""

    def pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    sqlalchemy.event.listen(storage.engine, "connect", pragmas)
    storage.engine.dispose()  # connections made so far lack the pragmas


def redact(url: str) -> str:
    """The URL with any password replaced by ***, for plans and logs."""
    if "://" in url and "@" in url.split("://", 1)[1]:
        scheme, rest = url.split("://", 1)
        cred, host = rest.rsplit("@", 1)
        user = cred.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}" if ":" in cred else url
    return url


PREDICTOR_PACKAGES = ("aiconfigurator-core", "numpy", "optuna", "simpy")
"""Packages whose versions move a search's answer (measured tables, arithmetic, the sampler,
the event loop)."""
PREDICTOR_CODE = ("simulator", "planner")
"""Folders whose sources and data (presets, fits) make the predictions and the search."""


@functools.cache
def predictor_digest() -> str:
    """A digest of what a search's numbers come from: the sources and data files under
    PREDICTOR_CODE and the versions of PREDICTOR_PACKAGES."""
    root = Path(__file__).resolve().parents[1]
    files = [p for folder in PREDICTOR_CODE for p in sorted((root / folder).rglob("*"))
             if p.suffix in (".py", ".json", ".yaml", ".csv", ".md") and p.is_file()]
    return code_digest(PREDICTOR_PACKAGES, files, root)[:16]


def study_name(model: str, hardware: str, gpus: int, objective: str,
               defining: dict[str, Any]) -> str:
    """``model-hardware-Ngpu-objective-HASH``, HASH over the rest of what defines the search."""
    text = json.dumps(defining, sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    stem = Path(model).stem if model.endswith(".json") else model
    return f"{stem}-{hardware}-{gpus}gpu-{objective}-{digest}"


def open_study(storage: BaseStorage, name: str, directions: list[Direction],
               sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
    """Create the study or load it to resume; SpecError when an existing study of that name
    optimizes a different number of objectives."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=storage, study_name=name, directions=directions,
                                sampler=sampler, load_if_exists=True)
    if len(study.directions) != len(directions):
        raise SpecError(f"study {name!r} already exists with {len(study.directions)} "
                        f"objective(s), not {len(directions)}; give another --study")
    return study


def owner() -> dict[str, Any]:
    """This process, as a trial's owner."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _gone(pid: int) -> bool:
    """Whether process `pid` of this host has ended (a zombie has)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] in (["Z"], ["X"])


def _orphaned(trial: FrozenTrial) -> bool:
    """Whether a running trial's owner ran on this host and is gone."""
    who = trial.system_attrs.get(OWNER)
    return (isinstance(who, dict) and who.get("host") == socket.gethostname()
            and isinstance(who.get("pid"), int) and _gone(who["pid"]))


def _silent(trial: FrozenTrial, beat: float | None) -> bool:
    """Whether a running trial's last sign of life (its heartbeat, else its start) is older
    than GRACE_S."""
    start = trial.datetime_start.timestamp() if trial.datetime_start else None
    last = max((t for t in (beat, start) if t is not None), default=None)
    return last is not None and time.time() - last > GRACE_S


def _owned(template: FrozenTrial | None) -> FrozenTrial:
    """The template of a trial asked by this process: running, owned by it."""
    if template is not None:
        return template
    return FrozenTrial(number=-1, state=TrialState.RUNNING, value=None,
                       datetime_start=datetime.now(), datetime_complete=None, params={},
                       distributions={}, user_attrs={}, system_attrs={OWNER: owner()},
                       intermediate_values={}, trial_id=-1)


def retry(study: optuna.Study, trial: FrozenTrial) -> None:
    """Enqueue an interrupted trial's parameters again (its owner and heartbeat left behind)."""
    kept = {k: v for k, v in trial.system_attrs.items() if k not in (OWNER, BEAT)}
    again = FrozenTrial(number=trial.number, state=trial.state, value=None,
                        datetime_start=trial.datetime_start, datetime_complete=None,
                        params=trial.params, distributions=trial.distributions,
                        user_attrs=trial.user_attrs, system_attrs=kept,
                        intermediate_values={}, trial_id=trial._trial_id)
    callback = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        (callback or optuna.storages.RetryFailedTrialCallback)()(study, again)


def retried(trials: Sequence[FrozenTrial]) -> set[int]:
    """Numbers of the interrupted trials that retries repeat."""
    return {n for t in trials for n in t.system_attrs.get(RETRIED, ())}


def fail_stale(study: optuna.Study) -> None:
    """Fail the study's stale trials and enqueue their parameters again."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


class _Rdb(RDBStorage):
    """RDB storage whose trials name their owner, and whose stale trials are also those of a
    gone owner and those that never beat and started over GRACE_S ago (Optuna's heartbeat
    judges only trials that beat)."""

    def _create_new_trial(self, study_id: int,
                          template_trial: FrozenTrial | None = None) -> FrozenTrial:
        return super()._create_new_trial(study_id, _owned(template_trial))

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Sequence[float] | None = None) -> bool:
        ok = super().set_trial_state_values(trial_id, state, values)
        if ok and state == TrialState.RUNNING:  # a waiting trial taken by this process
            self.set_trial_system_attr(trial_id, OWNER, owner())
        return ok

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        stale = set(super()._get_stale_trial_ids(study_id))
        running = self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
        if running:
            with self.engine.connect() as c:
                beating = {row[0] for row in c.execute(sqlalchemy.text(
                    "SELECT trial_id FROM trial_heartbeats"))}
            stale |= {t._trial_id for t in running if _orphaned(t) or (
                t._trial_id not in beating and _silent(t, None))}
        return sorted(stale)


class _Journal(JournalStorage, BaseHeartbeat):
    """Journal storage with the heartbeat Optuna gives RDB storage only: a trial's last beat
    is a system attribute (one journal line per held trial every HEARTBEAT_S)."""

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        return super().create_new_trial(study_id, _owned(template_trial))

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Sequence[float] | None = None) -> bool:
        ok = super().set_trial_state_values(trial_id, state, values)
        if ok and state == TrialState.RUNNING:
            self.set_trial_system_attr(trial_id, OWNER, owner())
        return ok

    def record_heartbeat(self, trial_id: int) -> None:
        self.set_trial_system_attr(trial_id, BEAT, time.time())

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        running = self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
        return [t._trial_id for t in running
                if _orphaned(t) or _silent(t, t.system_attrs.get(BEAT))]

    def get_heartbeat_interval(self) -> int:
        return HEARTBEAT_S

    def get_heartbeat_stale_trial_callback(self) -> StaleCallback:
        return retry

    get_failed_trial_callback = get_heartbeat_stale_trial_callback  # Optuna before 4.9


class Heartbeat:
    """Keeps the trials a search holds alive: a heartbeat for each every HEARTBEAT_S from a
    daemon thread, until it is released. None at once: a trial is alive for GRACE_S from its
    start, and most are told within milliseconds (rejected, screened out, reused)."""

    def __init__(self, storage: BaseStorage) -> None:
        self._storage = (storage if isinstance(storage, BaseHeartbeat)
                         and is_heartbeat_enabled(storage) else None)
        self._held: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, trial_id: int) -> None:
        if self._storage is None:
            return
        with self._lock:
            self._held.add(trial_id)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rackplan-heartbeat",
                                            daemon=True)
            self._thread.start()

    def release(self, trial_id: int | None = None) -> None:
        """Stop beating a trial (None: every trial)."""
        with self._lock:
            if trial_id is None:
                self._held.clear()
            else:
                self._held.discard(trial_id)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=CLOSE_S)  # a beat waiting on a busy database may stay
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with self._lock:
                held = sorted(self._held)
            for trial_id in held:
                self._beat(trial_id)

    def _beat(self, trial_id: int) -> None:
        assert self._storage is not None
        with contextlib.suppress(Exception):  # told meanwhile, or the database busy: the
            self._storage.record_heartbeat(trial_id)  # next beat will do
