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

import heapq
from collections.abc import Callable

import simpy

DONE_S = 1e-12
"""Service (seconds) below which a request's work counts as done (float residue)."""


class SharedServer:
    """One API server: `take` a request's serial work, `then` called when it is done.

    Every request in service gets 1/n of the server, so all of them have received the same
    service since any moment: the server keeps that service as a clock (`_served`, seconds of
    work each request in service has received since the start) and each request's finishing
    mark on it (its arrival's mark plus its work) in a heap. An arrival or a completion costs
    O(log n), so a burst of any size is cheap."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self._marks: list[tuple[float, int, Callable[[], None]]] = []
        """(finishing mark on the service clock, arrival number, then) per request in service:
        a heap, the next to finish first, ties in arrival order."""
        self._served = 0.0
        self._since = 0.0
        """When `_served` was last brought up to date."""
        self._arrivals = 0
        self._turn = 0
        """The pending completion's number: an arrival replaces it with a later one."""

    def take(self, work_s: float, then: Callable[[], None]) -> None:
        """Serve `work_s` seconds of work for a new request, sharing the server with the
        requests already in it; `then()` once it is done."""
        self._catch_up()
        self._arrivals += 1
        heapq.heappush(self._marks, (self._served + work_s, self._arrivals, then))
        self._plan()

    @property
    def busy(self) -> int:
        """Requests in service."""
        return len(self._marks)

    def _catch_up(self) -> None:
        """Move the service clock on by the time since the last update, shared equally."""
        now = self.env.now
        if self._marks:
            self._served += (now - self._since) / len(self._marks)
        self._since = now

    def _plan(self) -> None:
        """Schedule the next completion: the least work left, at 1/n of the server each."""
        self._turn += 1
        if not self._marks:
            return
        turn = self._turn
        wait = max(self._marks[0][0] - self._served, 0.0) * len(self._marks)
        self.env.timeout(wait).callbacks.append(lambda _: self._finish(turn))

    def _finish(self, turn: int) -> None:
        if turn != self._turn:  # an arrival since has planned a later completion
            return
        self._catch_up()
        done = []
        close = self._served + DONE_S + 1e-12 * self._served  # the clock's float residue
        while self._marks and self._marks[0][0] <= close:
            done.append(heapq.heappop(self._marks)[2])
        if not self._marks:  # a busy period ends: the clock starts again from 0
            self._served = 0.0
        self._plan()
        for then in done:
            then()
