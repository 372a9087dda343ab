"""executor/render: a deployment as typed launch records, whose command lines are the exact
`vllm serve` processes (golden files, records' fields, rules, the engine table)."""

import json
import shlex
from pathlib import Path

import pytest
import yaml

from executor.records import DataParallel
from executor.render import render
from simulator.specs.deployment import Deployment, RoleSpec, Speculative
from simulator.specs.errors import SpecError
from simulator.specs.loading import load_deployment
from simulator.specs.model import load_model
from tests.executor.golden_files import assert_golden, command_lines

ROOT = Path(__file__).resolve().parents[2]


def flag(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_deepseek_pd_wide_ep_plan_matches_its_golden_file():
    r = render(load_deployment(ROOT / "examples" / "deepseek-v3-h200-pd.yaml"),
               model_path="/models/DeepSeek-V3")
    assert_golden("deepseek-v3-h200-pd.txt", command_lines(r))


def test_dep_instance_spans_hosts_with_every_rank_once():
    r = render(load_deployment(ROOT / "examples" / "deepseek-v3-h200-pd.yaml"))
    decode = [p for p in r.processes if p.instance == "decode-0"]
    assert len(decode) == 5  # DEP40 on 8-GPU hosts
    ranks = []
    for p in decode:
        assert p.dp is not None
        ranks += range(p.dp.start_rank, p.dp.start_rank + p.dp.local)
        assert p.dp.address == "host4"
        assert p.dp.headless == (p.host > 0) and (p.port is None) == (p.host > 0)
        assert ("--headless" in p.to_argv()) == p.dp.headless
    assert sorted(ranks) == list(range(40))


def test_records_of_the_golden_pd_plan_carry_their_launch_as_typed_fields():
    r = render(load_deployment(ROOT / "examples" / "deepseek-v3-h200-pd.yaml"),
               model_path="/models/DeepSeek-V3")
    prefill = r.processes[0]
    assert (prefill.instance, prefill.role, prefill.host, prefill.port) == ("prefill-0",
                                                                            "prefill", 0, 8100)
    assert prefill.dp == DataParallel(size=8, local=8, start_rank=0, address="host0",
                                      rpc_port=29550, headless=False)
    third = next(p for p in r.processes if p.instance == "decode-0" and p.host == 2)
    assert third.dp == DataParallel(size=40, local=8, start_rank=16, address="host4",
                                    rpc_port=29554, headless=True)
    assert (third.tp, third.port, third.gpus, third.model) == (1, None, 8, "/models/DeepSeek-V3")
    assert third.env == {"VLLM_NIXL_SIDE_CHANNEL_HOST": "host6",
                         "VLLM_NIXL_SIDE_CHANNEL_PORT": "5604"}
    assert third.value("--eplb-config") == {"num_redundant_experts": 64}  # data, not JSON text
    assert third.value("--max-num-seqs") == 256 and third.has("--enable-expert-parallel")
    assert third.value("--kv-transfer-config") == {"kv_connector": "NixlConnector",
                                                   "kv_role": "kv_consumer"}
    argv = third.to_argv()  # the last step: the golden file's line
    assert argv[:3] == ("vllm", "serve", "/models/DeepSeek-V3")
    assert argv[-3:] == ("--data-parallel-start-rank", "16", "--headless")
    assert third.command_line() in (ROOT / "tests" / "executor" / "golden" /
                                    "deepseek-v3-h200-pd.txt").read_text().splitlines()


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_an_engine_rackplan_does_not_deploy_is_refused_by_name_not_rendered_as_vllm(engine):
    plan = yaml.safe_load((ROOT / "examples" / "deepseek-v3-h200-pd.yaml").read_text())
    d = load_deployment({**plan, "engine": engine})  # its calibration tables may price it
    with pytest.raises(SpecError) as e:
        render(d)
    assert str(e.value) == (f"deploying engine '{engine}' is not supported yet; rackplan "
                            "deploys vllm")


def test_pd_roles_are_nixl_producer_and_consumer_and_the_router_knows_both():
    r = render(load_deployment(ROOT / "examples" / "deepseek-v3-h200-pd.yaml"))
    roles = {p.role: json.loads(flag(p.argv, "--kv-transfer-config") or "{}")["kv_role"]
             for p in r.processes}
    assert roles == {"prefill": "kv_producer", "decode": "kv_consumer"}
    assert len(r.router["prefill_urls"]) == 4 and len(r.router["decode_urls"]) == 1
    assert r.router_policies == {"prefill_policy": "prefix_aware",
                                 "decode_policy": "least_requests"}  # the defaults


def test_the_router_carries_the_plans_policy_of_each_role():
    d = Deployment(model="deepseek-v3", hardware="h200",
                   aggregated=RoleSpec(dep=8, instances=2, router="session_affinity"))
    r = render(d)
    assert r.router["aggregated_policy"] == "session_affinity"
    assert r.router_policies == {"aggregated_policy": "session_affinity"}


def test_eplb_and_mtp_flags():
    d = Deployment(model="deepseek-v3", hardware="gb300",
                   aggregated=RoleSpec(dep=32, redundant_experts=32,
                                       speculative=Speculative(tokens=2)))
    (head, *rest) = render(d).processes
    assert len(rest) == 7  # 4-GPU compute trays
    assert json.loads(flag(head.argv, "--eplb-config") or "") == {"num_redundant_experts": 32}
    assert json.loads(flag(head.argv, "--speculative-config") or "") == {
        "method": "mtp", "num_speculative_tokens": 2}
    assert flag(head.argv, "--all2all-backend") == "allgather_reducescatter"
    assert "--kv-transfer-config" not in head.argv
    assert shlex.split(head.command_line())[:3] == ["vllm", "serve", "deepseek-v3"]


def test_tp_layout_has_no_data_parallel_flags():
    d = Deployment(model="qwen3-235b-a22b", hardware="h200", aggregated=RoleSpec(tp=4))
    (p,) = render(d).processes
    assert flag(p.argv, "--tensor-parallel-size") == "4"
    assert "--data-parallel-size" not in p.argv and "--enable-expert-parallel" not in p.argv


@pytest.mark.parametrize(("role", "needle"), [
    (RoleSpec(dep=10, redundant_experts=32), "dep=10 must divide"),
    (RoleSpec(tp=8, all2all_backend="deepep_low_latency"), "needs expert parallelism"),
])
def test_rules_refuse_with_the_value(role, needle):
    d = Deployment(model="deepseek-v3", hardware="h200", aggregated=role)
    with pytest.raises(SpecError, match=needle):
        render(d)


V4_PD = ROOT / "examples" / "deepseek-v4-flash-gb300-pd.yaml"


def test_deepseek_v4_flash_pd_wide_ep_plan_matches_its_golden_file():
    assert load_model("deepseek-v4-flash").architecture == "DeepseekV4ForCausalLM"
    r = render(load_deployment(V4_PD), model_path="/models/DeepSeek-V4-Flash")
    assert_golden("deepseek-v4-flash-gb300-pd.txt", command_lines(r))


def test_deepseek_v4_processes_carry_what_vllm_needs_for_v4():
    r = render(load_deployment(V4_PD))
    assert [p.instance for p in r.processes if p.host == 0] == ["prefill-0", "prefill-1",
                                                                 "decode-0"]
    assert len(r.processes) == 6  # 2 x DEP4 on one tray each, DEP16 on four 4-GPU trays
    for p in r.processes:
        assert flag(p.argv, "--kv-cache-dtype") == "fp8"
        assert flag(p.argv, "--block-size") == "256"
        assert flag(p.argv, "--tokenizer-mode") == "deepseek_v4"
        assert json.loads(flag(p.argv, "--attention-config") or "") == {
            "indexer_kv_dtype": "mxfp4"}
        assert "--no-disable-hybrid-kv-cache-manager" in p.argv
        assert "--enable-expert-parallel" in p.argv
        assert flag(p.argv, "--moe-backend") == "deep_gemm_mega_moe"
        assert "--all2all-backend" not in p.argv  # MegaMoE dispatches and combines itself
    (decode, *_) = (p for p in r.processes if p.role == "decode")
    assert json.loads(flag(decode.argv, "--speculative-config") or "") == {
        "method": "mtp", "num_speculative_tokens": 1}
    assert flag(decode.argv, "--data-parallel-size") == "16"


V41_PD = ROOT / "examples" / "deepseek-v4.1-flash-gb300-pd.yaml"


def test_deepseek_v41_flash_pd_wide_ep_plan_matches_its_golden_file():
    assert load_model("deepseek-v4.1-flash").architecture == "DeepseekV41ForCausalLM"
    r = render(load_deployment(V41_PD), model_path="/models/DeepSeek-V4.1-Flash")
    assert_golden("deepseek-v4.1-flash-gb300-pd.txt", command_lines(r))


def test_deepseek_v41_processes_carry_what_vllm_needs_for_v41():
    r = render(load_deployment(V41_PD))
    for p in r.processes:
        assert flag(p.argv, "--kv-cache-dtype") == "nvfp4_ds_mla"  # fp4 records, fp8 window
        assert flag(p.argv, "--tokenizer-mode") == "deepseek_v41"
        assert json.loads(flag(p.argv, "--attention-config") or "") == {
            "indexer_kv_dtype": "mxfp4"}
        assert flag(p.argv, "--moe-backend") == "deep_gemm_mega_moe"
        assert "--enable-dbo" not in p.argv and "--all2all-backend" not in p.argv
    (decode, *_) = (p for p in r.processes if p.role == "decode")
    assert json.loads(flag(decode.argv, "--speculative-config") or "") == {
        "method": "dspark", "num_speculative_tokens": 5}


def test_deepseek_v41_refuses_what_vllm_cannot_run_for_it():
    base = load_deployment(V41_PD)
    tp = base.model_copy(update={"decode": RoleSpec(tp=4, max_num_seqs=8)})
    with pytest.raises(SpecError, match=r"kv_cache='fp4' \(vLLM nvfp4_ds_mla\) .*needs "
                                        r"attention TP 1, not decode TP4"):
        render(tp)
    on_hopper = base.model_copy(update={"hardware": "h200"})
    with pytest.raises(SpecError, match=r"nvfp4_ds_mla\) needs Blackwell"):
        render(on_hopper)
    bf16 = base.model_copy(update={"precision": base.precision.model_copy(
        update={"kv_cache": "bf16"})})
    with pytest.raises(SpecError, match=r"kv_cache='bf16' has no vLLM KV-cache dtype for "
                                        r"deepseek-v4.1-flash"):
        render(bf16)


def test_a_single_role_bench_deck_is_not_deployed():
    d = Deployment(model="deepseek-v3", hardware="h200", decode=RoleSpec(dep=8))
    with pytest.raises(SpecError, match="only decode instances, an isolated-role bench"):
        render(d)


def test_the_long_prefill_threshold_is_rendered_where_a_role_sets_it():
    d = Deployment(model="deepseek-v3", hardware="h200",
                   prefill=RoleSpec(dep=8, max_num_batched_tokens=32768,
                                    long_prefill_token_threshold=4096),
                   decode=RoleSpec(dep=8))
    pre, dec = render(d).processes[0], render(d).processes[-1]
    assert flag(pre.argv, "--long-prefill-token-threshold") == "4096"
    assert "--long-prefill-token-threshold" not in dec.argv  # 0: vLLM's own default


def test_prefix_caching_off_is_rendered_and_refuses_a_host_tier():
    d = Deployment(model="deepseek-v3", hardware="h200",
                   prefill=RoleSpec(dep=8, prefix_caching=False), decode=RoleSpec(dep=8))
    pre, dec = render(d).processes[0], render(d).processes[-1]
    assert "--no-enable-prefix-caching" in pre.argv
    assert "--no-enable-prefix-caching" not in dec.argv  # on: vLLM's own default
    with pytest.raises(ValueError, match="host_cache_gb=8 is a second tier of the prefix cache"):
        RoleSpec(dep=8, prefix_caching=False, host_cache_gb=8)


def test_dual_batch_overlap_flags():
    d = Deployment(model="deepseek-v3", hardware="h200",
                   prefill=RoleSpec(dep=16, dbo=True, dbo_prefill_token_threshold=1024),
                   decode=RoleSpec(dep=16))
    pre, dec = render(d).processes[0], render(d).processes[-1]
    assert "--enable-dbo" in pre.argv and "--enable-dbo" not in dec.argv
    assert flag(pre.argv, "--dbo-prefill-token-threshold") == "1024"
    assert flag(pre.argv, "--dbo-decode-token-threshold") == "32"
    with pytest.raises(ValueError, match="aggregated: dbo=true needs all2all_backend"):
        Deployment(model="deepseek-v3", hardware="h200", aggregated=RoleSpec(dep=8, dbo=True))


def test_attention_dp_over_tp_groups_spans_hosts_by_dp_rank():
    d = Deployment(model="deepseek-v3", hardware="h200", aggregated=RoleSpec(dep=4, tp=4))
    head, other = render(d).processes
    assert flag(head.argv, "--tensor-parallel-size") == "4"
    assert flag(head.argv, "--data-parallel-size") == "4"
    assert flag(head.argv, "--data-parallel-size-local") == "2"  # 8 GPUs a host / TP4
    assert flag(other.argv, "--data-parallel-start-rank") == "2"
    assert "--enable-expert-parallel" in head.argv
    with pytest.raises(SpecError, match="tp=8 must divide the 4 GPUs of a host"):
        render(Deployment(model="deepseek-v3", hardware="gb300",
                          aggregated=RoleSpec(dep=2, tp=8)))


def test_host_tier_of_the_prefix_cache():
    agg = Deployment(model="deepseek-v3", hardware="gb300",
                     aggregated=RoleSpec(dep=8, host_cache_gb=100))
    argv = render(agg).processes[0].argv
    assert flag(argv, "--kv-offloading-size") == "100"
    assert flag(argv, "--kv-offloading-backend") == "native"
    pd = Deployment(model="deepseek-v3", hardware="gb300",
                    prefill=RoleSpec(dep=8, host_cache_gb=50), decode=RoleSpec(dep=8))
    procs = render(pd).processes
    prefill = json.loads(flag(procs[0].argv, "--kv-transfer-config"))
    assert prefill["kv_connector"] == "MultiConnector"
    nixl, host = prefill["kv_connector_extra_config"]["connectors"]
    assert nixl["kv_connector"] == "NixlConnector"
    assert host == {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                    "kv_connector_extra_config": {"cpu_bytes_to_use": 50 * 2 ** 30}}
    decode = json.loads(flag(procs[-1].argv, "--kv-transfer-config"))
    assert decode["kv_connector"] == "NixlConnector" and "--kv-offloading-size" not in procs[0].argv


def test_cpu_offload_flag():
    d = Deployment(model="deepseek-v3", hardware="gb300",
                   prefill=RoleSpec(dep=8), decode=RoleSpec(dep=8, cpu_offload_gb=12.5))
    procs = render(d).processes
    assert "--cpu-offload-gb" not in procs[0].argv
    assert flag(procs[-1].argv, "--cpu-offload-gb") == "12.5"


def test_prefetch_offload_flags_name_the_layer_groups():
    d = Deployment(model="deepseek-r1", hardware="gb200", precision={"weights": "fp4"},
                   prefill=RoleSpec(dep=2, cpu_offload_gb=32, offload_backend="prefetch"),
                   decode=RoleSpec(dep=8))
    pre, dec = render(d).processes[0], render(d).processes[-1]
    assert flag(pre.argv, "--offload-backend") == "prefetch"
    assert flag(pre.argv, "--offload-group-size") == "5"  # 12 of 61 layers, one per 5
    assert flag(pre.argv, "--offload-num-in-group") == "1"
    assert flag(pre.argv, "--offload-prefetch-step") == "1"
    assert "--cpu-offload-gb" not in pre.argv and "--offload-backend" not in dec.argv
