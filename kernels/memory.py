"""Memory bandwidth: a device-to-device copy of a buffer (reads it once, writes it once)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from kernels.checks import KernelMismatch, generator, randn
from kernels.device import Device
from kernels.shapes import CopyShape
from kernels.timing import Timer


def check(dev: Device) -> None:
    """A copy gives back its source exactly."""
    gen = generator(dev.torch, 0)
    src = randn((4099,), gen, torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if not torch.equal(dst, src):
        raise KernelMismatch("memory copy: the destination differs from the source")


def run(shapes: list[CopyShape], dev: Device, timer: Timer,
        tick: Callable[[], bool]) -> list[dict[str, Any]]:
    """One row per size: latency (ms) and the bandwidth it implies (read + write, GB/s)."""
    rows = []
    for s in shapes:
        src = torch.ones(s.nbytes, dtype=torch.uint8, device=dev.torch)
        dst = torch.empty_like(src)
        t = timer(partial(dst.copy_, src))
        rows.append({"op_name": "copy", "kernel_source": "torch.Tensor.copy_",
                     "message_size": s.nbytes,
                     "bandwidth_gb_s": 2 * s.nbytes / (t.median_ms * 1e-3) / 1e9,
                     **t.columns()})
        del src, dst
        if not tick():
            break
    return rows
