"""Measured kernel tables for one (hardware, engine, version), priced through `Grid`.

Sources, in order: the user's own tables written by `rackplan calibrate` (same layout), the measured
database shipped in the `aiconfigurator-core` package, and the roofline when neither covers an op.
Every price says where it came from.

pandas and the parquet reader load on the first table read; what is derived from the tables (the
interpolation grids and the few numbers read off them) is kept in a disk cache
(`simulator.calibration.cache`), so a process that finds it warm reads no table at all.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from simulator.calibration import mega_attention as mega
from simulator.calibration import roofline as rf
from simulator.calibration.cache import cached
from simulator.calibration.grid import EXTRAPOLATED, ROOFLINE, SOURCES, Grid, worst
from simulator.specs.attention import DSV4, DSV4_ENTRY_BYTES, INDEXER_KEY_BYTES
from simulator.specs.attention import kind as kind_of
from simulator.specs.deployment import SM100_HARDWARE
from simulator.specs.errors import SpecError
from simulator.specs.hardware import (
    DTYPE_BYTES,
    HardwareSpec,
    dense_dtype,
    linear_dtype,
    load_hardware,
)
from simulator.specs.memo import per_object
from simulator.specs.model import load_model
from simulator.specs.topology import all_to_all_rate

if TYPE_CHECKING:
    import pandas as pd

    from simulator.cost.step import Instance
    from simulator.specs.attention import CSA2
    from simulator.specs.model import ModelSpec

ENGINES = ("vllm", "sglang", "trtllm")

# op -> (folder, file, backend folder override); one table of what is read from where.
OP_FILES: dict[str, tuple[str, str]] = {
    "gemm": ("gemm", "gemm_perf.parquet"),
    "moe": ("moe", "moe_perf.parquet"),
    "attention_context": ("attention", "context_attention_perf.parquet"),
    "attention_generation": ("attention", "generation_attention_perf.parquet"),
    "mla_context": ("mla", "mla_context_module_perf.parquet"),
    "mla_generation": ("mla", "mla_generation_module_perf.parquet"),
    "all_to_all": ("comm", "moe_a2a_perf.parquet"),
    "allreduce": ("comm", "custom_allreduce_perf.parquet"),
    "nccl": ("comm", "nccl_perf.parquet"),
    "moe_wideep_generation": ("moe", "wideep_generation_moe_perf.parquet"),
    "moe_wideep_context": ("moe", "wideep_context_moe_perf.parquet"),
    "dsa_context": ("sparse_attention", "dsa_context_module_perf.parquet"),
    "dsa_generation": ("sparse_attention", "dsa_generation_module_perf.parquet"),
    "dsv4_csa_context": ("sparse_attention", "dsv4_csa_context_module_perf.parquet"),
    "dsv4_csa_generation": ("sparse_attention", "dsv4_csa_generation_module_perf.parquet"),
    "dsv4_hca_context": ("sparse_attention", "dsv4_hca_context_module_perf.parquet"),
    "dsv4_hca_generation": ("sparse_attention", "dsv4_hca_generation_module_perf.parquet"),
    "dsv4_indexer": ("sparse_attention", "dsv4_paged_mqa_logits_module_perf.parquet"),
    "dsv4_hca_attn": ("sparse_attention", "dsv4_hca_attn_module_perf.parquet"),
    "dsv4_topk": ("sparse_attention", "dsv4_csa_topk_calib_perf.parquet"),
    "mhc": ("mhc", "mhc_module_perf.parquet"),
    "mega_moe": ("moe", "dsv4_megamoe_module_perf.parquet"),
    "gdn": ("linear_attention", "gdn_perf.parquet"),
    "a2a_wide_ll": ("comm", "wideep_deepep_ll_perf.parquet"),
    "a2a_wide_normal": ("comm", "wideep_deepep_normal_perf.parquet"),
    "a2a_nvlink": ("comm", "trtllm_alltoall_perf.parquet"),
}
OP_ENGINES = {"nccl": ("nccl",), "moe_wideep_generation": ("sglang",),
              "mega_moe": ("sglang",), "dsv4_topk": ("sglang",), "a2a_wide_ll": ("sglang",),
              "a2a_wide_normal": ("sglang",),
              "moe_wideep_context": ("sglang",), "a2a_nvlink": ("trtllm",)}
"""Ops whose tables sit under a library's folder rather than the engine's."""
NCCL_OPS = ("all_gather", "reduce_scatter", "all_reduce", "alltoall")

GEMM_DTYPES = {"bf16": ["bfloat16"], "fp8": ["fp8_block", "fp8"], "fp4": ["nvfp4"]}
MOE_DTYPES = {"bf16": ["bfloat16"], "fp8": ["fp8_block", "fp8"],
              "fp4": ["nvfp4", "w4a8_mxfp4_mxfp8", "w4a16_mxfp4", "int4_wo"],
              "int4": ["int4_wo"]}
WEIGHT_ONLY_INT4 = "int4_wo"
"""MoE rows of INT4 weights with 16-bit activations (w4a16, Kimi-K2.5's native checkpoint):
`weights: int4` experts' own rows. On hardware without fp4 tensor cores (Hopper) 4-bit experts
run a weight-only kernel whatever their format, as w4a16_mxfp4 does, so there `fp4` experts
too take these rows for a shape only they measured (`_exact_int4`): H200's vLLM table
measures 4-bit weights on Kimi's shape only as int4_wo (0.47 ms at 64 tokens, TP8), where a
transfer from gpt-oss's mxfp4 shape put 0.52 ms with a step from 48 to 64 tokens the
measurement does not have. Where fp4 is native
(Blackwell), 4-bit experts mean its fp4 kernels and these rows are left out."""
KV_DTYPES = {"bf16": "bfloat16", "fp8": "fp8", "fp4": "nvfp4"}
MLA_GEMM = {"bf16": "bfloat16", "fp8": "fp8_block", "fp4": "fp8_block"}
FALLBACK = {"int4": "fp4", "fp4": "fp8", "fp8": "bf16"}
"""When no row has a dtype, price with the next dtype's efficiency: its measured time over its own
roofline, applied to the asked dtype's roofline (flagged extrapolated)."""

A2A_DTYPES = {"dispatch": ("default", "fp8", "bfloat16"), "combine": ("default", "bfloat16")}
"""The measured dispatch / combine rows that price the exchange, first found first: the
collector's default (vLLM: fp8 dispatch, bf16 combine, what the cost model sends), else the
same dtype, else bf16 (TensorRT-LLM measures its normal kernels' dispatch in bf16 and NVFP4
only: bf16, the slower, prices an fp8 dispatch there). A smaller dtype's time is not scaled
from a larger one's: the measured kernels are far from their bytes (NVFP4 dispatch 10 % faster
than bf16 at 3.6 x fewer bytes, B200, 8K tokens)."""

ONE_SIDED_DISPATCH = {"fp4": 0.5 + 1 / 16, "fp8": 1.0 + 4 / 128}
"""Bytes per hidden element vLLM's NVLink one-sided dispatch sends, by the experts' dtype
(`flashinfer_one_sided_dispatch_layout`, fused_moe/all2all_utils.py): NVFP4 activations with
an fp8 scale per 16, fp8 with an fp32 scale per 128 (DeepSeek's block scales); bf16 (2) for
the others. Its combine returns bf16 (2)."""

ONE_SIDED_PAYLOAD = {"dispatch": ONE_SIDED_DISPATCH["fp4"], "combine": 2.0}
"""Bytes per hidden element the NVLink one-sided kernels carried where TensorRT-LLM measured
them (`trtllm_alltoall_perf`, moe_dtype nvfp4): a dispatch of NVFP4 activations, a combine of
bf16 expert outputs."""

TOPK_SCORES = "v1_top_last"
"""The rows of SGLang's kernel-level top-k table (`dsv4_csa_topk_calib`) that price the
selection after V4's indexer. Its collector times the top-k transform twice a shape: over
scores all alike ("flat", a radix select's worst case, what the dummy scores of the module
collectors give) and over scores whose best come last ("top_last"); aiconfigurator corrects
its measured CSA modules by flat - top_last, taking top_last as what real scores cost. v1 is
the kernel it times in prefill and decode (v2 only at one new token)."""

LATENCY_UNIT_MS = {"all_to_all": 1e-3}
"""Tables whose latency column is not in ms (the all-to-all table is in microseconds)."""



@dataclass(frozen=True)
class Unsound:
    """Rows of a shipped table that time something other than the kernel they name, and what
    other engines' harnesses measured in their place on the same system: the same kernel, or
    their own implementation of the same block."""

    op: str
    engine: str
    version: str
    column: str
    value: str
    """The rows where `column` is `value` are dropped."""
    stand_ins: tuple[str, ...]
    """Engines whose rows of the same value on the same system stand in, first found first."""
    why: str
    fixed_by: str = ""
    """Words in the table's collection_meta.yaml that mark a re-collection without the fault:
    such a table is kept ("" for none)."""


UNSOUND = (
    Unsound("gemm", "vllm", "0.24.0", "gemm_dtype", "fp8_block", ("sglang", "trtllm"),
            "vLLM 0.24.0's block-scaled fp8 GEMM rows (DeepGEMM and CUTLASS) take 0.24 ms "
            "or more at every shape on GB300 whatever the rows (0.29 ms for 1 and for 32,768 "
            "rows of 4096 x 1024), 10-85 x its own bf16 at 64 rows on every system; SGLang's "
            "and TensorRT-LLM's DeepGEMM rows on the same systems agree within a few percent "
            "(GB300, 4096 x 1024: 8.0 / 8.3 us at 8 rows, 12.2 / 11.3 at 1,024, 41.1 / 42.2 "
            "at 8,192) and sit at 1.0-1.3 x bf16: a fixed cost of the harness, not of the "
            "kernel, which vLLM runs for block-quantized checkpoints (DeepSeek's)"),
    *(Unsound(op, "vllm", "0.24.0", "op_name", f"{op}_module", ("trtllm",),
              "vLLM 0.24.0's MLA module rows time RMSNorm's native op chain, which serving "
              "never runs (+34 % at 64 heads, 16 requests, 8K context, per the re-collection's "
              "own note), except on B200, re-collected with the fused ops (its "
              "collection_meta.yaml: norm_dispatch): there vLLM's and TensorRT-LLM's modules "
              "agree (DeepSeek-V3, 16 heads, 4 requests over 1K: 52 / 50 us), while vLLM's "
              "legacy rows take 2.0-2.3 x TensorRT-LLM's on every other system (B300 102 / 44 "
              "us, GB300 102 / 46, H200 117 / 55), twice its own B200 rows on the faster B300. "
              "TensorRT-LLM's module on the same system stands in (its own implementation of "
              "the same MLA block)", fixed_by="norm_dispatch")
      for op in ("mla_generation", "mla_context")),
)
"""Known-unsound measurements, with the figures that show it (docs/cost-model.md)."""


@dataclass(frozen=True)
class Unmeasured:
    """A kernel an engine runs that its own harness did not time, and the engines whose
    harnesses timed the same kernel on the same system: their rows join the engine's table,
    where the fastest kernel of a point counts as among its own (`Grid.build`)."""

    op: str
    engine: str
    column: str
    value: str
    """The engine's rows where `column` is `value` miss the kernel."""
    kernel: str
    """What the stand-in rows' kernel_source contains."""
    stand_ins: tuple[str, ...]
    """Engines whose rows of that value and kernel on the same system stand in, first found
    first, at the shapes the engine did not time that kernel at."""
    why: str
    shape: tuple[str, ...] = ("hidden_size", "inter_size", "num_experts", "topk")
    """The columns that name a shape."""
    within: Callable[[pd.DataFrame], Any] | None = None
    """The stand-in rows the engine runs that kernel at (None: all of them)."""


ALLREDUCE_ELEMENT_BYTES = DTYPE_BYTES["bf16"]
"""Bytes of one element of the all-reduce tables' `message_size`: the collectors record an
element count of bf16 ("element count, not bytes"), not bytes."""

FI_ALLREDUCE_FUSION_MAX_MB = {2: 64, 4: 2, 8: 1}
"""Largest all-reduce (MB, by TP size) vLLM hands to FlashInfer's fused all-reduce + RMSNorm
(`PassConfig.fi_allreduce_fusion_max_size_mb`'s defaults; Hopper's, the smaller: Blackwell's
TP4 limit is 32 MB). Larger ones take vLLM's own all-reduce."""


def _fi_allreduce_sizes(t: pd.DataFrame) -> Any:
    """Rows of an all-reduce table (message_size in bf16 elements) within FlashInfer's fusion
    limit for their GPU count."""
    limit = t.num_gpus.map(FI_ALLREDUCE_FUSION_MAX_MB).fillna(0) * 2 ** 20
    return (t.message_size * ALLREDUCE_ELEMENT_BYTES <= limit).to_numpy()


UNMEASURED = (
    Unmeasured("moe", "trtllm", "moe_dtype", "fp8_block", "flashinfer_trtllm", ("sglang", "vllm"),
               "TensorRT-LLM runs block-scaled FP8 experts on Blackwell with its trtllm-gen "
               "kernels (moe_config.backend TRTLLM: InferenceX's DeepSeek-R1 FP8 B200 recipes "
               "since 2026-01-29, `benchmarks/dsr1_fp8_b200_trt.sh`), but its collector timed "
               "only DeepGEMM for that dtype (1.3.0rc20 on B200, B300, GB200, GB300). SGLang's "
               "and vLLM's harnesses timed the same trtllm-gen kernels through FlashInfer and "
               "agree within 15 % (B200, DeepSeek's experts split over TP8: 42 / 48 us at 4 "
               "tokens, 156 / 161 us at 64, where DeepGEMM takes 135 and 425 us); DeepGEMM "
               "stays where it is faster (thousands of tokens, expert parallel), as the "
               "recipes pick it there"),
    Unmeasured("moe", "vllm", "moe_dtype", "w4a8_mxfp4_mxfp8", "flashinfer_trtllm",
               ("sglang", "trtllm"),
               "vLLM runs gpt-oss's MXFP4 experts on Blackwell with FlashInfer's trtllm-gen "
               "MXFP4 x MXFP8 kernel when VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1, as "
               "InferenceX's B200 recipe sets it (`benchmarks/single_node/gptoss_fp4_b200.sh`); "
               "vLLM 0.24.0's collector timed that kernel only at DeepSeek-V4's two shapes, and "
               "gpt-oss's (hidden 2880, 128 experts, top-4) only with BF16 activations. SGLang's "
               "harness timed the same FlashInfer kernel at gpt-oss's shape and TensorRT-LLM's "
               "its own MXFP4 x MXFP8 kernel: 155 / 148 us at 16 tokens on B200, where vLLM's "
               "BF16-activation rows take 204"),
    Unmeasured("allreduce", "vllm", "allreduce_dtype", "bfloat16", "TRTLLM", ("trtllm",),
               "vLLM fuses each TP all-reduce with the RMSNorm after it into FlashInfer's port "
               "of TensorRT-LLM's all-reduce kernel (the fuse_allreduce_rms pass, on by default "
               "at -O2 for TP > 1 on Hopper and Blackwell; InferenceX's gpt-oss B200 and "
               "Kimi-K2.5 recipes set it too) for messages up to FI_ALLREDUCE_FUSION_MAX_MB, "
               "but vLLM's collector timed only its own custom all-reduce. TensorRT-LLM's "
               "collector timed that kernel: 5.0 / 7.2 us at 1K / 256K elements over TP4 on "
               "B200, where vLLM's custom kernel takes 7.1 / 18.0",
               shape=("num_gpus",), within=_fi_allreduce_sizes),
)
"""Kernels an engine runs that its own tables lack (docs/cost-model.md)."""

FABRIC_SIBLINGS = {"gb300": "gb200"}
"""Hardware whose scale-up fabric is another's: GB300 NVL72 and GB200 NVL72 share NVLink 5 over
the same NVSwitch trays (72 GPUs at 1.8 TB/s each), so an exchange over it measured on the
sibling prices theirs where their own data has none (flagged extrapolated)."""

STAND_IN = "_measured_by"
"""Column naming the table a stand-in row (`Unsound.stand_ins`) came from."""

# DeepSeek-V3's MLA block, the model the shipped MLA module tables were measured on.
DSV3_MLA = {"hidden": 7168, "q_lora": 1536, "kv_lora": 512, "nope": 128, "rope": 64, "v": 128}


@dataclass(frozen=True)
class Priced:
    """Latency of one operation for each queried point, and where the numbers came from."""

    ms: np.ndarray
    """Milliseconds per query point."""
    source: str
    """Least trustworthy provenance among the points (measured, interpolated, extrapolated,
    roofline)."""
    table: str
    """The table that priced it (system/op/engine/version), or 'roofline'."""
    codes: np.ndarray | None = None
    """Each point's provenance (an index into SOURCES) where the pricing knows it point by
    point; None: `source` for every point. Operation prices kept per point take it, so that
    a point priced among others keeps its own provenance."""

    def point_codes(self) -> np.ndarray:
        """Each point's provenance index, `source`'s where no point's own is known."""
        if self.codes is not None:
            return np.broadcast_to(self.codes, np.shape(self.ms))
        return np.full(np.shape(self.ms), SOURCES.index(self.source))

    def carried(self, ms: np.ndarray, beyond: np.ndarray) -> Priced:
        """`ms` in place of this price, where the points `beyond` were carried past the
        table's range (flagged extrapolated) and the others keep their own provenance."""
        own = self.point_codes()
        codes = np.where(beyond, np.maximum(own, EXTRAPOLATED), own)
        return Priced(ms, SOURCES[int(codes.max())], self.table, codes)

    def scaled(self, factor: float | np.ndarray) -> Priced:
        return Priced(self.ms * factor, self.source, self.table, self.codes)

    def transferred(self, own: np.ndarray, roof: np.ndarray) -> Priced:
        """A roofline `own` at the efficiency this price reaches over its own roofline `roof`,
        flagged extrapolated (another kernel's or shape's measurement)."""
        return Priced(own * self.ms / roof,
                      SOURCES[max(SOURCES.index(self.source), EXTRAPOLATED)], self.table,
                      None if self.codes is None else np.maximum(self.codes, EXTRAPOLATED))

    @staticmethod
    def total(parts: list[Priced]) -> Priced:
        """Several operations run one after another: their summed time, the least trustworthy
        provenance among them (point by point), and their tables."""
        tables = list(dict.fromkeys(p.table for p in parts))
        ms = sum((p.ms for p in parts), np.zeros(1))
        codes = np.max([np.broadcast_to(p.point_codes(), ms.shape) for p in parts], axis=0)
        return Priced(ms, SOURCES[int(codes.max())], " + ".join(tables), codes)


GPU_FAMILY = {"h100": "sm90", "h200": "sm90", **dict.fromkeys(SM100_HARDWARE, "sm100")}
"""Hardware preset -> its GPUs' CUDA family (Hopper sm_90, Blackwell datacenter sm_10x)."""

INDEXER_ROW_PAIRS: dict[str, Callable[[int], bool]] = {
    "sm100": lambda rows: True,
    "sm90": lambda rows: rows in (1, 2, 4),
}
"""GPU family -> whether the sparse indexer of a decode step reads a request's index keys once
for each pair of its query rows (1 + draft tokens), as vLLM runs DeepSeek-V4.1's indexer on
DeepGEMM's paged MQA logits: on Blackwell every request's rows go through the kernel's varlen
layout, whose scheduler takes two adjacent rows of one request together and loads their keys
once (`kNextNAtom` 2 in DeepGEMM's scheduler/paged_mqa_logits.cuh; vLLM's
`_supports_varlen_paged_mqa_logits`, vllm/v1/attention/backends/mla/indexer.py); on Hopper
only a native next_n of 1, 2 or 4 pairs its rows (`_supports_native_decode`), any other count
is flattened to one row a request. Elsewhere every row reads its own keys. Compute stays per
row."""


def indexer_key_reads(hardware: str, rows: int) -> float:
    """Times a decode request's index keys are read per step, per query row of its `rows`:
    ceil(rows / 2) / rows where the rows pair (INDEXER_ROW_PAIRS), else 1."""
    pairs = INDEXER_ROW_PAIRS.get(GPU_FAMILY.get(hardware.lower(), ""))
    if rows <= 1 or pairs is None or not pairs(rows):
        return 1.0
    return math.ceil(rows / 2) / rows


def mla_shape_params(hidden: int, q_lora: int, kv_lora: int, nope: int, rope: int,
                     v: int) -> tuple[float, float]:
    """(params shared by all heads, params per head) of an MLA block's projections."""
    shared = hidden * q_lora + hidden * (kv_lora + rope)
    per_head = q_lora * (nope + rope) + kv_lora * (nope + v) + v * hidden
    return float(shared), float(per_head)


MEASURED_HIDDEN = {"DeepSeek-V3.2": 7168, "GLM-5": 6144, "DeepSeek-V4-Flash-FP8": 4096,
                   "DeepSeek-V4-Flash": 4096, "DeepSeek-V4-Pro": 7168}
"""Hidden size of the models the sparse-attention tables name in their `model` column, to
pick a model's own rows where a table spans several."""


def _v4_proxy(m: ModelSpec) -> ModelSpec:
    """The DeepSeek-V4 preset whose measured attention kernels price a V4.1 model's: the one
    with as many attention heads, else the nearest hidden size (V4.1-Flash: V4-Flash)."""
    v4 = [load_model(name) for name in ("deepseek-v4-flash", "deepseek-v4-pro")]
    same = [x for x in v4 if x.num_attention_heads == m.num_attention_heads] or v4
    return min(same, key=lambda x: abs(math.log(x.hidden / m.hidden)))


_PROXIES: dict[int, tuple[Instance, Instance]] = {}
"""id(instance) -> (the instance, kept so that its id stays its own; `_v4_instance` of it)."""


def _v4_instance(inst: Instance) -> Instance:
    """`inst` with its V4.1 model's V4 proxy and an fp8 cache, whose measured kernels price its
    layers (the same instance every time for one instance: a V4.1 step asks for it per
    layer kind)."""
    return per_object(_PROXIES, inst,
                      lambda: replace(inst, model=_v4_proxy(inst.model), kv_cache="fp8"))


def _longest_at(edges: tuple[np.ndarray, np.ndarray], batch: np.ndarray) -> np.ndarray:
    """The longest context a table measured at each queried batch, from its (batches, longest
    context at each): that of the nearest measured batch at or above it (the largest
    batch's past the last)."""
    levels, longest = edges
    return longest[np.clip(np.searchsorted(levels, batch), 0, len(levels) - 1)]


def _measured_kv(kv_dtype: str) -> tuple[str, int]:
    """The KV dtype whose rows price `kv_dtype`: itself, or fp8 for fp4 KV (no GQA/MLA table
    measures an fp4 cache; the roofline carries the smaller reads), flagged extrapolated."""
    return ("fp8", EXTRAPOLATED) if kv_dtype == "fp4" else (kv_dtype, 0)


def _rows_dtype(rows: pd.DataFrame, col: str, table: dict[str, list[str]],
                asked: str | None = None) -> str:
    """Our name for the dtype the rows were measured in (the rows one `_pick_dtype` level
    keeps share it): `asked` where its own rows are these (int4_wo is INT4's and, on Hopper,
    fp4's). Their roofline takes this dtype, not the one asked for, so that a dtype transfer
    carries the kernel's efficiency (a fallback fp8 row prices fp4 at fp8's fraction of the fp4
    roofline) rather than its latency."""
    got = rows[col].iloc[0] if len(rows) else None
    if asked is not None and got in table.get(asked, ()):
        return asked
    return next((ours for ours, names in table.items() if got in names), "bf16")


def _exact_int4(rows: pd.DataFrame, dtype: str, shape: dict[str, float],
                hw: HardwareSpec) -> pd.DataFrame:
    """Of the MoE rows one `_pick_dtype` level keeps for `dtype`: for fp4 experts, the
    WEIGHT_ONLY_INT4 ones alone where only they measured `shape` (hidden, inter, top-k,
    experts) on `hw` without fp4 tensor cores, else the others alone; the rows as they are for
    any other dtype."""
    int4 = (rows.moe_dtype == WEIGHT_ONLY_INT4).to_numpy()
    if dtype != "fp4" or not int4.any():
        return rows
    if "fp4" in hw.peak_tflops:
        return rows[~int4]
    exact = np.ones(len(rows), dtype=bool)
    for col, value in shape.items():
        exact &= rows[col].to_numpy() == value
    only_int4 = (exact & int4).any() and not (exact & ~int4).any()
    return rows[int4 if only_int4 else ~int4]


def _version_key(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.replace("rc", ".").replace(".post", ".").split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _read_parquet(path: Path) -> pd.DataFrame:
    import pandas as pd

    return pd.read_parquet(path)


def _pack_grid(built: tuple[Grid, int, str] | None) -> dict[str, np.ndarray]:
    """A `_grid` result as arrays for the cache (none for no table)."""
    if built is None:
        return {}
    grid, floor, label = built
    return {**grid.to_arrays(), "floor": np.array(floor), "label": np.array(label)}


def _unpack_grid(arrays: dict[str, np.ndarray]) -> tuple[Grid, int, str] | None:
    if not arrays:
        return None
    return Grid.from_arrays(arrays), int(arrays["floor"]), str(arrays["label"])


def aic_system_dir(system: str) -> Path:
    """The measured-data folder of one system inside the aiconfigurator-core package."""
    return Path(str(resources.files("aiconfigurator_core"))) / "systems" / "data" / system


@dataclass
class Calibration:
    """Per-operation latency for one hardware and engine; tables loaded once and cached."""

    hardware: HardwareSpec
    engine: str
    version: str | None = None
    """Engine version to prefer; None: the newest table per op."""
    user_dir: Path | None = None
    """Tables written by `rackplan calibrate`, preferred over the shipped ones."""
    _frames: dict[str, tuple[pd.DataFrame, str] | None] = field(default_factory=dict, repr=False)
    _grids: dict[tuple[Any, ...], tuple[Grid, int, str] | None] = field(
        default_factory=dict, repr=False)
    _found: dict[str, bool] = field(default_factory=dict, repr=False)
    """op -> whether any table covers it (`_has_table`, looked up once)."""
    _rates: dict[tuple[Any, ...], float] = field(default_factory=dict, repr=False)
    """Sustained rate (roofline / measured) of a long-context kernel's table."""
    _edges: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray] | None] = field(
        default_factory=dict, repr=False)
    """Longest measured context per batch size of a module table, or of the top-k table's
    one-token runs (`_topk_decode_edges`; None: no table)."""
    _v4_csas: dict[tuple[Any, ...], tuple[Instance, Priced, np.ndarray]] = field(
        default_factory=dict, repr=False)
    """`_v4_csa` by its points: (the proxy instance, kept so that its id stays its own; V4's
    CSA module price; its roofline)."""

    # ---- table discovery ---------------------------------------------------------------------

    def _locate(self, op: str, engines: tuple[str, ...] | None = None,
                user: bool = True) -> tuple[Path, str] | None:
        folder, fname = OP_FILES[op]
        roots: list[tuple[Path, str]] = []
        if self.user_dir is not None and user:
            roots.append((self.user_dir / folder, "user"))
        if self.hardware.system:
            roots.append((aic_system_dir(self.hardware.system) / folder, self.hardware.system))
        if engines is None:
            engines = OP_ENGINES.get(op, tuple(dict.fromkeys((self.engine, "vllm"))))
        for root, label in roots:
            for engine in engines:
                base = root / engine
                if not base.is_dir():
                    continue
                versions = sorted((p.name for p in base.iterdir() if (p / fname).is_file()),
                                  key=_version_key)
                if not versions:
                    continue
                pick = self.version if self.version in versions else versions[-1]
                return base / pick / fname, f"{label}/{folder}/{engine}/{pick}"
        return None

    def _table_files(self, op: str) -> list[Path]:
        """Every file a price of `op` may read: its table at each engine and version, in the
        user folder and in the shipped data (what a cached value of `op` is keyed on)."""
        folder, fname = OP_FILES[op]
        roots = [self.user_dir / folder] if self.user_dir is not None else []
        if self.hardware.system:
            roots.append(aic_system_dir(self.hardware.system) / folder)
        return [p for root in roots if root.is_dir() for p in root.glob(f"*/*/{fname}")]

    def _has_table(self, op: str) -> bool:
        """Whether any table covers `op`: the engine's own, or another engine's (what `frame`
        and `_other_frames` would find), without reading one."""
        if op not in self._found:
            self._found[op] = self._locate(op) is not None or (op not in OP_ENGINES and any(
                self._locate(op, (e,), user=False) is not None for e in ENGINES))
        return self._found[op]

    def frame(self, op: str) -> tuple[pd.DataFrame, str] | None:
        """The table of an op and its label, or None when no table covers it."""
        if op not in self._frames:
            found = self._locate(op)
            self._frames[op] = None if found is None else self._read(op, *found)
        return self._frames[op]

    def _read(self, op: str, path: Path, label: str) -> tuple[pd.DataFrame, str]:
        """A shipped table without its `UNSOUND` rows, the same kernel's rows measured by a
        stand-in engine on the same system in their place (their table in `STAND_IN`), and
        with the `UNMEASURED` kernels' rows measured by one; the user's own tables as they
        are."""
        df = _read_parquet(path)
        parts = label.split("/")
        if parts[0] == "user":
            return df, label
        import pandas as pd

        meta = path.parent / "collection_meta.yaml"
        notes = meta.read_text() if meta.is_file() else ""
        for u in UNSOUND:
            if (u.op, u.engine, u.version) != (op, *parts[2:4]) or (
                    u.fixed_by and u.fixed_by in notes):
                continue
            df = df[df[u.column] != u.value]

            def same(t: pd.DataFrame, u: Unsound = u) -> Any:
                return t[u.column] == u.value

            alt = self._stand_in(op, u.stand_ins, list(df), same)
            if alt is not None:
                df = pd.concat([df, alt], ignore_index=True)
        for m in UNMEASURED:  # only beside the engine's own rows of that value
            if (m.op, m.engine) != (op, parts[2]):
                continue
            value = df[m.column] == m.value
            if not value.any():
                continue
            # shapes the engine timed the kernel at itself keep its own rows alone
            own = df.loc[value & df.kernel_source.astype(str).str.contains(m.kernel),
                         list(m.shape)].drop_duplicates()

            def keep(t: pd.DataFrame, m: Unmeasured = m, own: pd.DataFrame = own) -> Any:
                timed = t[list(m.shape)].merge(own, how="left", indicator=True)
                return ((t[m.column] == m.value).to_numpy()
                        & t.kernel_source.astype(str).str.contains(m.kernel).to_numpy()
                        & (timed["_merge"] == "left_only").to_numpy()
                        & (True if m.within is None else m.within(t)))

            alt = self._stand_in(op, m.stand_ins, list(df), keep)
            if alt is not None:
                df = pd.concat([df, alt], ignore_index=True)
        return df, label

    def _stand_in(self, op: str, engines: tuple[str, ...], columns: list[str],
                  keep: Callable[[pd.DataFrame], Any]) -> pd.DataFrame | None:
        """The rows `keep` selects of the first of `engines`' shipped tables of `op` on this
        system that has any, in `columns`, labelled with their table (`STAND_IN`)."""
        for engine in engines:
            found = self._locate(op, (engine,), user=False)
            if found is None:
                continue
            alt = _read_parquet(found[0])
            alt = alt.loc[keep(alt), [c for c in columns if c in alt]]
            if len(alt):
                return alt.assign(**{STAND_IN: found[1]})
        return None

    def _version_frames(self, op: str) -> list[tuple[pd.DataFrame, str]]:
        """The engine's own tables of `op` at its other shipped versions, newest first."""
        own = self.frame(op)
        if own is None or not self.hardware.system or own[1].startswith("user/"):
            return []
        folder, fname = OP_FILES[op]
        engine, picked = own[1].split("/")[2:4]
        base = aic_system_dir(self.hardware.system) / folder / engine
        versions = sorted((p.name for p in base.iterdir() if (p / fname).is_file()
                           and p.name != picked), key=_version_key, reverse=True)
        out = []
        for v in versions:
            key = f"{op}@{engine}@{v}"
            if key not in self._frames:
                self._frames[key] = self._read(op, base / v / fname,
                                               f"{self.hardware.system}/{folder}/{engine}/{v}")
            got = self._frames[key]
            if got is not None:
                out.append(got)
        return out

    def _other_frames(self, op: str) -> list[tuple[pd.DataFrame, str]]:
        """The same op measured on the same system by the other engines, for shapes or dtypes
        the engine's own table lacks."""
        if op in OP_ENGINES:
            return []
        own = self.frame(op)
        out = []
        for engine in ENGINES:
            key = f"{op}@{engine}"
            if key not in self._frames:
                found = self._locate(op, (engine,), user=False)
                self._frames[key] = None if found is None else self._read(op, *found)
            got = self._frames[key]
            if got is not None and (own is None or got[1] != own[1]):
                out.append(got)
        return out

    def load_all(self) -> Calibration:
        """Read every table now (otherwise each is read on first use)."""
        for op in OP_FILES:
            self.frame(op)
        return self

    def _grid(self, key: tuple[Any, ...], op: str,
              select: Callable[[pd.DataFrame], tuple[pd.DataFrame, int]],
              axes: list[str],
              roof: Callable[[pd.DataFrame], np.ndarray]) -> tuple[Grid, int, str] | None:
        """A cached Grid for the rows `select` keeps; the int is the provenance floor. Kept
        per process, and on disk keyed by `select`, `roof` and the table files.

        Preference, with the choice in the label: (a) the engine's own table at the pinned (or
        newest) version, (b) its own table at another version that measured the shape and
        dtype, (c) another engine's measurement of the same kernel on the same system, (d) a
        shape or dtype transfer inside the engine's own table, (e) the roofline (no table)."""
        if key not in self._grids:

            def build(got: tuple[pd.DataFrame, str] | None) -> tuple[Grid, int, str] | None:
                if got is None:
                    return None
                df, label = got
                rows, floor = select(df)
                if not len(rows):
                    return None
                if STAND_IN in rows:  # the label names the stand-ins' tables too
                    label = " + ".join([label, *sorted(rows[STAND_IN].dropna().unique())])
                rows = rows.assign(latency=rows["latency"] * LATENCY_UNIT_MS.get(op, 1.0))
                pts = rows[axes].to_numpy(dtype=float)
                return Grid.build(pts, rows["latency"].to_numpy(float), roof(rows)), floor, label

            def preferred() -> dict[str, np.ndarray]:
                built = build(self.frame(op))
                if built is None or built[1] >= EXTRAPOLATED:
                    for other in [*self._version_frames(op), *self._other_frames(op)]:
                        alt = build(other)
                        if alt is not None and alt[1] < EXTRAPOLATED:
                            built = alt
                            break
                return _pack_grid(built)

            self._grids[key] = _unpack_grid(cached(("grid", op, key, axes, select, roof, self),
                                                   self._table_files(op), preferred))
        return self._grids[key]

    @staticmethod
    def _price(grid: tuple[Grid, int, str] | None, points: np.ndarray, roof: np.ndarray,
               default_eff: float) -> Priced:
        if grid is None:
            return Priced(np.asarray(roof, dtype=float) / default_eff, SOURCES[ROOFLINE],
                          "roofline")
        g, floor, label = grid
        ms, codes = g.query(points, roof, exact=floor < EXTRAPOLATED)
        codes = np.maximum(codes, floor)
        return Priced(ms, worst(codes), label, codes)

    # ---- row selection helpers ---------------------------------------------------------------

    @staticmethod
    def _pick_dtype(df: pd.DataFrame, col: str, table: dict[str, list[str]],
                    dtype: str) -> tuple[pd.DataFrame, int]:
        floor, d = 0, dtype
        while True:
            rows = df[df[col].isin(table[d])]
            if len(rows):
                return rows, floor
            if d not in FALLBACK:
                return rows, floor
            d, floor = FALLBACK[d], EXTRAPOLATED

    @staticmethod
    def _nearest(df: pd.DataFrame, want: dict[str, float]) -> tuple[pd.DataFrame, int]:
        """Rows whose shape columns equal `want`, else the nearest shape in log space."""
        if not len(df):
            return df, 0
        mask = np.ones(len(df), dtype=bool)
        for c, v in want.items():
            mask &= df[c].to_numpy() == v
        if mask.any():
            return df[mask], 0
        shapes = df[list(want)].drop_duplicates().to_numpy(dtype=float)
        target = np.log(np.maximum(np.array(list(want.values()), dtype=float), 1))
        best = shapes[np.argmin(np.abs(np.log(np.maximum(shapes, 1)) - target).sum(axis=1))]
        mask = np.ones(len(df), dtype=bool)
        for c, v in zip(want, best, strict=True):
            mask &= df[c].to_numpy() == v
        return df[mask], EXTRAPOLATED

    # ---- operations --------------------------------------------------------------------------

    def gemm(self, m: np.ndarray | float, n: int, k: int, dtype: str) -> Priced:
        """Dense GEMM [m, k] x [k, n] in a weight dtype (bf16, fp8, fp4; int4 deployments'
        dense layers are bf16: `dense_dtype`)."""
        hw = self.hardware
        dtype = dense_dtype(dtype)

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            return self._pick_dtype(df, "gemm_dtype", GEMM_DTYPES, dtype)

        grid = self._grid(("gemm", dtype), "gemm", select, ["m", "n", "k"],
                          lambda r: rf.gemm(hw, r.m, r.n, r.k,
                                            _rows_dtype(r, "gemm_dtype", GEMM_DTYPES)))
        m = np.atleast_1d(np.asarray(m, dtype=float))
        idle = m <= 0  # a rank with no tokens this step (lock-step DP) does no GEMM
        m = np.maximum(m, 1.0)
        pts = np.stack([m, np.full_like(m, n), np.full_like(m, k)], axis=1)
        got = self._price(grid, pts, rf.gemm(hw, m, n, k, dtype), 0.6)
        return got.scaled(~idle) if idle.any() else got

    def gemm_chain(self, m: np.ndarray | float,
                   shapes: tuple[tuple[int, int, int, str], ...]) -> Priced:
        """GEMMs that run one after another on the same rows, summed (`Priced.total`): for
        each (rows per row of `m`, n, k, dtype) of `shapes`, [m x rows, k] x [k, n]. One
        operation for the price cache, which keeps the sum per point instead of each GEMM's."""
        m = np.atleast_1d(np.asarray(m, dtype=float))
        return Priced.total([self.gemm(m * rows, n, k, dtype) for rows, n, k, dtype in shapes])

    def moe(self, tokens: np.ndarray | float, hidden: int, inter: int, topk: int, experts: int,
            ep: int, dtype: str, tp: int = 1) -> Priced:
        """MoE grouped GEMM on one rank; `tokens` = tokens over the EP group, balanced.

        Experts are split over `ep` ranks (expert parallel) or each expert over `tp` ranks.

        A rank that receives R token-to-expert assignments costs what a balanced group of
        R * ep / topk tokens costs: pass that to price an imbalanced rank.
        """
        hw = self.hardware

        shape: dict[str, float] = {"hidden_size": hidden, "inter_size": inter, "topk": topk,
                                   "num_experts": experts}

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            rows, floor = self._pick_dtype(df[(df.moe_tp_size == 1) | (df.moe_ep_size == 1)],
                                           "moe_dtype", MOE_DTYPES, dtype)
            rows = _exact_int4(rows, dtype, shape, hw)
            dist = "balanced" if (rows.distribution == "balanced").any() else "power_law_1.01"
            rows, f2 = self._nearest(rows[rows.distribution == dist], shape)
            return rows, max(floor, f2)

        def roof(r: pd.DataFrame) -> np.ndarray:
            return rf.moe(hw, r.num_tokens, r.hidden_size.to_numpy(), r.inter_size.to_numpy(),
                          r.topk.to_numpy(), r.num_experts.to_numpy(), r.moe_ep_size,
                          _rows_dtype(r, "moe_dtype", MOE_DTYPES, dtype), r.moe_tp_size.to_numpy())

        grid = self._grid(("moe", hidden, inter, topk, experts, dtype), "moe", select,
                          ["num_tokens", "moe_ep_size", "moe_tp_size"], roof)
        t = np.maximum(np.atleast_1d(np.asarray(tokens, dtype=float)), 1.0)
        pts = np.stack([t, np.full_like(t, ep), np.full_like(t, tp)], axis=1)
        return self._price(grid, pts,
                           rf.moe(hw, t, hidden, inter, topk, experts, ep, dtype, tp), 0.5)

    def moe_wideep(self, tokens: np.ndarray | float, hidden: int, inter: int, topk: int,
                   experts: int, ep: int, dtype: str, low_latency: bool) -> Priced:
        """Expert compute of one rank behind a DeepEP dispatch (wide EP): it runs only the
        tokens routed to its own experts. `tokens` counts tokens over the EP group, balanced;
        the low-latency table prices decode, the normal one prefill."""
        hw = self.hardware
        op = "moe_wideep_generation" if low_latency else "moe_wideep_context"

        shape: dict[str, float] = {"hidden_size": hidden, "inter_size": inter, "topk": topk,
                                   "num_experts": experts}

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            rows, floor = self._pick_dtype(df, "moe_dtype", MOE_DTYPES, dtype)
            rows = _exact_int4(rows, dtype, shape, hw)
            rows, f2 = self._nearest(rows[rows.distribution == "uniform"], shape)
            return rows, max(floor, f2)

        def roof(r: pd.DataFrame) -> np.ndarray:
            return rf.moe(hw, r.num_tokens, r.hidden_size.to_numpy(), r.inter_size.to_numpy(),
                          r.topk.to_numpy(), r.num_experts.to_numpy(), r.moe_ep_size,
                          _rows_dtype(r, "moe_dtype", MOE_DTYPES, dtype))

        grid = self._grid((op, hidden, inter, topk, experts, dtype), op, select,
                          ["num_tokens", "moe_ep_size"], roof)
        t = np.maximum(np.atleast_1d(np.asarray(tokens, dtype=float)), 1.0)
        pts = np.stack([t, np.full_like(t, ep)], axis=1)
        return self._price(grid, pts, rf.moe(hw, t, hidden, inter, topk, experts, ep, dtype),
                           0.5)

    def _gqa(self, op: str, batch: np.ndarray | float, length: np.ndarray | float, heads: int,
             kv_heads: int, head_dim: int, kv_dtype: str, window: int) -> Priced:
        hw = self.hardware
        axis = "isl" if op == "attention_context" else "step"
        fn = rf.attention_context if op == "attention_context" else rf.attention_generation

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            kvd, floor = _measured_kv(kv_dtype)
            rows = df[(df.kv_cache_dtype == KV_DTYPES[kvd]) & (df.window_size == window)]
            rows, f2 = self._nearest(rows, {"head_dim": head_dim, "num_key_value_heads": kv_heads})
            return rows, max(floor, f2)

        def roof(r: pd.DataFrame) -> np.ndarray:  # at the KV dtype the rows measured
            return fn(hw, r.batch_size, r[axis], r.num_heads.to_numpy(),
                      r.num_key_value_heads.to_numpy(), r.head_dim.to_numpy(),
                      _measured_kv(kv_dtype)[0])

        grid = self._grid((op, kv_heads, head_dim, kv_dtype, window), op, select,
                          ["batch_size", axis, "num_heads"], roof)
        b, s = np.broadcast_arrays(np.atleast_1d(np.asarray(batch, dtype=float)),
                                   np.atleast_1d(np.asarray(length, dtype=float)))
        b, s = np.maximum(b, 1.0), np.maximum(s, 1.0)
        pts = np.stack([b, s, np.full_like(b, heads)], axis=1)
        return self._price(grid, pts, fn(hw, b, s, heads, kv_heads, head_dim, kv_dtype), 0.4)

    def attention_context(self, batch: np.ndarray | float, isl: np.ndarray | float, heads: int,
                          kv_heads: int, head_dim: int, kv_dtype: str, window: int = 0) -> Priced:
        """GQA prefill attention kernel: `batch` requests of `isl` new tokens, heads per rank."""
        return self._gqa("attention_context", batch, isl, heads, kv_heads, head_dim, kv_dtype,
                         window)

    def attention_generation(self, batch: np.ndarray | float, context: np.ndarray | float,
                             heads: int, kv_heads: int, head_dim: int, kv_dtype: str,
                             window: int = 0) -> Priced:
        """GQA decode attention kernel: `batch` requests over `context` cached tokens."""
        return self._gqa("attention_generation", batch, context, heads, kv_heads, head_dim,
                         kv_dtype, window)

    def _mla(self, op: str, batch: np.ndarray | float, length: np.ndarray | float, heads: int,
             shape: dict[str, int], weights: str, kv_dtype: str) -> Priced:
        hw = self.hardware
        weights = dense_dtype(weights)  # an int4 checkpoint's attention is bf16
        context = op == "mla_context"
        axis = "isl" if context else "step"

        def roof_for(s: dict[str, int], b: Any, n: Any, h: Any, kv: str) -> np.ndarray:
            shared, per_head = mla_shape_params(s["hidden"], s["q_lora"], s["kv_lora"],
                                                s["nope"], s["rope"], s["v"])
            new = n if context else 1.0
            return rf.mla_module(hw, b, new, n, h, per_head, shared, s["kv_lora"], s["rope"],
                                 weights, kv)

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            kvd, floor = _measured_kv(kv_dtype)
            rows = df[(df.kv_cache_dtype == KV_DTYPES[kvd])
                      & (df.gemm_type == MLA_GEMM[weights])]
            if context:
                rows = rows[rows.step == 0]
            return rows, max(floor, 0 if shape == DSV3_MLA else EXTRAPOLATED)

        grid = self._grid((op, weights, kv_dtype, tuple(shape.items())), op, select,
                          ["batch_size", axis, "num_heads"],
                          lambda r: roof_for(DSV3_MLA, r.batch_size, r[axis],
                                             r.num_heads.to_numpy(), _measured_kv(kv_dtype)[0]))
        b, s = np.broadcast_arrays(np.atleast_1d(np.asarray(batch, dtype=float)),
                                   np.atleast_1d(np.asarray(length, dtype=float)))
        b, s = np.maximum(b, 1.0), np.maximum(s, 1.0)
        pts = np.stack([b, s, np.full_like(b, heads)], axis=1)
        return self._price(grid, pts, roof_for(shape, b, s, heads, kv_dtype), 0.4)

    def mla_context(self, batch: np.ndarray | float, isl: np.ndarray | float, heads: int,
                    shape: dict[str, int], weights: str, kv_dtype: str) -> Priced:
        """Whole MLA block (projections + attention) for prefill of `isl` tokens per request."""
        return self._mla("mla_context", batch, isl, heads, shape, weights, kv_dtype)

    def mla_generation(self, batch: np.ndarray | float, context: np.ndarray | float, heads: int,
                       shape: dict[str, int], weights: str, kv_dtype: str) -> Priced:
        """Whole MLA block for one decode token per request over `context` cached tokens."""
        return self._mla("mla_generation", batch, context, heads, shape, weights, kv_dtype)

    def _module_rows(self, df: pd.DataFrame, m: ModelSpec, kv_dtype: str,
                     gemm: str) -> tuple[pd.DataFrame, int]:
        """Rows of a sparse-attention module table measured on `m`'s architecture and head
        count (any TP split of it), in the KV and GEMM dtypes when measured; floor
        extrapolated when another shape or dtype stands in."""
        floor = 0
        rows = df[df.architecture == m.architecture]
        if "tp_size" in rows.columns and (rows.tp_size > 1).any():
            same = rows[rows.num_heads * rows.tp_size == m.num_attention_heads]
        else:  # the table emulates TP by its local head count: pick the model by name
            same = rows[[MEASURED_HIDDEN.get(str(x).split("/")[-1], 0) == m.hidden
                         for x in rows.model]]
        if len(same):
            rows = same
        elif len(rows):
            floor = EXTRAPOLATED
        else:
            rows, floor = df, EXTRAPOLATED
        for col, want in (("kv_cache_dtype", KV_DTYPES.get(kv_dtype, "fp8")),
                          ("gemm_type", gemm)):
            pick = rows[rows[col] == want]
            if len(pick):
                rows = pick
            else:
                floor = EXTRAPOLATED
                rows = rows[rows[col] == rows[col].iloc[0]]
        return rows, floor

    def _sparse(self, op: str, key: tuple[Any, ...], m: ModelSpec, kv_dtype: str, gemm: str,
                context: bool, batch: np.ndarray, new: np.ndarray, past: np.ndarray,
                heads: int, roof: Callable[[Any, Any, Any, Any], np.ndarray],
                floor_extra: int = 0) -> Priced | None:
        """A sparse-attention module table over (batch, isl, past, heads) in prefill or
        (batch, context, heads) in decode; None when no table ships."""
        if not self._has_table(op):
            return None
        # Prefill axes: new tokens and where the chunk ends (past + new, positive on log axes).
        axes = ["batch_size", "isl", "end", "num_heads"] if context else [
            "batch_size", "step", "num_heads"]

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            rows, floor = self._module_rows(df, m, kv_dtype, gemm)
            return rows.assign(end=rows.step + rows.isl), floor

        def table_roof(r: pd.DataFrame) -> np.ndarray:
            if context:
                return roof(r.batch_size, r.isl, r.step, r.num_heads.to_numpy())
            return roof(r.batch_size, np.ones(len(r)), r.step, r.num_heads.to_numpy())

        grid = self._grid(key, op, select, axes, table_roof)
        b, n, p = np.broadcast_arrays(*(np.atleast_1d(np.asarray(v, dtype=float))
                                        for v in (batch, new, past)))
        b, n = np.maximum(b, 1.0), np.maximum(n, 1.0)
        h = np.full_like(b, heads)
        if context:
            pts = np.stack([b, n, np.maximum(p, 0.0) + n, h], axis=1)
        else:
            pts = np.stack([b, np.maximum(p, 1.0), h], axis=1)
        got = self._price(grid, pts, roof(b, n, p, h), 0.3)
        if floor_extra and got.source in SOURCES[:EXTRAPOLATED]:
            got = Priced(got.ms, SOURCES[EXTRAPOLATED], got.table)
        return got

    def dsv4_module(self, kind: DSV4, context: bool, inst: Instance, batch: np.ndarray,
                    new: np.ndarray, past: np.ndarray) -> Priced:
        """One DeepSeek-V4 attention layer of `kind` (projections, compressor, indexer and
        attention) from the measured dsv4 module tables; an SWA-only layer from the HCA table at
        a window-length context (flagged extrapolated). Past the module's measured contexts a
        CSA layer grows by its indexer's scoring and its rows' top-k selection (`dsv4_topk`,
        `dsv4_decode_topk`); inside them the module's measurement, selection included,
        stands."""
        m = inst.model
        heads = max(m.num_attention_heads // inst.tp, 1)
        swa = kind.ratio == 0
        fam = "csa" if kind.ratio == 4 else "hca"
        op = f"dsv4_{fam}_{'context' if context else 'generation'}"
        roof = self._dsv4_module_roof(kind, inst)
        if swa:  # the window is all an SWA layer reads, whatever the context
            past = np.minimum(past, m.sliding_window)
        key = (op, m.architecture, m.num_attention_heads, inst.kv_cache, inst.indexer_cache,
               inst.tp)
        b, n, p = np.broadcast_arrays(*(np.atleast_1d(np.asarray(v, dtype=float))
                                        for v in (batch, new, past)))
        # Beyond the module table's measured contexts the layer grows by what its long-context
        # kernel reads: the module at its last measured context plus the growth of the indexer
        # (CSA) or of the compressed attention (HCA) kernel from there on.
        edge = self._edge(op, key, m, inst.kv_cache, "step" if not context else "end", b)
        inside = np.maximum(np.minimum(p + (n if context else 0), edge) - (n if context else 0),
                            0.0) if not swa else p
        got = self._sparse(op, key, m, inst.kv_cache, "fp8_block", context, b, n, inside,
                           heads, roof, floor_extra=int(swa))
        assert got is not None  # roofline when no table ships
        beyond = p > inside
        if swa or not beyond.any():
            return got
        kernel = "dsv4_indexer" if kind.ratio == 4 else "dsv4_hca_attn"
        kn = n if context else np.ones_like(n)
        # the kernel's own measurements where they reach (its table spans far longer contexts
        # than the module's), its sustained rate beyond them
        grow = np.maximum(self.dsv4_kernel(kernel, inst, b, kn, p).ms
                          - self.dsv4_kernel(kernel, inst, b, kn, inside).ms, 0.0)
        if kind.ratio == 4:  # and each query row's top-k selection among more keys
            k = len(b)  # both contexts in one query
            both = self.dsv4_selection(context, inst, np.concatenate([b, b]),
                                       np.concatenate([n, n]), np.concatenate([p, inside])).ms
            grow = grow + np.maximum(both[:k] - both[k:], 0.0)
        return got.carried(got.ms + np.where(beyond, grow, 0.0), beyond)

    def _dsv4_module_roof(self, kind: DSV4, inst: Instance
                          ) -> Callable[[Any, Any, Any, Any], np.ndarray]:
        """The roofline of one V4 attention layer of `kind` on `inst` at (batch, new, past,
        local heads): an SWA-only layer as HCA's, whose module prices it."""
        m = inst.model
        entry = kind.entry_bytes(m, inst.kv_cache)
        proxy = kind_of("hca") if kind.ratio == 0 else kind
        params = proxy.params(m) / (1 if inst.expert_parallel else inst.tp)
        idx = INDEXER_KEY_BYTES[inst.indexer_cache](m.index_head_dim)
        hw = self.hardware
        r = getattr(proxy, "ratio", 0)

        def roof(b: Any, n: Any, p: Any, h: Any) -> np.ndarray:
            return rf.sparse_attention(
                hw, b, n, p, params=params, heads=h, qk_dim=m.head_dim, v_dim=m.head_dim,
                window=m.sliding_window, ratio=r, topk=m.sparse_topk if r == 4 else 0,
                index_heads=m.index_n_heads, index_dim=m.index_head_dim, entry_bytes=entry,
                index_bytes=idx)

        return roof

    def dsv41_module(self, kind: CSA2, context: bool, inst: Instance, batch: np.ndarray,
                     new: np.ndarray, past: np.ndarray) -> Priced:
        """One DeepSeek-V4.1 (CSA2) layer of `kind` but its indexer's scoring: projections,
        compressor and the window + top-k attention, by transfer from V4's measured CSA module
        (no shipped table measures V4.1). The V4 module is taken where it reads as many
        compressed entries (the same batch and new tokens after 4 x the records the V4.1
        layer reads: top-k at most; a window-only layer at its window), and its efficiency
        there (its own roofline over its measured time) applied to this layer's roofline (its
        heads, widths, record bytes). Flagged extrapolated."""
        m, hw = inst.model, self.hardware
        heads = max(m.num_attention_heads // inst.tp, 1)
        pinst = _v4_instance(inst)
        b, n, p = np.broadcast_arrays(*(np.atleast_1d(np.asarray(v, dtype=float))
                                        for v in (batch, new, past)))
        ratio = kind.reads
        p4 = (4 * np.minimum(p / ratio, m.sparse_topk) if ratio
              else np.minimum(p, m.sliding_window))
        v4, v4_roof = self._v4_csa(context, pinst, b, n, p4, heads)
        own = rf.sparse_attention(
            hw, b, n, p, params=kind.params(m) / (1 if inst.expert_parallel else inst.tp),
            heads=heads, qk_dim=m.head_dim, v_dim=m.head_dim, window=m.sliding_window,
            ratio=ratio, topk=m.sparse_topk if ratio else 0, index_heads=0, index_dim=0,
            entry_bytes=kind.record_bytes(m, inst.kv_cache), index_bytes=0.0,
            window_bytes=kind.window_bytes(m, inst.kv_cache))
        return v4.transferred(own, v4_roof)

    def _v4_csa(self, context: bool, pinst: Instance, b: np.ndarray, n: np.ndarray,
                p4: np.ndarray, heads: int) -> tuple[Priced, np.ndarray]:
        """V4's measured CSA module at (b, n, p4) on the proxy instance `pinst`, and its
        roofline there: what `dsv41_module` transfers, remembered per points (a V4.1 layer
        reads at most top-k records, so most contexts are one V4 point: 9 calls in 10 in an
        AgentX replay)."""
        key = (context, id(pinst), heads, b.shape, b.tobytes(), n.tobytes(), p4.tobytes())
        held = self._v4_csas.get(key)
        if held is None or held[0] is not pinst:
            csa = kind_of("csa")
            assert isinstance(csa, DSV4)
            v4 = self.dsv4_module(csa, context, pinst, b, n, p4)
            roof = self._dsv4_module_roof(csa, pinst)(b, n, p4, heads)
            v4.ms.setflags(write=False)  # shared by the calls that find it
            roof.setflags(write=False)
            if len(self._v4_csas) >= 100_000:
                self._v4_csas.clear()
            held = self._v4_csas[key] = (pinst, v4, roof)
        return held[1], held[2]

    def dsv41_indexer(self, kind: CSA2, context: bool, inst: Instance, batch: np.ndarray,
                      new: np.ndarray, past: np.ndarray) -> Priced | None:
        """The scoring of one DeepSeek-V4.1 layer's indexer (all its source's keys, or at most
        `candidate_pool` of them; None for a layer without one), by transfer from V4's
        measured indexer kernel (`dsv4_paged_mqa_logits`, beyond its range by what it reads
        and computes) at the context where it scores as many keys, its efficiency applied to
        this layer's roofline (its index heads and key bytes). In decode its keys are read once
        per pair of a request's query rows where the kernel pairs them (`indexer_key_reads`).
        Then each query row's selection of top-k among the keys it scored (`dsv4_topk` in
        prefill, `dsv4_decode_topk` in decode). Flagged extrapolated."""
        if kind.index == "none":
            return None
        m, hw = inst.model, self.hardware
        heads = max(m.num_attention_heads // inst.tp, 1)
        pinst = _v4_instance(inst)
        b, n, p = np.broadcast_arrays(*(np.atleast_1d(np.asarray(v, dtype=float))
                                        for v in (batch, new, past)))
        kn = n if context else np.ones_like(n)
        half = kn / 2 if context else 0.0  # a prefill chunk's mean new token sits halfway
        cap = m.candidate_pool if kind.index == "candidates" else math.inf
        # V4 scores (past + i) / 4 keys for its i-th new token: the past that scores as many
        # keys on average as this layer does
        p4 = np.maximum(4 * np.minimum((p + half) / kind.reads, cap) - half, 0.0)
        got = self.dsv4_kernel("dsv4_indexer", pinst, b, kn, p4)
        v4_roof, _ = self._dsv4_kernel_roof("dsv4_indexer", pinst)
        # the keys are the roofline's only bytes: in decode, read once per pair of a request's
        # rows where the kernel pairs them
        reads = 1.0 if context else indexer_key_reads(hw.name, 1 + inst.spec_tokens)
        own = rf.sparse_attention(
            hw, b, kn, p, params=0.0, heads=0, qk_dim=0, v_dim=0, window=0, ratio=kind.reads,
            topk=1, index_heads=m.index_n_heads, index_dim=m.index_head_dim, entry_bytes=0.0,
            index_bytes=INDEXER_KEY_BYTES[inst.indexer_cache](m.index_head_dim) * reads,
            index_cap=cap)
        scoring = got.transferred(own, v4_roof(b, kn, p4, heads))
        # then each query row's top-k of the keys it scored, at V4's past of as many keys
        return Priced.total([scoring, self.dsv4_selection(context, pinst, b, kn, p4)])

    def dsv41_attention(self, kind: CSA2, context: bool, inst: Instance, batch: np.ndarray,
                        new: np.ndarray, past: np.ndarray) -> Priced:
        """One DeepSeek-V4.1 decode layer's mega attention (the query's pad with the window
        KV insert, and the one kernel for the window + top-k attention with its RoPE and output
        cast; no projections) at vLLM's measurement on GB300 (`mega_attention`: a 64-head
        model reading 128 window + 512 compressed entries, NVFP4 records, by query tokens a
        GPU and live heads). Carried to other conditions by measured ratios: what V4's
        attention kernel (`dsv4_hca_attn`) costs on this system where it reads as many entries
        as this layer, over what it costs on GB300 where it reads the table's (a layer that
        reads fewer entries, another Blackwell system); and, for records other than NVFP4, the
        time above the table's one-token figure by the kernel's roofline with this layer's
        records over the one with NVFP4's. Exactly the
        measurement where the conditions are the table's, flagged extrapolated elsewhere."""
        m = inst.model
        b, n, p = np.broadcast_arrays(*(np.atleast_1d(np.asarray(v, dtype=float))
                                        for v in (batch, new, past)))
        live = max(m.num_attention_heads // inst.tp, 1)
        table, codes = mega.measured_ms(live, b * n)
        same = (self.hardware.name == mega.HARDWARE and inst.kv_cache == mega.KV_CACHE
                and (m.num_attention_heads, m.head_dim, m.sliding_window, m.sparse_topk)
                == (mega.HEADS, mega.HEAD_DIM, mega.WINDOW, mega.TOPK))
        reads_all = (p >= kind.reads * mega.TOPK) if kind.reads else np.zeros(p.shape, bool)
        exact = same & reads_all
        if exact.all():
            return Priced(table, SOURCES[int(codes.max())], mega.TABLE, codes)
        ref_cal = self if self.hardware.name == mega.HARDWARE else load_calibration(
            load_hardware(mega.HARDWARE), self.engine, None, self.user_dir)
        reader = kind if kind.reads else cast("CSA2", kind_of("csa2_reuse_r2"))
        full = np.full_like(p, float(reader.reads * mega.TOPK))
        scale = (self._v4_attention_at(kind, inst, b, n, p)
                 / ref_cal._v4_attention_at(reader, inst, b, n, full))
        if inst.kv_cache != mega.KV_CACHE:
            # the records' bytes move only what the kernel's work adds above its one-token
            # time (at one query token it reads a few hundred KB: its latency, not its bytes)
            floor, _ = mega.measured_ms(live, np.ones(1))
            table = floor + (table - floor) * (
                self._mega_roof(kind, inst.kv_cache, inst, b, n, p)
                / self._mega_roof(kind, mega.KV_CACHE, inst, b, n, p))
        codes = np.where(exact, codes, np.maximum(codes, EXTRAPOLATED))
        return Priced(np.where(exact, table, table * scale), SOURCES[int(codes.max())],
                      mega.TABLE, codes)

    def _v4_attention_at(self, kind: CSA2, inst: Instance, b: np.ndarray, n: np.ndarray,
                         p: np.ndarray) -> np.ndarray:
        """ms of V4's measured attention kernel (`dsv4_hca_attn`, window + compressed entries,
        V4's fp8 records) at the context where it reads as many entries as a V4.1 layer `kind`
        at past `p`: 128 x the records that layer reads (a window-only layer: its window), at
        the heads the mega kernel computes (a TP shard's, padded to MEGA_ATTENTION_HEADS)."""
        from simulator.specs.deployment import MEGA_ATTENTION_HEADS

        m = inst.model
        heads = max(m.num_attention_heads // inst.tp, MEGA_ATTENTION_HEADS)
        proxy = _v4_proxy(m)  # V4's kernel measured at as many heads
        pinst = replace(inst, model=proxy, kv_cache="fp8", expert_parallel=True,
                        attn_tp=max(proxy.num_attention_heads // heads, 1))
        p4 = (128 * np.minimum(p / kind.reads, m.sparse_topk) if kind.reads
              else np.minimum(p, m.sliding_window))
        return self.dsv4_kernel("dsv4_hca_attn", pinst, b, n, p4).ms

    def _mega_roof(self, kind: CSA2, kv: str, inst: Instance, b: np.ndarray, n: np.ndarray,
                   p: np.ndarray) -> np.ndarray:
        """The mega kernel's roofline ms for a V4.1 layer `kind` with `kv` records (fp8
        window entries unless bf16) at the heads it computes."""
        from simulator.specs.deployment import MEGA_ATTENTION_HEADS

        m = inst.model
        return rf.sparse_attention(
            self.hardware, b, n, p, params=0.0,
            heads=max(m.num_attention_heads // inst.tp, MEGA_ATTENTION_HEADS),
            qk_dim=m.head_dim, v_dim=m.head_dim, window=m.sliding_window, ratio=kind.reads,
            topk=m.sparse_topk if kind.reads else 0, index_heads=0, index_dim=0,
            entry_bytes=kind.record_bytes(m, kv), index_bytes=0.0,
            window_bytes=kind.window_bytes(m, kv))

    def dsv4_growth(self, op: str, inst: Instance, batch: np.ndarray, new: np.ndarray,
                    start: np.ndarray, stop: np.ndarray) -> np.ndarray:
        """ms a V4 long-context kernel (`dsv4_indexer`, `dsv4_hca_attn`) adds when the prefix
        grows from `start` to `stop` tokens: the extra reads and FLOPs at the rate the kernel's
        table sustains on its largest measured work (the 90th percentile of roofline /
        measured over rows at least a tenth of the largest), not at the efficiency of small
        launches dominated by fixed costs."""
        roof, _ = self._dsv4_kernel_roof(op, inst)
        key = (op, "rate", inst.model.architecture, inst.kv_cache, inst.indexer_cache)
        if key not in self._rates:

            def sustained() -> dict[str, np.ndarray]:
                got = self.frame(op)
                rate = 0.5
                if got is not None:
                    rows, _ = self._module_rows(got[0], inst.model, inst.kv_cache, "fp8_block")
                    r = roof(rows.batch_size, rows.isl, rows.step, rows.num_heads.to_numpy())
                    big = r >= 0.1 * r.max()
                    rate = float(np.quantile(r[big] / rows.latency.to_numpy(float)[big], 0.9))
                return {"rate": np.array(rate)}

            self._rates[key] = float(cached(("rate", key, inst.model, roof, self),
                                            self._table_files(op), sustained)["rate"])
        rate = self._rates[key]
        stream = max(self.stream_efficiency() or rate, rate)
        heads = max(inst.model.num_attention_heads // inst.tp, 1)

        # the extra FLOPs at the kernel's sustained rate, the extra bytes at the rate this
        # system's measured decode attention streams long reads (a kernel table's largest
        # decode rows are still launch-bound, far below the bandwidth a long read reaches)
        more = np.maximum(roof(batch, new, stop, heads, "each")
                          - roof(batch, new, start, heads, "each"), 0.0)
        return np.maximum(more[0] / rate, more[1] / stream)

    def stream_efficiency(self) -> float | None:
        """The share of HBM bandwidth a long memory-bound read sustains on this system: the
        median roofline / measured over the engine's decode attention rows (GQA, no window)
        that read 1 GB or more. None when no such table or row ships."""
        key = ("stream",)
        if key not in self._rates:

            def median_rate() -> dict[str, np.ndarray]:
                got, hw, eff = self.frame("attention_generation"), self.hardware, float("nan")
                names = {v: k for k, v in KV_DTYPES.items()}
                if got is not None:
                    rows = got[0][(got[0].window_size == 0)
                                  & got[0].kv_cache_dtype.isin(list(names))]
                    effs = [np.array([])]
                    for kvd, r in rows.groupby("kv_cache_dtype"):
                        roof = rf.attention_generation(hw, r.batch_size, r.step + r.isl,
                                                       r.num_heads.to_numpy(),
                                                       r.num_key_value_heads.to_numpy(),
                                                       r.head_dim.to_numpy(), names[str(kvd)])
                        big = roof * 1e-3 * hw.hbm_bytes_s >= 1e9
                        effs.append(roof[big] / r.latency.to_numpy(float)[big])
                    both = np.concatenate(effs)
                    if both.size:
                        eff = float(min(np.median(both), 1.0))
                return {"eff": np.array(eff)}

            self._rates[key] = float(cached(("stream", self), self._table_files(
                "attention_generation"), median_rate)["eff"])
        found = self._rates[key]
        return None if np.isnan(found) else found

    def _dsv4_kernel_roof(self, op: str, inst: Instance
                          ) -> tuple[Callable[..., np.ndarray], tuple[Any, ...]]:
        m = inst.model
        entry = DSV4_ENTRY_BYTES[inst.kv_cache](m.head_dim, m.qk_rope_head_dim)
        idx = INDEXER_KEY_BYTES[inst.indexer_cache](m.index_head_dim)
        hw = self.hardware

        def roof(b: Any, n: Any, p: Any, h: Any, bound: str = "both") -> np.ndarray:
            if op == "dsv4_indexer":
                return rf.sparse_attention(hw, b, n, p, params=0.0, heads=0, qk_dim=0, v_dim=0,
                                           window=0, ratio=4, topk=1,
                                           index_heads=m.index_n_heads,
                                           index_dim=m.index_head_dim, entry_bytes=0.0,
                                           index_bytes=idx, bound=bound)
            return rf.sparse_attention(hw, b, n, p, params=0.0, heads=h, qk_dim=m.head_dim,
                                       v_dim=m.head_dim, window=m.sliding_window, ratio=128,
                                       topk=0, index_heads=0, index_dim=0, entry_bytes=entry,
                                       index_bytes=0.0, bound=bound)

        return roof, (op, m.architecture, m.num_attention_heads, inst.kv_cache,
                      inst.indexer_cache)

    def _edge(self, op: str, key: tuple[Any, ...], m: ModelSpec, kv_dtype: str, axis: str,
              batch: np.ndarray) -> np.ndarray:
        """The longest context a module table measured at each queried batch (that of the
        nearest measured batch at or above it); inf when no table ships."""
        ek = (*key, axis)
        if ek not in self._edges:

            def longest_per_batch() -> dict[str, np.ndarray]:
                got = self.frame(op)
                if got is None:
                    return {}
                rows, _ = self._module_rows(got[0], m, kv_dtype, "fp8_block")
                rows = rows.assign(end=rows.step + rows.isl)
                most = rows.groupby("batch_size")[axis].max()
                return {"levels": most.index.to_numpy(float), "longest": most.to_numpy(float)}

            arrays = cached(("edge", op, ek, m, kv_dtype, self), self._table_files(op),
                            longest_per_batch)
            self._edges[ek] = (arrays["levels"], arrays["longest"]) if arrays else None
        found = self._edges[ek]
        if found is None:
            return np.full_like(batch, np.inf)
        return _longest_at(found, batch)

    def dsv4_topk(self, inst: Instance, batch: np.ndarray, new: np.ndarray,
                  past: np.ndarray) -> Priced:
        """The top-k selection after one DeepSeek-V4 CSA indexer's scoring: each query row
        keeps the `sparse_topk` best of the compressed keys before it (one per 4 tokens), from
        SGLang's kernel-level table (its top-k transform over ordered scores: TOPK_SCORES;
        the runs of the model with this one's head count, else the nearest, extrapolated) in
        prefill (batch, new tokens, where the chunk ends) and decode (batch, context); no
        engine ships its own. Nothing to select where a row has at most top-k keys. Its
        roofline: the row's logits read once (fp32); beyond the table at the efficiency of the
        table's edge (flagged extrapolated). Decode rows past the table's reach are priced by
        `dsv4_decode_topk`."""
        m, hw = inst.model, self.hardware
        ratio, topk = 4, m.sparse_topk

        def roof(b: Any, n: Any, p: Any) -> np.ndarray:
            b, n, p = (np.asarray(v, dtype=float) for v in (b, n, p))
            keys = (p + (n + 1) / 2) / ratio  # a chunk's mean row
            return np.where((p + n) // ratio > topk, b * n * keys * 4 / hw.hbm_bytes_s * 1e3,
                            0.0)

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            rows = df[(df.score_mode == TOPK_SCORES) & (df.latency > 0)]
            # the model's own runs (by its head count: V4-Flash 64, top-k 512; V4-Pro 128,
            # top-k 1024), else the nearest model's
            rows, floor = self._nearest(rows, {"num_heads": m.num_attention_heads})
            rows = rows[roof(rows.batch_size, rows.isl, rows.step) > 0]
            return rows.assign(end=rows.step + rows.isl), floor

        grid = self._grid(("dsv4_topk", TOPK_SCORES, m.num_attention_heads, topk), "dsv4_topk",
                          select,
                          ["batch_size", "isl", "end"],
                          lambda r: roof(r.batch_size, r.isl, r.step))
        b, n, p = np.broadcast_arrays(*(np.atleast_1d(np.asarray(v, dtype=float))
                                        for v in (batch, new, past)))
        b, n, p = np.maximum(b, 1.0), np.maximum(n, 1.0), np.maximum(p, 0.0)
        r = roof(b, n, p)
        got = self._price(grid, np.stack([b, n, p + n], axis=1), r, 0.3)
        if r.all():
            return got
        codes = np.where(r > 0, got.point_codes(), 0)  # nothing to select: none measured
        return Priced(got.ms, SOURCES[int(codes.max())], got.table, codes)

    def dsv4_selection(self, context: bool, inst: Instance, batch: np.ndarray,
                       new: np.ndarray, past: np.ndarray) -> Priced:
        """Each query row's top-k selection after one V4 CSA indexer's scoring: a prompt
        chunk's rows (`dsv4_topk`) or a decode step's `batch` query rows (`dsv4_decode_topk`,
        one new token a row)."""
        if context:
            return self.dsv4_topk(inst, batch, new, past)
        return self.dsv4_decode_topk(inst, batch, past)

    def dsv4_decode_topk(self, inst: Instance, rows: np.ndarray, past: np.ndarray) -> Priced:
        """The top-k selection of a decode step's `rows` query rows after one DeepSeek-V4 CSA
        indexer's scoring, each among the keys of `past` tokens (`dsv4_topk`'s table, one new
        token a row). Where the table measured as many rows at this context, its price. It
        stops short of decode batches at long contexts (256 rows reach 3K tokens, 4 rows 128K,
        one row 1M): a row runs on its own, so the rows side by side cost what one row costs
        and grow only past what runs at once (0.003 ms for 1 to 256 rows of 768 keys; 0.012 ms
        for 1 to 4 rows of 32K), and a row's time grows with its keys (0.07 ms for 250K). Past
        it, one row's time at this context (the one-row runs, beyond 1M tokens at their last
        efficiency) times what the rows cost over one row at the longest context the table
        measured that many rows, and beyond the most rows it measured (256) in proportion to
        the rows (flagged extrapolated). Extrapolating the table's edge by the logits' bytes
        instead would price hundreds of long rows one after another, at the launch-bound
        efficiency of its short ones."""
        r, p = np.broadcast_arrays(*(np.atleast_1d(np.asarray(v, dtype=float))
                                     for v in (rows, past)))
        r, p = np.maximum(r, 1.0), np.maximum(p, 0.0)
        ones = np.ones_like(r)
        direct = self.dsv4_topk(inst, r, ones, p)
        edges = self._topk_decode_edges(inst)
        if edges is None:  # no table: the roofline's price stands
            return direct
        most = edges[0][-1]  # the most rows the table ran
        inside = (p + 1 <= _longest_at(edges, r)) & (r <= most)
        if inside.all():
            return direct
        measured = np.minimum(r, most)  # then in proportion to the rows
        edge = _longest_at(edges, measured) - 1
        k = len(r)  # one row here, the rows and one row at their edge: one query
        got = self.dsv4_topk(inst, np.concatenate([ones, measured, ones]),
                             np.concatenate([ones, ones, ones]),
                             np.concatenate([p, edge, edge])).ms
        one, many, lone = got[:k], got[k:2 * k], got[2 * k:]
        factor = np.maximum(np.divide(many, lone, out=np.ones_like(many), where=lone > 0),
                            1.0) * (r / measured)
        return direct.carried(np.where(inside, direct.ms, one * factor), ~inside)

    def _topk_decode_edges(self, inst: Instance) -> tuple[np.ndarray, np.ndarray] | None:
        """Per batch the top-k table ran one new token a row with something to select (the
        model's head count's runs, as `dsv4_topk` takes them): the batches, and the longest
        context (step + 1) each reached; None where no such run ships."""
        want = inst.model.num_attention_heads
        key = ("dsv4_topk-decode", want)
        if key not in self._edges:

            def longest_per_batch() -> dict[str, np.ndarray]:
                got = self.frame("dsv4_topk")
                if got is None:
                    return {}
                df = got[0]
                rows = df[(df.score_mode == TOPK_SCORES) & (df.latency > 0) & (df.isl == 1)]
                if not len(rows):
                    return {}
                rows, _ = self._nearest(rows, {"num_heads": want})
                most = (rows.step + 1).groupby(rows.batch_size).max()
                return {"levels": most.index.to_numpy(float), "longest": most.to_numpy(float)}

            arrays = cached(("edge", *key, TOPK_SCORES, self), self._table_files("dsv4_topk"),
                            longest_per_batch)
            self._edges[key] = (arrays["levels"], arrays["longest"]) if arrays else None
        return self._edges[key]

    def dsv4_kernel(self, op: str, inst: Instance, batch: np.ndarray, new: np.ndarray,
                    past: np.ndarray) -> Priced:
        """A DeepSeek-V4 long-context kernel of one layer from its measured table:
        `dsv4_indexer` (the CSA indexer's paged MQA logits over every compressed key) or
        `dsv4_hca_attn` (HCA's attention over the window and the compressed entries)."""
        roof, key = self._dsv4_kernel_roof(op, inst)
        heads = max(inst.model.num_attention_heads // inst.tp, 1)
        b, n, p = np.broadcast_arrays(*(np.atleast_1d(np.asarray(v, dtype=float))
                                        for v in (batch, new, past)))
        edge = self._edge(op, key, inst.model, inst.kv_cache, "end", b)
        inside = np.maximum(np.minimum(p + n, edge) - n, 0.0)
        got = self._sparse(op, key, inst.model, inst.kv_cache, "fp8_block", True, b, n, inside,
                           heads, roof)
        assert got is not None
        beyond = p > inside
        if not beyond.any():
            return got
        grow = self.dsv4_growth(op, inst, b, n, inside, p)
        return got.carried(got.ms + np.where(beyond, grow, 0.0), beyond)

    def dsa_module(self, context: bool, inst: Instance, batch: np.ndarray, new: np.ndarray,
                   past: np.ndarray) -> Priced | None:
        """One DeepSeek-V3.2 / GLM-5 sparse MLA layer (projections, indexer, top-k latent
        attention) from the measured dsa module tables; None when none ships."""
        m = inst.model
        op = "dsa_context" if context else "dsa_generation"
        heads = max(m.num_attention_heads // inst.tp, 1)
        params_all = kind_of("dsa").params(m)
        shared, per_head = mla_shape_params(m.hidden, m.q_lora_rank, m.kv_lora_rank,
                                            m.head_dim - m.qk_rope_head_dim, m.qk_rope_head_dim,
                                            m.v_head_dim)
        indexer = params_all - shared - m.num_attention_heads * per_head
        lat = (m.kv_lora_rank + m.qk_rope_head_dim) * DTYPE_BYTES[inst.kv_cache]
        idx = INDEXER_KEY_BYTES[inst.indexer_cache](m.index_head_dim)
        hw = self.hardware
        weights = linear_dtype(inst.weights)

        def roof(b: Any, n: Any, p: Any, h: Any) -> np.ndarray:
            params = shared + indexer + np.asarray(h, dtype=float) * per_head
            return rf.sparse_attention(
                hw, b, n, p, params=params, heads=h,
                qk_dim=m.kv_lora_rank + m.qk_rope_head_dim, v_dim=m.kv_lora_rank, window=0,
                ratio=1, topk=m.sparse_topk, index_heads=m.index_n_heads,
                index_dim=m.index_head_dim, entry_bytes=lat, index_bytes=idx, weights=weights)

        key = (op, m.architecture, m.hidden, inst.kv_cache, inst.weights, inst.indexer_cache)
        return self._sparse(op, key, m, inst.kv_cache, MLA_GEMM[dense_dtype(inst.weights)],
                            context, batch, new, past, heads, roof)

    def mega_moe(self, tokens: np.ndarray | float, hidden: int, inter: int, topk: int,
                 experts: int, ep: int, dtype: str, decode: bool, gb_s: float) -> Priced:
        """DeepGEMM's fused MegaMoE (dispatch + expert GEMMs + combine) of one rank holding
        `tokens`, balanced, over an EP group of `ep` ranks. Measured by SGLang's collector
        (the kernel vLLM's --moe-backend deep_gemm_mega_moe runs) in decode (generation) and
        prefill (context) mode; other expert shapes transfer its efficiency (extrapolated)."""
        hw = self.hardware
        phase = "generation" if decode else "context"

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            rows = df[(df.phase == phase) & (df.distribution == "balanced")]
            return self._nearest(rows, {"hidden_size": hidden, "inter_size": inter,
                                        "topk": topk, "num_experts": experts})

        def roof(r: pd.DataFrame) -> np.ndarray:
            return rf.mega_moe(hw, r.num_tokens, r.hidden_size.to_numpy(), r.inter_size.to_numpy(),
                               r.topk.to_numpy(), r.num_experts.to_numpy(), r.moe_ep_size,
                               dtype, hw.scaleup_gb_s)

        grid = self._grid(("mega_moe", phase, hidden, inter, topk, experts, dtype), "mega_moe",
                          select, ["num_tokens", "moe_ep_size"], roof)
        t = np.maximum(np.atleast_1d(np.asarray(tokens, dtype=float)), 1.0)
        pts = np.stack([t, np.full_like(t, ep)], axis=1)
        return self._price(grid, pts, rf.mega_moe(hw, t, hidden, inter, topk, experts, ep,
                                                  dtype, gb_s), 0.5)

    def gdn(self, context: bool, inst: Instance, batch: np.ndarray, new: np.ndarray) -> Priced:
        """Gated DeltaNet kernels of one layer on one rank (the convolution and the
        delta-rule recurrence: chunked in prefill, one step in decode) from the measured gdn
        tables; heads split over the TP ranks."""
        m, hw = inst.model, self.hardware
        kh, vh = max(m.linear_k_heads // inst.tp, 1), max(m.linear_v_heads // inst.tp, 1)
        phase = "context" if context else "generation"
        kernels = (("causal_conv1d_fn", "chunk_gated_delta_rule") if context else
                   ("causal_conv1d_update", "fused_recurrent_gated_delta_rule"))
        b = np.maximum(np.atleast_1d(np.asarray(batch, dtype=float)), 1.0)
        n = np.maximum(np.atleast_1d(np.asarray(new, dtype=float)), 1.0)
        b, n = np.broadcast_arrays(b, n)
        axes = ["batch_size", "seq_len"] if context else ["batch_size"]
        pts = np.stack([b, n], axis=1) if context else b[:, None]
        total, worst_code, table = np.zeros_like(b), 0, "roofline"

        def roof_rows(r: pd.DataFrame) -> np.ndarray:
            return rf.gdn(hw, r.batch_size, r.seq_len, r.num_k_heads.to_numpy(), m.linear_k_dim,
                          r.num_v_heads.to_numpy(), m.linear_v_dim, m.linear_conv_kernel)

        for kernel in kernels:
            def select(df: pd.DataFrame, kernel: str = kernel) -> tuple[pd.DataFrame, int]:
                rows = df[(df.phase == phase) & df.kernel_source.str.startswith(kernel)]
                return self._nearest(rows, {"d_model": m.hidden, "num_k_heads": kh,
                                            "num_v_heads": vh})

            grid = self._grid(("gdn", kernel, m.hidden, kh, vh), "gdn", select, axes, roof_rows)
            # Both kernels are normalised by the whole layer's roofline; without a table each
            # is charged that roofline / 0.6, so the pair costs it at 30 % efficiency.
            p = self._price(grid, pts, rf.gdn(hw, b, n, kh, m.linear_k_dim, vh, m.linear_v_dim,
                                              m.linear_conv_kernel), 0.6)
            total = total + p.ms
            worst_code = max(worst_code, SOURCES.index(p.source))
            table = p.table
        return Priced(total, SOURCES[worst_code], table)

    def mhc(self, tokens: np.ndarray | float, hidden: int, streams: int, iters: int) -> Priced:
        """DeepSeek-V4 hyper-connection pre + post mixing of one layer for `tokens` per rank."""
        hw = self.hardware
        t = np.maximum(np.atleast_1d(np.asarray(tokens, dtype=float)), 1.0)
        total = np.zeros_like(t)
        source, table = SOURCES[0], "roofline"
        for phase in ("pre", "post"):
            def select(df: pd.DataFrame, phase: str = phase) -> tuple[pd.DataFrame, int]:
                rows = df[df.op_name == phase]
                return self._nearest(rows, {"hidden_size": hidden, "hc_mult": streams,
                                            "sinkhorn_iters": iters})

            grid = self._grid(("mhc", phase, hidden, streams, iters), "mhc", select,
                              ["num_tokens"],
                              lambda r: rf.mhc(hw, r.num_tokens, r.hidden_size.to_numpy(),
                                               r.hc_mult.to_numpy()))
            p = self._price(grid, t[:, None], rf.mhc(hw, t, hidden, streams), 0.3)
            total = total + p.ms
            source = SOURCES[max(SOURCES.index(source), SOURCES.index(p.source))]
            table = p.table
        return Priced(total, source, table)

    def all_to_all(self, tokens: np.ndarray | float, hidden: int, topk: int, experts: int,
                   ep: int, phase: str, low_latency: bool, gb_s: float) -> Priced:
        """MoE dispatch or combine of `tokens` per rank over an EP group at `gb_s` GB/s per GPU."""
        if ep <= 1:
            t = np.atleast_1d(np.asarray(tokens, dtype=float))
            return Priced(np.zeros_like(t), "measured", "none (single rank)")
        elem = 1.0 if phase == "dispatch" else 2.0
        mode = "deepep_ll" if low_latency else "deepep_ht"
        scaleup = self.hardware.scaleup_gb_s

        def nbytes(tok: Any, h: Any, k: Any, n: Any) -> Any:
            return tok * k * h * elem * (n - 1) / n

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            # TensorRT-LLM's collector names its DeepEP kernels trtllm_deepep_{ht,ll} and
            # measures each in several dtypes: the phase's own (A2A_DTYPES) is kept
            rows = df[df.comm_backend.isin([mode, f"trtllm_{mode}"]) & (df.phase == phase)]
            have = set(rows.comm_dtype)
            dtype = next((d for d in A2A_DTYPES[phase] if d in have), None)
            if dtype is not None:
                rows = rows[rows.comm_dtype == dtype]
            return self._nearest(rows, {"hidden_size": hidden, "topk": topk,
                                        "num_experts": experts})

        grid = self._grid(("a2a", hidden, topk, experts, phase, mode), "all_to_all", select,
                          ["num_tokens", "ep_size"],
                          lambda r: rf.transfer(nbytes(r.num_tokens, r.hidden_size.to_numpy(),
                                                       r.topk.to_numpy(), r.ep_size), scaleup))
        t = np.maximum(np.atleast_1d(np.asarray(tokens, dtype=float)), 1.0)
        pts = np.stack([t, np.full_like(t, ep)], axis=1)
        wide = self._wide_a2a(hidden, topk, experts, phase, low_latency)
        own_ep = 0.0 if grid is None else float(grid[0].axes[1].max())
        # The exchange an engine's own collector measured, where it ships, before any other:
        # SGLang's DeepEP at every node count (on GB200, 1-32 tokens a rank: 17-19 us where
        # vLLM's harness times 62-110 us), TensorRT-LLM's all-to-all over the NVLink domain
        # (GB200: EP 2-64), which it runs there instead of DeepEP.
        own_table = {"sglang": self._wide_a2a, "trtllm": self._nvlink_a2a}.get(self.engine)
        own = None if own_table is None else own_table(hidden, topk, experts, phase, low_latency)
        if own is not None:
            grid = own
        elif wide is not None and ep > own_ep and float(wide[0].axes[1].max()) > own_ep:
            # Wider than the engine's own table measured: DeepEP measured at that EP size
            # (multi-node), with the same kernels, beats extrapolating an 8-GPU measurement.
            grid = wide
        return self._price(grid, pts, rf.transfer(nbytes(t, hidden, topk, ep), gb_s), 0.5)

    def _nvlink_a2a(self, hidden: int, topk: int, experts: int, phase: str,
                    low_latency: bool = True) -> tuple[Grid, int, str] | None:
        """TensorRT-LLM's NVLink all-to-all (`trtllm_alltoall_perf`; none where the system
        ships no such table): a grid over (tokens per rank, EP size) of a dispatch (its
        metadata exchange, `alltoall_prepare`, plus the payload's) or a combine, in the
        phase's dtype as the cost model sends it (A2A_DTYPES), fastest kernel per point. The
        same kernels serve both modes (`low_latency` is `_wide_a2a`'s, unused here)."""
        elem = 1.0 if phase == "dispatch" else 2.0
        keys = ["kernel_source", "moe_dtype", "num_tokens", "moe_ep_size", "hidden_size",
                "topk", "num_experts"]

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            dtypes = [d for d in A2A_DTYPES[phase] if d in set(df.moe_dtype)]
            df = df[df.moe_dtype == dtypes[0]] if dtypes else df.iloc[:0]
            rows = df[df.op_name == f"alltoall_{phase}"]
            if phase == "dispatch":  # the kernels that exchange metadata first pay for it
                prep = df[df.op_name == "alltoall_prepare"].groupby(keys).latency.min()
                extra = rows.join(prep.rename("prepare"), on=keys).prepare.fillna(0.0)
                rows = rows.assign(latency=rows.latency + extra)
            return self._nearest(rows, {"hidden_size": hidden, "topk": topk,
                                        "num_experts": experts})

        return self._nvlink_grid(("a2a_nvlink", hidden, topk, experts, phase), select, elem,
                                 lambda other: other._nvlink_a2a(hidden, topk, experts, phase))

    def _nvlink_grid(self, key: tuple[Any, ...],
                     select: Callable[[pd.DataFrame], tuple[pd.DataFrame, int]], elem: float,
                     again: Callable[[Calibration], tuple[Grid, int, str] | None]
                     ) -> tuple[Grid, int, str] | None:
        """A grid over (tokens per rank, EP size) of the `trtllm_alltoall_perf` rows `select`
        keeps, on the roofline of `elem` bytes per hidden element sent to every other rank;
        where the system ships none, its fabric sibling's (`again` on the sibling's
        calibration) at its efficiency on this roofline, flagged extrapolated."""
        scaleup = self.hardware.scaleup_gb_s

        def roof(r: pd.DataFrame) -> np.ndarray:
            sent = (r.num_tokens.to_numpy(float) * r.topk.to_numpy(float)
                    * r.hidden_size.to_numpy(float) * elem)
            n = r.moe_ep_size.to_numpy(float)
            return rf.transfer(sent * (n - 1) / n, scaleup)

        got = self._grid(key, "a2a_nvlink", select, ["num_tokens", "moe_ep_size"], roof)
        sibling = FABRIC_SIBLINGS.get(self.hardware.name)
        if got is None and sibling is not None:
            got = again(load_calibration(load_hardware(sibling), self.engine, None,
                                         self.user_dir))
            if got is not None:
                got = (got[0], max(got[1], EXTRAPOLATED), got[2])
        return got

    def nvlink_one_sided(self, tokens: np.ndarray | float, hidden: int, topk: int,
                         experts: int, ep: int, phase: str, expert_dtype: str,
                         gb_s: float) -> Priced:
        """MoE dispatch or combine of `tokens` per rank over the NVLink one-sided kernels
        (vLLM --all2all-backend flashinfer_nvlink_one_sided: FlashInfer's port of TensorRT-LLM's
        NVLinkOneSided all-to-all) for experts in `expert_dtype`, whose dispatch payload
        follows it (ONE_SIDED_DISPATCH; a combine returns bf16). Priced from
        TensorRT-LLM's measurement of the same kernel (`trtllm_alltoall_perf`, NVLinkOneSided,
        NVFP4 payload) on the query's bytes: another payload is a dtype transfer (flagged
        extrapolated); a system without the measurement (nor a fabric sibling's) gets the
        roofline."""
        t = np.maximum(np.atleast_1d(np.asarray(tokens, dtype=float)), 1.0)
        if ep <= 1:
            return Priced(np.zeros_like(t), "measured", "none (single rank)")
        measured = ONE_SIDED_PAYLOAD[phase]
        payload = ONE_SIDED_DISPATCH.get(expert_dtype, 2.0) if phase == "dispatch" else measured
        grid = self._one_sided_grid(hidden, topk, experts, phase)
        if grid is not None and payload != measured:
            grid = (grid[0], max(grid[1], EXTRAPOLATED), grid[2])
        roof = rf.transfer(t * topk * hidden * payload * (ep - 1) / ep, gb_s)
        pts = np.stack([t, np.full_like(t, ep)], axis=1)
        return self._price(grid, pts, roof, 0.5)

    def _one_sided_grid(self, hidden: int, topk: int, experts: int,
                        phase: str) -> tuple[Grid, int, str] | None:
        """The NVLinkOneSided rows of `trtllm_alltoall_perf` for one phase: a grid over (tokens
        per rank, EP size) on the roofline of the bytes they carried (ONE_SIDED_PAYLOAD)."""
        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            rows = df[(df.kernel_source == "NVLinkOneSided") & (df.op_name == f"alltoall_{phase}")]
            return self._nearest(rows, {"hidden_size": hidden, "topk": topk,
                                        "num_experts": experts})

        return self._nvlink_grid(("a2a_one_sided", hidden, topk, experts, phase), select,
                                 ONE_SIDED_PAYLOAD[phase],
                                 lambda other: other._one_sided_grid(hidden, topk, experts, phase))

    def _wide_a2a(self, hidden: int, topk: int, experts: int, phase: str,
                  low_latency: bool) -> tuple[Grid, int, str] | None:
        """DeepEP dispatch / combine measured over several nodes (SGLang's wide-EP collector,
        every version that ships on this system, fastest kernel per point): a grid over
        (tokens per rank, EP size = nodes x GPUs per host); None when none ships."""
        op = "a2a_wide_ll" if low_latency else "a2a_wide_normal"
        key = ("a2a_wide", op, hidden, topk, experts, phase)
        if key not in self._grids:
            self._grids[key] = _unpack_grid(cached(
                ("a2a_wide", key, self), self._table_files(op),
                lambda: _pack_grid(self._build_wide_a2a(op, hidden, topk, experts, phase,
                                                        low_latency))))
        return self._grids[key]

    def _build_wide_a2a(self, op: str, hidden: int, topk: int, experts: int, phase: str,
                        low_latency: bool) -> tuple[Grid, int, str] | None:
        folder, fname = OP_FILES[op]
        frames = []
        if self.hardware.system:
            base = aic_system_dir(self.hardware.system) / folder / "sglang"
            if base.is_dir():
                frames = [_read_parquet(p / fname) for p in sorted(base.iterdir())
                          if (p / fname).is_file()]
        if not frames:
            return None
        import pandas as pd

        df = pd.concat(frames, ignore_index=True)
        per = self.hardware.gpus_per_host
        if low_latency:
            us = df[f"{phase}_avg_t_us"]
        else:
            us = df[f"{phase}_transmit_us"] + df[f"{phase}_notify_us"]
        df = df.assign(latency=us * 1e-3, ep_size=df.node_num * per,
                       num_tokens=df.num_token, topk=df.num_topk)
        rows, floor = self._nearest(df, {"hidden_size": hidden, "topk": topk,
                                         "num_experts": experts})
        elem = 1.0 if phase == "dispatch" else 2.0
        hw = self.hardware

        def roof(r: pd.DataFrame) -> np.ndarray:
            n = r.ep_size.to_numpy(float)  # ranks filling hosts of `per` GPUs
            rate = all_to_all_rate(n, np.minimum(n, per), hw.scaleup_gb_s, hw.nic_gb_s)
            sent = r.num_tokens.to_numpy(float) * r.topk.to_numpy(float) * r.hidden_size.to_numpy(
                float) * elem * (n - 1) / n
            return rf.transfer(sent, rate)

        pts = rows[["num_tokens", "ep_size"]].to_numpy(dtype=float)
        return (Grid.build(pts, rows["latency"].to_numpy(float), roof(rows)), floor,
                f"{self.hardware.system}/comm/sglang/wideep_deepep_"
                f"{'ll' if low_latency else 'normal'}")

    def collective(self, op: str, nbytes: np.ndarray | float, gpus: int, gb_s: float) -> Priced:
        """An NCCL collective (all_gather, reduce_scatter, all_reduce, alltoall) of `nbytes`
        (the whole gathered / reduced buffer) over `gpus` GPUs at `gb_s` GB/s per GPU."""
        if op not in NCCL_OPS:
            raise SpecError(f"collective {op!r} is not one of {', '.join(NCCL_OPS)}")
        if gpus <= 1:
            b = np.atleast_1d(np.asarray(nbytes, dtype=float))
            return Priced(np.zeros_like(b), "measured", "none (single rank)")
        factor = 2.0 if op == "all_reduce" else 1.0

        def roof(size: Any, n: Any, bw: float) -> np.ndarray:
            return rf.transfer(factor * (np.asarray(n, dtype=float) - 1) / n * size, bw)

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            return df[df.op_name == op], 0

        grid = self._grid(("nccl", op), "nccl", select, ["message_size", "num_gpus"],
                          lambda r: roof(r.message_size, r.num_gpus.to_numpy(),
                                         self.hardware.scaleup_gb_s))
        b = np.maximum(np.atleast_1d(np.asarray(nbytes, dtype=float)), 1.0)
        pts = np.stack([b, np.full_like(b, gpus)], axis=1)
        return self._price(grid, pts, roof(b, gpus, gb_s), 0.5)

    def allreduce(self, nbytes: np.ndarray | float, gpus: int, gb_s: float) -> Priced:
        """All-reduce of `nbytes` bf16 over a TP group of `gpus` GPUs (CUDA-graph kernels)."""
        if gpus <= 1:
            b = np.atleast_1d(np.asarray(nbytes, dtype=float))
            return Priced(np.zeros_like(b), "measured", "none (single rank)")

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            if "backend" in df.columns:  # vLLM's table has eager and CUDA-graph kernels
                graph = df.backend.astype(str).str.contains("graph")
                if STAND_IN in df:  # and FlashInfer's fused kernel, as TensorRT-LLM timed it
                    graph |= df[STAND_IN].notna()
                return (df[graph] if graph.any() else df), 0
            return df, 0

        size = ALLREDUCE_ELEMENT_BYTES  # the tables count elements, `nbytes` is bytes
        grid = self._grid(("allreduce",), "allreduce", select, ["message_size", "num_gpus"],
                          lambda r: rf.allreduce(size * r.message_size, r.num_gpus.to_numpy(),
                                                 self.hardware.scaleup_gb_s))
        b = np.maximum(np.atleast_1d(np.asarray(nbytes, dtype=float)), size)
        pts = np.stack([b / size, np.full_like(b, gpus)], axis=1)
        return self._price(grid, pts, rf.allreduce(b, gpus, gb_s), 0.5)


_LOADED: dict[tuple[str, str, str | None, str | None], Calibration] = {}

CALIBRATION_ENV = "RACKPLAN_CALIBRATION_DIR"
"""Environment variable naming a `rackplan calibrate` folder that load_calibration prefers
when its caller gives none (so simulate, step, search and their worker processes all use it)."""


def user_calibration_dir(user_dir: str | Path | None = None,
                         name: str = "user_dir") -> Path | None:
    """The user tables to prefer: `user_dir`, else $RACKPLAN_CALIBRATION_DIR, else none;
    `name` is what an error calls `user_dir`."""
    chosen = user_dir if user_dir is not None else os.environ.get(CALIBRATION_ENV) or None
    if chosen is None:
        return None
    if not Path(chosen).is_dir():
        given = name if user_dir is not None else CALIBRATION_ENV
        raise SpecError(f"{given}={str(chosen)!r} is not a folder; give one written by "
                        "`rackplan calibrate --out DIR`")
    return Path(chosen)


@contextmanager
def calibration_dir(path: str | Path | None, name: str = "--calibration") -> Iterator[None]:
    """While inside, load_calibration prefers the tables in `path` (None: leave as is)."""
    if path is None:
        yield
        return
    user_calibration_dir(path, name)  # a bad folder fails here, with its name
    before = os.environ.get(CALIBRATION_ENV)
    os.environ[CALIBRATION_ENV] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CALIBRATION_ENV, None)
        else:
            os.environ[CALIBRATION_ENV] = before


def load_calibration(hardware: HardwareSpec, engine: str = "vllm", version: str | None = None,
                     user_dir: str | Path | None = None) -> Calibration:
    """The calibration of one hardware and engine, shared by every caller in the process.

    `user_dir` (default: $RACKPLAN_CALIBRATION_DIR) holds tables written by `rackplan
    calibrate`, preferred over the shipped ones."""
    if engine not in ENGINES:
        raise SpecError(f"engine={engine!r} is not one of {', '.join(ENGINES)}")
    user = user_calibration_dir(user_dir)
    key = (hardware.name, engine, version, str(user) if user else None)
    if key not in _LOADED:
        _LOADED[key] = Calibration(hardware, engine, version, user)
    return _LOADED[key]
