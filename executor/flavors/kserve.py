"""KServe: one LLMInferenceService (serving.kserve.io/v1alpha2).

KServe's controller builds the vLLM pods from its own config and the service's fields: the model
(`model.uri`: `hf://ORG/NAME` for a Hugging Face id, `pvc://CLAIM/PATH` for a folder on the
model volume's claim), `replicas` and `parallelism` (tensor, data, dataLocal, expert) of the
decode (or aggregated) instances at the top, and the same in the `prefill` block for prefill
instances. An instance that spans hosts gets a `worker` pod template beside its `template`
(KServe runs it as a LeaderWorkerSet). What the plan sets beyond parallelism — batching, memory,
cache, experts, EPLB, MTP, NixlConnector's role — goes to vLLM through KServe's
VLLM_ADDITIONAL_ARGS. The `router` block asks KServe for its Gateway route and its scheduler
(the inference extension's InferencePool and endpoint picker). The containers ask for their
GPUs, the fabric's devices, CPU and memory, and have startup, liveness and readiness probes on
KServe's HTTPS port; on GB200/GB300 every pod claims the ComputeDomain's IMEX channel.
"""

from __future__ import annotations

import shlex
from typing import Any, ClassVar

from executor.backends.k8s_pod import (
    CHANNEL_CLAIM,
    MODEL_MOUNT,
    compute_domain,
    engine_env,
    engine_resources,
    probes,
)
from executor.backends.layout import RoleLayout
from executor.flavors.base import Flavor, Wait
from executor.records import flag_words
from simulator.specs.errors import SpecError

LLMISVC_API = "serving.kserve.io/v1alpha2"
KSERVE_PORT = 8000
"""The port KServe's vLLM container serves on (HTTPS)."""


class KServe(Flavor):
    """An LLMInferenceService: decode (or aggregated) at the top, prefill in its block."""

    name: ClassVar[str] = "kserve"

    @property
    def channel_template(self) -> str | None:
        return (f"{self.target.app}-cd-channel" if self.target.settings.fabric.compute_domain
                else None)

    @property
    def url(self) -> str:
        return f"llminferenceservice/{self.target.app} (its URL in the resource's status)"

    def model_uri(self) -> str:
        """hf://ID, or pvc://CLAIM/PATH for a folder on the model volume."""
        model, volume = self.target.model, self.target.settings.model_volume
        if not model.startswith("/"):
            return f"hf://{model}"
        if volume.kind != "pvc":
            raise SpecError(f"the kserve flavor reads a model folder ({model}) from a "
                            "PersistentVolumeClaim only; give --model-volume pvc:CLAIM or a "
                            "Hugging Face id")
        return f"pvc://{volume.source}/{model.removeprefix(MODEL_MOUNT + '/')}"

    def additional_args(self, layout: RoleLayout) -> str:
        """The role's engine flags KServe passes on (its own: model, port, parallelism)."""
        return shlex.join(flag_words(layout.head.flags))

    def pod(self, layout: RoleLayout) -> dict[str, Any]:
        """The pod template of the role's pods (the same for a multi-host instance's workers)."""
        settings, head = self.target.settings, layout.head
        container: dict[str, Any] = {
            "name": "main",
            "env": engine_env(head, settings, (("VLLM_ADDITIONAL_ARGS",
                                                 self.additional_args(layout)),), cache=False),
            "resources": engine_resources(layout.gpus_per_host, settings.fabric),
            **probes(KSERVE_PORT, scheme="HTTPS")}
        if settings.fabric.capabilities:
            container["securityContext"] = {"capabilities": {"add": list(
                settings.fabric.capabilities)}}
        pod: dict[str, Any] = {"containers": [container]}
        if self.channel_template is not None:
            pod["resourceClaims"] = [{"name": CHANNEL_CLAIM,
                                      "resourceClaimTemplateName": self.channel_template}]
        return pod

    def workload(self, layout: RoleLayout) -> dict[str, Any]:
        """replicas, parallelism, template (and worker) of one role."""
        head = layout.head
        parallelism: dict[str, Any] = {"tensor": head.tp}
        if head.dp is not None:
            parallelism.update(data=head.dp.size, dataLocal=head.dp.local)
        if head.has("--enable-expert-parallel"):
            parallelism["expert"] = True
        out: dict[str, Any] = {"replicas": layout.instances, "parallelism": parallelism,
                               "template": self.pod(layout)}
        if layout.hosts > 1:
            out["worker"] = self.pod(layout)
        return out

    def service(self) -> dict[str, Any]:
        roles = {lay.role: lay for lay in self.target.layouts}
        main = roles.get("decode") or roles.get("aggregated")
        if main is None:
            raise SpecError("the kserve flavor needs decode or aggregated instances")
        spec: dict[str, Any] = {"model": {"uri": self.model_uri(), "name": self.target.model},
                                **self.workload(main)}
        if "prefill" in roles:
            spec["prefill"] = self.workload(roles["prefill"])
        spec["router"] = {"scheduler": {}, "route": {}, "gateway": {}}
        return {"apiVersion": LLMISVC_API, "kind": "LLMInferenceService",
                "metadata": {"name": self.target.app, "labels": self.target.labels("service")},
                "spec": spec}

    def objects(self) -> list[dict[str, Any]]:
        objs: list[dict[str, Any]] = []
        if self.channel_template is not None:
            objs.append(compute_domain(f"{self.target.app}-cd", self.target.labels("fabric")))
        return [*objs, self.service()]

    def waits(self) -> list[Wait]:
        return [Wait(f"llminferenceservice/{self.target.app}", "Ready",
                     f"the LLMInferenceService ({self.target.app})")]

    @property
    def probe_in(self) -> None:
        """None: KServe's Ready condition already says its pods answer their probes and its
        route is programmed; its pods' names are KServe's own."""
        return None
