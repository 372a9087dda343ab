"""A study on a real PostgreSQL server (started here in a temporary folder): a search's worker
processes, and two searches sharing one study as two machines would, finish exactly the budget
of trials, each number once, none left running."""

from __future__ import annotations

import glob
import multiprocessing
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from planner.objectives import SLO
from planner.search import FINISHED, SearchConfig, run_search
from planner.space import build_space
from planner.storage import open_storage
from simulator.specs.workload import ClosedArrival, FixedLength, Workload
from tests.planner.fakes import BatchTradeoff, Sleepy

TIMEOUT_S = 60
WORKLOAD = Workload(arrival=ClosedArrival(concurrency=8), requests=16,
                    input_tokens=FixedLength(value=512), output_tokens=FixedLength(value=16))


def postgres_bin() -> Path | None:
    """The folder of PostgreSQL's server binaries: from PATH, else Debian's
    /usr/lib/postgresql/<version>/bin (newest version)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    folders = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                     key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return Path(folders[-1]).parent if folders else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A URL to a new database on a server of our own, over a unix socket in a temporary
    folder; the server is stopped afterwards, whatever happened."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server binaries (initdb) on PATH or under "
                    "/usr/lib/postgresql/*/bin; `make postgres` installs Debian's package")
    folder = Path(tempfile.mkdtemp(prefix="rackplan-pg-"))
    prefix: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: the server runs as an unprivileged user
        user = next(u for u in ("postgres", "nobody") if _has_user(u))
        entry = pwd.getpwnam(user)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
        prefix = ["runuser", "-u", user, "--"]
    data, port = folder / "data", free_port()

    def pg(*args: str) -> None:
        subprocess.run([*prefix, *args], check=True, capture_output=True, timeout=TIMEOUT_S)

    started = False
    try:
        pg(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "rackplan",
           "--no-sync")
        pg(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-w",
           "-t", str(TIMEOUT_S), "-o", f"-k {folder} -p {port} -c listen_addresses=''",
           "start")
        started = True
        pg(str(bin_dir / "createdb"), "-h", str(folder), "-p", str(port), "-U", "rackplan",
           "study")
        yield f"postgresql+psycopg2://rackplan@/study?host={folder}&port={port}"
    finally:
        if started:
            pg(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def config(url: str, **kw: Any) -> SearchConfig:
    space = build_space("deepseek-r1", "h200", 32, deps=(8, 16), max_num_seqs=(16, 64, 256),
                        max_num_batched_tokens=(8192,), mtp_tokens=(0, 1),
                        all2all=("deepep_low_latency",))
    base: dict[str, Any] = dict(space=space, workload=WORKLOAD, storage=url, screen=False,
                                   startup_trials=8, slos=(SLO("tok_s_user_p90", 20.0),))
    return SearchConfig(**{**base, **kw})


def trials_of(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=open_storage(url))
    return study.get_trials(deepcopy=False)


def test_a_search_with_two_workers_on_postgresql(postgres_url):
    cfg = config(postgres_url, study="workers", trials=16, workers=2, batch=2)
    run_search(cfg, evaluate=BatchTradeoff())
    trials = trials_of(postgres_url, "workers")
    assert sorted(t.number for t in trials) == list(range(16))
    assert all(t.state in FINISHED and "record" in t.user_attrs for t in trials)


def search_in_a_process(cfg: SearchConfig, start: Any) -> None:
    start.wait()  # both searches begin together
    run_search(cfg, evaluate=Sleepy(0.02))


def test_two_searches_share_one_study_on_postgresql(postgres_url):
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=search_in_a_process,
                         args=(config(postgres_url, study="machines", trials=24, seed=s,
                                      batch=2), start)) for s in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=TIMEOUT_S)
    assert [p.exitcode for p in procs] == [0, 0]
    trials = trials_of(postgres_url, "machines")
    done = [t for t in trials if t.state in FINISHED]
    assert sorted(t.number for t in done) == list(range(24))
    assert all(t.state == optuna.trial.TrialState.WAITING for t in trials if t not in done)
