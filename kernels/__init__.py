"""rackplan: kernels — torch and Triton microbenchmarks that write calibration tables.

Each family (gemm, moe, attention, mla, memory, comm) checks its kernels against a torch
reference, then times a declarative sweep of a model's shapes (kernels.shapes) and returns rows
for the calibration layer's tables (kernels.writer). `rackplan calibrate` (kernels.cli) runs them
through kernels.calibrate. The names below need no torch; the kernel modules do.
"""

from kernels.device import DEVICE_KINDS, Device, detect
from kernels.shapes import GRIDS, OPS, Sweep, build_sweep
from kernels.timing import CpuTimer, CudaTimer, Timing, timer_for

__all__ = ["DEVICE_KINDS", "GRIDS", "OPS", "CpuTimer", "CudaTimer", "Device", "Sweep", "Timing",
           "build_sweep", "detect", "timer_for"]
