"""Roofline times (ms) per operation: max(FLOPs / peak, bytes / bandwidth).

They normalise measured tables (efficiency = roofline / measured) and price what no table covers.
Every function is vectorised over its array arguments.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from simulator.specs.hardware import DTYPE_BYTES, HardwareSpec

ArrayLike = np.ndarray | float | int


def _ms(hw: HardwareSpec, flops: ArrayLike, nbytes: ArrayLike, dtype: str) -> np.ndarray:
    return np.maximum(np.asarray(flops) / hw.peak_flops(dtype),
                      np.asarray(nbytes) / hw.hbm_bytes_s) * 1e3


def gemm(hw: HardwareSpec, m: ArrayLike, n: ArrayLike, k: ArrayLike, dtype: str) -> np.ndarray:
    """y[m, n] = x[m, k] @ w[k, n]; bf16 activations out."""
    m, n, k = (np.asarray(v, dtype=float) for v in (m, n, k))
    wb = DTYPE_BYTES[dtype]
    return _ms(hw, 2 * m * n * k, (m * k + n * k) * wb + 2 * m * n, dtype)


def moe(hw: HardwareSpec, tokens: ArrayLike, hidden: ArrayLike, inter: ArrayLike, topk: ArrayLike,
        experts: ArrayLike, ep: ArrayLike, dtype: str, tp: ArrayLike = 1) -> np.ndarray:
    """Grouped GEMM of one rank; `tokens` counts tokens over the whole EP group (balanced);
    experts are split over `ep` ranks and each expert's intermediate size over `tp` ranks."""
    tokens, ep = np.asarray(tokens, dtype=float), np.asarray(ep, dtype=float)
    inter = np.asarray(inter, dtype=float) / np.asarray(tp, dtype=float)
    local = experts / ep
    assigned = tokens * topk / ep
    touched = local * (1 - np.exp(-assigned / local))  # expected experts that get a token
    flops = 2 * assigned * 3 * hidden * inter
    nbytes = touched * 3 * hidden * inter * DTYPE_BYTES[dtype] + assigned * hidden * 2 * 2
    return _ms(hw, flops, nbytes, dtype)


def attention_generation(hw: HardwareSpec, batch: ArrayLike, context: ArrayLike, heads: int,
                         kv_heads: int, head_dim: int, kv_dtype: str) -> np.ndarray:
    """One decode token per request against `context` cached tokens (GQA kernel only)."""
    batch, context = np.asarray(batch, dtype=float), np.asarray(context, dtype=float)
    flops = 4 * batch * heads * head_dim * context
    nbytes = batch * context * 2 * kv_heads * head_dim * DTYPE_BYTES[kv_dtype]
    return _ms(hw, flops, nbytes, "bf16")


def attention_context(hw: HardwareSpec, batch: ArrayLike, isl: ArrayLike, heads: int,
                      kv_heads: int, head_dim: int, kv_dtype: str) -> np.ndarray:
    """Causal prefill attention of `isl` new tokens per request (GQA kernel only)."""
    batch, isl = np.asarray(batch, dtype=float), np.asarray(isl, dtype=float)
    flops = 2 * batch * heads * head_dim * isl * isl  # causal: half of 4 * s^2
    nbytes = batch * isl * (2 * heads + 2 * kv_heads) * head_dim * 2
    return _ms(hw, flops, nbytes, "bf16")


def mla_module(hw: HardwareSpec, batch: ArrayLike, new: ArrayLike, context: ArrayLike, heads: int,
               proj_params_per_head: float, shared_params: float, latent: int, rope: int,
               weights: str, kv_dtype: str) -> np.ndarray:
    """A whole MLA attention block: projections plus latent attention.

    `new` tokens per request attend to `context` tokens (prefill: new == context, causal).
    Projection weights are `shared_params + heads * proj_params_per_head`.
    """
    batch, new, context = (np.asarray(v, dtype=float) for v in (batch, new, context))
    params = shared_params + heads * proj_params_per_head
    tokens = batch * new
    core = 2 * heads * (2 * latent + rope) * np.where(new > 1, context / 2, context)
    flops = 2 * tokens * params + tokens * core
    nbytes = params * DTYPE_BYTES[weights] + batch * context * (latent + rope) * DTYPE_BYTES[
        kv_dtype] + tokens * heads * 128 * 2 * 2
    return _ms(hw, flops, nbytes, weights)


def mega_moe(hw: HardwareSpec, tokens: ArrayLike, hidden: ArrayLike, inter: ArrayLike,
             topk: ArrayLike, experts: ArrayLike, ep: ArrayLike, dtype: str,
             gb_s: float) -> np.ndarray:
    """DeepGEMM's fused MegaMoE on one rank of `tokens` (per rank): the grouped GEMM of the
    tokens routed to its experts, overlapped with dispatching them (fp8) and combining the
    results (bf16) over the `gb_s` GB/s scale-up link; the slower of the two sets the time."""
    tokens, ep = np.asarray(tokens, dtype=float), np.asarray(ep, dtype=float)
    gemm = moe(hw, tokens * ep, hidden, inter, topk, experts, ep, dtype)
    sent = tokens * np.asarray(topk, dtype=float) * np.asarray(hidden, dtype=float) * (
        1 + 2) * (ep - 1) / ep
    return np.maximum(gemm, sent / (gb_s * 1e9) * 1e3)


def gdn(hw: HardwareSpec, batch: ArrayLike, new: ArrayLike, k_heads: ArrayLike, k_dim: int,
        v_heads: ArrayLike, v_dim: int, conv: int) -> np.ndarray:
    """Gated DeltaNet kernels (causal convolution + delta-rule recurrence) of `batch` requests
    of `new` tokens each on one rank: every token reads and updates the fp32 state in chunks
    (prefill) or once (decode), and passes q, k, v through the convolution."""
    batch, new = np.asarray(batch, dtype=float), np.asarray(new, dtype=float)
    k_heads, v_heads = np.asarray(k_heads, dtype=float), np.asarray(v_heads, dtype=float)
    tokens = batch * new
    width = 2 * k_heads * k_dim + v_heads * v_dim
    state = v_heads * k_dim * v_dim * 4
    flops = tokens * (2 * conv * width + 2 * 4 * v_heads * k_dim * v_dim)
    nbytes = tokens * width * 2 * 2 + batch * state * 2
    return _ms(hw, flops, nbytes, "bf16")


def transfer(nbytes: ArrayLike, gb_s: ArrayLike, latency_us: float = 10.0) -> np.ndarray:
    """Moving bytes over a link of `gb_s` GB/s with a fixed start-up latency."""
    return np.asarray(nbytes, dtype=float) / (gb_s * 1e9) * 1e3 + latency_us * 1e-3


def allreduce(nbytes: ArrayLike, gpus: ArrayLike, gb_s: float) -> np.ndarray:
    """Ring all-reduce: each GPU sends and receives 2 (n-1)/n of the message."""
    n = np.maximum(np.asarray(gpus, dtype=float), 1.0)
    return transfer(2 * (n - 1) / n * np.asarray(nbytes, dtype=float), gb_s)


def sparse_attention(hw: HardwareSpec, batch: ArrayLike, new: ArrayLike, past: ArrayLike, *,
                     params: ArrayLike, heads: ArrayLike, qk_dim: float, v_dim: float, window: int,
                     ratio: int, topk: int, index_heads: int, index_dim: int,
                     entry_bytes: float, index_bytes: float, weights: str = "fp8",
                     bound: str = "both", index_cap: float = math.inf,
                     window_bytes: float | None = None) -> np.ndarray:
    """One layer of compressed / sparse attention (DeepSeek-V4 SWA, CSA, HCA; V3.2 DSA) with its
    projections: `batch` requests of `new` tokens after `past` cached ones.

    Each query reads the last `window` raw entries, and the compressed entries (one per `ratio`
    tokens; ratio 1 for V3.2's uncompressed latents): all of them, or the `topk` an indexer
    picks when topk > 0; the indexer scores every compressed entry with its own keys. Compute
    is the sum of the projection and indexer time (weights' dtype) and the attention core
    (bf16); memory is weights + the entries each request reads + the query/output activations.
    `bound` "compute" or "memory" gives that side alone (default "both": the larger), "each"
    both sides stacked (compute first).
    `index_cap`: the most keys the indexer scores per query (DeepSeek-V4.1's re-indexing layers
    score only the candidates another layer picked); `window_bytes`: bytes of a raw window
    entry when it is stored apart from the compressed ones (V4.1: fp8 window, fp4 records).
    """
    wbytes = entry_bytes if window_bytes is None else window_bytes
    one = _one_point((batch, new, past, params, heads))
    if one is not None:
        shape, (b1, n1, p1, w1, h1) = one
        compute1, memory1 = _sparse_attention_one(
            hw, b1, n1, p1, w1, h1, qk_dim, v_dim, window, ratio, topk, index_heads, index_dim,
            entry_bytes, index_bytes, weights, index_cap, wbytes)
        sides1 = {"compute": compute1, "memory": memory1, "both": max(compute1, memory1)}
        if bound == "each":
            return np.stack([np.full(shape, compute1 * 1e3), np.full(shape, memory1 * 1e3)])
        return np.full(shape, sides1[bound] * 1e3)
    batch, new, past = (np.asarray(v, dtype=float) for v in (batch, new, past))
    tokens = batch * new
    seen = past + np.where(new > 1, (new + 1) / 2, new)  # mean context of a new token
    end = past + new

    def entries(c: np.ndarray) -> np.ndarray:
        raw = np.minimum(c, window) if window else np.zeros_like(c)
        if not ratio:
            return raw
        comp = c / ratio
        return raw + (np.minimum(comp, topk) if topk else comp)

    def raw(c: np.ndarray) -> np.ndarray:
        return np.minimum(c, window) if window else np.zeros_like(c)

    core = tokens * 2 * heads * (qk_dim + v_dim) * entries(seen)
    indexer = (tokens * 2 * index_heads * index_dim * np.minimum(seen / max(ratio, 1), index_cap)
               if topk else 0.0)
    compute = ((2 * tokens * params + indexer) / hw.peak_flops(weights)
               + core / hw.peak_flops("bf16"))
    comp = (end / ratio if ratio else 0.0) * np.ones_like(end)
    if ratio and topk:
        comp = np.where(new > 1, comp, np.minimum(comp, topk))
    held = raw(end)
    reads = (held + comp) * entry_bytes if wbytes == entry_bytes else (
        held * wbytes + comp * entry_bytes)
    keys = np.minimum(end / max(ratio, 1), index_cap) * index_bytes if topk else 0.0
    nbytes = (params * DTYPE_BYTES[weights] + batch * (reads + keys)
              + tokens * heads * v_dim * 2 * 2)
    sides = {"compute": lambda: compute * np.ones_like(tokens),
             "memory": lambda: nbytes / hw.hbm_bytes_s,
             "both": lambda: np.maximum(compute, nbytes / hw.hbm_bytes_s),
             "each": lambda: np.stack([compute * np.ones_like(tokens),
                                       nbytes / hw.hbm_bytes_s * np.ones_like(tokens)])}
    return sides[bound]() * 1e3


def _one_point(values: tuple[ArrayLike, ...]) -> tuple[tuple[int, ...], list[float]] | None:
    """The values of one-element arguments as floats, and the broadcast shape (the longest
    of theirs); None when one has more elements or none."""
    shape: tuple[int, ...] = ()
    out = []
    for v in values:
        t = type(v)
        if t is float or t is int:
            out.append(float(cast(float, v)))
            continue
        if t is np.ndarray:
            a = cast(np.ndarray, v)
            if a.size != 1:
                return None
            out.append(float(a.reshape(-1)[0]))
            if a.ndim > len(shape):
                shape = a.shape
            continue
        one = _one(v)
        if one is None:
            return None
        out.append(one)
        if np.ndim(v) > len(shape):
            shape = np.shape(v)
    return shape, out


def _one(v: ArrayLike) -> float | None:
    """The value of a one-element argument as a float (None for more elements or none)."""
    if type(v) is float:
        return v
    if type(v) is int:
        return float(v)
    a = np.asarray(v, dtype=float)
    return float(a.ravel()[0]) if a.size == 1 else None


def _sparse_attention_one(hw: HardwareSpec, batch: float, new: float, past: float,
                          params: float, heads: float, qk_dim: float, v_dim: float,
                          window: int, ratio: int, topk: int, index_heads: int,
                          index_dim: int, entry_bytes: float, index_bytes: float,
                          weights: str, index_cap: float, wbytes: float) -> tuple[float, float]:
    """`sparse_attention` of one point in plain floats (a step prices one or two points, and
    numpy's per-call cost dominates at that size): the same operations in the same order;
    (compute, memory) in seconds."""
    tokens = batch * new
    seen = past + ((new + 1) / 2 if new > 1 else new)
    end = past + new

    def entries(c: float) -> float:
        raw = min(c, window) if window else 0.0
        if not ratio:
            return raw
        comp = c / ratio
        return raw + (min(comp, topk) if topk else comp)

    def raw(c: float) -> float:
        return min(c, window) if window else 0.0

    core = tokens * 2 * heads * (qk_dim + v_dim) * entries(seen)
    indexer = (tokens * 2 * index_heads * index_dim * min(seen / max(ratio, 1), index_cap)
               if topk else 0.0)
    compute = ((2 * tokens * params + indexer) / hw.peak_flops(weights)
               + core / hw.peak_flops("bf16"))
    comp = end / ratio if ratio else 0.0
    if ratio and topk and new <= 1:
        comp = min(comp, topk)
    held = raw(end)
    reads = (held + comp) * entry_bytes if wbytes == entry_bytes else (
        held * wbytes + comp * entry_bytes)
    keys = min(end / max(ratio, 1), index_cap) * index_bytes if topk else 0.0
    nbytes = (params * DTYPE_BYTES[weights] + batch * (reads + keys)
              + tokens * heads * v_dim * 2 * 2)
    return compute, nbytes / hw.hbm_bytes_s


def mhc(hw: HardwareSpec, tokens: ArrayLike, hidden: ArrayLike, streams: ArrayLike,
        sites: int = 2) -> np.ndarray:
    """DeepSeek-V4 hyper-connection pre or post mixing of `tokens` (per site: read the
    `streams` residual streams and the layer's output in fp32, write them back, and project the
    streams to the mixing weights)."""
    tokens, hidden, streams = (np.asarray(v, dtype=float) for v in (tokens, hidden, streams))
    flops = sites * 2 * tokens * streams * hidden * (2 * streams + streams * streams)
    nbytes = sites * tokens * hidden * (2 * streams + 1) * 4
    return _ms(hw, flops, nbytes, "bf16")
