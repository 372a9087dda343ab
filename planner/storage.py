"""Where a search keeps its trials, and what its study is called.

Storage URLs: an Optuna RDB URL (``sqlite:///runs/rackplan.db``, ``postgresql://...``) or
``journal:PATH`` for an append-only journal file (optuna's JournalStorage with a
JournalFileBackend) that processes on one file system share. The default is an SQLite file under
``runs/`` in the working directory, created when missing. A study's default name is derived from
everything that defines the search (model, hardware, GPUs, objective, and a hash of the space,
workload and SLOs), so running the same search again resumes it.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Literal

import optuna
import sqlalchemy
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from planner.defaults import STORAGE
from simulator.specs.errors import SpecError
from simulator.specs.paths import writable

Direction = Literal["maximize", "minimize"]
DEFAULT_STORAGE = STORAGE
"""SQLite file under runs/ in the working directory."""
SQLITE_TIMEOUT_S = 60
"""How long a process waits for another's write lock on an SQLite file."""
SCHEMA_ATTEMPTS = 5
"""Tries at opening a database whose tables another process is creating at the same moment."""


def open_storage(url: str) -> BaseStorage:
    """The Optuna storage for `url` (parent folders of a file created); SpecError for a URL
    Optuna cannot open."""
    if url.startswith("journal:"):
        path = Path(url[len("journal:"):]).expanduser()
        if not path.name:
            raise SpecError(f"--storage {url!r} names no file; use journal:PATH")
        writable(path, "--storage").parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):])
        if str(path) not in ("", ":memory:"):
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
    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            return RDBStorage(url, engine_kwargs=engine_kwargs)
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
