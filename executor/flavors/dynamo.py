"""NVIDIA Dynamo: one DynamoGraphDeployment (nvidia.com/v1alpha1), as Dynamo 0.6.0 runs vLLM.

The graph has a Frontend service (`python3 -m dynamo.frontend`, the OpenAI API on port 8000,
which routes each request to a decode worker and, disaggregated, its prefill to a prefill worker,
in the router mode of the plan's policy: `ROUTER_MODES`)
and one worker service per role: `python3 -m dynamo.vllm --model M` with the role's vLLM engine
flags, `--is-prefill-worker` for prefill, and the P/D handoff through Dynamo's own NIXL connector
(`--connector nixl`, which Dynamo 0.6.0 refuses beside a --kv-transfer-config). `replicas` is the
number of instances; an instance that spans hosts is `multinode.nodeCount` pods, which Dynamo's
operator joins into one Ray cluster (the leader runs the worker after `ray start --head`, the
others run Ray only), so its data-parallel ranks are placed by vLLM's Ray backend
(`--data-parallel-backend ray`, `--data-parallel-size-local` ranks a pod). Each worker pod asks
for its GPUs, the fabric's devices, CPU and memory, mounts the model volume, and has startup,
liveness and readiness probes (the operator drops them on non-leader pods of a multinode
service); on GB200/GB300 every pod claims the ComputeDomain's IMEX channel.
The operator's platform (etcd, NATS) must be installed in the cluster.
"""

from __future__ import annotations

from typing import Any, ClassVar

from executor.backends.k8s_pod import (
    CHANNEL_CLAIM,
    CPU_PER_GPU,
    MEMORY_GIB_PER_GPU,
    MODEL_MOUNT,
    SHM_GIB_PER_GPU,
    compute_domain,
    engine_env,
    probes,
)
from executor.backends.layout import RoleLayout
from executor.flavors.base import Flavor, Wait
from executor.records import DP_FLAGS, TP_FLAG, Flag, flag_words

DGD_API = "nvidia.com/v1alpha1"
DYNAMO_VERSION = "0.6.0"
DYNAMO_IMAGE = f"nvcr.io/nvidia/ai-dynamo/vllm-runtime:{DYNAMO_VERSION}"
"""Dynamo's vLLM runtime image of the pinned version (what --image replaces)."""
FRONTEND_PORT = 8000
WORKER_HEALTH_PORT = 9090
"""Where a worker answers /health and /live (Dynamo's system server, DYN_SYSTEM_PORT)."""
SERVICE_NAMES = {"prefill": "VllmPrefillWorker", "decode": "VllmDecodeWorker",
                 "aggregated": "VllmWorker"}
DROPPED_FLAGS = ("--kv-transfer-config",)
"""Engine flags Dynamo sets itself (the connector, from --connector)."""
ROUTER_MODES: dict[tuple[str, str], str] = {
    ("aggregated", "kv_router"): "kv",
    ("prefill", "prefix_aware"): "kv",
    ("aggregated", "round_robin"): "round-robin",
    ("prefill", "round_robin"): "round-robin",
}
"""The frontend's `--router-mode` for the plan's policy of the role it routes a request to
first (aggregated, or prefill): Dynamo's KV router is `kv_router` for an aggregated worker,
and for P/D its prefill router tracks no active blocks, which leaves `prefix_aware`. A policy
with no counterpart here runs as Dynamo's default (round-robin), which the graph's
`ROUTER_NOTE` annotation says."""
ROUTER_NOTE = "rackplan.io/router"


class Dynamo(Flavor):
    """A DynamoGraphDeployment of a frontend and a worker service per role."""

    name: ClassVar[str] = "dynamo"

    @property
    def channel_template(self) -> str | None:
        return (f"{self.target.app}-cd-channel" if self.target.settings.fabric.compute_domain
                else None)

    @property
    def image(self) -> str:
        return self.target.settings.image or DYNAMO_IMAGE

    @property
    def url(self) -> str:
        return f"http://{self.target.app}-frontend:{FRONTEND_PORT}"

    def worker_args(self, layout: RoleLayout) -> list[str]:
        """`dynamo.vllm`'s arguments: the model, Dynamo's role and connector, the role's engine
        flags, then its parallelism (data-parallel ranks through Ray across pods)."""
        head = layout.head
        flags: list[Flag] = [f for f in head.flags if f[0] not in DROPPED_FLAGS]
        if layout.role == "prefill":
            flags.insert(0, ("--is-prefill-worker", None))
        if layout.role in ("prefill", "decode"):
            flags.insert(0, ("--connector", "nixl"))
        if head.tp > 1:
            flags.append((TP_FLAG, head.tp))
        if head.dp is not None:
            flags += [(DP_FLAGS["size"], head.dp.size), (DP_FLAGS["local"], head.dp.local)]
            if layout.hosts > 1:
                flags.append(("--data-parallel-backend", "ray"))
        return ["--model", self.target.model, *flag_words(flags)]

    def worker(self, layout: RoleLayout) -> dict[str, Any]:
        settings, gpus = self.target.settings, layout.gpus_per_host
        custom = dict(settings.fabric.resources)
        amounts: dict[str, Any] = {"gpu": str(gpus), "memory": f"{MEMORY_GIB_PER_GPU * gpus}Gi"}
        if custom:
            amounts["custom"] = custom
        env = engine_env(layout.head, settings, (("DYN_SYSTEM_ENABLED", "true"),
                                                 ("DYN_SYSTEM_PORT", str(WORKER_HEALTH_PORT))))
        container: dict[str, Any] = {
            "name": "main", "image": self.image, "command": ["python3", "-m", "dynamo.vllm"],
            "args": self.worker_args(layout), "env": env,
            "ports": [{"name": "system", "containerPort": WORKER_HEALTH_PORT}],
            **probes("system"),
            "volumeMounts": [{"name": "models", "mountPath": MODEL_MOUNT}]}
        container["readinessProbe"]["httpGet"]["path"] = "/health"
        container["livenessProbe"]["httpGet"]["path"] = "/live"
        if settings.fabric.capabilities:
            container["securityContext"] = {"capabilities": {"add": list(
                settings.fabric.capabilities)}}
        pod: dict[str, Any] = {"mainContainer": container,
                               "volumes": [settings.model_volume.volume()]}
        if self.channel_template is not None:
            container["resources"] = {"claims": [{"name": CHANNEL_CLAIM}]}
            pod["resourceClaims"] = [{"name": CHANNEL_CLAIM,
                                      "resourceClaimTemplateName": self.channel_template}]
        service: dict[str, Any] = {
            "dynamoNamespace": self.target.app, "componentType": "worker",
            "replicas": layout.instances,
            "resources": {"requests": {**amounts, "cpu": str(CPU_PER_GPU * gpus)},
                          "limits": dict(amounts)},
            "sharedMemory": {"size": f"{SHM_GIB_PER_GPU * gpus}Gi"},
            "extraPodSpec": pod}
        if layout.role in ("prefill", "decode"):
            service["subComponentType"] = layout.role
        if layout.hosts > 1:
            service["multinode"] = {"nodeCount": layout.hosts}
        return service

    @property
    def first_policy(self) -> tuple[str, str]:
        """The role the frontend routes a request to first, and the plan's policy for it."""
        router = self.target.rendered.router
        role = "aggregated" if "aggregated_policy" in router else "prefill"
        return role, str(router.get(f"{role}_policy", ""))

    def frontend(self) -> dict[str, Any]:
        http = {"httpGet": {"path": "/health", "port": FRONTEND_PORT}}
        mode = ROUTER_MODES.get(self.first_policy)
        container = {"name": "main", "image": self.image,
                     "command": ["python3", "-m", "dynamo.frontend"],
                     "args": ["--http-port", str(FRONTEND_PORT),
                              *(["--router-mode", mode] if mode else [])],
                     "startupProbe": {**http, "periodSeconds": 5, "failureThreshold": 60}}
        return {"dynamoNamespace": self.target.app, "componentType": "frontend",
                "replicas": 1,
                "resources": {"requests": {"cpu": "4", "memory": "8Gi"},
                              "limits": {"memory": "16Gi"}},
                "livenessProbe": {**http, "periodSeconds": 10, "failureThreshold": 3},
                "readinessProbe": {**http, "periodSeconds": 5, "failureThreshold": 3},
                "extraPodSpec": {"mainContainer": container}}

    def graph(self) -> dict[str, Any]:
        services = {"Frontend": self.frontend()}
        for layout in self.target.layouts:
            services[SERVICE_NAMES.get(layout.role, layout.role)] = self.worker(layout)
        metadata: dict[str, Any] = {"name": self.target.app,
                                    "labels": self.target.labels("graph")}
        role, policy = self.first_policy
        if (role, policy) not in ROUTER_MODES:
            metadata["annotations"] = {ROUTER_NOTE: (
                f"the plan routes {role} requests by {policy}, for which Dynamo's frontend has "
                "no router mode: it runs its default, round-robin")}
        return {"apiVersion": DGD_API, "kind": "DynamoGraphDeployment", "metadata": metadata,
                "spec": {"backendFramework": "vllm", "services": services}}

    def objects(self) -> list[dict[str, Any]]:
        objs: list[dict[str, Any]] = []
        if self.channel_template is not None:
            objs.append(compute_domain(f"{self.target.app}-cd", self.target.labels("fabric")))
        return [*objs, self.graph()]

    def waits(self) -> list[Wait]:
        return [Wait(f"dynamographdeployment/{self.target.app}", "Ready",
                     f"the Dynamo graph ({self.target.app})")]

    @property
    def probe_in(self) -> tuple[tuple[str, ...], str]:
        return (f"deployment/{self.target.app}-frontend",), f"http://127.0.0.1:{FRONTEND_PORT}"
