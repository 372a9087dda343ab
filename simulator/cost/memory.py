"""Memory per rank: weights, redundant experts, reserves, and the KV pool that is left."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from simulator.specs.deployment import RoleSpec
from simulator.specs.errors import SpecError
from simulator.specs.hardware import HardwareSpec
from simulator.specs.model import HOST_COMPONENTS, ModelSpec

GIB = 1024 ** 3
RESERVE_GB = 3.5
"""CUDA graphs, NCCL/DeepEP buffers and allocator slack per rank (vLLM's own headroom, in GB)."""
ACTIVATION_BYTES_PER_TOKEN_HIDDEN = 20
"""Peak activation bytes per batched token per hidden unit (bf16 residual, norms, MoE buffers)."""

KV_FRACTION_OF: dict[str, str] = {"vllm": "total", "sglang": "static", "trtllm": "free"}
"""What an engine's memory fraction (a role's gpu_memory_utilization, 0.9 by default) is a
fraction of:
- "total", vLLM's --gpu-memory-utilization: of the whole HBM, which weights, activations, the
  reserve and the KV pool share;
- "static", SGLang's --mem-fraction-static: of the whole HBM, for the static allocations only,
  the weights and the KV pool (its server arguments: "the fraction of the memory used for static
  allocation (model weights and KV cache memory pool)"; the pool is HBM x fraction - weights);
  activations, CUDA graphs and buffers take from the rest;
- "free", TensorRT-LLM's KvCacheConfig free_gpu_memory_fraction (default 0.9): of the memory
  left free once the model is loaded, all of it the KV pool's (its docs: "allocate 90% of free
  GPU memory for KV cache")."""


BUDGET: dict[str, Callable[[float, float, float, float], float]] = {
    "total": lambda hbm, fraction, taken, outside: hbm * fraction,
    "static": lambda hbm, fraction, taken, outside: min(hbm * fraction + outside, hbm),
    "free": lambda hbm, fraction, taken, outside: taken + fraction * max(hbm - taken, 0.0),
}
"""Per KV_FRACTION_OF rule: what weights, activations, reserve and the KV pool may take in all,
from the HBM, the fraction, what the rank takes besides its pool, and the activations and reserve
(which SGLang's static fraction leaves out; never more than the HBM)."""


@dataclass(frozen=True)
class RankMemory:
    """Where one rank's memory goes, in bytes."""

    budget: float
    """Memory the engine lets weights, activations, reserve and the KV pool take: HBM x
    gpu_memory_utilization, or, where that fraction is of the free memory (KV_FRACTION_OF),
    the weights, activations and reserve plus that fraction of what they leave."""
    weights: float
    """Weights held by this rank in HBM, redundant expert replicas included, offload taken
    out."""
    offloaded: float
    """Weights this rank keeps in host memory instead (cpu_offload_gb)."""
    redundant_experts: float
    """The part of `weights` that the redundant expert replicas take."""
    activations: float
    """Peak activations for max_num_batched_tokens."""
    reserve: float
    """Fixed runtime reserve."""
    kv_bytes_per_token: float
    """KV bytes one cached token takes on this rank."""

    @property
    def kv_pool(self) -> float:
        return self.budget - self.weights - self.activations - self.reserve

    @property
    def kv_tokens(self) -> int:
        """Tokens of KV cache this rank can hold."""
        return max(int(self.kv_pool // self.kv_bytes_per_token), 0)


def rank_memory(model: ModelSpec, hardware: HardwareSpec, role: RoleSpec, weights: str,
                kv_cache: str, indexer: str = "fp8", engine: str = "vllm") -> RankMemory:
    """Memory of one rank of an instance.

    DEP: attention, dense and shared weights are replicated on every rank; each rank holds
    (routed + redundant) / dep experts per MoE layer. TP: every weight is split over the ranks,
    or, with enable_expert_parallel, the experts are spread whole over the ranks. The MTP
    layers are loaded only when the role decodes speculatively with them, their routed
    experts spread over the EP ranks like the others.
    """
    held, _, redundant, split = _held(model, role, weights)
    # Each kind says how a TP group splits its cache (GQA by KV heads; latent caches not).
    kv = model.kv_bytes_per_token(kv_cache, indexer, split)
    if kv <= 0:  # every layer windowed: a pool token is one token of a window
        kv = model.kv_bytes(1, kv_cache, indexer)
    offload = min(role.cpu_offload_gb * GIB, held)
    plan = prefetch_plan(model, role, weights)
    if plan is not None:  # whole layers go, and one layer's room takes the copy in flight
        offload = plan.layers * plan.layer_bytes - plan.layer_bytes
    activations = float(ACTIVATION_BYTES_PER_TOKEN_HIDDEN * role.max_num_batched_tokens
                        * model.hidden)
    reserve = RESERVE_GB * 1e9 * (hardware.hbm_gb / 80.0 if hardware.name == "cpu" else 1.0)
    fraction_of = KV_FRACTION_OF.get(engine)
    if fraction_of is None:
        raise SpecError(f"engine={engine!r} has no memory rule; known: "
                        f"{', '.join(KV_FRACTION_OF)}")
    taken = held - offload + activations + reserve
    budget = BUDGET[fraction_of](hardware.hbm_bytes, role.gpu_memory_utilization, taken,
                                 activations + reserve)
    return RankMemory(
        budget=budget,
        weights=held - offload,
        offloaded=offload,
        redundant_experts=redundant,
        activations=activations,
        reserve=reserve,
        kv_bytes_per_token=kv,
    )


@dataclass(frozen=True)
class Prefetch:
    """Weight offloading by layers (vLLM --offload-backend prefetch): one decoder layer of
    every `group` lives in host memory and is copied in one layer ahead of its use."""

    group: int
    """--offload-group-size (with --offload-num-in-group 1)."""
    layers: int
    """Decoder layers offloaded."""
    layer_bytes: float
    """Weights of one decoder layer on a rank."""


def prefetch_plan(model: ModelSpec, role: RoleSpec, weights: str) -> Prefetch | None:
    """The layers a prefetch-offloading role moves to host memory: as few as hold its
    cpu_offload_gb, spread one per group over the decoder layers; None for UVA offloading."""
    if role.offload_backend != "prefetch" or not role.cpu_offload_gb:
        return None
    _, layers_held, _, _ = _held(model, role, weights)
    per = layers_held / model.layers
    want = min(max(math.ceil(role.cpu_offload_gb * GIB / per), 1), model.layers)
    group = max(model.layers // want, 1)
    return Prefetch(group, model.layers // group, per)


def kv_split(model: ModelSpec, role: RoleSpec, weights: str) -> int:
    """The TP ranks a rank of `role` shares its KV cache over (`ModelSpec.kv_token_cost`'s
    split): the attention TP group under expert parallelism, else the TP size."""
    return _held(model, role, weights)[3]


def _held(model: ModelSpec, role: RoleSpec, weights: str) -> tuple[float, float, float, int]:
    """(weights a rank holds in HBM before any offloading, the part that is its decoder
    layers', the part that is redundant expert replicas, the ranks a TP group splits its KV
    cache over)."""
    wb = {k: v for k, v in model.weight_bytes(weights).items() if k not in HOST_COMPONENTS}
    mtp = wb["mtp"] if role.speculative is not None else 0.0
    mtp_experts = 0.0
    if mtp and model.is_moe:
        p = model.params()
        mtp_experts = mtp * model.mtp_layers * model.n_routed_experts * model.expert_params() / (
            p["mtp"])
    experts_total = wb["routed_experts"] + mtp_experts
    replicated = sum(v for k, v in wb.items() if k not in ("routed_experts", "mtp")) + (
        mtp - mtp_experts)
    redundant = 0.0
    if role.expert_parallel and model.is_moe:
        per_expert = experts_total / model.n_routed_experts
        slots = (model.n_routed_experts + role.redundant_experts) / role.ranks
        redundant = role.redundant_experts / role.ranks * per_expert
        # attention data-parallel: non-expert weights replicated over the DP ranks, split
        # inside each one's TP group; TP attention with expert-parallel MoE: split over all
        split = role.attention_tp if role.dep is not None else role.ranks
        held = replicated / split + slots * per_expert
        kv_split = split
    else:
        split = role.ranks
        held = (replicated + experts_total) / role.ranks
        kv_split = role.tp or 1
    # not in a decoder layer: the embedding, the lm_head and the draft layers
    outside = (wb["embedding"] + wb["lm_head"] + mtp - mtp_experts) / split + (
        mtp_experts / role.ranks)
    return held, max(held - outside, 0.0), redundant, kv_split


def host_weights_per_gpu(model: ModelSpec, hardware: HardwareSpec, role: RoleSpec,
                         weights: str) -> float:
    """Bytes of host memory per GPU that weights kept in host memory take (V4.1's Engram
    tables): one copy per instance on each host, shared by its DP ranks there (vLLM's
    --engram-config dp_shared_memory), over the instance's GPUs on that host."""
    wb = model.weight_bytes(weights)
    held = sum(wb[k] for k in HOST_COMPONENTS if k in wb)
    return held / min(role.ranks, hardware.gpus_per_host) if held else 0.0


def check_memory(name: str, model: ModelSpec, hardware: HardwareSpec, role: RoleSpec,
                 weights: str, kv_cache: str, min_kv_tokens: int | None = None,
                 indexer: str = "fp8", engine: str = "vllm") -> RankMemory:
    """The rank's memory on `engine`, or a SpecError with the numbers when it does not fit.

    The KV pool must hold at least `min_kv_tokens` (default: one max_num_batched_tokens chunk).
    """
    mem = rank_memory(model, hardware, role, weights, kv_cache, indexer, engine)
    tables = host_weights_per_gpu(model, hardware, role, weights)
    host = (role.cpu_offload_gb + role.host_cache_gb) * GIB + tables
    if host > hardware.host_gb * 1e9:
        held = f" plus {tables / 1e9:.0f} GB of Engram tables" if tables else ""
        raise SpecError(f"{name}: cpu_offload_gb={role.cpu_offload_gb:g} plus "
                        f"host_cache_gb={role.host_cache_gb:g} GiB{held} exceed the "
                        f"{hardware.host_gb:.0f} GB of host memory per GPU of {hardware.name}")
    need = min_kv_tokens if min_kv_tokens is not None else role.max_num_batched_tokens
    if mem.kv_tokens < need:
        gb = 1e9
        raise SpecError(
            f"{name}: {model.name} does not fit {role.layout} on {hardware.name}: per rank "
            f"{mem.weights / gb:.1f} GB weights (incl. {mem.redundant_experts / gb:.1f} GB "
            f"redundant experts, {mem.offloaded / gb:.1f} GB more offloaded to the host) + "
            f"{mem.activations / gb:.1f} GB activations + "
            f"{mem.reserve / gb:.1f} GB reserve leaves {max(mem.kv_pool, 0) / gb:.1f} GB for KV "
            f"({mem.kv_tokens} tokens) of {mem.budget / gb:.1f} GB usable, but at least {need} "
            f"tokens are needed; use a larger dep/tp, fewer redundant experts, fp8/fp4 "
            f"weights, or cpu_offload_gb")
    return mem
