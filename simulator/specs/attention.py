"""Attention kinds: one class per kind of attention layer, picked by name from `KINDS`.

A kind owns everything that differs between attention layers: the projection parameters of one
layer, the KV bytes a request holds (what grows per context token and what is fixed per
request), the FLOPs and KV entries one new token reads, and how the cost model prices the layer
in decode and in prefill (a chunk after a cached prefix is priced by what the kind reads: the
whole prefix for dense kinds, the window, the top-k or the compressed entries for sparse ones).

A ModelSpec lists its layers as (kind name, count) pairs; the cost model, the memory model and
the KV accounting ask the kinds. A new kind is one class here plus its tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from simulator.specs.errors import SpecError
from simulator.specs.hardware import DTYPE_BYTES, linear_dtype

if TYPE_CHECKING:
    from simulator.calibration import Calibration, Priced
    from simulator.cost.step import Instance
    from simulator.specs.model import ModelSpec

KV_DTYPES = ("bf16", "fp8", "fp4")
INDEXER_DTYPES = ("fp8", "fp4")

INDEXER_KEY_BYTES = {"fp8": lambda d: d + 4, "fp4": lambda d: d / 2 + d / 32}
"""Bytes of one cached indexer key of `d` dims: fp8 values + one fp32 scale (132 at d=128;
DeepSeek-V3.2 and V4's lightning indexer), or MXFP4 values + one ue8m0 scale per 32 (68 at
d=128; vLLM's fp4 indexer cache, --attention-config.use_fp4_indexer_cache)."""

DSV4_ENTRY_BYTES = {
    "bf16": lambda d, rope: 2.0 * d,
    "fp8": lambda d, rope: (d - rope) + 2.0 * rope + (d - rope) / 64 + 1,
    "fp4": lambda d, rope: (d - rope) / 2 + 2.0 * rope + (d - rope) / 16,
}
"""Bytes of one cached DeepSeek-V4 KV entry (one head of `d` dims shared by K and V, the last
`rope` dims rotary). bf16: 2 bytes a dim (vLLM's FlashInfer V4 backend). fp8: vLLM's
fp8_ds_mla layout, fp8 non-rotary dims + bf16 rotary dims + one ue8m0 scale per 64 + 1 pad byte
(584 bytes at d=512, rope=64). fp4: the same with fp4 values and one scale per 16 (380 bytes;
vLLM has no fp4 V4 cache upstream, so this is the layout's arithmetic, not a measured size)."""

COMPRESSOR_STATE_FP32 = 4
"""V4's compressors keep, per request and layer, fp32 running kv and score states: a window of
ratio x overlap slots of 2 x overlap x head_dim values each (vLLM's CompressorStateCache)."""


def _b(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=float)


class AttentionKind:
    """The interface of one kind of attention layer (all sizes per layer)."""

    name: ClassVar[str]
    bench: ClassVar[str | None] = None
    """The kernels/ family that measures this kind on the user's hardware (None: none yet)."""

    def params(self, m: ModelSpec) -> int:
        """Projection weights of one layer."""
        raise NotImplementedError

    def kv_token_bytes(self, m: ModelSpec, kv: str, indexer: str = "fp8") -> float:
        """KV bytes one more context token adds, once the context is past any window."""
        raise NotImplementedError

    def kv_bytes(self, m: ModelSpec, context: Any, kv: str, indexer: str = "fp8") -> Any:
        """KV bytes one request of `context` tokens holds (per-request state included)."""
        return self.kv_token_bytes(m, kv, indexer) * _b(context)

    def kv_fixed_bytes(self, m: ModelSpec, kv: str, indexer: str = "fp8") -> float:
        """KV bytes a request holds beyond the per-token growth (window, compressor state),
        for a context longer than any window."""
        big = 1 << 22
        return float(self.kv_bytes(m, big, kv, indexer) - self.kv_token_bytes(m, kv, indexer)
                     * big)

    def attended(self, m: ModelSpec, context: Any) -> Any:
        """KV entries one new token's attention reads at `context` tokens."""
        return _b(context)

    def core_flops(self, m: ModelSpec, context: Any) -> Any:
        """Attention FLOPs (scores, values, indexer) of one new token at `context` tokens."""
        raise NotImplementedError

    def kv_split(self, m: ModelSpec, tp: int) -> int:
        """Ranks a TP group splits the KV cache over (1: every rank keeps all of it)."""
        return 1

    def decode(self, cal: Calibration, inst: Instance, queries: np.ndarray,
               context: np.ndarray) -> dict[str, Priced]:
        """One layer for `queries` new tokens per rank (one per request and draft) over
        `context` cached tokens: priced parts by name, each per rank."""
        raise NotImplementedError

    def prefill(self, cal: Calibration, inst: Instance, requests: np.ndarray,
                new: np.ndarray, past: np.ndarray) -> dict[str, Priced]:
        """One layer for `requests` per rank of `new` prompt tokens each after `past` tokens
        already cached (prefix hits, earlier chunks): priced parts by name, each per rank."""
        raise NotImplementedError


def effective_isl(new: np.ndarray, past: np.ndarray) -> np.ndarray:
    """Prompt length whose causal attention work equals `new` tokens after `past` cached ones
    (new * (past + new / 2) = s^2 / 2): dense kinds read the whole prefix."""
    return np.sqrt(new * new + 2 * new * past)


# ---- grouped-query attention ----------------------------------------------------------------

class GQA(AttentionKind):
    """Grouped-query attention over the whole context (Llama, Qwen3, Mixtral, gpt-oss)."""

    name = "gqa"
    bench = "gqa"
    window_of: ClassVar[bool] = False

    def window(self, m: ModelSpec) -> int:
        return m.sliding_window if self.window_of else 0

    def params(self, m: ModelSpec) -> int:
        h, n, d = m.hidden, m.num_attention_heads, m.head_dim
        gate = h * n * d if m.attn_output_gate else 0  # Qwen3.5: q_proj also yields a gate
        return h * n * d + gate + 2 * h * m.num_kv_heads * d + n * d * h

    def kv_token_bytes(self, m: ModelSpec, kv: str, indexer: str = "fp8") -> float:
        return 0.0 if self.window_of else self._entry(m, kv)

    def _entry(self, m: ModelSpec, kv: str) -> float:
        return 2 * m.num_kv_heads * m.head_dim * DTYPE_BYTES[kv]

    def kv_bytes(self, m: ModelSpec, context: Any, kv: str, indexer: str = "fp8") -> Any:
        return self._entry(m, kv) * self.attended(m, context)

    def attended(self, m: ModelSpec, context: Any) -> Any:
        w = self.window(m)
        return np.minimum(_b(context), w) if w else _b(context)

    def core_flops(self, m: ModelSpec, context: Any) -> Any:
        return 2 * m.num_attention_heads * 2 * m.head_dim * self.attended(m, context)

    def kv_split(self, m: ModelSpec, tp: int) -> int:
        return min(tp, m.num_kv_heads)

    def _proj(self, cal: Calibration, inst: Instance, tokens: np.ndarray) -> dict[str, Priced]:
        m, tp = inst.model, inst.tp
        heads, kvh = max(m.num_attention_heads // tp, 1), max(m.num_kv_heads // tp, 1)
        q_out = heads * m.head_dim
        gate = q_out if m.attn_output_gate else 0
        qkv = cal.gemm(tokens, q_out + gate + 2 * kvh * m.head_dim, m.hidden, inst.weights)
        o = cal.gemm(tokens, m.hidden, q_out, inst.weights)
        return {"qkv_proj": qkv.scaled(tokens > 0), "o_proj": o.scaled(tokens > 0)}

    def decode(self, cal: Calibration, inst: Instance, queries: np.ndarray,
               context: np.ndarray) -> dict[str, Priced]:
        m, tp = inst.model, inst.tp
        heads, kvh = max(m.num_attention_heads // tp, 1), max(m.num_kv_heads // tp, 1)
        core = cal.attention_generation(queries, self.attended(m, context), heads, kvh,
                                        m.head_dim, inst.kv_cache, self.window(m))
        return {**self._proj(cal, inst, queries), "core": core}

    def prefill(self, cal: Calibration, inst: Instance, requests: np.ndarray,
                new: np.ndarray, past: np.ndarray) -> dict[str, Priced]:
        m, tp = inst.model, inst.tp
        heads, kvh = max(m.num_attention_heads // tp, 1), max(m.num_kv_heads // tp, 1)
        # A windowed layer reads at most the window whatever the prefix; a full layer does the
        # causal work of the longer prompt.
        seff = new if self.window_of else effective_isl(new, past)
        core = cal.attention_context(requests, seff, heads, kvh, m.head_dim, inst.kv_cache,
                                     self.window(m))
        return {**self._proj(cal, inst, requests * new), "core": core}


class SlidingGQA(GQA):
    """Grouped-query attention over the last `sliding_window` tokens (gpt-oss, Mistral)."""

    name = "swa_gqa"
    window_of = True


# ---- multi-head latent attention ------------------------------------------------------------

class MLA(AttentionKind):
    """DeepSeek-V3's multi-head latent attention: one latent (kv_lora + rope) per token, dense
    over the whole context; priced from the measured MLA module tables."""

    name = "mla"
    bench = "mla"

    def params(self, m: ModelSpec) -> int:
        h, n = m.hidden, m.num_attention_heads
        nope = m.head_dim - m.qk_rope_head_dim
        q = (h * m.q_lora_rank + m.q_lora_rank * n * m.head_dim
             if m.q_lora_rank else h * n * m.head_dim)
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * n * (nope + m.v_head_dim)
        return q + kv + n * m.v_head_dim * h

    def kv_token_bytes(self, m: ModelSpec, kv: str, indexer: str = "fp8") -> float:
        return (m.kv_lora_rank + m.qk_rope_head_dim) * DTYPE_BYTES[kv]

    def core_flops(self, m: ModelSpec, context: Any) -> Any:
        return 2 * m.num_attention_heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim) * (
            self.attended(m, context))

    @staticmethod
    def shape(m: ModelSpec) -> dict[str, int]:
        return {"hidden": m.hidden, "q_lora": m.q_lora_rank, "kv_lora": m.kv_lora_rank,
                "nope": m.head_dim - m.qk_rope_head_dim, "rope": m.qk_rope_head_dim,
                "v": m.v_head_dim}

    def decode(self, cal: Calibration, inst: Instance, queries: np.ndarray,
               context: np.ndarray) -> dict[str, Priced]:
        m = inst.model
        heads = max(m.num_attention_heads // inst.tp, 1)
        return {"module": cal.mla_generation(queries, self.attended(m, context), heads,
                                             self.shape(m), inst.weights, inst.kv_cache)}

    def prefill(self, cal: Calibration, inst: Instance, requests: np.ndarray,
                new: np.ndarray, past: np.ndarray) -> dict[str, Priced]:
        m = inst.model
        heads = max(m.num_attention_heads // inst.tp, 1)
        shape = self.shape(m)
        p = cal.mla_context(requests, new, heads, shape, inst.weights, inst.kv_cache)
        out = {"module": p}
        if (past > 0).any():  # the chunk also attends to the prefix: add its core cost
            seff = effective_isl(new, past)
            longer = cal.mla_context(requests, seff, heads, shape, inst.weights, inst.kv_cache)
            core = 2 * m.num_attention_heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim) * seff / 2
            share = core / (core + 2 * self.params(m))
            extra = np.where(past > 0, np.maximum(longer.ms - p.ms, 0.0) * share, 0.0)
            out["prefix"] = type(p)(extra, longer.source, longer.table)
        return out


class DSA(MLA):
    """DeepSeek-V3.2 / GLM-5 sparse attention: MLA whose queries read the `index_topk` latents
    a lightning indexer picks; the indexer scores every cached token with its own fp8 keys.
    Priced from the measured dsa module tables where they ship, else the MLA module tables at
    the top-k context."""

    name = "dsa"

    def params(self, m: ModelSpec) -> int:
        # Indexer: wq_b (q_lora -> heads x dim), wk (hidden -> dim), weights_proj (-> heads).
        indexer = (m.index_n_heads * (m.q_lora_rank * m.index_head_dim + m.hidden)
                   + m.hidden * m.index_head_dim)
        return super().params(m) + indexer

    def kv_token_bytes(self, m: ModelSpec, kv: str, indexer: str = "fp8") -> float:
        return super().kv_token_bytes(m, kv) + INDEXER_KEY_BYTES[indexer](m.index_head_dim)

    def attended(self, m: ModelSpec, context: Any) -> Any:
        return np.minimum(_b(context), m.sparse_topk)

    def core_flops(self, m: ModelSpec, context: Any) -> Any:
        return super().core_flops(m, context) + (
            2 * m.index_n_heads * m.index_head_dim * _b(context))

    def decode(self, cal: Calibration, inst: Instance, queries: np.ndarray,
               context: np.ndarray) -> dict[str, Priced]:
        got = cal.dsa_module(False, inst, queries, np.ones_like(queries), context)
        return {"module": got} if got is not None else super().decode(cal, inst, queries,
                                                                       context)

    def prefill(self, cal: Calibration, inst: Instance, requests: np.ndarray,
                new: np.ndarray, past: np.ndarray) -> dict[str, Priced]:
        got = cal.dsa_module(True, inst, requests, new, past)
        if got is not None:
            return {"module": got}
        # MLA tables: the core reads at most top-k latents, so no dense prefix term.
        m = inst.model
        heads = max(m.num_attention_heads // inst.tp, 1)
        return {"module": cal.mla_context(requests, new, heads, self.shape(m), inst.weights,
                                          inst.kv_cache)}


# ---- DeepSeek-V4 compressed attention -------------------------------------------------------

class DSV4(AttentionKind):
    """A DeepSeek-V4 attention layer: one KV head of head_dim shared by K and V, low-rank query
    (q_lora) and grouped low-rank output (o_lora over o_groups), a `sliding_window` of raw
    entries on every layer, and, per `ratio`, compressed entries (one per `ratio` tokens).
    Priced from the measured dsv4 module tables (projections, compressor, indexer and attention
    of one layer), extrapolated beyond their range by this kind's own reads and FLOPs."""

    ratio: ClassVar[int] = 0
    overlap: ClassVar[int] = 1
    """Compression windows per compressed entry (CSA's windows overlap: 2)."""

    def params(self, m: ModelSpec) -> int:
        h, n, d = m.hidden, m.num_attention_heads, m.head_dim
        q = h * m.q_lora_rank + m.q_lora_rank * n * d
        kv = h * d
        o = n * d * m.o_lora_rank + m.o_groups * m.o_lora_rank * h
        sink = n
        compressor = 2 * h * self.overlap * d if self.ratio else 0  # wkv and wgate
        return q + kv + o + sink + compressor + self.indexer_params(m)

    def indexer_params(self, m: ModelSpec) -> int:
        return 0

    def entry_bytes(self, m: ModelSpec, kv: str) -> float:
        return float(DSV4_ENTRY_BYTES[kv](m.head_dim, m.qk_rope_head_dim))

    def kv_token_bytes(self, m: ModelSpec, kv: str, indexer: str = "fp8") -> float:
        return self.entry_bytes(m, kv) / self.ratio if self.ratio else 0.0

    def kv_bytes(self, m: ModelSpec, context: Any, kv: str, indexer: str = "fp8") -> Any:
        c = _b(context)
        window = np.minimum(c, m.sliding_window) * self.entry_bytes(m, kv)
        if not self.ratio:
            return window
        state = self.ratio * self.overlap ** 2 * 2 * m.head_dim * COMPRESSOR_STATE_FP32
        return window + np.floor(c / self.ratio) * self.entry_bytes(m, kv) + state

    def compressed_read(self, m: ModelSpec, context: Any) -> Any:
        """Compressed entries one query's attention reads."""
        return np.floor(_b(context) / self.ratio) if self.ratio else _b(context) * 0

    def attended(self, m: ModelSpec, context: Any) -> Any:
        return np.minimum(_b(context), m.sliding_window) + self.compressed_read(m, context)

    def core_flops(self, m: ModelSpec, context: Any) -> Any:
        return 2 * m.num_attention_heads * 2 * m.head_dim * self.attended(m, context)

    def decode(self, cal: Calibration, inst: Instance, queries: np.ndarray,
               context: np.ndarray) -> dict[str, Priced]:
        return {"module": cal.dsv4_module(self, False, inst, queries, np.ones_like(queries),
                                          context)}

    def prefill(self, cal: Calibration, inst: Instance, requests: np.ndarray,
                new: np.ndarray, past: np.ndarray) -> dict[str, Priced]:
        return {"module": cal.dsv4_module(self, True, inst, requests, new, past)}


class SWA(DSV4):
    """V4 sliding-window-only layer (compress ratio 0): the window and nothing else. No table
    measures it alone: priced as an HCA layer at a window-length context, which does the same
    projections and reads the window (plus at most one compressed entry)."""

    name = "swa"


class CSA(DSV4):
    """V4 compressed sparse attention (ratio 4): one compressed entry per 4 tokens from
    overlapping windows, of which the indexer (its own keys per 4 tokens) picks `index_topk`
    for each query, plus the window."""

    name = "csa"
    ratio = 4
    overlap = 2

    def indexer_params(self, m: ModelSpec) -> int:
        # wq_b (q_lora -> index heads x dim), weights_proj (hidden -> heads), and the indexer's
        # own compressor (wkv, wgate over overlapping windows).
        return (m.q_lora_rank * m.index_n_heads * m.index_head_dim + m.hidden * m.index_n_heads
                + 2 * m.hidden * self.overlap * m.index_head_dim)

    def kv_token_bytes(self, m: ModelSpec, kv: str, indexer: str = "fp8") -> float:
        return (self.entry_bytes(m, kv) + INDEXER_KEY_BYTES[indexer](m.index_head_dim)) / (
            self.ratio)

    def kv_bytes(self, m: ModelSpec, context: Any, kv: str, indexer: str = "fp8") -> Any:
        keys = np.floor(_b(context) / self.ratio) * INDEXER_KEY_BYTES[indexer](m.index_head_dim)
        state = self.ratio * self.overlap ** 2 * 2 * m.index_head_dim * COMPRESSOR_STATE_FP32
        return super().kv_bytes(m, context, kv, indexer) + keys + state

    def compressed_read(self, m: ModelSpec, context: Any) -> Any:
        return np.minimum(np.floor(_b(context) / self.ratio), m.sparse_topk)

    def core_flops(self, m: ModelSpec, context: Any) -> Any:
        scores = 2 * m.index_n_heads * m.index_head_dim * np.floor(_b(context) / self.ratio)
        return super().core_flops(m, context) + scores


class HCA(DSV4):
    """V4 heavily compressed attention (ratio 128): dense over one compressed entry per 128
    tokens, plus the window."""

    name = "hca"
    ratio = 128


# ---- DeepSeek-V4.1 CSA2 ---------------------------------------------------------------------

V41_RECORD_BYTES = {
    "bf16": lambda d: 2.0 * d,
    "fp8": lambda d: d + d / 32,
    "fp4": lambda d: d / 2 + d / 16,
}
"""Bytes of one cached DeepSeek-V4.1 record of `d` dims, as vLLM 0.32 lays it out on Blackwell
(vllm/models/deepseek_v41/attention.py). fp4: the nvfp4_ds_mla compressed record, every dim
e2m1 with one E4M3 scale per 16 (288 bytes at d=512, the record the V4.1 paper's 890 bytes
per token count); fp8: the MXFP8 record, every dim e4m3 with one UE8M0 scale per 32 (528
bytes; window entries always take it, also beside fp4 records); bf16: 2 bytes a dim (its
FlashInfer rows). Hopper keeps V4's 584-byte fp8_ds_mla record instead."""

V41_RING_BYTES = 8 * 4096
"""A ratio-2 KV source's compressor ring per request: max(8, the next power of two >= draft
tokens + 2) fp32 rows of 4,096 bytes (vllm/models/deepseek_v41/compressor.py); 8 rows for up to
6 draft tokens."""


class CSA2(AttentionKind):
    """A DeepSeek-V4.1 attention layer (CSA2): V4's projections (low-rank query, one shared KV
    head of head_dim, grouped low-rank output) over the layer's own `sliding_window` of raw
    entries and up to `index_topk` compressed records. Only the KV-source layers
    (`kv_source_layer_ids`) compress and store records (one per `reads` tokens) with their
    index keys; every other layer attends to the records of the nearest source at or before it
    and keeps only its window. A layer's indexer scores all of its source's keys (a source),
    the candidates the candidate layer picked (a re-indexing layer), or nothing (a reusing
    layer takes the latest top-k). Priced by transfer from V4's measured kernels."""

    reads: ClassVar[int] = 0
    """Tokens per compressed record the layer attends to (its source's ratio); 0: window only."""
    owns: ClassVar[bool] = False
    """A KV source: compresses its input and stores records and index keys."""
    index: ClassVar[str] = "none"
    """What the layer's indexer scores: 'all' its source's keys, 'candidates' at most
    `candidate_pool` of them, or 'none'."""

    def params(self, m: ModelSpec) -> int:
        h, n, d = m.hidden, m.num_attention_heads, m.head_dim
        q = h * m.q_lora_rank + m.q_lora_rank * n * d
        window = h * d  # every layer writes its own window entries
        o = n * d * m.o_lora_rank + m.o_groups * m.o_lora_rank * h
        # a source's compressor: kv (and, over pairs, a gate) projection; its keys' projection
        indexer = (m.q_lora_rank * m.index_n_heads * m.index_head_dim + h * m.index_n_heads
                   if self.index != "none" else 0)
        return q + window + o + n + self.compressor_params(m) + indexer

    def compressor_params(self, m: ModelSpec) -> int:
        """A KV source's compressor: its kv projection (and, over pairs, a gate) and its index
        keys' projection; 0 for a layer that stores no records."""
        if not self.owns:
            return 0
        return m.hidden * m.head_dim * (2 if self.reads > 1 else 1) + (
            m.head_dim * m.index_head_dim)

    def record_bytes(self, m: ModelSpec, kv: str) -> float:
        """Bytes of one compressed record."""
        return float(V41_RECORD_BYTES[kv](m.head_dim))

    def window_bytes(self, m: ModelSpec, kv: str) -> float:
        """Bytes of one raw window entry: the fp8 record unless the cache is bf16."""
        return float(V41_RECORD_BYTES["bf16" if kv == "bf16" else "fp8"](m.head_dim))

    def key_bytes(self, m: ModelSpec, indexer: str) -> float:
        return float(INDEXER_KEY_BYTES[indexer](m.index_head_dim))

    def kv_token_bytes(self, m: ModelSpec, kv: str, indexer: str = "fp8") -> float:
        if not self.owns:
            return 0.0
        return (self.record_bytes(m, kv) + self.key_bytes(m, indexer)) / self.reads

    def kv_bytes(self, m: ModelSpec, context: Any, kv: str, indexer: str = "fp8") -> Any:
        c = _b(context)
        window = np.minimum(c, m.sliding_window) * self.window_bytes(m, kv)
        if not self.owns:
            return window
        state = V41_RING_BYTES if self.reads > 1 else 0  # a pair compressor's fp32 ring
        records = np.floor(c / self.reads) * (self.record_bytes(m, kv)
                                              + self.key_bytes(m, indexer))
        return window + records + state

    def compressed_read(self, m: ModelSpec, context: Any) -> Any:
        """Compressed records one query's attention reads."""
        if not self.reads:
            return _b(context) * 0
        return np.minimum(np.floor(_b(context) / self.reads), m.sparse_topk)

    def index_keys(self, m: ModelSpec, context: Any) -> Any:
        """Index keys one query's indexer scores."""
        if self.index == "none":
            return _b(context) * 0
        keys = np.floor(_b(context) / self.reads)
        return np.minimum(keys, m.candidate_pool) if self.index == "candidates" else keys

    def attended(self, m: ModelSpec, context: Any) -> Any:
        return np.minimum(_b(context), m.sliding_window) + self.compressed_read(m, context)

    def core_flops(self, m: ModelSpec, context: Any) -> Any:
        return (2 * m.num_attention_heads * 2 * m.head_dim * self.attended(m, context)
                + 2 * m.index_n_heads * m.index_head_dim * self.index_keys(m, context))

    def decode(self, cal: Calibration, inst: Instance, queries: np.ndarray,
               context: np.ndarray) -> dict[str, Priced]:
        return self._parts(cal, False, inst, queries, np.ones_like(queries), context)

    def prefill(self, cal: Calibration, inst: Instance, requests: np.ndarray,
                new: np.ndarray, past: np.ndarray) -> dict[str, Priced]:
        return self._parts(cal, True, inst, requests, new, past)

    def _parts(self, cal: Calibration, context: bool, inst: Instance, batch: np.ndarray,
               new: np.ndarray, past: np.ndarray) -> dict[str, Priced]:
        from simulator.specs.deployment import uses_mega_attention

        # Decode under mega attention drops the unfused module's many small kernels, whose
        # fixed costs make most of its measured time at decode batches. A prefill chunk keeps
        # the module's measured efficiency: there the elementwise work scales with tokens, and
        # the part of it outside the fused kernel (window writes, the compressor's pooling,
        # the index keys' quantisation) is measured by no table apart from the module.
        if not context and uses_mega_attention(inst.model.architecture, inst.hardware.name):
            out = self._mega(cal, context, inst, batch, new, past)
        else:
            out = {"module": cal.dsv41_module(self, context, inst, batch, new, past)}
        if self.index != "none":  # a layer without an indexer scores nothing
            scoring = cal.dsv41_indexer(self, context, inst, batch, new, past)
            if scoring is not None:
                out["indexer"] = scoring
        return out

    def _mega(self, cal: Calibration, context: bool, inst: Instance, batch: np.ndarray,
              new: np.ndarray, past: np.ndarray) -> dict[str, Priced]:
        """The layer as vLLM runs it under mega attention: its projections as GEMMs at the
        measured GEMM rates (the ones reading the layer's input as one, as vLLM merges
        DeepSeek's q_a and kv_a projections; the grouped output projection as the batched
        GEMM it is, one group's shape over `o_groups` x the tokens: the same FLOPs), a source's
        compressor, and the one fused attention kernel (`Calibration.dsv41_attention`); the
        indexer's scoring is priced apart. None of the unfused module's norm, RoPE and cast
        kernels remain; the one small kernel before the fused one (the query's padding and the
        new KV entry's insert) is not priced apart."""

        m = inst.model
        tokens = batch * new
        dtype = linear_dtype(inst.weights)  # V4's module tables: fp8 blocks
        h, d = m.hidden, m.head_dim
        # attention TP shards the heads and the output groups; the input's projections and
        # the indexer's stay whole on every rank
        n, groups = max(m.num_attention_heads // inst.tp, 1), max(m.o_groups // inst.tp, 1)
        indexed = self.index != "none"
        shapes = [(1, m.q_lora_rank + d + (m.index_n_heads if indexed else 0), h, dtype),
                  (1, n * d, m.q_lora_rank, dtype),
                  (groups, m.o_lora_rank, n * d // groups, dtype),
                  (1, h, groups * m.o_lora_rank, dtype)]
        if indexed:
            shapes.append((1, m.index_n_heads * m.index_head_dim, m.q_lora_rank, dtype))
        out = {"projections": cal.gemm_chain(tokens, tuple(shapes)),
               "attention": cal.dsv41_attention(self, context, inst, batch, new, past)}
        if self.owns:  # as the cut layer's compressor in prefill (cost/step.py)
            out["compressor"] = cal.gemm_chain(tokens, (
                (1, d * (2 if self.reads > 1 else 1), h, "bf16"),
                (1, m.index_head_dim, d, "bf16")))
        return out


class CSA2Window(CSA2):
    """V4.1 window-only layer (compress ratio 0): its window and nothing else."""

    name = "csa2_window"


class CSA2Source2(CSA2):
    """V4.1 KV source over token pairs (ratio 2): stores one record and key per 2 tokens and
    scores all of its keys."""

    name = "csa2_source_r2"
    reads, owns, index = 2, True, "all"


class CSA2Source1(CSA2):
    """V4.1 KV source at ratio 1 (the candidate layer): one record and key per token, scores
    all of them and picks the candidate blocks the re-indexing layers score."""

    name = "csa2_source_r1"
    reads, owns, index = 1, True, "all"


class CSA2Reindex2(CSA2):
    """V4.1 re-indexing layer over a ratio-2 source: scores only the candidates."""

    name = "csa2_reindex_r2"
    reads, index = 2, "candidates"


class CSA2Reindex1(CSA2):
    """V4.1 re-indexing layer over the ratio-1 source: scores only the candidates."""

    name = "csa2_reindex_r1"
    reads, index = 1, "candidates"


class CSA2Reuse2(CSA2):
    """V4.1 layer reusing a ratio-2 source's records and the latest top-k: no indexer."""

    name = "csa2_reuse_r2"
    reads = 2


class CSA2Reuse1(CSA2):
    """V4.1 layer reusing the ratio-1 source's records and the latest top-k: no indexer."""

    name = "csa2_reuse_r1"
    reads = 1


CSA2_ROLES: dict[tuple[str, int], str] = {
    (k.index if k.index != "all" else "source", k.reads): k.name
    for k in (CSA2Source2, CSA2Source1, CSA2Reindex2, CSA2Reindex1, CSA2Reuse2, CSA2Reuse1)}
"""(role, ratio) of a V4.1 layer -> its kind: role 'source' (a KV source), 'candidates' (an
index source that is no KV source) or 'none' (reuses); ratio 0 is `csa2_window`."""


# ---- linear attention ----------------------------------------------------------------------

class GatedDeltaNet(AttentionKind):
    """Qwen3.5's Gated DeltaNet (linear attention): a short causal convolution and a
    recurrent state of linear_num_value_heads x key_dim x value_dim per request, the same size
    whatever the context. Priced from the measured gdn kernel tables plus its projections."""

    name = "linear"

    def params(self, m: ModelSpec) -> int:
        h = m.hidden
        qk = m.linear_k_heads * m.linear_k_dim
        v = m.linear_v_heads * m.linear_v_dim
        in_proj = h * (2 * qk + 2 * v) + h * 2 * m.linear_v_heads  # q, k, v, gate z; b, a
        conv = m.linear_conv_kernel * (2 * qk + v)
        return in_proj + conv + v * h + 2 * m.linear_v_heads

    def kv_token_bytes(self, m: ModelSpec, kv: str, indexer: str = "fp8") -> float:
        return 0.0

    def state_bytes(self, m: ModelSpec) -> float:
        """Per-request state of one layer: the fp32 recurrent state and the bf16 window of the
        convolution (as vLLM keeps them)."""
        ssm = m.linear_v_heads * m.linear_k_dim * m.linear_v_dim * 4
        conv = (2 * m.linear_k_heads * m.linear_k_dim + m.linear_v_heads * m.linear_v_dim) * (
            m.linear_conv_kernel - 1) * 2
        return float(ssm + conv)

    def kv_bytes(self, m: ModelSpec, context: Any, kv: str, indexer: str = "fp8") -> Any:
        return np.where(_b(context) > 0, self.state_bytes(m), 0.0)

    def attended(self, m: ModelSpec, context: Any) -> Any:
        return np.minimum(_b(context), 1.0)  # the state, once

    def core_flops(self, m: ModelSpec, context: Any) -> Any:
        # read the state, decay and update it, read the output: ~3 passes over kdim x vdim
        per = 2 * 3 * m.linear_v_heads * m.linear_k_dim * m.linear_v_dim
        return np.where(_b(context) > 0, float(per), 0.0)

    def kv_split(self, m: ModelSpec, tp: int) -> int:
        return min(tp, m.linear_k_heads)

    def _proj(self, cal: Calibration, inst: Instance, tokens: np.ndarray) -> dict[str, Priced]:
        m, tp = inst.model, inst.tp
        qk = m.linear_k_heads * m.linear_k_dim
        v = m.linear_v_heads * m.linear_v_dim
        inp = cal.gemm(tokens, (2 * qk + 2 * v + 2 * m.linear_v_heads) // tp, m.hidden,
                       inst.weights)
        out = cal.gemm(tokens, m.hidden, v // tp, inst.weights)
        return {"in_proj": inp, "out_proj": out}

    def decode(self, cal: Calibration, inst: Instance, queries: np.ndarray,
               context: np.ndarray) -> dict[str, Priced]:
        return {**self._proj(cal, inst, queries),
                "core": cal.gdn(False, inst, queries, np.ones_like(queries))}

    def prefill(self, cal: Calibration, inst: Instance, requests: np.ndarray,
                new: np.ndarray, past: np.ndarray) -> dict[str, Priced]:
        # The state carries the prefix: a chunk after a cached prefix costs what a fresh
        # chunk of the same length does.
        return {**self._proj(cal, inst, requests * new),
                "core": cal.gdn(True, inst, requests, new)}


KINDS: dict[str, type[AttentionKind]] = {
    k.name: k for k in (GQA, SlidingGQA, MLA, DSA, SWA, CSA, HCA, CSA2Window, CSA2Source2,
                        CSA2Source1, CSA2Reindex2, CSA2Reindex1, CSA2Reuse2, CSA2Reuse1,
                        GatedDeltaNet)}
"""Attention kind name -> class; a ModelSpec's layers name their kind here."""

DSV4_RATIOS: dict[int, str] = {0: SWA.name, 4: CSA.name, 128: HCA.name}
"""DeepSeek-V4 config compress_ratios value -> attention kind."""


def kind(name: str) -> AttentionKind:
    """The attention kind called `name`."""
    if name not in KINDS:
        raise SpecError(f"attention kind {name!r} is not one of {', '.join(KINDS)}")
    return _INSTANCES[name]


_INSTANCES = {name: cls() for name, cls in KINDS.items()}


def check_kv_dtype(kv: str, indexer: str = "fp8") -> None:
    if kv not in KV_DTYPES:
        raise SpecError(f"kv_cache={kv!r} is not one of {', '.join(KV_DTYPES)}")
    if indexer not in INDEXER_DTYPES:
        raise SpecError(f"indexer_cache={indexer!r} is not one of {', '.join(INDEXER_DTYPES)}")
