"""Manifests checked against the Kubernetes API schemas and the copied CRD schemas (README.md)."""

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
from kubernetes_validate.utils import latest_version
from referencing import Registry, Resource

HERE = Path(__file__).parent
K8S_DEFS = "https://kubernetes.io/api/_definitions.json"
CRDS = {
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io/v1", "leaderworkerset-v1.crd.json"),
    "InferencePool": ("inference.networking.k8s.io/v1", "inferencepool-v1.crd.json"),
    "ComputeDomain": ("resource.nvidia.com/v1beta1", "computedomain-v1beta1.crd.json"),
    "HTTPRoute": ("gateway.networking.k8s.io/v1", "httproute-v1.crd.json"),
    "DynamoGraphDeployment": ("nvidia.com/v1alpha1", "dynamographdeployment-v1alpha1.crd.json"),
    "LLMInferenceService": ("serving.kserve.io/v1alpha2", "llminferenceservice-v1alpha2.crd.json"),
}
"""kind -> (apiVersion, schema file)."""
DNS_1035 = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS_1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
NAME_RULES = {"LeaderWorkerSet": {"pattern": DNS_1035, "maxLength": 63}}
"""Names the API server (or the kind's webhook) accepts; others: a DNS-1123 subdomain."""
WEBHOOKS = {"LeaderWorkerSet": [(("spec", "leaderWorkerTemplate", "size"), {"minimum": 1})]}
"""What a kind's validating webhook adds to its CRD schema: (property path, rule); LWS's
pkg/webhooks/leaderworkerset_webhook.go refuses a group of fewer than one pod."""
NEWEST = ".".join(latest_version().split(".")[:2])


class ManifestError(AssertionError):
    """A manifest its schema refuses: which object, the field path, why."""


def strict(node: Any) -> Any:
    """A CRD schema as kubectl's strict field validation applies it: listed properties only."""
    if isinstance(node, list):
        return [strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items()}
    if node.get("nullable") and "type" in node:
        out["type"] = [node["type"], "null"]
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def full_version(version: str) -> str:
    return next(v for v in kubernetes_validate.utils.all_versions()
                if v.startswith(version + "."))


@cache
def k8s_definitions(version: str) -> dict[str, Any]:
    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    path = folder / f"v{full_version(version)}-local-strict" / "_definitions.json"
    return json.loads(path.read_text())


@cache
def crd_validator(kind: str, version: str) -> jsonschema.Draft202012Validator:
    """The kind's CRD schema, strict, its metadata this Kubernetes version's ObjectMeta."""
    api_version, file = CRDS[kind]
    schema = strict(json.loads((HERE / file).read_text()))
    name = NAME_RULES.get(kind, {"pattern": DNS_1123_SUBDOMAIN, "maxLength": 253})
    schema["required"] = sorted({*schema.get("required", ()), "apiVersion", "kind",
                                 "metadata", "spec"})
    schema["properties"]["apiVersion"] = {"const": api_version}
    schema["properties"]["kind"] = {"const": kind}
    schema["properties"]["metadata"] = {"allOf": [
        {"$ref": f"{K8S_DEFS}#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
        {"type": "object", "required": ["name"],
         "properties": {"name": {"type": "string", **name}}}]}
    for path, rule in WEBHOOKS.get(kind, []):
        node = schema
        for key in path:
            node = node["properties"][key]
        node.update(rule)
    registry = Registry().with_resource(K8S_DEFS,
                                        Resource.from_contents(k8s_definitions(version)))
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate(obj: dict[str, Any], version: str = NEWEST) -> None:
    """ManifestError naming the object and field path when `obj` fails its schema on this
    Kubernetes version (major.minor)."""
    where = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
    try:
        if obj.get("kind") in CRDS:
            error = jsonschema.exceptions.best_match(
                crd_validator(obj["kind"], version).iter_errors(obj))
            if error is not None:
                raise error
        else:
            kubernetes_validate.validate(obj, version, strict=True)
    except jsonschema.ValidationError as e:
        raise ManifestError(f"{where} (Kubernetes {version}): {e.json_path}: {e.message}") \
            from None
