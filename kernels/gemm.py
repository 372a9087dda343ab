"""Dense GEMM: torch.nn.functional.linear in bf16, torch._scaled_mm in fp8 (per-tensor scales).

`check` compares both with an fp32 matmul of the same (dequantized) operands; `run` times each
shape of a sweep and returns one calibration-table row per shape.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from kernels.checks import assert_close, generator, randn
from kernels.device import Device
from kernels.shapes import GemmShape
from kernels.timing import Timer

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
TABLE_DTYPE = {"bf16": "bfloat16", "fp8": "fp8"}
SOURCE = {"bf16": "torch.nn.functional.linear", "fp8": "torch._scaled_mm"}


def quantize_fp8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor fp8 (e4m3) quantization: (values, fp32 scale) with t ~= values * scale."""
    scale = t.abs().amax().float().clamp(min=1e-12) / FP8_MAX
    return (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def fp8_linear(x8: torch.Tensor, sx: torch.Tensor, w8: torch.Tensor,
               sw: torch.Tensor) -> torch.Tensor:
    """x8 [m, k] @ w8 [n, k]^T in fp8 with bf16 output; m is padded to a multiple of 16."""
    m = x8.shape[0]
    pad = -m % 16
    if pad:
        x8 = torch.cat([x8, x8.new_zeros(pad, x8.shape[1])])
    out = torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
    return out[:m]


def _calls(group: list[GemmShape], gen: torch.Generator) -> list[Callable[[], Any]]:
    """One call per shape of a group sharing (n, k, dtype): one weight, row slices of one x."""
    n, k, dtype = group[0].n, group[0].k, group[0].dtype
    w = randn((n, k), gen, torch.bfloat16, k ** -0.5)
    x = randn((max(s.m for s in group), k), gen, torch.bfloat16)
    if dtype == "bf16":
        return [partial(F.linear, x[: s.m], w) for s in group]
    x8, sx = quantize_fp8(x)
    w8, sw = quantize_fp8(w)
    return [partial(fp8_linear, x8[: s.m], sx, w8, sw) for s in group]


def check(dev: Device) -> None:
    """bf16 (and fp8 where the device has it) against an fp32 reference; KernelMismatch if off."""
    gen = generator(dev.torch, 0)
    m, n, k = 33, 80, 256
    x = randn((m, k), gen, torch.bfloat16)
    w = randn((n, k), gen, torch.bfloat16, k ** -0.5)
    want = x.float() @ w.float().t()
    assert_close("gemm bf16", F.linear(x, w), want, atol=2e-2, rtol=2e-2)
    if dev.fp8:
        x8, sx = quantize_fp8(x)
        w8, sw = quantize_fp8(w)
        want8 = (x8.float() * sx) @ (w8.float() * sw).t()
        assert_close("gemm fp8", fp8_linear(x8, sx, w8, sw), want8, atol=3e-2, rtol=3e-2)


def run(shapes: list[GemmShape], dev: Device, timer: Timer,
        tick: Callable[[], bool]) -> list[dict[str, Any]]:
    """One row of the GEMM table per shape."""
    gen = generator(dev.torch, 1)
    groups: dict[tuple[int, int, str], list[GemmShape]] = {}
    for s in shapes:
        groups.setdefault((s.n, s.k, s.dtype), []).append(s)
    rows = []
    for group in groups.values():
        for s, call in zip(group, _calls(group, gen), strict=True):
            t = timer(call)
            rows.append({"op_name": "gemm", "kernel_source": SOURCE[s.dtype],
                         "gemm_dtype": TABLE_DTYPE[s.dtype], "m": s.m, "n": s.n, "k": s.k,
                         **t.columns()})
            if not tick():
                return rows
    return rows
