"""Accelerator presets: peak rates, memory, and the scale-up / scale-out network."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator.specs.errors import SpecError

Dtype = Literal["bf16", "fp8", "fp4", "int4"]
DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625, "int4": 0.5625}
"""Bytes per element as stored; fp4 counts its block scales (NVFP4: one fp8 scale per 16), int4
its group scales (Kimi-K2.5's compressed-tensors checkpoint: one bf16 scale per 32)."""

WEIGHT_ONLY: dict[str, str] = {"int4": "bf16"}
"""Weight dtypes whose kernels compute in another dtype: INT4 weight-only (w4a16) GEMMs
dequantize to bf16 and run at bf16's rate. An INT4 checkpoint quantizes only its routed
experts; its other layers are served in that dtype (`dense_dtype`)."""


def dense_dtype(weights: str) -> str:
    """The dtype of a deployment's layers other than its routed experts, for pricing: bf16 for
    weight-only INT4 (WEIGHT_ONLY), else the weights' own."""
    return WEIGHT_ONLY.get(weights, weights)


def linear_dtype(weights: str) -> str:
    """The dtype a checkpoint stores its linear layers besides the routed experts in: bf16 for
    bf16 and weight-only INT4 checkpoints, else fp8 (block-scaled, fp4 checkpoints' too)."""
    return "bf16" if dense_dtype(weights) == "bf16" else "fp8"


class HardwareSpec(BaseModel):
    """One accelerator kind and the network it sits in."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """Preset name, e.g. h200."""
    system: str | None
    """aiconfigurator-core system whose measured tables price this hardware (None: none ship)."""
    peak_tflops: dict[str, float]
    """Dense tensor-core peak per dtype in TFLOP/s (bf16, fp8, fp4 where supported)."""
    hbm_gb: float = Field(gt=0)
    """Device memory in GB (1e9 bytes)."""
    hbm_tb_s: float = Field(gt=0)
    """Device memory bandwidth in TB/s."""
    scaleup_domain: int = Field(ge=1)
    """GPUs in one scale-up (NVLink) domain: 8 for an HGX node, 72 for an NVL72 rack."""
    gpus_per_host: int = Field(8, ge=1)
    """GPUs one host drives (one vllm process per host): 8 on HGX nodes, 4 on a GB200/GB300
    compute tray."""
    scaleup_gb_s: float = Field(gt=0)
    """Scale-up bandwidth per GPU, one direction, GB/s."""
    nic_gb_s: float = Field(gt=0)
    """Scale-out bandwidth per GPU, one direction, GB/s."""
    host_link_gb_s: float = Field(64.0, gt=0)
    """GPU <-> host-memory bandwidth per GPU, one direction, GB/s: PCIe Gen5 x16 on HGX
    (64), Gen6 x16 on B300 (128), NVLink-C2C to the Grace CPU on GB200/GB300 (450; 900 both
    directions)."""
    host_gb: float = Field(256.0, ge=0)
    """Host memory per GPU that weights may be offloaded to, GB (a typical 2 TB HGX host over 8
    GPUs; Grace's 480 GB LPDDR5X over the 2 GPUs it serves on GB200/GB300)."""
    sms: int = Field(132, ge=1)
    """Streaming multiprocessors per GPU (datasheets: 132 on H100/H200 SXM, 148 on B200 and
    GB200, 160 on B300 and GB300): a communication kernel that keeps some of them busy leaves
    the rest to the compute it overlaps."""
    usd_per_gpu_hour: float = Field(ge=0)
    """Price per GPU-hour used for $ per million tokens (a default to override)."""

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s for a dtype; a dtype the hardware lacks runs at the best it has below it."""
        for d in (WEIGHT_ONLY.get(dtype, dtype), "fp8", "bf16"):
            if d in self.peak_tflops:
                return self.peak_tflops[d] * 1e12
        raise SpecError(f"hardware {self.name!r} has no peak rate for {dtype!r}")

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gb * 1e9

    @property
    def hbm_bytes_s(self) -> float:
        return self.hbm_tb_s * 1e12


# Datasheet figures (dense, per GPU). Prices are typical 2026 cloud list prices, a default only.
HARDWARE: dict[str, HardwareSpec] = {
    h.name: h
    for h in [
        HardwareSpec(name="h100", system="h100_sxm", peak_tflops={"bf16": 989, "fp8": 1979},
                     hbm_gb=85.9, hbm_tb_s=3.35, scaleup_domain=8, scaleup_gb_s=450,
                     nic_gb_s=50, usd_per_gpu_hour=2.5),
        HardwareSpec(name="h200", system="h200_sxm", peak_tflops={"bf16": 989, "fp8": 1979},
                     hbm_gb=151.4, hbm_tb_s=4.8, scaleup_domain=8, scaleup_gb_s=450,
                     nic_gb_s=50, usd_per_gpu_hour=3.5),
        HardwareSpec(name="b200", system="b200_sxm",
                     peak_tflops={"bf16": 2250, "fp8": 4500, "fp4": 9000},
                     hbm_gb=193.3, hbm_tb_s=7.7, scaleup_domain=8, scaleup_gb_s=900,
                     nic_gb_s=100, sms=148, usd_per_gpu_hour=5.0),
        HardwareSpec(name="b300", system="b300_sxm",
                     peak_tflops={"bf16": 2250, "fp8": 4500, "fp4": 14000},
                     hbm_gb=288.4, hbm_tb_s=7.75, scaleup_domain=8, scaleup_gb_s=900,
                     nic_gb_s=100, host_link_gb_s=128.0, sms=160, usd_per_gpu_hour=6.0),
        HardwareSpec(name="gb200", system="gb200",
                     peak_tflops={"bf16": 2500, "fp8": 5000, "fp4": 10000},
                     hbm_gb=198.7, hbm_tb_s=8.0, scaleup_domain=72, gpus_per_host=4,
                     scaleup_gb_s=900, host_link_gb_s=450.0, host_gb=240.0,
                     nic_gb_s=100, sms=148, usd_per_gpu_hour=6.0),
        HardwareSpec(name="gb300", system="gb300",
                     peak_tflops={"bf16": 2500, "fp8": 5000, "fp4": 15000},
                     hbm_gb=298.0, hbm_tb_s=8.0, scaleup_domain=72, gpus_per_host=4,
                     scaleup_gb_s=900, host_link_gb_s=450.0, host_gb=240.0,
                     nic_gb_s=100, sms=160, usd_per_gpu_hour=7.0),
        # This project's CPU machine kind (2 cores with AMX): a rough placeholder until
        # `rackplan calibrate --device cpu` measures it.
        HardwareSpec(name="cpu", system=None, peak_tflops={"bf16": 1.0},
                     hbm_gb=24.0, hbm_tb_s=0.02, scaleup_domain=1, gpus_per_host=1,
                     scaleup_gb_s=10, host_gb=0.0,
                     nic_gb_s=1.25, usd_per_gpu_hour=0.1),
    ]
}


def load_hardware(name: str, usd_per_gpu_hour: float | None = None) -> HardwareSpec:
    """A hardware preset by name, with an optional price override."""
    try:
        spec = HARDWARE[name.lower()]
    except KeyError:
        raise SpecError(
            f"unknown hardware {name!r}; valid: {', '.join(HARDWARE)}"
        ) from None
    if usd_per_gpu_hour is not None:
        if usd_per_gpu_hour < 0:
            raise SpecError(f"usd_per_gpu_hour={usd_per_gpu_hour} must be >= 0")
        spec = spec.model_copy(update={"usd_per_gpu_hour": usd_per_gpu_hour})
    return spec
