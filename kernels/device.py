"""The device a calibration runs on: what it is called and what it can do.

`detect(kind)` is the one place that asks torch about the machine; everything downstream gets
a plain `Device`.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from simulator.specs.errors import SpecError

DEVICE_KINDS = ("cpu", "cuda")
DeviceKind = Literal["cpu", "cuda"]


@dataclass(frozen=True)
class Device:
    """One device kind as seen by torch."""

    kind: DeviceKind
    """cpu or cuda."""
    name: str
    """Human name, e.g. 'NVIDIA H200' or the CPU model."""
    count: int
    """Devices of this kind visible to the process (GPUs; 1 for the CPU)."""
    threads: int
    """torch intra-op threads (the CPU's cores given to a kernel)."""
    fp8: bool
    """The device has fp8 matrix multiply (Ada/Hopper or newer); never on the CPU."""
    capability: str = ""
    """CUDA compute capability, e.g. '9.0'; empty on the CPU."""
    memory_bytes: int = 0
    """Device memory (GPU) or physical memory (CPU); 0 when unknown."""

    @property
    def torch(self) -> str:
        """The torch device string kernels allocate on."""
        return "cuda:0" if self.kind == "cuda" else "cpu"

    def ranks_for_comm(self) -> int:
        """Processes a collective benchmark can use: 2 on the CPU (gloo), the GPUs on CUDA."""
        return 2 if self.kind == "cpu" else self.count


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def _cpu_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def detect(kind: str) -> Device:
    """The device of `kind`; SpecError when it is not a kind or not present."""
    if kind not in DEVICE_KINDS:
        raise SpecError(f"--device={kind!r} is not one of {', '.join(DEVICE_KINDS)}")
    import torch

    if kind == "cpu":
        return Device("cpu", _cpu_name(), 1, torch.get_num_threads(), False,
                      memory_bytes=_cpu_memory())
    if not torch.cuda.is_available():
        raise SpecError("--device='cuda' but torch sees no CUDA device "
                        f"(torch {torch.__version__}); use --device cpu")
    major, minor = torch.cuda.get_device_capability(0)
    fp8 = (major, minor) >= (8, 9) and hasattr(torch, "_scaled_mm")
    return Device("cuda", torch.cuda.get_device_name(0), torch.cuda.device_count(),
                  torch.get_num_threads(), fp8, f"{major}.{minor}",
                  torch.cuda.get_device_properties(0).total_memory)

