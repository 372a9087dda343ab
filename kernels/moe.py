"""Routed experts of one MoE layer on one rank: a torch reference, a torch grouped
implementation (timed on the CPU) and our Triton fused-MoE kernel (timed on CUDA).

Routing is balanced and deterministic: token t's k-th expert is (t * topk + k) % experts, with
seeded softmax weights. With expert parallelism the rank holds experts [0, experts / ep) and
computes only the assignments that land there, as an EP rank does.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from kernels.checks import assert_close, generator, randn
from kernels.device import Device
from kernels.shapes import MoeShape
from kernels.timing import Timer


def balanced_routing(tokens: int, topk: int, experts: int,
                     gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [T, K] int64, routing weights [T, K] fp32); every expert gets T*K/E +- 1."""
    dev = gen.device
    t = torch.arange(tokens, device=dev)[:, None]
    ids = (t * topk + torch.arange(topk, device=dev)[None, :]) % experts
    weights = torch.softmax(randn((tokens, topk), gen, torch.float32), dim=-1)
    return ids, weights


def moe_reference(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor,
                  weights: torch.Tensor, first_expert: int = 0) -> torch.Tensor:
    """fp32, per assignment: sum_k w_k * down_e(SiLU(gate_e x) * up_e x) over local experts."""
    local, inter = w1.shape[0], w2.shape[2]
    e = ids - first_expert
    mine = (e >= 0) & (e < local)
    e = e.clamp(0, local - 1)
    h = torch.einsum("tkoh,th->tko", w1[e].float(), x.float())
    act = F.silu(h[..., :inter]) * h[..., inter:]
    y = torch.einsum("tkhi,tki->tkh", w2[e].float(), act)
    return (y * (weights * mine)[..., None]).sum(dim=1)


def moe_torch(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor,
              weights: torch.Tensor, first_expert: int = 0) -> torch.Tensor:
    """Grouped in torch: sort assignments by expert, two matmuls per expert that has rows,
    weight, scatter-add back to tokens."""
    tokens, hidden = x.shape
    local, inter = w1.shape[0], w2.shape[2]
    topk = ids.shape[1]
    flat = ids.reshape(-1) - first_expert
    key = torch.where((flat >= 0) & (flat < local), flat, local)
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=local + 1).tolist()
    mine = order[: sum(counts[:local])]
    token = mine // topk
    xs = x[token]
    ys = torch.empty(len(mine), hidden, dtype=x.dtype, device=x.device)
    start = 0
    for e, c in enumerate(counts[:local]):
        if c:
            h = xs[start:start + c] @ w1[e].t()
            ys[start:start + c] = (F.silu(h[:, :inter]) * h[:, inter:]) @ w2[e].t()
            start += c
    ys = ys * weights.reshape(-1)[mine, None].to(x.dtype)
    out = torch.zeros(tokens, hidden, dtype=torch.float32, device=x.device)
    out.index_add_(0, token, ys.float())
    return out.to(x.dtype)


def triton_usable(dev: Device) -> bool:
    """Triton is installed, and kernels run on CUDA, or on the CPU under TRITON_INTERPRET=1."""
    if importlib.util.find_spec("triton") is None:
        return False
    return dev.kind == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _layer(s: MoeShape, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    local, inter = s.experts // s.ep, s.inter // s.tp
    x = randn((s.tokens, s.hidden), gen, torch.bfloat16)
    w1 = randn((local, 2 * inter, s.hidden), gen, torch.bfloat16, s.hidden ** -0.5)
    w2 = randn((local, s.hidden, inter), gen, torch.bfloat16, inter ** -0.5)
    ids, weights = balanced_routing(s.tokens, s.topk, s.experts, gen)
    return x, w1, w2, ids, weights


CHECK_SHAPES = (MoeShape(37, 128, 96, 2, 8, 1, 1), MoeShape(24, 64, 64, 3, 8, 2, 1))
"""Small, odd shapes: partial blocks, an intermediate size that is not a block multiple, and an
EP rank holding half the experts."""


def check(dev: Device, triton: bool | None = None) -> None:
    """The torch implementation (and the Triton kernel where it can run) against the fp32
    reference; KernelMismatch if either is off."""
    use_triton = triton_usable(dev) if triton is None else triton
    gen = generator(dev.torch, 0)
    for s in CHECK_SHAPES:
        x, w1, w2, ids, weights = _layer(s, gen)
        want = moe_reference(x, w1, w2, ids, weights)
        tag = f"moe {s.tokens}x{s.hidden} inter {s.inter} top{s.topk}/{s.experts} ep{s.ep}"
        assert_close(f"{tag} (torch)", moe_torch(x, w1, w2, ids, weights), want,
                     atol=2e-2, rtol=2e-2)
        if use_triton:
            from kernels.moe_triton import fused_moe

            assert_close(f"{tag} (triton)", fused_moe(x, w1, w2, ids, weights), want,
                         atol=2e-2, rtol=2e-2)


def run(shapes: list[MoeShape], dev: Device, timer: Timer,
        tick: Callable[[], bool]) -> list[dict[str, Any]]:
    """One row of the MoE table per shape: the Triton kernel on CUDA, torch on the CPU."""
    if dev.kind == "cuda":
        from kernels.moe_triton import fused_moe

        impl, source = fused_moe, "rackplan_triton_fused_moe"
    else:
        impl, source = moe_torch, "rackplan_torch_grouped_moe"
    gen = generator(dev.torch, 2)
    rows = []
    layers: dict[tuple[int, ...], tuple[torch.Tensor, ...]] = {}
    for s in shapes:
        key = (s.hidden, s.inter, s.topk, s.experts, s.ep, s.tp)
        if key not in layers:  # one layer's weights per split, shared by every token count
            layers.clear()
            layers[key] = _layer(MoeShape(max(t.tokens for t in shapes), *key[:4], s.ep, s.tp),
                                 gen)
        x, w1, w2, ids, weights = layers[key]
        t = timer(partial(impl, x[: s.tokens], w1, w2, ids[: s.tokens], weights[: s.tokens]))
        rows.append({"op_name": "moe", "kernel_source": source, "moe_dtype": "bfloat16",
                     "num_tokens": s.tokens, "hidden_size": s.hidden, "inter_size": s.inter,
                     "topk": s.topk, "num_experts": s.experts, "moe_tp_size": s.tp,
                     "moe_ep_size": s.ep, "distribution": "balanced", **t.columns()})
        if not tick():
            break
    return rows
