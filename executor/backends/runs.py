"""A local deployment's run directory as the processes of another program see it.

`rackplan deploy --target local` writes, besides logs/, two files there: pids.json (one row per
started process group: instance, host, pid, pgid, port, log, run) and run.json (the run's token,
the deploying process's pid and start time, the watchdog's pid, the KV folder). From them,
without the process that launched the deployment:
- `stop_run` ends what is left: it asks a live deploying process to tear down (SIGTERM), then
  ends every process group that still has a member carrying the run's token (SIGTERM, then
  SIGKILL after the grace period), and removes the shared-storage KV folder;
- `status_rows` says, per process, whether it runs and whether its port answers /health.
The watchdog (executor/watchdog.py) calls `stop_run` when the deploying process dies, however
it dies. A group is ended only when one of its members carries the run's token, so a pid the
system reused for something else is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executor.backends.base import LaunchError, write_atomic
from executor.backends.procs import alive, belongs, group_members, signal_group

PIDS_FILE = "pids.json"
RUN_FILE = "run.json"
OWNER_EXIT_S = 60.0
"""Seconds `stop_run` gives a live deploying process to tear its deployment down itself."""
HEALTH_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Run:
    """What run.json and pids.json say about a local deployment."""

    run_dir: Path
    token: str
    owner: int | None
    """The deploying process (None when it was not recorded)."""
    owner_start: int | None
    kv_dir: Path | None
    """The shared-storage KV folder the run's processes write (inside run_dir), if any."""
    rows: list[dict[str, Any]]


def write_run(run_dir: Path, token: str, owner: int, owner_start: int | None,
              watchdog: int | None, kv_dir: Path | None) -> Path:
    """run.json: what `stop_run` and `status_rows` need besides pids.json."""
    body = {"run": token, "owner": owner, "owner_start": owner_start, "watchdog": watchdog,
            "kv_dir": str(kv_dir) if kv_dir is not None else None}
    return write_atomic(run_dir / RUN_FILE, json.dumps(body, indent=2) + "\n")


def read_run(run_dir: Path) -> Run:
    """The run recorded in `run_dir`; LaunchError when it is not a local deployment's."""
    run_dir = Path(run_dir)
    try:
        meta = json.loads((run_dir / RUN_FILE).read_text())
        rows = json.loads((run_dir / PIDS_FILE).read_text())
        token = meta["run"]
        if not isinstance(token, str) or not isinstance(rows, list) or not all(
                isinstance(r, dict) and isinstance(r.get("pgid"), int) for r in rows):
            raise ValueError("unexpected contents")
    except FileNotFoundError as e:
        raise LaunchError(f"{run_dir} holds no {Path(str(e.filename)).name}: it is not the run "
                          "directory of a local deployment (rackplan deploy --target local "
                          "--out DIR)") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LaunchError(f"{run_dir}'s {RUN_FILE}/{PIDS_FILE} cannot be read ({e}); end its "
                          "processes by hand") from None
    owner = meta.get("owner")
    start = meta.get("owner_start")
    kv = meta.get("kv_dir")
    return Run(run_dir, token, owner if isinstance(owner, int) else None,
               start if isinstance(start, int) else None,
               Path(kv) if isinstance(kv, str) else None, rows)


def ours(run: Run, row: dict[str, Any]) -> list[int]:
    """The live members of a row's process group that carry the run's token."""
    return [pid for pid in group_members(row["pgid"]) if belongs(pid, run.token)]


def end_groups(pgids: list[int], grace_s: float, wait: Callable[[], object] | None = None,
               ) -> None:
    """SIGTERM every group, SIGKILL what is left after `grace_s`, wait until each is gone (at
    most 10 s more). `wait` is called while waiting (to reap children)."""
    for pgid in pgids:
        signal_group(pgid, signal.SIGTERM)
    _wait_gone(pgids, grace_s, wait)
    for pgid in pgids:
        if group_members(pgid):
            signal_group(pgid, signal.SIGKILL)
    _wait_gone(pgids, 10.0, wait)


def _wait_gone(pgids: list[int], seconds: float, wait: Callable[[], object] | None) -> None:
    end = time.monotonic() + seconds
    while True:
        if wait is not None:
            wait()
        if not any(group_members(g) for g in pgids) or time.monotonic() >= end:
            return
        time.sleep(0.1)


def remove_kv(run: Run) -> bool:
    """Remove the run's shared-storage KV folder."""
    return run.kv_dir is not None and remove_inside(run.run_dir, run.kv_dir)


def remove_inside(run_dir: Path, folder: Path) -> bool:
    """Remove `folder` if it exists and lies inside `run_dir` (never anything outside it)."""
    if not folder.exists():
        return False
    try:
        folder.resolve().relative_to(Path(run_dir).resolve())
    except ValueError:
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def stop_run(run_dir: Path, grace_s: float, say: Callable[[str], object] = print,
             ask_owner: bool = True) -> int:
    """End what is left of the deployment in `run_dir`; returns how many process groups were
    ended. `say` gets one line per thing done."""
    run = read_run(run_dir)
    if ask_owner and run.owner is not None and alive(run.owner, run.owner_start):
        say(f"asking the deploying process (pid {run.owner}) to tear the deployment down")
        _terminate(run.owner)
        end = time.monotonic() + OWNER_EXIT_S + grace_s
        while alive(run.owner, run.owner_start) and time.monotonic() < end:
            time.sleep(0.2)
    left = [row for row in run.rows if ours(run, row)]
    for row in left:
        say(f"ending {row.get('instance', '?')} (process group {row['pgid']})")
    end_groups([row["pgid"] for row in left], grace_s)
    if remove_kv(run):
        say(f"removed the KV folder {run.kv_dir}")
    still = [row for row in run.rows if ours(run, row)]
    if still:
        raise LaunchError(f"{still[0].get('instance', '?')} (process group {still[0]['pgid']}) "
                          "is still running after SIGKILL")
    return len(left)


def _terminate(pid: int) -> None:
    """SIGTERM one process (the deploying process shares its shell's group: not the group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)


@dataclass(frozen=True)
class Status:
    """One process of a local deployment, now."""

    instance: str
    pid: int
    port: int | None
    running: bool
    answering: bool | None
    """Whether its port answered /health (None for a process without a port)."""


def status_rows(run_dir: Path) -> list[Status]:
    """Each recorded process: running (a member of its group carries the token) and answering
    (its port's /health said 200)."""
    run = read_run(run_dir)
    out = []
    for row in run.rows:
        port = row.get("port") if isinstance(row.get("port"), int) else None
        running = bool(ours(run, row))
        answering = None if port is None else running and health(port)
        out.append(Status(str(row.get("instance", "?")), int(row.get("pid", row["pgid"])), port,
                          running, answering))
    return out


def health(port: int, timeout_s: float = HEALTH_TIMEOUT_S, any_status: bool = False) -> bool:
    """Whether 127.0.0.1:`port` answers GET /health: with 200, or (`any_status`) at all."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout_s) as r:
            return bool(r.status == 200 or any_status)
    except urllib.error.HTTPError:
        return any_status
    except (OSError, ValueError):
        return False
