"""What an engine gives the renderer: its rules, the flags of a role, a host's environment.

The renderer (executor/render.py) places instances on hosts and splits their data-parallel
ranks; the engine says what each of those processes runs. A backend never sees the engine, only
the launch records it filled in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from executor.records import Flag
from simulator.specs.deployment import Deployment, RoleSpec


class Engine(ABC):
    """One serving engine rackplan deploys."""

    name: ClassVar[str]
    """The Deployment.engine value that picks it."""
    launcher: ClassVar[tuple[str, ...]]
    """Its command before the model (`vllm serve`)."""

    @abstractmethod
    def check(self, deployment: Deployment) -> None:
        """Raise SpecError, one sentence, where the deployment breaks a rule of this engine."""

    @abstractmethod
    def role_flags(self, deployment: Deployment, role_name: str, role: RoleSpec, *,
                   kv_dir: str, max_model_len: int) -> tuple[Flag, ...]:
        """The flags every host of an instance of this role gets, besides its parallelism and
        port. `kv_dir` and `max_model_len` matter on the cpu hardware only."""

    @abstractmethod
    def env(self, deployment: Deployment, role_name: str, host: str,
            instance: int) -> dict[str, str]:
        """The environment of a process on `host` of the deployment's `instance`-th instance
        (counted over every role)."""
