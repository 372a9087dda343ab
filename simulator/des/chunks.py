"""Chunked prefill on an instance's DP ranks.

A request taken by the instance goes to the rank with the fewest outstanding prompt tokens and
waits in that rank's queue. Each step, every rank fills its token budget first-come
first-served: requests already started continue, then queued ones are admitted (when the
instance's `admit` callback finds KV space and a sequence slot) and get a chunk of what budget
is left, each at most `cap` tokens (vLLM's long-prefill threshold). A request's last chunk ends
its prefill.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class Chunking:
    """A request in its prefill on one rank."""

    rid: int
    remaining: int
    """Prompt tokens still to compute."""
    computed: int
    """Prompt tokens already in KV (cached prefix + earlier chunks)."""
    ref: int = -1
    """The instance's handle for the request (its decode slot in an aggregated instance)."""


@dataclass(frozen=True)
class ChunkPlan:
    """One step's prefill work: per-rank arrays and each rank's (entry, chunk) pairs."""

    tokens: np.ndarray
    requests: np.ndarray
    context: np.ndarray
    chunks: list[list[tuple[Chunking, int]]]


class ChunkScheduler:
    """Queues and running prefills of each rank."""

    def __init__(self, ranks: int, budget: int, max_seqs: int,
                 admit: Callable[[int, int], int | None], cap: int = 0) -> None:
        self.budget, self.max_seqs = budget, max_seqs
        self.cap = cap if cap > 0 else budget
        """Most tokens one request computes in a step (vLLM's long_prefill_token_threshold)."""
        self.admit = admit
        """admit(rank, rid) -> a handle when the request may start on the rank, else None."""
        self.queues: list[deque[tuple[int, int, int]]] = [deque() for _ in range(ranks)]
        """Per rank: (rid, uncached tokens, cached tokens) not started yet."""
        self.running: list[list[Chunking]] = [[] for _ in range(ranks)]
        self.outstanding = np.zeros(ranks)
        """Prompt tokens still to compute per rank, queued included."""
        self._requests = np.zeros(ranks, dtype=np.int64)
        """Requests per rank, queued or running (kept as they come and go)."""

    @property
    def ranks(self) -> int:
        return len(self.queues)

    def enqueue(self, rid: int, uncached: int, cached: int, rank: int | None = None,
                front: bool = False) -> int:
        """Queue a request on `rank` (default: the rank with the fewest outstanding tokens),
        at the back of its queue or, `front`, at its head (a preempted request, as vLLM puts
        it back); returns the rank."""
        if rank is None:
            rank = int(np.argmin(self.outstanding))
        if front:
            self.queues[rank].appendleft((rid, uncached, cached))
        else:
            self.queues[rank].append((rid, uncached, cached))
        self.outstanding[rank] += uncached
        self._requests[rank] += 1
        return rank

    def requests(self) -> np.ndarray:
        """Requests per rank, queued or running."""
        return self._requests.copy()

    def waiting(self) -> int:
        return sum(len(q) for q in self.queues)

    def has_work(self) -> bool:
        return any(self.running) or any(self.queues)

    def plan(self, budget: np.ndarray | None = None,
             seats: np.ndarray | None = None) -> ChunkPlan:
        """Chunks for one step within each rank's token `budget` and `seats` (defaults: the
        instance's max_num_batched_tokens and max_num_seqs)."""
        n = self.ranks
        tokens, reqs, ctx = np.zeros(n), np.zeros(n), np.zeros(n)
        chunks: list[list[tuple[Chunking, int]]] = [[] for _ in range(n)]
        for r in range(n):
            left = self.budget if budget is None else int(budget[r])
            room = self.max_seqs if seats is None else int(seats[r])
            running, queue = self.running[r], self.queues[r]
            while queue and len(running) < room and left > sum(
                    min(e.remaining, self.cap) for e in running):
                rid, uncached, cached = queue[0]
                ref = self.admit(r, rid)
                if ref is None:
                    break
                queue.popleft()
                running.append(Chunking(rid, uncached, cached, ref))
            for entry in running:
                if left <= 0:
                    break
                take = min(entry.remaining, left, self.cap)
                left -= take
                chunks[r].append((entry, take))
                tokens[r] += take
                ctx[r] += entry.computed
            reqs[r] = len(chunks[r])
        mean_ctx = np.divide(ctx, reqs, out=np.zeros(n), where=reqs > 0)
        return ChunkPlan(tokens, reqs, mean_ctx, chunks)

    def advance(self, plan: ChunkPlan) -> list[tuple[int, Chunking]]:
        """Apply a step's chunks; returns (rank, entry) of the prefills that completed."""
        done: list[tuple[int, Chunking]] = []
        for r, chunks in enumerate(plan.chunks):
            for entry, take in chunks:
                entry.remaining -= take
                entry.computed += take
                self.outstanding[r] -= take
                if entry.remaining <= 0:
                    done.append((r, entry))
                    self._requests[r] -= 1
            if chunks:
                self.running[r] = [e for e in self.running[r] if e.remaining > 0]
        return done
