"""The kserve flavor: an LLMInferenceService (serving.kserve.io/v1alpha2) checked against its
CRD schema: parallelism tensor/data/dataLocal/expert, a prefill block, worker templates for
multi-host instances, the model's URI, and the fabric, probes and resources."""

import copy
import shlex

import pytest

from simulator.specs.errors import SpecError
from tests.executor.cluster import flavor_objects, k8s_v3, k8s_v4
from tests.executor.schemas.validate import NEWEST, ManifestError, validate

v3, v4 = k8s_v3, k8s_v4


def objects(tmp_path, rendered=None, **options) -> list[dict]:
    return flavor_objects(tmp_path, "kserve", rendered, **options)


@pytest.mark.parametrize(("rendering", "oldest"), [(v3, "1.29"), (v4, "1.32")])
def test_the_service_validates_against_the_kserve_crd(tmp_path, rendering, oldest):
    objs = objects(tmp_path, rendering())
    assert objs[-1]["kind"] == "LLMInferenceService"
    for obj in objs:
        for version in (oldest, NEWEST):
            validate(obj, version)
    broken = copy.deepcopy(objs[-1])
    broken["spec"]["prefill"]["parallelism"]["dataLocal"] = 0
    with pytest.raises(ManifestError, match=r"\$\.spec\.prefill\.parallelism\.dataLocal: 0 is "
                                            "less than the minimum of 1"):
        validate(broken)
    broken = copy.deepcopy(objs[-1])
    del broken["spec"]["model"]["uri"]
    with pytest.raises(ManifestError, match="'uri' is a required property"):
        validate(broken)


def test_decode_at_the_top_prefill_in_its_block_with_their_parallelism(tmp_path):
    (svc,) = objects(tmp_path, model_volume="pvc:models")
    spec = svc["spec"]
    assert spec["model"] == {"uri": "pvc://models/DeepSeek-V3", "name": "/models/DeepSeek-V3"}
    assert spec["replicas"] == 1
    assert spec["parallelism"] == {"tensor": 1, "data": 40, "dataLocal": 8, "expert": True}
    assert "worker" in spec  # DEP40 spans five hosts
    assert spec["prefill"]["replicas"] == 4
    assert spec["prefill"]["parallelism"] == {"tensor": 1, "data": 8, "dataLocal": 8,
                                              "expert": True}
    assert "worker" not in spec["prefill"]
    assert spec["router"] == {"scheduler": {}, "route": {}, "gateway": {}}
    for workload, role in ((spec, "kv_consumer"), (spec["prefill"], "kv_producer")):
        (main,) = workload["template"]["containers"]
        assert main["name"] == "main"
        env = {e["name"]: e.get("value") for e in main["env"]}
        args = shlex.split(env["VLLM_ADDITIONAL_ARGS"])
        assert role in args[args.index("--kv-transfer-config") + 1]
        assert "--data-parallel-size" not in args and "--port" not in args
        assert "HF_HUB_CACHE" not in env  # KServe's storage fetches the model
        assert main["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert main["resources"]["limits"]["rdma/ib"] == "1"
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert main[probe]["httpGet"]["scheme"] == "HTTPS"


def test_the_model_is_a_hub_uri_or_a_folder_on_a_claim(tmp_path):
    (domain, svc) = objects(tmp_path, v4())
    assert svc["spec"]["model"]["uri"] == "hf://deepseek-ai/DeepSeek-V4-Flash"
    claim = svc["spec"]["template"]["resourceClaims"][0]["resourceClaimTemplateName"]
    assert claim == domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    with pytest.raises(SpecError, match=r"reads a model folder \(/models/DeepSeek-V3\) from a "
                                        "PersistentVolumeClaim only"):
        objects(tmp_path, model_volume="host:/mnt/models")


def test_vllm_s_own_parser_accepts_what_kserve_passes_on(tmp_path):
    """VLLM_ADDITIONAL_ARGS with the parallelism KServe adds from the service's fields parse
    with vLLM's own parser (skipped without the engine environment)."""
    from executor.vllm_args import check_with_vllm

    argvs = []
    for rendering in (v3, v4):
        (svc,) = objects(tmp_path, rendering())[-1:]
        spec = svc["spec"]
        for name, workload in (("decode", spec), ("prefill", spec["prefill"])):
            env = {e["name"]: e.get("value") for e in workload["template"]["containers"][0]["env"]}
            p = workload["parallelism"]
            argvs.append((f"{svc['metadata']['name']} {name}", [
                "vllm", "serve", spec["model"]["name"],
                *shlex.split(env["VLLM_ADDITIONAL_ARGS"]),
                "--tensor-parallel-size", str(p["tensor"]), "--data-parallel-size",
                str(p["data"]), "--data-parallel-size-local", str(p["dataLocal"])]))
    result = check_with_vllm(argvs)
    if result.skipped:
        pytest.skip(result.skipped)
    assert not result.errors, result.errors
