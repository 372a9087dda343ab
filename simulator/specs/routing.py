"""Router policies: one table, used by the simulator's routers and by the deployed P/D proxy.

A router sees, for every place a request could go (an instance, or one DP rank of one), a
`Candidate`: the work queued there and, for this request, how much of its prompt that place
already holds in its prefix cache. A policy turns candidates into a choice; what is simulated is
what the proxy runs. Units are the router's own: the simulator counts tokens, the proxy counts
what it can see of a prompt (characters of its text); a policy only compares candidates.

| policy             | picks                                                                    |
|--------------------|--------------------------------------------------------------------------|
| `prefix_aware`     | least (prompt not cached there + prompt work queued there): the prefill  |
|                    | terms of Dynamo's KV router, llm-d's precise-prefix-cache scorer with a  |
|                    | load scorer                                                              |
| `kv_router`        | least (prompt not cached there + prompt work queued there + KV held      |
|                    | there by requests in flight): Dynamo's KV router at its default weights  |
|                    | (prefill load scale 1, overlap credit 1, no per-request weight)          |
| `session_affinity` | where the request's session went before, while it is known; else as     |
|                    | `prefix_aware` (and the session is pinned there)                        |
| `least_tokens`     | least prompt work queued                                                 |
| `least_requests`   | fewest requests in flight (per DP rank: the report's decode choice)      |
| `round_robin`      | each candidate in turn (a baseline)                                      |

Ties go to the candidate listed first. A router also takes the candidates as columns
(`Candidates`, one array per field), which is how the simulator hands it every DP rank of every
instance at once; a policy's cost is the same expression over either form.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

RouterPolicy = Literal["prefix_aware", "kv_router", "session_affinity", "least_tokens",
                       "least_requests", "round_robin"]
"""Names a RoleSpec's `router` may take."""


@dataclass(frozen=True)
class Candidate:
    """One place a request could be routed to, as a router sees it at that moment."""

    queued_tokens: float = 0.0
    """Prompt work waiting or running there (tokens still to prefill, in the router's units)."""
    requests: float = 0.0
    """Requests in flight there."""
    cached_tokens: float = 0.0
    """Of this request's prompt, how much that place holds in its prefix cache."""
    prompt_tokens: float = 0.0
    """The request's prompt length (same units as cached_tokens)."""
    active_tokens: float = 0.0
    """KV held there by the requests in flight (their contexts so far), in the router's
    units: what Dynamo's router counts as a worker's active decode blocks."""

    @property
    def new_tokens(self) -> float:
        """Prompt this place would have to compute."""
        return max(self.prompt_tokens - self.cached_tokens, 0.0)


@dataclass(frozen=True)
class Candidates:
    """Candidates as columns: each field one value per candidate, in candidate order."""

    queued_tokens: np.ndarray
    requests: np.ndarray
    cached_tokens: np.ndarray
    prompt_tokens: float = 0.0
    """The request's prompt length, the same for every candidate."""
    active_tokens: np.ndarray | float = 0.0
    """KV held by the requests in flight, per candidate (0: not tracked)."""

    @property
    def new_tokens(self) -> np.ndarray:
        out: np.ndarray = np.maximum(self.prompt_tokens - self.cached_tokens, 0.0)
        return out

    def __len__(self) -> int:
        return len(self.queued_tokens)


@dataclass(frozen=True)
class Policy:
    """One row of the table."""

    name: str
    summary: str
    cost: Callable[[Any], tuple[Any, ...]] | None
    """Lexicographic cost of a candidate (least wins), written so that it also gives the
    columns of costs of `Candidates`; None for round-robin."""
    uses_prefix: bool = False
    """Needs each candidate's cached_tokens for the request (a prefix index)."""
    sticky: bool = False
    """Pins a session to the candidate it first went to."""
    uses_active: bool = False
    """Needs each candidate's active_tokens (the KV its requests in flight hold)."""


def _prefix_cost(c: Any) -> tuple[Any, ...]:
    return (c.new_tokens + c.queued_tokens, c.requests)


def _kv_cost(c: Any) -> tuple[Any, ...]:
    """Dynamo's KV router cost in tokens: its prefill term (the worker's prompt work plus this
    prompt, less what it holds) plus its decode term (the KV its requests in flight hold, plus
    this request's, the same everywhere and so left out)."""
    return (c.new_tokens + c.queued_tokens + c.active_tokens, c.requests)


POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("prefix_aware", "least (uncached prompt + queued prompt work)", _prefix_cost,
           uses_prefix=True),
    Policy("kv_router", "least (uncached prompt + queued prompt work + KV in flight)",
           _kv_cost, uses_prefix=True, uses_active=True),
    Policy("session_affinity", "the session's previous place, else prefix_aware",
           _prefix_cost, uses_prefix=True, sticky=True),
    Policy("least_tokens", "least queued prompt work",
           lambda c: (c.queued_tokens, c.requests)),
    Policy("least_requests", "fewest requests in flight",
           lambda c: (c.requests, c.queued_tokens)),
    Policy("round_robin", "each in turn", None),
)}
"""Policy name -> row; the keys are exactly RouterPolicy's names."""
assert set(POLICIES) == set(get_args(RouterPolicy))

DEFAULT_ROUTER: dict[str, RouterPolicy] = {
    "prefill": "prefix_aware",
    "decode": "least_requests",
    "aggregated": "prefix_aware",
}
"""Policy of each role when the deployment names none."""

SESSION_MEMORY = 65536
"""Sessions a sticky router remembers (least recently routed forgotten first), so that a
long-running proxy's memory stays bounded."""


def _least(cost: Callable[[Any], tuple[Any, ...]],
           candidates: Sequence[Candidate] | Candidates) -> int:
    """Index of the least cost, the first of equals: over columns in numpy (lexsort is
    stable), over a short list in Python."""
    if isinstance(candidates, Candidates):
        n = len(candidates)
        keys = [k if isinstance(k, np.ndarray) and k.shape == (n,) else np.full(n, k)
                for k in cost(candidates)]
        return int(np.lexsort(keys[::-1])[0])
    costs = [cost(c) for c in candidates]
    return costs.index(min(costs))


class Router:
    """A policy with its state (round-robin position, session pins)."""

    def __init__(self, policy: str) -> None:
        if policy not in POLICIES:
            raise ValueError(f"router policy {policy!r} is not one of "
                             f"{', '.join(POLICIES)}")
        self.policy = POLICIES[policy]
        self._next = 0
        self._pins: OrderedDict[Hashable, int] = OrderedDict()

    def pick(self, candidates: Sequence[Candidate] | Candidates,
             session: Hashable | None = None) -> int:
        """Index of the chosen candidate."""
        n = len(candidates)
        if n == 0:
            raise ValueError("a router needs at least one candidate")
        p = self.policy
        if p.sticky and session is not None:
            held = self._pins.get(session)
            if held is not None and held < n:
                self._pins.move_to_end(session)
                return held
        if p.cost is None:
            i = self._next % n
            self._next += 1
        else:
            i = _least(p.cost, candidates)
        if p.sticky and session is not None:
            self._pins[session] = i
            self._pins.move_to_end(session)
            while len(self._pins) > SESSION_MEMORY:
                self._pins.popitem(last=False)
        return i

    def forget(self, session: Hashable) -> None:
        """A session ended: drop its pin."""
        self._pins.pop(session, None)
