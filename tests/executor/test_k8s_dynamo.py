"""The dynamo flavor: a DynamoGraphDeployment of Dynamo 0.6.0 checked against its CRD schema,
prefill and decode worker services with multinode.nodeCount, `python3 -m dynamo.vllm` with
Dynamo's disaggregation flags, and the fabric, model volume, probes and resources."""

import copy

import pytest

from simulator.specs.errors import SpecError
from tests.executor.cluster import flavor_objects, k8s_v3, k8s_v4
from tests.executor.schemas.validate import NEWEST, ManifestError, validate

v3, v4 = k8s_v3, k8s_v4


def objects(tmp_path, rendered=None, **options) -> list[dict]:
    return flavor_objects(tmp_path, "dynamo", rendered, **options)


@pytest.mark.parametrize(("rendering", "oldest"), [(v3, "1.29"), (v4, "1.32")])
def test_the_graph_validates_against_the_dynamo_crd(tmp_path, rendering, oldest):
    objs = objects(tmp_path, rendering())
    assert objs[-1]["kind"] == "DynamoGraphDeployment"
    for obj in objs:
        for version in (oldest, NEWEST):
            validate(obj, version)
    broken = copy.deepcopy(objs[-1])
    broken["spec"]["services"]["VllmDecodeWorker"]["multinode"]["nodeCount"] = 1
    with pytest.raises(ManifestError, match=r"\$\.spec\.services\.VllmDecodeWorker\.multinode"
                                            r"\.nodeCount: 1 is less than the minimum of 2"):
        validate(broken)
    broken = copy.deepcopy(objs[-1])
    broken["spec"]["services"]["VllmDecodeWorker"]["replica"] = 1
    with pytest.raises(ManifestError, match="'replica' was unexpected"):
        validate(broken)


def test_prefill_and_decode_workers_run_dynamo_vllm_with_its_disaggregation_flags(tmp_path):
    (graph,) = objects(tmp_path)
    services = graph["spec"]["services"]
    assert graph["spec"]["backendFramework"] == "vllm"
    assert set(services) == {"Frontend", "VllmPrefillWorker", "VllmDecodeWorker"}
    frontend = services["Frontend"]["extraPodSpec"]["mainContainer"]
    assert frontend["command"] == ["python3", "-m", "dynamo.frontend"]
    prefill, decode = services["VllmPrefillWorker"], services["VllmDecodeWorker"]
    assert (prefill["replicas"], decode["replicas"]) == (4, 1)
    assert "multinode" not in prefill and decode["multinode"] == {"nodeCount": 5}
    for service, role in ((prefill, "prefill"), (decode, "decode")):
        assert service["componentType"] == "worker" and service["subComponentType"] == role
        main = service["extraPodSpec"]["mainContainer"]
        assert main["command"] == ["python3", "-m", "dynamo.vllm"]
        args = main["args"]
        assert args[:4] == ["--model", "/models/DeepSeek-V3", "--connector", "nixl"]
        assert ("--is-prefill-worker" in args) == (role == "prefill")
        assert "--kv-transfer-config" not in args and "--port" not in args
        assert {"startupProbe", "livenessProbe", "readinessProbe"} <= set(main)
        assert service["resources"]["limits"] == {"gpu": "8", "memory": "768Gi",
                                                  "custom": {"rdma/ib": "1"}}
        assert service["resources"]["requests"]["cpu"] == "64"
        assert {"name": "models", "mountPath": "/models"} in main["volumeMounts"]
    decode_args = decode["extraPodSpec"]["mainContainer"]["args"]
    at = decode_args.index("--data-parallel-size")
    assert decode_args[at:] == ["--data-parallel-size", "40", "--data-parallel-size-local", "8",
                                "--data-parallel-backend", "ray"]


def test_gb300_workers_claim_the_compute_domain_and_the_image_is_dynamo_s(tmp_path):
    domain, graph = objects(tmp_path, v4())
    assert domain["kind"] == "ComputeDomain"
    for name in ("VllmPrefillWorker", "VllmDecodeWorker"):
        pod = graph["spec"]["services"][name]["extraPodSpec"]
        assert pod["resourceClaims"][0]["resourceClaimTemplateName"] == \
            domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
        assert pod["mainContainer"]["image"] == "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.0"
        assert pod["mainContainer"]["args"][1] == "deepseek-ai/DeepSeek-V4-Flash"
    (graph,) = objects(tmp_path, image="registry.example/dynamo:1")
    main = graph["spec"]["services"]["VllmDecodeWorker"]["extraPodSpec"]["mainContainer"]
    assert main["image"] == "registry.example/dynamo:1"


def test_a_routing_of_llm_d_is_refused_for_a_flavor_with_its_own_frontend(tmp_path):
    with pytest.raises(SpecError, match="the dynamo flavor routes through its own frontend; "
                                        "--routing epp applies to the flavors that take it"):
        objects(tmp_path, routing="epp")


def test_vllm_s_own_parser_accepts_the_workers_engine_flags(tmp_path):
    """A worker's arguments, less Dynamo's own (--model's value becomes the positional model;
    --connector and --is-prefill-worker are dynamo.vllm's), parse with vLLM's own parser
    (skipped without the engine environment)."""
    from executor.vllm_args import check_with_vllm

    argvs = []
    for rendering in (v3, v4):
        graph = objects(tmp_path, rendering())[-1]
        for name, service in graph["spec"]["services"].items():
            if service["componentType"] != "worker":
                continue
            args = list(service["extraPodSpec"]["mainContainer"]["args"])
            assert args[0] == "--model" and args[2:4] == ["--connector", "nixl"]
            rest = [a for a in args[4:] if a != "--is-prefill-worker"]
            argvs.append((f"{graph['metadata']['name']} {name}",
                          ["vllm", "serve", args[1], *rest]))
    result = check_with_vllm(argvs)
    if result.skipped:
        pytest.skip(result.skipped)
    assert not result.errors, result.errors


@pytest.mark.parametrize(("router", "mode"), [("kv_router", "kv"), ("round_robin", "round-robin"),
                                             ("prefix_aware", None)])
def test_the_frontend_routes_in_the_mode_of_the_plans_policy(tmp_path, router, mode):
    """Dynamo's KV router is `kv_router` for aggregated workers (and `prefix_aware` for P/D
    prefill, the goldens); a policy Dynamo has no mode for runs as its default, round-robin,
    and the graph says so."""
    from executor.backends.kubernetes import KubernetesBackend
    from simulator.specs.deployment import Deployment, RoleSpec

    d = Deployment(model="deepseek-v3", hardware="h200",
                   aggregated=RoleSpec(instances=2, dep=8, router=router))
    (graph,) = objects(tmp_path, KubernetesBackend.render_for(d, "/models/DeepSeek-V3"))
    validate(graph)
    args = graph["spec"]["services"]["Frontend"]["extraPodSpec"]["mainContainer"]["args"]
    assert args[2:] == ([] if mode is None else ["--router-mode", mode])
    note = graph["metadata"].get("annotations", {}).get("rackplan.io/router")
    if mode is None:
        assert note == ("the plan routes aggregated requests by prefix_aware, for which "
                        "Dynamo's frontend has no router mode: it runs its default, round-robin")
    else:
        assert note is None
