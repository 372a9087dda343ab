"""Kubernetes: a rendered deployment as one flavor's objects, a kustomization, kubectl.

The flavor (`--flavor`, a table in executor/flavors/) decides which objects a deployment becomes:
llm-d (the default) is one LeaderWorkerSet per role in llm-d's wide-EP conventions
(executor/flavors/llm_d.py), dynamo one DynamoGraphDeployment (executor/flavors/dynamo.py),
kserve one LLMInferenceService (executor/flavors/kserve.py). Every flavor's engine pods share
what executor/backends/k8s_pod.py sets: the fabric of the hardware (InfiniBand devices, or an
NVL72 ComputeDomain), the model volume, HF_TOKEN from a Secret, resources and probes. llm-d's
routing (`--routing`: our router, or its InferencePool and endpoint picker) is
executor/backends/k8s_router.py's; the other flavors route through their own frontends. Names
come from the plan (`--name`, default the plan's file name); the pods serve the model by its
Hugging Face id (a preset's) or by a path on the model volume.

`render` writes one YAML file per object and a kustomization.yaml listing them under
<run_dir>/kubernetes/ (`kubectl apply -k` that folder to deploy it by hand); `launch` applies the
kustomization, `wait_ready` waits for what the flavor names and then, where the flavor says
where, sends one completion from inside the cluster; `teardown` deletes what was applied.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from executor.backends.base import Backend, LaunchError, write_atomic
from executor.backends.k8s_pod import (
    ROUTER_IMAGE,
    ModelVolume,
    PodSettings,
    fabric_for,
    served_model,
    to_yaml,
)
from executor.backends.k8s_router import ROUTINGS
from executor.backends.layout import dns_label, role_layouts
from executor.flavors import DEFAULT_FLAVOR, Flavor, Target, flavor_class
from executor.records import Rendered
from executor.render import render as render_deployment
from simulator.specs.deployment import Deployment
from simulator.specs.errors import SpecError

POLL_S = 5.0
MANIFEST_DIR = "kubernetes"
"""Folder under the run directory that holds the manifests."""
KUSTOMIZATION = "kustomization.yaml"
COMPLETION_PROBE = (
    "import json, sys, urllib.request as u; "
    "r = u.Request(sys.argv[1] + '/v1/completions', data=json.dumps({'model': sys.argv[2], "
    "'prompt': 'Hello', 'max_tokens': 1}).encode(), "
    "headers={'Content-Type': 'application/json'}); "
    "print(u.urlopen(r, timeout=60).status)")
"""Run inside a pod: one real completion."""


@dataclass(frozen=True)
class ClusterRendered(Rendered):
    """A rendering that knows its hardware (which picks the pods' fabric)."""

    hardware: str | None = None


class KubernetesBackend(Backend):
    """A rendered deployment as Kubernetes objects, applied with kubectl."""

    name: ClassVar[str] = "kubernetes"
    deploy_options: ClassVar[tuple[str, ...]] = (
        "flavor", "name", "routing", "image", "router_image", "model_volume",
        "hf_token_secret", "namespace", "gateway")
    """The `rackplan deploy` options this target takes (its keyword arguments)."""

    def __init__(self, rendered: Rendered, run_dir: Path, *, name: str | None = None,
                 namespace: str | None = None, flavor: str = DEFAULT_FLAVOR,
                 routing: str | None = None, image: str | None = None,
                 router_image: str = ROUTER_IMAGE, model_volume: str = "pvc:hf-cache",
                 hf_token_secret: str = "hf-token", gateway: str = "inference-gateway",
                 hardware: str | None = None) -> None:
        super().__init__(rendered, run_dir)
        self.app = dns_label(name or Path(run_dir).name.removeprefix("deploy-"), limit=40)
        """Prefix of every object's name."""
        self.namespace = namespace
        """Namespace for kubectl and the kustomization (None: the current context's)."""
        cls = flavor_class(flavor)
        if routing is not None and routing not in ROUTINGS:
            raise SpecError(f"unknown routing {routing!r}; valid: {', '.join(ROUTINGS)}")
        if routing is not None and routing not in cls.routings:
            raise SpecError(f"the {flavor} flavor routes through its own frontend; --routing "
                            f"{routing} applies to the flavors that take it (llm-d)")
        routing = routing or (cls.routings[0] if cls.routings else None)
        if hardware is None and isinstance(rendered, ClusterRendered):
            hardware = rendered.hardware
        self.settings = PodSettings(fabric=fabric_for(hardware), image=image,
                                    router_image=router_image,
                                    model_volume=ModelVolume.parse(model_volume),
                                    hf_token_secret=hf_token_secret)
        self.layouts = role_layouts(rendered)
        self.flavor: Flavor = cls(Target(
            app=self.app, rendered=rendered, layouts=tuple(self.layouts),
            model=served_model(self.layouts[0].model), settings=self.settings, routing=routing,
            gateway=dns_label(gateway, limit=63)))
        self.files: list[Path] = []
        self._applied = False

    @classmethod
    def render_for(cls, deployment: Deployment, model: str, **options: Any) -> Rendered:
        """The rendering, with the hardware it runs on (each host keeps its placeholder name;
        the pods' own addresses replace it)."""
        rendered = render_deployment(deployment, model)
        return ClusterRendered(rendered.processes, rendered.router, hardware=deployment.hardware)

    @property
    def folder(self) -> Path:
        return self.run_dir / MANIFEST_DIR

    @property
    def url(self) -> str:
        """Where clients inside the cluster reach the deployment."""
        return self.flavor.url

    def objects(self) -> list[dict[str, Any]]:
        """Every object, in the order they are applied."""
        return self.flavor.objects()

    def kustomization(self, files: list[Path]) -> dict[str, Any]:
        out: dict[str, Any] = {"apiVersion": "kustomize.config.k8s.io/v1beta1",
                               "kind": "Kustomization"}
        if self.namespace:
            out["namespace"] = self.namespace
        out["resources"] = [f.name for f in files]
        return out

    # --- Backend -------------------------------------------------------------------------

    def render(self) -> list[Path]:
        """One YAML file per object under <run_dir>/kubernetes/, in apply order, and the
        kustomization.yaml that lists them (last)."""
        self.files = []
        for n, obj in enumerate(self.objects()):
            kind, name = obj["kind"], obj["metadata"]["name"]
            text = f"# rackplan {self.app}: {kind} {name}\n" + to_yaml(obj)
            path = self.folder / f"{n:02d}-{kind.lower()}-{name}.yaml"
            self.files.append(write_atomic(path, text))
        kustomization = write_atomic(self.folder / KUSTOMIZATION,
                                     f"# rackplan {self.app}: kubectl apply -k this folder\n"
                                     + to_yaml(self.kustomization(self.files)))
        return [*self.files, kustomization]

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
        """`kubectl apply -k` the manifests' folder (rendering them first if needed)."""
        if shutil.which("kubectl") is None:
            raise LaunchError("kubectl not found on PATH; use --dry-run to write the manifests "
                              f"to {self.folder}")
        if not self.files:
            self.render()
        self._applied = True  # a partial apply still needs a teardown
        run = self._kubectl("apply", "-k", str(self.folder))
        if run.returncode:
            raise LaunchError(f"kubectl apply failed: {_last_line(run)}")

    def wait_ready(self, timeout_s: float) -> None:
        """Everything the flavor names ready, then one completion sent from inside the cluster
        (the router's pod, or an engine pod)."""
        deadline = time.monotonic() + timeout_s

        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LaunchError(f"the deployment was not ready within {timeout_s:.0f} s")
            return remaining

        for wait in self.flavor.waits():
            t = left()
            run = self._kubectl("wait", f"--for=condition={wait.condition}", wait.resource,
                                f"--timeout={t:.0f}s", timeout_s=t + 10)
            if run.returncode:
                raise LaunchError(f"{wait.what} were not {wait.condition.lower()} within "
                                  f"{timeout_s:.0f} s: {_last_line(run)}")
        if self.flavor.probe_in is None:
            return
        where, url = self.flavor.probe_in
        model = self.flavor.target.model
        while True:
            t = left()
            run = self._kubectl("exec", *where, "--", "python3", "-c", COMPLETION_PROBE, url,
                                model, timeout_s=min(t, 90.0))
            if run.returncode == 0:
                return
            if deadline - time.monotonic() <= POLL_S:
                raise LaunchError(f"no completion through {where[0]} within "
                                  f"{timeout_s:.0f} s: {_last_line(run)}")
            time.sleep(POLL_S)

    def teardown(self) -> None:
        """`kubectl delete -k` what launch applied; safe to call twice."""
        if not self._applied or shutil.which("kubectl") is None:
            return
        self._applied = False
        self._kubectl("delete", "--ignore-not-found", "--wait=false", "-k", str(self.folder))


def _last_line(run: subprocess.CompletedProcess[str]) -> str:
    lines = (run.stderr or run.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit code {run.returncode}"
