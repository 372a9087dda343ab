"""Model architecture, read from a Hugging Face config.json or a shipped preset.

Everything the cost model needs is derived here: parameter counts and weight bytes per component,
KV-cache bytes per token, and FLOPs per token per operation.
"""

from __future__ import annotations

import json
import os
import reprlib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator.specs.attention import (
    CSA2_ROLES,
    DSV4_RATIOS,
    AttentionKind,
    CSA2Window,
    check_kv_dtype,
)
from simulator.specs.attention import kind as attention_kind
from simulator.specs.errors import SpecError
from simulator.specs.hardware import DTYPE_BYTES, linear_dtype
from simulator.specs.memo import per_object

Component = Literal["embedding", "attention", "mhc", "dense_mlp", "routed_experts",
                    "shared_experts", "router", "lm_head", "mtp", "engram", "engram_tables"]

HOST_COMPONENTS: tuple[Component, ...] = ("engram_tables",)
"""Weights vLLM keeps in host memory, never in a GPU's (V4.1's Engram tables: its
--engram-config cpu_offload, on by default)."""

PRESET_DIR = "presets/models"


class ModelSpec(BaseModel):
    """The architecture numbers of one decoder-only transformer (dense or MoE)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """Preset name or config path this spec came from."""
    architecture: str
    """Hugging Face architecture class, e.g. DeepseekV3ForCausalLM (a multimodal wrapper's name
    when the text model was read from its text_config)."""
    hidden: int = Field(ge=1)
    """Hidden size."""
    layers: int = Field(ge=1)
    """Decoder layers (MTP layers not included)."""
    dense_layers: int = Field(ge=0)
    """Layers with a dense MLP; the rest have an MoE block."""
    vocab: int = Field(ge=1)
    """Vocabulary size."""
    attention: Literal["mla", "gqa", "dsv4", "dsv41"]
    """Attention family: multi-head latent (DeepSeek-V3, Kimi, GLM-5), grouped-query,
    DeepSeek-V4's compressed attention, or DeepSeek-V4.1's CSA2 (compressed records shared
    across layers); each layer's kind is in `layer_kinds`."""
    num_attention_heads: int = Field(ge=1)
    """Query heads."""
    num_kv_heads: int = Field(ge=1)
    """KV heads (GQA; 1 for DeepSeek-V4); equals query heads for MLA."""
    head_dim: int = Field(ge=1)
    """Per-head dimension of q/k (GQA, V4) or qk_nope + qk_rope (MLA)."""
    q_lora_rank: int = Field(0, ge=0)
    """MLA / V4 query compression rank (0: no compression)."""
    kv_lora_rank: int = Field(0, ge=0)
    """MLA latent KV rank."""
    qk_rope_head_dim: int = Field(0, ge=0)
    """MLA / V4 rotary part of each head."""
    v_head_dim: int = Field(0, ge=0)
    """MLA value head dimension."""
    o_lora_rank: int = Field(0, ge=0)
    """V4 output projection rank per group (0: no low-rank output)."""
    o_groups: int = Field(0, ge=0)
    """V4 output projection groups."""
    sliding_window: int = Field(0, ge=0)
    """Window of sliding-window layers in tokens (0: none); V4: the raw window every layer
    keeps."""
    sliding_layers: int = Field(0, ge=0)
    """How many GQA layers use the sliding window."""
    compress_ratios: tuple[int, ...] = ()
    """V4: per layer (MTP layers last) 0 = sliding window only, 4 = CSA, 128 = HCA; V4.1: 0 =
    window only, else the tokens per compressed record the layer attends to (1 or 2)."""
    kv_source_layers: tuple[int, ...] = ()
    """V4.1: the layers that compress and store records and index keys; every other layer
    reads the nearest source at or before it. Prefill runs the layers after the last source
    only on each prompt's last `sliding_window` tokens (the causal encoder-decoder)."""
    index_source_layers: tuple[int, ...] = ()
    """V4.1: the layers that score index keys (the sources and the re-indexing layers); the
    others reuse the latest top-k."""
    candidate_pool: int = Field(0, ge=0)
    """V4.1: index keys a re-indexing layer scores at most (candidate_topk_blocks x
    candidate_block_size)."""
    sparse_topk: int = Field(0, ge=0)
    """Sparse attention (DeepSeek-V3.2, GLM-5, V4's CSA): entries each query attends to
    (0: dense)."""
    index_head_dim: int = Field(0, ge=0)
    """Sparse-attention indexer key dimension, cached per (compressed) token per layer."""
    index_n_heads: int = Field(0, ge=0)
    """Sparse-attention indexer query heads (DeepSeek-V3.2: 64, GLM-5: 32)."""
    linear_layers: int = Field(0, ge=0)
    """Gated DeltaNet (linear-attention) layers (Qwen3.5); the rest are full attention."""
    linear_k_heads: int = Field(0, ge=0)
    """Linear-attention key heads."""
    linear_k_dim: int = Field(0, ge=0)
    """Linear-attention key head dimension."""
    linear_v_heads: int = Field(0, ge=0)
    """Linear-attention value heads."""
    linear_v_dim: int = Field(0, ge=0)
    """Linear-attention value head dimension."""
    linear_conv_kernel: int = Field(0, ge=0)
    """Width of the linear-attention layers' causal convolution."""
    attn_output_gate: bool = False
    """Full-attention layers gate their output with a second query-sized projection
    (Qwen3.5)."""
    qk_norm_across_heads: bool = False
    """The query and key RMSNorms normalise over all heads together, not per head
    (MiniMax-M2's qk_norm_type per_layer): with the heads split over TP ranks, each layer
    all-reduces every token's two variances before it can normalise."""
    hc_mult: int = Field(1, ge=1)
    """V4 hyper-connections: residual streams per token (1: a plain residual)."""
    hc_sinkhorn_iters: int = Field(0, ge=0)
    """V4 hyper-connections: Sinkhorn iterations of each mixing-matrix projection."""
    dense_intermediate: int = Field(0, ge=0)
    """Intermediate size of dense MLP layers."""
    n_routed_experts: int = Field(0, ge=0)
    """Routed experts per MoE layer (0 for a dense model)."""
    n_shared_experts: int = Field(0, ge=0)
    """Shared experts per MoE layer."""
    top_k: int = Field(0, ge=0)
    """Routed experts per token."""
    moe_intermediate: int = Field(0, ge=0)
    """Intermediate size of one expert."""
    mtp_layers: int = Field(0, ge=0)
    """Multi-token-prediction layers usable as a speculative draft."""
    context_length: int | None = Field(None, ge=1)
    """Longest sequence (prompt and output) the model takes, as vLLM derives it from the
    config: max_position_embeddings, scaled by a rope_scaling factor (a YaRN one scales
    original_max_position_embeddings); None when the config does not say."""
    hash_layers: int = Field(0, ge=0)
    """V4: first MoE layers that route each token by a hash of its id (balanced by
    construction, no learned popularity)."""
    expert_dtype: Literal["bf16", "fp8", "fp4"] | None = None
    """The checkpoint's routed-expert dtype (V4 ships fp4 experts); experts are never served
    wider than stored (None: as the deployment's weights)."""
    engram_layers: int = Field(0, ge=0)
    """V4.1 Engram: layers that add an n-gram memory lookup."""
    engram_rows: int = Field(0, ge=0)
    """Engram table rows over all its layers."""
    engram_heads: int = Field(0, ge=0)
    """Engram hash heads per n-gram order."""
    engram_head_dim: int = Field(0, ge=0)
    """Engram row width (fp8 values, one E8M0 scale per 32)."""
    engram_ngram: int = Field(0, ge=0)
    """Engram's largest n-gram (orders 2 .. engram_ngram are looked up)."""
    mtp_experts: int = Field(0, ge=0)
    """Routed experts of each draft layer (DSpark: 128); 0: as the model's."""
    dspark_block: int = Field(0, ge=0)
    """DSpark: draft tokens proposed per pass of the draft layers (0: the draft layers are MTP
    layers, one token per pass)."""
    dspark_targets: int = Field(0, ge=0)
    """DSpark: target layers whose inputs the first draft layer projects (main_proj)."""
    dspark_markov_rank: int = Field(0, ge=0)
    """DSpark: rank of the Markov head, whose low-rank bias on each drafted position's logits
    follows the token drafted before it (0: none)."""

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    # ---- attention kinds --------------------------------------------------------------------

    def layer_kind_names(self) -> tuple[str, ...]:
        """The attention kind of each decoder layer, in order (MTP excluded)."""
        if self.attention == "dsv41":
            return per_object(_V41_KINDS, self, lambda: tuple(_v41_kind(self, i)
                                                              for i in range(self.layers)))
        return tuple(k for k, n in self.layer_kinds for _ in range(n))

    @property
    def replay_from(self) -> int:
        """The first layer prefill runs only on each prompt's last `sliding_window` tokens
        (V4.1's bounded replay: the last KV source, once its compressor has written records
        for every token, and the layers after it, whose window is all a later token reads of
        them); `layers` when every layer runs on every prompt token."""
        if self.attention == "dsv41" and self.kv_source_layers:
            return max(self.kv_source_layers)
        return self.layers

    @property
    def replay_kinds(self) -> tuple[tuple[str, int], ...]:
        """(attention kind, layers) over the layers from `replay_from` on."""
        tail = Counter(self.layer_kind_names()[self.replay_from:])
        return tuple((k, n) for k, n in tail.items() if n)

    @property
    def layer_kinds(self) -> tuple[tuple[str, int], ...]:
        """(attention kind, layers of that kind) over the decoder layers, MTP excluded."""
        if self.attention == "dsv41":
            counts = Counter(self.layer_kind_names())
            return tuple((k, n) for k, n in counts.items())
        if self.attention == "dsv4":
            counts = Counter(DSV4_RATIOS[r] for r in self.compress_ratios[:self.layers])
            return tuple((k, counts[k]) for k in DSV4_RATIOS.values() if counts[k])
        if self.attention == "mla":
            return (("dsa" if self.sparse_topk else "mla", self.layers),)
        pairs = (("gqa", self.layers - self.sliding_layers - self.linear_layers),
                 ("swa_gqa", self.sliding_layers), ("linear", self.linear_layers))
        return tuple((k, n) for k, n in pairs if n)

    def kinds(self) -> list[tuple[AttentionKind, int]]:
        """The attention kind objects of `layer_kinds`, with their layer counts."""
        return [(attention_kind(k), n) for k, n in self.layer_kinds]

    @property
    def mtp_kind(self) -> AttentionKind:
        """The attention kind of the MTP layers (V4 lists it after the decoder layers)."""
        if self.attention == "dsv4" and len(self.compress_ratios) > self.layers:
            return attention_kind(DSV4_RATIOS[self.compress_ratios[self.layers]])
        if self.attention == "dsv41":  # draft layers attend to their own window
            return attention_kind(CSA2Window.name)
        return self.kinds()[0][0]

    # ---- parameters -------------------------------------------------------------------------

    def expert_params(self) -> int:
        """Weights of one routed expert (gate, up, down)."""
        return 3 * self.hidden * self.moe_intermediate

    def mhc_params(self) -> int:
        """V4 hyper-connection mixing weights of one layer: two sites (attention, FFN), each
        projecting the hc_mult streams to pre/post weights and an hc_mult x hc_mult mix."""
        if self.hc_mult <= 1:
            return 0
        n = self.hc_mult
        return 2 * (n * self.hidden * (2 * n + n * n) + 2 * n + n * n)

    def params(self) -> dict[Component, int]:
        """Parameter count per component over the whole model."""
        out: dict[Component, int] = {
            "embedding": self.vocab * self.hidden,
            "attention": sum(k.params(self) * n for k, n in self.kinds()),
            "mhc": self.layers * self.mhc_params(),
            "dense_mlp": self.dense_layers * 3 * self.hidden * self.dense_intermediate,
            "routed_experts": self.moe_layers * self.n_routed_experts * self.expert_params(),
            "shared_experts": self.moe_layers * self.n_shared_experts * self.expert_params(),
            "router": self.moe_layers * self.hidden * self.n_routed_experts,
            "lm_head": self.vocab * self.hidden,
            "mtp": 0,
        }
        if self.mtp_layers:
            experts = self.mtp_experts or self.n_routed_experts
            layer = (self.mtp_kind.params(self) + self.mhc_params()
                     + (experts + self.n_shared_experts) * self.expert_params()
                     + self.hidden * experts)
            # MTP: each layer projects [embedding; hidden] (eh_proj); DSpark: the first layer
            # projects the target layers' inputs (main_proj)
            proj = (self.dspark_targets * self.hidden * self.hidden if self.dspark_block
                    else self.mtp_layers * 2 * self.hidden * self.hidden)
            out["mtp"] = self.mtp_layers * layer + proj
        if self.engram_layers:
            out["engram"] = self.engram_layers * self.engram_key_width() * (
                (self.hc_mult + 1) * self.hidden)
            out["engram_tables"] = self.engram_rows * self.engram_head_dim
        return out

    def engram_key_width(self) -> int:
        """Width of the rows one token gathers in one Engram layer: a row per head of each
        n-gram order from 2 to `engram_ngram`."""
        return max(self.engram_ngram - 1, 0) * self.engram_heads * self.engram_head_dim

    def prefill_active_params(self) -> int:
        """Parameters one prompt token touches: `active_params` with the layers from
        `replay_from` on left out but for the last KV source's compressor (they run only on a
        prompt's last window of tokens), and without the lm_head (only a prompt's last token
        is sampled)."""
        if self.replay_from >= self.layers:
            return self.active_params() - self.params()["lm_head"]
        kinds = dict(self.replay_kinds)
        tail = sum(attention_kind(k).params(self) * n for k, n in kinds.items())
        per_layer = (self.mhc_params()
                     + (self.top_k + self.n_shared_experts) * self.expert_params()
                     + self.hidden * self.n_routed_experts)
        replayed = self.layers - self.replay_from
        cut = attention_kind(self.layer_kind_names()[self.replay_from])
        return (self.active_params() - self.params()["lm_head"] - tail
                - replayed * per_layer + getattr(cut, "compressor_params", lambda m: 0)(self))

    def total_params(self) -> int:
        return sum(self.params().values())

    def active_params(self) -> int:
        """Parameters touched per token (routed experts counted top_k times per MoE layer)."""
        p = self.params()
        routed = self.moe_layers * self.top_k * self.expert_params()
        return sum(v for k, v in p.items()
                   if k not in ("routed_experts", "mtp", "engram_tables")) + routed

    def weight_bytes(self, weights: str) -> dict[Component, float]:
        """Bytes per component for a weight precision.

        bf16: everything 2 bytes. fp8: linear layers 1 byte, embedding / lm_head / router bf16.
        fp4: routed experts in 4-bit (NVFP4/MXFP4 incl. block scales), other linears fp8.
        int4: routed experts in weight-only INT4 (incl. group scales), other linears bf16, as
        Kimi-K2.5's native checkpoint stores them. Routed experts are never wider than the
        checkpoint stores them (`expert_dtype`).
        """
        if weights not in DTYPE_BYTES:
            raise SpecError(f"weights={weights!r} is not one of {', '.join(DTYPE_BYTES)}")
        linear = DTYPE_BYTES[linear_dtype(weights)]
        experts = min(DTYPE_BYTES[weights], DTYPE_BYTES[self.expert_dtype or weights])
        per_byte: dict[Component, float] = {
            "embedding": 2.0, "lm_head": 2.0, "router": 2.0, "attention": linear, "mhc": 2.0,
            "dense_mlp": linear, "routed_experts": experts, "shared_experts": linear, "mtp": linear,
            "engram": linear,
            # fp8 rows with one E8M0 scale per 32 values (264 bytes a row of 256)
            "engram_tables": 1.0 + 1.0 / 32,
        }
        return {k: v * per_byte[k] for k, v in self.params().items()}

    def expert_weights(self, weights: str) -> str:
        """The dtype the routed experts are served in for a deployment's weight precision."""
        if self.expert_dtype and DTYPE_BYTES[self.expert_dtype] < DTYPE_BYTES[weights]:
            return self.expert_dtype
        return weights

    # ---- KV cache ---------------------------------------------------------------------------

    def kv_bytes_per_token(self, kv_dtype: str, indexer: str = "fp8", split: int = 1) -> float:
        """KV bytes one more context token adds over all layers, for contexts longer than any
        window (windowed layers add nothing; compressed layers a share of an entry); with
        `split`, on one rank of a TP group of that many (each kind's share its own way)."""
        check_kv_dtype(kv_dtype, indexer)
        return float(sum(k.kv_token_bytes(self, kv_dtype, indexer) * n / k.kv_split(self, split)
                         for k, n in self.kinds()))

    def kv_bytes(self, context: float, kv_dtype: str, indexer: str = "fp8",
                 split: int = 1) -> float:
        """KV bytes one request of `context` tokens holds over all layers (windows, compressed
        entries and per-request compressor state included); with `split`, on one rank of a TP
        group of that many (each kind's share its own way, as `kv_token_cost` takes it)."""
        check_kv_dtype(kv_dtype, indexer)
        return float(sum(k.kv_bytes(self, context, kv_dtype, indexer) * n / k.kv_split(self, split)
                         for k, n in self.kinds()))

    def kv_fixed_bytes(self, kv_dtype: str, indexer: str = "fp8") -> float:
        """KV bytes a long request holds beyond `kv_bytes_per_token` x context."""
        check_kv_dtype(kv_dtype, indexer)
        return float(sum(k.kv_fixed_bytes(self, kv_dtype, indexer) * n
                         for k, n in self.kinds()))

    def kv_token_cost(self, kv_dtype: str, indexer: str = "fp8",
                      split: int = 1) -> Callable[[float], float]:
        """Context -> KV pool tokens one request takes on a rank, a pool token being the KV
        one more context token adds there: the context itself for a model whose every layer
        grows alike, more for windows and per-request compressor or recurrent state. `split`:
        the TP ranks an instance shares its cache over (`memory.kv_split`), which each kind
        divides its own way (GQA by its KV heads, Gated DeltaNet by its key heads, latent
        caches not at all): a rank's share of a request is taken kind by kind."""
        per = self.kv_bytes_per_token(kv_dtype, indexer, split)
        if not self.kv_fixed_bytes(kv_dtype, indexer) or per <= 0:
            return float
        kinds = self.kinds()  # once, not on every admission
        ways = [k.kv_split(self, split) for k, _ in kinds]

        def cost(context: float) -> float:
            return float(sum(k.kv_bytes(self, context, kv_dtype, indexer) * n / w
                             for (k, n), w in zip(kinds, ways, strict=True))) / per
        return cost

    @property
    def full_attention_layers(self) -> int:
        return self.layers - self.sliding_layers - self.linear_layers

    # ---- FLOPs ------------------------------------------------------------------------------

    def attended_context(self, context: float) -> float:
        """Entries one query attends to in the model's first non-windowed layer kind."""
        k = self.kinds()[-1][0] if self.attention != "dsv4" else attention_kind("csa")
        return float(k.attended(self, context))

    def attention_core_flops(self, context: float) -> float:
        """Score + value (+ indexer) FLOPs of one new token over all layers (decode form; MLA
        absorbed)."""
        return float(sum(k.core_flops(self, context) * n for k, n in self.kinds()))

    def flops_per_token(self, context: float = 0.0) -> dict[str, float]:
        """FLOPs per token per operation over all layers."""
        return {
            "attention_proj": 2.0 * self.params()["attention"],
            "attention_core": self.attention_core_flops(context),
            "dense_mlp": 2.0 * self.dense_layers * 3 * self.hidden * self.dense_intermediate,
            "routed_experts": 2.0 * self.moe_layers * self.top_k * self.expert_params(),
            "shared_experts": 2.0 * self.moe_layers * self.n_shared_experts * self.expert_params(),
            "router": 2.0 * self.moe_layers * self.hidden * self.n_routed_experts,
            "lm_head": 2.0 * self.hidden * self.vocab,
        }


# ---- loading ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class FieldKind:
    """What a config.json field may hold: `valid` says it in words for the error; a list's
    entries are each checked against `each`."""

    valid: str
    ok: Callable[[Any], bool]
    each: FieldKind | None = None


def _ints(lo: int, hi: int) -> FieldKind:
    """An integer from lo to hi (JSON true/false and 4096.0 are not integers)."""
    return FieldKind(f"an integer from {lo} to {hi:,}",
                     lambda v: type(v) is int and lo <= v <= hi)


def _list_of(item: FieldKind) -> FieldKind:
    return FieldKind(f"a list, each entry {item.valid}", lambda v: isinstance(v, list), item)


# Upper bounds: the largest value among aiconfigurator-core's 117 real configs and our presets
# times a margin of 30 or more, so no real model is refused while a typo or a 10**40 is, before
# it reaches any arithmetic.
LAYERS = _ints(1, 4096)  # most: 126 decoder layers (Llama-3.1-405B)
SOME_LAYERS = _ints(0, 4096)  # dense, MTP or hash-routed layers: a share of LAYERS
WIDTH = _ints(1, 1 << 20)  # hidden 16,384 and MLP 53,248 (Llama-3.1-405B); head dims <= 512
RANK = _ints(0, 1 << 20)  # low-rank projections (q/o_lora_rank): 0 or null for none
HEADS = _ints(1, 1 << 14)  # most: 128 query heads (DeepSeek-V3, Llama-3.1-405B)
EXPERTS = _ints(0, 1 << 16)  # most: 512 routed experts (Qwen3.5); 0 for a dense model
VOCAB = _ints(1, 1 << 24)  # most: 248,320 tokens (Qwen3.5)
TOKENS = _ints(0, 1 << 30)  # windows: gpt-oss 128, Qwen2's configs 131,072 (the context)
SELECTED = _ints(1, 1 << 30)  # index_topk: tokens each query attends to, 2,048 at most
SMALL = _ints(0, 1024)  # hyper-connection streams (4), Sinkhorn iterations (20), groups (16)
BOOL = FieldKind("true or false", lambda v: isinstance(v, bool))
MAPPING = FieldKind("a JSON object", lambda v: isinstance(v, dict))
STRINGS = _list_of(FieldKind("a string", lambda v: isinstance(v, str)))

CONFIG_FIELDS: dict[str, FieldKind] = {
    "architectures": STRINGS, "num_hidden_layers": LAYERS, "hidden_size": WIDTH,
    "vocab_size": VOCAB, "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
    "head_dim": WIDTH, "qk_nope_head_dim": WIDTH, "qk_rope_head_dim": WIDTH,
    "v_head_dim": WIDTH, "kv_lora_rank": WIDTH, "q_lora_rank": RANK, "o_lora_rank": RANK,
    "o_groups": SMALL, "intermediate_size": WIDTH, "moe_intermediate_size": WIDTH,
    "shared_expert_intermediate_size": RANK, "first_k_dense_replace": SOME_LAYERS,
    "num_nextn_predict_layers": SOME_LAYERS, "mtp_num_hidden_layers": SOME_LAYERS,
    "num_hash_layers": SOME_LAYERS, "n_routed_experts": EXPERTS, "num_experts": EXPERTS,
    "num_local_experts": EXPERTS, "n_shared_experts": EXPERTS, "num_experts_per_tok": EXPERTS,
    "experts_per_token": EXPERTS, "index_topk": SELECTED, "index_head_dim": WIDTH,
    "index_n_heads": HEADS, "sliding_window": TOKENS, "use_sliding_window": BOOL,
    "max_position_embeddings": _ints(1, 1 << 30),  # most: V4's 1,048,576 after its YaRN factor
    "layer_types": STRINGS, "mlp_only_layers": _list_of(_ints(0, 4095)),
    "compress_ratios": _list_of(_ints(0, 1 << 20)), "hc_mult": _ints(1, 1024),
    "hc_sinkhorn_iters": SMALL, "linear_num_key_heads": HEADS, "linear_key_head_dim": WIDTH,
    "linear_num_value_heads": HEADS, "linear_value_head_dim": WIDTH,
    "linear_conv_kernel_dim": _ints(1, 1024), "attn_output_gate": BOOL,
    "text_config": MAPPING, "rope_scaling": MAPPING, "quantization_config": MAPPING,
    "kv_source_layer_ids": _list_of(_ints(0, 4095)),
    "index_source_layer_ids": _list_of(_ints(0, 4095)),
    "candidate_source_layer_id": _ints(0, 4095), "candidate_topk_blocks": _ints(0, 1 << 24),
    "candidate_block_size": _ints(1, 1 << 16), "engram_layer_ids": _list_of(_ints(0, 4095)),
    "engram_num_embeddings": _list_of(_ints(1, 1 << 40)), "engram_n_heads": HEADS,
    "engram_head_dim": WIDTH, "engram_max_ngram_size": SMALL, "dspark_block_size": SMALL,
    "dspark_target_layer_ids": _list_of(_ints(0, 4095)), "dspark_n_routed_experts": EXPERTS,
    "dspark_markov_rank": _ints(0, 1 << 16),
}
"""config.json key -> what it may hold: every field a builder reads (and the nested objects a
config carries), checked before any arithmetic; null counts as absent."""


def _show(value: Any) -> str:
    """A config value as the other spec errors show it (true, null, nan, inf), cut short."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return reprlib.repr(value)


def _check(name: str, cfg: dict[str, Any], key: str, prefix: str = "") -> None:
    """SpecError naming `key` (and the entry of a list) when the config holds what
    CONFIG_FIELDS does not allow there."""
    value, kind = cfg.get(key), CONFIG_FIELDS[key]
    if value is None:
        return
    if not kind.ok(value):
        raise SpecError(f"{name}: config.json has {prefix}{key}={_show(value)}; it must be "
                        f"{kind.valid}")
    each = kind.each
    bad = next((i for i, v in enumerate(value) if not each.ok(v)), None) if each else None
    if each and bad is not None:
        raise SpecError(f"{name}: config.json has {prefix}{key}[{bad}]={_show(value[bad])}; "
                        f"each entry must be {each.valid}")


def _checked(name: str, cfg: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The config, every field of CONFIG_FIELDS checked, with null fields dropped (null
    counts as absent)."""
    for key in CONFIG_FIELDS:
        _check(name, cfg, key, prefix)
    return {k: v for k, v in cfg.items() if v is not None}


def _require(ok: bool, name: str, problem: str) -> None:
    if not ok:
        raise SpecError(f"{name}: config.json has {problem}")


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


SPARSE_MLA = ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")
"""MLA architectures with a lightning indexer choosing index_topk tokens per query (DSA)."""


def _check_top_k(name: str, top_k: int, experts: int) -> None:
    _require(top_k <= experts, name, f"{top_k} experts per token (num_experts_per_tok) but "
             f"{experts} routed experts; a token can be routed to at most all of them")


def _from_deepseek(name: str, arch: str, cfg: dict[str, Any]) -> ModelSpec:
    layers = cfg["num_hidden_layers"]
    sparse = arch in SPARSE_MLA
    experts = _get(cfg, "n_routed_experts", default=0)
    top_k = _get(cfg, "num_experts_per_tok", default=0)
    _check_top_k(name, top_k, experts)
    return ModelSpec(
        name=name, architecture=arch, hidden=cfg["hidden_size"], layers=layers,
        dense_layers=min(layers, _get(cfg, "first_k_dense_replace", default=0)),
        vocab=cfg["vocab_size"], attention="mla",
        num_attention_heads=cfg["num_attention_heads"],
        num_kv_heads=cfg["num_attention_heads"],
        head_dim=cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"],
        q_lora_rank=_get(cfg, "q_lora_rank", default=0), kv_lora_rank=cfg["kv_lora_rank"],
        qk_rope_head_dim=cfg["qk_rope_head_dim"], v_head_dim=cfg["v_head_dim"],
        sparse_topk=cfg["index_topk"] if sparse else 0,
        index_head_dim=cfg["index_head_dim"] if sparse else 0,
        index_n_heads=cfg["index_n_heads"] if sparse else 0,
        dense_intermediate=cfg["intermediate_size"],
        n_routed_experts=experts,
        n_shared_experts=_get(cfg, "n_shared_experts", default=0),
        top_k=top_k,
        moe_intermediate=_get(cfg, "moe_intermediate_size", default=0),
        mtp_layers=_get(cfg, "num_nextn_predict_layers", default=0),
    )


def _ratios(name: str, arch: str, cfg: dict[str, Any], allowed: Iterable[int],
            meaning: str) -> list[int]:
    """compress_ratios, one per decoder layer and then (optionally) one per draft layer, each
    one of `allowed` (`meaning` says what they are)."""
    layers = cfg["num_hidden_layers"]
    mtp = _get(cfg, "num_nextn_predict_layers", default=0)
    ratios: list[int] = cfg["compress_ratios"]
    if len(ratios) not in (layers, layers + mtp):
        raise SpecError(f"{name}: compress_ratios has {len(ratios)} entries; {arch} with "
                        f"num_hidden_layers={layers} and num_nextn_predict_layers={mtp} needs "
                        f"{layers + mtp} (one per decoder layer, then one per draft layer)")
    ok = list(allowed)
    odd = sorted({r for r in ratios if r not in ok})
    if odd:
        raise SpecError(f"{name}: compress_ratios holds {', '.join(map(str, odd))}; each entry "
                        f"must be one of {', '.join(map(str, ok))} ({meaning})")
    return ratios


def _expert_dtype(name: str, value: Any) -> Any:
    """A config's routed-expert dtype, checked."""
    if value not in (None, "bf16", "fp8", "fp4"):
        raise SpecError(f"{name}: expert_dtype={_show(value)} is not one of bf16, fp8, fp4")
    return value


def _from_deepseek_v4(name: str, arch: str, cfg: dict[str, Any]) -> ModelSpec:
    """DeepSeek-V4 (Flash, Pro): compressed attention per layer from compress_ratios,
    hash-routed first MoE layers, hyper-connections, fp4 experts, MTP."""
    layers = cfg["num_hidden_layers"]
    ratios = _ratios(name, arch, cfg, DSV4_RATIOS, "0 sliding window only, 4 CSA, 128 HCA")
    experts = _expert_dtype(name, cfg.get("expert_dtype"))
    hashed = _get(cfg, "num_hash_layers", default=0)
    _require(hashed <= layers, name, f"num_hash_layers={hashed}; it must be at most "
             f"num_hidden_layers={layers}")
    _check_top_k(name, cfg["num_experts_per_tok"], cfg["n_routed_experts"])
    return ModelSpec(**_v4_family(name, arch, cfg, ratios), attention="dsv4",
                     hash_layers=hashed, expert_dtype=experts)


def _v4_family(name: str, arch: str, cfg: dict[str, Any], ratios: list[int]) -> dict[str, Any]:
    """The ModelSpec fields DeepSeek-V4 and V4.1 configs give alike: the shared-KV-head
    attention with low-rank query and grouped low-rank output, its window and indexer,
    hyper-connections, the MoE and the draft layers."""
    return dict(
        name=name, architecture=arch, hidden=cfg["hidden_size"],
        layers=cfg["num_hidden_layers"], dense_layers=0, vocab=cfg["vocab_size"],
        num_attention_heads=cfg["num_attention_heads"],
        num_kv_heads=_get(cfg, "num_key_value_heads", default=1),
        head_dim=cfg["head_dim"], q_lora_rank=cfg["q_lora_rank"],
        qk_rope_head_dim=cfg["qk_rope_head_dim"], v_head_dim=cfg["head_dim"],
        o_lora_rank=cfg["o_lora_rank"], o_groups=cfg["o_groups"],
        sliding_window=cfg["sliding_window"], compress_ratios=tuple(ratios),
        sparse_topk=cfg["index_topk"], index_head_dim=cfg["index_head_dim"],
        index_n_heads=cfg["index_n_heads"],
        hc_mult=_get(cfg, "hc_mult", default=1),
        hc_sinkhorn_iters=_get(cfg, "hc_sinkhorn_iters", default=0),
        n_routed_experts=cfg["n_routed_experts"],
        n_shared_experts=_get(cfg, "n_shared_experts", default=0),
        top_k=cfg["num_experts_per_tok"], moe_intermediate=cfg["moe_intermediate_size"],
        mtp_layers=_get(cfg, "num_nextn_predict_layers", default=0))

V41_RATIOS = (0, 1, 2)
"""DeepSeek-V4.1 compress_ratios values: 0 window only, 1 or 2 tokens per compressed record."""


_V41_KINDS: dict[int, tuple[ModelSpec, tuple[str, ...]]] = {}
"""id(a V4.1 model) -> (the model, kept so that its id stays its own; its layers' kinds): a
step asks for them per layer kind (the model is frozen)."""


def _v41_kind(m: ModelSpec, layer: int) -> str:
    """The CSA2 kind of V4.1 decoder layer `layer` (see CSA2_ROLES)."""
    ratio = m.compress_ratios[layer]
    if ratio == 0:
        return CSA2Window.name
    role = ("source" if layer in m.kv_source_layers
            else "candidates" if layer in m.index_source_layers else "none")
    return CSA2_ROLES[(role, ratio)]


def _from_deepseek_v41(name: str, arch: str, cfg: dict[str, Any]) -> ModelSpec:
    """DeepSeek-V4.1 (Flash): the causal encoder-decoder with CSA2 attention (compressed
    records stored by a few KV-source layers, read by the rest), Engram n-gram memory,
    single-pass hyper-connections, fp4 experts and DSpark draft layers. Reads `text_config`
    (the vision tower is ignored) and the top level's quantization_config."""
    text = _checked(name, cfg["text_config"], "text_config.")
    try:
        return _v41_spec(name, arch, text, cfg.get("quantization_config") or {})
    except KeyError as e:
        raise KeyError(f"text_config.{e.args[0]}") from None


def _v41_spec(name: str, arch: str, cfg: dict[str, Any], quant: dict[str, Any]) -> ModelSpec:
    layers = cfg["num_hidden_layers"]
    ratios = _ratios(name, arch, cfg, V41_RATIOS,
                     "0 window only, 1 or 2 tokens per compressed record")
    sources = sorted(set(cfg["kv_source_layer_ids"]))
    index = sorted(set(cfg["index_source_layer_ids"]))
    _require(bool(sources) and sources[-1] < layers, name,
             f"kv_source_layer_ids={_show(cfg['kv_source_layer_ids'])}; it must list at least "
             f"one layer below num_hidden_layers={layers}")
    _require(not index or index[-1] < layers, name,
             f"index_source_layer_ids={_show(cfg['index_source_layer_ids'])}; each must be "
             f"below num_hidden_layers={layers}")
    for layer in range(layers):
        ratio = ratios[layer]
        before = [s for s in sources if s <= layer]
        if layer in sources:
            _require(ratio > 0 and layer in index, name,
                     f"KV source layer {layer} with compress ratio {ratio}; a source must "
                     "compress (ratio 1 or 2) and be in index_source_layer_ids")
        elif ratio:
            _require(bool(before) and ratios[before[-1]] == ratio, name,
                     f"layer {layer} reading records of ratio {ratio} but "
                     + (f"its nearest KV source at or before it, layer {before[-1]}, has ratio "
                        f"{ratios[before[-1]]}" if before else "no KV source at or before it"))
    experts = _expert_dtype(name, quant.get("expert_dtype", cfg.get("expert_dtype")))
    _check_top_k(name, cfg["num_experts_per_tok"], cfg["n_routed_experts"])
    engram = _get(cfg, "engram_layer_ids", default=[])
    rows = _get(cfg, "engram_num_embeddings", default=[])
    _require(len(rows) == len(engram), name,
             f"{len(rows)} engram_num_embeddings for {len(engram)} engram_layer_ids; it needs "
             "one table size per Engram layer")
    block = _get(cfg, "dspark_block_size", default=0)
    return ModelSpec(
        **_v4_family(name, arch, cfg, ratios), attention="dsv41",
        kv_source_layers=tuple(sources), index_source_layers=tuple(index),
        candidate_pool=(_get(cfg, "candidate_topk_blocks", default=0)
                        * _get(cfg, "candidate_block_size", default=1)),
        hash_layers=_get(cfg, "num_hash_layers", default=0), expert_dtype=experts,
        engram_layers=len(engram), engram_rows=sum(rows),
        engram_heads=_get(cfg, "engram_n_heads", default=0) if engram else 0,
        engram_head_dim=_get(cfg, "engram_head_dim", default=0) if engram else 0,
        engram_ngram=_get(cfg, "engram_max_ngram_size", default=0) if engram else 0,
        mtp_experts=_get(cfg, "dspark_n_routed_experts", default=0) if block else 0,
        dspark_block=block,
        dspark_targets=len(_get(cfg, "dspark_target_layer_ids", default=[])) if block else 0,
        dspark_markov_rank=_get(cfg, "dspark_markov_rank", default=0) if block else 0,
    )

GQA_LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")


def _from_gqa(name: str, arch: str, cfg: dict[str, Any]) -> ModelSpec:
    """Dense or MoE GQA models (Llama, Qwen3, Mixtral, gpt-oss, MiniMax-M2), and Qwen3.5's mix
    of Gated DeltaNet linear-attention layers with gated full-attention layers.

    MiniMax-M2 names its expert width intermediate_size (it has no dense layers) and its MTP
    modules (use_mtp) are not counted: upstream vLLM has no MiniMax-M2 MTP draft model.
    """
    layers = cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv_heads = _get(cfg, "num_key_value_heads", default=heads)
    _require(heads % kv_heads == 0, name, f"num_key_value_heads={kv_heads}; it must divide "
             f"num_attention_heads={heads} (each KV head serves a whole group of query heads)")
    if cfg.get("head_dim") is None:
        _require(cfg["hidden_size"] % heads == 0, name, f"no head_dim and "
                 f"num_attention_heads={heads}, which does not divide "
                 f"hidden_size={cfg['hidden_size']}; give head_dim")
    experts = _get(cfg, "num_experts", "num_local_experts", "n_routed_experts", default=0)
    only = _get(cfg, "mlp_only_layers", default=[])
    _require(len(set(only)) == len(only) and all(i < layers for i in only), name,
             f"mlp_only_layers={_show(only)}; it must list distinct layer indices below "
             f"num_hidden_layers={layers}")
    layer_types = _get(cfg, "layer_types", default=[])
    _require(not layer_types or len(layer_types) == layers, name,
             f"{len(layer_types)} layer_types and num_hidden_layers={layers}; it needs one "
             "layer type per layer")
    odd = sorted({t for t in layer_types if t not in GQA_LAYER_TYPES})
    if odd:
        raise SpecError(f"{name}: {arch} has layer types {', '.join(odd)}; only "
                        f"{' and '.join(GQA_LAYER_TYPES)} layers can be described")
    window = _get(cfg, "sliding_window", default=0)
    sliding = sum(1 for t in layer_types if t == "sliding_attention") if window else 0
    if window and not layer_types and cfg.get("use_sliding_window", True):
        sliding = layers
    linear = sum(1 for t in layer_types if t == "linear_attention")
    gdn = ({"linear_k_heads": cfg["linear_num_key_heads"],
            "linear_k_dim": cfg["linear_key_head_dim"],
            "linear_v_heads": cfg["linear_num_value_heads"],
            "linear_v_dim": cfg["linear_value_head_dim"],
            "linear_conv_kernel": cfg["linear_conv_kernel_dim"]} if linear else {})
    top_k = _get(cfg, "num_experts_per_tok", "experts_per_token", default=0) if experts else 0
    _check_top_k(name, top_k, experts)
    return ModelSpec(
        linear_layers=linear, **gdn, attn_output_gate=cfg.get("attn_output_gate", False),
        mtp_layers=_get(cfg, "mtp_num_hidden_layers", default=0),
        name=name, architecture=arch, hidden=cfg["hidden_size"], layers=layers,
        dense_layers=layers if not experts else len(only), vocab=cfg["vocab_size"],
        qk_norm_across_heads=(bool(cfg.get("use_qk_norm"))
                              and cfg.get("qk_norm_type") == "per_layer"),
        attention="gqa", num_attention_heads=heads, num_kv_heads=kv_heads,
        head_dim=_get(cfg, "head_dim", default=cfg["hidden_size"] // heads),
        sliding_window=window if sliding else 0, sliding_layers=sliding,
        dense_intermediate=(cfg["intermediate_size"] if not experts or only
                            else _get(cfg, "intermediate_size", default=0)),
        n_routed_experts=experts,
        n_shared_experts=1 if _get(cfg, "shared_expert_intermediate_size", default=0) else 0,
        top_k=top_k,
        moe_intermediate=(_get(cfg, "moe_intermediate_size", "intermediate_size", default=0)
                          if experts else 0),
    )


Builder = Callable[[str, str, dict[str, Any]], ModelSpec]


def _text_model(builder: Builder) -> Builder:
    """A builder for a multimodal wrapper: reads its text_config; the vision tower is ignored."""
    def build(name: str, arch: str, cfg: dict[str, Any]) -> ModelSpec:
        text = _checked(name, cfg["text_config"], "text_config.")
        try:
            return builder(name, arch, text)
        except KeyError as e:
            raise KeyError(f"text_config.{e.args[0]}") from None
    return build

BUILDERS: dict[str, Builder] = {
    "DeepseekV3ForCausalLM": _from_deepseek,
    "DeepseekV32ForCausalLM": _from_deepseek,
    "GlmMoeDsaForCausalLM": _from_deepseek,
    "DeepseekV4ForCausalLM": _from_deepseek_v4,
    "DeepseekV41ForCausalLM": _from_deepseek_v41,
    "KimiK2ForCausalLM": _from_deepseek,
    "KimiK25ForConditionalGeneration": _text_model(_from_deepseek),
    "Qwen3MoeForCausalLM": _from_gqa,
    "GptOssForCausalLM": _from_gqa,
    "MiniMaxM2ForCausalLM": _from_gqa,
    "MixtralForCausalLM": _from_gqa,
    "LlamaForCausalLM": _from_gqa,
    "Qwen2ForCausalLM": _from_gqa,
    "Qwen3ForCausalLM": _from_gqa,
    "Qwen3_5MoeForConditionalGeneration": _text_model(_from_gqa),
    "Qwen3_5ForConditionalGeneration": _text_model(_from_gqa),
}
"""Architecture class -> builder; one table of supported architectures."""

_HYBRID = ("of the layers with a constant-size recurrent state ModelSpec describes only Gated "
           "DeltaNet (Qwen3.5)")
UNSUPPORTED = {
    "NemotronHForCausalLM": f"it mixes Mamba-2 layers with attention; {_HYBRID}",
}
"""Architectures known and refused, with the reason shown to people."""


def model_from_config(name: str, cfg: dict[str, Any]) -> ModelSpec:
    """A ModelSpec from a parsed Hugging Face config.json (pure; no I/O); SpecError naming the
    key for a config that holds anything else than CONFIG_FIELDS allows."""
    if not isinstance(cfg, dict):
        raise SpecError(f"{name}: a config.json must hold a JSON object, not "
                        f"{type(cfg).__name__} {_show(cfg)}")
    _check(name, cfg, "architectures")
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in BUILDERS:
        why = f" ({UNSUPPORTED[arch]})" if arch in UNSUPPORTED else ""
        raise SpecError(f"{name}: architecture {arch!r} is not supported{why}; supported: "
                        f"{', '.join(BUILDERS)}")
    try:
        checked = _checked(name, cfg)
        spec = BUILDERS[arch](name, arch, checked)
    except KeyError as e:
        raise SpecError(f"{name}: config.json lacks the key {e.args[0]!r} that {arch} needs") \
            from None
    # a multimodal wrapper keeps the context in its text_config
    scope = checked if "max_position_embeddings" in checked else checked.get("text_config", {})
    return spec.model_copy(update={"context_length": _context_length(name, scope)})


NO_ROPE_LENGTH = ("su", "longrope", "llama3", "default", "mrope")
"""rope_scaling types whose factor does not lengthen the context (vLLM's
_get_and_verify_max_len leaves them out)."""


def _context_length(name: str, cfg: dict[str, Any]) -> int | None:
    """max_position_embeddings, scaled as vLLM scales it by the config's rope_scaling."""
    length = cfg.get("max_position_embeddings")
    if length is None:
        return None
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = scaling.get("factor")
    if factor is None or kind in NO_ROPE_LENGTH:
        return int(length)
    if isinstance(factor, bool) or not isinstance(factor, int | float) or \
            not 1 <= factor <= 1024:
        raise SpecError(f"{name}: config.json has rope_scaling.factor={_show(factor)}; it must "
                        "be a number from 1 to 1024")
    base = scaling.get("original_max_position_embeddings") if kind == "yarn" else None
    if base is not None and (type(base) is not int or not 1 <= base <= 1 << 30):
        raise SpecError(f"{name}: config.json has rope_scaling.original_max_position_embeddings"
                        f"={_show(base)}; it must be an integer from 1 to {1 << 30:,}")
    return int((base or length) * factor)


def preset_names() -> list[str]:
    """Names of the shipped model presets."""
    folder = resources.files("simulator.specs").joinpath(PRESET_DIR)
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir()
                  if p.name.endswith(".json"))


HF_PRESETS = {
    "deepseek-ai/DeepSeek-R1": "deepseek-r1",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3",
    "deepseek-ai/DeepSeek-V3.2": "deepseek-v3.2",
    "deepseek-ai/DeepSeek-V4-Flash": "deepseek-v4-flash",
    "deepseek-ai/DeepSeek-V4-Pro": "deepseek-v4-pro",
    "deepseek-ai/DeepSeek-V4.1-Flash": "deepseek-v4.1-flash",
    "moonshotai/Kimi-K2-Instruct": "kimi-k2",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "Qwen/Qwen3-235B-A22B": "qwen3-235b-a22b",
}
"""Hugging Face model ids whose preset is ours (the preset carries what the config does not,
e.g. V4's fp4 experts); other ids load their config.json (`hf_config`)."""


def hf_cache_dir() -> Path:
    """Where the Hugging Face hub keeps downloaded repositories ($HF_HUB_CACHE, else
    $HF_HOME/hub, else ~/.cache/huggingface/hub); read, never written."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME")
    return Path(home) / "hub" if home else Path.home() / ".cache" / "huggingface" / "hub"


def hf_config(model_id: str) -> Path | None:
    """The config.json of a Hugging Face model id found offline: the one aiconfigurator-core
    ships (117 models), else the newest snapshot in the local hub cache; None when neither."""
    flat = model_id.replace("/", "--")
    shipped = Path(str(resources.files("aiconfigurator_core"))) / "model_configs" / (
        f"{flat}_config.json")
    if _probe(shipped.is_file):
        return shipped
    snapshots = hf_cache_dir() / f"models--{flat}" / "snapshots"
    if not _probe(snapshots.is_dir):
        return None
    found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _probe(test: Callable[[], bool]) -> bool:
    """test() of a path, False where the file system cannot even look the name up (a name too
    long, a NUL byte)."""
    try:
        return test()
    except (OSError, ValueError):
        return False


def _hf_id(ref: str) -> bool:
    """Whether `ref` reads as a Hugging Face id (org/name) rather than a path."""
    return (ref.count("/") == 1 and not ref.startswith((".", "/", "~"))
            and not _probe(Path(ref).exists))


@cache
def load_model(path_or_preset: str) -> ModelSpec:
    """A preset by name; a Hugging Face id (org/name) through its preset or its config.json
    found offline (`hf_config`); or a config.json (or a folder holding one) by path."""
    ref = HF_PRESETS.get(path_or_preset, path_or_preset)
    if ref in preset_names():
        text = resources.files("simulator.specs").joinpath(f"{PRESET_DIR}/{ref}.json").read_text()
        return model_from_config(ref, json.loads(text))
    if _hf_id(path_or_preset):
        found = hf_config(path_or_preset)
        if found is None:
            raise SpecError(
                f"unknown model {path_or_preset!r}: no preset ({', '.join(preset_names())}), "
                f"no config.json among aiconfigurator-core's and none in the Hugging Face cache "
                f"{hf_cache_dir()}; give a path to its config.json")
        return model_from_config(path_or_preset, _read_config(found))
    path = Path(path_or_preset)
    if _probe(path.is_dir):
        path = path / "config.json"
    if not _probe(path.is_file):
        raise SpecError(f"unknown model {path_or_preset!r}; give a preset "
                        f"({', '.join(preset_names())}), a Hugging Face id (org/name) or a path "
                        "to a config.json")
    return model_from_config(str(path_or_preset), _read_config(path))


def _read_config(path: Path) -> Any:
    """The parsed JSON of a config.json (model_from_config checks what it holds)."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecError(f"{path}: not valid JSON ({e})") from None
    except ValueError as e:  # an integer of more digits than Python converts (4,300)
        raise SpecError(f"{path}: not valid JSON ({str(e).split(':')[0]})") from None
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply to be a config.json") from None
    except OSError as e:
        raise SpecError(f"{path}: cannot be read ({e.strerror or e})") from None
