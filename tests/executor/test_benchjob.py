"""executor/benchjob: the bench Job validates against the Kubernetes API schema, runs exactly
run_bench's `vllm bench serve` arguments against the router, and its container's command, run
here with a fake vllm, prints a result that `rackplan bench --from-file` compares."""

import json
import subprocess

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from executor.bench import bench_command, bench_settings, compare_file, read_result
from executor.benchjob import AIPERF_MISSING, RESULT_DIR, bench_job
from planner.cli import main
from simulator.specs.errors import SpecError
from simulator.specs.loading import load_deployment, load_workload
from tests.executor.cluster import ROOT
from tests.executor.local_helpers import TINY_PD, fake_vllm

PD = ROOT / "examples" / "deepseek-v3-h200-pd.yaml"
ROUTER = "http://dsv3-router:8099"
IMAGE = "vllm/vllm-openai:v0.32.0"
VERSIONS = ["1.29", ".".join(latest_version().split(".")[:2])]
"""The oldest Kubernetes the manifests target, and the newest kubernetes-validate knows."""


def container(job: dict) -> dict:
    (only,) = job["spec"]["template"]["spec"]["containers"]
    return only


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("options", [{}, {"results_claim": "bench-results", "namespace": "llm",
                                          "hf_token_secret": "hf-token"}])
def test_the_job_validates_against_the_kubernetes_api_schema(version, options):
    job = bench_job(PD, ROUTER, "dsv3-bench", IMAGE, **options)
    kubernetes_validate.validate(job, version, strict=True)
    yaml.safe_load(yaml.safe_dump(job))  # plain data all the way down


def test_the_schema_refuses_a_broken_job():
    job = bench_job(PD, ROUTER, "dsv3-bench", IMAGE)
    job["spec"]["template"]["spec"]["restartPolicy"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, VERSIONS[-1], strict=True)


def test_the_job_runs_run_bench_s_arguments_against_the_router():
    job = bench_job(PD, ROUTER, "dsv3-bench", IMAGE, num_prompts=64)
    data = yaml.safe_load(PD.read_text())
    workload = load_workload(data.get("workload") or {})
    expected = bench_command(bench_settings(workload, 64), ROUTER, "deepseek-ai/DeepSeek-V3",
                             RESULT_DIR)
    c = container(job)
    assert c["args"] == expected
    assert c["args"][:3] == ["vllm", "bench", "serve"]
    assert c["args"][c["args"].index("--base-url") + 1] == ROUTER
    assert c["image"] == IMAGE and c["command"][:2] == ["/bin/sh", "-c"]
    assert c["volumeMounts"] == [{"name": "results", "mountPath": RESULT_DIR}]
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["template"]["spec"]["volumes"] == [{"name": "results", "emptyDir": {}}]
    claimed = bench_job(PD, ROUTER, "dsv3-bench", IMAGE, results_claim="bench-results")
    assert claimed["spec"]["template"]["spec"]["volumes"] == [
        {"name": "results", "persistentVolumeClaim": {"claimName": "bench-results"}}]


def test_a_deployment_and_workload_pair_and_a_served_path_are_taken_as_given():
    deployment = load_deployment(yaml.safe_load(TINY_PD.read_text())["deployment"])
    workload = load_workload({"arrival": {"kind": "poisson", "rate": 2}, "requests": 10})
    job = bench_job((deployment, workload), ROUTER, "tiny-bench", IMAGE,
                    model="/models/tiny-moe", tokenizer="/models/tiny-moe/tok")
    args = container(job)["args"]
    assert args == bench_command(bench_settings(workload), ROUTER, "/models/tiny-moe",
                                 RESULT_DIR, tokenizer="/models/tiny-moe/tok")
    assert args[args.index("--request-rate") + 1] == "2"


def test_the_container_prints_a_result_that_bench_from_file_compares(tmp_path, capsys):
    """The container's command, run here: its argv with the result folder moved to tmp_path
    and a fake vllm first."""
    job = bench_job(TINY_PD, ROUTER, "tiny-bench", IMAGE, model="m")
    c = container(job)
    args = [str(tmp_path) if a == RESULT_DIR else a for a in c["args"]]
    script = c["command"][2].replace(RESULT_DIR, str(tmp_path))
    r = subprocess.run([*c["command"][:2], script, *c["command"][3:],
                        str(fake_vllm(tmp_path)), *args[1:]],
                       capture_output=True, text=True, timeout=60, check=True)
    lines = r.stdout.splitlines()
    at = lines.index(f"result: {tmp_path}/bench.json")
    printed = json.loads(lines[at + 1])
    assert printed == read_result(tmp_path / "bench.json")
    report = compare_file(TINY_PD, tmp_path / "bench.json", tmp_path / "report")
    assert report.row("ttft_ms.p90").measured == printed["p90_ttft_ms"]
    assert main(["bench", str(TINY_PD), "--from-file", str(tmp_path / "bench.json"),
                 "--out", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / "report.json").is_file()
    capsys.readouterr()


def test_a_sessions_workload_is_refused_naming_what_is_missing():
    deployment = load_deployment(yaml.safe_load(TINY_PD.read_text())["deployment"])
    agentx = load_workload({"arrival": {"kind": "sessions", "concurrency": 4}, "requests": 8})
    with pytest.raises(SpecError) as e:
        bench_job((deployment, agentx), ROUTER, "tiny-bench", IMAGE)
    assert str(e.value) == AIPERF_MISSING and "\n" not in AIPERF_MISSING
    for needle in ("aiperf", "image", "dataset", "--from-file"):
        assert needle in str(e.value)


@pytest.mark.parametrize(("name", "needle"), [
    ("DSV3_bench", "bench job name 'DSV3_bench' is not a DNS label; use lowercase letters, "
                   "digits and dashes, e.g. 'dsv3-bench'"),
    ("x" * 64, "is not a DNS label"),
])
def test_a_name_that_is_not_a_dns_label_is_refused(name, needle):
    with pytest.raises(SpecError, match=needle):
        bench_job(PD, ROUTER, name, IMAGE)


def test_a_workload_bench_serve_cannot_send_is_refused():
    deployment = load_deployment(yaml.safe_load(TINY_PD.read_text())["deployment"])
    trace = load_workload({"arrival": {"kind": "trace", "path": "t.jsonl"}})
    with pytest.raises(SpecError, match="arrival kind 'trace' has no vllm bench serve"):
        bench_job((deployment, trace), ROUTER, "tiny-bench", IMAGE)
    with pytest.raises(SpecError, match="num_prompts=0 must be >= 1"):
        bench_job(PD, ROUTER, "dsv3-bench", IMAGE, num_prompts=0)
