"""What this machine's process table says about a local deployment's processes.

Every process the local backend starts carries RUN_VAR (the run's token) and INSTANCE_VAR (its
instance) in its environment, and so do the engine processes it forks. From /proc this module
answers: which live processes form a process group (`group_members`), which processes listen on
a TCP port (`listeners`), whether a process belongs to a run (`belongs`), and who holds a port
(`port_holder`, for the "port taken" refusal). Without /proc (not Linux) the answers are
coarser: a group is alive when signal 0 reaches it, and who listens on a port is unknown (None).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")
RUN_VAR = "RACKPLAN_RUN"
"""Environment variable holding the token of the run that started a process."""
INSTANCE_VAR = "RACKPLAN_INSTANCE"
"""Environment variable holding the instance (decode-0, proxy, ...) a process serves."""
LISTEN = "0A"
"""The TCP state LISTEN in /proc/net/tcp's `st` column."""


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    if not PROC.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to a process group; one that is gone (or not ours) is left alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def environment(pid: int) -> dict[str, str] | None:
    """The environment a process started with; None when it cannot be read (gone, another
    user's, or no /proc)."""
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def belongs(pid: int, run: str, instance: str | None = None) -> bool:
    """Whether a process was started by run `run` (and serves `instance`, when given)."""
    env = environment(pid)
    if env is None or env.get(RUN_VAR) != run:
        return False
    return instance is None or env.get(INSTANCE_VAR) == instance


def command(pid: int, width: int = 80) -> str:
    """A process's command line, shortened to `width` characters ('' when unreadable)."""
    try:
        words = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    text = " ".join(w.decode(errors="replace") for w in words if w)
    return text if len(text) <= width else text[:width - 3] + "..."


def listening_sockets(port: int) -> set[str] | None:
    """The sockets (as /proc/PID/fd links name them, 'socket:[INODE]') listening on TCP
    `port`, IPv4 or IPv6; None when this machine's process table cannot say (no /proc)."""
    found: set[str] = set()
    readable = False
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN and \
                    int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(f"socket:[{fields[9]}]")
    return found if readable else None


def holding(sockets: set[str], pids: Iterable[int] | None = None) -> set[int]:
    """Which of `pids` (default: every process this user can see; slow on a busy machine)
    hold one of `sockets` open."""
    if pids is None:
        pids = (int(e.name) for e in PROC.iterdir() if e.name.isdigit())
    out = set()
    for pid in pids:
        try:
            fds = list((PROC / str(pid) / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in sockets:
                    out.add(pid)
                    break
            except OSError:
                continue
    return out


def listeners(port: int) -> set[int] | None:
    """The processes listening on TCP `port`; None when the process table cannot say."""
    sockets = listening_sockets(port)
    if sockets is None:
        return None
    return holding(sockets) if sockets else set()


def port_free(port: int, host: str = "", reuse: bool = True) -> bool:
    """Whether a server could listen on `port` now, on `host` (default: every address, so a
    listener on any of them counts). Like servers, the probe sets SO_REUSEADDR (`reuse`): a
    closed connection's TIME_WAIT does not count as taken, a listening socket does."""
    with socket.socket() as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_holder(port: int) -> str:
    """Who holds a taken port, for an error message: 'pid 1234 (python -m http.server)', or
    'a process this user cannot see' when the process table does not say."""
    pids = listeners(port)
    if not pids:
        return "a process this user cannot see"
    pid = min(pids)
    cmd = command(pid)
    return f"pid {pid} ({cmd})" if cmd else f"pid {pid}"


def started(pid: int) -> int | None:
    """When a process started (clock ticks since boot, /proc/PID/stat field 22): with its pid,
    it names one process even after the pid is reused. None when unreadable."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[19]) if len(fields) > 19 else None


def alive(pid: int, start: int | None) -> bool:
    """Whether the process `pid` that started at `start` still runs (not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if not PROC.is_dir():
        return True
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    if stat[stat.rfind(")") + 2:].split()[0] in ("Z", "X"):
        return False
    return start is None or started(pid) == start
