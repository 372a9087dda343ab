"""The step-cost model: pure, monotone, and honest about what it sums."""

from typing import Any

import numpy as np
import pytest

from simulator.calibration import load_calibration
from simulator.cost import CATEGORIES, Batch, Instance, check_memory, step_time
from simulator.specs.deployment import RoleSpec
from simulator.specs.errors import SpecError
from simulator.specs.hardware import load_hardware
from simulator.specs.model import load_model

H200 = load_hardware("h200")
DSV3 = load_model("deepseek-v3")


@pytest.fixture(scope="module")
def cal():
    return load_calibration(H200, "vllm")


def decode_instance(**kw) -> Instance:
    return Instance(DSV3, H200, "decode", 8, True, **kw)


def test_breakdown_sums_to_total(cal):
    st = step_time(decode_instance(), Batch.decode(8, 64, 2048), cal)
    assert set(st.breakdown) == set(CATEGORIES)
    assert sum(st.breakdown.values()) == pytest.approx(st.total_ms)
    assert st.total_ms > 0 and np.isfinite(st.total_ms)


def test_decode_step_grows_with_batch_and_context(cal):
    inst = decode_instance()
    by_batch = [step_time(inst, Batch.decode(8, b, 4096), cal).total_ms for b in (1, 16, 64, 256)]
    by_ctx = [step_time(inst, Batch.decode(8, 64, c), cal).total_ms for c in (512, 4096, 32768)]
    assert by_batch == sorted(by_batch) and by_batch[0] < by_batch[-1]
    assert by_ctx == sorted(by_ctx) and by_ctx[0] < by_ctx[-1]


def test_prefill_step_grows_with_tokens(cal):
    inst = Instance(DSV3, H200, "prefill", 8, True, all2all="deepep_high_throughput")
    times = [step_time(inst, Batch.prefill(8, t), cal).total_ms for t in (1024, 4096, 16384)]
    assert times == sorted(times) and times[0] < times[-1]


def test_one_long_request_slows_the_whole_lockstep(cal):
    inst = decode_instance()
    even = Batch.decode(8, 64, 2048)
    ctx = np.full(8, 2048.0)
    ctx[3] = 65536.0
    skewed = Batch(np.full(8, 64.0), ctx, np.zeros(8), np.zeros(8), np.zeros(8))
    assert step_time(inst, skewed, cal).breakdown["attention"] > step_time(
        inst, even, cal).breakdown["attention"]


def test_most_loaded_expert_rank_sets_the_moe_time(cal):
    inst = decode_instance()
    per_rank = 64 * 8 * 8 / 8  # tokens x top_k spread over 8 EP ranks
    balanced = Batch.decode(8, 64, 2048)
    hot = np.full(8, per_rank)
    hot[0] *= 2.0
    skewed = Batch(balanced.decode_requests, balanced.decode_context, np.zeros(8), np.zeros(8),
                   np.zeros(8), expert_tokens=hot)
    assert step_time(inst, skewed, cal).breakdown["moe"] > step_time(
        inst, balanced, cal).breakdown["moe"]


def test_mtp_yields_more_tokens_per_step_at_a_cost(cal):
    plain = step_time(decode_instance(), Batch.decode(8, 64, 2048), cal)
    mtp = step_time(decode_instance(spec_tokens=1, spec_acceptance=0.8),
                    Batch.decode(8, 64, 2048), cal)
    assert mtp.tokens == pytest.approx(plain.tokens * 1.8)
    assert mtp.total_ms > plain.total_ms
    assert "mtp_draft" in mtp.provenance


def test_every_part_names_its_source(cal):
    st = step_time(decode_instance(), Batch.decode(8, 128, 4096), cal)
    for op, src in st.provenance.items():
        assert src.split(" ")[0] in ("measured", "interpolated", "extrapolated", "roofline"), op
    assert st.provenance["routed_experts"].startswith("measured")


def test_tp_layout_prices_gqa_model(cal):
    inst = Instance(load_model("qwen3-235b-a22b"), H200, "aggregated", 4, False)
    st = step_time(inst, Batch.decode(1, 64, 2000), cal)
    assert st.breakdown["communication"] > 0  # TP all-reduces
    assert sum(st.breakdown.values()) == pytest.approx(st.total_ms)


def test_memory_fit_reports_the_numbers():
    role = RoleSpec(dep=4)
    with pytest.raises(SpecError, match=r"GB weights .* tokens are needed") as e:
        check_memory("decode", DSV3, H200, role, "fp8", "fp8")
    assert "\n" not in str(e.value)
    fits = check_memory("decode", DSV3, H200, RoleSpec(dep=8), "fp8", "fp8")
    assert fits.kv_tokens > 8192


def test_redundant_experts_cost_kv_capacity():
    plain = check_memory("decode", DSV3, H200, RoleSpec(dep=8), "fp8", "fp8")
    extra = check_memory("decode", DSV3, H200, RoleSpec(dep=8, redundant_experts=32), "fp8", "fp8")
    assert extra.redundant_experts > 0
    assert extra.kv_tokens < plain.kv_tokens


def test_tp_with_expert_parallel_moe(cal):
    role = RoleSpec(tp=8, enable_expert_parallel=True, redundant_experts=32)
    assert role.layout == "TP8+EP" and role.expert_parallel
    inst = Instance(DSV3, H200, "aggregated", 8, False, tp_expert_parallel=True)
    assert (inst.tp, inst.ep, inst.moe_tp) == (8, 8, 1)
    st = step_time(inst, Batch.decode(1, 64, 2048), cal)
    # a TP group holds every token already: no dispatch, the combine is the TP all-reduce
    assert "all_to_all.dispatch" not in st.provenance and "allreduce" in st.provenance
    tp_only = Instance(DSV3, H200, "aggregated", 8, False)
    assert (tp_only.ep, tp_only.moe_tp) == (1, 8)
    mem_ep = check_memory("a", DSV3, H200, role, "fp8", "fp8")
    assert mem_ep.redundant_experts > 0


def test_token_exchange_follows_the_all2all_backend(cal):
    batch = Batch.decode(8, 64, 2048)
    deepep = step_time(decode_instance(), batch, cal)
    nccl = step_time(decode_instance(all2all="allgather_reducescatter"), batch, cal)
    assert deepep.provenance["all_to_all.dispatch"] != nccl.provenance["all_to_all.dispatch"]
    assert "nccl" in nccl.provenance["all_to_all.dispatch"]
    assert nccl.breakdown["communication"] > 0


def test_nvlink_one_sided_exchange_is_priced_from_its_measured_kernel():
    """vLLM's flashinfer_nvlink_one_sided on GB200: TensorRT-LLM's measurement of the same
    NVLink one-sided kernel, NVFP4 payload for fp4 experts (as measured); an fp8 payload is a
    dtype transfer on its own bytes; experts see only the tokens routed to the rank."""
    m, hw = load_model("deepseek-r1"), load_hardware("gb200")
    cal = load_calibration(hw, "vllm")

    def prefill(weights: str, all2all: str) -> Any:
        inst = Instance(m, hw, "prefill", 4, True, weights=weights, all2all=all2all)
        return step_time(inst, Batch.prefill(4, 8192), cal)

    one = prefill("fp4", "flashinfer_nvlink_one_sided")
    src = one.provenance["all_to_all.dispatch"]
    assert "gb200/comm/trtllm" in src and not src.startswith("extrapolated")
    deepep = prefill("fp4", "deepep_high_throughput")
    assert one.breakdown["communication"] < deepep.breakdown["communication"]
    fp8 = prefill("fp8", "flashinfer_nvlink_one_sided")
    assert fp8.provenance["all_to_all.dispatch"].startswith("extrapolated")
    assert fp8.parts["all_to_all.dispatch"] > one.parts["all_to_all.dispatch"]  # ~1.8x bytes
    assert fp8.parts["all_to_all.combine"] == pytest.approx(one.parts["all_to_all.combine"])
    gathered = prefill("fp4", "allgather_reducescatter")
    assert one.parts["routed_experts"] == pytest.approx(gathered.parts["routed_experts"])
    h200 = load_calibration(load_hardware("h200"), "vllm")
    off = step_time(Instance(m, load_hardware("h200"), "prefill", 8, True,
                             all2all="flashinfer_nvlink_one_sided"), Batch.prefill(8, 8192), h200)
    assert off.provenance["all_to_all.dispatch"].startswith("roofline")


def test_wide_ep_prices_experts_from_the_deepep_table(cal):
    batch = Batch.decode(8, 128, 4096)
    wide = step_time(decode_instance(), batch, cal)
    gathered = step_time(decode_instance(all2all="allgather_reducescatter"), batch, cal)
    assert "/moe/sglang/" in wide.provenance["routed_experts"]  # DeepEP grouped GEMMs
    assert "/moe/vllm/" in gathered.provenance["routed_experts"]  # every token on every rank
    assert wide.parts["routed_experts"] < gathered.parts["routed_experts"]


@pytest.mark.parametrize("batch", [Batch.decode(32, 128, 4096), Batch.decode(32, 8, 4096),
                                   Batch.prefill(32, 8192), Batch.prefill(32, 600)],
                         ids=["decode", "small-decode", "prefill", "small-prefill"])
def test_overlap_is_bounded_by_the_max_and_the_sum_of_compute_and_exchange(batch):
    from dataclasses import replace

    from simulator.specs.topology import all_to_all_rate
    m, hw = load_model("deepseek-v3"), load_hardware("h100")
    cal = load_calibration(hw, "vllm")
    role = "prefill" if batch.prefill_tokens.sum() else "decode"
    base = Instance(model=m, hardware=hw, role=role, ranks=32, expert_parallel=True,
                    a2a_gb_s=float(all_to_all_rate(32, 8, hw.scaleup_gb_s, hw.nic_gb_s)),
                    all2all="deepep_high_throughput" if role == "prefill" else
                    "deepep_low_latency")
    plain = step_time(base, batch, cal)
    dbo = step_time(replace(base, dbo=True), batch, cal)
    over = base.step_overhead_ms
    m_ = plain.breakdown["communication"]
    c = plain.total_ms - m_ - over
    assert max(c, m_) + over - 1e-9 <= dbo.total_ms <= plain.total_ms + 1e-9
    assert sum(dbo.breakdown.values()) == pytest.approx(dbo.total_ms)
    assert sum(dbo.parts.values()) == pytest.approx(dbo.total_ms)
    small = float((batch.decode_requests + batch.prefill_tokens).max()) <= (
        512 if role == "prefill" else 32)
    assert (dbo.total_ms == plain.total_ms) == small or dbo.total_ms == plain.total_ms


def test_each_exchange_hides_under_one_compute_stage_of_the_other_micro_batch():
    from simulator.cost.step import StepTime, _overlapped
    # one micro-batch over 2 MoE layers: attention 6 ms (gate 1 ms among it), experts 4 ms of
    # which 2 shared, dispatch 2, combine 6
    half = StepTime(18.0, {"attention": 5.0, "moe": 5.0, "communication": 8.0}, {},
                    {"router": 1.0, "shared_experts": 2.0, "routed_experts": 2.0,
                     "all_to_all.dispatch": 2.0, "all_to_all.combine": 6.0}, 1.0)
    # a layer: (dispatch 1 | attention 3) + (1 | routed 1) + (combine 3 | shared 1 + routed 1)
    # + (3 | shared 1 + attention 3) = 3 + 1 + 3 + 4 = 11
    assert _overlapped(half, 10.0, 2, 0.0) == pytest.approx(22.0)
    # the whole exchange (8) under the whole compute (10) would have hidden to 2 x 10 = 20
    # holding half the SMs, each slot's compute runs half its exchange longer:
    # max(1, 3.5) + max(1, 1.5) + max(3, 3.5) + max(3, 5.5) = 14 a layer
    assert _overlapped(half, 10.0, 2, 0.5) == pytest.approx(28.0)


@pytest.mark.parametrize(("all2all", "holds"), [("deepep_high_throughput", True),
                                                ("deepep_low_latency", False),
                                                ("allgather_reducescatter", False)])
def test_deepep_normal_kernels_take_their_sms_from_the_compute_they_overlap(
        monkeypatch, all2all, holds):
    from dataclasses import replace

    from simulator.cost import step as step_mod
    from simulator.specs.topology import all_to_all_rate
    m, hw = load_model("deepseek-v3"), load_hardware("h100")
    cal = load_calibration(hw, "sglang")
    inst = Instance(model=m, hardware=hw, role="prefill", ranks=32, expert_parallel=True,
                    a2a_gb_s=float(all_to_all_rate(32, 8, hw.scaleup_gb_s, hw.nic_gb_s)),
                    all2all=all2all, dbo=True)
    batch = Batch.prefill(32, 8192)
    assert step_mod.exchange_sm_share(inst) == (pytest.approx(20 / 132) if holds else 0.0)
    got = step_time(inst, batch, cal)
    with monkeypatch.context() as mp:
        mp.setattr(step_mod, "DEEPEP_NORMAL_SMS", 0)
        free = step_time(inst, batch, cal)
    plain = step_time(replace(inst, dbo=False), batch, cal)
    if not holds:
        assert got.total_ms == free.total_ms
        return
    exchange = plain.breakdown["communication"]
    assert free.total_ms < got.total_ms <= free.total_ms + 20 / 132 * exchange
    assert got.total_ms <= plain.total_ms  # never slower than not overlapping
    assert "holds 15% of the SMs" in got.provenance["dbo"]


def test_attention_dp_over_tp_groups_splits_heads_weights_and_kv():
    from simulator.cost.memory import rank_memory
    m, hw = load_model("deepseek-v3"), load_hardware("h200")
    cal = load_calibration(hw, "vllm")
    dep16 = Instance(model=m, hardware=hw, role="decode", ranks=16, expert_parallel=True)
    dxt = Instance(model=m, hardware=hw, role="decode", ranks=16, expert_parallel=True,
                   attn_tp=4)
    assert (dxt.dp, dxt.tp, dxt.ep) == (4, 4, 16)
    a = step_time(dep16, Batch.decode(16, 32, 4096), cal)
    b = step_time(dxt, Batch.decode(4, 128, 4096), cal)  # the same 512 requests
    assert "allreduce" in b.parts and "allreduce" not in a.parts
    assert b.parts["attention.mla.decode.module"] < 4 * a.parts["attention.mla.decode.module"]
    held = rank_memory(m, hw, RoleSpec(dep=4, tp=4), "fp8", "fp8").weights
    full = rank_memory(m, hw, RoleSpec(dep=16), "fp8", "fp8").weights
    assert held < full  # attention and shared weights split inside the TP group


def _serial(monkeypatch, inst, batch, cal):
    """The step priced with the shared experts after the routed ones, on one stream."""
    from simulator.cost import step as step_mod
    with monkeypatch.context() as mp:
        mp.setattr(step_mod, "SHARED_EXPERT_STREAMS", {})
        return step_time(inst, batch, cal)


@pytest.mark.parametrize(("engine", "batch", "beside"), [
    ("vllm", Batch.decode(1, 64, 2048), True),
    ("vllm", Batch.prefill(1, 1024), False),  # over vLLM's 256 tokens
    ("sglang", Batch.prefill(1, 1024), True),  # within SGLang's 1,024
    ("trtllm", Batch.decode(1, 64, 2048), True),
    ("trtllm", Batch.prefill(1, 128), False),  # streams only in CUDA-graph decode steps
], ids=["vllm-decode", "vllm-prefill", "sglang-prefill", "trtllm-decode", "trtllm-prefill"])
def test_shared_experts_run_beside_the_routed_experts_where_the_engine_does(
        monkeypatch, engine, batch, beside):
    cal = load_calibration(H200, engine)
    inst = Instance(DSV3, H200, "aggregated", 8, False)
    got, serial = step_time(inst, batch, cal), _serial(monkeypatch, inst, batch, cal)
    shared = serial.parts["shared_experts"]
    routed = serial.parts["router"] + serial.parts["routed_experts"]
    assert shared > 0 and routed > 0
    if not beside:
        assert got.total_ms == serial.total_ms
        assert "second stream" not in got.provenance["shared_experts"]
        return
    # the shorter stream hides under the longer: never faster than the longer, never slower
    assert got.total_ms == pytest.approx(serial.total_ms - min(shared, routed))
    assert got.total_ms - got.parts["shared_experts"] >= serial.total_ms - shared - 1e-9
    assert sum(got.parts.values()) == pytest.approx(got.total_ms)
    assert sum(got.breakdown.values()) == pytest.approx(got.total_ms)
    assert "second stream" in got.provenance["shared_experts"]


def test_shared_experts_stay_on_one_stream_on_the_cpu():
    from simulator.cost.step import shared_stream
    inst = Instance(DSV3, load_hardware("cpu"), "aggregated", 1, False)
    assert not shared_stream(inst, "vllm", 8, True)


def test_minimax_query_key_norm_all_reduces_its_variances_across_tp_ranks():
    from simulator.validate import model_source
    mm = load_model(model_source("MiniMaxAI/MiniMax-M2.5"))
    assert mm.qk_norm_across_heads
    assert not load_model(model_source("Qwen/Qwen3-235B-A22B-FP8")).qk_norm_across_heads
    hw = load_hardware("b200")
    cal = load_calibration(hw, "vllm")
    batch = Batch.decode(1, 8, 2048)
    tp4 = step_time(Instance(mm, hw, "aggregated", 4, False), batch, cal)
    tp1 = step_time(Instance(mm, hw, "aggregated", 1, False), batch, cal)
    assert tp4.parts["qk_norm_allreduce"] > 0 and "/comm/" in tp4.provenance["qk_norm_allreduce"]
    assert "qk_norm_allreduce" not in tp1.parts  # one rank holds every head
    assert sum(tp4.parts.values()) == pytest.approx(tp4.total_ms)


@pytest.mark.parametrize(("engine", "redundant", "beside"), [
    ("vllm", 0, True), ("vllm", 32, False), ("sglang", 0, False), ("trtllm", 32, True)])
def test_shared_experts_beside_a_deepep_exchange_follow_each_engine(engine, redundant, beside):
    from simulator.cost.step import shared_stream
    inst = Instance(DSV3, H200, "decode", 8, True, redundant_experts=redundant,
                    all2all="deepep_low_latency")
    assert shared_stream(inst, engine, 64, True) is beside
    # an all-gather exchange keeps every engine's rule
    gathered = Instance(DSV3, H200, "decode", 8, True, redundant_experts=redundant,
                        all2all="allgather_reducescatter")
    assert shared_stream(gathered, engine, 64, True)


def test_routed_experts_read_the_experts_a_random_gate_touches_not_a_balanced_table_s():
    """The MoE tables route balanced: 32 gpt-oss tokens (128 experts, top 4) give every expert
    one token. A gate's random routing leaves 1 - exp(-1) of them a token: the step reads the
    table where a balanced group touches as many experts, and a prefill-sized group keeps the
    table's own price."""
    from simulator.cost.step import routed_at_random
    oss = load_calibration(H200, "vllm")

    def table(group: float):
        return oss.moe(group, 2880, 2880, 4, 128, 1, "fp4")

    saturation = 128 / 4
    decode = routed_at_random(table, 32.0, saturation)
    touched = saturation * (1 - np.exp(-1.0))
    assert decode.ms[0] == pytest.approx(table(touched).ms[0])
    assert decode.ms[0] < 0.75 * table(32.0).ms[0]
    past = routed_at_random(table, 64.0, saturation)  # the tokens past saturation still count
    assert past.ms[0] == pytest.approx(table(64.0).ms[0] - table(32.0).ms[0]
                                       + table(saturation * (1 - np.exp(-2.0))).ms[0])
    assert routed_at_random(table, 8192.0, saturation).ms[0] == table(8192.0).ms[0]
    # priced tokens only grow the price
    prices = [routed_at_random(table, g, saturation).ms[0] for g in (1, 4, 16, 32, 64, 512)]
    assert prices == sorted(prices)
    roof = load_calibration(load_hardware("cpu"), "vllm")
    cpu = routed_at_random(lambda g: roof.moe(g, 2880, 2880, 4, 128, 1, "fp4"), 32.0, saturation)
    assert cpu.ms[0] == roof.moe(32.0, 2880, 2880, 4, 128, 1, "fp4").ms[0]
