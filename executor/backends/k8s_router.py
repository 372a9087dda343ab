"""Routing in front of the engine pods, one table of choices (`ROUTINGS`).

`router`: our P/D proxy (`python -m executor.proxy --config /etc/rackplan/router.json`, the image
Dockerfile.router builds) as a Deployment and a Service, its router.json from a ConfigMap: the
URL of every pod that serves HTTP in each role and the plan's router policy of each role.

`epp`: the Gateway API inference extension as llm-d runs it: an InferencePool
(inference.networking.k8s.io/v1) over every engine pod of the deployment, its endpoint picker
(llm-d's inference scheduler, EPP) with a prefill/decode profile that sends each request's
prefill to a prefill pod and its decode to a decode pod, whose routing sidecar (in front of
vLLM on the pool's port) runs the prefill first, and an HTTPRoute from the cluster's Gateway
(`--gateway`, of the Gateway class the cluster runs; rackplan does not write the Gateway) to the
pool.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from executor.backends.k8s_pod import PodSettings

CONFIG_DIR = "/etc/rackplan"
POOL_PORT = 8000
"""The port every engine pod serves the pool on (a decode pod's routing sidecar)."""
VLLM_BEHIND_SIDECAR = 8200
"""vLLM's own port in a decode pod under EPP routing (its sidecar takes POOL_PORT)."""
EPP_IMAGE = "ghcr.io/llm-d/llm-d-inference-scheduler:v0.5.0"
SIDECAR_IMAGE = "ghcr.io/llm-d/llm-d-routing-sidecar:v0.5.0"
EPP_GRPC_PORT = 9002
EPP_HEALTH_PORT = 9003
ROLE_LABEL = "llm-d.ai/role"
SERVING_LABEL = "llm-d.ai/inference-serving"
EPP_CONFIG = {
    "apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
    "plugins": [{"type": "prefill-header-handler"}, {"type": "prefill-filter"},
                {"type": "decode-filter"}, {"type": "max-score-picker"},
                {"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"},
                {"type": "pd-profile-handler", "parameters": {"threshold": 0}}],
    "schedulingProfiles": [
        {"name": "prefill", "plugins": [{"pluginRef": "prefill-filter"},
                                        {"pluginRef": "queue-scorer", "weight": 1},
                                        {"pluginRef": "max-score-picker"}]},
        {"name": "decode", "plugins": [{"pluginRef": "decode-filter"},
                                       {"pluginRef": "kv-cache-utilization-scorer", "weight": 1},
                                       {"pluginRef": "queue-scorer", "weight": 1},
                                       {"pluginRef": "max-score-picker"}]}]}
"""The endpoint picker's plugins: every request disaggregated (threshold 0), each role's pod
picked by its queue (and, for decode, its KV-cache use)."""


@dataclass(frozen=True)
class RouteTarget:
    """One role's pods as the routing sees them."""

    role: str
    urls: tuple[str, ...]
    """Every pod of the role that serves HTTP (with hybrid load balancing, every pod)."""
    policy: str | None
    """The plan's router policy for the role."""


@dataclass(frozen=True)
class RoutingContext:
    app: str
    labels: dict[str, str]
    """The labels of the deployment (app.kubernetes.io/instance among them)."""
    targets: tuple[RouteTarget, ...]
    port: int
    """Our router's port."""
    settings: PodSettings
    gateway: str = "inference-gateway"
    """The Gateway (in the deployment's namespace) whose HTTPRoute sends requests to the
    InferencePool."""


class Routing(ABC):
    """How clients reach the engine pods."""

    name: ClassVar[str]
    sidecar: ClassVar[bool] = False
    """Whether decode pods run llm-d's routing sidecar on POOL_PORT (vLLM behind it)."""

    def __init__(self, ctx: RoutingContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def objects(self) -> list[dict[str, Any]]:
        """The routing's objects, in apply order."""

    @abstractmethod
    def rollouts(self) -> list[str]:
        """Deployments (`deployment/NAME`) to wait for."""

    @property
    @abstractmethod
    def url(self) -> str:
        """Where clients inside the cluster reach the deployment."""


class OurRouter(Routing):
    """Our P/D proxy."""

    name: ClassVar[str] = "router"

    @property
    def router_name(self) -> str:
        return f"{self.ctx.app}-router"

    @property
    def url(self) -> str:
        return f"http://{self.router_name}:{self.ctx.port}"

    def labels(self) -> dict[str, str]:
        return {**self.ctx.labels, "app.kubernetes.io/component": "router"}

    def config(self) -> dict[str, Any]:
        """router.json: each role's pod URLs and its policy."""
        config: dict[str, Any] = {"port": self.ctx.port, "host": "0.0.0.0"}
        for target in self.ctx.targets:
            config[f"{target.role}_urls"] = list(target.urls)
        for target in self.ctx.targets:
            if target.policy is not None:
                config[f"{target.role}_policy"] = target.policy
        return config

    def objects(self) -> list[dict[str, Any]]:
        labels = self.labels()
        tcp = {"tcpSocket": {"port": "http"}}
        container = {
            "name": "router", "image": self.ctx.settings.router_image,
            "command": ["python", "-m", "executor.proxy", "--config",
                        f"{CONFIG_DIR}/router.json"],
            "ports": [{"name": "http", "containerPort": self.ctx.port}],
            "resources": {"requests": {"cpu": "2", "memory": "2Gi"},
                          "limits": {"memory": "4Gi"}},
            "startupProbe": {**tcp, "periodSeconds": 2, "failureThreshold": 30},
            "livenessProbe": {**tcp, "periodSeconds": 10, "failureThreshold": 3},
            "readinessProbe": {**tcp, "periodSeconds": 5},
            "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]}
        return [
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": self.router_name, "labels": labels},
             "data": {"router.json": json.dumps(self.config(), indent=2) + "\n"}},
            {"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": self.router_name, "labels": labels},
             "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                      "template": {"metadata": {"labels": labels},
                                   "spec": {"containers": [container], "volumes": [
                                       {"name": "config",
                                        "configMap": {"name": self.router_name}}]}}}},
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": self.router_name, "labels": labels},
             "spec": {"selector": labels, "ports": [{"name": "http", "port": self.ctx.port,
                                                     "targetPort": "http"}]}}]

    def rollouts(self) -> list[str]:
        return [f"deployment/{self.router_name}"]


class InferencePoolRouting(Routing):
    """llm-d's InferencePool and endpoint picker."""

    name: ClassVar[str] = "epp"
    sidecar: ClassVar[bool] = True

    @property
    def epp_name(self) -> str:
        return f"{self.ctx.app}-epp"

    @property
    def url(self) -> str:
        return f"the Gateway {self.ctx.gateway} (HTTPRoute {self.ctx.app})"

    def objects(self) -> list[dict[str, Any]]:
        app, epp = self.ctx.app, self.epp_name
        labels = {**self.ctx.labels, "app.kubernetes.io/component": "epp"}
        meta = {"name": epp, "labels": labels}
        pool = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
                "metadata": {"name": app, "labels": self.ctx.labels},
                "spec": {"selector": {"matchLabels": {
                    "app.kubernetes.io/instance": self.ctx.labels["app.kubernetes.io/instance"],
                    SERVING_LABEL: "true"}},
                    "targetPorts": [{"number": POOL_PORT}],
                    "endpointPickerRef": {"name": epp, "port": {"number": EPP_GRPC_PORT}}}}
        grpc = {"grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"}}
        container = {
            "name": "epp", "image": EPP_IMAGE,
            "args": ["--pool-name", app, "--pool-namespace", "$(NAMESPACE)",
                     "--config-file", "/config/epp.yaml",
                     "--grpc-port", str(EPP_GRPC_PORT),
                     "--grpc-health-port", str(EPP_HEALTH_PORT),
                     "--kv-cache-usage-percentage-metric", "vllm:kv_cache_usage_perc"],
            "env": [{"name": "NAMESPACE",
                     "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
            "ports": [{"name": "grpc", "containerPort": EPP_GRPC_PORT},
                      {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT}],
            "resources": {"requests": {"cpu": "2", "memory": "2Gi"},
                          "limits": {"memory": "4Gi"}},
            "startupProbe": {**grpc, "periodSeconds": 2, "failureThreshold": 60},
            "livenessProbe": {**grpc, "periodSeconds": 10, "failureThreshold": 3},
            "readinessProbe": {**grpc, "periodSeconds": 5},
            "volumeMounts": [{"name": "config", "mountPath": "/config", "readOnly": True}]}
        rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                 {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
                  "verbs": ["get", "list", "watch"]},
                 {"apiGroups": ["inference.networking.x-k8s.io"],
                  "resources": ["inferenceobjectives", "inferencemodelrewrites"],
                  "verbs": ["get", "list", "watch"]}]
        route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                 "metadata": {"name": app, "labels": self.ctx.labels},
                 "spec": {"parentRefs": [{"group": "gateway.networking.k8s.io",
                                          "kind": "Gateway", "name": self.ctx.gateway}],
                          "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                                     "backendRefs": [{"group": "inference.networking.k8s.io",
                                                      "kind": "InferencePool", "name": app}],
                                     "timeouts": {"request": "0s", "backendRequest": "0s"}}]}}
        return [
            pool, route,
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
             "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": meta,
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": epp},
             "subjects": [{"kind": "ServiceAccount", "name": epp}]},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
             "data": {"epp.yaml": json.dumps(EPP_CONFIG, indent=2) + "\n"}},
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
             "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                      "template": {"metadata": {"labels": labels},
                                   "spec": {"serviceAccountName": epp, "containers": [container],
                                            "volumes": [{"name": "config",
                                                         "configMap": {"name": epp}}]}}}},
            {"apiVersion": "v1", "kind": "Service", "metadata": meta,
             "spec": {"selector": labels, "ports": [
                 {"name": "grpc", "port": EPP_GRPC_PORT, "targetPort": "grpc"}]}}]

    def rollouts(self) -> list[str]:
        return [f"deployment/{self.epp_name}"]


def routing_sidecar(vllm_port: int) -> dict[str, Any]:
    """llm-d's routing sidecar of a decode pod (a native sidecar: an init container that keeps
    running): on POOL_PORT, it has the prefill pod the picker chose run the prompt over NIXL,
    then hands the request to vLLM on `vllm_port`."""
    return {"name": "routing-proxy", "image": SIDECAR_IMAGE, "restartPolicy": "Always",
            "args": [f"--port={POOL_PORT}", f"--vllm-port={vllm_port}", "--connector=nixlv2",
                     "--secure-proxy=false"],
            "ports": [{"name": "sidecar", "containerPort": POOL_PORT}],
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                          "limits": {"memory": "2Gi"}},
            "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True}}


ROUTINGS: dict[str, type[Routing]] = {"router": OurRouter, "epp": InferencePoolRouting}
"""`--routing` name -> how clients reach the pods."""
