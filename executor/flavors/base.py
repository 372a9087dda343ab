"""The interface of a Kubernetes flavor: a rendered deployment as one project's objects.

A flavor gets a `Target` (the deployment's name, its roles as a cluster launches them, the model
the pods serve, the pod settings from the deploy flags and the routing chosen) and answers
`objects()` (every manifest, in apply order) and `waits()` (what `kubectl wait` must see before
the deployment serves: `resource/name` and its condition). Pieces the flavors share (the fabric,
the model volume, probes, resources) are executor/backends/k8s_pod.py's; routing is
executor/backends/k8s_router.py's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from executor.backends.k8s_pod import PodSettings
from executor.backends.layout import RoleLayout
from executor.records import Rendered


@dataclass(frozen=True)
class Target:
    """What every flavor renders from."""

    app: str
    """The deployment's name: the prefix of every object's name."""
    rendered: Rendered
    layouts: tuple[RoleLayout, ...]
    model: str
    """What the pods serve: a Hugging Face id or a path on the model volume."""
    settings: PodSettings
    routing: str | None
    """The `--routing` choice (executor/backends/k8s_router.py's ROUTINGS); None for a flavor
    that routes through its own frontend."""
    gateway: str = "inference-gateway"
    """The Gateway an InferencePool's HTTPRoute hangs from (`--gateway`)."""

    def labels(self, component: str | None = None) -> dict[str, str]:
        out = {"app.kubernetes.io/name": "rackplan", "app.kubernetes.io/instance": self.app}
        if component is not None:
            out["app.kubernetes.io/component"] = component
        return out


@dataclass(frozen=True)
class Wait:
    """One thing `kubectl wait` waits for."""

    resource: str
    """kind/name, e.g. leaderworkerset/dsv3-decode."""
    condition: str
    """e.g. Available, Ready."""
    what: str
    """For people: which part of the deployment it is."""


class Flavor(ABC):
    """A deployment as the objects of one serving project."""

    name: ClassVar[str]
    routings: ClassVar[tuple[str, ...]] = ()
    """The routings this flavor can put in front of its pods, the default first; none for a
    flavor with its own frontend."""

    def __init__(self, target: Target) -> None:
        self.target = target

    @abstractmethod
    def objects(self) -> list[dict[str, Any]]:
        """Every object, in apply order."""

    @abstractmethod
    def waits(self) -> list[Wait]:
        """What must be ready before a completion is tried."""

    @property
    @abstractmethod
    def url(self) -> str:
        """Where clients inside the cluster reach the deployment."""

    @property
    @abstractmethod
    def probe_in(self) -> tuple[tuple[str, ...], str] | None:
        """Where the readiness completion is sent from and to: the `kubectl exec` target
        (`deployment/NAME`, or `pod/NAME -c CONTAINER`) and the URL inside it; None when the
        waited-for condition already says the deployment serves."""
