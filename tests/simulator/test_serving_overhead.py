"""Serving latencies measured on one's own engine, kept in a calibration folder, win over the
shipped fit while that folder is the active calibration — for simulate, step and plans alike."""

import json

import pytest
import yaml

from planner.cli import main
from planner.evaluate import measured_overhead, overhead_for, sim_options
from simulator.calibration.serving import (
    USER_FILE,
    serving_overhead,
    user_serving_overhead,
    write_user_serving_overhead,
)
from simulator.calibration.tables import calibration_dir
from simulator.specs.errors import SpecError
from simulator.specs.loading import load_deployment

ABOUT = {"fitted": "2026-11-29", "command": "test"}
AGG = {"model": "tiny-moe", "hardware": "cpu", "precision": {"weights": "bf16",
                                                              "kv_cache": "bf16"},
       "aggregated": {"instances": 1, "max_num_seqs": 8, "max_num_batched_tokens": 512}}
PD = {**{k: v for k, v in AGG.items() if k != "aggregated"},
      "prefill": {"instances": 1, "max_num_seqs": 8, "max_num_batched_tokens": 512},
      "decode": {"instances": 1, "max_num_seqs": 8, "max_num_batched_tokens": 512}}


@pytest.fixture
def folder(tmp_path):
    """A calibration folder holding measured CPU latencies for vLLM (no tables needed)."""
    write_user_serving_overhead(tmp_path, "cpu", "vllm",
                                {"step_overhead_ms": 1.5, "api_overhead_ms": 20.0,
                                 "handoff_ms": 40.0}, ABOUT)
    return tmp_path


def test_measured_latencies_round_trip_and_only_pd_pays_the_handoff(folder):
    agg = user_serving_overhead(folder, "cpu", "vllm", False)
    pd_ = user_serving_overhead(folder, "cpu", "vllm", True)
    assert agg is not None and pd_ is not None
    assert (agg.step_overhead_ms, agg.api_overhead_ms, agg.handoff_ms) == (1.5, 20.0, 0.0)
    assert pd_.handoff_ms == 40.0
    data = json.loads((folder / USER_FILE).read_text())
    assert data["hardware"]["cpu"]["vllm"]["command"] == "test"


def test_other_hardware_or_engine_is_not_covered(folder, tmp_path_factory):
    assert user_serving_overhead(folder, "h200", "vllm", False) is None
    assert user_serving_overhead(folder, "cpu", "sglang", False) is None
    assert user_serving_overhead(tmp_path_factory.mktemp("empty"), "cpu", "vllm", False) is None


def test_an_update_keeps_other_entries_and_none_removes_a_latency(folder):
    write_user_serving_overhead(folder, "h200", "vllm", {"api_overhead_ms": 5.0}, ABOUT)
    write_user_serving_overhead(folder, "cpu", "vllm",
                                {"step_overhead_ms": 2.0, "handoff_ms": None}, ABOUT)
    cpu = user_serving_overhead(folder, "cpu", "vllm", True,
                                fallback=serving_overhead("vllm", True))
    assert cpu is not None
    assert (cpu.step_overhead_ms, cpu.api_overhead_ms) == (2.0, 20.0)
    assert cpu.handoff_ms == serving_overhead("vllm", True).handoff_ms  # left out: shipped
    h200 = user_serving_overhead(folder, "h200", "vllm", False)
    assert h200 is not None and h200.api_overhead_ms == 5.0 and h200.step_overhead_ms is None
    assert not list(folder.glob(".*.tmp"))


def test_bad_latency_name_bad_folder_and_bad_file_are_one_sentence(folder, tmp_path):
    with pytest.raises(SpecError, match="unknown serving latency 'queue_ms'"):
        write_user_serving_overhead(folder, "cpu", "vllm", {"queue_ms": 1.0}, ABOUT)
    with pytest.raises(SpecError, match="is not a folder"):
        write_user_serving_overhead(tmp_path / "nope", "cpu", "vllm", {}, ABOUT)
    (folder / USER_FILE).write_text("{not json")
    with pytest.raises(SpecError, match="is not readable JSON") as e:
        user_serving_overhead(folder, "cpu", "vllm", False)
    assert "\n" not in str(e.value)
    (folder / USER_FILE).write_text(json.dumps({"format": 99}))
    with pytest.raises(SpecError, match="has format 99, expected 1"):
        user_serving_overhead(folder, "cpu", "vllm", False)


def test_the_active_calibration_folder_sets_what_simulate_applies(folder):
    agg, pd_ = load_deployment(AGG), load_deployment(PD)
    assert measured_overhead(agg) is None
    assert overhead_for(agg) == serving_overhead("vllm", False)
    with calibration_dir(folder):
        assert overhead_for(agg).api_overhead_ms == 20.0
        assert overhead_for(pd_).handoff_ms == 40.0
        assert sim_options(agg).step_overhead_ms == 1.5
        h200 = load_deployment({**AGG, "model": "deepseek-v3", "hardware": "h200",
                                "precision": {"weights": "fp8", "kv_cache": "fp8"},
                                "aggregated": {"dep": 8}})
        assert overhead_for(h200) == serving_overhead("vllm", False)  # measured on cpu only


def test_simulate_and_step_take_the_measured_latencies(folder, tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"format": 1, "deployment": AGG, "workload": {
        "arrival": {"kind": "closed", "concurrency": 1}, "requests": 2,
        "input_tokens": {"kind": "fixed", "value": 64},
        "output_tokens": {"kind": "fixed", "value": 8}}}))
    assert main(["simulate", str(plan), "--json", "--calibration", str(folder)]) == 0
    measured = json.loads(capsys.readouterr().out)
    write_user_serving_overhead(folder, "cpu", "vllm", {"api_overhead_ms": 120.0}, ABOUT)
    assert main(["simulate", str(plan), "--json", "--calibration", str(folder)]) == 0
    slower = json.loads(capsys.readouterr().out)
    assert slower["ttft_ms"]["p50"] == pytest.approx(measured["ttft_ms"]["p50"] + 100.0)
    assert slower["tpot_ms"]["p50"] == pytest.approx(measured["tpot_ms"]["p50"])

    dep = tmp_path / "d.yaml"
    dep.write_text(yaml.safe_dump(AGG))
    args = ["step", str(dep), "--role", "aggregated", "--batch", "2", "--context", "64",
            "--json"]
    assert main([*args, "--calibration", str(folder)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["parts_ms"]["overhead"] == 1.5
    assert report["provenance"]["overhead"] == "measured (fixed)"
    assert main(args) == 0
    assert "assumed fixed" in json.loads(capsys.readouterr().out)["provenance"]["overhead"]
