"""Model architecture, read from a Hugging Face config.json or a shipped preset.

Everything the cost model needs is derived here: parameter counts and weight bytes per component,
KV-cache bytes per token, and FLOPs per token per operation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator.specs.errors import SpecError
from simulator.specs.hardware import DTYPE_BYTES

Component = Literal["embedding", "attention", "dense_mlp", "routed_experts", "shared_experts",
                    "router", "lm_head", "mtp"]

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
    attention: Literal["mla", "gqa"]
    """Attention kind: multi-head latent (DeepSeek, Kimi, GLM-5) or grouped-query."""
    num_attention_heads: int = Field(ge=1)
    """Query heads."""
    num_kv_heads: int = Field(ge=1)
    """KV heads (GQA); equals query heads for MLA."""
    head_dim: int = Field(ge=1)
    """Per-head dimension of q/k (GQA) or qk_nope + qk_rope (MLA)."""
    q_lora_rank: int = Field(0, ge=0)
    """MLA query compression rank (0: no compression)."""
    kv_lora_rank: int = Field(0, ge=0)
    """MLA latent KV rank."""
    qk_rope_head_dim: int = Field(0, ge=0)
    """MLA rotary part of each head."""
    v_head_dim: int = Field(0, ge=0)
    """MLA value head dimension."""
    sliding_window: int = Field(0, ge=0)
    """Window of sliding-window layers in tokens (0: none)."""
    sliding_layers: int = Field(0, ge=0)
    """How many layers use the sliding window."""
    sparse_topk: int = Field(0, ge=0)
    """DeepSeek-V3.2 / GLM-5 sparse attention: tokens each query attends to (0: dense)."""
    index_head_dim: int = Field(0, ge=0)
    """Sparse-attention indexer key dimension, cached per token per layer."""
    index_n_heads: int = Field(0, ge=0)
    """Sparse-attention indexer query heads (DeepSeek-V3.2: 64, GLM-5: 32)."""
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

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    # ---- parameters -------------------------------------------------------------------------

    def attention_params(self) -> int:
        """Weights of one attention block (projections only)."""
        h, n = self.hidden, self.num_attention_heads
        if self.attention == "mla":
            nope = self.head_dim - self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * n * self.head_dim
                 if self.q_lora_rank else h * n * self.head_dim)
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * n * (
                nope + self.v_head_dim)
            # Indexer: wq_b (q_lora -> heads x dim), wk (hidden -> dim), weights_proj (-> heads).
            indexer = (self.index_n_heads * (self.q_lora_rank * self.index_head_dim + h)
                       + h * self.index_head_dim if self.sparse_topk else 0)
            return q + kv + n * self.v_head_dim * h + indexer
        return h * n * self.head_dim + 2 * h * self.num_kv_heads * self.head_dim + (
            n * self.head_dim * h)

    def expert_params(self) -> int:
        """Weights of one routed expert (gate, up, down)."""
        return 3 * self.hidden * self.moe_intermediate

    def params(self) -> dict[Component, int]:
        """Parameter count per component over the whole model."""
        out: dict[Component, int] = {
            "embedding": self.vocab * self.hidden,
            "attention": self.layers * self.attention_params(),
            "dense_mlp": self.dense_layers * 3 * self.hidden * self.dense_intermediate,
            "routed_experts": self.moe_layers * self.n_routed_experts * self.expert_params(),
            "shared_experts": self.moe_layers * self.n_shared_experts * self.expert_params(),
            "router": self.moe_layers * self.hidden * self.n_routed_experts,
            "lm_head": self.vocab * self.hidden,
            "mtp": 0,
        }
        if self.mtp_layers:
            layer = (self.attention_params() + (self.n_routed_experts + self.n_shared_experts)
                     * self.expert_params() + self.hidden * self.n_routed_experts)
            out["mtp"] = self.mtp_layers * (layer + 2 * self.hidden * self.hidden)
        return out

    def total_params(self) -> int:
        return sum(self.params().values())

    def active_params(self) -> int:
        """Parameters touched per token (routed experts counted top_k times per MoE layer)."""
        p = self.params()
        routed = self.moe_layers * self.top_k * self.expert_params()
        return sum(v for k, v in p.items() if k not in ("routed_experts", "mtp")) + routed

    def weight_bytes(self, weights: str) -> dict[Component, float]:
        """Bytes per component for a weight precision.

        bf16: everything 2 bytes. fp8: linear layers 1 byte, embedding / lm_head / router bf16.
        fp4: routed experts in 4-bit (NVFP4/MXFP4 incl. block scales), other linears fp8.
        """
        if weights not in DTYPE_BYTES:
            raise SpecError(f"weights={weights!r} is not one of {', '.join(DTYPE_BYTES)}")
        linear = DTYPE_BYTES["bf16" if weights == "bf16" else "fp8"]
        experts = DTYPE_BYTES[weights]
        per_byte: dict[Component, float] = {
            "embedding": 2.0, "lm_head": 2.0, "router": 2.0, "attention": linear,
            "dense_mlp": linear, "routed_experts": experts, "shared_experts": linear, "mtp": linear,
        }
        return {k: v * per_byte[k] for k, v in self.params().items()}

    # ---- KV cache ---------------------------------------------------------------------------

    def kv_bytes_per_token_layer(self, kv_dtype: str) -> float:
        """KV-cache bytes one token occupies in one layer."""
        if kv_dtype not in ("bf16", "fp8"):
            raise SpecError(f"kv_cache={kv_dtype!r} is not one of bf16, fp8")
        b = DTYPE_BYTES[kv_dtype]
        if self.attention == "mla":
            per = (self.kv_lora_rank + self.qk_rope_head_dim) * b
            if self.index_head_dim:
                per += self.index_head_dim + 4  # fp8 indexer key + its fp32 scale
            return per
        return 2 * self.num_kv_heads * self.head_dim * b

    def kv_bytes_per_token(self, kv_dtype: str) -> float:
        """KV bytes per token over all layers, for contexts longer than any sliding window."""
        return self.full_attention_layers * self.kv_bytes_per_token_layer(kv_dtype)

    def kv_bytes(self, context: float, kv_dtype: str) -> float:
        """KV bytes one request of `context` tokens holds (sliding layers keep only the window)."""
        per = self.kv_bytes_per_token_layer(kv_dtype)
        sliding = self.sliding_layers * min(context, self.sliding_window)
        return per * (self.full_attention_layers * context + sliding)

    @property
    def full_attention_layers(self) -> int:
        return self.layers - self.sliding_layers

    # ---- FLOPs ------------------------------------------------------------------------------

    def attended_context(self, context: float) -> float:
        """Tokens one query attends to in a full-attention layer."""
        return min(context, self.sparse_topk) if self.sparse_topk else context

    def attention_core_flops(self, context: float) -> float:
        """Score + value FLOPs of one new token over all layers (decode form; MLA absorbed)."""
        if self.attention == "mla":
            per_ctx = 2 * self.num_attention_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        else:
            per_ctx = 2 * self.num_attention_heads * 2 * self.head_dim
        window = min(context, self.sliding_window) if self.sliding_window else 0.0
        return per_ctx * (self.full_attention_layers * self.attended_context(context)
                          + self.sliding_layers * window)

    def flops_per_token(self, context: float = 0.0) -> dict[str, float]:
        """FLOPs per token per operation over all layers."""
        return {
            "attention_proj": 2.0 * self.layers * self.attention_params(),
            "attention_core": self.attention_core_flops(context),
            "dense_mlp": 2.0 * self.dense_layers * 3 * self.hidden * self.dense_intermediate,
            "routed_experts": 2.0 * self.moe_layers * self.top_k * self.expert_params(),
            "shared_experts": 2.0 * self.moe_layers * self.n_shared_experts * self.expert_params(),
            "router": 2.0 * self.moe_layers * self.hidden * self.n_routed_experts,
            "lm_head": 2.0 * self.hidden * self.vocab,
        }


# ---- loading ----------------------------------------------------------------------------------

def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


SPARSE_MLA = ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")
"""MLA architectures with a lightning indexer choosing index_topk tokens per query (DSA)."""


def _from_deepseek(name: str, arch: str, cfg: dict[str, Any]) -> ModelSpec:
    layers = int(cfg["num_hidden_layers"])
    sparse = arch in SPARSE_MLA
    return ModelSpec(
        name=name, architecture=arch, hidden=cfg["hidden_size"], layers=layers,
        dense_layers=min(layers, int(_get(cfg, "first_k_dense_replace", default=0))),
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
        n_routed_experts=_get(cfg, "n_routed_experts", default=0),
        n_shared_experts=_get(cfg, "n_shared_experts", default=0),
        top_k=_get(cfg, "num_experts_per_tok", default=0),
        moe_intermediate=_get(cfg, "moe_intermediate_size", default=0),
        mtp_layers=_get(cfg, "num_nextn_predict_layers", default=0),
    )


GQA_LAYER_TYPES = ("full_attention", "sliding_attention")


def _from_gqa(name: str, arch: str, cfg: dict[str, Any]) -> ModelSpec:
    """Dense or MoE GQA models (Llama, Qwen3, Mixtral, gpt-oss, MiniMax-M2).

    MiniMax-M2 names its expert width intermediate_size (it has no dense layers) and its MTP
    modules (use_mtp) are not counted: upstream vLLM has no MiniMax-M2 MTP draft model.
    """
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    experts = int(_get(cfg, "num_experts", "num_local_experts", "n_routed_experts", default=0))
    mlp_only = len(_get(cfg, "mlp_only_layers", default=[]))
    layer_types = _get(cfg, "layer_types", default=[]) or []
    odd = sorted({t for t in layer_types if t not in GQA_LAYER_TYPES})
    if odd:
        raise SpecError(f"{name}: {arch} has layer types {', '.join(odd)}; only "
                        f"{' and '.join(GQA_LAYER_TYPES)} layers can be described")
    window = int(_get(cfg, "sliding_window", default=0) or 0)
    sliding = sum(1 for t in layer_types if t == "sliding_attention") if window else 0
    if window and not layer_types and cfg.get("use_sliding_window", True):
        sliding = layers
    return ModelSpec(
        name=name, architecture=arch, hidden=cfg["hidden_size"], layers=layers,
        dense_layers=layers if not experts else mlp_only, vocab=cfg["vocab_size"],
        attention="gqa", num_attention_heads=heads,
        num_kv_heads=_get(cfg, "num_key_value_heads", default=heads),
        head_dim=_get(cfg, "head_dim", default=cfg["hidden_size"] // heads),
        sliding_window=window if sliding else 0, sliding_layers=sliding,
        dense_intermediate=cfg["intermediate_size"], n_routed_experts=experts,
        n_shared_experts=1 if _get(cfg, "shared_expert_intermediate_size", default=0) else 0,
        top_k=_get(cfg, "num_experts_per_tok", "experts_per_token", default=0) if experts else 0,
        moe_intermediate=(_get(cfg, "moe_intermediate_size", "intermediate_size", default=0)
                          if experts else 0),
    )


Builder = Callable[[str, str, dict[str, Any]], ModelSpec]


def _text_model(builder: Builder) -> Builder:
    """A builder for a multimodal wrapper: reads its text_config; the vision tower is ignored."""
    def build(name: str, arch: str, cfg: dict[str, Any]) -> ModelSpec:
        text = cfg["text_config"]
        if not isinstance(text, dict):
            raise SpecError(f"{name}: text_config of {arch} must be a JSON object")
        try:
            return builder(name, arch, text)
        except KeyError as e:
            raise KeyError(f"text_config.{e.args[0]}") from None
    return build


BUILDERS: dict[str, Builder] = {
    "DeepseekV3ForCausalLM": _from_deepseek,
    "DeepseekV32ForCausalLM": _from_deepseek,
    "GlmMoeDsaForCausalLM": _from_deepseek,
    "KimiK2ForCausalLM": _from_deepseek,
    "KimiK25ForConditionalGeneration": _text_model(_from_deepseek),
    "Qwen3MoeForCausalLM": _from_gqa,
    "GptOssForCausalLM": _from_gqa,
    "MiniMaxM2ForCausalLM": _from_gqa,
    "MixtralForCausalLM": _from_gqa,
    "LlamaForCausalLM": _from_gqa,
    "Qwen2ForCausalLM": _from_gqa,
    "Qwen3ForCausalLM": _from_gqa,
}
"""Architecture class -> builder; one table of supported architectures."""

_HYBRID = ("ModelSpec has only MLA/GQA layers, whose KV cache grows per token, and no layers "
           "with a constant-size recurrent state")
UNSUPPORTED = {
    "Qwen3_5MoeForConditionalGeneration":
        f"it mixes Gated DeltaNet linear-attention layers with full attention; {_HYBRID}",
    "Qwen3_5ForConditionalGeneration":
        f"it mixes Gated DeltaNet linear-attention layers with full attention; {_HYBRID}",
    "NemotronHForCausalLM": f"it mixes Mamba-2 layers with attention; {_HYBRID}",
}
"""Architectures known and refused, with the reason shown to people."""


def model_from_config(name: str, cfg: dict[str, Any]) -> ModelSpec:
    """A ModelSpec from a parsed Hugging Face config.json (pure; no I/O)."""
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in BUILDERS:
        why = f" ({UNSUPPORTED[arch]})" if arch in UNSUPPORTED else ""
        raise SpecError(f"{name}: architecture {arch!r} is not supported{why}; supported: "
                        f"{', '.join(BUILDERS)}")
    try:
        return BUILDERS[arch](name, arch, cfg)
    except KeyError as e:
        raise SpecError(f"{name}: config.json lacks the key {e.args[0]!r} that {arch} needs") \
            from None


def preset_names() -> list[str]:
    """Names of the shipped model presets."""
    folder = resources.files("simulator.specs").joinpath(PRESET_DIR)
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir()
                  if p.name.endswith(".json"))


@cache
def load_model(path_or_preset: str) -> ModelSpec:
    """A preset by name, or a Hugging Face config.json (or a folder holding one) by path."""
    if path_or_preset in preset_names():
        text = resources.files("simulator.specs").joinpath(
            f"{PRESET_DIR}/{path_or_preset}.json").read_text()
        return model_from_config(path_or_preset, json.loads(text))
    path = Path(path_or_preset)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise SpecError(f"unknown model {path_or_preset!r}; give a preset "
                        f"({', '.join(preset_names())}) or a path to a config.json")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise SpecError(f"{path}: a config.json must hold a JSON object")
    return model_from_config(str(path_or_preset), cfg)
