"""Routers: which instance of a role takes a request (the instance then picks its DP rank)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Routable(Protocol):
    """What a router reads of an instance."""

    def load_tokens(self) -> float:
        """Tokens outstanding on the instance."""
        ...

    def load_requests(self) -> float:
        """Requests on the instance's least-loaded DP rank."""
        ...


class Router:
    """Base: pick one of the role's instances (ties go to the first)."""

    def pick(self, instances: Sequence[Routable]) -> int:
        raise NotImplementedError


class LeastTokens(Router):
    """The instance with the fewest outstanding tokens."""

    def pick(self, instances: Sequence[Routable]) -> int:
        loads = [e.load_tokens() for e in instances]
        return loads.index(min(loads))


class LeastRequests(Router):
    """The instance whose least-loaded DP rank has the fewest requests."""

    def pick(self, instances: Sequence[Routable]) -> int:
        loads = [e.load_requests() for e in instances]
        return loads.index(min(loads))


class RoundRobin(Router):
    """Instances in turn."""

    def __init__(self) -> None:
        self._next = 0

    def pick(self, instances: Sequence[Routable]) -> int:
        i = self._next % len(instances)
        self._next += 1
        return i


ROUTERS: dict[str, type[Router]] = {
    "least_tokens": LeastTokens,
    "least_requests": LeastRequests,
    "round_robin": RoundRobin,
    "prefix_aware": LeastTokens,
    "session_affinity": LeastTokens,
}
"""RoleSpec.router_policy(role) -> router class."""
