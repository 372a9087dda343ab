"""KV-cache space of an instance's DP ranks, and the time requests spend waiting for it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


class KvPool:
    """Tokens of KV cache per DP rank: capacity, what is reserved, and a wait meter.

    The meter integrates, over time, the number of requests queued on a rank while the rank
    refused the request at the head of its queue for lack of KV space: the total time requests
    waited for KV space.
    """

    def __init__(self, ranks: int, capacity: int, clock: Callable[[], float],
                 cost: Callable[[float], float] = float) -> None:
        self.capacity = int(capacity)
        """Tokens one rank holds."""
        self.cost = cost
        """Pool tokens a request of a given context takes (its context, for a model whose KV
        grows by the same bytes every token)."""
        self.used = np.zeros(ranks)
        """Pool tokens reserved per rank: what requests took when admitted."""
        self.grown = np.zeros(ranks)
        """Pool tokens per rank that admitted requests have added since, step by step
        (optimistic admission, `slots.KV_ADMISSION`; 0 where requests reserve their whole
        length)."""
        self.clock = clock
        self.wait_s = 0.0
        self._blocked = np.zeros(ranks, dtype=bool)
        self._waiting = np.zeros(ranks, dtype=np.int64)
        self._since = np.zeros(ranks)

    def fits(self, rank: int, tokens: float) -> bool:
        """Whether `tokens` more fit on `rank`; a request larger than a whole empty rank is let
        in alone rather than waiting forever."""
        used = self.used[rank] + self.grown[rank]
        return bool(used + self.cost(tokens) <= self.capacity or used == 0)

    def take(self, rank: int, tokens: float) -> float:
        """Reserve a request of `tokens` of context on `rank`; the pool tokens it takes."""
        taken = self.cost(tokens)
        self.used[rank] += taken
        return taken

    def give(self, rank: int, tokens: float) -> None:
        """Give back what `take` of a request of `tokens` reserved."""
        self.release(rank, self.cost(tokens))

    def release(self, rank: int, pool_tokens: float) -> None:
        """Give back `pool_tokens` reserved on `rank` (what `take` returned)."""
        self.used[rank] = max(self.used[rank] - pool_tokens, 0.0)

    def note(self, rank: int, blocked: bool, waiting: int) -> None:
        """After an admission attempt: whether the head was refused for KV, and the queue left."""
        now = self.clock()
        if self._blocked[rank]:
            self.wait_s += (now - self._since[rank]) * self._waiting[rank]
        self._blocked[rank], self._waiting[rank], self._since[rank] = blocked, waiting, now

    def use(self) -> float:
        """Share of the instance's KV space in use, over all ranks."""
        return self.use_of(self.used, self.grown)

    def over(self) -> np.ndarray:
        """The ranks holding more than they have (only optimistic admission gets there)."""
        out: np.ndarray = np.flatnonzero(self.used + self.grown > self.capacity)
        return out

    def use_of(self, used: np.ndarray, grown: np.ndarray) -> float:
        """`use` had the ranks reserved `used` and grown `grown` (`uses_of`'s arithmetic)."""
        return float(self.uses_of(used, grown[None])[0])

    def uses_of(self, used: np.ndarray, grown: np.ndarray) -> np.ndarray:
        """`use_of(used, row)` for each row of `grown`, in the same arithmetic."""
        out: np.ndarray = (used[None] + grown).sum(axis=1) / max(self.capacity * len(used), 1)
        return out
