"""`rackplan calibrate`: a quick CPU run writes tables that price a tiny-moe step, and bad input
is one line."""

import contextlib
import importlib.util
import io
import json
import math
import os

import numpy as np
import pytest
import yaml

from planner.cli import main
from simulator.calibration.tables import CALIBRATION_ENV, load_calibration
from simulator.cost.step import Batch, Instance, step_time
from simulator.specs.hardware import load_hardware
from simulator.specs.model import load_model
from tests.kernels.conftest import TORCH_MISSING
from tests.planner.cli_run import assert_one_line_error, run_cli

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason=TORCH_MISSING)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One `rackplan calibrate --device cpu --quick` run: (folder, its --json output)."""
    pytest.importorskip("torch", reason=TORCH_MISSING)
    out = tmp_path_factory.mktemp("calibration") / "cpu"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = main(["calibrate", "--device", "cpu", "--quick", "--out", str(out), "--json"])
    assert rc == 0
    return out, json.loads(stdout.getvalue())


@needs_torch
def test_quick_run_writes_manifest_and_tables(quick):
    out, printed = quick
    manifest = json.loads((out / "manifest.json").read_text())
    assert printed["out"] == str(out) and printed["tables"] == manifest["tables"]
    assert manifest["device"]["kind"] == "cpu" and manifest["device"]["name"]
    assert manifest["versions"]["torch"].startswith("2.13")
    assert manifest["versions"]["rackplan"] and manifest["date"]
    assert manifest["model"] == "tiny-moe" and manifest["quick"] is True
    assert set(manifest["checks_passed"]) == {"gemm", "moe", "attention", "memory"}
    assert manifest["shapes"]["gemm"]["count"] == manifest["rows"]["gemm"] > 0
    assert "gemm fp8" in manifest["skipped"] and not manifest["unfinished"]
    assert set(manifest["tables"]) == {"gemm", "moe", "attention_generation",
                                       "attention_context", "memory", "nccl"}
    for rel in manifest["tables"].values():
        assert (out / rel).is_file()
    # the run's wall time is recorded; how fast it is belongs to benchmarks, not to a test
    assert math.isfinite(manifest["wall_time_s"]) and manifest["wall_time_s"] > 0
    import pandas as pd

    nccl = pd.read_parquet(out / manifest["tables"]["nccl"])
    assert set(nccl.op_name) == {"all_gather", "reduce_scatter", "all_reduce", "alltoall"}
    assert set(nccl.num_gpus) == {2} and set(nccl.kernel_source) == {"gloo"}
    assert (nccl.latency > 0).all()


@needs_torch
@pytest.mark.parametrize("batch", [Batch.decode(1, 8, 200), Batch.prefill(1, 256, 2)],
                         ids=["decode", "prefill"])
def test_measured_tables_price_a_tiny_moe_step(quick, batch):
    out, _ = quick
    hw, model = load_hardware("cpu"), load_model("tiny-moe")
    cal = load_calibration(hw, "vllm", user_dir=out)
    inst = Instance(model=model, hardware=hw, role="aggregated", ranks=1,
                    expert_parallel=False, weights="bf16", kv_cache="bf16")
    st = step_time(inst, batch, cal)
    priced = {op: v for op, v in st.provenance.items() if op != "overhead"}
    phase = "decode" if batch.decode_requests.sum() else "prefill"
    assert {f"attention.gqa.{phase}.qkv_proj", f"attention.gqa.{phase}.core", "routed_experts",
            "lm_head"} <= set(priced)
    assert all("(user/" in v for v in priced.values()), priced
    assert np.isfinite(st.total_ms) and st.total_ms > st.breakdown["other"]


@needs_torch
def test_a_measured_point_comes_back_exactly(quick):
    out, _ = quick
    import pandas as pd

    rows = pd.read_parquet(out / "attention/vllm/measured/generation_attention_perf.parquet")
    row = rows[(rows.kv_cache_dtype == "bfloat16")].iloc[0]
    cal = load_calibration(load_hardware("cpu"), "vllm", user_dir=out)
    got = cal.attention_generation(float(row.batch_size), float(row.step), int(row.num_heads),
                                   int(row.num_key_value_heads), int(row.head_dim), "bf16")
    assert got.source == "measured" and got.ms[0] == pytest.approx(row.latency)


@needs_torch
def test_step_takes_the_calibration_folder(quick, tmp_path, capsys):
    out, _ = quick
    dep = tmp_path / "d.yaml"
    dep.write_text(yaml.safe_dump({
        "model": "tiny-moe", "hardware": "cpu", "precision": {"weights": "bf16",
                                                             "kv_cache": "bf16"},
        "aggregated": {"dep": 1, "max_num_seqs": 16, "max_num_batched_tokens": 512}}))
    args = ["step", str(dep), "--role", "aggregated", "--batch", "4", "--context", "100",
            "--json"]
    assert main([*args, "--calibration", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "(user/moe/vllm/measured)" in report["provenance"]["routed_experts"]
    assert CALIBRATION_ENV not in os.environ  # the option does not outlive the command
    assert main(args) == 0
    assert "roofline" in json.loads(capsys.readouterr().out)["provenance"]["routed_experts"]


def test_bad_device_is_one_line():
    assert_one_line_error(run_cli("calibrate", "--device", "tpu"), "--device='tpu'",
                          "cpu, cuda")


def test_bad_only_is_one_line():
    assert_one_line_error(run_cli("calibrate", "--device", "cpu", "--only", "gemm,fft"),
                          "'fft'", "gemm, moe, attention")


def test_missing_calibration_folder_is_one_line(tmp_path):
    assert_one_line_error(run_cli("step", "examples/deepseek-v3-h200-pd.yaml", "--calibration",
                                  str(tmp_path / "none")), "--calibration=", "is not a folder")


@needs_torch
def test_cuda_without_a_gpu_is_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert_one_line_error(run_cli("calibrate", "--device", "cuda", "--out", str(tmp_path)),
                          "--device='cuda'", "no CUDA device", "--device cpu")


@needs_torch
def test_out_that_is_not_a_calibration_is_one_line(tmp_path):
    (tmp_path / "mine.txt").write_text("x")
    assert_one_line_error(run_cli("calibrate", "--device", "cpu", "--quick", "--only", "memory",
                                  "--out", str(tmp_path)), "non-empty folder")
