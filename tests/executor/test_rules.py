"""executor/rules: vLLM's rules for a `vllm serve` process, checked on its launch record, one
test per rule."""

import pytest

from executor.records import DataParallel, Flag, LaunchRecord, Rendered
from executor.render import render
from executor.rules import check_rendered, record_problems
from simulator.specs.errors import SpecError
from simulator.specs.loading import load_deployment
from tests.executor.cluster import ROOT, pd_rendering, uneven_rendering

NIXL_P = {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
NIXL_C = {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}
EP: Flag = ("--enable-expert-parallel", None)
EPLB: Flag = ("--enable-eplb", None)


def serve(*flags: Flag, dp: DataParallel | None = None, tp: int = 1,
          role: str = "aggregated") -> LaunchRecord:
    return LaunchRecord("x-0", role, 0, "/m", flags=flags, tp=tp, dp=dp)


def eplb(redundant: object) -> Flag:
    return ("--eplb-config", {"num_redundant_experts": redundant})


def dp(size: int, local: int | None = None, start: int = 0, address: str | None = None,
       headless: bool = False) -> DataParallel:
    return DataParallel(size, size if local is None else local, start, address, None, headless)


@pytest.mark.parametrize("rendering", [pd_rendering, uneven_rendering])
def test_renderings_break_no_rule(rendering):
    check_rendered(rendering(), routed_experts=256)


@pytest.mark.parametrize(("record", "needle"), [
    (serve(EPLB, dp=dp(8)), "--enable-eplb needs --enable-expert-parallel"),
    (serve(EPLB, EP), "expert-parallel group of more than one rank, but TP=1 x PCP=1 x DP=1 = 1"),
    (serve(eplb(32), EP, dp=dp(8)), "num_redundant_experts=32 needs --enable-eplb"),
    (serve(EPLB, EP, eplb(32), dp=dp(40)),
     "the expert-parallel size 40 (TP=1 x PCP=1 x DP=40) must divide routed+redundant experts "
     "(256+32=288); e.g. redundant_experts=64 (320 = 40 x 8)"),
    (serve(EPLB, EP, eplb(-1), dp=dp(8)), "num_redundant_experts=-1 must be"),
    (serve(("--eplb-config", "{oops")), "--eplb-config '{oops' must be a JSON object"),
])
def test_eplb_needs_expert_parallel_and_divisible_experts(record, needle):
    (problem,) = record_problems(record, routed_experts=256)
    assert needle in problem


def test_eplb_divisibility_is_the_spec_s_rule_and_counts_tensor_parallel_ranks_too():
    from simulator.specs.deployment import experts_error

    ok = serve(EPLB, EP, eplb(32), dp=dp(4), tp=2)
    assert record_problems(ok, routed_experts=256) == []  # 288 = 8 x 36
    (problem,) = record_problems(ok, routed_experts=250)  # 282 is not a multiple of 8
    assert problem == experts_error(250, 32, 8, "the expert-parallel size 8 (TP=2 x PCP=1 x "
                                                "DP=4)")
    assert record_problems(ok) == []  # experts unknown: divisibility not checked


@pytest.mark.parametrize(("record", "needle"), [
    (serve(("--data-parallel-hybrid-lb", None), ("--data-parallel-external-lb", None),
           dp=dp(4)), "modes external and hybrid exclude each other"),
    (serve(("--data-parallel-rank", 1), dp=dp(4, 2, start=2)),
     "modes external and hybrid exclude each other"),
    (serve(("--data-parallel-multi-port-external-lb", None), ("--data-parallel-hybrid-lb", None),
           dp=dp(4)), "modes multi-port external and hybrid exclude each other"),
])
def test_hybrid_and_external_load_balancing_exclude_each_other(record, needle):
    (problem,) = record_problems(record)
    assert needle in problem


def test_a_start_rank_with_multi_port_is_not_hybrid():
    record = serve(("--data-parallel-multi-port-external-lb", None), dp=dp(4, 2, start=2))
    assert record_problems(record) == []


def test_local_data_parallel_size_fits_in_the_data_parallel_size():
    (problem,) = record_problems(serve(dp=dp(8, 16)))
    assert problem == "--data-parallel-size-local 16 must be <= --data-parallel-size 8"
    (problem,) = record_problems(serve(dp=dp(8, 8, start=4, address="h", headless=True)))
    assert "start-rank 4 + --data-parallel-size-local 8 runs past --data-parallel-size 8" in \
        problem


def test_headless_needs_a_data_parallel_address_and_no_api_server():
    (problem,) = record_problems(serve(dp=dp(16, 8, start=8, headless=True)))
    assert problem.startswith("--headless needs --data-parallel-address")
    head = dp(16, 8, start=8, address="host0", headless=True)
    assert record_problems(serve(dp=head)) == []
    problems = record_problems(serve(("--api-server-count", 2), ("--data-parallel-hybrid-lb", None),
                                     dp=head))
    assert problems == ["--api-server-count 2 cannot be used with --headless (a headless host "
                        "starts no API server)",
                        "--data-parallel-hybrid-lb does not apply to a --headless host"]


@pytest.mark.parametrize("tokens", [0, -1, "2"])
def test_speculative_tokens_are_at_least_one(tokens):
    spec = {"method": "mtp", "num_speculative_tokens": tokens}
    (problem,) = record_problems(serve(("--speculative-config", spec)))
    assert "num_speculative_tokens=" in problem and ">= 1" in problem
    assert record_problems(serve(("--speculative-config",
                                  {"method": "mtp", "num_speculative_tokens": 1}))) == []


@pytest.mark.parametrize(("role", "flags", "needle"), [
    ("prefill", [], "a prefill instance of a P/D deployment needs --kv-transfer-config with "
                    "kv_role kv_producer or kv_both"),
    ("decode", [("--kv-transfer-config", NIXL_P)], "a decode instance needs kv_role kv_consumer "
                                                   "or kv_both in --kv-transfer-config, not "
                                                   "'kv_producer'"),
    ("decode", [("--kv-transfer-config", {"kv_connector": "NixlConnector"})],
     "sets kv_connector='NixlConnector' but no kv_role"),
    ("aggregated", [("--kv-transfer-config", {"kv_connector": "NixlConnector",
                                              "kv_role": "both"})],
     "kv_role='both' is not one of kv_producer, kv_consumer, kv_both"),
])
def test_pd_roles_need_their_kv_role(role, flags, needle):
    (problem,) = record_problems(serve(*flags, role=role))
    assert needle in problem
    assert record_problems(serve(("--kv-transfer-config", NIXL_P), role="prefill")) == []
    assert record_problems(serve(("--kv-transfer-config", NIXL_C), role="decode")) == []
    assert record_problems(serve(role="aggregated")) == []


def test_check_rendered_names_each_problem_once_with_its_first_process():
    procs = tuple(LaunchRecord(f"decode-{i}", "decode", 0, "/m",
                               flags=(("--kv-transfer-config", NIXL_C),), dp=dp(4, 8), port=1)
                  for i in range(3))
    with pytest.raises(SpecError) as e:
        check_rendered(Rendered(procs, {"port": 0}))
    assert str(e.value) == ("decode-0 host 0: --data-parallel-size-local 8 must be <= "
                            "--data-parallel-size 4")


V4 = "DeepseekV4ForCausalLM"


def v4_rendering() -> Rendered:
    return render(load_deployment(ROOT / "examples" / "deepseek-v4-flash-gb300-pd.yaml"))


def test_the_deepseek_v4_rendering_breaks_no_rule_of_its_family():
    check_rendered(v4_rendering(), routed_experts=256, architecture=V4, hardware="gb300")


def test_check_rendered_applies_the_family_rules_it_is_given():
    with pytest.raises(SpecError) as e:  # the same lines on Hopper
        check_rendered(v4_rendering(), routed_experts=256, architecture=V4, hardware="h200")
    assert str(e.value) == (
        "prefill-0 host 0: --attention-config indexer_kv_dtype='mxfp4' needs Blackwell "
        "datacenter GPUs (b200, b300, gb200, gb300), not h200; prefill-0 host 0: --moe-backend "
        "deep_gemm_mega_moe needs Blackwell datacenter GPUs (b200, b300, gb200, gb300), not "
        "h200")


@pytest.mark.parametrize(("flags", "arch", "hardware", "needle"), [
    ([("--kv-cache-dtype", "nvfp4_ds_mla")], V4, None,
     "--kv-cache-dtype nvfp4_ds_mla is not one vLLM's attention backends for "
     "DeepseekV4ForCausalLM take; use one of auto, bfloat16, fp8, fp8_e4m3, fp8_ds_mla"),
    ([("--kv-cache-dtype", "nvfp4_ds_mla")], "DeepseekV32ForCausalLM", "h200",
     "--kv-cache-dtype nvfp4_ds_mla needs Blackwell datacenter GPUs (b200, b300, gb200, gb300), "
     "not h200"),
    ([("--block-size", 64)], V4, None,
     "--block-size 64 is not one the attention kernels of DeepseekV4ForCausalLM support; use "
     "--block-size 256"),
    ([("--attention-config", {"indexer_kv_dtype": "mxfp4"})], "DeepseekV3ForCausalLM", None,
     "--attention-config indexer_kv_dtype='mxfp4' applies to models with a DeepSeek "
     "sparse-attention indexer (DeepseekV32ForCausalLM, DeepseekV4ForCausalLM, "
     "DeepseekV41ForCausalLM), not DeepseekV3ForCausalLM; drop it"),
    ([("--attention-config", {"indexer_kv_dtype": "nvfp4"})], V4, None,
     "--attention-config indexer_kv_dtype='nvfp4' is not one the DeepSeek sparse indexer "
     "supports; use one of auto, fp8, mxfp4"),
    ([("--attention-config", {"use_fp4_indexer_cache": True})], None, None,
     "--attention-config use_fp4_indexer_cache is not a field of vLLM 0.32's attention config; "
     "give indexer_kv_dtype 'mxfp4' for an fp4 indexer cache (or 'fp8')"),
    ([("--moe-backend", "deep_gemm_mega_moe")], V4, None,
     "--moe-backend deep_gemm_mega_moe needs --enable-expert-parallel"),
    ([("--moe-backend", "deep-gemm-mega-moe"), EP], "DeepseekV3ForCausalLM", None,
     "--moe-backend deep-gemm-mega-moe runs in the MoE layers of DeepseekV4ForCausalLM, "
     "DeepseekV41ForCausalLM only, not DeepseekV3ForCausalLM; drop it (auto)"),
])
def test_family_rules_refuse_what_vllm_refuses_for_the_model(flags, arch, hardware, needle):
    (problem,) = record_problems(serve(*flags, dp=dp(4)), architecture=arch, hardware=hardware)
    assert problem.startswith(needle)


def test_family_rules_need_the_architecture():
    record = serve(("--kv-cache-dtype", "nvfp4_ds_mla"), ("--block-size", 64))
    assert record_problems(record) == []  # model unknown: not checked
    assert record_problems(record, architecture="DeepseekV32ForCausalLM", hardware="b200") == []
