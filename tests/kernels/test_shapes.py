"""Sweeps hold the shapes the cost model asks for (no torch needed)."""

from kernels.shapes import COMM_OPS, GRIDS, build_sweep
from simulator.specs.model import load_model


def test_tiny_moe_cpu_sweep_covers_its_step():
    m = load_model("tiny-moe")
    sweep = build_sweep(m, "cpu", quick=True, fp8=False)
    gemms = {(s.name, s.n, s.k) for s in sweep.shapes["gemm"]}
    heads, kvh, hd = m.num_attention_heads, m.num_kv_heads, m.head_dim
    assert gemms == {("qkv_proj", (heads + 2 * kvh) * hd, m.hidden),
                     ("o_proj", m.hidden, heads * hd), ("router", m.n_routed_experts, m.hidden),
                     ("lm_head", m.vocab, m.hidden)}
    assert {s.dtype for s in sweep.shapes["gemm"]} == {"bf16"}
    assert "gemm fp8" in sweep.skipped and "mla" in sweep.skipped
    moe = sweep.shapes["moe"]
    assert {(s.hidden, s.inter, s.topk, s.experts) for s in moe} == {
        (m.hidden, m.moe_intermediate, m.top_k, m.n_routed_experts)}
    attn = sweep.shapes["attention"]
    assert {s.phase for s in attn} == {"decode", "prefill"}
    assert {s.kv_dtype for s in attn} == {"bf16", "fp8"}
    assert {s.op for s in sweep.shapes["comm"]} == set(COMM_OPS)


def test_deepseek_cuda_sweep_has_mla_fp8_gemm_and_ep_splits():
    m = load_model("deepseek-v3")
    sweep = build_sweep(m, "cuda", quick=False, fp8=True, comm_ranks=1)
    assert "attention" not in sweep.shapes and "mla" in sweep.shapes
    assert {s.dtype for s in sweep.shapes["gemm"] if s.name == "dense_up"} == {"bf16", "fp8"}
    assert {s.dtype for s in sweep.shapes["gemm"] if s.name == "lm_head"} == {"bf16"}
    assert {s.ep for s in sweep.shapes["moe"]} == set(GRIDS[("cuda", False)].ep)
    assert {s.heads for s in sweep.shapes["mla"]} == {m.num_attention_heads}
    assert "comm" in sweep.skipped and "comm" not in sweep.shapes


def test_only_limits_the_families_and_shapes_are_unique():
    m = load_model("tiny-moe")
    sweep = build_sweep(m, "cpu", quick=False, fp8=False, ops=("gemm",))
    assert list(sweep.shapes) == ["gemm"]
    keys = [(s.m, s.n, s.k, s.dtype) for s in sweep.shapes["gemm"]]
    assert len(keys) == len(set(keys))
    assert {s.n for s in sweep.shapes["gemm"] if s.name == "lm_head"} == {m.vocab, m.vocab // 2}


def test_moe_splits_too_big_for_the_memory_are_left_out_and_said_so():
    m = load_model("deepseek-v3")
    sweep = build_sweep(m, "cpu", quick=False, fp8=False, ops=("moe",),
                        memory_bytes=24 * 10**9)
    eps = {s.ep for s in sweep.shapes["moe"]}
    assert 1 not in eps and 8 in eps  # 22.5 GB of experts at ep=1; 2.8 GB at ep=8
    assert {(s.ep, s.tp) for s in sweep.shapes["moe"]} == {(4, 1), (8, 1)}
    assert "exceed a third of the cpu's 24 GB" in sweep.skipped["moe ep1, ep2, tp2"]
