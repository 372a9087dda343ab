"""KV-cache transfers from prefill to decode instances, sharing the links between them.

Transfers between one pair of instances share that pair's links (processor sharing): while `k`
are in flight, each moves at `Placement.transfer_gb_s(src, dst, k)`, and every start or finish
re-divides the rate.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

RateFn = Callable[[int], float]
"""GB/s one transfer gets while `k` transfers are in flight."""

BYTES_EPS = 1.0
"""Bytes left that count as done (covers the round-off of simulated clock arithmetic)."""


class KvLink:
    """The links from one prefill instance to one decode instance."""

    def __init__(self, env: simpy.Environment, rate: RateFn) -> None:
        self.env, self.rate = env, rate
        self._left: dict[int, float] = {}
        self._done: dict[int, simpy.Event] = {}
        self._count = 0
        self._wake = env.event()
        self.peak = 0
        """Most transfers in flight at once."""
        env.process(self._run())

    def send(self, nbytes: float) -> simpy.Event:
        """Start a transfer; the event fires when its bytes have arrived."""
        event = self.env.event()
        if nbytes <= 0:
            event.succeed()
            return event
        tid = self._count
        self._count += 1
        self._left[tid] = float(nbytes)
        self._done[tid] = event
        self.peak = max(self.peak, len(self._left))
        if not self._wake.triggered:
            self._wake.succeed()
        return event

    def _run(self) -> Generator[Any, Any, None]:
        while True:
            if not self._left:
                self._wake = self.env.event()
                yield self._wake
                continue
            bps = self.rate(len(self._left)) * 1e9
            start = self.env.now
            self._wake = self.env.event()
            yield self.env.timeout(min(self._left.values()) / bps) | self._wake
            self._drain((self.env.now - start) * bps)

    def _drain(self, moved: float) -> None:
        for tid in list(self._left):
            self._left[tid] -= moved
            if self._left[tid] <= BYTES_EPS:
                del self._left[tid]
                self._done.pop(tid).succeed()


class KvNetwork:
    """One `KvLink` per (prefill, decode) pair, made on first use."""

    def __init__(self, env: simpy.Environment, rate: Callable[[str, str, int], float]) -> None:
        self.env, self.rate = env, rate
        self.links: dict[tuple[str, str], KvLink] = {}
        self._rates: dict[tuple[str, str, int], float] = {}

    def send(self, src: str, dst: str, nbytes: float) -> simpy.Event:
        link = self.links.get((src, dst))
        if link is None:
            link = self.links[(src, dst)] = KvLink(self.env, lambda k: self._rate(src, dst, k))
        return link.send(nbytes)

    def _rate(self, src: str, dst: str, k: int) -> float:
        key = (src, dst, k)
        if key not in self._rates:
            self._rates[key] = self.rate(src, dst, k)
        return self._rates[key]
