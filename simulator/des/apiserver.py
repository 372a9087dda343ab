"""An API server's serial work, shared among the requests it holds.

A serving engine's API server is one process with one event loop (vLLM's, SGLang's and
TensorRT-LLM's OpenAI front ends alike): it parses, tokenizes and hands over each request, and
turns the engine's outputs into each request's stream, switching between the requests it holds
at every await. Its CPU time is therefore shared among them (processor sharing), not spent on
one request to the end before the next: n requests that arrive together each get 1/n of it and
finish together after n times their work, and a request arriving while another is served slows
it from then on. On the CPU closed loop the requests of a burst reach the engine within a
fraction of a millisecond of each other and take their first tokens in the same step
(docs/closed-loop.md), which a first-come-first-served server, spacing them one serial time
apart, does not do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import simpy

DONE_S = 1e-12
"""Work left (seconds) below which a request counts as served (float residue of the shares)."""


@dataclass
class _Job:
    left: float
    """Seconds of work left."""
    then: Callable[[], None]


class SharedServer:
    """One API server: `take` a request's serial work, `then` called when it is done."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self._jobs: list[_Job] = []
        """The requests in service."""
        self._since = 0.0
        """When their work left was last brought up to date."""
        self._turn = 0
        """The pending completion's number: an arrival replaces it with a later one."""

    def take(self, work_s: float, then: Callable[[], None]) -> None:
        """Serve `work_s` seconds of work for a new request, sharing the server with the
        requests already in it; `then()` once it is done."""
        self._catch_up()
        self._jobs.append(_Job(work_s, then))
        self._plan()

    @property
    def busy(self) -> int:
        """Requests in service."""
        return len(self._jobs)

    def _catch_up(self) -> None:
        """Take the time since the last update off every request's work, shared equally."""
        now = self.env.now
        if self._jobs:
            share = (now - self._since) / len(self._jobs)
            for job in self._jobs:
                job.left -= share
        self._since = now

    def _plan(self) -> None:
        """Schedule the next completion: the least work left, at 1/n of the server each."""
        self._turn += 1
        if not self._jobs:
            return
        turn = self._turn
        wait = max(min(job.left for job in self._jobs), 0.0) * len(self._jobs)
        self.env.timeout(wait).callbacks.append(lambda _: self._finish(turn))

    def _finish(self, turn: int) -> None:
        if turn != self._turn:  # an arrival since has planned a later completion
            return
        self._catch_up()
        done = [job for job in self._jobs if job.left <= DONE_S]
        self._jobs = [job for job in self._jobs if job.left > DONE_S]
        self._plan()
        for job in done:
            job.then()
