"""Continuous batching of decode requests on an instance's DP ranks, as numpy slot arrays.

Each rank has `max_num_seqs` slots. A request routed to a rank waits in the rank's queue until a
slot is free and its KV space can be reserved, by one of the admission kinds of KV_ADMISSION:
"whole" reserves its whole context (prompt + all output) and holds it until it finishes, so no
request is preempted; "optimistic" reserves what it holds when admitted (its prompt) and grows
by what each step adds, and when a rank's KV runs out the requests admitted last give theirs
back (`preempt`) and compute it again later; "estimate" does the same, but admits a prompt
only where it fits beside a share of the outputs still to come. A reserved slot turns active
once its KV is in place (after the KV transfer in P/D, after the prompt in an aggregated
instance). One step advances every active slot of every rank at once.

A slot keeps the steps it has decoded, not its running totals: its generated tokens and context
are what it had when it turned active plus steps x `accepted`, so the same steps give the same
floats whether they are taken one at a time or as a run of identical steps (`advance(...,
steps=k)`; the engines' macro-steps).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from simulator.des.kvpool import KvPool

KV_ADMISSION: dict[str, str] = {"vllm": "optimistic", "sglang": "estimate", "trtllm": "whole"}
"""How an engine admits a request against its KV cache. vLLM's scheduler allocates KV blocks
for the tokens a step computes, not for a request's future output, and when a running request
cannot get its next block it preempts the running request admitted last (its blocks freed, put
back at the head of the waiting queue, recomputed when it resumes): "optimistic". TensorRT-LLM's
default capacity policy (GUARANTEED_NO_EVICT) reserves every request's whole length: "whole".
SGLang admits a request when its prompt fits beside an estimate of the output still to come, its
own and every running request's (SchedulePolicy's PrefillAdder: `new_token_ratio` x the output
left, each clipped at SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION), holds only what is computed, and
retracts the requests with the fewest outputs when decode runs out: "estimate", which grows and
preempts as "optimistic" does. Aggregated instances use it; P/D decode instances reserve the
whole (a preempted decode request would have to be prefilled again on the decode instance)."""

ESTIMATE_RATIO = 0.7
"""The share of the output left that "estimate" admission sets aside: SGLang's starting
`new_token_ratio` (SGLANG_INIT_NEW_TOKEN_RATIO, 0.7 x --schedule-conservativeness 1.0). SGLang
lowers it by a 600th of the way to 0.098 each decode step and sets it again from the outputs
decoded after a retraction; a constant is kept here (see docs/cost-model.md, "Memory")."""

ESTIMATE_CLIP = 4096
"""Output tokens left that "estimate" admission counts at most per request
(SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION)."""

ADMISSIONS = ("whole", "optimistic", "estimate")

_NONE = np.zeros(0, dtype=np.int64)
"""No request ids."""

DONE_EPS = 1e-6
"""Tolerance when comparing generated tokens (fractional with speculative decoding) to lengths."""


class DecodeSlots:
    """Slot arrays of shape (ranks, max_num_seqs)."""

    def __init__(self, ranks: int, max_seqs: int, kv: KvPool, accepted: float = 1.0,
                 admission: str = "whole") -> None:
        shape = (ranks, max_seqs)
        self.kv = kv
        self.accepted = accepted
        """Tokens an active slot gains per step (fractional: the expected MTP acceptance)."""
        if admission not in ADMISSIONS:
            raise ValueError(f"admission {admission!r}: one of {', '.join(ADMISSIONS)}")
        self.optimistic = admission != "whole"
        """Reserve what a request holds and grow it step by step (KV_ADMISSION)."""
        self.estimate = admission == "estimate"
        """Admit only beside an estimate of the outputs to come (KV_ADMISSION)."""
        self.admitted = np.zeros(shape)
        """When each slot was reserved, in admissions on its rank (the last ones go first)."""
        self._admissions = 0
        self.rid = np.full(shape, -1, dtype=np.int64)
        """Request id per slot; -1: free."""
        self.active = np.zeros(shape, dtype=bool)
        """Slot decodes this step."""
        self.fresh = np.zeros(shape, dtype=bool)
        """Active slot whose first decode step has not ended yet."""
        self.context0 = np.zeros(shape)
        """Context when the slot turned active (when reserved, until then)."""
        self.generated0 = np.zeros(shape)
        """Output tokens it had when it turned active (1 after an aggregated prefill)."""
        self.steps = np.zeros(shape)
        """Decode steps it has taken since (whole numbers)."""
        self.finish_at = np.zeros(shape)
        """Steps after which it has all its output: the least whole k with generated0 +
        k x accepted >= target - DONE_EPS (set when it turns active)."""
        self.target = np.zeros(shape)
        self.reserved = np.zeros(shape)
        """KV pool tokens each slot holds (the cost of its whole context; with optimistic
        admission, of its context so far), given back when it finishes."""
        self.held = np.zeros(ranks, dtype=np.int64)
        """Slots reserved per rank (active or not)."""
        self.queues: list[deque[tuple[int, float, float]]] = [deque() for _ in range(ranks)]
        """Per rank: (request id, context, output tokens) waiting for a slot."""
        self.queued = np.zeros(ranks, dtype=np.int64)
        """Requests per rank in `queues`."""
        self._waiting = 0
        """Requests in all `queues`."""
        self._free: list[list[int]] = [list(range(max_seqs - 1, -1, -1)) for _ in range(ranks)]

    @property
    def ranks(self) -> int:
        return len(self.queues)

    @property
    def generated(self) -> np.ndarray:
        """Output tokens per slot."""
        out: np.ndarray = self.generated0 + self.steps * self.accepted
        return out

    @property
    def context(self) -> np.ndarray:
        """Tokens in KV per slot."""
        out: np.ndarray = self.context0 + self.steps * self.accepted
        return out

    def requests(self) -> np.ndarray:
        """Requests per rank: reserved slots plus queued."""
        out: np.ndarray = self.held + self.queued
        return out

    def waiting(self) -> int:
        return self._waiting

    def enqueue(self, rank: int, rid: int, context: float, output: float) -> None:
        self.queues[rank].append((rid, context, output))
        self.queued[rank] += 1
        self._waiting += 1

    def reserve(self, rank: int, rid: int, context: float, output: float) -> int | None:
        """Hold a free slot of `rank` and KV for the whole context (optimistic and estimate
        admission: for `context`, estimate only where the outputs to come fit beside it); the
        slot, or None when either is lacking."""
        free = self._free[rank]
        need = context if self.optimistic else context + output
        if not free or not self.kv.fits(rank, need + self._to_come(rank, output)):
            return None
        slot = free.pop()
        taken = self.kv.take(rank, need)
        self.rid[rank, slot] = rid
        self.context0[rank, slot] = context
        self.generated0[rank, slot] = 0.0
        self.steps[rank, slot] = 0.0
        self.target[rank, slot] = output
        self.reserved[rank, slot] = taken  # given back as is
        self.held[rank] += 1
        self._admissions += 1
        self.admitted[rank, slot] = self._admissions
        return slot

    def _to_come(self, rank: int, output: float) -> float:
        """The KV "estimate" admission sets aside beside a new request's prompt: the ratio of
        its output and of the output the requests held on `rank` have still to make, each
        clipped (0 for the other admissions)."""
        if not self.estimate:
            return 0.0
        held = self.rid[rank] >= 0
        left = np.clip(self.target[rank][held] - self.generated[rank][held], 0.0, ESTIMATE_CLIP)
        return ESTIMATE_RATIO * (min(output, ESTIMATE_CLIP) + float(left.sum()))

    def admit(self, rank: int) -> list[tuple[int, int]]:
        """Reserve slots for queued requests of `rank`, in order, while slots and KV are free.
        Returns (request id, slot) of those admitted."""
        q = self.queues[rank]
        got: list[tuple[int, int]] = []
        while q and self._free[rank]:
            rid, context, output = q[0]
            slot = self.reserve(rank, rid, context, output)
            if slot is None:
                break
            q.popleft()
            self.queued[rank] -= 1
            self._waiting -= 1
            got.append((rid, slot))
        self.kv.note(rank, bool(q) and bool(self._free[rank]), len(q))
        return got

    def has_free(self, rank: int) -> bool:
        return bool(self._free[rank])

    def activate(self, rank: int, slot: int, generated: float = 0.0) -> None:
        """The slot's KV is in place: it decodes from the next step on."""
        self.active[rank, slot] = True
        self.fresh[rank, slot] = generated == 0.0
        self.generated0[rank, slot] = generated
        self.context0[rank, slot] += generated
        a, need = self.accepted, self.target[rank, slot] - DONE_EPS
        k = max(math.ceil((need - generated) / a), 0)  # then exact, in the arrays' arithmetic
        while k > 0 and generated + (k - 1) * a >= need:
            k -= 1
        while generated + k * a < need:
            k += 1
        self.finish_at[rank, slot] = k

    def batch(self) -> tuple[np.ndarray, np.ndarray]:
        """Decode requests per rank and their mean context."""
        n, ctx = self.run_batch(self.active, 1)
        return n, ctx[0]

    def run_batch(self, stepped: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Decode requests per rank of the slots of mask `stepped`, and their mean context in
        each of the next `steps` steps (shape (steps, ranks)): step i's is what `batch` gives
        after i steps of those slots."""
        n = stepped.sum(axis=1, dtype=float)
        base = self.context0.sum(axis=1, where=stepped)
        taken = self.steps.sum(axis=1, where=stepped)  # whole numbers: exact in any order
        later = taken + n * np.arange(steps, dtype=float)[:, None]
        ctx: np.ndarray = (base + self.accepted * later) / np.maximum(n, 1.0)  # none: 0 / 1
        return n, ctx

    def steps_to_finish(self, stepped: np.ndarray) -> int:
        """Steps of the slots of mask `stepped` until the first of them finishes (>= 1)."""
        left = np.min(self.finish_at - self.steps, where=stepped, initial=np.inf)
        return max(int(left) if left < np.inf else 1, 1)

    def remaining(self, stepped: np.ndarray | None = None, steps: int = 0) -> float:
        """Output tokens the instance's requests have still to generate, after `steps` more
        steps of the slots of mask `stepped`."""
        taken = self.steps if stepped is None or not steps else self.steps + steps * stepped
        left = self.target - (self.generated0 + taken * self.accepted)
        return float(np.where(self.rid >= 0, left, 0.0).sum())

    def advance(self, stepped: np.ndarray, fresh: np.ndarray | None,
                steps: int = 1) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """End `steps` steps in which the slots of mask `stepped` (the active ones when the
        steps were planned; slots activated since wait for the next step) each gained
        `accepted` tokens a step, and those of mask `fresh` got their first in the first step
        (None: none did). No slot may finish before the last of the steps.

        Returns the ids of requests whose first token came out of these steps, the ids of the
        requests that finished (their slots and KV are freed), and the ranks that freed slots.
        """
        a = stepped
        np.add(self.steps, steps, out=self.steps, where=a)
        if fresh is None:
            first = _NONE
        else:
            first = self.rid[fresh]
            self.fresh[fresh] = False
        done = a & (self.steps >= self.finish_at)
        finished = self.rid[done]
        ranks: list[int] = []
        if finished.size:
            self.kv.used -= np.where(done, self.reserved, 0.0).sum(axis=1)
            np.maximum(self.kv.used, 0.0, out=self.kv.used)
            freed = done.sum(axis=1)
            self.held -= freed
            for r, s in zip(*np.nonzero(done), strict=True):
                self._free[r].append(int(s))
            self.rid[done] = -1
            self.active[done] = False
            self.reserved[done] = 0.0
            ranks = [int(r) for r in np.flatnonzero(freed)]
        self._regrow()
        return first, finished, ranks

    def grown_after(self, stepped: np.ndarray, steps: int) -> np.ndarray:
        """Per rank, the pool tokens the held slots have added (optimistic admission) after
        `steps` more steps of the slots of mask `stepped`: each token a step adds takes one
        more (the marginal KV of a context past the model's windows, `KvPool.cost`). Worked
        out from the whole steps each slot has taken, so that k steps one at a time and k as
        one run give the same floats."""
        out: np.ndarray = self.grown_over(stepped, steps, 1)[0]
        return out

    def grown_over(self, stepped: np.ndarray, first: int, steps: int) -> np.ndarray:
        """`grown_after(stepped, k)` for k = first .. first + steps - 1, one row each."""
        k = np.arange(first, first + steps, dtype=float)[:, None, None]
        taken = self.steps[None] + k * stepped[None]
        out: np.ndarray = np.sum(taken * self.accepted, axis=2, where=(self.rid >= 0)[None])
        return out

    def _regrow(self) -> None:
        if self.optimistic:
            self.kv.grown[:] = self.grown_after(self.active, 0)

    def steps_to_full(self, stepped: np.ndarray) -> int | None:
        """With optimistic admission, steps of the slots of mask `stepped` that every rank's
        KV holds (>= 1: the step that overflows a rank is the last of a run); None: any."""
        if not self.optimistic:
            return None
        n = stepped.sum(axis=1) * self.accepted
        room = (self.kv.capacity - self.kv.used - self.kv.grown) / np.where(n > 0, n, 1.0)
        left = np.min(room, where=n > 0, initial=np.inf)
        if left == np.inf:
            return None
        k = max(int(left), 1)
        if left - int(left) > 1e-6:  # clear of a whole step: rounding cannot move the overflow
            return k
        while k > 1 and (self.kv.used + self.grown_after(stepped, k) > self.kv.capacity).any():
            k -= 1  # exact, in the arithmetic the overflow check uses
        return k

    def preempt(self, rank: int) -> list[tuple[int, float]]:
        """While `rank` holds more KV than it has, free the active slot admitted last (not
        the last one left): (request id, output tokens it had) of each, in that order."""
        out: list[tuple[int, float]] = []
        while self.kv.used[rank] + self.kv.grown[rank] > self.kv.capacity:
            live = self.active[rank]
            if live.sum() <= 1:
                break
            slot = int(np.argmax(np.where(live, self.admitted[rank], -1.0)))
            out.append((int(self.rid[rank, slot]), float(self.generated[rank, slot])))
            self.finish_now(rank, slot)
        return out

    def finish_now(self, rank: int, slot: int) -> None:
        """Free a slot whose request needs no decode step (one output token, made by prefill),
        or that `preempt` takes back."""
        self.kv.release(rank, self.reserved[rank, slot])
        self.held[rank] -= 1
        self._free[rank].append(slot)
        self.rid[rank, slot] = -1
        self.active[rank, slot] = False
        self.reserved[rank, slot] = 0.0
        self._regrow()
