"""Specs: model, hardware, topology, workload and deployment — plain validated data.

The names below are re-exported lazily (PEP 562): importing `simulator.specs.errors` for
`SpecError` does not load numpy, pydantic or networkx through this package."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulator.specs.deployment import Deployment, RoleSpec, check_against_model
    from simulator.specs.errors import SpecError
    from simulator.specs.hardware import HARDWARE, HardwareSpec, load_hardware
    from simulator.specs.loading import (
        dump_deployment,
        dump_workload,
        load_deployment,
        load_workload,
    )
    from simulator.specs.model import ModelSpec, load_model, preset_names
    from simulator.specs.topology import InstanceRequest, Placement, Topology
    from simulator.specs.workload import Workload

_HOME = {"Deployment": "deployment", "RoleSpec": "deployment",
         "check_against_model": "deployment", "SpecError": "errors", "HARDWARE": "hardware",
         "HardwareSpec": "hardware", "load_hardware": "hardware", "dump_deployment": "loading",
         "dump_workload": "loading", "load_deployment": "loading", "load_workload": "loading",
         "ModelSpec": "model", "load_model": "model", "preset_names": "model",
         "InstanceRequest": "topology", "Placement": "topology", "Topology": "topology",
         "Workload": "workload"}
"""Public name -> the module of this package that defines it."""

__all__ = ["HARDWARE", "Deployment", "HardwareSpec", "InstanceRequest", "ModelSpec", "Placement",
           "RoleSpec", "SpecError", "Topology", "Workload", "check_against_model",
           "dump_deployment", "dump_workload", "load_deployment", "load_hardware", "load_model",
           "load_workload", "preset_names"]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value
