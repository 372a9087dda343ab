"""A fused-MoE Triton kernel: token assignments sorted by expert, then two grouped GEMMs.

1. `align_by_expert` sorts the (token, k) assignments by expert and pads each expert's run to a
   multiple of the block height, so every block of rows belongs to one expert (blocks of experts
   another EP rank holds, and padding blocks, are marked -1 and skipped).
2. `_gate_up_kernel`: per block, x[token] @ [gate; up]^T of its expert, SiLU(gate) * up.
3. `_down_kernel`: per block, that @ down^T of its expert, times the routing weight.
4. The top-k partial outputs of each token are summed.

On a CPU the kernels run only under TRITON_INTERPRET=1 (for correctness tests). Triton's
interpreter gets bf16 `tl.dot` wrong (triton 3.9: results off by orders of magnitude), so under
it the tiles are widened to fp32 before each dot (`DOT_FP32`); on a GPU bf16 tiles go to the
tensor cores as they are.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def interpreted() -> bool:
    """Triton kernels run in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _gate_up_kernel(x_ptr, w1_ptr, h_ptr, sorted_ptr, block_expert_ptr,
                    num_assign, topk, hidden, inter,
                    stride_x, stride_we, stride_wn, stride_h,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    DOT_FP32: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert >= 0:
        rows = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        valid = rows < num_assign
        token = rows // topk
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < inter
        w_base = w1_ptr + expert * stride_we
        acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, hidden, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < hidden
            a = tl.load(x_ptr + token[:, None] * stride_x + ks[None, :],
                        mask=valid[:, None] & k_ok[None, :], other=0.0)
            w_mask = k_ok[:, None] & col_ok[None, :]
            gate = tl.load(w_base + cols[None, :] * stride_wn + ks[:, None], mask=w_mask,
                           other=0.0)
            up = tl.load(w_base + (cols[None, :] + inter) * stride_wn + ks[:, None],
                         mask=w_mask, other=0.0)
            if DOT_FP32:
                a, gate, up = a.to(tl.float32), gate.to(tl.float32), up.to(tl.float32)
            acc_gate = tl.dot(a, gate, acc_gate)
            acc_up = tl.dot(a, up, acc_up)
        act = acc_gate * tl.sigmoid(acc_gate) * acc_up
        tl.store(h_ptr + rows[:, None] * stride_h + cols[None, :],
                 act.to(h_ptr.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])


@triton.jit
def _down_kernel(h_ptr, w2_ptr, out_ptr, sorted_ptr, block_expert_ptr, weight_ptr,
                 num_assign, hidden, inter,
                 stride_h, stride_we, stride_wn, stride_out,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 DOT_FP32: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert >= 0:
        rows = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        valid = rows < num_assign
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < hidden
        w_base = w2_ptr + expert * stride_we
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < inter
            a = tl.load(h_ptr + rows[:, None] * stride_h + ks[None, :],
                        mask=valid[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_base + cols[None, :] * stride_wn + ks[:, None],
                        mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            if DOT_FP32:
                a, w = a.to(tl.float32), w.to(tl.float32)
            acc = tl.dot(a, w, acc)
        weight = tl.load(weight_ptr + rows, mask=valid, other=0.0)
        acc = acc * weight[:, None]
        tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])


def align_by_expert(ids: torch.Tensor, local_experts: int, first_expert: int,
                    block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted assignment ids, expert of each block) for assignments `ids` [T, K].

    Assignment a = t * K + k. Each local expert's assignments are contiguous and padded to a
    multiple of `block_m` with the sentinel T * K; blocks past the last used one have expert -1.
    Sizes are upper bounds and nothing is indexed by a mask, so the device is never waited for.
    """
    n = ids.numel()
    dev = ids.device
    flat = ids.reshape(-1).to(torch.int64) - first_expert
    key = torch.where((flat >= 0) & (flat < local_experts), flat, local_experts)
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=local_experts + 1)
    padded = (counts[:local_experts] + block_m - 1) // block_m * block_m
    blocks = (n + block_m - 1) // block_m + local_experts
    # Where each expert's run starts in the padded layout; other ranks' assignments go to a
    # scratch tail past the last block.
    pad_start = torch.cat([torch.cumsum(padded, 0) - padded,
                           torch.full((1,), blocks * block_m, device=dev)])
    run_start = torch.cumsum(counts, 0) - counts
    e = key[order]
    pos = pad_start[e] + torch.arange(n, device=dev) - run_start[e]
    sorted_ids = torch.full((blocks * block_m + n,), n, dtype=torch.int32, device=dev)
    sorted_ids[pos] = order.to(torch.int32)
    block_start = torch.arange(blocks, device=dev) * block_m
    block_expert = torch.searchsorted(torch.cumsum(padded, 0), block_start, right=True)
    block_expert = torch.where(block_expert < local_experts, block_expert, -1)
    return sorted_ids[: blocks * block_m], block_expert.to(torch.int32)


def block_sizes(assignments: int, local_experts: int, inter: int,
                hidden: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps): short blocks when experts get few rows each; 8 warps
    for the tall blocks, whose two fp32 accumulators would not fit 4 warps' registers."""
    block_m = 16 if assignments <= 32 * local_experts else 64
    block_n = 64 if min(inter, hidden) <= 64 else 128
    return block_m, block_n, 64, 8 if block_m == 64 else 4


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor,
              weights: torch.Tensor, first_expert: int = 0) -> torch.Tensor:
    """Routed-expert output [T, H] for x [T, H]; w1 [E, 2I, H] (gate rows then up rows),
    w2 [E, H, I] are this rank's E experts, numbered from `first_expert`; ids / weights [T, K]."""
    tokens, hidden = x.shape
    local, inter = w1.shape[0], w2.shape[2]
    topk = ids.shape[1]
    n = tokens * topk
    bm, bn, bk, warps = block_sizes(n, local, inter, hidden)
    sorted_ids, block_expert = align_by_expert(ids, local, first_expert, bm)
    blocks = block_expert.numel()
    h = torch.empty(n, inter, dtype=x.dtype, device=x.device)
    out = torch.zeros(n, hidden, dtype=x.dtype, device=x.device)  # other ranks' rows stay 0
    w = weights.reshape(-1).to(torch.float32).contiguous()
    _gate_up_kernel[(blocks, triton.cdiv(inter, bn))](
        x, w1, h, sorted_ids, block_expert, n, topk, hidden, inter,
        x.stride(0), w1.stride(0), w1.stride(1), h.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, DOT_FP32=interpreted(), num_warps=warps)
    _down_kernel[(blocks, triton.cdiv(hidden, bn))](
        h, w2, out, sorted_ids, block_expert, w, n, hidden, inter,
        h.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, DOT_FP32=interpreted(), num_warps=warps)
    return out.view(tokens, topk, hidden).sum(dim=1, dtype=torch.float32).to(x.dtype)
