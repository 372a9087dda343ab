"""llm-d's wide-EP conventions: one LeaderWorkerSet per role, every pod alike.

Each role is a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1): `replicas` instances, `size` pods
(hosts) per instance, one pod template for the leader and the workers. With more than one pod an
instance runs vLLM's hybrid data-parallel load balancing (`--data-parallel-hybrid-lb`): every pod
serves its own API for its own ranks, and takes them from LeaderWorkerSet's environment —
`--data-parallel-start-rank $((LWS_WORKER_INDEX * DP_SIZE_LOCAL))` with DP_SIZE_LOCAL the ranks
of a pod (the last pod of an uneven instance runs the rest), the head's address from
LWS_LEADER_ADDRESS. P/D roles keep the rendering's NixlConnector roles (prefill kv_producer,
decode kv_consumer) with NIXL's side channel on the pod's IP. The pods ask for their GPUs, the
fabric's devices, CPU and memory (requests = limits), mount /dev/shm in memory and the model
volume, and have startup, liveness and readiness probes (executor/backends/k8s_pod.py). On
GB200/GB300 one ComputeDomain spans the deployment and every pod claims its IMEX channel.

A Service per role selects every pod of the role. Routing is our router or llm-d's InferencePool
and endpoint picker, with the routing sidecar in front of vLLM in decode pods
(executor/backends/k8s_router.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from executor.backends.k8s_pod import compute_domain, engine_container, engine_pod, model_label
from executor.backends.k8s_router import (
    POOL_PORT,
    ROLE_LABEL,
    ROUTINGS,
    SERVING_LABEL,
    VLLM_BEHIND_SIDECAR,
    RouteTarget,
    Routing,
    RoutingContext,
    routing_sidecar,
)
from executor.backends.layout import RoleLayout, shell_lines
from executor.flavors.base import Flavor, Target, Wait
from executor.records import LaunchRecord

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
HYBRID_LB = "--data-parallel-hybrid-lb"
ROLE_VALUES = {"prefill": "prefill", "decode": "decode", "aggregated": "both"}
"""Our role -> llm-d's llm-d.ai/role label (the picker's prefill and decode filters read it)."""


class LlmD(Flavor):
    """LeaderWorkerSets in llm-d's wide-EP conventions."""

    name: ClassVar[str] = "llm-d"
    routings: ClassVar[tuple[str, ...]] = ("router", "epp")

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        self.routing_name = target.routing or self.routings[0]
        self.routing: Routing = ROUTINGS[self.routing_name](RoutingContext(
            app=target.app, labels=target.labels(), port=self._router_port(),
            gateway=target.gateway,
            settings=target.settings, targets=tuple(
                RouteTarget(lay.role, self.pod_urls(lay),
                            target.rendered.router_policies.get(f"{lay.role}_policy"))
                for lay in target.layouts)))

    def _router_port(self) -> int:
        port = self.target.rendered.router["port"]
        assert isinstance(port, int)
        return port

    # --- names and ports -----------------------------------------------------------------

    def lws_name(self, role: str) -> str:
        return f"{self.target.app}-{role}"

    @property
    def channel_template(self) -> str | None:
        """The ComputeDomain's channel template, on NVL72."""
        return (f"{self.target.app}-cd-channel" if self.target.settings.fabric.compute_domain
                else None)

    def vllm_port(self, layout: RoleLayout) -> int:
        """vLLM's port in the role's pods: the rendering's, or under the InferencePool the
        pool's (decode: the port behind its routing sidecar)."""
        if self.routing_name != "epp":
            return layout.port
        return VLLM_BEHIND_SIDECAR if layout.role == "decode" else POOL_PORT

    def pod_urls(self, layout: RoleLayout) -> tuple[str, ...]:
        """Every pod's URL by its stable name (<lws>-<i> the leader, <lws>-<i>-<j> a worker,
        under the LeaderWorkerSet's headless Service <lws>): with hybrid load balancing each
        pod serves its own ranks."""
        lws, port = self.lws_name(layout.role), self.vllm_port(layout)
        return tuple(f"http://{lws}-{i}{'' if j == 0 else f'-{j}'}.{lws}:{port}"
                     for i in range(layout.instances) for j in range(layout.hosts))

    @property
    def url(self) -> str:
        return self.routing.url

    # --- objects -------------------------------------------------------------------------

    def objects(self) -> list[dict[str, Any]]:
        objs: list[dict[str, Any]] = []
        if self.channel_template is not None:
            objs.append(compute_domain(f"{self.target.app}-cd", self.target.labels("fabric")))
        for layout in self.target.layouts:
            objs += [self.leader_worker_set(layout), self.role_service(layout)]
        return [*objs, *self.routing.objects()]

    def pod_labels(self, layout: RoleLayout) -> dict[str, str]:
        return {**self.target.labels(layout.role), SERVING_LABEL: "true",
                "llm-d.ai/model": model_label(self.target.model),
                ROLE_LABEL: ROLE_VALUES.get(layout.role, layout.role)}

    def pod_record(self, layout: RoleLayout) -> LaunchRecord:
        """The one process every pod of the role runs: the model from the volume or the hub,
        vLLM on the pod's port; with several pods, a host's slice of ranks that serves its own
        API (hybrid load balancing), whose start rank and head address the pod's environment
        gives."""
        port = self.vllm_port(layout)
        if layout.hosts == 1:
            head = layout.head
            dp = head.dp and replace(head.dp, address="$(LWS_LEADER_ADDRESS)")
            return replace(head, model=self.target.model, port=port, dp=dp)
        worker = layout.processes[1]  # a start rank > 0: the command names it
        assert worker.dp is not None
        return replace(worker, model=self.target.model, port=port,
                       dp=replace(worker.dp, headless=False, local=layout.ranks_per_host),
                       flags=(*worker.flags, (HYBRID_LB, None)))

    def pod_command(self, layout: RoleLayout) -> tuple[list[str], list[str]]:
        """The container's command and args."""
        record = self.pod_record(layout)
        if layout.hosts == 1:  # Kubernetes expands $(LWS_LEADER_ADDRESS) in args itself
            return list(record.launcher), list(record.args())
        return ["/bin/sh", "-c"], [pod_script(layout, record)]

    def leader_worker_set(self, layout: RoleLayout) -> dict[str, Any]:
        """The role's LeaderWorkerSet: `instances` groups of `hosts` alike pods."""
        record = self.pod_record(layout)
        command, args = self.pod_command(layout)
        ports = [{"name": "http", "containerPort": self.vllm_port(layout)}]
        nixl = record.env.get("VLLM_NIXL_SIDE_CHANNEL_PORT")
        if nixl is not None:
            ports.append({"name": "nixl", "containerPort": int(nixl)})
        extra = (("DP_SIZE_LOCAL", str(layout.ranks_per_host)),) if record.dp else ()
        container = engine_container(record, self.target.settings, command=command, args=args,
                                     ports=ports, probe_port="http", extra_env=extra)
        init = ([routing_sidecar(self.vllm_port(layout))]
                if self.routing.sidecar and layout.role == "decode" else None)
        labels = self.pod_labels(layout)
        pod = engine_pod([container], record.gpus, self.target.settings, self.channel_template,
                         init=init)
        return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet",
                "metadata": {"name": self.lws_name(layout.role),
                             "labels": self.target.labels(layout.role)},
                "spec": {"replicas": layout.instances, "leaderWorkerTemplate": {
                    "size": layout.hosts, "restartPolicy": "RecreateGroupOnPodRestart",
                    "workerTemplate": {"metadata": {"labels": labels}, "spec": pod}}}}

    def role_service(self, layout: RoleLayout) -> dict[str, Any]:
        """A ClusterIP Service over every pod of the role."""
        name = self.lws_name(layout.role)
        return {"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": f"{name}-http", "labels": self.target.labels(layout.role)},
                "spec": {"selector": {LWS_NAME_LABEL: name},
                         "ports": [{"name": "http", "port": self.vllm_port(layout),
                                    "targetPort": "http"}]}}

    # --- readiness -----------------------------------------------------------------------

    def waits(self) -> list[Wait]:
        out = [Wait(f"leaderworkerset/{self.lws_name(lay.role)}", "Available",
                    f"{lay.role} instances ({self.lws_name(lay.role)})")
               for lay in self.target.layouts]
        return out + [Wait(r, "Available", f"the {self.routing.name} ({r.split('/')[-1]})")
                      for r in self.routing.rollouts()]

    @property
    def probe_in(self) -> tuple[tuple[str, ...], str]:
        if self.routing_name == "router":
            return (f"deployment/{self.target.app}-router",), \
                f"http://127.0.0.1:{self._router_port()}"
        layout = self.target.layouts[-1]  # a pod of the last role answers on its own port
        return (f"pod/{self.lws_name(layout.role)}-0", "-c", "vllm"), \
            f"http://127.0.0.1:{self.vllm_port(layout)}"


def pod_script(layout: RoleLayout, record: LaunchRecord) -> str:
    """The `sh -c` command of a pod of a multi-pod instance: vllm with its start rank from
    $LWS_WORKER_INDEX x $DP_SIZE_LOCAL and the head's address from $LWS_LEADER_ADDRESS (the
    last pod of an uneven instance runs the ranks left, though it asks for a full pod's GPUs:
    a LeaderWorkerSet's pods are alike)."""
    exprs = {"address": "${LWS_LEADER_ADDRESS}",
             "start_rank": "$((LWS_WORKER_INDEX * DP_SIZE_LOCAL))", "local": "${DP_SIZE_LOCAL}"}
    if len({layout.local_ranks(h) for h in range(layout.hosts)}) > 1:
        left = f"{layout.dp_size} - LWS_WORKER_INDEX * DP_SIZE_LOCAL"
        exprs["local"] = f"$(({left} < DP_SIZE_LOCAL ? {left} : DP_SIZE_LOCAL))"
    return shell_lines(["exec", *record.shell_words(dp=exprs)]) + "\n"
