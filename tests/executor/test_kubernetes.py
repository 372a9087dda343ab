"""executor/backends/kubernetes: manifests checked against the Kubernetes API schema, worker
pods' ranks, the router, and kubectl driven for real (a fake kubectl records the calls)."""

import json
import subprocess
from dataclasses import replace
from importlib import resources
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version
from referencing import Registry, Resource

from executor.backends import kubernetes
from executor.backends.base import LaunchError
from executor.backends.kubernetes import KubernetesBackend, worker_script
from executor.proxy import RouterConfig
from tests.executor.cluster import (
    calls,
    fake_tool,
    pd_rendering,
    uneven_rendering,
    use_path,
)

LWS_SCHEMA = Path(__file__).parent / "schemas" / "leaderworkerset-v1.json"
K8S_DEFS = "https://kubernetes.io/api/_definitions.json"
VERSIONS = ["1.29", ".".join(latest_version().split(".")[:2])]
"""The oldest Kubernetes the manifests target, and the newest kubernetes-validate knows."""


def lws_validator(version: str) -> jsonschema.Draft202012Validator:
    """The LeaderWorkerSet schema, its pod templates resolved against this Kubernetes
    version's strict API schema."""
    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    full = next(v for v in kubernetes_validate.utils.all_versions()
                if v.startswith(version + "."))
    defs = json.loads((folder / f"v{full}-local-strict" / "_definitions.json").read_text())
    schema = json.loads(LWS_SCHEMA.read_text())
    registry = Registry().with_resources([(K8S_DEFS, Resource.from_contents(defs)),
                                          (schema["$id"], Resource.from_contents(schema))])
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate(obj: dict, version: str) -> None:
    if obj["kind"] == "LeaderWorkerSet":
        lws_validator(version).validate(obj)
    else:
        kubernetes_validate.validate(obj, version, strict=True)


def written(tmp_path, rendered=None) -> tuple[KubernetesBackend, list[dict]]:
    backend = KubernetesBackend(rendered or pd_rendering(), tmp_path / "deploy-dsv3")
    return backend, [yaml.safe_load(p.read_text()) for p in backend.render()]


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("rendering", [pd_rendering, uneven_rendering])
def test_every_manifest_validates_against_the_kubernetes_api_schema(tmp_path, version,
                                                                    rendering):
    _, objs = written(tmp_path, rendering())
    assert {o["kind"] for o in objs} == {"LeaderWorkerSet", "Service", "ConfigMap",
                                         "Deployment"}
    for obj in objs:
        validate(obj, version)


def test_the_schemas_refuse_what_the_api_server_would(tmp_path):
    """The validation is not vacuous: a misspelled field, a wrong type or a bad name fail."""
    _, objs = written(tmp_path)
    lws = by_kind(objs, "LeaderWorkerSet")[1]
    broken = json.loads(json.dumps(lws))
    broken["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0][
        "resource"] = {}
    with pytest.raises(jsonschema.ValidationError, match="resource"):
        validate(broken, VERSIONS[-1])
    broken = json.loads(json.dumps(lws))
    broken["spec"]["leaderWorkerTemplate"]["size"] = 0
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, VERSIONS[-1])
    broken = json.loads(json.dumps(lws))
    broken["metadata"]["name"] = "DSV3_decode"
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, VERSIONS[-1])
    deployment = json.loads(json.dumps(by_kind(objs, "Deployment")[0]))
    deployment["spec"]["template"]["spec"]["containers"][0]["comand"] = ["x"]
    with pytest.raises(jsonschema.ValidationError, match="comand"):
        validate(deployment, VERSIONS[-1])


def test_one_leader_worker_set_per_role_sized_by_instances_and_hosts(tmp_path):
    _, objs = written(tmp_path)
    prefill, decode = by_kind(objs, "LeaderWorkerSet")
    assert prefill["metadata"]["name"] == "dsv3-prefill"
    assert prefill["spec"]["replicas"] == 4 and decode["spec"]["replicas"] == 1
    assert prefill["spec"]["leaderWorkerTemplate"]["size"] == 1
    assert decode["spec"]["leaderWorkerTemplate"]["size"] == 5
    assert "leaderTemplate" not in prefill["spec"]["leaderWorkerTemplate"]  # one pod: leader
    for lws in (prefill, decode):
        for key in ("leaderTemplate", "workerTemplate"):
            template = lws["spec"]["leaderWorkerTemplate"].get(key)
            if template is None:
                continue
            pod = template["spec"]
            (container,) = pod["containers"]
            assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
            assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
            assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
            nixl = {e["name"]: e for e in container["env"]}["VLLM_NIXL_SIDE_CHANNEL_HOST"]
            assert nixl["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_leaders_run_the_head_command_with_the_lws_leader_address(tmp_path):
    rendered = pd_rendering()
    _, objs = written(tmp_path, rendered)
    decode = by_kind(objs, "LeaderWorkerSet")[1]["spec"]["leaderWorkerTemplate"]
    (leader,) = decode["leaderTemplate"]["spec"]["containers"]
    head = next(p for p in rendered.processes if p.instance == "decode-0" and p.host == 0)
    assert head.dp is not None and head.dp.address == "host4"
    expected = replace(head, dp=replace(head.dp, address="$(LWS_LEADER_ADDRESS)")).to_argv()
    assert leader["command"] == ["vllm", "serve"] and leader["args"] == list(expected[2:])
    assert leader["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert leader["ports"] == [{"name": "http", "containerPort": head.port}]
    (worker,) = decode["workerTemplate"]["spec"]["containers"]
    assert "readinessProbe" not in worker and worker["command"] == ["/bin/sh", "-c"]


def run_worker(tmp_path, script: str, index: int) -> list[str]:
    """The argv `vllm` gets when the worker script runs in pod `index` (a fake vllm prints it)."""
    bin_dir = tmp_path / "bin"
    fake = bin_dir / "vllm"
    if not fake.exists():
        bin_dir.mkdir(exist_ok=True)
        fake.write_text('#!/bin/sh\nprintf "%s\\n" vllm "$@"\n')
        fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LWS_WORKER_INDEX": str(index),
           "LWS_LEADER_ADDRESS": "dsv3-decode-0.dsv3-decode.default"}
    out = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True,
                         check=True)
    return out.stdout.splitlines()


@pytest.mark.parametrize("rendering", [pd_rendering, uneven_rendering])
def test_worker_pods_run_the_rendered_headless_command_with_their_ranks(tmp_path, rendering):
    """Every worker pod's shell wrapper, run for real, starts exactly the rendered headless
    process of its host (its start rank and local size from LWS_WORKER_INDEX), and the pods of
    an instance hold every data-parallel rank once."""
    rendered = rendering()
    backend = KubernetesBackend(rendered, tmp_path / "run")
    layout = next(lay for lay in backend.layouts if lay.hosts > 1)
    assert layout.head.dp is not None
    ranks = list(range(layout.head.dp.local))
    script = worker_script(layout)
    for proc in layout.processes[1:]:
        got = run_worker(tmp_path, script, proc.host)
        assert proc.dp is not None and proc.dp.headless
        expected = replace(proc, dp=replace(proc.dp, address="dsv3-decode-0.dsv3-decode.default"))
        assert got == list(expected.to_argv())  # so its start rank and local size are the record's
        ranks += range(proc.dp.start_rank, proc.dp.start_rank + proc.dp.local)
    assert sorted(ranks) == list(range(layout.dp_size))


def test_role_services_select_leaders_and_the_router_reaches_every_instance(tmp_path):
    _, objs = written(tmp_path)
    services = {s["metadata"]["name"]: s["spec"] for s in by_kind(objs, "Service")}
    assert services["dsv3-decode-leaders"]["selector"] == {
        "leaderworkerset.sigs.k8s.io/name": "dsv3-decode",
        "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    assert services["dsv3-decode-leaders"]["ports"][0]["port"] == 8104
    assert services["dsv3-router"]["ports"][0]["port"] == 8099
    (cm,) = by_kind(objs, "ConfigMap")
    config = json.loads(cm["data"]["router.json"])
    assert config["host"] == "0.0.0.0" and config["port"] == 8099
    assert config["prefill_urls"] == [f"http://dsv3-prefill-{i}.dsv3-prefill:8100"
                                      for i in range(4)]
    assert config["decode_urls"] == ["http://dsv3-decode-0.dsv3-decode:8104"]
    assert (config["prefill_policy"], config["decode_policy"]) == ("prefix_aware",
                                                                   "least_requests")
    RouterConfig.from_dict(config)  # the proxy accepts it as it is
    (router,) = by_kind(objs, "Deployment")
    pod = router["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "executor.proxy", "--config",
                                    "/etc/rackplan/router.json"]
    assert container["volumeMounts"][0]["mountPath"] == "/etc/rackplan"
    assert pod["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"]
    assert router["spec"]["selector"]["matchLabels"] == router["spec"]["template"][
        "metadata"]["labels"]


def test_render_writes_the_same_bytes_twice_and_leaves_no_temporary_file(tmp_path):
    backend = KubernetesBackend(pd_rendering(), tmp_path / "run")
    first = {p: p.read_bytes() for p in backend.render()}
    second = {p: p.read_bytes() for p in backend.render()}
    assert first == second and len(first) == 7
    assert sorted((tmp_path / "run" / "kubernetes").iterdir()) == sorted(first)


def test_launch_wait_and_teardown_drive_kubectl(tmp_path, monkeypatch):
    log = tmp_path / "kubectl.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    fake_tool(tmp_path / "bin", "kubectl", "exit 0\n")
    use_path(monkeypatch, tmp_path / "bin")
    backend = KubernetesBackend(pd_rendering(), tmp_path / "deploy-dsv3", namespace="serving")
    files = backend.render()
    assert calls(log) == []  # render starts nothing
    backend.launch()
    backend.wait_ready(60)
    backend.teardown()
    backend.teardown()
    got = calls(log)
    applied = " ".join(f"-f {f}" for f in files)
    assert got[0] == f"kubectl --namespace serving apply {applied}"
    assert got[1].startswith("kubectl --namespace serving wait --for=condition=Available "
                             "leaderworkerset/dsv3-prefill --timeout=")
    assert "leaderworkerset/dsv3-decode" in got[2]
    assert got[3].startswith("kubectl --namespace serving rollout status deployment/dsv3-router")
    assert got[4].startswith("kubectl --namespace serving exec deployment/dsv3-router -- "
                             "python -c")
    assert got[4].endswith("http://127.0.0.1:8099 /models/DeepSeek-V3")
    deleted = " ".join(f"-f {f}" for f in reversed(files))
    assert got[5:] == [f"kubectl --namespace serving delete --ignore-not-found --wait=false "
                       f"{deleted}"]
    assert backend.url == "http://dsv3-router:8099"


def test_a_failed_apply_or_wait_is_a_launch_error_with_kubectl_s_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "kubectl.log"))
    fake_tool(tmp_path / "bin", "kubectl", """\
        if [[ "$1" == apply ]]; then
          echo 'error: resource mapping not found for kind "LeaderWorkerSet"' >&2; exit 1
        fi
        """)
    use_path(monkeypatch, tmp_path / "bin")
    backend = KubernetesBackend(pd_rendering(), tmp_path / "run")
    with pytest.raises(LaunchError, match='kubectl apply failed: error: resource mapping not '
                                          'found for kind "LeaderWorkerSet"'):
        backend.launch()
    backend.teardown()  # a partial apply is deleted
    assert calls(tmp_path / "kubectl.log")[-1].startswith("kubectl delete")
    fake_tool(tmp_path / "bin", "kubectl", """\
        if [[ "$1" == wait ]]; then
          echo 'error: timed out waiting for the condition' >&2; exit 1
        fi
        """)
    with pytest.raises(LaunchError, match=r"prefill instances \(run-prefill\) were not "
                                          "available within 5 s: error: timed out"):
        backend.wait_ready(5)
    fake_tool(tmp_path / "bin", "kubectl", """\
        if [[ "$1" == exec ]]; then
          echo 'urlopen error [Errno 111] Connection refused' >&2; exit 1
        fi
        """)
    monkeypatch.setattr(kubernetes, "POLL_S", 0.05)
    with pytest.raises(LaunchError, match=r"no completion through the router \(run-router\) "
                                          r"within 1 s: urlopen error \[Errno 111\]"):
        backend.wait_ready(1)


def test_pods_of_attention_dp_over_tp_groups_ask_for_every_gpu_they_use(tmp_path):
    """DEP4 x TP4 on 8-GPU hosts: two DP ranks of four GPUs per pod, so eight GPUs a pod (the
    record's dp.local x tp), and worker pods start at rank 2 x their index."""
    from executor.render import render
    from simulator.specs.deployment import Deployment, RoleSpec

    d = Deployment(model="deepseek-v3", hardware="h200", aggregated=RoleSpec(dep=4, tp=4))
    rendered = render(d, model_path="/models/DeepSeek-V3")
    _, objs = written(tmp_path, rendered)
    (lws,) = by_kind(objs, "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    for key in ("leaderTemplate", "workerTemplate"):
        (container,) = template[key]["spec"]["containers"]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    (layout,) = KubernetesBackend(rendered, tmp_path / "run").layouts
    assert (layout.gpus_per_host, layout.ranks_per_host) == (8, 2)
    assert '"$((LWS_WORKER_INDEX * 2))"' in worker_script(layout)
