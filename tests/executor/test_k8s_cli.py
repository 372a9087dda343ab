"""`rackplan deploy --target kubernetes` and its own flags: names from the plan or --name, each
flag reaching the manifests, and a flag or value that does not apply refused in one line."""

import pytest
import yaml

from planner.cli import main
from tests.executor.cluster import ROOT
from tests.planner.cli_run import assert_one_line_error, run_cli

PD = ROOT / "examples" / "deepseek-v3-h200-pd.yaml"


def dry_run(tmp_path, capsys, *flags: str) -> dict[str, dict]:
    assert main(["deploy", str(PD), "--target", "kubernetes", "--dry-run", "--out",
                 str(tmp_path / "out"), *flags]) == 0
    paths = capsys.readouterr().out.splitlines()
    return {f"{obj['kind']}/{obj['metadata']['name']}": obj for obj in
            (yaml.safe_load(open(p)) for p in paths if not p.endswith("kustomization.yaml"))}


def test_names_come_from_the_plan_not_the_out_folder_unless_given(tmp_path, capsys):
    objs = dry_run(tmp_path, capsys)
    assert {"LeaderWorkerSet/deepseek-v3-h200-pd-prefill",
            "LeaderWorkerSet/deepseek-v3-h200-pd-decode"} <= set(objs)
    objs = dry_run(tmp_path, capsys, "--name", "dsv3-prod")
    assert {"LeaderWorkerSet/dsv3-prod-prefill", "LeaderWorkerSet/dsv3-prod-decode",
            "Deployment/dsv3-prod-router"} <= set(objs)


def test_the_flags_reach_the_manifests(tmp_path, capsys):
    objs = dry_run(tmp_path, capsys, "--name", "p", "--image", "reg.example/vllm:1",
                   "--router-image", "reg.example/router:1", "--model-volume", "host:/data",
                   "--hf-token-secret", "my-token", "--namespace", "serving")
    pod = objs["LeaderWorkerSet/p-decode"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    (vllm,) = pod["containers"]
    assert vllm["image"] == "reg.example/vllm:1"
    assert {"name": "models", "hostPath": {"path": "/data", "type": "DirectoryOrCreate"}} in \
        pod["volumes"]
    token = next(e for e in vllm["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"]["secretKeyRef"]["name"] == "my-token"
    router = objs["Deployment/p-router"]["spec"]["template"]["spec"]
    assert router["containers"][0]["image"] == "reg.example/router:1"
    kustomization = yaml.safe_load((tmp_path / "out" / "kubernetes" /
                                    "kustomization.yaml").read_text())
    assert kustomization["namespace"] == "serving"
    objs = dry_run(tmp_path, capsys, "--flavor", "kserve")
    assert list(objs) == ["LLMInferenceService/deepseek-v3-h200-pd"]


@pytest.mark.parametrize(("args", "needles"), [
    (["--target", "local", "--flavor", "dynamo"],
     ["--flavor is not an option of --target local"]),
    (["--target", "slurm", "--name", "x"], ["--name is not an option of --target slurm"]),
    (["--target", "kubernetes", "--flavor", "kueue"],
     ["unknown flavor 'kueue'", "valid flavors: llm-d, dynamo, kserve"]),
    (["--target", "kubernetes", "--routing", "epp", "--flavor", "kserve"],
     ["the kserve flavor routes through its own frontend"]),
    (["--target", "kubernetes", "--model-volume", "nfs:/x"], ["model volume 'nfs:/x'"]),
    (["--target", "kubernetes", "--model-path", "/srv/DeepSeek-V3"],
     ["model path /srv/DeepSeek-V3 is not on the model volume"]),
])
def test_a_flag_that_does_not_apply_is_one_line(tmp_path, args, needles):
    assert_one_line_error(run_cli("deploy", str(PD), *args, "--dry-run", "--out",
                                  str(tmp_path / "out")), *needles)


def test_the_dry_runs_in_the_docs_run(tmp_path, capsys):
    """Every `rackplan deploy ... --dry-run` line of docs/deploy-kubernetes.md writes its files."""
    lines = [line.split("#")[0].split() for line in
             (ROOT / "docs" / "deploy-kubernetes.md").read_text().splitlines()
             if line.startswith("rackplan deploy") and "--dry-run" in line]
    assert len(lines) == 4
    for n, words in enumerate(lines):
        args = [str(ROOT / w) if w.startswith("examples/") else w for w in words[1:]]
        assert main([*args, "--out", str(tmp_path / str(n))]) == 0
        assert capsys.readouterr().out.splitlines()[-1].endswith("kustomization.yaml")
