"""What every Kubernetes flavor's engine pods share: the fabric, the model volume, probes,
resources, and manifests as YAML.

The fabric comes from the hardware: GPUs whose NVLink domain spans hosts (GB200, GB300 NVL72)
talk over multi-node NVLink, which needs NCCL's MNNVL and cuMem settings, UCX's CUDA IPC over
MNNVL and an IMEX channel from a ComputeDomain (NVIDIA's DRA driver) claimed by every pod; GPUs
whose NVLink domain is one host (H100, H200, B200, B300) reach other hosts over InfiniBand:
`rdma/ib` devices, NVSHMEM over IBGDA for the expert all-to-all, UCX over RC verbs for NIXL, and
the IPC_LOCK capability to pin memory (with SYS_RAWIO, as llm-d's pods ask). Both keep the
bootstrap traffic of NCCL, Gloo and NVSHMEM on the pod network (eth0).

The model volume holds the Hugging Face cache (HF_HUB_CACHE under it, HF_TOKEN from a Secret,
optional, for gated models) and any model folder given by path: a PersistentVolumeClaim or a
host path, mounted at /models in every engine pod.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from executor.backends.layout import HOST_ENV
from executor.records import LaunchRecord
from simulator.specs.errors import SpecError
from simulator.specs.hardware import load_hardware
from simulator.specs.model import HF_PRESETS

VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"
"""Image of the engine pods (vLLM 0.32.0, the version the rendering targets)."""
ROUTER_IMAGE = "rackplan-router:0.1.0"
"""Image of our router: what `make router-image` builds (Dockerfile.router); push it to a
registry the cluster pulls from and give that name with --router-image."""
GPU_RESOURCE = "nvidia.com/gpu"
RDMA_RESOURCE = "rdma/ib"
MODEL_MOUNT = "/models"
"""Where the model volume is mounted in every engine pod."""
HF_HUB_CACHE = f"{MODEL_MOUNT}/hub"
CPU_PER_GPU = 8
"""CPU cores an engine pod requests per GPU."""
MEMORY_GIB_PER_GPU = 96
"""Host memory (GiB) an engine pod requests and is limited to, per GPU."""
SHM_GIB_PER_GPU = 8
"""Size of the memory-backed /dev/shm per GPU (the engine's shared-memory queues)."""
CHANNEL_CLAIM = "compute-domain-channel"
"""The pod's name for its claim on the ComputeDomain's IMEX channel."""
STARTUP_S = 3600
"""How long a pod may take to load the model before its startup probe gives up."""


@dataclass(frozen=True)
class Fabric:
    """How the engine pods of one kind of hardware talk across hosts."""

    name: str
    env: tuple[tuple[str, str], ...]
    """Environment every engine pod gets, in order."""
    resources: tuple[tuple[str, str], ...] = ()
    """Extended resources every engine pod requests besides its GPUs."""
    compute_domain: bool = False
    """Whether the pods claim an IMEX channel of a ComputeDomain (multi-node NVLink)."""
    capabilities: tuple[str, ...] = ()
    """Linux capabilities the engine container adds."""
    min_kubernetes: str = "1.29"
    """The oldest Kubernetes the manifests validate against (DRA claims: 1.32)."""


BOOTSTRAP_ENV = (("GLOO_SOCKET_IFNAME", "eth0"), ("NCCL_SOCKET_IFNAME", "eth0"),
                 ("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "eth0"))
ENGINE_ENV = (("VLLM_SKIP_P2P_CHECK", "1"), ("VLLM_RANDOMIZE_DP_DUMMY_INPUTS", "1"),
              ("VLLM_USE_DEEP_GEMM", "1"), ("NVIDIA_GDRCOPY", "enabled"))

FABRICS: dict[str, Fabric] = {
    "infiniband": Fabric(
        name="infiniband",
        env=(*ENGINE_ENV, ("NVSHMEM_REMOTE_TRANSPORT", "ibgda"),
             ("NVSHMEM_IB_ENABLE_IBGDA", "true"), ("UCX_TLS", "rc,sm,cuda_ipc,cuda_copy,tcp"),
             *BOOTSTRAP_ENV),
        resources=((RDMA_RESOURCE, "1"),), capabilities=("IPC_LOCK", "SYS_RAWIO")),
    "nvl72": Fabric(
        name="nvl72",
        env=(*ENGINE_ENV, ("NCCL_MNNVL_ENABLE", "1"), ("NCCL_CUMEM_ENABLE", "1"),
             ("NCCL_NVLS_ENABLE", "1"), ("UCX_TLS", "cuda_copy,cuda_ipc,tcp"),
             ("UCX_CUDA_IPC_ENABLE_MNNVL", "y"), ("UCX_MEMTYPE_CACHE", "n"),
             *BOOTSTRAP_ENV),
        compute_domain=True, capabilities=("IPC_LOCK", "SYS_RAWIO"), min_kubernetes="1.32"),
    "none": Fabric(name="none", env=()),
}
"""Fabric name -> its settings; `fabric_for` picks one from the hardware."""


def fabric_for(hardware: str | None) -> Fabric:
    """The fabric of a hardware preset: NVL72 when its NVLink domain spans hosts, InfiniBand
    when it is one host of several GPUs, none for one GPU (the CPU preset) or no hardware."""
    if hardware is None:
        return FABRICS["none"]
    spec = load_hardware(hardware)
    if spec.scaleup_domain > spec.gpus_per_host:
        return FABRICS["nvl72"]
    return FABRICS["infiniband" if spec.gpus_per_host > 1 else "none"]


@dataclass(frozen=True)
class ModelVolume:
    """The volume that holds the model: a PersistentVolumeClaim or a host path."""

    kind: str
    """pvc or host."""
    source: str
    """The claim's name, or the path on every node."""

    KINDS = ("pvc", "host")

    @classmethod
    def parse(cls, text: str) -> ModelVolume:
        """`pvc:NAME` or `host:/PATH` (SpecError naming what is valid otherwise)."""
        kind, _, source = text.partition(":")
        if kind not in cls.KINDS or not source or (kind == "host" and not source.startswith("/")):
            raise SpecError(f"model volume {text!r}; give pvc:CLAIM (a PersistentVolumeClaim) "
                            "or host:/PATH (a folder on every node)")
        return cls(kind, source)

    def volume(self) -> dict[str, Any]:
        if self.kind == "pvc":
            return {"name": "models", "persistentVolumeClaim": {"claimName": self.source}}
        return {"name": "models", "hostPath": {"path": self.source, "type": "DirectoryOrCreate"}}


@dataclass(frozen=True)
class PodSettings:
    """What the deploy flags set in every engine pod."""

    fabric: Fabric = field(default_factory=lambda: FABRICS["none"])
    image: str | None = None
    """The engine pods' image (None: the flavor's own, vLLM's for llm-d)."""
    router_image: str = ROUTER_IMAGE
    model_volume: ModelVolume = field(default_factory=lambda: ModelVolume("pvc", "hf-cache"))
    hf_token_secret: str = "hf-token"
    """The Secret whose HF_TOKEN key the pods read (optional: public models need none)."""


def served_model(model: str) -> str:
    """What the pods serve: a preset's Hugging Face id, an id as given, or a path on the model
    volume (SpecError for a path elsewhere, which no pod has)."""
    by_preset = {preset: hf_id for hf_id, preset in HF_PRESETS.items()}
    if model in by_preset:
        return by_preset[model]
    if model.startswith("/") and not (model + "/").startswith(MODEL_MOUNT + "/"):
        raise SpecError(f"model path {model} is not on the model volume, which the pods mount "
                        f"at {MODEL_MOUNT}; give a path under {MODEL_MOUNT}/ or a Hugging Face "
                        "id (org/name)")
    if model.startswith((".", "~")) or (not model.startswith("/") and model.count("/") != 1):
        raise SpecError(f"model {model!r} is neither a Hugging Face id (org/name) nor a path "
                        f"under {MODEL_MOUNT}/ on the model volume; give one with --model-path")
    return model


def model_label(model: str) -> str:
    """The model as a label value: its last path part, at most 63 characters."""
    text = "".join(c if c.isalnum() or c in "-_." else "-" for c in model.rsplit("/", 1)[-1])
    return text[:63].strip("-_.") or "model"


def engine_env(process: LaunchRecord, settings: PodSettings,
               extra: tuple[tuple[str, str], ...] = (), cache: bool = True) -> list[dict[str, Any]]:
    """The engine container's environment: the record's (its own host from the pod IP), `extra`,
    the fabric's, the Hugging Face cache on the model volume (unless `cache` is False: a
    flavor that fetches the model itself) and HF_TOKEN."""
    env: list[dict[str, Any]] = []
    for key, value in sorted(process.env.items()):
        if key in HOST_ENV:
            env.append({"name": key, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        else:
            env.append({"name": key, "value": value})
    hub = (("HF_HUB_CACHE", HF_HUB_CACHE),) if cache else ()
    env += [{"name": k, "value": v} for k, v in (*extra, *settings.fabric.env, *hub)]
    env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": settings.hf_token_secret, "key": "HF_TOKEN", "optional": True}}})
    return env


def engine_resources(gpus: int, fabric: Fabric) -> dict[str, Any]:
    """Requests equal to limits: GPUs, the fabric's devices, CPU and memory per GPU; the IMEX
    channel claim on NVL72."""
    amounts = {GPU_RESOURCE: str(gpus), **dict(fabric.resources),
               "memory": f"{MEMORY_GIB_PER_GPU * gpus}Gi"}
    out: dict[str, Any] = {"requests": {**amounts, "cpu": str(CPU_PER_GPU * gpus)},
                           "limits": dict(amounts)}
    if fabric.compute_domain:
        out["claims"] = [{"name": CHANNEL_CLAIM}]
    return out


def probes(port: str | int, scheme: str | None = None) -> dict[str, Any]:
    """Startup (the model load, up to STARTUP_S), liveness (/health) and readiness (/v1/models,
    which answers once the engine serves) probes on a port (its name or number)."""
    def get(path: str) -> dict[str, Any]:
        return {"path": path, "port": port, **({"scheme": scheme} if scheme else {})}
    return {"startupProbe": {"httpGet": get("/health"), "periodSeconds": 10,
                             "timeoutSeconds": 5, "failureThreshold": STARTUP_S // 10},
            "livenessProbe": {"httpGet": get("/health"), "periodSeconds": 30,
                              "timeoutSeconds": 5, "failureThreshold": 3},
            "readinessProbe": {"httpGet": get("/v1/models"), "periodSeconds": 10,
                               "timeoutSeconds": 5, "failureThreshold": 3}}


def engine_container(process: LaunchRecord, settings: PodSettings, *, command: list[str],
                     args: list[str], ports: list[dict[str, Any]], probe_port: str,
                     extra_env: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """The vLLM container of an engine pod."""
    container: dict[str, Any] = {
        "name": "vllm", "image": settings.image or VLLM_IMAGE, "command": command, "args": args,
        "ports": ports, "env": engine_env(process, settings, extra_env),
        "resources": engine_resources(process.gpus, settings.fabric), **probes(probe_port),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "models", "mountPath": MODEL_MOUNT}]}
    if settings.fabric.capabilities:
        container["securityContext"] = {"capabilities": {"add": list(
            settings.fabric.capabilities)}}
    return container


def engine_pod(containers: list[dict[str, Any]], gpus: int, settings: PodSettings,
               channel_template: str | None,
               init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An engine pod's spec: its containers, /dev/shm in memory, the model volume, and the
    claim on the ComputeDomain's channel (`channel_template`) on NVL72."""
    spec: dict[str, Any] = {}
    if init:
        spec["initContainers"] = init
    spec["containers"] = containers
    spec["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory",
                                                     "sizeLimit": f"{SHM_GIB_PER_GPU * gpus}Gi"}},
                       settings.model_volume.volume()]
    if settings.fabric.compute_domain and channel_template is not None:
        spec["resourceClaims"] = [{"name": CHANNEL_CLAIM,
                                   "resourceClaimTemplateName": channel_template}]
    return spec


def compute_domain(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A ComputeDomain (resource.nvidia.com/v1beta1) whose channel template the pods claim;
    numNodes 0, as the driver recommends with its default IMEXDaemonsWithDNSNames."""
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": name, "labels": labels},
            "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {
                "name": f"{name}-channel"}}}}


class Dumper(yaml.SafeDumper):
    """Safe YAML without anchors, multi-line strings (scripts, configs) as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


Dumper.add_representer(str, _str)


def to_yaml(obj: Any) -> str:
    return yaml.dump(obj, Dumper=Dumper, sort_keys=False, width=100)
