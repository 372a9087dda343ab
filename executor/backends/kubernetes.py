"""Kubernetes: a LeaderWorkerSet per role, a Service per role, and the P/D router.

Each role becomes one LeaderWorkerSet (leaderworkerset.x-k8s.io/v1): `replicas` is the number of
instances and `leaderWorkerTemplate.size` the pods (hosts) of one instance. The leader pod runs
the head's `vllm serve` with `--data-parallel-address $(LWS_LEADER_ADDRESS)`; worker pods run
the headless command through a small `sh -c` wrapper that takes their data-parallel start rank
from `$LWS_WORKER_INDEX` x GPUs per pod. Every pod asks for its GPUs (`nvidia.com/gpu`) and
mounts a memory-backed emptyDir on /dev/shm; leaders are ready when /health answers. A ClusterIP
Service per role fronts its leaders, and the router — our P/D proxy, `python -m executor.proxy
--config /etc/rackplan/router.json` with that file from a ConfigMap — is a Deployment and a
Service. The router reaches each instance's leader by its stable DNS name
(<lws>-<i>.<lws>), which the LeaderWorkerSet's headless Service provides.

`render` writes one YAML file per object under <run_dir>/kubernetes/; `launch` applies them
with kubectl, `wait_ready` waits for every LeaderWorkerSet and the router and then sends one
completion through the router from inside its pod, `teardown` deletes what was applied.
The model path must exist inside the pods (an image or a volume that holds it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import yaml

from executor.backends.base import Backend, LaunchError, write_atomic
from executor.backends.layout import HOST_ENV, RoleLayout, dns_label, role_layouts, shell_lines
from executor.records import LaunchRecord, Rendered

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"
"""Image of the engine pods (vLLM 0.32.0, the version the rendering targets)."""
ROUTER_IMAGE = "rackplan:0.1.0"
"""Image of the router pod: any image with rackplan installed."""
CONFIG_DIR = "/etc/rackplan"
GPU_RESOURCE = "nvidia.com/gpu"
POLL_S = 5.0
MANIFEST_DIR = "kubernetes"
"""Folder under the run directory that holds the manifests."""
COMPLETION_PROBE = (
    "import json, sys, urllib.request as u; "
    "r = u.Request(sys.argv[1] + '/v1/completions', data=json.dumps({'model': sys.argv[2], "
    "'prompt': 'Hello', 'max_tokens': 1}).encode(), "
    "headers={'Content-Type': 'application/json'}); "
    "print(u.urlopen(r, timeout=60).status)")
"""Run inside the router pod: one real completion through the router."""


class KubernetesBackend(Backend):
    """A rendered deployment as Kubernetes objects, applied with kubectl."""

    name: ClassVar[str] = "kubernetes"

    def __init__(self, rendered: Rendered, run_dir: Path, *, app: str | None = None,
                 namespace: str | None = None, image: str = VLLM_IMAGE,
                 router_image: str = ROUTER_IMAGE) -> None:
        super().__init__(rendered, run_dir)
        self.app = dns_label(app or Path(run_dir).name.removeprefix("deploy-"), limit=24)
        """Prefix of every object's name."""
        self.namespace = namespace
        """Namespace for kubectl (None: the current context's)."""
        self.image = image
        self.router_image = router_image
        self.layouts = role_layouts(rendered)
        self.files: list[Path] = []
        self._applied = False

    # --- names ---------------------------------------------------------------------------

    def lws_name(self, role: str) -> str:
        return f"{self.app}-{role}"

    @property
    def router_name(self) -> str:
        return f"{self.app}-router"

    @property
    def url(self) -> str:
        """The router's address inside the cluster."""
        return f"http://{self.router_name}:{self.router_port}"

    def _labels(self, component: str) -> dict[str, str]:
        return {"app.kubernetes.io/name": "rackplan", "app.kubernetes.io/instance": self.app,
                "app.kubernetes.io/component": component}

    # --- objects -------------------------------------------------------------------------

    def objects(self) -> list[dict[str, Any]]:
        """Every object, in the order they are applied."""
        objs: list[dict[str, Any]] = [self.router_config_map()]
        for layout in self.layouts:
            objs += [self.leader_worker_set(layout), self.role_service(layout)]
        return [*objs, self.router_deployment(), self.router_service()]

    def leader_worker_set(self, layout: RoleLayout) -> dict[str, Any]:
        """The LeaderWorkerSet of one role: `instances` groups of `hosts` pods."""
        labels = self._labels(layout.role)
        leader = {"metadata": {"labels": labels}, "spec": self._pod(self._leader(layout))}
        template: dict[str, Any] = {"size": layout.hosts,
                                    "restartPolicy": "RecreateGroupOnPodRestart"}
        if layout.hosts > 1:
            template["leaderTemplate"] = leader
            template["workerTemplate"] = {"metadata": {"labels": labels},
                                          "spec": self._pod(self._worker(layout))}
        else:  # a group of one pod: the worker template is the leader's
            template["workerTemplate"] = leader
        return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet",
                "metadata": {"name": self.lws_name(layout.role), "labels": labels},
                "spec": {"replicas": layout.instances, "leaderWorkerTemplate": template}}

    def _pod(self, container: dict[str, Any]) -> dict[str, Any]:
        return {"containers": [container],
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]}

    def _container(self, layout: RoleLayout, process: LaunchRecord, command: list[str],
                   args: list[str], **extra: Any) -> dict[str, Any]:
        env: list[dict[str, Any]] = []
        for key, value in sorted(process.env.items()):
            if key in HOST_ENV:
                env.append({"name": key,
                            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
            else:
                env.append({"name": key, "value": value})
        container: dict[str, Any] = {"name": "vllm", "image": self.image, "command": command,
                                     "args": args}
        if env:
            container["env"] = env
        return {**container, **extra,
                "resources": {"limits": {GPU_RESOURCE: str(layout.gpus_per_host)}},
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}

    def _leader(self, layout: RoleLayout) -> dict[str, Any]:
        head = layout.head
        if head.dp is not None:  # Kubernetes expands $(VAR) in args itself
            head = replace(head, dp=replace(head.dp, address="$(LWS_LEADER_ADDRESS)"))
        probe = {"httpGet": {"path": "/health", "port": "http"}, "initialDelaySeconds": 30,
                 "periodSeconds": 10, "failureThreshold": 3}
        return self._container(layout, head, list(head.launcher), list(head.args()),
                               ports=[{"name": "http", "containerPort": layout.port}],
                               readinessProbe=probe)

    def _worker(self, layout: RoleLayout) -> dict[str, Any]:
        return self._container(layout, layout.processes[1], ["/bin/sh", "-c"],
                               [worker_script(layout)])

    def role_service(self, layout: RoleLayout) -> dict[str, Any]:
        """A ClusterIP Service in front of the role's leaders."""
        name = self.lws_name(layout.role)
        return {"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": f"{name}-leaders", "labels": self._labels(layout.role)},
                "spec": {"selector": {LWS_NAME_LABEL: name, LWS_WORKER_INDEX_LABEL: "0"},
                         "ports": [{"name": "http", "port": layout.port,
                                    "targetPort": "http"}]}}

    def router_config(self) -> dict[str, Any]:
        """The proxy's router.json: each instance's leader by its stable DNS name, and the
        plan's router policy of each role."""
        config: dict[str, Any] = {"port": self.router_port, "host": "0.0.0.0"}
        for layout in self.layouts:
            lws = self.lws_name(layout.role)
            config[f"{layout.role}_urls"] = [f"http://{lws}-{i}.{lws}:{layout.port}"
                                             for i in range(layout.instances)]
        config.update(self.rendered.router_policies)
        return config

    def router_config_map(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": self.router_name, "labels": self._labels("router")},
                "data": {"router.json": json.dumps(self.router_config(), indent=2) + "\n"}}

    def router_deployment(self) -> dict[str, Any]:
        labels = self._labels("router")
        container = {
            "name": "router", "image": self.router_image,
            "command": ["python", "-m", "executor.proxy", "--config",
                        f"{CONFIG_DIR}/router.json"],
            "ports": [{"name": "http", "containerPort": self.router_port}],
            "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 5},
            "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]}
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": self.router_name, "labels": labels},
                "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                         "template": {"metadata": {"labels": labels},
                                      "spec": {"containers": [container], "volumes": [
                                          {"name": "config",
                                           "configMap": {"name": self.router_name}}]}}}}

    def router_service(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": self.router_name, "labels": self._labels("router")},
                "spec": {"selector": self._labels("router"),
                         "ports": [{"name": "http", "port": self.router_port,
                                    "targetPort": "http"}]}}

    # --- Backend -------------------------------------------------------------------------

    def render(self) -> list[Path]:
        """One YAML file per object under <run_dir>/kubernetes/, in apply order."""
        folder = self.run_dir / MANIFEST_DIR
        self.files = []
        for n, obj in enumerate(self.objects()):
            kind, name = obj["kind"], obj["metadata"]["name"]
            text = (f"# rackplan {self.app}: {kind} {name}\n"
                    + yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=100))
            path = folder / f"{n:02d}-{kind.lower()}-{name}.yaml"
            self.files.append(write_atomic(path, text))
        return list(self.files)

    def _kubectl(self, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise LaunchError("kubectl not found on PATH; use --dry-run to write the manifests "
                              f"to {self.run_dir / MANIFEST_DIR}")
        ns = ["--namespace", self.namespace] if self.namespace else []
        try:
            return subprocess.run([kubectl, *ns, *args], capture_output=True, text=True,
                                  timeout=max(timeout_s, 1.0), check=False)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"kubectl {args[0]} did not finish within {timeout_s:.0f} s") \
                from None

    def launch(self) -> None:
        """`kubectl apply` every manifest (rendering them first if needed)."""
        if shutil.which("kubectl") is None:
            raise LaunchError("kubectl not found on PATH; use --dry-run to write the manifests "
                              f"to {self.run_dir / MANIFEST_DIR}")
        files = self.files or self.render()
        self._applied = True  # a partial apply still needs a teardown
        run = self._kubectl("apply", *_file_args(files))
        if run.returncode:
            raise LaunchError(f"kubectl apply failed: {_last_line(run)}")

    def wait_ready(self, timeout_s: float) -> None:
        """Every LeaderWorkerSet Available, the router rolled out, then one completion through
        the router (sent from inside its pod)."""
        deadline = time.monotonic() + timeout_s

        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LaunchError(f"the deployment was not ready within {timeout_s:.0f} s")
            return remaining

        for layout in self.layouts:
            lws = self.lws_name(layout.role)
            t = left()
            run = self._kubectl("wait", "--for=condition=Available", f"leaderworkerset/{lws}",
                                f"--timeout={t:.0f}s", timeout_s=t + 10)
            if run.returncode:
                raise LaunchError(f"{layout.role} instances ({lws}) were not available within "
                                  f"{timeout_s:.0f} s: {_last_line(run)}")
        t = left()
        run = self._kubectl("rollout", "status", f"deployment/{self.router_name}",
                            f"--timeout={t:.0f}s", timeout_s=t + 10)
        if run.returncode:
            raise LaunchError(f"the router ({self.router_name}) did not roll out: "
                              f"{_last_line(run)}")
        model = self.layouts[-1].model
        while True:
            t = left()
            run = self._kubectl("exec", f"deployment/{self.router_name}", "--", "python", "-c",
                                COMPLETION_PROBE, f"http://127.0.0.1:{self.router_port}", model,
                                timeout_s=min(t, 90.0))
            if run.returncode == 0:
                return
            if deadline - time.monotonic() <= POLL_S:
                raise LaunchError(f"no completion through the router ({self.router_name}) "
                                  f"within {timeout_s:.0f} s: {_last_line(run)}")
            time.sleep(POLL_S)

    def teardown(self) -> None:
        """`kubectl delete` what launch applied; safe to call twice."""
        if not self._applied or shutil.which("kubectl") is None:
            return
        self._applied = False
        self._kubectl("delete", "--ignore-not-found", "--wait=false",
                      *_file_args(reversed(self.files)))


def worker_script(layout: RoleLayout) -> str:
    """The `sh -c` command of a worker pod: the headless vllm with its start rank (and, when
    the last pod holds fewer ranks, its local size) from $LWS_WORKER_INDEX."""
    proc = layout.processes[1]
    per = layout.ranks_per_host
    exprs = {"address": "${LWS_LEADER_ADDRESS}", "start_rank": f"$((LWS_WORKER_INDEX * {per}))"}
    if len({layout.local_ranks(h) for h in range(1, layout.hosts)}) > 1:  # the last pod: the rest
        left = f"{layout.dp_size} - LWS_WORKER_INDEX * {per}"
        exprs["local"] = f"$(({left} < {per} ? {left} : {per}))"
    return shell_lines(["exec", *proc.shell_words(dp=exprs)]) + "\n"


class _Dumper(yaml.SafeDumper):
    """Safe YAML without anchors, multi-line strings (the worker script) as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def _file_args(files: Any) -> list[str]:
    return [arg for f in files for arg in ("-f", str(f))]


def _last_line(run: subprocess.CompletedProcess[str]) -> str:
    lines = (run.stderr or run.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit code {run.returncode}"
