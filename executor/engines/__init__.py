"""The engines rackplan deploys, one table keyed by Deployment.engine.

A deployment may name any engine whose calibration tables price it (vllm, sglang, trtllm);
only those in ENGINES are rendered for a launch. Any other is refused by name, never rendered
as another engine's command.
"""

from __future__ import annotations

from executor.engines.base import Engine
from executor.engines.vllm import VllmEngine
from simulator.specs.deployment import Deployment
from simulator.specs.errors import SpecError

ENGINES: dict[str, type[Engine]] = {"vllm": VllmEngine}
"""Deployment.engine -> the engine that renders its processes."""


def engine_for(deployment: Deployment) -> Engine:
    """The engine that renders `deployment`; SpecError naming it when rackplan does not deploy
    that engine."""
    engine = ENGINES.get(deployment.engine)
    if engine is None:
        raise SpecError(f"deploying engine {deployment.engine!r} is not supported yet; rackplan "
                        f"deploys {', '.join(ENGINES)}")
    return engine()


__all__ = ["ENGINES", "Engine", "VllmEngine", "engine_for"]
