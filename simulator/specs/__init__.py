"""Specs: model, hardware, topology, workload and deployment — plain validated data."""

from simulator.specs.deployment import Deployment, RoleSpec, check_against_model
from simulator.specs.errors import SpecError
from simulator.specs.hardware import HARDWARE, HardwareSpec, load_hardware
from simulator.specs.loading import dump_deployment, dump_workload, load_deployment, load_workload
from simulator.specs.model import ModelSpec, load_model, preset_names
from simulator.specs.topology import InstanceRequest, Placement, Topology
from simulator.specs.workload import Workload

__all__ = ["HARDWARE", "Deployment", "HardwareSpec", "InstanceRequest", "ModelSpec", "Placement",
           "RoleSpec", "SpecError", "Topology", "Workload", "check_against_model",
           "dump_deployment", "dump_workload", "load_deployment", "load_hardware", "load_model",
           "load_workload", "preset_names"]
