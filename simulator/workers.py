"""Worker processes that die with their parent and leave ^C to it.

A search's rounds and `rackplan validate`'s rows are spread over `worker_pool(n)`: spawned
processes that ignore SIGINT (a ^C at a terminal reaches the whole process group; the parent
answers it, once) and die with the process that started them, however it dies — at once on
Linux (PR_SET_PDEATHSIG), elsewhere within a second (a thread watching the parent's id).
`stop_pool(pool, kill=True)` ends an interrupted pool without waiting for its tasks.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal a process gets when the thread that started it exits."""


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """`workers` spawned processes for the rounds' evaluations. They ignore SIGINT (a ^C at a
    terminal reaches the whole process group; the search answers it, once) and die with this
    process: they are started here, SIGINT blocked meanwhile — a mask they inherit, so not even
    their start-up sees one; a ^C here waits until they are started."""
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_start, initargs=(os.getpid(),))
    mask = hasattr(signal, "pthread_sigmask")
    if mask:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for _ in range(workers):  # a process each: none is idle yet to take a task
            pool.submit(os.getpid)
    finally:
        if mask:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return pool


class LazyPool:
    """`worker_pool(workers)`, started only when a batch of two tasks or more asks for it: until
    then (or with one worker) tasks run in the asking process, so that a small search pays no
    process start-up (about a second each)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.pool: ProcessPoolExecutor | None = None

    def for_tasks(self, tasks: int) -> ProcessPoolExecutor | None:
        """The pool to run `tasks` tasks on, started now if need be; None: run them here."""
        if self.pool is None and (self.workers < 2 or tasks < 2):
            return None
        if self.pool is None:
            self.pool = worker_pool(self.workers)
        return self.pool

    def stop(self, kill: bool = False) -> None:
        """`stop_pool` of the pool, if it was started."""
        if self.pool is not None:
            pool, self.pool = self.pool, None
            stop_pool(pool, kill)


def stop_pool(pool: ProcessPoolExecutor, kill: bool = False) -> None:
    """Shut the pool down; with `kill` (the search was interrupted) its processes are killed
    first, their evaluations not awaited."""
    if kill:
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            if process.is_alive():
                process.kill()
    pool.shutdown(wait=True, cancel_futures=True)


def _worker_start(parent: int) -> None:
    """A worker's set-up: SIGINT ignored, and death with the parent — at once on Linux
    (PR_SET_PDEATHSIG), elsewhere within a second (a thread watching the parent's id)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before that took hold
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="rackplan-parent",
                     daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)
