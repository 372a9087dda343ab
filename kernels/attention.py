"""GQA attention on one rank: decode over a paged KV cache and causal prefill.

References are plain fp32 softmax attention per request. Timed implementations: decode is our
Triton kernel on CUDA and torch on the CPU (gather and widen the pages, a grouped matmul with an
fp32 softmax: for one query token torch's scaled_dot_product_attention is an order of magnitude
slower than that on a CPU); prefill is torch's scaled_dot_product_attention (flash attention on
CUDA) after writing the new keys and values into the cache in its dtype.

fp8 caches hold e4m3 on CUDA and e5m2 on the CPU, with a per-tensor scale: e5m2 is the top byte
of an fp16, so a CPU widens it with a shift, where e4m3 takes a slow element-wise conversion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from kernels.checks import assert_close, generator, randn
from kernels.device import Device
from kernels.moe import triton_usable
from kernels.shapes import AttnShape
from kernels.timing import Timer

PAGE = 16
"""Tokens per KV-cache page (vLLM's default block size)."""
TABLE_DTYPE = {"bf16": "bfloat16", "fp8": "fp8"}


def kv_dtype(name: str, device: torch.device) -> torch.dtype:
    """The torch dtype a cache of `name` (bf16, fp8) holds on `device`."""
    if name == "bf16":
        return torch.bfloat16
    return torch.float8_e5m2 if device.type == "cpu" else torch.float8_e4m3fn


def quantize(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """(t / scale in `dtype`, scale): per-tensor scaling for fp8, none for bf16; `t` may be
    overwritten (it is scratch: big caches are made once, in place)."""
    if dtype == t.dtype:
        return t, 1.0
    if dtype == torch.bfloat16:
        return t.to(dtype), 1.0
    scale = float(t.abs().amax()) / torch.finfo(dtype).max
    return t.div_(scale).to(dtype), scale


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """fp32 attention; q [B, Hq, Sq, D], k / v [B, Hkv, Sk, D]; causal aligns the last query
    with the last key."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    s = q.float() @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


class PagedCache:
    """A batch's KV cache in pages, every request holding `length` tokens (pages shuffled)."""

    def __init__(self, batch: int, length: int, kv_heads: int, dim: int, kv: str,
                 gen: torch.Generator) -> None:
        pages = -(-length // PAGE)
        total = batch * pages
        kv_both = randn((2, total, PAGE, kv_heads, dim), gen, torch.bfloat16)
        both, self.kv_scale = quantize(kv_both, kv_dtype(kv, gen.device))
        self.k, self.v = both[0], both[1]
        perm = torch.randperm(total, generator=gen, device=gen.device)
        self.table = perm.view(batch, pages).to(torch.int32)
        self.lens = torch.full((batch,), length, dtype=torch.int32, device=gen.device)
        self.length = length
        self._scratch: dict[tuple[int, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def contiguous(self, dtype: torch.dtype,
                   scaled: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v as [B, Hkv, S, D] in `dtype`, pages gathered (one pass: gather, then widen and
        transpose together) into buffers the cache keeps, as an engine keeps its workspace
        (a fresh multi-MB allocation per step would time the CPU allocator's page faults);
        `scaled`: times the cache's scale."""
        b, pages = self.table.shape
        out = []
        for i, c in enumerate((self.k, self.v)):
            gathered, heads = self._buffers(i, c, dtype)
            torch.index_select(c, 0, self.table.reshape(-1), out=gathered)
            heads.copy_(widen(gathered).view(b, pages * PAGE, c.shape[2], c.shape[3])
                        .transpose(1, 2))
            if scaled and self.kv_scale != 1.0:
                heads.mul_(self.kv_scale)
            out.append(heads[:, :, : self.length])
        return out[0], out[1]

    def _buffers(self, i: int, c: torch.Tensor,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        key = (i, dtype)
        if key not in self._scratch:
            b, pages = self.table.shape
            self._scratch[key] = (
                torch.empty(b * pages, *c.shape[1:], dtype=c.dtype, device=c.device),
                torch.empty(b, c.shape[2], pages * PAGE, c.shape[3], dtype=dtype,
                            device=c.device))
        return self._scratch[key]


def widen(t: torch.Tensor) -> torch.Tensor:
    """e5m2 as fp16 (it is an fp16's top byte: a shift, no conversion); other dtypes as is."""
    if t.dtype == torch.float8_e5m2:
        return (t.view(torch.uint8).to(torch.int16) << 8).view(torch.float16)
    return t


def decode_torch(q: torch.Tensor, cache: PagedCache) -> torch.Tensor:
    """Decode in torch: gather and widen the pages, grouped q @ k^T, fp32 softmax, @ v; the
    cache's scale is applied to the scores and the output rather than to every cached value.
    An fp8 cache is computed in fp32 (no fast fp16 or fp8 matmul on a CPU)."""
    b, heads, dim = q.shape
    compute = torch.float32 if cache.k.element_size() == 1 else q.dtype
    k, v = cache.contiguous(compute, scaled=False)
    kv_heads = k.shape[1]
    qg = q.view(b, kv_heads, heads // kv_heads, dim).to(compute)
    s = (qg @ k.transpose(-1, -2)).float() * (dim ** -0.5 * cache.kv_scale)
    out = torch.softmax(s, dim=-1).to(compute) @ v
    if cache.kv_scale != 1.0:
        out = out * cache.kv_scale
    return out.view(b, heads, dim).to(q.dtype)


def decode_triton(q: torch.Tensor, cache: PagedCache, splits: int | None = None) -> torch.Tensor:
    from kernels.attention_triton import paged_decode

    return paged_decode(q, cache.k, cache.v, cache.table, cache.lens, q.shape[-1] ** -0.5,
                        cache.kv_scale, splits)


def prefill_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor) -> torch.Tensor:
    """Prefill: write k / v into the cache (its dtype), causal attention over the new tokens."""
    k_cache.copy_(k.transpose(1, 2).reshape(k_cache.shape))
    v_cache.copy_(v.transpose(1, 2).reshape(v_cache.shape))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


CHECK = {"batch": 3, "length": 300, "heads": 8, "kv_heads": 2, "dim": 32}
"""A ragged length (not a page or block multiple, long enough for 3 KV splits) and 4 query
heads per KV head."""


def check(dev: Device, triton: bool | None = None) -> None:
    """Decode (torch, and Triton where it can run) and prefill against the fp32 reference."""
    use_triton = triton_usable(dev) if triton is None else triton
    gen = generator(dev.torch, 0)
    c = CHECK
    for kv in ("bf16", "fp8"):
        cache = PagedCache(c["batch"], c["length"], c["kv_heads"], c["dim"], kv, gen)
        q = randn((c["batch"], c["heads"], c["dim"]), gen, torch.bfloat16)
        k, v = cache.contiguous(torch.float32)
        want = reference(q[:, :, None], k, v, causal=False)[:, :, 0]
        assert_close(f"decode attention kv {kv} (torch)", decode_torch(q, cache), want,
                     atol=2e-2, rtol=2e-2)
        if use_triton:
            for splits in (1, 3):
                assert_close(f"decode attention kv {kv} (triton, {splits} splits)",
                             decode_triton(q, cache, splits), want, atol=2e-2, rtol=2e-2)
    b, s, h, kvh, d = 2, 37, c["heads"], c["kv_heads"], c["dim"]
    q, k, v = (randn((b, n, s, d), gen, torch.bfloat16) for n in (h, kvh, kvh))
    kc = torch.empty(b * s, kvh, d, dtype=torch.bfloat16, device=q.device)
    assert_close("prefill attention (torch)", prefill_torch(q, k, v, kc, kc.clone()),
                 reference(q, k, v, causal=True), atol=2e-2, rtol=2e-2)


def _call(s: AttnShape, dev: Device, gen: torch.Generator) -> tuple[Callable[[], Any], str]:
    if s.phase == "decode":
        cache = PagedCache(s.batch, s.length + 1, s.kv_heads, s.head_dim, s.kv_dtype, gen)
        q = randn((s.batch, s.heads, s.head_dim), gen, torch.bfloat16)
        if dev.kind == "cuda":
            return (lambda: decode_triton(q, cache)), "rackplan_triton_paged_decode"
        return (lambda: decode_torch(q, cache)), "torch_paged_sdpa"
    q, k, v = (randn((s.batch, n, s.length, s.head_dim), gen, torch.bfloat16)
               for n in (s.heads, s.kv_heads, s.kv_heads))
    kc = torch.empty(s.batch * s.length, s.kv_heads, s.head_dim,
                     dtype=kv_dtype(s.kv_dtype, q.device), device=q.device)
    vc = torch.empty_like(kc)
    return (lambda: prefill_torch(q, k, v, kc, vc)), "torch_sdpa_causal"


def run(shapes: list[AttnShape], dev: Device, timer: Timer,
        tick: Callable[[], bool]) -> list[dict[str, Any]]:
    """One row per shape, for the generation (decode) or context (prefill) attention table."""
    gen = generator(dev.torch, 3)
    rows = []
    for s in shapes:
        call, source = _call(s, dev, gen)
        t = timer(call)
        decode = s.phase == "decode"
        rows.append({"op_name": "generation_attention" if decode else "context_attention",
                     "kernel_source": source, "batch_size": s.batch,
                     "isl": 1 if decode else s.length, "num_heads": s.heads,
                     "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim,
                     "beam_width": 1, "attn_dtype": "bfloat16",
                     "kv_cache_dtype": TABLE_DTYPE[s.kv_dtype],
                     "step": s.length if decode else 0, "window_size": 0, **t.columns()})
        if not tick():
            break
    return rows
