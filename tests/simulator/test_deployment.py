"""Deployment spec: defaults, YAML round-trip, one-line errors, P/D rules, vLLM model rules."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.specs.deployment import Deployment, RoleSpec, check_against_model
from simulator.specs.errors import SpecError
from simulator.specs.loading import dump_deployment, load_deployment

PD: dict[str, Any] = {
    "model": "deepseek-v3",
    "hardware": "h200",
    "prefill": {"instances": 4, "dep": 8, "max_num_batched_tokens": 16384,
                "redundant_experts": 32},
    "decode": {"instances": 1, "dep": 32, "max_num_seqs": 256, "redundant_experts": 32,
               "speculative": {"method": "mtp", "tokens": 1, "acceptance": 0.8}},
}


@dataclass(frozen=True)
class StubModel:
    name: str = "stub-moe"
    n_routed_experts: int = 256
    mtp_layers: int = 1
    num_attention_heads: int = 128
    num_kv_heads: int = 128
    dspark_block: int = 0
    engram_layers: int = 0

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0


DENSE = StubModel(name="stub-dense", n_routed_experts=0, mtp_layers=0,
                  num_attention_heads=64, num_kv_heads=8)


def with_(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def error(source: Any) -> str:
    with pytest.raises(SpecError) as info:
        load_deployment(source)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- defaults and properties ----------------------------------------------------------------


def test_defaults() -> None:
    d = load_deployment({"model": "m", "hardware": "h200", "aggregated": {}})
    assert (d.engine, d.engine_version, d.gpus, d.usd_per_gpu_hour) == ("vllm", None, None, None)
    assert (d.precision.weights, d.precision.kv_cache) == ("fp8", "fp8")
    role = d.roles["aggregated"]
    assert (role.instances, role.dep, role.tp, role.ranks, role.gpus) == (1, None, None, 1, 1)
    assert (role.max_num_seqs, role.max_num_batched_tokens, role.redundant_experts) == (
        256, 8192, 0)
    assert role.speculative is None and not role.expert_parallel
    assert role.gpu_memory_utilization == 0.9
    assert role.backend("aggregated") == "allgather_reducescatter"
    assert not d.disaggregated and d.gpus_used == 1


def test_pd_properties_and_role_defaults() -> None:
    d = load_deployment(PD)
    assert list(d.roles) == ["prefill", "decode"] and d.disaggregated
    assert d.gpus_used == 4 * 8 + 32
    assert d.prefill is not None and d.decode is not None
    assert d.prefill.expert_parallel and d.prefill.ranks == 8
    assert d.prefill.backend("prefill") == "deepep_high_throughput"
    assert d.decode.backend("decode") == "deepep_low_latency"
    assert d.prefill.router_policy("prefill") == "prefix_aware"
    assert d.decode.router_policy("decode") == "least_requests"
    assert d.decode.speculative is not None and d.decode.speculative.acceptance == 0.8
    chosen = RoleSpec(all2all_backend="pplx", router="round_robin")
    assert chosen.backend("decode") == "pplx" and chosen.router_policy("prefill") == "round_robin"


def test_tp_layout() -> None:
    role = RoleSpec(instances=2, tp=4)
    assert (role.ranks, role.gpus, role.expert_parallel, role.layout) == (4, 8, False, "TP4")


# --- round-trip -----------------------------------------------------------------------------


def test_round_trip_through_yaml(tmp_path: Path) -> None:
    d = load_deployment(with_(PD, precision={"weights": "fp4"}, gpus=128, engine_version="0.11"))
    dumped = dump_deployment(d)
    path = tmp_path / "deployment.yaml"
    path.write_text(yaml.safe_dump(dumped))
    assert load_deployment(path) == d
    assert load_deployment(str(path)) == d


def test_dump_is_short() -> None:
    dumped = dump_deployment(load_deployment(PD))
    assert dumped == PD
    built = Deployment(model="m", hardware="b200", aggregated=RoleSpec(tp=8))
    assert dump_deployment(built) == {"model": "m", "hardware": "b200", "aggregated": {"tp": 8}}
    assert load_deployment(dump_deployment(built)) == built


# --- one-line errors ------------------------------------------------------------------------


def test_unknown_key_names_key_and_valid_keys() -> None:
    msg = error(with_(PD, decode={"dep": 8, "max_seqs": 128}))
    assert msg.startswith("deployment: unknown key 'max_seqs' in decode")
    assert "max_num_seqs" in msg and "valid keys: instances, dep, tp" in msg


def test_unknown_top_level_key() -> None:
    assert "unknown key 'gpu' " in error(with_(PD, gpu=8))


def test_bound_error() -> None:
    assert error(with_(PD, decode={"dep": 0})) == "deployment: decode.dep=0 must be >= 1"


def test_literal_error_lists_choices() -> None:
    msg = error(with_(PD, precision={"weights": "int3"}))
    assert msg == "deployment: precision.weights='int3' is not one of bf16, fp8, fp4, int4"
    msg = error(with_(PD, decode={"dep": 8, "all2all_backend": "nccl"}))
    assert "'nccl'" in msg and "deepep_low_latency" in msg


def test_wrong_type() -> None:
    assert error(with_(PD, decode={"dep": "eight"})) == (
        "deployment: decode.dep='eight' must be an integer")
    assert "precision='fp8' must be a mapping with keys weights, kv_cache" in error(
        with_(PD, precision="fp8"))


def test_missing_required_key() -> None:
    assert error(with_(PD, model=None)) == "deployment: missing required key 'model'"


def test_file_errors(tmp_path: Path) -> None:
    assert "no such file" in error(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: x\n  hardware: [\n")
    msg = error(bad)
    assert msg.startswith(f"{bad}: invalid YAML at line 2")
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    assert "top level must be a mapping" in error(listed) and "a list" in error(listed)
    named = tmp_path / "deployment.yaml"
    named.write_text(yaml.safe_dump(with_(PD, decode={"dep": 0})))
    assert error(named) == f"{named}: decode.dep=0 must be >= 1"


# --- P/D vs aggregated and other cross-field rules ------------------------------------------


def test_aggregated_alone_is_valid() -> None:
    d = load_deployment({"model": "m", "hardware": "h200", "aggregated": {"instances": 2,
                                                                          "dep": 8}})
    assert list(d.roles) == ["aggregated"] and d.gpus_used == 16


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"prefill": None, "decode": None}, "no roles given"),
        ({"aggregated": {"dep": 8}}, "aggregated cannot be given with prefill and decode"),
    ],
)
def test_role_combinations(changes: dict[str, Any], expected: str) -> None:
    msg = error(with_(PD, **changes))
    assert expected in msg and "aggregated alone" in msg


@pytest.mark.parametrize("alone", ["prefill", "decode"])
def test_one_role_alone_is_an_isolated_bench(alone: str) -> None:
    other = "decode" if alone == "prefill" else "prefill"
    d = load_deployment(with_(PD, **{other: None}))
    assert list(d.roles) == [alone] and d.single_role == alone
    assert load_deployment(PD).single_role is None


def test_dep_with_tp_is_attention_dp_over_tp_groups() -> None:
    d = load_deployment(with_(PD, decode={"dep": 4, "tp": 4}))
    assert (d.decode.ranks, d.decode.attention_tp, d.decode.layout) == (16, 4, "DEP4xTP4")
    msg = error(with_(PD, decode={"dep": 8, "enable_expert_parallel": True}))
    assert "enable_expert_parallel applies to tp layouts" in msg


def test_redundant_experts_need_dep() -> None:
    msg = error(with_(PD, prefill={"tp": 8, "redundant_experts": 16}))
    assert "prefill: redundant_experts=16 needs expert parallelism" in msg


def test_gpus_must_cover_roles() -> None:
    pd = with_(PD, prefill={"instances": 4, "dep": 8}, decode={"dep": 48}, gpus=72)
    assert error(pd) == ("deployment: roles use 80 GPUs (prefill 4 x DEP8 = 32, "
                         "decode 1 x DEP48 = 48) but gpus=72")
    assert load_deployment(with_(pd, gpus=80)).gpus == 80


# --- rules that need the model ---------------------------------------------------------------


def check(role: dict[str, Any], model: StubModel) -> None:
    check_against_model(load_deployment({"model": model.name, "hardware": "h200",
                                         "aggregated": role}), model)


def test_dep_must_divide_routed_plus_redundant() -> None:
    check({"dep": 48, "redundant_experts": 32}, StubModel())  # 288 = 48 x 6
    check({"dep": 32, "redundant_experts": 0}, StubModel())
    with pytest.raises(SpecError) as info:
        check_against_model(load_deployment(with_(PD, decode={"dep": 7, "redundant_experts": 32})),
                            StubModel())
    msg = str(info.value)
    assert msg.startswith("decode: dep=7 must divide routed+redundant experts (256+32=288)")
    assert "redundant_experts=38" in msg and "\n" not in msg


def test_redundant_experts_on_dense_model() -> None:
    with pytest.raises(SpecError, match=r"redundant_experts=8 needs an MoE model but stub-dense"):
        check({"dep": 8, "redundant_experts": 8}, DENSE)
    check({"dep": 8}, DENSE)


def test_mtp_needs_mtp_layers() -> None:
    spec = {"dep": 8, "speculative": {"tokens": 2}}
    check(spec, StubModel())  # one MTP layer, reused
    with pytest.raises(SpecError, match=r"needs MTP layers but stub-dense has none"):
        check({"tp": 8, "speculative": {}}, DENSE)
    with pytest.raises(SpecError, match=r"tokens=3 .* multiple of 2"):
        check({"dep": 8, "speculative": {"tokens": 3}}, StubModel(mtp_layers=2))


def test_draft_method_follows_the_models_draft_layers() -> None:
    dspark = StubModel(mtp_layers=3, dspark_block=5, engram_layers=2)
    check({"dep": 8, "speculative": {"method": "dspark", "tokens": 5}}, dspark)
    with pytest.raises(SpecError, match=r"draft layers are DSpark layers.*use method dspark"):
        check({"dep": 8, "speculative": {"tokens": 3}}, dspark)
    with pytest.raises(SpecError, match=r"tokens=6 is more than the DSpark block of 5"):
        check({"dep": 8, "speculative": {"method": "dspark", "tokens": 6}}, dspark)
    with pytest.raises(SpecError, match=r"'dspark' needs DSpark draft layers.*use method mtp"):
        check({"dep": 8, "speculative": {"method": "dspark"}}, StubModel())
    with pytest.raises(SpecError, match=r"dbo=true: .*Engram layers.*set dbo to false"):
        check({"dep": 8, "dbo": True, "all2all_backend": "deepep_low_latency"}, dspark)


def test_tp_must_divide_heads() -> None:
    check({"tp": 8}, DENSE)
    check({"tp": 16}, DENSE)  # 8 KV heads, each replicated twice
    with pytest.raises(SpecError, match=r"tp=3 must divide the 64 attention heads"):
        check({"tp": 3}, DENSE)
    with pytest.raises(SpecError, match=r"tp=4 and the 6 KV heads"):
        check({"tp": 4}, StubModel(n_routed_experts=0, num_attention_heads=48, num_kv_heads=6))


def test_attention_dp_balance_is_tensorrt_llms_and_needs_dep() -> None:
    base = {"model": "deepseek-v3", "hardware": "h200"}
    msg = error({**base, "aggregated": {"dep": 8, "attention_dp_balance": True}})
    assert "attention_dp_balance=true is TensorRT-LLM's" in msg and "engine vllm" in msg
    assert "needs dep" in error({**base, "engine": "trtllm",
                                 "aggregated": {"tp": 8, "attention_dp_balance": True}})
    ok = load_deployment({**base, "engine": "trtllm",
                          "aggregated": {"dep": 8, "attention_dp_balance": True}})
    assert ok.aggregated is not None and ok.aggregated.attention_dp_balance


def test_recv_interval_is_sglangs() -> None:
    base = {"model": "deepseek-v3", "hardware": "h200"}
    msg = error({**base, "aggregated": {"tp": 8, "recv_interval": 30}})
    assert "recv_interval=30 is SGLang's --scheduler-recv-interval" in msg
    assert "engine vllm" in msg
    assert "recv_interval" in error({**base, "engine": "sglang",
                                     "aggregated": {"tp": 8, "recv_interval": 0}})
    ok = load_deployment({**base, "engine": "sglang", "aggregated": {"tp": 8, "recv_interval": 30}})
    assert ok.aggregated is not None and ok.aggregated.recv_interval == 30
