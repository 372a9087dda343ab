"""Kubernetes flavors, one table of choices: the projects whose objects a deployment becomes."""

from __future__ import annotations

import importlib

from executor.flavors.base import Flavor, Target, Wait
from simulator.specs.errors import SpecError

FLAVORS: dict[str, str] = {
    "llm-d": "executor.flavors.llm_d:LlmD",
    "dynamo": "executor.flavors.dynamo:Dynamo",
    "kserve": "executor.flavors.kserve:KServe",
}
"""`--flavor` name -> the class that renders it (imported when chosen)."""
DEFAULT_FLAVOR = "llm-d"


def flavor_class(name: str) -> type[Flavor]:
    """The class of flavor `name` (SpecError naming the valid flavors when there is none)."""
    if name not in FLAVORS:
        raise SpecError(f"unknown flavor {name!r}; valid flavors: {', '.join(FLAVORS)}")
    module, _, cls = FLAVORS[name].partition(":")
    flavor: type[Flavor] = getattr(importlib.import_module(module), cls)
    return flavor


__all__ = ["DEFAULT_FLAVOR", "FLAVORS", "Flavor", "Target", "Wait", "flavor_class"]
