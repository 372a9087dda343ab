"""The run's request table: one row per request, numpy columns, ids from the run's counter."""

from __future__ import annotations

import numpy as np

from simulator.des.prefix_cache import BLOCK_TOKENS
from simulator.des.sessions import Runs
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
        self.blocks: list[Runs | None] = [None] * capacity
        """Runs of the ids of the prompt's prefix blocks (traces, sessions); None: no ids."""
        self.block_tokens = BLOCK_TOKENS
        """Tokens per block id of this run's traffic (the trace's block size)."""
        self.session = np.full(capacity, -1, dtype=np.int64)
        """Conversation the request belongs to (a session's agent), -1 for none: what
        session-affine routing pins."""
        self.tree = np.full(capacity, -1, dtype=np.int64)
        """Session tree (one replay of a trace), -1 for none."""
        self.depth = np.zeros(capacity, dtype=np.int64)
        """Turn index within its agent (0: the agent's first turn)."""
        self.warmup = np.zeros(capacity, dtype=bool)
        """Sent to prime the cache before the measured window; left out of every metric."""
        self.host_loaded = np.zeros(capacity, dtype=np.int64)
        """Prompt tokens loaded from the host-memory tier instead of computed."""

    def new(self, arrival: float, input_len: int, output_len: int,
            blocks: Runs | None = None) -> int:
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

    def measured(self) -> np.ndarray:
        """Mask of the requests that finished and count in the metrics (not warmup)."""
        return self.done() & ~self.warmup[: self.count]
