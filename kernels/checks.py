"""Comparing a kernel's output with its reference: fail loudly, in one sentence."""

from __future__ import annotations

from typing import Any


class KernelMismatch(AssertionError):
    """A kernel disagrees with its torch reference; no table may be written from it."""


def assert_close(name: str, got: Any, want: Any, atol: float, rtol: float) -> float:
    """Raise KernelMismatch unless |got - want| <= atol + rtol * |want| everywhere; returns the
    largest absolute error."""
    import torch

    got_f, want_f = got.float(), want.float()
    if got_f.shape != want_f.shape:
        raise KernelMismatch(f"{name}: output shape {tuple(got_f.shape)} differs from the "
                             f"reference's {tuple(want_f.shape)}")
    if not torch.isfinite(got_f).all():
        raise KernelMismatch(f"{name}: output holds NaN or inf")
    err = (got_f - want_f).abs()
    bound = atol + rtol * want_f.abs()
    if (err > bound).any():
        worst = int(torch.argmax(err - bound))
        raise KernelMismatch(
            f"{name}: max abs error {float(err.max()):.4g} exceeds the tolerance "
            f"(atol {atol:g} + rtol {rtol:g} x |ref|) at flat index {worst}, where the kernel "
            f"gave {float(got_f.flatten()[worst]):.5g} and the reference "
            f"{float(want_f.flatten()[worst]):.5g}")
    return float(err.max())


def generator(dev_torch: str, seed: int) -> Any:
    """A seeded torch generator on the device (so big operands are made where they live)."""
    import torch

    return torch.Generator(device=dev_torch).manual_seed(seed)


def randn(shape: tuple[int, ...], gen: Any, dtype: Any, scale: float = 1.0) -> Any:
    """Seeded normal values of `dtype` on the generator's device, times `scale` (drawn in the
    dtype itself, so a large bf16 weight needs no fp32 copy)."""
    import torch

    out = torch.randn(shape, generator=gen, device=gen.device, dtype=dtype)
    if scale != 1.0:
        out.mul_(scale)
    return out
