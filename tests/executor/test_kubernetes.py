"""executor/backends/kubernetes with the llm-d flavor: manifests checked against the Kubernetes
API schemas and the copied CRD schemas, the pods' ranks (their script run for real), fabric,
model volume, probes and resources, both routings, the kustomization, and kubectl driven for
real (a fake kubectl records the calls)."""

import copy
import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from executor.backends import kubernetes
from executor.backends.base import LaunchError
from executor.backends.kubernetes import KubernetesBackend
from executor.proxy import RouterConfig
from simulator.specs.errors import SpecError
from simulator.specs.loading import load_deployment
from tests.executor.cluster import (
    V3,
    calls,
    fake_tool,
    k8s_v4,
    pd_rendering,
    uneven_rendering,
    use_path,
)
from tests.executor.schemas.validate import NEWEST, ManifestError, validate


def rendering_of(path: Path):
    d = load_deployment(path)
    return KubernetesBackend.render_for(d, d.model)


v4_rendering = k8s_v4


def written(tmp_path, rendered=None, **options) -> tuple[KubernetesBackend, list[dict]]:
    backend = KubernetesBackend(rendered or pd_rendering(), tmp_path / "deploy-dsv3", **options)
    files = backend.render()
    assert files[-1].name == "kustomization.yaml"
    return backend, [yaml.safe_load(p.read_text()) for p in files[:-1]]


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def pod_spec(lws: dict) -> dict:
    return lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]


def vllm(lws: dict) -> dict:
    return next(c for c in pod_spec(lws)["containers"] if c["name"] == "vllm")


CASES = [(pd_rendering, "router", "1.29"), (uneven_rendering, "router", "1.29"),
         (pd_rendering, "epp", "1.29"), (v4_rendering, "router", "1.32"),
         (v4_rendering, "epp", "1.32")]
"""(rendering, routing, the oldest Kubernetes it targets: DRA claims need 1.32)."""


@pytest.mark.parametrize(("rendering", "routing", "oldest"), CASES)
def test_every_manifest_validates_against_its_schema(tmp_path, rendering, routing, oldest):
    """Kubernetes kinds against the API's strict schema; LeaderWorkerSet, InferencePool and
    ComputeDomain against their CRDs' schemas."""
    _, objs = written(tmp_path, rendering(), routing=routing)
    kinds = {o["kind"] for o in objs}
    assert {"LeaderWorkerSet", "Service"} <= kinds
    assert ("InferencePool" in kinds) == (routing == "epp")
    for obj in objs:
        for version in (oldest, NEWEST):
            validate(obj, version)


def test_the_schemas_refuse_what_the_api_server_would_and_name_the_field(tmp_path):
    _, objs = written(tmp_path, v4_rendering(), routing="epp")
    lws = by_kind(objs, "LeaderWorkerSet")[1]

    def refused(obj: dict, edit, match: str) -> None:
        broken = copy.deepcopy(obj)
        edit(broken)
        with pytest.raises(ManifestError, match=match):
            validate(broken)

    def typo(o):
        pod_spec(o)["containers"][0]["resource"] = {}

    refused(lws, typo, r"\$\.spec\.leaderWorkerTemplate\.workerTemplate\.spec\.containers\[0\]: "
                       r"Additional properties .*'resource'")
    refused(lws, lambda o: o["spec"]["leaderWorkerTemplate"].update(size=0),
            r"\$\.spec\.leaderWorkerTemplate\.size: 0 is less than the minimum of 1")
    refused(lws, lambda o: o["metadata"].update(name="DSV3_decode"), r"\$\.metadata\.name")
    refused(lws, lambda o: o["spec"].update(replicas="2"), r"\$\.spec\.replicas: '2' is not of")
    (pool,) = by_kind(objs, "InferencePool")
    refused(pool, lambda o: o["spec"].pop("targetPorts"), r"'targetPorts' is a required")
    refused(pool, lambda o: o["spec"]["targetPorts"][0].update(number=70000),
            r"\$\.spec\.targetPorts\[0\]\.number")
    (domain,) = by_kind(objs, "ComputeDomain")
    refused(domain, lambda o: o["spec"]["channel"].update(allocationMode="Some"),
            r"\$\.spec\.channel\.allocationMode: 'Some' is not one of")
    (route,) = by_kind(objs, "HTTPRoute")
    refused(route, lambda o: o["spec"]["rules"][0]["matches"][0]["path"].update(type="Glob"),
            r"\$\.spec\.rules\[0\]\.matches\[0\]\.path\.type: 'Glob' is not one of")
    deployment = by_kind(objs, "Deployment")[0]
    refused(deployment, lambda o: o["spec"]["template"]["spec"]["containers"][0].update(
        comand=["x"]), r"containers\[0\]: .*'comand'")


def test_one_leader_worker_set_per_role_of_alike_pods(tmp_path):
    _, objs = written(tmp_path)
    prefill, decode = by_kind(objs, "LeaderWorkerSet")
    assert prefill["metadata"]["name"] == "dsv3-prefill"
    assert prefill["spec"]["replicas"] == 4 and decode["spec"]["replicas"] == 1
    assert decode["spec"]["leaderWorkerTemplate"]["size"] == 5
    for lws in (prefill, decode):
        template = lws["spec"]["leaderWorkerTemplate"]
        assert "leaderTemplate" not in template  # the leader is worker 0, like the others
        labels = template["workerTemplate"]["metadata"]["labels"]
        assert labels["llm-d.ai/inference-serving"] == "true"
        assert labels["llm-d.ai/model"] == "DeepSeek-V3"
        assert labels["llm-d.ai/role"] == lws["metadata"]["name"].split("-")[-1]


def test_h200_pods_ask_for_gpus_rdma_cpu_and_memory_and_run_over_infiniband(tmp_path):
    _, objs = written(tmp_path, rendering_of(V3))
    assert not by_kind(objs, "ComputeDomain")
    for lws in by_kind(objs, "LeaderWorkerSet"):
        container, pod = vllm(lws), pod_spec(lws)
        resources = container["resources"]
        assert resources["limits"] == {"nvidia.com/gpu": "8", "rdma/ib": "1", "memory": "768Gi"}
        assert resources["requests"] == {**resources["limits"], "cpu": "64"}
        assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK", "SYS_RAWIO"]
        env = {e["name"]: e for e in container["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "status.podIP"}}
        for key, value in [("NVSHMEM_REMOTE_TRANSPORT", "ibgda"), ("UCX_TLS",
                           "rc,sm,cuda_ipc,cuda_copy,tcp"), ("NCCL_SOCKET_IFNAME", "eth0"),
                           ("GLOO_SOCKET_IFNAME", "eth0"), ("HF_HUB_CACHE", "/models/hub")]:
            assert env[key]["value"] == value
        assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {
            "name": "hf-token", "key": "HF_TOKEN", "optional": True}}
        assert {"name": "models", "persistentVolumeClaim": {"claimName": "hf-cache"}} in \
            pod["volumes"]
        assert {"name": "models", "mountPath": "/models"} in container["volumeMounts"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        assert "resourceClaims" not in pod


def test_gb300_pods_claim_one_compute_domain_and_use_multi_node_nvlink(tmp_path):
    _, objs = written(tmp_path, v4_rendering())
    (domain,) = by_kind(objs, "ComputeDomain")
    template = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    assert objs[0] is domain  # applied before the pods that claim it
    for lws in by_kind(objs, "LeaderWorkerSet"):
        container, pod = vllm(lws), pod_spec(lws)
        assert pod["resourceClaims"] == [{"name": "compute-domain-channel",
                                          "resourceClaimTemplateName": template}]
        assert container["resources"]["claims"] == [{"name": "compute-domain-channel"}]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
        assert "rdma/ib" not in container["resources"]["limits"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["NCCL_MNNVL_ENABLE"] == "1" and env["UCX_CUDA_IPC_ENABLE_MNNVL"] == "y"


def test_every_pod_has_startup_liveness_and_readiness_probes(tmp_path):
    for routing in ("router", "epp"):
        _, objs = written(tmp_path, routing=routing)
        for obj in objs:
            if obj["kind"] == "LeaderWorkerSet":
                pods = [pod_spec(obj)]
            elif obj["kind"] == "Deployment":
                pods = [obj["spec"]["template"]["spec"]]
            else:
                continue
            for pod in pods:
                for container in pod["containers"]:
                    assert {"startupProbe", "livenessProbe", "readinessProbe"} <= set(container)
                    assert container["resources"]["requests"]


def test_the_pods_serve_the_preset_s_hugging_face_id_or_a_path_on_the_model_volume(tmp_path):
    _, objs = written(tmp_path, v4_rendering())
    prefill = vllm(by_kind(objs, "LeaderWorkerSet")[0])
    assert prefill["command"] == ["vllm", "serve"]
    assert prefill["args"][0] == "deepseek-ai/DeepSeek-V4-Flash"
    _, objs = written(tmp_path, model_volume="host:/mnt/models")  # /models/DeepSeek-V3
    pod = pod_spec(by_kind(objs, "LeaderWorkerSet")[0])
    assert vllm(by_kind(objs, "LeaderWorkerSet")[0])["args"][0] == "/models/DeepSeek-V3"
    assert {"name": "models", "hostPath": {"path": "/mnt/models",
                                           "type": "DirectoryOrCreate"}} in pod["volumes"]
    elsewhere = KubernetesBackend.render_for(load_deployment(V3), "/srv/DeepSeek-V3")
    with pytest.raises(SpecError, match="model path /srv/DeepSeek-V3 is not on the model "
                                        "volume, which the pods mount at /models"):
        KubernetesBackend(elsewhere, tmp_path / "run")
    with pytest.raises(SpecError, match="model volume 'nfs:x'; give pvc:CLAIM"):
        KubernetesBackend(pd_rendering(), tmp_path / "run", model_volume="nfs:x")


def run_pod(tmp_path, script: str, index: int, group_size: int) -> list[str]:
    """The argv `vllm` gets when the pod script runs in pod `index` (a fake vllm prints it)."""
    bin_dir = tmp_path / "bin"
    fake = bin_dir / "vllm"
    if not fake.exists():
        bin_dir.mkdir(exist_ok=True)
        fake.write_text('#!/bin/sh\nprintf "%s\\n" vllm "$@"\n')
        fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LWS_WORKER_INDEX": str(index),
           "LWS_GROUP_SIZE": str(group_size), "LWS_LEADER_ADDRESS": "dsv3-decode-0.dsv3-decode",
           "DP_SIZE_LOCAL": "8"}
    out = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True,
                         check=True)
    return out.stdout.splitlines()


@pytest.mark.parametrize("rendering", [pd_rendering, uneven_rendering])
def test_every_pod_runs_its_slice_of_ranks_with_hybrid_load_balancing(tmp_path, rendering):
    """Each pod's script, run for real with LeaderWorkerSet's environment, starts the rendered
    process of its host — its start rank and local size — serving its own API
    (--data-parallel-hybrid-lb, never --headless); the pods of an instance hold every rank
    once."""
    rendered = rendering()
    backend, objs = written(tmp_path, rendered)
    layout = next(lay for lay in backend.layouts if lay.hosts > 1)
    lws = next(o for o in objs if o["metadata"]["name"].endswith(layout.role))
    container = vllm(lws)
    assert container["command"] == ["/bin/sh", "-c"]
    assert {"name": "DP_SIZE_LOCAL", "value": "8"} in container["env"]
    ranks: list[int] = []
    for proc in layout.processes:
        got = run_pod(tmp_path, container["args"][0], proc.host, layout.hosts)
        assert proc.dp is not None
        expected = replace(proc, model="/models/DeepSeek-V3", port=layout.port,
                           flags=(*proc.flags, ("--data-parallel-hybrid-lb", None)),
                           dp=replace(proc.dp, address="dsv3-decode-0.dsv3-decode",
                                      headless=False, start_rank=proc.dp.start_rank or 1))
        words = list(expected.to_argv())
        if proc.dp.start_rank == 0:  # the leader names its start rank 0
            words[words.index("--data-parallel-start-rank") + 1] = "0"
        assert got == words
        ranks += range(proc.dp.start_rank, proc.dp.start_rank + proc.dp.local)
    assert sorted(ranks) == list(range(layout.dp_size))


def test_our_router_reaches_every_pod_and_role_services_select_them(tmp_path):
    _, objs = written(tmp_path)
    services = {s["metadata"]["name"]: s["spec"] for s in by_kind(objs, "Service")}
    assert services["dsv3-decode-http"]["selector"] == {
        "leaderworkerset.sigs.k8s.io/name": "dsv3-decode"}
    assert services["dsv3-decode-http"]["ports"][0]["port"] == 8104
    assert services["dsv3-router"]["ports"][0]["port"] == 8099
    (cm,) = by_kind(objs, "ConfigMap")
    config = json.loads(cm["data"]["router.json"])
    assert config["host"] == "0.0.0.0" and config["port"] == 8099
    assert config["prefill_urls"] == [f"http://dsv3-prefill-{i}.dsv3-prefill:8100"
                                      for i in range(4)]
    assert config["decode_urls"] == ["http://dsv3-decode-0.dsv3-decode:8104"] + [
        f"http://dsv3-decode-0-{j}.dsv3-decode:8104" for j in range(1, 5)]
    assert (config["prefill_policy"], config["decode_policy"]) == ("prefix_aware",
                                                                   "least_requests")
    RouterConfig.from_dict(config)  # the proxy accepts it as it is
    (router,) = by_kind(objs, "Deployment")
    (container,) = router["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "rackplan-router:0.1.0"
    assert container["command"] == ["python", "-m", "executor.proxy", "--config",
                                    "/etc/rackplan/router.json"]
    _, objs = written(tmp_path, router_image="registry.example/rackplan-router:1")
    (router,) = by_kind(objs, "Deployment")
    assert router["spec"]["template"]["spec"]["containers"][0]["image"] == \
        "registry.example/rackplan-router:1"


def test_epp_routing_is_an_inference_pool_its_picker_and_decode_sidecars(tmp_path):
    _, objs = written(tmp_path, routing="epp")
    (pool,) = by_kind(objs, "InferencePool")
    assert pool["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/instance": "dsv3", "llm-d.ai/inference-serving": "true"}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {"name": "dsv3-epp", "port": {"number": 9002}}
    (route,) = by_kind(objs, "HTTPRoute")
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io",
                                            "kind": "Gateway", "name": "inference-gateway"}]
    assert route["spec"]["rules"][0]["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "dsv3"}]
    _, other = written(tmp_path, routing="epp", gateway="prod-gw")
    assert by_kind(other, "HTTPRoute")[0]["spec"]["parentRefs"][0]["name"] == "prod-gw"
    (epp,) = by_kind(objs, "Deployment")
    args = epp["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["--pool-name", "dsv3"]
    (config,) = [c for c in by_kind(objs, "ConfigMap") if c["metadata"]["name"] == "dsv3-epp"]
    plugins = {p["type"] for p in yaml.safe_load(config["data"]["epp.yaml"])["plugins"]}
    assert {"pd-profile-handler", "prefill-filter", "decode-filter"} <= plugins
    assert {"ServiceAccount", "Role", "RoleBinding"} <= {o["kind"] for o in objs}
    prefill, decode = by_kind(objs, "LeaderWorkerSet")
    assert "initContainers" not in pod_spec(prefill)
    assert vllm(prefill)["ports"][0]["containerPort"] == 8000
    (sidecar,) = pod_spec(decode)["initContainers"]
    assert sidecar["restartPolicy"] == "Always" and "--port=8000" in sidecar["args"]
    assert "--vllm-port=8200" in sidecar["args"]
    assert "--port \\\n  8200" not in vllm(decode)["args"][0]
    assert vllm(decode)["args"][0].rstrip().endswith("--port 8200")
    assert not by_kind(objs, "ConfigMap")[0]["metadata"]["name"].endswith("router")
    with pytest.raises(SpecError, match="unknown routing 'gateway'; valid: router, epp"):
        KubernetesBackend(pd_rendering(), tmp_path / "run", routing="gateway")


def test_names_come_from_the_name_given(tmp_path):
    backend, objs = written(tmp_path, name="DSv3 Prod!")
    assert backend.app == "dsv3-prod"
    assert {o["metadata"]["name"] for o in by_kind(objs, "LeaderWorkerSet")} == {
        "dsv3-prod-prefill", "dsv3-prod-decode"}
    with pytest.raises(SpecError, match="unknown flavor 'kueue'; valid flavors: llm-d"):
        KubernetesBackend(pd_rendering(), tmp_path / "run", flavor="kueue")


def test_render_writes_the_same_bytes_twice_and_a_kustomization_of_them(tmp_path):
    backend = KubernetesBackend(pd_rendering(), tmp_path / "run", namespace="serving")
    first = {p: p.read_bytes() for p in backend.render()}
    second = {p: p.read_bytes() for p in backend.render()}
    assert first == second and len(first) == 8
    assert sorted((tmp_path / "run" / "kubernetes").iterdir()) == sorted(first)
    kustomization = yaml.safe_load((tmp_path / "run" / "kubernetes" /
                                    "kustomization.yaml").read_text())
    assert kustomization["namespace"] == "serving"
    assert kustomization["resources"] == [p.name for p in sorted(first)][:-1]


def test_launch_wait_and_teardown_drive_kubectl(tmp_path, monkeypatch):
    log = tmp_path / "kubectl.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    fake_tool(tmp_path / "bin", "kubectl", "exit 0\n")
    use_path(monkeypatch, tmp_path / "bin")
    backend = KubernetesBackend(pd_rendering(), tmp_path / "deploy-dsv3", namespace="serving")
    backend.render()
    assert calls(log) == []  # render starts nothing
    backend.launch()
    backend.wait_ready(60)
    backend.teardown()
    backend.teardown()
    got = calls(log)
    folder = tmp_path / "deploy-dsv3" / "kubernetes"
    assert got[0] == f"kubectl --namespace serving apply -k {folder}"
    assert got[1].startswith("kubectl --namespace serving wait --for=condition=Available "
                             "leaderworkerset/dsv3-prefill --timeout=")
    assert "leaderworkerset/dsv3-decode" in got[2]
    assert got[3].startswith("kubectl --namespace serving wait --for=condition=Available "
                             "deployment/dsv3-router")
    assert got[4].startswith("kubectl --namespace serving exec deployment/dsv3-router -- "
                             "python3 -c")
    assert got[4].endswith("http://127.0.0.1:8099 /models/DeepSeek-V3")
    assert got[5:] == [f"kubectl --namespace serving delete --ignore-not-found --wait=false "
                       f"-k {folder}"]
    assert backend.url == "http://dsv3-router:8099"


def test_with_epp_routing_the_completion_goes_to_an_engine_pod(tmp_path, monkeypatch):
    log = tmp_path / "kubectl.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    fake_tool(tmp_path / "bin", "kubectl", "exit 0\n")
    use_path(monkeypatch, tmp_path / "bin")
    backend = KubernetesBackend(pd_rendering(), tmp_path / "deploy-dsv3", routing="epp")
    backend.launch()
    backend.wait_ready(60)
    got = calls(log)
    assert "deployment/dsv3-epp" in got[3]
    assert got[4].startswith("kubectl exec pod/dsv3-decode-0 -c vllm -- python3 -c")
    assert got[4].endswith("http://127.0.0.1:8200 /models/DeepSeek-V3")


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
    with pytest.raises(LaunchError, match=r"no completion through deployment/run-router "
                                          r"within 1 s: urlopen error \[Errno 111\]"):
        backend.wait_ready(1)


def test_pods_of_attention_dp_over_tp_groups_ask_for_every_gpu_they_use(tmp_path):
    """DEP4 x TP4 on 8-GPU hosts: two DP ranks of four GPUs per pod, so eight GPUs a pod (the
    record's dp.local x tp), and pods start at rank DP_SIZE_LOCAL (2) x their index."""
    from executor.render import render
    from simulator.specs.deployment import Deployment, RoleSpec

    d = Deployment(model="deepseek-v3", hardware="h200", aggregated=RoleSpec(dep=4, tp=4))
    rendered = render(d, model_path="/models/DeepSeek-V3")
    _, objs = written(tmp_path, rendered)
    (lws,) = by_kind(objs, "LeaderWorkerSet")
    container = vllm(lws)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert {"name": "DP_SIZE_LOCAL", "value": "2"} in container["env"]
    assert '"$((LWS_WORKER_INDEX * DP_SIZE_LOCAL))"' in container["args"][0]
    assert pod_spec(lws)["containers"][0]["args"][0].count("--tensor-parallel-size 4") == 1


def test_vllm_s_own_parser_accepts_every_pod_s_command(tmp_path):
    """The commands the pods run — each pod's script run for real, a one-pod instance's args
    with Kubernetes' $(VAR) expanded — parse with vLLM's own parser (skipped without the
    engine environment)."""
    from executor.vllm_args import check_with_vllm

    argvs = []
    for rendering in (v4_rendering, lambda: rendering_of(V3)):
        backend, objs = written(tmp_path, rendering())
        for layout, lws in zip(backend.layouts, by_kind(objs, "LeaderWorkerSet"), strict=True):
            container = vllm(lws)
            local = next(e["value"] for e in container["env"] if e["name"] == "DP_SIZE_LOCAL")
            if container["command"] == ["/bin/sh", "-c"]:
                for index in range(layout.hosts):
                    env_script = f"DP_SIZE_LOCAL={local}; " + container["args"][0]
                    argvs.append((f"{lws['metadata']['name']} pod {index}",
                                  run_pod(tmp_path, env_script, index, layout.hosts)))
            else:
                args = [a.replace("$(LWS_LEADER_ADDRESS)", "10.0.0.1")
                        for a in container["args"]]
                argvs.append((lws["metadata"]["name"], [*container["command"], *args]))
    result = check_with_vllm(argvs)
    if result.skipped:
        pytest.skip(result.skipped)
    assert not result.errors, result.errors
