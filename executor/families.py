"""What `vllm serve` needs for one model family, as data: one table keyed by architecture.

FAMILIES maps a Hugging Face architecture class (ModelSpec.architecture) to a Family: the vLLM
name of each KV-cache precision, the block size and tokenizer mode the family needs, whether it
has a sparse-attention indexer (and so an indexer cache dtype), and the MoE backend it takes on
Blackwell. An architecture not in the table gets GENERIC. The vLLM engine (executor/engines/
vllm.py) asks the family for its flags, executor/rules.py asks it which values vLLM accepts;
adding a family is one entry.

Every value below was read in vLLM 0.32.0 (the engine executor/engine_env.sh pins); each field
names the vLLM file it mirrors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from executor.records import Flag
from simulator.specs.deployment import SM100_HARDWARE, Deployment, RoleSpec, uses_mega_moe

SM100_ONLY = {
    # vllm/v1/attention/backends/mla/flashmla_sparse.py: nvfp4_ds_mla only on SM100.
    "nvfp4_ds_mla": "--kv-cache-dtype nvfp4_ds_mla",
    # vllm/v1/attention/backends/mla/indexer.py (dsa_indexer_uses_fp4): mxfp4 needs sm_10x.
    "mxfp4": "--attention-config indexer_kv_dtype='mxfp4'",
    # vllm/model_executor/layers/fused_moe/deep_gemm_mega_moe.py: "requires SM100 GPUs".
    "deep_gemm_mega_moe": "--moe-backend deep_gemm_mega_moe",
}
"""vLLM values that run on Blackwell datacenter GPUs only, with the flag that gives each."""
INDEXER_KV_DTYPES = ("auto", "fp8", "mxfp4")
"""indexer_kv_dtype values the DeepSeek sparse indexer accepts ("auto" is fp8);
vllm/v1/attention/backends/mla/indexer.py (DSA_INDEXER_KV_DTYPES)."""
INDEXER_FP4 = "mxfp4"
"""What precision.indexer_cache=fp4 is in vLLM: `--attention-config '{"indexer_kv_dtype":
"mxfp4"}'` (vllm/config/attention.py). vLLM 0.32 has no `use_fp4_indexer_cache` any more,
the name older DeepSeek-V4 recipes give; its AttentionConfig refuses unknown keys."""


@dataclass(frozen=True)
class Family:
    """The `vllm serve` flags one model family needs, and the values vLLM accepts for it."""

    kv_cache: Mapping[str, str]
    """precision.kv_cache -> --kv-cache-dtype value; a precision not here is refused."""
    kv_cache_why: str = ""
    """Why the precisions missing from kv_cache are refused (one clause, shown to people)."""
    vllm_kv_cache_dtypes: tuple[str, ...] | None = None
    """--kv-cache-dtype values the family's attention backends accept; None: not checked."""
    block_sizes: tuple[int, ...] = ()
    """KV block sizes the family's attention kernels support; the first is rendered
    (--block-size). Empty: vLLM picks one."""
    tokenizer_mode: str | None = None
    """--tokenizer-mode the family's chat encoding needs; None: vLLM's default."""
    sparse_indexer: bool = False
    """Whether the model has a DeepSeek sparse-attention indexer, whose key cache
    precision.indexer_cache stores."""
    mega_moe: str | None = None
    """--moe-backend of the family's fused dispatch + expert GEMM + combine kernel, taken for
    fp4 experts under expert parallelism on Blackwell instead of an --all2all-backend."""
    hybrid_kv_cache: bool = False
    """Whether the KV cache has several kinds of layers (sliding window, compressed) that need
    vLLM's hybrid KV-cache manager: rendered as --no-disable-hybrid-kv-cache-manager, so that
    vLLM refuses to start rather than turn it off (a KV connector may)."""
    speculative_method: str = "mtp"
    """--speculative-config method of the model's own draft layers."""
    kv_cache_tp1: tuple[str, ...] = ()
    """--kv-cache-dtype values only a backend that needs attention TP 1 reads."""

    def kv_cache_dtype(self, precision: str) -> str | None:
        """The --kv-cache-dtype value of a precision.kv_cache; None when vLLM has none here."""
        return self.kv_cache.get(precision)

    def uses_mega_moe(self, deployment: Deployment, role: RoleSpec, architecture: str) -> bool:
        """Whether this role runs the family's MegaMoE kernel: fp4 experts, expert parallel,
        Blackwell, and no all2all backend chosen by hand (that picks the fused-MoE path)."""
        return self.mega_moe is not None and uses_mega_moe(
            architecture, deployment.hardware, role, deployment.precision.weights)

    def flags(self, deployment: Deployment) -> list[Flag]:
        """Flags every process of this family gets, after --kv-cache-dtype (the block size
        goes with the memory flags)."""
        flags: list[Flag] = []
        if self.tokenizer_mode is not None:
            flags.append(("--tokenizer-mode", self.tokenizer_mode))
        if self.sparse_indexer and deployment.precision.indexer_cache == "fp4":
            flags.append(("--attention-config", {"indexer_kv_dtype": INDEXER_FP4}))
        if self.hybrid_kv_cache:
            flags.append(("--no-disable-hybrid-kv-cache-manager", None))
        return flags


GENERIC = Family(
    kv_cache={"bf16": "auto", "fp8": "fp8"},
    kv_cache_why="rackplan renders an fp4 KV cache only for DeepseekV32ForCausalLM "
                 "(vLLM's nvfp4_ds_mla)",
)
"""Any architecture not in FAMILIES: bf16 is the model's own dtype ("auto")."""

FAMILIES: dict[str, Family] = {
    "DeepseekV32ForCausalLM": Family(
        # vllm/model_executor/models/config.py (DeepseekV32ForCausalLM): "auto" is the model's
        # default cache dtype, so bf16 is asked for by name. fp4: NVFP4 NoPE + fp8 RoPE in
        # DeepSeek-V3.2's geometry, vllm/v1/attention/backends/mla/flashmla_sparse.py.
        kv_cache={"bf16": "bfloat16", "fp8": "fp8", "fp4": "nvfp4_ds_mla"},
        # flashmla_sparse.py and flashinfer_mla_sparse.py (supported_kv_cache_dtypes).
        vllm_kv_cache_dtypes=("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_ds_mla",
                              "nvfp4_ds_mla"),
        sparse_indexer=True,
    ),
    "DeepseekV4ForCausalLM": Family(
        # fp8 as vLLM's DeepSeek-V4 recipe and llm-d's guides/wide-ep-lws DeepSeek-V4 manifests
        # give it: vllm/models/deepseek_v4/attention.py (_resolve_dsv4_kv_cache_dtype) maps it
        # to fp8_ds_mla on FlashMLA and keeps per-tensor fp8 on FlashInfer, which on SM10x
        # refuses the name fp8_ds_mla (vllm/models/deepseek_v4/nvidia/flashinfer_sparse.py).
        kv_cache={"fp8": "fp8"},
        kv_cache_why="vLLM's DeepSeek-V4 sparse-MLA attention (FlashMLA, its default) keeps "
                     "the KV cache in fp8 only and no DeepSeek-V4 backend has an fp4 one",
        # vllm/models/deepseek_v4/sparse_mla.py and nvidia/flashinfer_sparse.py
        # (supported_kv_cache_dtypes).
        vllm_kv_cache_dtypes=("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_ds_mla"),
        # sparse_mla.py and flashinfer_sparse.py: get_supported_kernel_block_sizes -> [256];
        # the recipe's and llm-d's --block-size 256.
        block_sizes=(256,),
        # vllm/config/model.py (TokenizerMode; the default for DeepseekV4ForCausalLM) and the
        # recipe's / llm-d's --tokenizer-mode deepseek_v4.
        tokenizer_mode="deepseek_v4",
        sparse_indexer=True,
        # vllm/config/kernel.py (MoEBackend, NATIVE_MEGA_MOE_BACKENDS) and
        # vllm/models/deepseek_v4/nvidia/model.py (needs expert parallel and fp4 experts);
        # llm-d's DeepSeek-V4 prefill.yaml / decode.yaml: --moe-backend deep_gemm_mega_moe
        # and no --all2all-backend. vLLM has no all2all backend named for MegaMoE.
        mega_moe="deep_gemm_mega_moe",
        # llm-d's DeepSeek-V4 manifests; vllm/config/vllm.py turns the manager off for a KV
        # connector without HMA support unless this flag is given.
        hybrid_kv_cache=True,
        # vllm/config/speculative.py: V4's MTP layers load as DeepSeekV4MTPModel under "mtp".
        speculative_method="mtp",
    ),
    "DeepseekV41ForCausalLM": Family(
        # vllm/models/deepseek_v41/attention.py: the packed records. fp8 by its own name,
        # fp8_ds_mla: plain "fp8" resolves to the backend's preferred record, which under
        # Blackwell's mega attention (FLASHMLA_MEGA_ATTN_DSV41, the SM100 default) is
        # nvfp4_ds_mla; fp4 is that nvfp4_ds_mla record (288 bytes), whose window entries
        # stay fp8.
        kv_cache={"fp8": "fp8_ds_mla", "fp4": "nvfp4_ds_mla"},
        kv_cache_why="vLLM's DeepSeek-V4.1 FlashMLA and mega-attention backends keep packed fp8 "
                     "or nvfp4 records (bf16 rows only on its FlashInfer backend, not picked "
                     "on Blackwell datacenter GPUs or Hopper)",
        # FlashMLA (sparse_mla) and mega attention (flash_mla_mega_attn.py)
        # supported_kv_cache_dtypes.
        vllm_kv_cache_dtypes=("auto", "fp8", "fp8_ds_mla", "nvfp4_ds_mla"),
        # vllm/config/model.py (TokenizerMode; what "auto" resolves to for V4.1) and vLLM's
        # DeepSeek-V4.1 recipe's --tokenizer-mode deepseek_v41.
        tokenizer_mode="deepseek_v41",
        sparse_indexer=True,
        # vllm/models/deepseek_v41/nvidia/model.py: MegaMoE needs expert parallel, SM100 and
        # fp4 experts, as for V4.
        mega_moe="deep_gemm_mega_moe",
        # a window group and the compressed records' group (kv_cache_interface.py)
        hybrid_kv_cache=True,
        # vllm/config/speculative.py: V4.1's draft layers run only as "dspark" ("mtp" raises).
        speculative_method="dspark",
        # nvfp4_ds_mla is read only by mega attention, which needs 8 local heads per output
        # group (64 heads in 8 groups: attention TP 1) (flash_mla_mega_attn.py).
        kv_cache_tp1=("nvfp4_ds_mla",),
    ),
}
"""Architecture -> Family; every other architecture gets GENERIC."""


def family_for(architecture: str | None) -> Family:
    """The family of a Hugging Face architecture class (GENERIC when not in FAMILIES)."""
    return FAMILIES.get(architecture or "", GENERIC)


def indexer_architectures() -> list[str]:
    """Architectures with a sparse-attention indexer, for messages."""
    return [a for a, f in FAMILIES.items() if f.sparse_indexer]


def deployment_problems(deployment: Deployment, architecture: str) -> list[str]:
    """The precisions of `deployment` that vLLM has no flag for on this model and hardware,
    one sentence each (empty when none)."""
    family, precision = family_for(architecture), deployment.precision
    hw, model = deployment.hardware.lower(), deployment.model
    problems = []
    kv = family.kv_cache_dtype(precision.kv_cache)
    if kv is None:
        valid = " or ".join(family.kv_cache)
        problems.append(f"precision.kv_cache={precision.kv_cache!r} has no vLLM KV-cache dtype "
                        f"for {model} ({architecture}): {family.kv_cache_why}; use kv_cache "
                        f"{valid}")
    elif kv in SM100_ONLY and hw not in SM100_HARDWARE:
        problems.append(f"precision.kv_cache={precision.kv_cache!r} (vLLM {kv}) needs Blackwell "
                        f"datacenter GPUs ({', '.join(SM100_HARDWARE)}), not {hw}; use "
                        "kv_cache fp8")
    if kv in family.kv_cache_tp1:
        wide = [f"{name} {r.layout}" for name, r in deployment.roles.items()
                if r.attention_tp > 1 or (r.dep is None and r.ranks > 1)]
        if wide:
            problems.append(f"precision.kv_cache={precision.kv_cache!r} (vLLM {kv}) is read only "
                            f"by {model}'s mega-attention backend, which needs attention TP 1, "
                            f"not {', '.join(wide)}; use dep layouts or kv_cache fp8")
    if precision.indexer_cache == "fp4":
        if not family.sparse_indexer:
            problems.append(f"precision.indexer_cache='fp4' needs a model with a sparse-attention "
                            f"indexer ({', '.join(indexer_architectures())}), but {model} is "
                            f"{architecture}; use indexer_cache fp8")
        elif hw not in SM100_HARDWARE:
            problems.append(f"precision.indexer_cache='fp4' (vLLM indexer_kv_dtype mxfp4) needs "
                            f"Blackwell datacenter GPUs ({', '.join(SM100_HARDWARE)}), not {hw}; "
                            "use indexer_cache fp8")
    return problems
