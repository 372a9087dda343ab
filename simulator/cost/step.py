"""Step time of one engine step of one instance, composed per layer from priced operations.

`step_time(instance, batch, calibration)` is pure: the calibration tables are loaded outside and
passed in. All DP ranks of an instance step in lock-step, so attention and dense work cost what the
slowest rank costs, and the MoE costs what the most-loaded EP rank costs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from simulator.calibration import Calibration, Priced
from simulator.calibration.grid import SOURCES
from simulator.cost.memory import prefetch_plan
from simulator.specs.deployment import MEGA_MOE_ARCHITECTURES, RoleSpec, uses_mega_moe
from simulator.specs.hardware import HardwareSpec
from simulator.specs.model import ModelSpec

CATEGORIES = ("attention", "moe", "communication", "dense", "other")
"""Breakdown of a step; they sum to the total."""

STEP_OVERHEAD_MS = {"gpu": 1.0, "cpu": 5.0}
"""Fixed per-step cost (scheduling, input preparation, sampling launch) when none is measured."""


@dataclass(frozen=True)
class SharedStream:
    """When an engine runs a MoE layer's shared experts on a second CUDA stream, beside its
    routed path (router, token exchange, routed experts): the layer then takes the longer of
    the two instead of their sum."""

    max_tokens: int | None
    """Tokens per rank in the step at most (None: any)."""
    decode_only: bool
    """Only in decode-only steps (the engine switches streams only inside CUDA graphs)."""
    deepep: bool
    """Also where DP ranks exchange tokens over DeepEP (under the dispatch and combine)."""
    deepep_eplb: bool
    """There too with redundant experts (EPLB)."""
    source: str


SHARED_EXPERT_STREAMS = {
    "vllm": SharedStream(256, False, True, False,
                         "vLLM: VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD, default 256 "
                         "(fused_moe/runner/shared_experts.py); with DeepEP inside its "
                         "dispatch/combine, not with EPLB there"),
    "sglang": SharedStream(1024, False, False, False,
                           "SGLang: DUAL_STREAM_TOKEN_THRESHOLD 1024 (models/deepseek_v2.py, "
                           "DeepseekV2MoE.forward), not with DeepEP"),
    "trtllm": SharedStream(None, True, True, True,
                           "TensorRT-LLM: maybe_execute_in_parallel, multi-stream only under "
                           "CUDA graphs (_torch/modules/multi_stream_utils.py)"),
}
"""Engines that overlap shared and routed experts, and when (read in each engine's source)."""


def shared_stream(inst: Instance, engine: str, tokens: float, decode_only: bool) -> bool:
    """Whether `engine` runs the shared experts of a step with `tokens` per rank (the busiest)
    on a second stream (never on the CPU: no CUDA streams)."""
    rule = SHARED_EXPERT_STREAMS.get(engine)
    if rule is None or inst.hardware.name == "cpu" or not inst.model.n_shared_experts:
        return False
    if inst.dp > 1 and inst.all2all.startswith("deepep") and not (
            rule.deepep and (rule.deepep_eplb or not inst.redundant_experts)):
        return False
    return (rule.max_tokens is None or tokens <= rule.max_tokens) and (
        decode_only or not rule.decode_only)


@dataclass(frozen=True)
class Instance:
    """Everything the cost model needs about one engine instance (plain data)."""

    model: ModelSpec
    hardware: HardwareSpec
    role: str
    """prefill, decode or aggregated."""
    ranks: int
    """GPUs of the instance."""
    expert_parallel: bool
    """DEP: attention data-parallel and MoE expert-parallel over the ranks; else TP."""
    attn_tp: int = 1
    """DEP layouts: GPUs of each attention DP rank (a TP group); `ranks` counts all GPUs."""
    tp_expert_parallel: bool = False
    """TP layouts only: MoE experts split over the TP ranks (vLLM --enable-expert-parallel)."""
    weights: str = "fp8"
    kv_cache: str = "fp8"
    indexer_cache: str = "fp8"
    """Sparse-attention indexer key cache dtype (DeepSeek-V3.2 / V4): fp8 or fp4."""
    redundant_experts: int = 0
    spec_tokens: int = 0
    """MTP draft tokens per step (0: no speculative decoding)."""
    spec_acceptance: float = 0.0
    a2a_gb_s: float = 0.0
    """Per-GPU all-to-all bandwidth inside the instance (from the topology); 0: scale-up."""
    all2all: str = "deepep_low_latency"
    """MoE token exchange between DP ranks (vLLM --all2all-backend): deepep_low_latency,
    deepep_high_throughput, flashinfer_nvlink_one_sided (TOKEN_EXCHANGES), or an NCCL
    all-gather + reduce-scatter for the others."""
    overhead_ms: float | None = None
    """Fixed per-step overhead; None: the default for the hardware kind."""
    overhead_per_layer_ms: float = 0.0
    """Per-step overhead for each decoder layer, on top of `overhead_ms` (the fitted serving
    stack's: the small kernels a layer launches that no measured table prices)."""
    overhead_per_seq_ms: float = 0.0
    """Per-step overhead for each request the busiest rank runs in the step (the serving
    stack's per-request work on the step's critical path: scheduling and output processing,
    and streaming where the API server shares the engine's core); measured, 0 without it."""
    offload_bytes: float = 0.0
    """Weights per GPU in host memory, read in place over the host link in every forward
    pass (UVA offloading)."""
    prefetch: tuple[int, float] | None = None
    """Prefetch offloading: (decoder layers in host memory, bytes of each), each copied over
    the host link under the previous layer's compute; None without it."""
    dbo: bool = False
    """Dual-batch overlap (vLLM --enable-dbo): steps over the thresholds run as two
    micro-batches, one's all-to-all under the other's compute."""
    dbo_thresholds: tuple[int, int] = (32, 512)
    """Tokens per rank above which a decode-only / a prefill step is split."""
    mega_moe: bool = False
    """Routed experts on DeepGEMM's MegaMoE kernel: dispatch, expert GEMMs and combine in one
    kernel that overlaps the exchange with the GEMMs (vLLM --moe-backend deep_gemm_mega_moe)."""

    @property
    def tp(self) -> int:
        return self.attn_tp if self.expert_parallel else self.ranks

    @property
    def dp(self) -> int:
        return self.ranks // self.attn_tp if self.expert_parallel else 1

    @property
    def ep(self) -> int:
        """MoE expert-parallel size."""
        moe_ep = self.expert_parallel or self.tp_expert_parallel
        return self.ranks if moe_ep and self.model.is_moe else 1

    @property
    def moe_tp(self) -> int:
        """Ranks each expert's weights are split over."""
        return 1 if self.ep > 1 else self.tp

    @property
    def a2a_bandwidth(self) -> float:
        """GB/s per GPU for the all-to-all (the scale-up bandwidth when the topology gave none)."""
        return self.a2a_gb_s or self.hardware.scaleup_gb_s

    @property
    def fixed_overhead_ms(self) -> float:
        """The per-step overhead's part that does not grow with the layers."""
        if self.overhead_ms is not None:
            return self.overhead_ms
        return STEP_OVERHEAD_MS["cpu" if self.hardware.name == "cpu" else "gpu"]

    @property
    def step_overhead_ms(self) -> float:
        return self.fixed_overhead_ms + self.overhead_per_layer_ms * self.model.layers


def overhead_source(inst: Instance) -> str:
    """Where an instance's per-step overhead comes from, for a step's provenance."""
    if inst.overhead_per_layer_ms > 0:
        return (f"measured ({inst.fixed_overhead_ms:g} ms + {inst.overhead_per_layer_ms:g} ms "
                f"per decoder layer x {inst.model.layers})")
    if inst.overhead_ms is not None:
        return "measured (fixed)"
    return f"roofline (assumed fixed {inst.step_overhead_ms} ms per step)"


def instance_from_role(model: ModelSpec, hardware: HardwareSpec, role_name: str, role: RoleSpec,
                       weights: str, kv_cache: str, a2a_gb_s: float = 0.0,
                       overhead_ms: float | None = None,
                       indexer_cache: str = "fp8",
                       overhead_per_seq_ms: float = 0.0,
                       overhead_per_layer_ms: float = 0.0) -> Instance:
    """The cost-model view of one instance of a deployment role."""
    spec = role.speculative
    plan = prefetch_plan(model, role, weights)
    return Instance(
        model=model, hardware=hardware, role=role_name, ranks=role.ranks,
        expert_parallel=role.dep is not None,
        attn_tp=role.attention_tp if role.dep is not None else 1,
        tp_expert_parallel=role.dep is None and role.enable_expert_parallel,
        weights=weights, kv_cache=kv_cache, indexer_cache=indexer_cache,
        redundant_experts=role.redundant_experts,
        spec_tokens=spec.tokens if spec else 0, spec_acceptance=spec.acceptance if spec else 0.0,
        a2a_gb_s=a2a_gb_s,
        all2all=role.backend(role_name),
        overhead_ms=overhead_ms, overhead_per_seq_ms=overhead_per_seq_ms,
        overhead_per_layer_ms=overhead_per_layer_ms,
        offload_bytes=0.0 if plan is not None else role.cpu_offload_gb * 1024 ** 3,
        prefetch=None if plan is None else (plan.layers, plan.layer_bytes),
        dbo=role.dbo and role.dep is not None,
        dbo_thresholds=(role.dbo_decode_token_threshold, role.dbo_prefill_token_threshold),
        mega_moe=uses_mega_moe(model.architecture, hardware.name, role, weights))


@dataclass(frozen=True)
class Batch:
    """The work of one step on each DP rank (every array has one entry per rank)."""

    decode_requests: np.ndarray
    """Requests generating tokens this step."""
    decode_context: np.ndarray
    """Mean KV length of those requests."""
    prefill_tokens: np.ndarray = field(default_factory=lambda: np.zeros(1))
    """New prompt tokens computed this step (one chunk per request)."""
    prefill_requests: np.ndarray = field(default_factory=lambda: np.zeros(1))
    """Requests those prompt tokens belong to."""
    prefill_context: np.ndarray = field(default_factory=lambda: np.zeros(1))
    """Mean tokens already cached for them before this chunk (prefix hits, earlier chunks)."""
    expert_tokens: np.ndarray | None = None
    """Token-to-expert assignments each EP rank receives; None: spread evenly."""

    def halved(self) -> Batch:
        """One of the two micro-batches dual-batch overlap splits this batch into."""
        return Batch(self.decode_requests / 2, self.decode_context, self.prefill_tokens / 2,
                     self.prefill_requests / 2, self.prefill_context,
                     None if self.expert_tokens is None else self.expert_tokens / 2)

    @classmethod
    def decode(cls, ranks: int, requests: float, context: float) -> Batch:
        """The same decode batch on every rank."""
        return cls(np.full(ranks, float(requests)), np.full(ranks, float(context)),
                   np.zeros(ranks), np.zeros(ranks), np.zeros(ranks))

    @classmethod
    def prefill(cls, ranks: int, tokens: float, requests: float = 1.0,
                context: float = 0.0) -> Batch:
        """The same prefill chunk on every rank."""
        return cls(np.zeros(ranks), np.zeros(ranks), np.full(ranks, float(tokens)),
                   np.full(ranks, float(requests)), np.full(ranks, float(context)))


@dataclass(frozen=True)
class StepTime:
    """Duration of one step, its breakdown, and which source priced each operation."""

    total_ms: float
    breakdown: dict[str, float]
    """ms per category (attention, moe, communication, dense, other); sums to total_ms."""
    provenance: dict[str, str]
    """operation -> 'source (table)'."""
    parts: dict[str, float]
    """ms per priced operation over all layers (finer than `breakdown`; sums to total_ms)."""
    tokens: float
    """Tokens computed this step over all ranks (decode tokens count accepted ones)."""

    @property
    def source(self) -> str:
        """The least trustworthy source among the operations."""
        worst = max((SOURCES.index(w) for w in (v.split(" ")[0] for v in
                                                  self.provenance.values()) if w in SOURCES),
                    default=0)
        return SOURCES[worst]


class _Ledger:
    """Accumulates ms per category and the provenance of every priced operation."""

    def __init__(self) -> None:
        self.ms = dict.fromkeys(CATEGORIES, 0.0)
        self.parts: dict[str, float] = {}
        self.provenance: dict[str, str] = {}

    def add(self, category: str, op: str, priced: Priced | None, ms: float) -> None:
        self.ms[category] += ms
        self.parts[op] = self.parts.get(op, 0.0) + ms
        if priced is not None:
            self.provenance[op] = f"{priced.source} ({priced.table})"


def _per_rank(a: np.ndarray, ranks: int) -> np.ndarray:
    a = np.asarray(a, dtype=float)
    return np.broadcast_to(a, (ranks,)) if a.size == 1 else a


REPLAY_TRIM_MIN_TOKENS = 768
"""A step with prompt work of fewer tokens on every rank runs DeepSeek-V4.1's late layers on
whole prompt chunks where it runs as a CUDA graph (vLLM's decoder_replay_trim_threshold;
prefill instances run eager steps, which always trim). Sequence parallelism (expert parallel
with TP attention and MegaMoE or DP) and dual-batch overlap turn the bounded replay off
(`bounded_replay`)."""


def sequence_parallel(inst: Instance) -> bool:
    """Whether `inst` runs DeepSeek-V4's sequence parallelism: expert parallel with TP
    attention, on MegaMoE or over DP ranks (vLLM's `_use_sequence_parallel`,
    vllm/models/deepseek_v41/nvidia/model.py). Each TP rank then keeps 1/tp of the step's
    tokens through the hyper-connections, the router and the MoE (MegaMoE dispatches a rank's
    own shard), and attention all-gathers its input and reduce-scatters its output over the
    TP group instead of all-reducing after attention and after the MoE."""
    return (inst.model.architecture in MEGA_MOE_ARCHITECTURES and inst.tp > 1
            and inst.ep > 1 and (inst.mega_moe or inst.dp > 1))


def bounded_replay(inst: Instance) -> bool:
    """Whether `inst` runs V4.1's bounded replay: the late layers prefill each chunk's last
    window only, and a prefix hit recomputes its last window (its window entries are not
    cached) instead of keeping them. Sequence parallelism and dual-batch overlap's
    micro-batches turn it off (the replay's batch shrinks per rank, which neither can follow:
    vLLM's `_decoder_replay_supported`)."""
    m = inst.model
    return m.replay_from < m.layers and not (sequence_parallel(inst) or inst.dbo)


def prefix_rewind(inst: Instance) -> int:
    """Tokens of a prefix-cache hit that `inst` computes again: the window with V4.1's
    bounded replay (a hit of no more is not used at all; vLLM's scheduler), else 0."""
    return inst.model.sliding_window if bounded_replay(inst) else 0


def _replays(inst: Instance, tokens: np.ndarray, pre_tok: np.ndarray) -> bool:
    """Whether a step with `tokens` (of which `pre_tok` prompt tokens) on each rank runs the
    bounded replay: decided for the step, every rank alike (lock-step DP ranks run the same
    graph mode)."""
    return bounded_replay(inst) and bool(pre_tok.any()) and (
        inst.role == "prefill" or float(tokens.max()) >= REPLAY_TRIM_MIN_TOKENS)


def step_replays(inst: Instance, batch: Batch) -> bool:
    """`_replays` of a whole step (the decision a rank's attention in it depends on besides its
    own row: `rank_work_ms`'s `replay`)."""
    dec_b, _, pre_tok, _, _ = _rank_columns(batch, inst.dp)
    return _replays(inst, dec_b * (1 + inst.spec_tokens) + pre_tok, pre_tok)


def _tail(inst: Instance, tokens: np.ndarray, pre_tok: np.ndarray, pre_req: np.ndarray,
          replay: bool | None = None) -> np.ndarray | None:
    """Prompt tokens per rank the layers from `replay_from` on compute in this step: each
    prompt chunk's last `sliding_window` tokens (the causal encoder-decoder's bounded replay;
    V4.1); None when every layer computes every token. `replay`: the step's decision when
    these ranks are not the whole step (else taken from them)."""
    m = inst.model
    if not (_replays(inst, tokens, pre_tok) if replay is None
            else replay and bounded_replay(inst)):
        return None
    isl = pre_tok / np.maximum(pre_req, 1)
    out: np.ndarray = pre_req * np.minimum(isl, m.sliding_window)
    return out


def _groups(inst: Instance, tokens: np.ndarray, pre_tok: np.ndarray,
            tail: np.ndarray | None) -> list[tuple[int, int, np.ndarray]]:
    """(layers, MoE layers, tokens per rank) of each group of layers that computes the same
    tokens: every layer, or, with a `tail`, the layers before `replay_from` on every token and
    those from it on the decode tokens and each prompt chunk's tail."""
    m = inst.model
    moe = m.moe_layers if m.is_moe else 0
    if tail is None:
        return [(m.layers, moe, tokens)]
    cut = m.replay_from
    late = max(m.layers - max(cut, m.dense_layers), 0) if moe else 0
    return [(cut, moe - late, tokens), (m.layers - cut, late, tokens - pre_tok + tail)]


_ATTENTION_KEYS: dict[tuple[str, str, str], str] = {}
"""(layer kind, phase, part) -> its key in a step's parts."""


def _top(ms: np.ndarray) -> float:
    """The largest entry of `ms` as a float: a few entries (a step's distinct rows) without
    numpy's reduction, whose call costs more than comparing them."""
    if ms.size <= 8:
        return float(max(ms.ravel().tolist()))
    return float(ms.max())


def _attention(inst: Instance, cal: Calibration, decode_b: np.ndarray, decode_ctx: np.ndarray,
               pre_tok: np.ndarray, pre_req: np.ndarray, pre_ctx: np.ndarray,
               led: _Ledger, tail: np.ndarray | None = None) -> np.ndarray:
    """Per-rank ms of every attention layer of the model, each priced by its kind; with a
    `tail`, the layers from `replay_from` on prefill only each chunk's last window."""
    m = inst.model
    out = np.zeros_like(decode_b)
    dec, pre = decode_b > 0, pre_tok > 0
    late = dict(m.replay_kinds) if tail is not None else {}
    parts_ms, provenance = led.parts, led.provenance

    def book(kind: str, phase: str, ranks: np.ndarray | slice, layers: int,
             parts: dict[str, Priced]) -> None:
        for name, p in parts.items():
            ms = layers * p.ms
            out[ranks] += ms
            key = _ATTENTION_KEYS.get((kind, phase, name))
            if key is None:
                key = _ATTENTION_KEYS[kind, phase, name] = f"attention.{kind}.{phase}.{name}"
            parts_ms[key] = parts_ms.get(key, 0.0) + _top(ms)
            provenance[key] = f"{p.source} ({p.table})"

    # a mask every rank passes indexes as the whole array (the same sums, without the gather)
    dec_at: np.ndarray | slice = slice(None) if dec.all() else dec
    pre_at: np.ndarray | slice = slice(None) if pre.all() else pre
    decoding, prefilling = bool(dec.any()), bool(pre.any())
    if decoding:
        queries, context = decode_b[dec] * (1 + inst.spec_tokens), decode_ctx[dec]
    if prefilling:
        requests, past = pre_req[pre], pre_ctx[pre]
        isl = pre_tok[pre] / np.maximum(requests, 1)
        last = np.minimum(isl, m.sliding_window)
    for kind, layers in m.kinds():
        if decoding:
            book(kind.name, "decode", dec_at, layers, kind.decode(cal, inst, queries, context))
        if prefilling:
            replayed = late.get(kind.name, 0)
            if layers > replayed:
                book(kind.name, "prefill", pre_at, layers - replayed,
                     kind.prefill(cal, inst, requests, isl, past))
            if replayed:  # each chunk's last window, after the rest of the chunk
                book(kind.name, "prefill_tail", pre_at, replayed,
                     kind.prefill(cal, inst, requests, last, past + isl - last))
    if late and prefilling:  # the cut layer's compressor writes records for every token
        cut = m.layer_kind_names()[m.replay_from]
        kv = cal.gemm(pre_tok[pre], m.head_dim, m.hidden, "bf16")
        keys = cal.gemm(pre_tok[pre], m.index_head_dim, m.head_dim, "bf16")
        book(cut, "prefill", pre, 1, {"compressor": type(kv)(kv.ms + keys.ms, kv.source,
                                                               kv.table)})
    return out


def step_time(inst: Instance, batch: Batch, cal: Calibration) -> StepTime:
    """Duration of one engine step of `inst` running `batch` (see module docstring).

    With dual-batch overlap a step over vLLM's token thresholds runs as two micro-batches:
    while one exchanges its tokens (dispatch / combine), the other computes. Per layer that is
    the four slots of `_overlapped` (each exchange beside one compute stage of the other
    micro-batch, slowed by the SMs a normal-mode exchange holds) plus one layer's fill, bounded
    below by max(compute, exchange) of the whole batch (overlap hides, it never removes) and
    above by their sum (never slower than not overlapping). The exchange left exposed is what
    the breakdown books as communication."""
    return close_step(inst, open_step(inst, batch, cal), cal, most_loaded(inst, batch))


def most_loaded(inst: Instance, batch: Batch) -> float | None:
    """Token-to-expert assignments of the most-loaded EP rank in `batch`; None: spread evenly
    (no `expert_tokens`, or no expert parallelism)."""
    if batch.expert_tokens is None or inst.ep <= 1:
        return None
    return float(np.max(batch.expert_tokens))


@dataclass(frozen=True)
class _Open:
    """One micro-batch priced up to its routed experts."""

    led: _Ledger
    even: float
    """The most-loaded EP rank's assignments when they are spread evenly."""
    decode_only: bool
    draft: tuple[float, float, float | None] | None
    """Drafting: (decode requests / tokens of the busiest ranks, the drafts' logits ms
    (`_draft_logits`), `_draft_attention`); None without it."""
    accepted: float
    late: tuple[int, float] | None = None
    """V4.1 prefill: (MoE layers from `replay_from` on, their share of the step's tokens);
    None when every layer computes every token."""
    shared_stream: bool = False
    """The shared experts run beside the routed path (SHARED_EXPERT_STREAMS)."""


@dataclass(frozen=True)
class OpenStep:
    """A step priced up to its routed experts, whose price depends on the batch only through
    the most-loaded EP rank's assignments: `close_step` finishes it for any such load, the
    same StepTime as `step_time`, bit for bit (a memo keeps one per batch, not one per expert
    load)."""

    full: _Open | StepTime
    """The whole batch (a StepTime when the step computes nothing)."""
    half: _Open | None
    """Dual-batch overlap: one of its two micro-batches, when the step splits."""


def _rank_columns(batch: Batch, dp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                  np.ndarray, np.ndarray]:
    """The batch's decode requests, decode context, prefill tokens, prefill requests and
    prefill context, one entry per DP rank."""
    return (_per_rank(batch.decode_requests, dp), _per_rank(batch.decode_context, dp),
            _per_rank(batch.prefill_tokens, dp), _per_rank(batch.prefill_requests, dp),
            _per_rank(batch.prefill_context, dp))


def _distinct_ranks(*columns: np.ndarray) -> np.ndarray | slice:
    """Indices of the first rank of each distinct row of `columns` (one entry per rank), in
    rank order; every rank (a slice) when the rows are all distinct. A step the memo composes
    is its front's few rows padded to the DP size by repeating the first."""
    n = len(columns[0])
    if n <= 1:
        return slice(None)
    first: dict[tuple[float, ...], int] = {}
    for i, row in enumerate(zip(*(c.tolist() for c in columns), strict=True)):
        first.setdefault(row, i)
    return slice(None) if len(first) == n else np.fromiter(first.values(), dtype=np.intp)


def _rank_local(inst: Instance, cal: Calibration, tokens: np.ndarray,
                groups: list[tuple[int, int, np.ndarray]]
                ) -> Iterator[tuple[str, str, Priced, np.ndarray]]:
    """The work outside attention that each DP rank computes on its own tokens, between two
    exchanges: (category, part, its pricing, ms of all its layers per rank) for mHC, Engram,
    the dense MLP layers, the shared experts and the router, in the order a step books them.
    A step charges each part's slowest rank; a rank with less waits for it (`rank_work_ms`)."""
    m = inst.model
    # the tokens a TP rank keeps outside attention: 1/tp of them with sequence parallelism
    sp = sequence_parallel(inst)
    shard: Callable[[np.ndarray], np.ndarray] = (
        (lambda w: np.ceil(w / inst.tp)) if sp else (lambda w: w))
    if m.hc_mult > 1:  # V4 hyper-connections: pre and post mixing around both sublayers
        for layers, _, work in groups:
            mhc = cal.mhc(shard(work), m.hidden, m.hc_mult, m.hc_sinkhorn_iters)
            yield "other", "mhc", mhc, layers * mhc.ms
    if m.engram_layers:  # V4.1 Engram: project the gathered n-gram rows (in encoder layers;
        # the gathers come from host memory ahead of use, on a side stream)
        eng = cal.gemm(tokens, (m.hc_mult + 1) * m.hidden // inst.tp, m.engram_key_width(),
                       inst.weights)
        yield "other", "engram", eng, m.engram_layers * eng.ms

    # Dense MLP layers and the shared experts run on each rank's own tokens.
    if m.dense_layers:
        inter = m.dense_intermediate // inst.tp
        up = cal.gemm(tokens, 2 * inter, m.hidden, inst.weights)
        down = cal.gemm(tokens, m.hidden, inter, inst.weights)
        yield "dense", "dense_mlp", up, m.dense_layers * (up.ms + down.ms)
    moe_layers = m.moe_layers if m.is_moe else 0
    if moe_layers and m.n_shared_experts:
        inter = m.n_shared_experts * m.moe_intermediate // inst.tp
        for _, moe, work in groups:
            up = cal.gemm(work, 2 * inter, m.hidden, inst.weights)
            down = cal.gemm(work, m.hidden, inter, inst.weights)
            yield "moe", "shared_experts", up, moe * (up.ms + down.ms)
    if moe_layers:  # the router
        hashed = m.hash_layers  # hash-routed layers (V4, the first ones) look their experts
        for _, moe, work in groups:  # up by token id: no gate GEMM
            router = cal.gemm(shard(work), m.n_routed_experts, m.hidden, "bf16")
            gated = max(moe - hashed, 0)
            hashed = max(hashed - moe, 0)
            yield "moe", "router", router, gated * router.ms


def rank_work_ms(inst: Instance, batch: Batch, cal: Calibration, replay: bool | None = None,
                 shared: bool | None = None) -> np.ndarray:
    """Each DP rank's ms of the work it computes on its own tokens in `batch`: every attention
    layer, mHC, Engram, dense MLP layers, shared experts (unless they run on a second stream
    beside the routed path), router and logits. Lock-step ranks meet at every exchange, so a
    rank with less of this work waits for the one with the most. A rank's figure depends on
    its own row and on the step's `replay` (`step_replays`) and `shared` (`step_shares`)
    decisions, given when the rows are not one whole step."""
    cols = _rank_columns(batch, inst.dp)
    dec_b, _, pre_tok, pre_req, _ = cols
    spec = inst.spec_tokens
    tokens = dec_b * (1 + spec) + pre_tok
    tail = _tail(inst, tokens, pre_tok, pre_req, replay)
    ms = _attention(inst, cal, *cols, _Ledger(), tail)
    if shared is None:
        shared = step_shares(inst, batch, cal.engine)
    for _, part, _, part_ms in _rank_local(inst, cal, tokens, _groups(inst, tokens, pre_tok,
                                                                       tail)):
        if not (shared and part == "shared_experts"):
            ms = ms + part_ms
    out: np.ndarray = ms + _head(inst, cal, dec_b, pre_req).ms
    return out


def _head(inst: Instance, cal: Calibration, dec_b: np.ndarray, pre_req: np.ndarray) -> Priced:
    """The LM head on each rank: a row per decode token (drafts included) and per prompt."""
    return _logits(inst, cal, dec_b * (1 + inst.spec_tokens) + pre_req, inst.model.hidden)


def _logits(inst: Instance, cal: Calibration, rows: np.ndarray, width: int) -> Priced:
    """`rows` per rank projected from `width` dims onto the rank's share of the vocabulary."""
    return cal.gemm(rows, inst.model.vocab // inst.tp, width, "bf16")


def step_shares(inst: Instance, batch: Batch, engine: str) -> bool:
    """Whether `engine` runs the shared experts of the whole step `batch` on a second stream
    (`shared_stream`: decided by the busiest rank's tokens)."""
    dec_b, _, pre_tok, _, _ = _rank_columns(batch, inst.dp)
    return _shares(inst, engine, dec_b, pre_tok)


def _shares(inst: Instance, engine: str, dec_b: np.ndarray, pre_tok: np.ndarray) -> bool:
    """`step_shares` of a step's decode requests and prompt tokens per rank."""
    tokens = dec_b * (1 + inst.spec_tokens) + pre_tok
    return shared_stream(inst, engine, float(tokens.max()),
                         bool(dec_b.sum() > 0 and pre_tok.sum() == 0))


def open_step(inst: Instance, batch: Batch, cal: Calibration) -> OpenStep:
    """`batch` on `inst` priced but for its routed experts (see `OpenStep`)."""
    full = _open(inst, batch, cal)
    if isinstance(full, StepTime) or not inst.dbo or full.led.ms["communication"] <= 0 or (
            not _splits(inst, batch)):
        return OpenStep(full, None)
    half = _open(inst, batch.halved(), cal)
    assert not isinstance(half, StepTime)
    return OpenStep(full, half)


def close_step(inst: Instance, opened: OpenStep, cal: Calibration,
               top: float | None) -> StepTime:
    """The StepTime of an opened step whose most-loaded EP rank receives `top` token-to-expert
    assignments (None: spread evenly)."""
    if isinstance(opened.full, StepTime):
        return opened.full
    full = _close(inst, opened.full, cal, top)
    if opened.half is None:
        return full
    half = _close(inst, opened.half, cal, None if top is None else top / 2)
    comm = full.breakdown["communication"]
    over = inst.step_overhead_ms
    c, m = full.total_ms - comm - over, comm
    mh = half.breakdown["communication"]
    ch = half.total_ms - mh - over
    layers = max(inst.model.moe_layers, 1)
    held = exchange_sm_share(inst)
    body = float(np.clip(_overlapped(half, ch, layers, held) + min(ch, mh) / layers,
                         max(c, m), c + m))
    exposed = body - c
    share = exposed / m
    parts = {k: (v * share if k.startswith("all_to_all") else v) for k, v in full.parts.items()}
    breakdown = {**full.breakdown, "communication": exposed}
    note = f"; the exchange holds {held:.0%} of the SMs" if held else ""
    provenance = {**full.provenance,
                  "dbo": f"two micro-batches, {exposed:.3g} of {m:.3g} ms exchange exposed{note}"}
    return StepTime(body + over, breakdown, provenance, parts, full.tokens)


DEEPEP_NORMAL_SMS = 20
"""SMs DeepEP's normal (high-throughput) kernels run on for as long as they move tokens:
DeepEP's default `Buffer.num_sms`, which vLLM keeps (`DeepEPAll2AllManagerBase.num_sms`) and,
under dual-batch overlap, reserves for them (`VLLM_DBO_COMM_SMS`, 20: DeepGEMM gets the rest);
the DeepSeek-V3 report gives communication 20 of H800's 132 SMs. Its low-latency kernels wait
for the network in a receive hook that holds no SM (DeepEP's README; vLLM's SM control
applies to the high-throughput kernels only), so their exchange takes nothing from the
compute it overlaps."""


def exchange_sm_share(inst: Instance) -> float:
    """The share of a GPU's SMs the instance's token exchange holds while it runs."""
    if inst.all2all != "deepep_high_throughput":
        return 0.0
    return min(DEEPEP_NORMAL_SMS / inst.hardware.sms, 1.0)


def _overlapped(half: StepTime, compute: float, layers: int, held: float) -> float:
    """A dual-batch-overlap step's time but for its fill, from one micro-batch's prices.

    Per MoE layer the two micro-batches take turns, as vLLM schedules them (docs/design/
    dbo.md): while one computes its attention (projections, core attention, the MoE gate) the
    other's dispatch is in flight, then its routed experts beside the other's dispatch, its
    shared and routed experts beside the other's combine, its shared experts and the next
    attention beside its own combine: four slots, (dispatch | attention), (dispatch |
    experts), (combine | shared + experts), (combine | shared + attention), each as long as
    the longer of its two. An exchange that holds a share of the SMs slows the compute beside
    it by that share of its own time. Attention is everything but the shared and routed
    experts."""
    def slot(exchange: float, work: float) -> float:
        return max(exchange, work + held * exchange)

    shared = half.parts.get("shared_experts", 0.0) / layers
    experts = half.breakdown["moe"] / layers - shared - half.parts.get("router", 0.0) / layers
    attn = compute / layers - experts - shared
    d = half.parts.get("all_to_all.dispatch", 0.0) / layers
    c = half.parts.get("all_to_all.combine", 0.0) / layers
    return layers * (slot(d, attn) + slot(d, experts) + slot(c, shared + experts)
                     + slot(c, shared + attn))


def _splits(inst: Instance, batch: Batch) -> bool:
    """Whether vLLM's dual-batch overlap splits this step (tokens per rank over the
    threshold of its kind: decode-only, or with prefill work)."""
    dec = np.asarray(batch.decode_requests, dtype=float) * (1 + inst.spec_tokens)
    pre = np.asarray(batch.prefill_tokens, dtype=float)
    tokens = float(np.max(dec + pre))
    threshold = inst.dbo_thresholds[1] if pre.sum() > 0 else inst.dbo_thresholds[0]
    return tokens > threshold


def _open(inst: Instance, batch: Batch, cal: Calibration) -> _Open | StepTime:
    """One micro-batch without dual-batch overlap, priced up to its routed experts (a
    StepTime when it computes nothing)."""
    m = inst.model
    dp = inst.dp
    led = _Ledger()
    dec_b, dec_ctx, pre_tok, pre_req, pre_ctx = _rank_columns(batch, dp)
    spec = inst.spec_tokens
    tokens = dec_b * (1 + spec) + pre_tok  # per rank, computed this step
    if tokens.sum() <= 0:
        return StepTime(inst.step_overhead_ms, {**dict.fromkeys(CATEGORIES, 0.0),
                                                "other": inst.step_overhead_ms},
                        {"overhead": overhead_source(inst)}, {"overhead": inst.step_overhead_ms},
                        0.0)
    if inst.overhead_per_seq_ms > 0:
        running = float(np.max(dec_b + pre_req))
        led.add("other", "request_overhead", None, inst.overhead_per_seq_ms * running)
        led.provenance["request_overhead"] = (
            f"measured ({inst.overhead_per_seq_ms:g} ms per request of the busiest rank)")

    # V4.1's late layers prefill only each chunk's last window: the layers fall in groups
    # that compute the same tokens (one group for every other model).
    tail = _tail(inst, tokens, pre_tok, pre_req)
    groups = _groups(inst, tokens, pre_tok, tail)

    # Attention: every layer, slowest DP rank. A rank's attention depends on its own row (and
    # the step's replay decision) alone, so ranks with the same row are priced once: the
    # slowest rank, each part's largest and its provenance are those of the distinct rows.
    distinct = _distinct_ranks(dec_b, dec_ctx, pre_tok, pre_req, pre_ctx)
    attn = _attention(inst, cal, dec_b[distinct], dec_ctx[distinct], pre_tok[distinct],
                      pre_req[distinct], pre_ctx[distinct], led,
                      None if tail is None else tail[distinct])
    _charge_parts(led, "attention", "attention.", float(attn.max()))
    # The rest of a rank's own work likewise: a step charges each part's slowest rank, and
    # the distinct rows hold every rank's figure (and every point's provenance, in order).
    own = tokens[distinct]
    for category, part, priced, ms in _rank_local(inst, cal, own, _groups(
            inst, own, pre_tok[distinct], None if tail is None else tail[distinct])):
        led.add(category, part, priced, float(ms.max()))
    moe_layers = m.moe_layers if m.is_moe else 0

    # The routed experts are priced by `_close`, after everything else.
    ep = inst.ep
    even = float(tokens.sum() * m.top_k / ep)
    if moe_layers:
        led.parts["routed_experts"], led.provenance["routed_experts"] = 0.0, ""  # its place
        if ep > 1 and dp > 1 and not inst.mega_moe:  # DP ranks exchange tokens; a TP group
            # already holds them all, and MegaMoE exchanges them inside its kernel
            for _, moe, work in groups:
                _token_exchange(inst, cal, work, moe, led)
    if sequence_parallel(inst):  # attention's input gathered from the token shards, its
        # output scattered back
        for layers, _, work in groups:
            for op in ("all_gather", "reduce_scatter"):
                c = cal.collective(op, work.max() * m.hidden * 2, inst.tp, inst.a2a_bandwidth)
                led.add("communication", f"sp_{op}", c, layers * float(c.ms.max()))
    elif inst.tp > 1:
        for layers, _, work in groups:
            ar = cal.allreduce(work.max() * m.hidden * 2, inst.tp, inst.a2a_bandwidth)
            led.add("communication", "allreduce", ar, 2 * layers * float(ar.ms.max()))
            if m.qk_norm_across_heads:  # each token's query and key variances, fp32
                qk = cal.allreduce(work.max() * 2 * 4, inst.tp, inst.a2a_bandwidth)
                led.add("communication", "qk_norm_allreduce", qk, layers * float(qk.ms.max()))

    head = _head(inst, cal, dec_b[distinct], pre_req[distinct])
    led.add("dense", "lm_head", head, float(head.ms.max()))
    draft = None
    if spec and dec_b.any():
        draft = (float(dec_b.max() / max(tokens.max(), 1)),
                 _draft_logits(inst, cal, dec_b[distinct], float(head.ms.max())),
                 _draft_attention(inst, led))
    accepted = dec_b * _expected_accepted(spec, inst.spec_acceptance) + pre_tok
    late = None
    if len(groups) > 1:
        late = (groups[1][1], float(groups[1][2].sum() / tokens.sum()))
    decode_only = bool(dec_b.sum() > 0 and pre_tok.sum() == 0)
    return _Open(led, even, decode_only, draft, float(accepted.sum()), late,
                 _shares(inst, cal.engine, dec_b, pre_tok))


def _draft_logits(inst: Instance, cal: Calibration, dec_b: np.ndarray, head_ms: float) -> float:
    """ms of the drafts' logits in a step whose LM head costs `head_ms`. MTP drafts one token
    a pass, each pass with its own logits: `spec_tokens` x the head. DSpark drafts its block in
    one pass (vllm/models/deepseek_v41/nvidia/dspark.py): one LM head over the block's rows,
    then, position by position, the Markov head's bias on the logits (the previous drafted
    token's embedding, of `dspark_markov_rank` dims, times a rank x vocabulary matrix)."""
    m, spec = inst.model, inst.spec_tokens
    if not m.dspark_block:
        return spec * head_ms
    out = float(_logits(inst, cal, dec_b * spec, m.hidden).ms.max())
    if m.dspark_markov_rank:
        out += spec * float(_logits(inst, cal, dec_b, m.dspark_markov_rank).ms.max())
    return out


def _draft_attention(inst: Instance, led: _Ledger) -> float | None:
    """ms of one draft layer's attention over the step's decode rows (1 + drafts a request),
    where the model's layers come in several kinds and the draft layers' kind is one of them
    (V4.1's draft layers attend to their own window, as its window-only layers do): that
    kind's decode parts over its layers. None where the draft layer is priced as a decoder
    layer (a model of one kind, or a draft kind no decoder layer has)."""
    m = inst.model
    layers = dict(m.layer_kinds)
    name = m.mtp_kind.name
    if len(layers) < 2 or name not in layers:
        return None
    prefix = f"attention.{name}.decode."
    return sum(v for k, v in led.parts.items() if k.startswith(prefix)) / layers[name]


def _close(inst: Instance, opened: _Open, cal: Calibration, top: float | None) -> StepTime:
    """An opened micro-batch finished: its routed experts at `top` assignments on the
    most-loaded EP rank (None: `opened.even`), the MTP draft, offload and fixed overhead."""
    m = inst.model
    src = opened.led
    led = _Ledger()
    led.ms, led.parts, led.provenance = dict(src.ms), dict(src.parts), dict(src.provenance)
    moe_layers = m.moe_layers if m.is_moe else 0
    if moe_layers:  # the most-loaded EP rank sets the pace
        received = opened.even if top is None else top
        experts = _routed(inst, cal, received, opened.decode_only)
        ms = moe_layers * float(experts.ms.max())
        if opened.late is not None:  # the late layers route only the tail's tokens
            layers, share = opened.late
            tail = _routed(inst, cal, received * share, opened.decode_only)
            ms = (moe_layers - layers) * float(experts.ms.max()) + layers * float(
                tail.ms.max())
        led.add("moe", "routed_experts", experts, ms)
        if opened.shared_stream:  # the shorter of the two streams hides under the longer
            path = sum(led.parts.get(k, 0.0) for k in (
                "router", "routed_experts", "all_to_all.dispatch", "all_to_all.combine"))
            hidden = min(led.parts.get("shared_experts", 0.0), path)
            led.ms["moe"] -= hidden
            led.parts["shared_experts"] -= hidden
            led.provenance["shared_experts"] += (
                f"; {hidden:.3g} ms on a second stream under the routed path")

    spec = inst.spec_tokens
    if opened.draft is not None:  # draft layers: `spec` single-layer passes at the decode
        # batch (MTP), or one pass of `spec` rows a request (DSpark): the same work
        ratio, logits_ms, own = opened.draft
        draft_frac = spec * m.mtp_layers / m.layers
        # a draft layer with fewer routed experts (DSpark: 128 of 384) reads and exchanges
        # that share of a decoder layer's expert work; its attention is a layer of its own
        # kind where the model's layers differ (V4.1: a window-only layer), else a decoder
        # layer's
        share = m.mtp_experts / m.n_routed_experts if m.mtp_experts and m.is_moe else 1.0
        if own is None:
            layer_work = (led.ms["attention"] + share * (led.ms["moe"]
                                                         + led.ms["communication"])) * ratio
        else:  # per decode token, over as many layers as the model has
            layer_work = own * m.layers / (1 + spec) + share * (
                led.ms["moe"] + led.ms["communication"]) * ratio
        led.add("other", "mtp_draft", None, draft_frac * layer_work + logits_ms)
        led.provenance["mtp_draft"] = led.provenance.get("routed_experts",
                                                         led.provenance["lm_head"])
    if inst.prefetch is not None:  # each offloaded layer's copy under the layer before it
        layers, nbytes = inst.prefetch
        copy = nbytes / (inst.hardware.host_link_gb_s * 1e9) * 1e3
        under = sum(led.ms.values()) / m.layers
        led.add("other", "weight_prefetch", None, layers * max(copy - under, 0.0))
        led.provenance["weight_prefetch"] = (
            f"roofline ({layers} layers of {nbytes / 1e9:.2g} GB, each {copy:.3g} ms over the "
            f"{inst.hardware.host_link_gb_s:g} GB/s host link under a layer's {under:.3g} ms)")
    if inst.offload_bytes > 0:  # zero-copy reads of the offloaded weights, every forward pass
        ms = inst.offload_bytes / (inst.hardware.host_link_gb_s * 1e9) * 1e3
        led.add("other", "weight_offload", None, ms)
        led.provenance["weight_offload"] = (
            f"roofline (offloaded bytes over the {inst.hardware.host_link_gb_s:g} GB/s host link)")
    led.add("other", "overhead", None, inst.step_overhead_ms)
    led.provenance["overhead"] = overhead_source(inst)
    total = float(sum(led.ms.values()))
    return StepTime(total, dict(led.ms), led.provenance, led.parts, opened.accepted)


def _routed(inst: Instance, cal: Calibration, received: float, decode_only: bool) -> Priced:
    """One MoE layer's routed experts on the EP rank that receives `received` token-to-expert
    assignments, on the instance's expert kernel."""
    m, ep, dp = inst.model, inst.ep, inst.dp
    expert_dtype = m.expert_weights(inst.weights)
    group_tokens = received * ep / m.top_k  # a balanced group loading every rank so
    if inst.mega_moe and (dp > 1 or sequence_parallel(inst)):  # one fused kernel: its
        # exchange is inside; each rank dispatches its own tokens (its DP rank's, or its shard)
        return cal.mega_moe(group_tokens / ep, m.hidden, m.moe_intermediate, m.top_k,
                            m.n_routed_experts, ep, expert_dtype, decode_only,
                            inst.a2a_bandwidth)
    if dp > 1 and inst.all2all.startswith("deepep"):  # wide EP: only routed tokens arrive
        return cal.moe_wideep(group_tokens, m.hidden, m.moe_intermediate, m.top_k,
                              m.n_routed_experts, ep, expert_dtype,
                              inst.all2all == "deepep_low_latency")
    # every rank sees every token (TP, or all-gather EP)
    def table(group: float) -> Priced:
        return cal.moe(group, m.hidden, m.moe_intermediate, m.top_k, m.n_routed_experts, ep,
                       expert_dtype, tp=inst.moe_tp)

    return routed_at_random(table, group_tokens, m.n_routed_experts / m.top_k)


def routed_at_random(table: Callable[[float], Priced], group: float,
                     saturation: float) -> Priced:
    """The expert GEMMs of a group of `group` tokens that the model's gate routes, priced from
    a table measured with balanced routing.

    The MoE tables route their tokens `balanced`: `saturation` tokens (experts / top-k) give
    every expert exactly one token, fewer give `group x top-k` experts one each, so below
    saturation a table point reads as many experts' weights as it has assignments. A gate
    routes at random: `group` tokens leave an expected share 1 - exp(-group / saturation) of
    the experts a token (the roofline's count, `roofline.moe`), so a decode step of 32 gpt-oss
    tokens (128 experts, top 4) reads 63 % of its experts where the table's 32 tokens read them
    all. The price is the table's at the balanced group that touches as many experts, plus
    what the table adds for tokens past saturation (their compute):
    f(group) - f(min(group, saturation)) + f(touched). A roofline price (no table) counts the
    random routing itself and is kept."""
    whole = table(group)
    if whole.table == "roofline" or group >= 16 * saturation:  # exp(-16): nothing to move
        return whole
    touched = saturation * -math.expm1(-group / saturation)
    knee, reads = table(min(group, saturation)), table(touched)
    ms = np.maximum(whole.ms - knee.ms, 0.0) + reads.ms
    worst = Priced.total([whole, knee, reads])  # the least trustworthy of the three points
    return Priced(ms, worst.source, whole.table, worst.codes)


def _charge_parts(led: _Ledger, category: str, prefix: str, total: float) -> None:
    """Book `total` (the slowest rank's ms) under `category`, and rescale the per-op parts
    that start with `prefix` (each its own slowest rank) so that they sum to it."""
    keys = [k for k in led.parts if k.startswith(prefix)]
    parts = sum(led.parts[k] for k in keys)
    for k in keys:
        led.parts[k] = led.parts[k] * total / parts if parts > 0 else 0.0
    led.ms[category] += total


def _deepep(inst: Instance, cal: Calibration, sent: float, phase: str) -> Priced:
    m = inst.model
    return cal.all_to_all(sent, m.hidden, m.top_k, m.n_routed_experts, inst.ep, phase,
                          inst.all2all == "deepep_low_latency", inst.a2a_bandwidth)


def _one_sided(inst: Instance, cal: Calibration, sent: float, phase: str) -> Priced:
    m = inst.model
    return cal.nvlink_one_sided(sent, m.hidden, m.top_k, m.n_routed_experts, inst.ep, phase,
                                m.expert_weights(inst.weights), inst.a2a_bandwidth)


TOKEN_EXCHANGES: dict[str, Callable[[Instance, Calibration, float, str], Priced]] = {
    "deepep_low_latency": _deepep,
    "deepep_high_throughput": _deepep,
    "flashinfer_nvlink_one_sided": _one_sided,
}
"""All2all backends that send each rank's tokens only to the ranks their experts live on, and
how their dispatch / combine of one MoE layer is priced; every other backend all-gathers the
tokens and reduce-scatters the outputs (NCCL)."""


def _token_exchange(inst: Instance, cal: Calibration, tokens: np.ndarray, moe_layers: int,
                    led: _Ledger) -> None:
    """Dispatch to and combine from the expert ranks, per the instance's all2all backend."""
    m, ep = inst.model, inst.ep
    exchange = TOKEN_EXCHANGES.get(inst.all2all)
    if exchange is not None:
        sent = tokens.max() / inst.attn_tp  # a TP group's ranks each send a share of its tokens
        for phase in ("dispatch", "combine"):
            a2a = exchange(inst, cal, sent, phase)
            led.add("communication", f"all_to_all.{phase}", a2a,
                    moe_layers * float(a2a.ms.max()))
        return
    # all-gather every rank's tokens (bf16), then reduce-scatter the expert outputs back
    gathered = inst.dp * float(tokens.max()) * m.hidden * 2
    for op, phase in (("all_gather", "dispatch"), ("reduce_scatter", "combine")):
        c = cal.collective(op, gathered, ep, inst.a2a_bandwidth)
        led.add("communication", f"all_to_all.{phase}", c, moe_layers * float(c.ms.max()))


def _expected_accepted(spec: int, acceptance: float) -> float:
    """Tokens a request gains per step with `spec` draft tokens each accepted with `acceptance`
    (a chain: the i-th draft counts only if all before it were accepted), plus the bonus token."""
    return 1.0 + sum(acceptance ** i for i in range(1, spec + 1))
