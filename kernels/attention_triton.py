"""A paged GQA decode-attention Triton kernel, split over the KV length (flash decoding).

Each program takes one request, one KV head (all the query heads that share it, padded to 16
rows for `tl.dot`) and one slice of the request's cached tokens. It walks them BLOCK_N at a
time, finding each token's page through the block table, with an online softmax, and writes an
unnormalised partial output with its running max and sum. `paged_decode` merges the slices
(log-sum-exp) in torch.

The KV cache is vLLM-shaped: [pages, page_size, kv_heads, head_dim], bf16 or fp8 (e4m3 on CUDA,
e5m2 on the CPU, with a per-tensor scale). Under TRITON_INTERPRET=1 tiles are widened to fp32
before each dot (see kernels/moe_triton.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.moe_triton import interpreted


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, acc_ptr, max_ptr, sum_ptr,
                   scale, kv_scale, tokens_per_split,
                   stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_tb,
                   stride_ab, stride_ah, stride_as,
                   GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                   DIM_PAD: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                   DOT_FP32: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM_PAD)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    heads = kvh * GROUP + g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    seq_len = tl.load(lens_ptr + b)
    first = split * tokens_per_split
    last = tl.minimum(first + tokens_per_split, seq_len)
    m_i = tl.full((GROUP_PAD,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((GROUP_PAD,), dtype=tl.float32)
    acc = tl.zeros((GROUP_PAD, DIM_PAD), dtype=tl.float32)
    for start in range(first, last, BLOCK_N):
        tok = start + tl.arange(0, BLOCK_N)
        ok = tok < last
        page = tl.load(table_ptr + b * stride_tb + tok // PAGE, mask=ok, other=0).to(tl.int64)
        offs = (page[:, None] * stride_kp + (tok % PAGE)[:, None] * stride_kt
                + kvh * stride_kh + d[None, :])
        kv_mask = ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + offs, mask=kv_mask, other=0.0).to(tl.float32) * kv_scale
        v = tl.load(v_ptr + offs, mask=kv_mask, other=0.0).to(tl.float32) * kv_scale
        if not DOT_FP32:
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        prob = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(prob, 1)
        acc = acc * alpha[:, None] + tl.dot(prob.to(v.dtype), v)
        m_i = m_new
    out = b * stride_ab + heads * stride_ah + split * stride_as
    tl.store(acc_ptr + out[:, None] * DIM_PAD + d[None, :], acc, mask=g_ok[:, None])
    tl.store(max_ptr + out, m_i, mask=g_ok)
    tl.store(sum_ptr + out, l_i, mask=g_ok)


BLOCK_N = 64
"""Cached tokens per inner step (several pages, gathered through the block table)."""


def splits_for(batch: int, kv_heads: int, tokens: int, programs: int = 264) -> int:
    """KV slices per (request, KV head): enough programs to fill a GPU, at least 4 inner steps
    each."""
    want = triton.cdiv(programs, batch * kv_heads)
    return max(1, min(want, triton.cdiv(tokens, 4 * BLOCK_N)))


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                 kv_scale: float = 1.0, splits: int | None = None) -> torch.Tensor:
    """Attention output [B, Hq, D] of one new token per request; q [B, Hq, D] (its key and
    value are already in the cache), seq_lens [B] counts cached tokens including it."""
    batch, heads, dim = q.shape
    page, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    max_tokens = block_table.shape[1] * page
    n = splits or splits_for(batch, kv_heads, max_tokens)
    per_split = triton.cdiv(triton.cdiv(max_tokens, n), BLOCK_N) * BLOCK_N
    dim_pad = max(16, triton.next_power_of_2(dim))
    acc = torch.empty(batch, heads, n, dim_pad, dtype=torch.float32, device=q.device)
    mx = torch.empty(batch, heads, n, dtype=torch.float32, device=q.device)
    sm = torch.empty_like(mx)
    _decode_kernel[(batch, kv_heads, n)](
        q, k_cache, v_cache, block_table, seq_lens, acc, mx, sm,
        scale, kv_scale, per_split,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_table.stride(0), mx.stride(0), mx.stride(1), mx.stride(2),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=dim,
        DIM_PAD=dim_pad, PAGE=page, BLOCK_N=BLOCK_N, DOT_FP32=interpreted())
    top = mx.amax(dim=2, keepdim=True)
    w = torch.exp(mx - top)  # slices with no page have max -inf: weight 0
    out = (acc[..., :dim] * w[..., None]).sum(2) / (sm * w).sum(2)[..., None]
    return out.to(q.dtype)
