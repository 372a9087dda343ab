"""Deployment spec: model, hardware, engine, and the instances of each serving role."""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import ConfigDict, Field, model_validator

from simulator.specs.errors import SpecError
from simulator.specs.hardware import Dtype
from simulator.specs.limits import (
    MAX_CONTEXT_TOKENS,
    MAX_DRAFT_TOKENS,
    MAX_GPUS,
    MAX_HOST_GB,
    MAX_INSTANCES,
    MAX_NUM_SEQS,
    MAX_RECV_INTERVAL,
)
from simulator.specs.routing import DEFAULT_ROUTER, RouterPolicy
from simulator.specs.spec import Spec

_SPEC = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

Role = Literal["prefill", "decode", "aggregated"]
All2AllBackend = Literal[
    "naive",
    "pplx",
    "deepep_high_throughput",
    "deepep_low_latency",
    "allgather_reducescatter",
    "flashinfer_all2allv",
    "flashinfer_nvlink_one_sided",
]

DEFAULT_BACKEND: dict[str, All2AllBackend] = {
    "prefill": "deepep_high_throughput",
    "decode": "deepep_low_latency",
    "aggregated": "allgather_reducescatter",
}
DBO_BACKENDS = ("deepep_low_latency", "deepep_high_throughput")
"""All-to-all backends vLLM's dual-batch overlap (micro-batching) runs with."""


class Precision(Spec):
    """Storage types of the weights and of the KV cache."""

    model_config = _SPEC

    weights: Dtype = "fp8"
    """Weight dtype: bf16, fp8, fp4 (NVFP4/MXFP4 MoE), or int4 (weight-only INT4 routed experts
    with bf16 other layers, as Kimi-K2.5's native checkpoint) (default fp8)."""
    kv_cache: Literal["bf16", "fp8", "fp4"] = "fp8"
    """KV-cache dtype: bf16, fp8, or fp4 (default fp8)."""
    indexer_cache: Literal["fp8", "fp4"] = "fp8"
    """Dtype of the sparse-attention indexer's key cache (DeepSeek-V3.2 / V4): fp8, or fp4
    (vLLM --attention-config.use_fp4_indexer_cache) (default fp8)."""


class Speculative(Spec):
    """Speculative decoding with the model's own draft layers: multi-token prediction (MTP)
    layers drafting one token per pass, or DeepSeek-V4.1's DSpark layers drafting a block of
    tokens in one pass."""

    model_config = _SPEC

    method: Literal["mtp", "dspark"] = "mtp"
    """Drafting method: mtp, or dspark for a model with DSpark draft layers (default mtp)."""
    tokens: int = Field(1, ge=1, le=MAX_DRAFT_TOKENS)
    """Draft tokens proposed per step, at most 64 (dspark: at most its block) (default 1)."""
    acceptance: float = Field(0.7, ge=0, le=1)
    """Probability that a draft token is accepted, in [0, 1] (default 0.7)."""


class RoleSpec(Spec):
    """The engine instances of one role (prefill, decode, or aggregated), all alike."""

    model_config = _SPEC

    instances: int = Field(1, ge=1, le=MAX_INSTANCES)
    """Engine instances of this role, at most 2,048 (default 1)."""
    dep: int | None = Field(None, ge=1, le=MAX_GPUS)
    """Attention data-parallel ranks per instance, MoE expert-parallel over all its GPUs
    (DEP-N); with tp, each DP rank is a TP group (vLLM --data-parallel-size dep
    --tensor-parallel-size tp, dep x tp GPUs)."""
    tp: int | None = Field(None, ge=1, le=MAX_GPUS)
    """Tensor-parallel ranks: of the whole instance without dep (dense / TP layouts), of each
    DP rank with dep; neither: tp=1."""
    enable_expert_parallel: bool = False
    """With tp: split MoE experts over the TP ranks instead of each expert's weights (vLLM's
    --enable-expert-parallel); dep always does (default false)."""
    max_num_seqs: int = Field(256, ge=1, le=MAX_NUM_SEQS)
    """Most sequences in a batch, per rank, at most 1,048,576 (default 256)."""
    max_num_batched_tokens: int = Field(8192, ge=1, le=MAX_CONTEXT_TOKENS)
    """Most tokens in one engine step, per rank, at most 10,000,000 (default 8192)."""
    long_prefill_token_threshold: int = Field(0, ge=0, le=MAX_CONTEXT_TOKENS)
    """Most prompt tokens one request computes in a step (vLLM's
    --long-prefill-token-threshold): a longer prompt is chunked at this many and the step's
    other tokens go to the prompts queued behind it; 0: a prompt takes what the step's budget
    leaves (default 0, vLLM's with one partial prefill at a time)."""
    redundant_experts: int = Field(0, ge=0)
    """Extra expert slots per MoE layer placed by EPLB; needs dep (default 0)."""
    speculative: Speculative | None = None
    """Speculative decoding {method: mtp, tokens, acceptance}; null for none (default)."""
    all2all_backend: All2AllBackend | None = None
    """MoE all-to-all backend; null: deepep_high_throughput for prefill, deepep_low_latency for
    decode, allgather_reducescatter for aggregated."""
    router: RouterPolicy | None = None
    """How requests pick an instance or DP rank (simulator.specs.routing's table, shared with
    the deployed proxy); null: prefix_aware for prefill and aggregated, least_requests for
    decode."""
    dbo: bool = False
    """Dual-batch overlap: split a step into two micro-batches so that one's MoE all-to-all
    runs under the other's compute (vLLM --enable-dbo; off by default, as in vLLM)."""
    dbo_decode_token_threshold: int = Field(32, ge=0, le=MAX_CONTEXT_TOKENS)
    """With dbo: a decode-only step of more tokens per rank than this is split (vLLM's
    default 32)."""
    dbo_prefill_token_threshold: int = Field(512, ge=0, le=MAX_CONTEXT_TOKENS)
    """With dbo: a step with prefill work of more tokens per rank than this is split (vLLM's
    default 512)."""
    recv_interval: int = Field(1, ge=1, le=MAX_RECV_INTERVAL)
    """SGLang's --scheduler-recv-interval: the scheduler takes in new requests only once this
    many decode steps have run since it last did, or right after a step that computed prompt
    tokens, so a request that comes meanwhile waits; 1: at every step (default 1; engine
    sglang only, at most 1,000)."""
    attention_dp_balance: bool = False
    """Hold new prompts until every DP rank has one to start, so that the ranks prefill in the
    same step instead of one rank's prefill stalling the others' decode; released when the
    engine's waiting count (steps in which not every rank had a prompt, whether or not one
    waited) reaches ADP_BALANCE_TIMEOUT_STEPS, or at once where a rank with a prompt has
    nothing to decode (TensorRT-LLM's attention_dp_config enable_balance, timeout_iters 60,
    batching_wait_iters 0; engine trtllm with dep only) (default false)."""
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    """Share of GPU memory the engine may use, in (0, 1] (default 0.9): of the whole HBM for
    vLLM and SGLang, of the memory the loaded model leaves free for TensorRT-LLM (its
    free_gpu_memory_fraction)."""
    cpu_offload_gb: float = Field(0.0, ge=0, le=MAX_HOST_GB)
    """GiB of weights per GPU kept in host memory and read over the host link in every forward
    pass (vLLM --cpu-offload-gb, zero-copy; fast on GB200/GB300's NVLink-C2C) (default 0)."""
    offload_backend: Literal["uva", "prefetch"] = "uva"
    """How the cpu_offload_gb of weights reach the GPU: uva reads them in place over the host
    link in every forward pass (vLLM --cpu-offload-gb); prefetch offloads whole decoder layers
    (one of every few) and copies each into GPU memory one layer ahead, under the previous
    layer's compute (vLLM --offload-backend prefetch) (default uva)."""
    host_cache_gb: float = Field(0.0, ge=0, le=MAX_HOST_GB)
    """GiB of host memory per GPU for the prefix cache's second tier: every computed KV block is
    also stored there, and a prompt whose blocks left HBM loads them over the host link instead
    of computing them (vLLM --kv-offloading-size, which counts all TP ranks together) (default
    0: no host tier)."""
    host_cache_backend: Literal["native", "lmcache"] = "native"
    """Who keeps the host tier: vLLM's own offloading connector or LMCache
    (--kv-offloading-backend) (default native)."""
    prefix_caching: bool = True
    """Keep finished prompts' KV blocks for later prompts that share their prefix (vLLM's
    automatic prefix caching, on by default); false: every prompt token is computed, whatever
    hits the workload's block ids or prefix_hit_rate would give (--no-enable-prefix-caching;
    e.g. for a benchmark whose dataset repeats prompts the prediction does not)."""

    @model_validator(mode="after")
    def _check(self) -> RoleSpec:
        if self.dep is not None and self.enable_expert_parallel:
            raise SpecError("enable_expert_parallel applies to tp layouts; dep already splits "
                            "the experts over every GPU of the instance")
        if self.redundant_experts > 0 and not self.expert_parallel:
            raise SpecError(
                f"redundant_experts={self.redundant_experts} needs expert parallelism; "
                "give dep (or tp with enable_expert_parallel), or set redundant_experts to 0"
            )
        if self.attention_dp_balance and self.dep is None:
            raise SpecError("attention_dp_balance=true balances prompts over DP ranks and needs "
                            "dep; give dep or set attention_dp_balance to false")
        if self.offload_backend == "prefetch" and not self.cpu_offload_gb:
            raise SpecError("offload_backend='prefetch' moves cpu_offload_gb of weights to host "
                            "memory; give cpu_offload_gb > 0 or leave offload_backend uva")
        if self.host_cache_gb and not self.prefix_caching:
            raise SpecError(f"host_cache_gb={self.host_cache_gb:g} is a second tier of the prefix "
                            "cache, which prefix_caching=false turns off; set host_cache_gb to 0 "
                            "or prefix_caching to true")
        if self.dbo and self.dep is None:
            raise SpecError("dbo=true overlaps the DP ranks' all-to-all and needs dep; give dep "
                            "or set dbo to false")
        return self

    @property
    def ranks(self) -> int:
        """GPUs per instance."""
        if self.dep is not None:
            return self.dep * (self.tp or 1)
        return self.tp or 1

    @property
    def attention_tp(self) -> int:
        """GPUs of one attention rank: tp inside each DP rank with dep, else the instance."""
        return self.tp or 1

    @property
    def gpus(self) -> int:
        """GPUs of all instances of this role."""
        return self.instances * self.ranks

    @property
    def expert_parallel(self) -> bool:
        """Whether MoE experts are split over the ranks (dep, or tp with enable_expert_parallel)."""
        return self.dep is not None or self.enable_expert_parallel

    @property
    def layout(self) -> str:
        """Short name of one instance's layout: DEP8, DEP4xTP4, TP4, TP8+EP."""
        if self.dep is not None:
            return f"DEP{self.dep}" + (f"xTP{self.tp}" if self.tp and self.tp > 1 else "")
        return f"TP{self.tp or 1}" + ("+EP" if self.enable_expert_parallel else "")

    def backend(self, role: str) -> All2AllBackend:
        """The all2all backend in effect for this role."""
        return self.all2all_backend or DEFAULT_BACKEND[role]

    def router_policy(self, role: str) -> RouterPolicy:
        """The router policy in effect for this role."""
        return self.router or DEFAULT_ROUTER[role]


class Deployment(Spec):
    """One serving deployment: what runs, on what, and how the roles are laid out."""

    model_config = _SPEC

    model: str
    """Model preset name, or a path to a Hugging Face config.json (required)."""
    hardware: str
    """Hardware preset name, e.g. h200 (required)."""
    engine: Literal["vllm", "sglang", "trtllm"] = "vllm"
    """Engine whose calibration tables price the steps: vllm, sglang or trtllm (default vllm)."""
    engine_version: str | None = None
    """Engine version that picks the calibration tables; null for the newest (default)."""
    precision: Precision = Precision()
    """Storage types {weights, kv_cache} (default fp8 / fp8)."""
    gpus: int | None = Field(None, ge=1, le=MAX_GPUS)
    """Cluster size in GPUs, at most 200,000; null for exactly what the roles use (default)."""
    usd_per_gpu_hour: float | None = Field(None, ge=0)
    """Price per GPU-hour; null for the hardware preset's price (default)."""
    prefill: RoleSpec | None = None
    """Prefill instances of a P/D-disaggregated layout (give with decode; alone for the
    prefill_only bench)."""
    decode: RoleSpec | None = None
    """Decode instances of a P/D-disaggregated layout (give with prefill; alone for the
    decode_only bench)."""
    aggregated: RoleSpec | None = None
    """Instances that both prefill and decode, for a layout without P/D (instead of both)."""

    @model_validator(mode="after")
    def _check(self) -> Deployment:
        pd = [r for r in ("prefill", "decode") if getattr(self, r) is not None]
        if self.aggregated is not None and pd:
            raise SpecError(
                f"aggregated cannot be given with {' and '.join(pd)}; give prefill and decode "
                "(P/D), or aggregated alone"
            )
        if self.aggregated is None and not pd:
            raise SpecError("no roles given; give prefill and decode (P/D), aggregated alone, "
                            "or one of prefill / decode alone for an isolated-role bench")
        for name, r in self.roles.items():
            if r.dbo and r.backend(name) not in DBO_BACKENDS:
                raise SpecError(f"{name}: dbo=true needs all2all_backend in "
                                f"{', '.join(DBO_BACKENDS)} (vLLM's micro-batching), not "
                                f"{r.backend(name)!r}")
            if r.recv_interval > 1 and self.engine != "sglang":
                raise SpecError(f"{name}: recv_interval={r.recv_interval} is SGLang's "
                                f"--scheduler-recv-interval; engine {self.engine} takes in "
                                "requests at every step (use engine sglang, or recv_interval 1)")
            if r.attention_dp_balance and self.engine != "trtllm":
                raise SpecError(f"{name}: attention_dp_balance=true is TensorRT-LLM's "
                                f"attention-DP scheduler; engine {self.engine} has none (use "
                                "engine trtllm, or set attention_dp_balance to false)")
        used = self.gpus_used
        if used > MAX_GPUS:
            parts = ", ".join(
                f"{name} {r.instances} x {r.layout} = {r.gpus:,}" for name, r in self.roles.items()
            )
            raise SpecError(f"roles use {used:,} GPUs ({parts}), more than the {MAX_GPUS:,} of "
                            "the largest clusters built")
        if self.gpus is not None and self.gpus < used:
            parts = ", ".join(
                f"{name} {r.instances} x {r.layout} = {r.gpus}" for name, r in self.roles.items()
            )
            raise SpecError(f"roles use {used} GPUs ({parts}) but gpus={self.gpus}")
        return self

    @property
    def roles(self) -> dict[str, RoleSpec]:
        """The roles present, in the order prefill, decode, aggregated."""
        named = (("prefill", self.prefill), ("decode", self.decode),
                 ("aggregated", self.aggregated))
        return {name: r for name, r in named if r is not None}

    @property
    def gpus_used(self) -> int:
        """GPUs of all instances of all roles."""
        return sum(r.gpus for r in self.roles.values())

    @property
    def single_role(self) -> str | None:
        """prefill or decode when the deployment is that role alone (an isolated-role bench,
        as vLLM's `bench forward` or DecodeBenchConnector measure one role), else None."""
        roles = list(self.roles)
        return roles[0] if len(roles) == 1 and roles[0] != "aggregated" else None

    @property
    def disaggregated(self) -> bool:
        """Whether prefill and decode run on separate instances."""
        return self.aggregated is None


class ModelLike(Protocol):
    """What check_against_model needs of a model spec."""

    @property
    def name(self) -> str: ...
    @property
    def n_routed_experts(self) -> int: ...
    @property
    def is_moe(self) -> bool: ...
    @property
    def mtp_layers(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def dspark_block(self) -> int: ...
    @property
    def engram_layers(self) -> int: ...


def check_against_model(deployment: Deployment, model: ModelLike) -> None:
    """Raise SpecError where a role breaks one of vLLM's rules for this model."""
    for name, role in deployment.roles.items():
        error = _role_error(role, model)
        if error:
            raise SpecError(f"{name}: {error}")


def experts_divide(routed: int, redundant: int, ranks: int) -> bool:
    """vLLM's expert-placement rule: an MoE layer's routed plus redundant expert slots split
    evenly over its expert-parallel ranks, (routed + redundant) % ranks == 0."""
    return (routed + redundant) % ranks == 0


def experts_error(routed: int, redundant: int, ranks: int, size: str) -> str | None:
    """The clause saying that `ranks` expert-parallel ranks (named `size`, e.g. "dep=40") do not
    divide routed+redundant experts, with the nearest valid redundant count; None when they do.
    The one copy of the rule: the spec's check, the executor's rules over launch records and the
    planner's space all ask it."""
    if experts_divide(routed, redundant, ranks):
        return None
    fix = redundant + (-(routed + redundant)) % ranks
    return (f"{size} must divide routed+redundant experts ({routed}+{redundant}="
            f"{routed + redundant}); e.g. redundant_experts={fix} ({routed + fix} = {ranks} x "
            f"{(routed + fix) // ranks})")


def mtp_tokens_fit(tokens: int, mtp_layers: int) -> bool:
    """vLLM's MTP rule: draft tokens up to the model's MTP layers, or a multiple of them above
    (the layers run again); a model without MTP layers drafts none."""
    return mtp_layers > 0 and (tokens <= mtp_layers or tokens % mtp_layers == 0)


def _role_error(role: RoleSpec, model: ModelLike) -> str | None:
    """The first rule of vLLM this role breaks for this model, as a clause; None if none."""
    r = role.redundant_experts
    if r > 0 and not model.is_moe:
        return f"redundant_experts={r} needs an MoE model but {model.name} is dense; use 0"
    if model.is_moe and role.expert_parallel:
        n = role.ranks
        size = (f"{role.layout} ({n} GPUs)" if role.dep and role.tp else
                f"dep={n}" if role.dep is not None else f"tp={n}")
        most = model.n_routed_experts * (n - 1)
        if r > most:
            return (f"redundant_experts={r} is more than {size} can place: "
                    f"{model.n_routed_experts} experts x ({n} - 1) = {most} extra slots already "
                    "put every expert on every rank")
        error = experts_error(model.n_routed_experts, r, n, size)
        if error:
            return error
    spec = role.speculative
    if spec is not None:
        k, m, block = spec.tokens, model.mtp_layers, model.dspark_block
        if m == 0:
            return f"speculative method {spec.method!r} needs MTP layers but {model.name} has none"
        if spec.method == "mtp" and block:
            return (f"{model.name}'s draft layers are DSpark layers, which vLLM runs only as "
                    "speculative method 'dspark' (it refuses 'mtp'); use method dspark")
        if spec.method == "dspark" and not block:
            return (f"speculative method 'dspark' needs DSpark draft layers but "
                    f"{model.name}'s are MTP layers; use method mtp")
        if spec.method == "dspark" and k > block:
            return (f"speculative tokens={k} is more than the DSpark block of {block} tokens "
                    f"{model.name} drafts in one pass; use at most {block}")
        if spec.method == "mtp" and not mtp_tokens_fit(k, m):
            return f"speculative tokens={k} above the {m} MTP layers must be a multiple of {m}"
    if role.dbo and model.engram_layers:
        return (f"dbo=true: {model.name}'s Engram layers do not run micro-batched in vLLM "
                "(DBO or --ubatch-size); set dbo to false")
    if role.tp is not None:
        tp, heads, kv = role.tp, model.num_attention_heads, model.num_kv_heads
        if heads % tp:
            return f"tp={tp} must divide the {heads} attention heads of {model.name}"
        if kv % tp and tp % kv:
            return f"tp={tp} and the {kv} KV heads of {model.name} must divide one another"
    return None


SM100_HARDWARE = ("b200", "b300", "gb200", "gb300")
"""Hardware presets with Blackwell datacenter GPUs (CUDA sm_10x)."""
MEGA_MOE_ARCHITECTURES = ("DeepseekV4ForCausalLM", "DeepseekV41ForCausalLM")
"""Architectures vLLM runs on DeepGEMM's MegaMoE kernel (dispatch, expert GEMMs and combine
fused; vLLM --moe-backend deep_gemm_mega_moe) where it applies."""


MEGA_ATTENTION_ARCHITECTURES = ("DeepseekV41ForCausalLM",)
"""Architectures vLLM runs on FlashMLA's mega attention on Blackwell (FLASHMLA_MEGA_ATTN_DSV41,
its SM100 default for V4.1: one kernel for the query's RoPE, the window + top-k attention, the
output's inverse RoPE and its FP8 cast, vllm/models/deepseek_v41/nvidia/flash_mla_mega_attn.py);
the projections stay GEMMs."""

MEGA_ATTENTION_HEADS = 64
"""Query heads the mega-attention kernel computes (it takes 64 or 128): a TP shard with fewer
local heads is zero-padded to 64, so it pays for 64 (vLLM's benchmark_dsv41_mega_attn.py: at 16
live heads, TP4 on a 64-head model, the kernel and the unfused split-KV path cost alike)."""


def uses_mega_attention(architecture: str | None, hardware: str) -> bool:
    """Whether an instance's attention layers run mega attention: a family that has it, on
    Blackwell (at any attention TP, its heads padded to MEGA_ATTENTION_HEADS)."""
    return architecture in MEGA_ATTENTION_ARCHITECTURES and hardware.lower() in SM100_HARDWARE


ADP_BALANCE_TIMEOUT_STEPS = 60
"""The count of steps at which held prompts start anyway (TensorRT-LLM's attention_dp_config
timeout_iters as InferenceX's DeepSeek recipes set it); the count runs whether or not a prompt
waits, so a prompt waits for its next timeout, up to this many steps."""


def uses_mega_moe(architecture: str, hardware: str, role: RoleSpec, weights: str) -> bool:
    """Whether a role runs MegaMoE: a family that has it, fp4 experts, expert parallel,
    Blackwell, and no all2all backend or dual-batch overlap chosen by hand (either picks the
    DeepEP path). The
    executor renders exactly this; the cost model prices it."""
    return (architecture in MEGA_MOE_ARCHITECTURES and role.expert_parallel
            and role.all2all_backend is None and not role.dbo and weights == "fp4"
            and hardware.lower() in SM100_HARDWARE)
