"""`rackplan deploy` and `rackplan bench`: dry runs, launches through fake cluster tools, and
the one-line errors of the CLI contract."""

import os
import shlex
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

import executor.cli as cli
from executor import vllm_args
from executor.backends.local import render_local
from executor.backends.mock import MockBackend
from executor.records import DataParallel, LaunchRecord, Rendered
from executor.vllm_args import FlagError, VllmCheck
from planner.cli import main
from simulator.specs.errors import SpecError
from simulator.specs.loading import load_deployment
from tests.executor.cluster import ROOT, calls, fake_tool, use_path
from tests.planner.cli_run import assert_one_line_error, run_cli

PD = ROOT / "examples" / "deepseek-v3-h200-pd.yaml"
CPU_PLAN = {"model": "tiny-moe", "hardware": "cpu",
            "precision": {"weights": "bf16", "kv_cache": "bf16"},
            "prefill": {"max_num_batched_tokens": 512}, "decode": {"max_num_seqs": 8}}


def rackplan(*args: str, cwd: Path, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env={**os.environ, **(env or {})})


def test_local_dry_run_prints_one_command_line_per_process_and_starts_nothing(tmp_path):
    """The engine's vllm points nowhere: a launch would fail; the dry run prints and exits."""
    r = rackplan("deploy", str(PD), "--target", "local", "--dry-run", cwd=tmp_path,
                 env={"RACKPLAN_ENGINE_VENV": str(tmp_path / "no-engine")})
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    lines = r.stdout.splitlines()
    rendered = render_local(load_deployment(PD))
    assert len(lines) == len(rendered.processes) == 9
    for line, proc in zip(lines, rendered.processes, strict=True):
        words = shlex.split(line)
        exe = words.index(str(tmp_path / "no-engine" / "bin" / "vllm"))
        assert "HF_HUB_OFFLINE=1" in words[:exe]
        assert words[exe + 1:] == list(proc.argv[1:])
    assert list(tmp_path.iterdir()) == []  # nothing written, no run directory


def test_local_dry_run_serves_the_built_tiny_moe_model_unless_told_otherwise(tmp_path):
    plan = tmp_path / "cpu.yaml"
    plan.write_text(yaml.safe_dump(CPU_PLAN))
    r = rackplan("deploy", str(plan), "--target", "local", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for line in r.stdout.splitlines():
        words = shlex.split(line)
        served = words[words.index("serve") + 1]
        assert Path(served).parts[-3:] == (".venv-engine", "models", "tiny-moe")
    r = rackplan("deploy", str(plan), "--target", "local", "--dry-run", "--model-path",
                 "/srv/tiny", cwd=tmp_path)
    assert [shlex.split(ln)[shlex.split(ln).index("serve") + 1]
            for ln in r.stdout.splitlines()] == ["/srv/tiny", "/srv/tiny"]


@pytest.mark.parametrize(("target", "count", "folder"), [("kubernetes", 8, "kubernetes"),
                                                         ("slurm", 5, "slurm")])
def test_cluster_dry_run_writes_the_files_and_prints_their_paths(tmp_path, target, count,
                                                                folder):
    r = rackplan("deploy", str(PD), "--target", target, "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    paths = [Path(line) for line in r.stdout.splitlines()]
    assert len(paths) == count
    out = Path("runs") / "deploy-deepseek-v3-h200-pd" / folder
    assert all(p.parent == out and (tmp_path / p).is_file() for p in paths)
    r = rackplan("deploy", str(PD), "--target", target, "--dry-run", "--out",
                 str(tmp_path / "elsewhere"), cwd=tmp_path)
    assert all(Path(line).parent == tmp_path / "elsewhere" / folder
               for line in r.stdout.splitlines())


@pytest.mark.parametrize(("args", "needles"), [
    (["--target", "docker"], ["unknown target 'docker'", "valid targets: local, kubernetes, "
                                                         "slurm"]),
    (["--target", "local", "--timeout", "0"], ["--timeout 0 must be a positive"]),
])
def test_bad_target_or_timeout_is_one_line(args, needles):
    assert_one_line_error(run_cli("deploy", str(PD), *args, "--dry-run"), *needles)


def test_missing_plan_file_is_one_line(tmp_path):
    missing = tmp_path / "nope.yaml"
    assert_one_line_error(run_cli("deploy", str(missing), "--target", "slurm", "--dry-run"),
                          str(missing), "no such file")
    assert_one_line_error(run_cli("bench", str(missing)), str(missing), "no such file")


def test_a_tiny_moe_model_that_cannot_be_built_is_one_line(tmp_path, monkeypatch, capsys):
    from executor import tinymodel

    def no_engine():
        raise RuntimeError("engine interpreter .venv-engine/bin/python not found; run `make "
                           "engine` first\nmore detail")

    monkeypatch.setattr(tinymodel, "ensure_tiny_model", no_engine)
    plan = tmp_path / "cpu.yaml"
    plan.write_text(yaml.safe_dump(CPU_PLAN))
    assert main(["deploy", str(plan), "--target", "local", "--out", str(tmp_path / "run")]) == 1
    assert capsys.readouterr().err == ("rackplan: error: engine interpreter .venv-engine/bin/"
                                       "python not found; run `make engine` first\n")


def test_launch_without_kubectl_is_one_line_naming_dry_run(tmp_path):
    r = rackplan("deploy", str(PD), "--target", "kubernetes", "--out", str(tmp_path / "run"),
                 cwd=tmp_path, env={"PATH": str(tmp_path / "empty")})
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip() == ("rackplan: error: kubectl not found on PATH; use --dry-run to "
                                f"write the manifests to {tmp_path / 'run' / 'kubernetes'}")


def test_kubernetes_launch_applies_waits_and_prints_the_router(tmp_path, monkeypatch, capsys):
    log = tmp_path / "kubectl.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    fake_tool(tmp_path / "bin", "kubectl", "exit 0\n")
    use_path(monkeypatch, tmp_path / "bin")
    assert main(["deploy", str(PD), "--target", "kubernetes", "--out",
                 str(tmp_path / "deploy-dsv3"), "--timeout", "60"]) == 0
    assert capsys.readouterr().out == "router: http://deepseek-v3-h200-pd-router:8099\n"
    verbs = [line.split()[1] for line in calls(log)]
    assert verbs == ["apply", "wait", "wait", "wait", "exec"]  # left running, not deleted


def test_a_failed_launch_tears_down_and_says_why_in_one_line(tmp_path, monkeypatch, capsys):
    log = tmp_path / "kubectl.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    fake_tool(tmp_path / "bin", "kubectl", """\
        if [[ "$1" == wait ]]; then echo 'error: timed out' >&2; exit 1; fi
        """)
    use_path(monkeypatch, tmp_path / "bin")
    assert main(["deploy", str(PD), "--target", "kubernetes", "--out",
                 str(tmp_path / "run"), "--timeout", "5"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rackplan: error: prefill instances (deepseek-v3-h200-pd-prefill) were not "
                   "available within 5 s: error: timed out"]
    assert calls(log)[-1].startswith("kubectl delete --ignore-not-found")


def mock_backends(monkeypatch, **options) -> list[MockBackend]:
    """Every backend the CLI asks for is a MockBackend with these options; the list fills with
    the ones it built."""
    built: list[MockBackend] = []

    def get_backend(target, rendered, run_dir, **_):
        built.append(MockBackend(rendered, run_dir, **options))
        return built[-1]

    monkeypatch.setattr(cli, "get_backend", get_backend)
    return built


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_local_launch_serves_in_the_foreground_until_a_stop_signal_then_tears_down(
        tmp_path, monkeypatch, capsys, sig):
    monkeypatch.setattr("executor.backends.local.gpus_here", lambda: 72)  # a 72-GPU machine
    built = mock_backends(monkeypatch, foreground=True, stop_with=sig)
    before = signal.getsignal(sig)
    assert main(["deploy", str(PD), "--target", "local", "--model-path", "/m",
                 "--timeout", "30", "--restart", "2", "--out", str(tmp_path / "run")]) == 0
    (backend,) = built
    assert backend.calls == ["launch", "wait_ready 30", "supervise 2", "teardown"]
    assert {p.dp.address for p in backend.rendered.processes if p.dp} == {"127.0.0.1"}
    out = capsys.readouterr()
    assert out.out == "router: http://127.0.0.1:8099\n"
    assert "press Ctrl-C or send SIGTERM" in out.err
    assert f"rackplan: {sig.name}: stopping; tearing the deployment down" in out.err
    assert out.err.rstrip().endswith("rackplan: stopped")
    assert signal.getsignal(sig) == before  # deploy's handlers are gone again


def test_a_deployment_that_dies_after_ready_is_torn_down_with_exit_1(tmp_path, monkeypatch,
                                                                      capsys):
    monkeypatch.setattr("executor.backends.local.gpus_here", lambda: 72)
    built = mock_backends(monkeypatch, foreground=True, fail="supervise")
    assert main(["deploy", str(PD), "--target", "local", "--model-path", "/m",
                 "--out", str(tmp_path / "run")]) == 1
    assert built[0].calls == ["launch", "wait_ready 1800", "supervise 0", "teardown"]
    assert capsys.readouterr().err.splitlines()[-1] == "rackplan: error: supervise failed (mock)"


def test_a_target_that_does_not_serve_in_the_foreground_is_left_running(tmp_path, monkeypatch,
                                                                        capsys):
    built = mock_backends(monkeypatch, url="http://router.example:8099")
    assert main(["deploy", str(PD), "--target", "slurm", "--out", str(tmp_path / "run")]) == 0
    assert built[0].calls == ["launch", "wait_ready 1800"]  # not torn down
    out = capsys.readouterr()
    assert out.out == "router: http://router.example:8099\n"
    assert out.err == f"running on mock; files in {tmp_path / 'run'}\n"


def test_a_failed_wait_tears_the_backend_down_and_says_why(tmp_path, monkeypatch, capsys):
    built = mock_backends(monkeypatch, fail="wait_ready")
    assert main(["deploy", str(PD), "--target", "kubernetes", "--out", str(tmp_path)]) == 1
    assert built[0].calls == ["launch", "wait_ready 1800", "teardown"]
    assert capsys.readouterr().err == "rackplan: error: wait_ready failed (mock)\n"


def test_a_dry_run_prints_what_the_backend_says_and_launches_nothing(tmp_path, monkeypatch,
                                                                     capsys):
    built = mock_backends(monkeypatch)
    assert main(["deploy", str(PD), "--target", "kubernetes", "--dry-run", "--out",
                 str(tmp_path)]) == 0
    (backend,) = built
    assert backend.calls == ["dry_run_lines"]
    assert capsys.readouterr().out.splitlines() == [
        p.command_line() for p in backend.rendered.processes]


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
@pytest.mark.parametrize("target", ["local", "kubernetes"])
def test_an_engine_rackplan_does_not_deploy_is_refused_by_name(tmp_path, engine, target):
    plan = tmp_path / f"{engine}.yaml"
    plan.write_text(PD.read_text().replace("engine: vllm", f"engine: {engine}"))
    out = tmp_path / "run"
    assert_one_line_error(run_cli("deploy", str(plan), "--target", target, "--dry-run",
                                  "--out", str(out)),
                          f"deploying engine '{engine}' is not supported yet; rackplan deploys "
                          "vllm")
    assert not out.exists()
    with pytest.raises(SpecError, match=f"deploying engine '{engine}'"):
        cli.render_for(target, load_deployment(plan), "/m")


def test_rules_refuse_a_rendering_before_any_file_is_written(tmp_path, monkeypatch):
    bad = Rendered((LaunchRecord(
        "decode-0", "decode", 0, "/m", flags=(("--kv-transfer-config", {
            "kv_connector": "NixlConnector", "kv_role": "kv_consumer"}),),
        dp=DataParallel(size=4, local=8), port=8100),), {"port": 8099})
    monkeypatch.setattr(cli, "render_for", lambda target, deployment, model: bad)
    with pytest.raises(SpecError, match="decode-0 host 0: --data-parallel-size-local 8 must be "
                                        "<= --data-parallel-size 4"):
        cli.check_flags(load_deployment(PD), bad, with_vllm=False)
    assert main(["deploy", str(PD), "--target", "slurm", "--dry-run", "--out",
                 str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()


def test_check_flags_applies_the_model_family_rules(monkeypatch):
    v4 = load_deployment(ROOT / "examples" / "deepseek-v4-flash-gb300-pd.yaml")
    rendered = cli.render_for("slurm", v4, "/models/DeepSeek-V4-Flash")
    cli.check_flags(v4, rendered, with_vllm=False)  # the example breaks no rule
    head = rendered.processes[0]
    small = replace(head, flags=tuple((n, 64 if n == "--block-size" else v)
                                      for n, v in head.flags))
    with pytest.raises(SpecError, match="prefill-0 host 0: --block-size 64 is not one the "
                                        "attention kernels of DeepseekV4ForCausalLM support"):
        cli.check_flags(v4, Rendered((small,), rendered.router), with_vllm=False)


def test_check_flags_reports_vllm_s_refusals_or_notes_a_skip(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(vllm_args, "_ROOT", tmp_path)  # no engine environment here
    assert main(["deploy", str(PD), "--target", "slurm", "--dry-run", "--check-flags",
                 "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert err.startswith("rackplan: note: no engine environment at .venv-engine/")
    monkeypatch.setattr(vllm_args, "check_with_vllm", lambda processes: VllmCheck(
        errors=(FlagError("decode-0 host 0", "--all2all-backend", "invalid choice: 'x'"),),
        vllm_version="0.32.0"))
    assert main(["deploy", str(PD), "--target", "slurm", "--dry-run", "--check-flags",
                 "--out", str(tmp_path / "run2")]) == 2
    assert capsys.readouterr().err == ("rackplan: error: vLLM 0.32.0 refuses: decode-0 host 0: "
                                       "--all2all-backend: invalid choice: 'x'\n")


def test_bench_runs_against_the_local_router_and_prints_predicted_vs_measured(
        tmp_path, monkeypatch, capsys):
    seen = {}

    class Report:
        def __init__(self):
            self.paths = [tmp_path / "report.json", tmp_path / "report.md"]

        def table(self):
            return "metric  predicted  measured"

    def run_bench(plan_path, url, run_dir, repredict=False, num_prompts=None):
        seen.update(plan=plan_path, url=url, run_dir=run_dir, repredict=repredict,
                    num_prompts=num_prompts)
        return Report()

    import executor.bench

    monkeypatch.setattr(executor.bench, "run_bench", run_bench)
    assert main(["bench", str(PD), "--out", str(tmp_path / "b")]) == 0
    assert seen == {"plan": PD, "url": "http://127.0.0.1:8099", "run_dir": tmp_path / "b",
                    "repredict": False, "num_prompts": None}
    first, *rest = capsys.readouterr().out.splitlines()
    assert first.startswith(f"prediction: simulated now: {PD} holds no prediction, so under "
                            "the built-in workload {"), first
    assert rest == ["metric  predicted  measured", f"report: {tmp_path}/report.json",
                    f"report: {tmp_path}/report.md"]
    assert main(["bench", str(PD), "--url", "http://127.0.0.2:8000", "--num-prompts", "5"]) == 0
    assert seen["url"] == "http://127.0.0.2:8000" and seen["num_prompts"] == 5
    assert seen["run_dir"] == Path("runs") / "bench-deepseek-v3-h200-pd"


def test_a_gpu_plan_larger_than_this_machine_is_refused_before_anything_starts(tmp_path):
    out = tmp_path / "run"
    bare = {**os.environ, "PATH": str(tmp_path)}  # no nvidia-smi here: this machine has 0 GPUs
    r = subprocess.run([sys.executable, "-m", "planner.cli", "deploy", str(PD), "--target",
                        "local", "--out", str(out)], capture_output=True, text=True,
                       timeout=120, env=bare)
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1
    for needle in ("needs 72 h200 GPUs", "has 0", "--target kubernetes"):
        assert needle in r.stderr
    assert not out.exists()


def test_check_fits_here_counts_every_rank_of_every_instance():
    from executor.backends.base import LaunchError
    from executor.backends.local import check_fits_here

    pd = load_deployment(PD)
    check_fits_here(pd, gpus=72)
    with pytest.raises(LaunchError, match="needs 72 h200 GPUs on this machine and it has 64"):
        check_fits_here(pd, gpus=64)
    from simulator.specs.deployment import Deployment

    check_fits_here(Deployment.model_validate(CPU_PLAN), gpus=0)  # runs on this machine's cores
    tiered = {**CPU_PLAN, "decode": {"max_num_seqs": 8, "host_cache_gb": 2}}
    with pytest.raises(LaunchError, match=r"decode role asks for a host KV tier \(host_cache_gb "
                                          r"2\), which vLLM's CPU build cannot run"):
        check_fits_here(Deployment.model_validate(tiered), gpus=0)
