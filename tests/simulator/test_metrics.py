"""Tests for simulator.des.metrics: percentiles and the `simulate --json` key contract."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator.des import simulate
from simulator.des.metrics import SimResult, percentiles, weighted_percentiles
from simulator.specs.deployment import Deployment, RoleSpec
from simulator.specs.workload import ClosedArrival, FixedLength, Workload

CONTRACT = {
    "gpus", "duration_s", "completed", "throughput_tok_s_gpu", "output_tok_s_gpu",
    "prefill_input_tok_s_gpu", "decode_output_tok_s_gpu", "ttft_ms", "tpot_ms", "itl_ms",
    "tok_s_user", "step_breakdown", "expert_imbalance", "cost_per_mtok_usd",
    "cached_input_tokens", "uncached_input_tokens", "output_tokens", "kv_admission_wait_s",
    "dp_imbalance",  # an extension of DESIGN.md's keys: GPU time lock-step DP ranks wait
    # extensions for agentic traffic: prefix-cache hits, the host tier, warmup turns left
    # out, TTFT by turn depth, per-session speed
    "cache_hit_share", "host_loaded_tokens", "warmup_requests", "ttft_by_depth_ms",
    "session_tok_s",
    "prefill_computed_tok_s_gpu",  # uncached (computed) input tokens / prefill GPUs
    "preempted_requests",  # running requests whose KV an instance took back (vLLM)
}


def result(**kw: object) -> SimResult:
    base: dict[str, object] = dict(
        gpus=16, prefill_gpus=8, decode_gpus=8, usd_per_gpu_hour=3.6, duration_s=100.0,
        ttft_s=np.array([0.1, 0.2, 0.3, 0.4]), tpot_s=np.array([0.01, 0.02, 0.04, np.nan]),
        e2e_s=np.array([1.0, 2.0, 3.0, 4.0]), cached_input_tokens=1000,
        uncached_input_tokens=3000, output_tokens=2000,
        itl_s=np.array([0.01, 0.03]), itl_weight=np.array([3, 1]),
        breakdown_ms={"moe": 60.0, "attention": 20.0, "communication": 10.0, "other": 10.0},
        expert_imbalance=0.25, kv_admission_wait_s=1.5, timelines={}, instances={})
    base.update(kw)
    return SimResult(**base)  # type: ignore[arg-type]


def test_metrics_has_exactly_the_contract_keys_and_serializes() -> None:
    m = result().metrics()
    assert set(m) == CONTRACT
    # the contract's percentiles, plus the mean (what published benchmarks report)
    assert set(m["ttft_ms"]) == set(m["tpot_ms"]) == set(m["itl_ms"]) == {"p50", "p90", "p99",
                                                                          "mean"}
    assert {"p50", "p90"} <= set(m["tok_s_user"])
    assert set(m["step_breakdown"]) == {"moe", "attention", "communication", "other"}
    json.dumps(m, allow_nan=False)


def test_throughput_cost_and_breakdown_arithmetic() -> None:
    m = result().metrics()
    assert m["throughput_tok_s_gpu"] == pytest.approx(6000 / 100 / 16)
    assert m["output_tok_s_gpu"] == pytest.approx(2000 / 100 / 16)
    assert m["prefill_input_tok_s_gpu"] == pytest.approx(4000 / 100 / 8)
    assert m["prefill_computed_tok_s_gpu"] == pytest.approx(3000 / 100 / 8)
    assert m["decode_output_tok_s_gpu"] == pytest.approx(2000 / 100 / 8)
    assert m["cost_per_mtok_usd"] == pytest.approx(3.6 * 16 * 100 / 3600 / (6000 / 1e6))
    assert m["step_breakdown"] == pytest.approx(
        {"moe": 0.6, "attention": 0.2, "communication": 0.1, "other": 0.1})
    assert m["ttft_ms"]["p50"] == pytest.approx(250.0)
    assert m["tok_s_user"]["p50"] == pytest.approx(50.0)  # 1 / median TPOT of 0.01, 0.02, 0.04
    assert {k: m["itl_ms"][k] for k in ("p50", "p90", "p99")} == {
        "p50": pytest.approx(10.0), "p90": pytest.approx(30.0), "p99": pytest.approx(30.0)}


def test_absent_roles_and_empty_samples_are_null() -> None:
    m = result(prefill_gpus=None, decode_gpus=None, tpot_s=np.full(4, np.nan),
               itl_s=np.zeros(0), itl_weight=np.zeros(0)).metrics()
    assert m["prefill_input_tok_s_gpu"] is None and m["decode_output_tok_s_gpu"] is None
    assert m["prefill_computed_tok_s_gpu"] is None
    assert m["tpot_ms"] == {"p50": None, "p90": None, "p99": None, "mean": None}
    assert m["itl_ms"]["p99"] is None and m["tok_s_user"]["p90"] is None
    json.dumps(m, allow_nan=False)


def test_percentiles() -> None:
    assert percentiles(np.array([1.0, np.nan, 3.0]), (50,)) == {"p50": 2.0, "mean": 2.0}
    assert percentiles(np.zeros(0), (50, 90)) == {"p50": None, "p90": None, "mean": None}
    w = weighted_percentiles(np.array([5.0, 1.0, 9.0]), np.array([1, 8, 1]), (50, 85, 95))
    assert w == {"p50": 1.0, "p85": 5.0, "p95": 9.0, "mean": pytest.approx(2.2)}


def test_simulated_metrics_satisfy_the_contract() -> None:
    dep = Deployment(model="deepseek-v3", hardware="h200", prefill=RoleSpec(dep=8),
                     decode=RoleSpec(dep=8), gpus=24, usd_per_gpu_hour=2.0)
    wl = Workload(arrival=ClosedArrival(concurrency=16), requests=32,
                  input_tokens=FixedLength(value=1500), output_tokens=FixedLength(value=40))
    m = simulate(dep, wl).metrics()
    assert set(m) == CONTRACT
    assert m["gpus"] == 24 and m["completed"] == 32  # the cluster's GPUs, idle ones included
    assert m["uncached_input_tokens"] == 32 * 1500 and m["output_tokens"] == 32 * 40
    assert sum(m["step_breakdown"].values()) == pytest.approx(1.0)
    assert m["ttft_ms"]["p50"] <= m["ttft_ms"]["p90"] <= m["ttft_ms"]["p99"]
    tokens = 32 * (1500 + 40)
    assert m["cost_per_mtok_usd"] == pytest.approx(
        2.0 * 24 * m["duration_s"] / 3600 / (tokens / 1e6))
    json.dumps(m, allow_nan=False)
