"""Declarative shape sweeps: which shapes a model's step needs, per device kind.

A sweep lists, per operation, the shapes the cost model will ask the calibration for when it
prices a step of `model` (per rank, for each TP / EP split on the grid), crossed with the
token-count axes in `GRIDS`. Nothing here needs torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from simulator.specs.model import ModelSpec

OPS = ("gemm", "moe", "attention", "mla", "memory", "comm")
"""Operation families a calibration can measure, in the order they run."""

COMM_OPS = ("all_gather", "reduce_scatter", "all_reduce", "alltoall")
"""Collectives measured; names as the calibration's NCCL table spells them."""


@dataclass(frozen=True)
class GemmShape:
    """y[m, n] = x[m, k] @ w[n, k]^T."""

    m: int
    n: int
    k: int
    dtype: str
    """Weight dtype: bf16 or fp8."""
    name: str
    """The layer it stands for (qkv_proj, lm_head, ...)."""


@dataclass(frozen=True)
class MoeShape:
    """Routed experts of one MoE layer on one rank."""

    tokens: int
    """Tokens over the whole EP group, routed evenly over all experts."""
    hidden: int
    inter: int
    """Intermediate size of one whole expert (before TP splits it)."""
    topk: int
    experts: int
    ep: int
    """Expert-parallel ranks: this rank holds experts / ep of them."""
    tp: int
    """Ranks each expert's intermediate size is split over."""


@dataclass(frozen=True)
class AttnShape:
    """GQA attention kernel on one rank."""

    phase: str
    """decode (one new token per request) or prefill (causal, `length` new tokens)."""
    batch: int
    length: int
    """decode: tokens already cached (the new token attends length + 1); prefill: new tokens."""
    heads: int
    kv_heads: int
    head_dim: int
    kv_dtype: str


@dataclass(frozen=True)
class MlaShape:
    """A whole MLA block (projections and latent attention) on one rank."""

    phase: str
    batch: int
    length: int
    """As in AttnShape."""
    heads: int
    hidden: int
    q_lora: int
    kv_lora: int
    nope: int
    rope: int
    v: int
    kv_dtype: str


@dataclass(frozen=True)
class CopyShape:
    """A device-to-device copy of `nbytes`."""

    nbytes: int


@dataclass(frozen=True)
class CommShape:
    """One collective over `ranks` processes; `nbytes` is the whole buffer (the gathered
    output of all_gather, the input of reduce_scatter, the buffer of all_reduce and the send
    buffer of alltoall)."""

    op: str
    nbytes: int
    ranks: int


@dataclass(frozen=True)
class Grid:
    """Token-count axes one device kind sweeps."""

    m: tuple[int, ...]
    """GEMM rows (tokens per rank)."""
    tp: tuple[int, ...]
    """Tensor-parallel splits of the per-rank shapes."""
    moe_tokens: tuple[int, ...]
    ep: tuple[int, ...]
    decode_batch: tuple[int, ...]
    decode_past: tuple[int, ...]
    """GQA decode: cached tokens (2^k - 1, so the new token makes a power of two)."""
    mla_past: tuple[int, ...]
    prefill_batch: tuple[int, ...]
    isl: tuple[int, ...]
    kv_dtypes: tuple[str, ...]
    copy_bytes: tuple[int, ...]
    comm_tokens: tuple[int, ...]
    """Tokens per rank whose hidden states a collective moves."""


def _pow2(lo: int, hi: int) -> tuple[int, ...]:
    return tuple(2 ** i for i in range(lo, hi + 1))


MIB = 1 << 20
GRIDS: dict[tuple[str, bool], Grid] = {
    ("cpu", True): Grid(
        m=(1, 16, 128, 1024), tp=(1,), moe_tokens=(1, 16, 128, 1024), ep=(1,),
        decode_batch=(1, 8, 32), decode_past=(15, 255, 1023), mla_past=(16, 256),
        prefill_batch=(1, 2), isl=(16, 128, 512), kv_dtypes=("bf16", "fp8"),
        copy_bytes=(MIB, 64 * MIB), comm_tokens=(1, 256)),
    ("cpu", False): Grid(
        m=_pow2(0, 12), tp=(1, 2), moe_tokens=_pow2(0, 12), ep=(1, 2, 4, 8),
        decode_batch=_pow2(0, 7), decode_past=(15, 63, 255, 1023, 2047),
        mla_past=(16, 256, 2048), prefill_batch=(1, 2, 4, 8),
        isl=(16, 64, 256, 1024, 2048), kv_dtypes=("bf16", "fp8"),
        copy_bytes=(MIB, 16 * MIB, 256 * MIB), comm_tokens=_pow2(0, 12)[::2]),
    ("cuda", True): Grid(
        m=(1, 16, 256, 4096), tp=(1,), moe_tokens=(1, 64, 1024, 8192), ep=(8,),
        decode_batch=(1, 32, 256), decode_past=(1023, 8191), mla_past=(1024, 8192),
        prefill_batch=(1,), isl=(1024, 8192), kv_dtypes=("bf16",),
        copy_bytes=(64 * MIB, 1024 * MIB), comm_tokens=(1, 256, 4096)),
    ("cuda", False): Grid(
        m=_pow2(0, 14), tp=(1,), moe_tokens=_pow2(0, 14), ep=(1, 8, 16, 32, 64),
        decode_batch=(1, 4, 16, 32, 64, 128, 256, 512), decode_past=(1023, 4095, 16383),
        mla_past=(1024, 4096, 16384), prefill_batch=(1, 4),
        isl=(512, 2048, 8192), kv_dtypes=("bf16", "fp8"),
        copy_bytes=(16 * MIB, 256 * MIB, 2048 * MIB), comm_tokens=_pow2(0, 14)[::2]),
}


@dataclass(frozen=True)
class Sweep:
    """Every shape of one calibration run, per operation family."""

    model: str
    device: str
    quick: bool
    shapes: dict[str, list[Any]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    """Operation family -> why it is not measured on this device or model."""

    def total(self) -> int:
        return sum(len(v) for v in self.shapes.values())

    def describe(self) -> dict[str, Any]:
        """Counts and the shapes themselves, for the manifest."""
        return {op: {"count": len(v), "shapes": [asdict(s) for s in v]}
                for op, v in self.shapes.items()}


def _benched(m: ModelSpec) -> dict[str | None, list[str]]:
    """kernels/ family -> the model's attention kinds it measures (None: no family does)."""
    out: dict[str | None, list[str]] = {}
    for k, _ in m.kinds():
        out.setdefault(k.bench, []).append(k.name)
    return out


def _gemm_layers(m: ModelSpec, tp: int) -> list[tuple[str, int, int, bool]]:
    """(layer, n, k, follows the weight dtype) of every dense GEMM the cost model prices."""
    out: list[tuple[str, int, int, bool]] = []
    if "gqa" in _benched(m):  # GQA projections are GEMMs; MLA's are inside its module
        heads, kvh = m.num_attention_heads // tp, max(m.num_kv_heads // tp, 1)
        out += [("qkv_proj", (heads + 2 * kvh) * m.head_dim, m.hidden, True),
                ("o_proj", m.hidden, heads * m.head_dim, True)]
    if m.dense_layers:
        inter = m.dense_intermediate // tp
        out += [("dense_up", 2 * inter, m.hidden, True), ("dense_down", m.hidden, inter, True)]
    if m.is_moe and m.n_shared_experts:
        inter = m.n_shared_experts * m.moe_intermediate // tp
        out += [("shared_up", 2 * inter, m.hidden, True),
                ("shared_down", m.hidden, inter, True)]
    if m.is_moe:
        out.append(("router", m.n_routed_experts, m.hidden, False))
    out.append(("lm_head", m.vocab // tp, m.hidden, False))
    return out


def build_sweep(model: ModelSpec, device: str, quick: bool, fp8: bool,
                ops: tuple[str, ...] = OPS, comm_ranks: int = 2,
                memory_bytes: int = 0) -> Sweep:
    """The shapes `model` needs on a `device` kind; `fp8`: the device multiplies in fp8;
    `memory_bytes`: the device's memory (0: unknown), so that an MoE split whose bf16 expert
    weights would not fit in a third of it is left out (and said so) rather than exhausting it."""
    g = GRIDS[(device, quick)]
    sweep = Sweep(model.name, device, quick)
    tps = [tp for tp in g.tp if model.num_attention_heads % tp == 0]

    if "gemm" in ops:
        dtypes = ("bf16", "fp8") if fp8 else ("bf16",)
        seen: set[tuple[int, int, int, str]] = set()
        gemms: list[GemmShape] = []
        for tp in tps:
            for name, n, k, weight_dtype in _gemm_layers(model, tp):
                for dtype in dtypes if weight_dtype else ("bf16",):
                    for mm in g.m:
                        if (mm, n, k, dtype) not in seen:
                            seen.add((mm, n, k, dtype))
                            gemms.append(GemmShape(mm, n, k, dtype, name))
        sweep.shapes["gemm"] = gemms
        if not fp8:
            sweep.skipped["gemm fp8"] = f"the {device} has no fp8 matrix multiply"

    if "moe" in ops:
        if model.is_moe:
            layer = 3 * model.hidden * model.moe_intermediate * 2 * model.n_routed_experts
            splits = [(ep, 1) for ep in g.ep if model.n_routed_experts % ep == 0]
            splits += [(1, tp) for tp in g.tp if tp > 1 and model.moe_intermediate % tp == 0]
            too_big = [(ep, tp) for ep, tp in splits
                       if memory_bytes and layer / (ep * tp) > memory_bytes / 3]
            if too_big:
                names = ", ".join(f"ep{ep}" if tp == 1 else f"tp{tp}" for ep, tp in too_big)
                biggest = layer / min(ep * tp for ep, tp in too_big)
                sweep.skipped[f"moe {names}"] = (
                    f"up to {biggest / 1e9:.1f} GB of bf16 expert weights per rank exceed a "
                    f"third of the {device}'s {memory_bytes / 1e9:.0f} GB")
            moes = [MoeShape(t, model.hidden, model.moe_intermediate, model.top_k,
                             model.n_routed_experts, ep, tp)
                    for ep, tp in splits if (ep, tp) not in too_big for t in g.moe_tokens]
            sweep.shapes["moe"] = moes
            sweep.skipped["moe fp8"] = "the fused MoE kernel runs bf16 only"
        else:
            sweep.skipped["moe"] = f"{model.name} has no routed experts"

    benched = _benched(model)
    unbenched = ", ".join(benched.get(None, []))
    if "attention" in ops:
        if "gqa" in benched:
            attn: list[AttnShape] = []
            for tp in tps:
                heads, kvh = model.num_attention_heads // tp, max(model.num_kv_heads // tp, 1)
                for kv in g.kv_dtypes:
                    attn += [AttnShape("decode", b, p, heads, kvh, model.head_dim, kv)
                             for b in g.decode_batch for p in g.decode_past]
                    attn += [AttnShape("prefill", b, s, heads, kvh, model.head_dim, kv)
                             for b in g.prefill_batch for s in g.isl]
            sweep.shapes["attention"] = attn
            if model.sliding_layers:
                sweep.skipped["attention window"] = "sliding-window layers are not measured"
        else:
            sweep.skipped["attention"] = (f"{model.name} has no GQA layers (see mla)"
                                          if "mla" in benched else
                                          f"{model.name}'s {unbenched} layers have no "
                                          "microbenchmark; the shipped tables price them")

    if "mla" in ops:
        if "mla" in benched:
            mla: list[MlaShape] = []
            dims = {"hidden": model.hidden, "q_lora": model.q_lora_rank,
                    "kv_lora": model.kv_lora_rank,
                    "nope": model.head_dim - model.qk_rope_head_dim,
                    "rope": model.qk_rope_head_dim, "v": model.v_head_dim}
            for tp in tps:
                heads = model.num_attention_heads // tp
                for kv in g.kv_dtypes:
                    mla += [MlaShape("decode", b, p, heads, kv_dtype=kv, **dims)
                            for b in g.decode_batch for p in g.mla_past]
                    mla += [MlaShape("prefill", b, s, heads, kv_dtype=kv, **dims)
                            for b in g.prefill_batch for s in g.isl]
            sweep.shapes["mla"] = mla
            sweep.skipped["mla fp8"] = "MLA projections are measured in bf16 only"
        else:
            sweep.skipped["mla"] = (f"{model.name} has no MLA layers (see attention)"
                                    if "gqa" in benched else
                                    f"{model.name}'s {unbenched} layers have no "
                                    "microbenchmark; the shipped tables price them")

    if "memory" in ops:
        sweep.shapes["memory"] = [CopyShape(b) for b in g.copy_bytes]

    if "comm" in ops:
        if comm_ranks >= 2:
            sweep.shapes["comm"] = [CommShape(op, comm_ranks * t * model.hidden * 2, comm_ranks)
                                    for op in COMM_OPS for t in g.comm_tokens]
        else:
            sweep.skipped["comm"] = (f"collectives need 2 or more {device} devices; "
                                     f"{comm_ranks} visible")
    return sweep
