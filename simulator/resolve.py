"""A deployment resolved into what the cost model and the simulator run on.

Loads the model and hardware, applies vLLM's rules and the memory check, places every instance on
the topology, and builds the cost-model view of each role.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.calibration import Calibration, load_calibration
from simulator.calibration.serving import ServingOverhead
from simulator.cost.memory import RankMemory, check_memory
from simulator.cost.step import Instance, instance_from_role
from simulator.specs.deployment import Deployment, RoleSpec, check_against_model
from simulator.specs.hardware import HardwareSpec, load_hardware
from simulator.specs.model import ModelSpec, load_model
from simulator.specs.topology import InstanceRequest, Placement, Topology


@dataclass(frozen=True)
class ResolvedRole:
    """One role of a deployment, ready to price."""

    name: str
    """prefill, decode or aggregated."""
    spec: RoleSpec
    instance: Instance
    """Cost-model view of one of the role's instances (they are identical)."""
    memory: RankMemory
    instance_names: tuple[str, ...]
    """Names placed on the topology, e.g. prefill-0, prefill-1."""


@dataclass(frozen=True)
class Resolved:
    """A checked, placed deployment."""

    deployment: Deployment
    model: ModelSpec
    hardware: HardwareSpec
    placement: Placement
    roles: dict[str, ResolvedRole]
    calibration: Calibration

    @property
    def gpus(self) -> int:
        return self.deployment.gpus or self.deployment.gpus_used


def resolve(deployment: Deployment, calibration: Calibration | None = None,
            overhead: ServingOverhead | None = None) -> Resolved:
    """Check `deployment` against its model, memory and topology; SpecError when it cannot run.
    `overhead`: the serving latencies whose step costs the instances carry (None: the cost
    model's default step overhead)."""
    model = load_model(deployment.model)
    hardware = load_hardware(deployment.hardware, deployment.usd_per_gpu_hour)
    check_against_model(deployment, model)
    weights, kv = deployment.precision.weights, deployment.precision.kv_cache
    indexer = deployment.precision.indexer_cache
    memory = {name: check_memory(name, model, hardware, role, weights, kv, indexer=indexer,
                                 engine=deployment.engine)
              for name, role in deployment.roles.items()}
    names = {name: tuple(f"{name}-{i}" for i in range(role.instances))
             for name, role in deployment.roles.items()}
    topology = Topology.build(hardware, deployment.gpus or deployment.gpus_used)
    placement = topology.place([InstanceRequest(n, role.ranks)
                                for name, role in deployment.roles.items() for n in names[name]])
    cal = calibration or load_calibration(hardware, deployment.engine, deployment.engine_version)
    step_ms = None if overhead is None else overhead.step_overhead_ms
    per_seq_ms = 0.0 if overhead is None else overhead.step_overhead_per_seq_ms
    per_layer_ms = 0.0 if overhead is None else overhead.step_overhead_per_layer_ms
    roles = {
        name: ResolvedRole(
            name=name, spec=role,
            instance=instance_from_role(model, hardware, name, role, weights, kv,
                                        a2a_gb_s=placement.all_to_all_gb_s(names[name][0]),
                                        overhead_ms=step_ms, indexer_cache=indexer,
                                        overhead_per_seq_ms=per_seq_ms,
                                        overhead_per_layer_ms=per_layer_ms),
            memory=memory[name], instance_names=names[name])
        for name, role in deployment.roles.items()
    }
    return Resolved(deployment, model, hardware, placement, roles, cal)
