"""The run's request table: one row per request, numpy columns, ids from the run's counter."""

from __future__ import annotations

import numpy as np

from simulator.specs.errors import SpecError


class RequestTable:
    """Every request of one run, as parallel numpy columns indexed by request id.

    Ids are handed out by `new` in submission order, from a counter this table (and so the run)
    owns. Times are simulated seconds; a time not reached yet is NaN.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise SpecError(f"a run needs at least one request, not {capacity}")
        self.capacity = capacity
        self.count = 0
        """Requests submitted so far; also the next id."""
        self.arrival = np.full(capacity, np.nan)
        self.input_len = np.zeros(capacity, dtype=np.int64)
        """Prompt tokens, cached prefix included."""
        self.cached = np.zeros(capacity, dtype=np.int64)
        """Prompt tokens served from the prefix cache (set when an instance takes the request)."""
        self.output_len = np.zeros(capacity, dtype=np.int64)
        self.prefill_done = np.full(capacity, np.nan)
        self.first_token = np.full(capacity, np.nan)
        self.finish = np.full(capacity, np.nan)
        self.blocks: list[tuple[int, ...] | None] = [None] * capacity
        """Ids of the prompt's 512-token prefix blocks (traces, sessions); None: no block ids."""

    def new(self, arrival: float, input_len: int, output_len: int,
            blocks: tuple[int, ...] | None = None) -> int:
        """Add one request and return its id."""
        if self.count >= self.capacity:
            raise SpecError(f"more than the {self.capacity} requests this run was sized for")
        rid = self.count
        self.count += 1
        self.arrival[rid] = arrival
        self.input_len[rid] = input_len
        self.output_len[rid] = output_len
        self.blocks[rid] = blocks
        return rid

    @property
    def uncached(self) -> np.ndarray:
        """Prompt tokens each request computes."""
        return self.input_len - self.cached

    def done(self) -> np.ndarray:
        """Mask of the requests that finished."""
        return ~np.isnan(self.finish[: self.count])
