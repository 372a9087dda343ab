"""A whole multi-head latent attention (MLA) block on one rank, in torch.

Projections: x -> q_a -> RMSNorm -> q_b (per-head nope + rope parts); x -> kv_a (latent + shared
rope key) -> RMSNorm on the latent; output projection from the heads' values. The latent and
rope key are what the KV cache holds (bf16, or fp8 with a per-tensor scale, as in
kernels/attention.py).

Decode uses the absorbed form (queries projected into the latent space, attention over the
latent cache, values projected out of it); prefill expands keys and values per head and runs
causal scaled_dot_product_attention. The reference expands every cached latent and attends in
fp32, so the check also proves the absorption algebra. Rotary embedding is left out (it is
elementwise and the same in every form).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kernels.attention import TABLE_DTYPE, kv_dtype, quantize, reference, widen
from kernels.checks import assert_close, generator, randn
from kernels.device import Device
from kernels.shapes import MlaShape
from kernels.timing import Timer


@dataclass
class MlaWeights:
    """One rank's MLA weights (bf16, [out, in] like nn.Linear)."""

    s: MlaShape
    q_a: torch.Tensor
    q_b: torch.Tensor
    kv_a: torch.Tensor
    kv_b: torch.Tensor
    o: torch.Tensor

    @classmethod
    def random(cls, s: MlaShape, gen: torch.Generator) -> MlaWeights:
        h, qk = s.heads, s.nope + s.rope
        q_in = s.q_lora or s.hidden

        def w(out: int, inp: int) -> torch.Tensor:
            return randn((out, inp), gen, torch.bfloat16, inp ** -0.5)

        return cls(s, w(s.q_lora, s.hidden) if s.q_lora else w(0, s.hidden), w(h * qk, q_in),
                   w(s.kv_lora + s.rope, s.hidden), w(h * (s.nope + s.v), s.kv_lora),
                   w(s.hidden, h * s.v))

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """[T, H, nope + rope]."""
        s = self.s
        cq = F.rms_norm(F.linear(x, self.q_a), (s.q_lora,)) if s.q_lora else x
        return F.linear(cq, self.q_b).view(x.shape[0], s.heads, s.nope + s.rope)

    def latent(self, x: torch.Tensor) -> torch.Tensor:
        """What the cache holds per token: [T, kv_lora + rope] (normalised latent, rope key)."""
        s = self.s
        c = F.linear(x, self.kv_a)
        return torch.cat([F.rms_norm(c[:, : s.kv_lora], (s.kv_lora,)), c[:, s.kv_lora:]], -1)

    def expand(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head keys [T, H, nope + rope] and values [T, H, v] of cached latents."""
        s = self.s
        kv = F.linear(latent[:, : s.kv_lora].to(self.kv_b.dtype), self.kv_b)
        kv = kv.view(-1, s.heads, s.nope + s.v)
        rope = latent[:, None, s.kv_lora:].to(kv.dtype).expand(-1, s.heads, -1)
        return torch.cat([kv[..., : s.nope], rope], -1), kv[..., s.nope:]


class LatentCache:
    """A batch's latent cache, [B, S, kv_lora + rope], every request `length` tokens long."""

    def __init__(self, batch: int, length: int, width: int, kv: str,
                 gen: torch.Generator) -> None:
        c = randn((batch, length, width), gen, torch.bfloat16)
        self.data, self.scale = quantize(c, kv_dtype(kv, gen.device))

    def read(self, dtype: torch.dtype) -> torch.Tensor:
        """The cached latents in `dtype`, scale applied."""
        out = widen(self.data).to(dtype)
        return out * self.scale if self.scale != 1.0 else out


def decode_absorbed(w: MlaWeights, x: torch.Tensor, cache: LatentCache) -> torch.Tensor:
    """One new token per request ([B, hidden]) over its cached latents: [B, hidden]."""
    s = w.s
    q = w.queries(x)
    uk = w.kv_b.view(s.heads, s.nope + s.v, s.kv_lora)
    q_lat = torch.einsum("bhn,hnl->bhl", q[..., : s.nope], uk[:, : s.nope])
    lat = cache.read(x.dtype)
    scores = torch.cat([q_lat, q[..., s.nope:]], -1) @ lat.transpose(1, 2)  # [B, H, S]
    p = torch.softmax(scores.float() * (s.nope + s.rope) ** -0.5, -1).to(x.dtype)
    o_lat = p @ lat[..., : s.kv_lora]  # [B, H, kv_lora]
    o = torch.einsum("bhl,hvl->bhv", o_lat, uk[:, s.nope:])
    return F.linear(o.reshape(x.shape[0], -1), w.o)


def prefill(w: MlaWeights, x: torch.Tensor, batch: int, cache: torch.Tensor) -> torch.Tensor:
    """`batch` requests of x.shape[0] / batch new tokens each, causal: [T, hidden]; the latents
    are written into `cache` in its dtype."""
    s = w.s
    q = w.queries(x)
    lat = w.latent(x)
    cache.copy_(lat.view(cache.shape))
    k, v = w.expand(lat)
    n = x.shape[0] // batch

    def heads_first(t: torch.Tensor) -> torch.Tensor:
        return t.view(batch, n, s.heads, -1).transpose(1, 2)

    # Values padded to the query/key width, as flash attention wants one head size.
    v = F.pad(v, (0, max(s.nope + s.rope - s.v, 0)))
    o = F.scaled_dot_product_attention(heads_first(q), heads_first(k), heads_first(v),
                                       is_causal=True)[..., : s.v]
    return F.linear(o.transpose(1, 2).reshape(x.shape[0], -1), w.o)


def reference_decode(w: MlaWeights, x: torch.Tensor, cache: LatentCache) -> torch.Tensor:
    """fp32, keys and values expanded per head from every cached latent."""
    s = w.s
    b, length, _ = cache.data.shape
    q = w.queries(x).float()
    k, v = w.expand(cache.read(torch.float32).reshape(b * length, -1).to(torch.bfloat16))
    k = k.float().view(b, length, s.heads, -1).transpose(1, 2)
    v = v.float().view(b, length, s.heads, -1).transpose(1, 2)
    o = reference(q[:, :, None], k, v, causal=False)[:, :, 0]
    return o.reshape(b, -1) @ w.o.float().t()


CHECK = MlaShape("decode", 3, 41, 4, hidden=64, q_lora=48, kv_lora=32, nope=16, rope=16, v=16,
                 kv_dtype="bf16")


def check(dev: Device) -> None:
    """Absorbed decode and prefill against fp32 references; KernelMismatch if off."""
    gen = generator(dev.torch, 0)
    w = MlaWeights.random(CHECK, gen)
    for kv in ("bf16", "fp8"):
        cache = LatentCache(CHECK.batch, CHECK.length, CHECK.kv_lora + CHECK.rope, kv, gen)
        x = randn((CHECK.batch, CHECK.hidden), gen, torch.bfloat16)
        assert_close(f"mla decode kv {kv} (torch absorbed)", decode_absorbed(w, x, cache),
                     reference_decode(w, x, cache), atol=3e-2, rtol=3e-2)
    b, n = 2, 19
    x = randn((b * n, CHECK.hidden), gen, torch.bfloat16)
    lat_cache = torch.empty(b * n, CHECK.kv_lora + CHECK.rope, dtype=torch.bfloat16,
                            device=x.device)
    q = w.queries(x).view(b, n, CHECK.heads, -1).transpose(1, 2)
    k, v = w.expand(w.latent(x))
    k, v = (t.view(b, n, CHECK.heads, -1).transpose(1, 2) for t in (k, v))
    want = reference(q, k, v, causal=True).transpose(1, 2).reshape(b * n, -1) @ w.o.float().t()
    assert_close("mla prefill (torch)", prefill(w, x, b, lat_cache), want, atol=3e-2,
                 rtol=3e-2)


def _call(s: MlaShape, w: MlaWeights, gen: torch.Generator) -> Callable[[], Any]:
    if s.phase == "decode":
        cache = LatentCache(s.batch, s.length + 1, s.kv_lora + s.rope, s.kv_dtype, gen)
        x = randn((s.batch, s.hidden), gen, torch.bfloat16)
        return lambda: decode_absorbed(w, x, cache)
    x = randn((s.batch * s.length, s.hidden), gen, torch.bfloat16)
    lat = torch.empty(s.batch * s.length, s.kv_lora + s.rope,
                      dtype=kv_dtype(s.kv_dtype, x.device), device=x.device)
    return lambda: prefill(w, x, s.batch, lat)


def run(shapes: list[MlaShape], dev: Device, timer: Timer,
        tick: Callable[[], bool]) -> list[dict[str, Any]]:
    """One row per shape, for the MLA generation (decode) or context (prefill) module table."""
    gen = generator(dev.torch, 4)
    weights: dict[int, MlaWeights] = {}
    rows = []
    for s in shapes:
        if s.heads not in weights:
            weights.clear()
            weights[s.heads] = MlaWeights.random(s, gen)
        t = timer(_call(s, weights[s.heads], gen))
        decode = s.phase == "decode"
        rows.append({"op_name": "mla_generation_module" if decode else "mla_context_module",
                     "kernel_source": ("rackplan_torch_mla_absorbed" if decode
                                       else "rackplan_torch_mla_sdpa"),
                     "mla_dtype": "bfloat16", "kv_cache_dtype": TABLE_DTYPE[s.kv_dtype],
                     "gemm_type": "bfloat16", "num_heads": s.heads, "batch_size": s.batch,
                     "isl": 1 if decode else s.length, "tp_size": 1,
                     "step": s.length if decode else 0, **t.columns()})
        if not tick():
            break
    return rows
