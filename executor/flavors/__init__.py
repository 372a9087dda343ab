"""Kubernetes flavors, one table of choices: the projects whose objects a deployment becomes."""

from __future__ import annotations

from executor.flavors.base import Flavor, Target, Wait
from executor.lazy import lazy_class

FLAVORS: dict[str, str] = {
    "llm-d": "executor.flavors.llm_d:LlmD",
    "dynamo": "executor.flavors.dynamo:Dynamo",
    "kserve": "executor.flavors.kserve:KServe",
}
"""`--flavor` name -> the class that renders it (imported when chosen)."""
DEFAULT_FLAVOR = "llm-d"


def flavor_class(name: str) -> type[Flavor]:
    """The class of flavor `name` (SpecError naming the valid flavors when there is none)."""
    flavor: type[Flavor] = lazy_class(FLAVORS, name, "flavor")
    return flavor


__all__ = ["DEFAULT_FLAVOR", "FLAVORS", "Flavor", "Target", "Wait", "flavor_class"]
