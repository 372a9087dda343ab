"""Memory per rank: what a rank holds."""

import pytest

from simulator.cost.memory import rank_memory
from simulator.specs.deployment import RoleSpec, Speculative
from simulator.specs.hardware import load_hardware
from simulator.specs.model import load_model

R1 = load_model("deepseek-r1")
H200 = load_hardware("h200")


def test_a_rank_without_speculative_decoding_holds_no_mtp_layer():
    plain = rank_memory(R1, H200, RoleSpec(dep=16), "fp8", "fp8")
    spec = rank_memory(R1, H200, RoleSpec(dep=16, speculative=Speculative(tokens=1)), "fp8",
                       "fp8")
    mtp = R1.weight_bytes("fp8")["mtp"]
    extra = spec.weights - plain.weights
    # the MTP layer's routed experts are spread over the 16 EP ranks, the rest is replicated
    experts = mtp * R1.n_routed_experts * R1.expert_params() / R1.params()["mtp"]
    assert extra == pytest.approx(mtp - experts + experts / 16)
    assert 0 < extra < mtp


def test_weights_offloaded_to_the_host_fit_a_layout_and_cost_their_reads():
    from simulator.calibration import load_calibration
    from simulator.cost.memory import check_memory
    from simulator.cost.step import Batch, Instance, step_time
    from simulator.specs.errors import SpecError
    gb300 = load_hardware("gb300")
    role = RoleSpec(dep=4)
    with pytest.raises(SpecError, match="does not fit DEP4 on gb300") as e:
        check_memory("decode", R1, gb300, role, "bf16", "fp8")
    assert "0.0 GB more offloaded to the host" in str(e.value)
    offloaded = RoleSpec(dep=4, cpu_offload_gb=200)
    mem = check_memory("decode", R1, gb300, offloaded, "bf16", "fp8")
    assert mem.offloaded == pytest.approx(200 * 1024 ** 3)
    with pytest.raises(SpecError, match="cpu_offload_gb=300 plus host_cache_gb=0 GiB exceed "
                                        "the 240 GB of host memory"):
        check_memory("decode", R1, gb300, RoleSpec(dep=4, cpu_offload_gb=300), "bf16", "fp8")
    cal = load_calibration(gb300, "vllm")
    base = Instance(model=R1, hardware=gb300, role="decode", ranks=4, expert_parallel=True)
    off = Instance(model=R1, hardware=gb300, role="decode", ranks=4, expert_parallel=True,
                   offload_bytes=200 * 1024 ** 3)
    extra = (step_time(off, Batch.decode(4, 8, 1024), cal).total_ms
             - step_time(base, Batch.decode(4, 8, 1024), cal).total_ms)
    assert extra == pytest.approx(200 * 1024 ** 3 / 450e9 * 1e3)  # over NVLink-C2C


def test_prefetch_offloading_moves_whole_layers_and_hides_their_copies_under_compute():
    """DeepSeek-R1 with fp4 experts on two GB200s (the layout of vLLM's GB200 wide-EP report's
    prefill instances): it fits only with weights in host memory. Prefetching moves whole
    decoder layers, one of every `group`, and copies each one layer ahead: a long prefill step
    hides the copies, a decode step does not."""
    from simulator.calibration import load_calibration
    from simulator.cost.memory import check_memory, prefetch_plan
    from simulator.cost.step import Batch, instance_from_role, step_time
    from simulator.specs.errors import SpecError
    gb200 = load_hardware("gb200")
    with pytest.raises(SpecError, match="does not fit DEP2 on gb200"):
        check_memory("prefill", R1, gb200, RoleSpec(dep=2), "fp4", "fp8")
    role = RoleSpec(dep=2, cpu_offload_gb=32, offload_backend="prefetch")
    plan = prefetch_plan(R1, role, "fp4")
    assert plan is not None and plan.layers == R1.layers // plan.group
    assert plan.layers * plan.layer_bytes >= 32 * 1024 ** 3  # whole layers, at least as asked
    mem = check_memory("prefill", R1, gb200, role, "fp4", "fp8")
    assert mem.offloaded == pytest.approx((plan.layers - 1) * plan.layer_bytes)  # one in flight
    cal = load_calibration(gb200, "vllm")
    copy_ms = plan.layer_bytes / 450e9 * 1e3  # over NVLink-C2C
    for name, batch, hidden in (("prefill", Batch.prefill(2, 16384, 8, 0), True),
                                ("decode", Batch.decode(2, 64, 2048), False)):
        st = step_time(instance_from_role(R1, gb200, name, role, "fp4", "fp8"), batch, cal)
        # the layer before an offloaded one computes while it copies (the step's GPU work
        # over its layers; the fixed per-step overhead is the host's)
        under = (st.total_ms - st.parts["weight_prefetch"] - st.parts["overhead"]) / R1.layers
        assert (st.parts["weight_prefetch"] == 0) == hidden
        assert st.parts["weight_prefetch"] == pytest.approx(
            plan.layers * max(copy_ms - under, 0), rel=1e-9)
    with pytest.raises(ValueError, match="offload_backend='prefetch' moves cpu_offload_gb"):
        RoleSpec(dep=2, offload_backend="prefetch")


def test_each_engine_gives_the_kv_pool_what_its_memory_fraction_leaves():
    """vLLM's gpu_memory_utilization is a fraction of the whole HBM for everything; SGLang's
    mem_fraction_static one for the weights and the KV pool only (activations and buffers
    outside it); TensorRT-LLM's free_gpu_memory_fraction a fraction of what the loaded model
    leaves. DeepSeek-R1 fp8 on four B200 (TP4): 168 GB of weights a rank leave vLLM about
    1 GB of KV at 0.9, SGLang about 6 GB, and TensorRT-LLM about 18 GB, the layout its own
    runs serve 8 x 8K prompts with."""
    from simulator.specs.errors import SpecError

    b200 = load_hardware("b200")
    role = RoleSpec(tp=4, max_num_batched_tokens=8320)
    vllm = rank_memory(R1, b200, role, "fp8", "fp8")
    trt = rank_memory(R1, b200, role, "fp8", "fp8", engine="trtllm")
    taken = vllm.weights + vllm.activations + vllm.reserve
    assert trt.weights == vllm.weights and trt.kv_bytes_per_token == vllm.kv_bytes_per_token
    assert vllm.kv_pool == pytest.approx(0.9 * b200.hbm_bytes - taken)
    assert trt.kv_pool == pytest.approx(0.9 * (b200.hbm_bytes - taken))
    assert vllm.kv_tokens < 8 * 8192 < trt.kv_tokens
    sglang = rank_memory(R1, b200, role, "fp8", "fp8", engine="sglang")
    assert sglang.kv_pool == pytest.approx(0.9 * b200.hbm_bytes - vllm.weights)
    assert vllm.kv_pool < sglang.kv_pool < trt.kv_pool
    whole = rank_memory(R1, b200, RoleSpec(tp=4, max_num_batched_tokens=8320,
                                           gpu_memory_utilization=0.99),
                        "fp8", "fp8", engine="sglang")
    assert whole.budget == b200.hbm_bytes  # what the static part leaves is too little
    with pytest.raises(SpecError, match="engine='tgi' has no memory rule; known: vllm"):
        rank_memory(R1, b200, role, "fp8", "fp8", engine="tgi")


def test_a_rank_holds_its_share_of_each_kinds_cache_the_kinds_own_way():
    """Qwen3.5's full-attention layers split their cache over its 2 KV heads, its Gated
    DeltaNet layers their recurrent state over 16 key heads: on TP4 a rank keeps half of a
    request's attention KV and a quarter of its state. A request's pool tokens on a rank are
    that share over the rank's per-token bytes (the whole-model ratio would count the state
    twice over); with one way (TP1, or a model whose every kind splits alike) it is unchanged."""
    from simulator.cost.memory import kv_split
    from tests.simulator.test_model import load_shipped

    m = load_shipped("Qwen--Qwen3.5-397B-A17B_config.json")
    (gqa, full), (gdn, linear) = m.kinds()
    assert (gqa.name, gdn.name) == ("gqa", "linear")
    tp4 = RoleSpec(tp=4)
    assert kv_split(m, tp4, "fp8") == 4 and gqa.kv_split(m, 4) == 2 and gdn.kv_split(m, 4) == 4
    context = 9216.0
    per_rank_token = gqa.kv_token_bytes(m, "fp8") * full / 2
    share = (gqa.kv_bytes(m, context, "fp8") * full / 2 + gdn.state_bytes(m) * linear / 4)
    cost = m.kv_token_cost("fp8", split=4)(context)
    assert cost == pytest.approx(share / per_rank_token)
    whole = m.kv_token_cost("fp8")(context)
    assert whole == pytest.approx((gqa.kv_bytes(m, context, "fp8") * full
                                   + gdn.state_bytes(m) * linear) / (per_rank_token * 2))
    assert cost < whole  # the state is a smaller share of a rank than of the model
    assert R1.kv_token_cost("fp8", split=8) is float  # MLA: every token alike, one way


def test_int4_weights_are_4_bit_experts_beside_bf16_layers():
    # Kimi-K2.5's native checkpoint: INT4 routed experts with a bf16 scale per 32, the rest bf16
    params, got = R1.params(), R1.weight_bytes("int4")
    assert got["routed_experts"] == pytest.approx(params["routed_experts"] * (0.5 + 2 / 32))
    assert got["attention"] == pytest.approx(params["attention"] * 2.0)
    assert got["shared_experts"] == pytest.approx(params["shared_experts"] * 2.0)
    assert R1.weight_bytes("fp4")["attention"] == pytest.approx(params["attention"] * 1.0)
