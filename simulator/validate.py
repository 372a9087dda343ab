"""Accuracy against measured deployments: aiconfigurator-core's `systems/silicon_sample.csv`.

Reading the rows. An instance's GPUs are tp_size x attention_dp_size; attention DP with TP 1 is
our DEP; TP with moe_ep_size > 1 is TP attention with expert-parallel MoE. Some rows record
tp_size as the product TP x EP (their ids say "tp8_ep8" where tp_size is 64): those are read as
TP = moe_tp_size; attention-DP rows that record attention_dp_size as that product (64 where
moe_tp_size and moe_ep_size are 8) are read as DEP over moe_tp_size GPUs. P/D rows without
worker counts are not covered: their layout is unknown.

Each row is one measured deployment (aggregated or P/D, any backend) at a fixed concurrency and
ISL/OSL with its measured TTFT and TPOT. We rebuild its layout as a Deployment, replay the
benchmark as its client ran it (InferenceX's `benchmark_serving.py`: all clients start at once,
ten requests each, lengths drawn from [0.8 L, L]), simulate, and compare means. Rows we cannot
describe honestly are reported as not covered, with the reason.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from simulator.calibration.serving import ServingOverhead, fitted_overhead, used_by_fit
from simulator.specs.deployment import All2AllBackend, Deployment, RoleSpec
from simulator.specs.errors import SpecError
from simulator.specs.model import load_model
from simulator.specs.routing import RouterPolicy
from simulator.specs.workload import Workload
from simulator.workers import stop_pool, worker_pool

SYSTEMS = {"h100_sxm": "h100", "h200_sxm": "h200", "b200_sxm": "b200", "b300_sxm": "b300",
           "gb200": "gb200", "gb300": "gb300"}
"""aiconfigurator-core system -> our hardware preset."""
PRESETS = {"deepseek-ai/DeepSeek-R1": "deepseek-r1", "deepseek-ai/DeepSeek-V3": "deepseek-v3",
           "openai/gpt-oss-120b": "gpt-oss-120b", "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b"}
"""Measured model -> our preset; other models load the config.json shipped beside the data."""
CONFIG_ALIASES = {
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1",
    "zhipuai/GLM-5": "zai-org/GLM-5",
}
"""Measured model names whose config.json ships under another name (same architecture)."""
WEIGHTS = {"fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4", "int4_wo": "int4", "fp4": "fp4",
           "bf16": "bf16", "int4": "int4"}

EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")

Predictor = Callable[[Deployment, Workload], dict[str, Any]]


def silicon_path() -> Path:
    return Path(str(resources.files("aiconfigurator_core"))) / "systems" / "silicon_sample.csv"


def load_rows() -> pd.DataFrame:
    """The measured rows, with their concurrency, the day they were measured (empty where
    not recorded) and their InferenceX config id (NaN where none) parsed out of the source
    note."""
    df = pd.read_csv(silicon_path())
    note = df.silicon_data_source.astype(str)
    conc = note.str.extract(r"silicon_concurrency=(\d+)")[0].astype(float)
    df["concurrency"] = conc.fillna(df.batch_size)
    df["measured_day"] = note.str.extract(r"measured=(\d{4}-\d\d-\d\d)")[0].fillna("")
    df["config_id"] = note.str.extract(r"config_id=(\d+)")[0].astype(float)
    return df


def _config_path(model_path: str) -> Path:
    name = CONFIG_ALIASES.get(model_path, model_path)
    folder = Path(str(resources.files("aiconfigurator_core"))) / "model_configs"
    return folder / (name.replace("/", "--") + "_config.json")


def model_source(model_path: str) -> str:
    """Our preset for a measured model, else the config.json aiconfigurator-core ships for it."""
    name = CONFIG_ALIASES.get(model_path, model_path)
    if name in PRESETS:
        return PRESETS[name]
    path = _config_path(model_path)
    if not path.is_file():
        raise SpecError(f"no config.json for {model_path}")
    return str(path)


@dataclass(frozen=True)
class Case:
    """One measured row rebuilt as a deployment and a workload."""

    row: str
    deployment: Deployment
    workload: Workload
    ttft_ms: float
    tpot_ms: float


def _num(v: Any, default: float = 0.0) -> float:
    return default if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


WIDE_EP = {"prefill": "deepep_high_throughput", "decode": "deepep_low_latency",
           "aggregated": "deepep_low_latency"}
"""Token exchange of attention-DP layouts in SGLang and TensorRT-LLM (DeepEP-style all-to-all);
vLLM rows keep vLLM's own default."""


def _role(name: str, engine: str, tp: float, dp: float, moe_tp: float, moe_ep: float,
          instances: float, concurrency: float, isl: float, moe: bool,
          recv: int = 1, drafts: bool = False) -> RoleSpec:
    tp, dp = int(_num(tp, 1) or 1), int(_num(dp, 1) or 1)
    mtp, ep = int(_num(moe_tp, 1) or 1), int(_num(moe_ep, 1) or 1)
    if dp <= 1 and mtp > 1 and ep > 1 and tp == mtp * ep:
        # Rows written as tp_size = TP x EP (their ids read "tp8_ep8" where tp_size is 64):
        # the instance is TP=moe_tp GPUs with its experts spread over them.
        tp = mtp
    elif tp <= 1 and mtp > 1 and ep > 1 and dp == mtp * ep:
        # Attention-DP rows written the same way (attention_dp_size 64 = moe_tp 8 x moe_ep 8
        # for ids that read "tp8_ep8", on single 8-GPU nodes): DEP over moe_tp GPUs.
        dp = mtp
    if instances is None or (isinstance(instances, float) and math.isnan(instances)):
        raise SpecError(UNDESCRIBED)
    n = int(instances)
    ranks = dp if dp > 1 else tp
    seqs = max(1, math.ceil(concurrency / (n * ranks if dp > 1 else n)))
    draft = mtp_tokens(dp) if drafts else 0
    common: dict[str, Any] = {
        "instances": n, "max_num_seqs": seqs,
        "max_num_batched_tokens": batched_tokens(engine, name, concurrency, isl, draft),
        "speculative": {"method": "mtp", "tokens": draft, "acceptance": MTP_ACCEPTANCE}
        if draft else None}
    if dp > 1:  # attention DP, each DP rank a TP group when tp > 1 (no row reads so now)
        # `recv` is not applied: the recipes that set it run DP size 1 (`recv_interval`)
        a2a = WIDE_EP[name] if engine != "vllm" and moe else None
        # aggregated: one server, whose own DP balancer picks each request's rank
        router = ENGINE_DP_ROUTER if name == "aggregated" else None
        return RoleSpec(dep=dp, tp=tp if tp > 1 else None, all2all_backend=a2a,
                        attention_dp_balance=engine == "trtllm", router=router, **common)
    return RoleSpec(tp=tp, enable_expert_parallel=moe and ep > 1, recv_interval=recv, **common)


ENGINE_DP_ROUTER: RouterPolicy = "least_requests"
"""How an aggregated row's server spreads requests over its DP ranks: its own load balancer, not
a prefix-aware router (the rows' prompts are random and the client talks to one server). The
router picks the instance by fewest requests and the instance picks the rank as the engine's
balancer does (`AggregatedEngine._least_busy_rank`: vLLM's 4 x waiting + running, the
fewest requests for the others); prefix_aware, the aggregated default, would send every
prompt to a rank with no prompt queued, even one whose slots are all decoding, where it waits
for one of them to end."""

SGLANG_RECV_SYSTEMS = ("b200_sxm", "b300_sxm")
"""Systems whose InferenceX aggregated SGLang recipes pass --scheduler-recv-interval."""

DSR1: tuple[str, ...] = ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3")
"""The file's rows named DeepSeek-V3 carry the DeepSeek-R1 recipes' ids (`dsr1_...`: the same
architecture and checkpoint size)."""
QWEN35: tuple[str, ...] = ("Qwen/Qwen3.5-397B-A17B",)
GLM5: tuple[str, ...] = ("zhipuai/GLM-5",)
GPT_OSS: tuple[str, ...] = ("openai/gpt-oss-120b",)

SGLANG_RECV_MODELS = DSR1 + QWEN35
"""Models whose recipes there do: DeepSeek-R1's (and the file's `dsr1_` rows named DeepSeek-V3)
and Qwen3.5's; GLM-5's (`glm5_fp8_b200.sh`, `glm5_fp8_b300.sh`) never did."""


def recv_interval(engine: str, system: str, role: str, concurrency: float,
                  model: str) -> int:
    """SGLang's --scheduler-recv-interval as InferenceX's aggregated recipes on B200 and B300 set
    it (`benchmarks/dsr1_fp4_b200.sh`, `dsr1_fp8_b200.sh`, Qwen3.5's B200 recipe: 10 below 16
    users, 30 from 16 on, their DP size 1); its Hopper recipes (`dsr1_fp8_h200.sh`) and GLM-5's
    leave it at 1, and so does every other engine and role."""
    if (engine == "sglang" and role == "aggregated" and system in SGLANG_RECV_SYSTEMS
            and model in SGLANG_RECV_MODELS):
        return 10 if concurrency < 16 else 30
    return 1


class Recipe(NamedTuple):
    """What one InferenceX recipe sets beyond the row's columns (None: the general rule)."""

    memory_fraction: float | None = None
    """A role's gpu_memory_utilization: SGLang's --mem-fraction-static, TensorRT-LLM's
    kv_cache_config free_gpu_memory_fraction."""
    recv_interval: int | None = None
    """SGLang's --scheduler-recv-interval at every concurrency."""
    batched_tokens: int | None = None
    """Prompt tokens a step computes at most (max_num_batched_tokens): SGLang's
    --chunked-prefill-size, TensorRT-LLM's --max_num_tokens."""


RecipeKey = tuple[str, str, str, str, int | None]
"""(backend, model, precision, system, TP of the instance or None for any)."""

RECIPE_SOURCES: tuple[tuple[str, tuple[str, ...], str, str, int | None, Recipe], ...] = (
    # benchmarks/dsr1_fp8_b200.sh: TP4 (8K/1K only) fits 32 users' 9K-token contexts beside 168
    # GB of weights a GPU at 0.95 with a receive interval of 10 at every concurrency; TP8 0.82
    ("sglang", DSR1, "fp8", "b200_sxm", 4, Recipe(0.95, 10, 8192)),
    ("sglang", DSR1, "fp8", "b200_sxm", 8, Recipe(0.82, None, 32768)),
    ("sglang", DSR1, "fp4", "b200_sxm", None, Recipe(0.85, None, 16384)),  # dsr1_fp4_b200.sh
    ("sglang", DSR1, "fp8", "h200_sxm", None, Recipe(0.82, None, 32768)),  # dsr1_fp8_h200.sh
    ("sglang", QWEN35, "fp8", "b200_sxm", None, Recipe(0.82, None, 32768)),  # qwen3.5_fp8_b200
    ("sglang", QWEN35, "bf16", "b200_sxm", None, Recipe(0.82, None, 32768)),  # qwen3.5_bf16_b200
    ("sglang", QWEN35, "fp8", "h200_sxm", None, Recipe(0.8, None, 16384)),  # qwen3.5_fp8_h200
    ("sglang", GLM5, "fp8", "b200_sxm", None, Recipe(0.85, None, 32768)),  # glm5_fp8_b200.sh
    ("sglang", GLM5, "fp8", "h200_sxm", None, Recipe(0.85)),  # glm5_fp8_h200.sh
    # TensorRT-LLM: dsr1_fp{4,8}_b200_trt{,_mtp}.sh keep 0.8 of the free memory for KV (fp8 8K/1K
    # on TP4 0.75 and the fp8 MTP recipe 0.7 in some runs: not told apart), dsr1_fp8_h200_trt.sh
    # 0.75; gptoss_fp4_{b200,h200}_trt.sh 0.85 with --max_num_tokens 20000
    ("trtllm", DSR1, "fp4", "b200_sxm", None, Recipe(0.8)),
    ("trtllm", DSR1, "fp8", "b200_sxm", None, Recipe(0.8)),
    ("trtllm", DSR1, "fp8", "h200_sxm", None, Recipe(0.75)),
    ("trtllm", GPT_OSS, "fp4", "b200_sxm", None, Recipe(0.85, None, 20000)),
    ("trtllm", GPT_OSS, "fp4", "h200_sxm", None, Recipe(0.85, None, 20000)),
)
RECIPES: dict[RecipeKey, Recipe] = {
    (backend, model, precision, system, tp): recipe
    for backend, models, precision, system, tp, recipe in RECIPE_SOURCES for model in models}
"""Aggregated rows without attention DP whose InferenceX recipe (`benchmarks/single_node/*.sh`
as they stood from February to April 2026, unchanged over the rows' dates) sets the memory
fraction, the receive interval or the tokens a step computes apart from the general rules; a
key of the instance's TP wins over one for any TP (`recipe_of`). Every other row keeps the
default memory fraction 0.9, `recv_interval` and `batched_tokens`. B300, fp4 Qwen3.5 and GLM-5
recipes came after the rows that measured them: not read. Nor is SGLang's
`--max-running-requests` (128 for Qwen3.5 and DeepSeek-R1 fp8 on B200): the rows at 256 and 512
users measured a 2.1-3.1 s TTFT and a TPOT that grows past the 128-user one, where 128 slots
would have queued half the users for a whole request."""


def recipe_of(backend: str, model: str, precision: str, system: str, tp: int) -> Recipe | None:
    """The recipe of an aggregated row's instance (RECIPES), its own TP's first."""
    got = RECIPES.get((backend, model, precision, system, tp))
    return got if got is not None else RECIPES.get((backend, model, precision, system, None))


PROMPT_SIZED_BATCHES: dict[tuple[str, str, str], tuple[str, ...]] = {
    ("vllm", "MiniMaxAI/MiniMax-M2.5", "b200_sxm"): ("0.17.0",),
    ("vllm", "MiniMaxAI/MiniMax-M2.5", "b300_sxm"): ("0.17.0",),
}
"""Aggregated rows whose recipe passes --max-num-batched-tokens of twice the prompt length:
(backend, model, system) -> the backend versions measured before it did. MiniMax-M2.5's vLLM
B200 recipe (`benchmarks/single_node/minimaxm2.5_fp8_b200.sh`) set it on 2026-04-03 with its
move from vLLM 0.17.0 to 0.19.0; its fp4 (2026-04-08) and B300 recipes (2026-04-17) set it from
their start. Every other row takes `batched_tokens`."""


def _recipe(row: pd.Series, role: RoleSpec) -> RoleSpec:
    """`role` with what the row's recipe sets (RECIPES, PROMPT_SIZED_BATCHES) in place of the
    general rules."""
    before = PROMPT_SIZED_BATCHES.get((row.backend, row.model_path, row.system))
    if before is not None and str(row.backend_version) not in before:
        role = role.model_copy(update={"max_num_batched_tokens": int(2 * row.isl)})
    got = recipe_of(row.backend, row.model_path, str(row.precision), row.system,
                    role.tp or 1) if role.dep is None else None
    if got is None:
        return role
    update: dict[str, Any] = {}
    if got.memory_fraction is not None:
        update["gpu_memory_utilization"] = got.memory_fraction
    if got.recv_interval is not None:
        update["recv_interval"] = got.recv_interval
    if got.batched_tokens is not None:
        update["max_num_batched_tokens"] = got.batched_tokens
    return role.model_copy(update=update)


def batched_tokens(engine: str, role: str, concurrency: float, isl: float,
                   draft: int = 0) -> int:
    """Tokens per step and rank: InferenceX's aggregated TensorRT-LLM recipes pass
    --max_num_tokens = concurrency x (1 + draft tokens) + ISL + 64 rounded up to 64, at least
    8,192, so that a prompt is never chunked; elsewhere max(8192, ISL)."""
    if engine == "trtllm" and role == "aggregated":
        return max(8192, math.ceil((concurrency * (1 + draft) + isl + 64) / 64) * 64)
    return int(max(8192, isl))


MTP_RUNS = (
    ("trtllm", "1.2.0rc6.post3", ""),
    ("trtllm", "1.1.0rc2.post2", "2026-01-14"),
)
"""Rows measured with MTP speculative decoding, though no column says so: (backend, its
version, the day measured or "" for any day). InferenceX's configuration
(.github/configs/nvidia-master.yaml) ran TensorRT-LLM 1.2.0rc6.post3 only in its DeepSeek-R1 MTP
configurations (dsr1-fp8-b200-trt-mtp from 2026-02-05, dsr1-fp4-b200-trt-mtp from 2026-02-06),
while the same configurations without MTP ran 1.2.0rc6.post2; and on 2026-01-14 it ran the sweep
of the change that added those MTP configurations (#392, merged 2026-01-15) on 1.1.0rc2.post2,
the image of every DeepSeek-R1 TensorRT-LLM run then. Every row of those runs that repeats a
configuration measured without MTP has 0.43-0.87 of its TPOT; no other run does (below 0.9 on
average, checked over every backend, model and day in the file)."""

MTP_ACCEPTANCE = 0.72
"""Probability that a draft token is accepted, fitted on the fitting half of the MTP rows
(`benchmarks/fit_mtp_acceptance.py`: the candidate whose median TPOT error there is nearest
zero; 0.70 / 0.72 / 0.75 / 0.85 give +3.0 / +0.7 / -2.8 / -16.0 %). The rows do not record it.
The DeepSeek-V3 technical report (section 5.4.3) measures 85-90 % for the first token its MTP
module drafts, on real text; these runs chain the one MTP layer up to three times on the
benchmark's random-token prompts, so each later draft is accepted less often."""


def mtp_tokens(dp: int) -> int:
    """Draft tokens of InferenceX's DeepSeek-R1 TensorRT-LLM MTP recipes
    (`benchmarks/dsr1_fp8_b200_trt_mtp.sh` and its FP4 and H200 siblings): 3, or 1 with
    attention DP."""
    return 1 if dp > 1 else 3


def measured_with_mtp(row: pd.Series, mtp_layers: int) -> bool:
    """Whether a row's run decoded speculatively with the model's MTP layers (`MTP_RUNS`)."""
    if mtp_layers == 0:
        return False
    return any(row.backend == backend and str(row.backend_version) == version
               and (not when or row.measured_day == when) for backend, version, when in MTP_RUNS)


KV_AUTO_BF16: dict[tuple[str, str, str, str], tuple[str, ...] | None] = {
    ("vllm", "openai/gpt-oss-120b", "fp4", "h100_sxm"): None,
    ("vllm", "openai/gpt-oss-120b", "fp4", "h200_sxm"): None,
    ("vllm", "MiniMaxAI/MiniMax-M2.5", "fp8", "h100_sxm"): None,
    ("vllm", "MiniMaxAI/MiniMax-M2.5", "fp8", "h200_sxm"): None,
    ("vllm", "MiniMaxAI/MiniMax-M2.5", "fp8", "b200_sxm"): ("0.17.0",),
    ("vllm", "moonshotai/Kimi-K2.5", "int4", "b200_sxm"): None,
    ("vllm", "moonshotai/Kimi-K2.5", "int4", "h200_sxm"): None,
    ("sglang", "deepseek-ai/DeepSeek-R1", "fp8", "h200_sxm"): None,
    ("sglang", "deepseek-ai/DeepSeek-V3", "fp8", "h200_sxm"): None,
    ("sglang", "zhipuai/GLM-5", "fp8", "h200_sxm"): None,
    ("trtllm", "openai/gpt-oss-120b", "fp4", "h200_sxm"): None,
}
"""Aggregated rows whose single-node InferenceX recipe leaves the KV cache's dtype to the engine
(vLLM's and SGLang's `auto`, TensorRT-LLM's `dtype: auto`) on a checkpoint that carries no KV
quantization, so the cache is bf16 (SGLang's `auto` is bf16 for GLM-5's sparse attention on
Hopper, fp8 from Blackwell on): (backend, model, precision, system) -> the backend versions it
applies to (None: all). Read from the recipes in effect when the rows were measured (2026-03 to
2026-04: `benchmarks/single_node/gptoss_fp4_h100.sh`, `minimaxm2.5_fp8_h200.sh`,
`dsr1_fp8_h200.sh`, `glm5_fp8_h200.sh`, `gptoss_fp4_h200_trt.sh`, ...); MiniMax-M2.5's B200 fp8
recipe passed `--kv-cache-dtype fp8` from its move to vLLM 0.19.0 on, not on 0.17.0. Every other
quantized row's recipe sets an fp8 cache (or its recipe is not known: the general rule, fp8)."""


def kv_cache_dtype(row: pd.Series, weights: str) -> str:
    """The KV cache's dtype a row ran with: bf16 with bf16 weights or where its recipe leaves
    it to the engine on a checkpoint without KV quantization (KV_AUTO_BF16; P/D rows' multi-node
    recipes are not read), else fp8."""
    if weights == "bf16":
        return "bf16"
    key = (str(row.backend), str(row.model_path), str(row.precision), str(row.system))
    if row["mode"] == "agg" and key in KV_AUTO_BF16:
        versions = KV_AUTO_BF16[key]
        if versions is None or str(row.backend_version) in versions:
            return "bf16"
    return "fp8"


class PdRecipe(NamedTuple):
    """What a P/D run's recipe set for one role beyond, or against, the row's columns."""

    attention_dp: bool = False
    """The role ran attention DP over its GPUs (DEP) where the row records one TP group."""
    batched_tokens: int | None = None
    """Prompt tokens a step computes at most, per rank (--max-num-batched-tokens)."""
    max_num_seqs: int | None = None
    """Requests a rank runs at once (--max-num-seqs), where it binds below the row's load."""
    all2all: All2AllBackend | None = None
    """The DP ranks' MoE token exchange (--all2all-backend)."""


DUMP = "db-dump/2026-04-27"
NVLINK: All2AllBackend = "flashinfer_nvlink_one_sided"
PD_RECIPES: dict[tuple[str, int, int, str], PdRecipe] = {
    # 1P1D DEP4 + DEP16, 1K/1K (`recipes/vllm/kimi-k2.5/1k1k/disagg-gb200-1p1d-dep4-dep16.yaml`)
    (DUMP, 697, 1024, "prefill"): PdRecipe(True, 16384, all2all=NVLINK),
    (DUMP, 697, 1024, "decode"): PdRecipe(True, all2all=NVLINK),
    # 1P4D DEP4 + TEP4 (`.../1k1k/disagg-gb200-1p4d-dep4-tep4.yaml` and its 8k1k sibling, whose
    # decode workers run 16 requests at most)
    (DUMP, 698, 1024, "prefill"): PdRecipe(True, 16384, all2all=NVLINK),
    (DUMP, 698, 8192, "prefill"): PdRecipe(True, 16384, all2all=NVLINK),
    (DUMP, 698, 8192, "decode"): PdRecipe(max_num_seqs=16),
    # TensorRT-LLM's DeepSeek-R1 fp4 runs on GB200 of 2025-12-19: context servers of 4 prompts
    # and 4,608 tokens at 1K/1K, 1 prompt and 8,448 tokens at 8K/1K
    (DUMP, 237, 1024, "prefill"): PdRecipe(batched_tokens=4608, max_num_seqs=4),
    (DUMP, 229, 8192, "prefill"): PdRecipe(batched_tokens=8448, max_num_seqs=1),
    (DUMP, 250, 8192, "prefill"): PdRecipe(batched_tokens=8448, max_num_seqs=1),
}
"""P/D runs whose recipe the row's columns do not tell: (database dump, InferenceX config id,
ISL, role) -> what its recipe set. vLLM's Kimi-K2.5 P/D rows on GB200 (measured 2026-04-07,
InferenceX #1008: `kimik2.5-fp4-gb200-dynamo-vllm` in .github/configs/nvidia-master.yaml, the
recipes of NVIDIA/srt-slurm's branch sa-submission-q2-2026) record every role as tp_size 4 or
16 with attention_dp_size 1, while the configuration sets `dp-attn: true` on every prefill and
on the 1P1D run's decode, and the recipes run them as `--tensor-parallel-size 1
--data-parallel-size N --enable-expert-parallel` with 16,384 prompt tokens a rank (no chunked
prefill) and every DEP role exchanging tokens over the NVLink one-sided kernels
(`--all2all-backend flashinfer_nvlink_one_sided`); the 1P4D run's decode is TP4 with experts
spread (TEP4), as recorded. TensorRT-LLM's DeepSeek-R1 fp4 P/D runs on GB200 of 2025-12-19
(`dsr1-fp4-gb200-dynamo-trt` in the same file as it stood then) pass every context server
PREFILL_MAX_BATCH_SIZE and PREFILL_MAX_NUM_TOKENS: 4 and 4,608 at 1K/1K, 1 and 8,448 at 8K/1K,
where the general rule would batch the row's users up to 8,192 tokens."""


def pd_recipe(row: pd.Series, role: str) -> PdRecipe | None:
    """The recipe of a P/D row's role where PD_RECIPES knows its run."""
    note = str(row.silicon_data_source)
    config = _num(row.get("config_id"), -1)
    return PD_RECIPES.get((note.split(";")[0], int(config), int(row.isl), role))


VLLM_TP_ONLY_RUNS: tuple[tuple[str, str], ...] = (
    ("moonshotai/Kimi-K2.5", "2026-04-20"),
)
"""vLLM aggregated runs that passed `--tensor-parallel-size` alone, whatever their columns say:
(model, last day measured). InferenceX's Kimi-K2.5 scripts on vLLM
(benchmarks/single_node/kimik2.5_fp4_b200.sh, and the B300 one added 2026-04-17) passed no
expert- or data-parallel flag through 2026-04-20, so the configuration's `{tp: 4, ep: 4}`
ran as TP4 with every expert split over the four GPUs. The file records those runs as tp_size 4
with moe_ep_size 4, and again (the same measurements, digit for digit: ids "..._tp4_ep4")
as attention_dp_size 4 with moe_ep_size 16. Rows without a measured day belong to them."""

VLLM_DP_RUNS: frozenset[tuple[str, str, int, int, str]] = frozenset({
    ("MiniMaxAI/MiniMax-M2.5", "b200_sxm", 1024, 256, "2026-04-22"),
    ("MiniMaxAI/MiniMax-M2.5", "b200_sxm", 1024, 512, "2026-04-22"),
    ("MiniMaxAI/MiniMax-M2.5", "b200_sxm", 1024, 1024, "2026-04-22"),
    ("MiniMaxAI/MiniMax-M2.5", "b300_sxm", 1024, 256, "2026-04-21"),
    ("MiniMaxAI/MiniMax-M2.5", "b300_sxm", 1024, 512, "2026-04-21"),
    ("MiniMaxAI/MiniMax-M2.5", "b300_sxm", 1024, 1024, "2026-04-21"),
    ("MiniMaxAI/MiniMax-M2.5", "b300_sxm", 1024, 2048, "2026-04-21"),
    ("MiniMaxAI/MiniMax-M2.5", "b300_sxm", 8192, 512, "2026-04-21"),
})
"""The vLLM aggregated runs that ran attention DP: (model, system, ISL, concurrency, day
measured). vLLM rows recording tp_size = attention_dp_size = N with moe_ep_size = N x N are
otherwise TP N with expert parallelism: InferenceX's MiniMax-M2.5 fp8 scripts (B200, B300,
H100) pass `--tensor-parallel-size N --enable-expert-parallel` and read no DP setting, and its
nvfp4 scripts run `--tensor-parallel-size 1 --data-parallel-size N --enable-expert-parallel`
only where the configuration of the day sets `dp-attn: true` (.github/configs/nvidia-master.yaml:
`minimaxm2.5-fp4-b200-vllm` and `-b300-vllm`, TP2 x EP2 at 1K/1K from 256 users on 2026-04-21
and -22, and at 8K/1K 512 users on -21). The other 89 rows of that shape are TP runs."""


def _vllm_agg_parallel(row: pd.Series, tp: Any, dp: Any, ep: Any) -> tuple[Any, Any, Any]:
    """(tp, attention DP, EP) an aggregated vLLM row's recipe ran, from its columns read
    through VLLM_TP_ONLY_RUNS and VLLM_DP_RUNS. Rows written tp_size = attention_dp_size = N,
    moe_ep_size = N x N (ids that read "tpN_epN") ran on N GPUs: DEP N where VLLM_DP_RUNS lists
    them (`--tensor-parallel-size 1 --data-parallel-size N --enable-expert-parallel`), TP N
    with expert parallelism otherwise; never N DP ranks of TP N."""
    day = str(row.get("measured_day", "") or "")
    if any(row.model_path == model and day <= last for model, last in VLLM_TP_ONLY_RUNS):
        return tp, 1, 1
    n = int(_num(tp, 1) or 1)
    if not (n > 1 and _num(dp, 1) == n and _num(ep, 1) == n * n):
        return tp, dp, ep
    run = (row.model_path, row.system, int(row.isl), int(_num(row.concurrency)), day)
    return (1, n, ep) if run in VLLM_DP_RUNS else (tp, 1, n)


def _row_role(row: pd.Series, prefix: str, name: str, instances: float, concurrency: float,
              moe: bool, drafts: bool = False) -> RoleSpec:
    """One role's layout from its columns (`prefix` is "", "prefill_" or "decode_")."""
    tp, dp = row[f"{prefix}tp_size"], row[f"{prefix}attention_dp_size"]
    ep = row[f"{prefix}moe_ep_size"]
    pd_run = pd_recipe(row, name) if name != "aggregated" else None
    if pd_run is not None and pd_run.attention_dp and _num(dp, 1) <= 1:
        tp, dp = 1, tp
    if name == "aggregated" and row.backend == "vllm":
        tp, dp, ep = _vllm_agg_parallel(row, tp, dp, ep)
    role = _role(name, row.backend, tp, dp, row[f"{prefix}moe_tp_size"],
                 ep, instances, concurrency, float(row.isl), moe,
                 recv_interval(row.backend, row.system, name, concurrency, row.model_path),
                 drafts)
    if pd_run is not None:
        update: dict[str, Any] = {}
        if pd_run.batched_tokens is not None:
            update["max_num_batched_tokens"] = pd_run.batched_tokens
        if pd_run.max_num_seqs is not None:
            update["max_num_seqs"] = min(role.max_num_seqs, pd_run.max_num_seqs)
        if pd_run.all2all is not None:
            update["all2all_backend"] = pd_run.all2all
        role = role.model_copy(update=update)
    return _recipe(row, role) if name == "aggregated" else role


CAPPED_RUNS: tuple[tuple[str, str, str, float, tuple[str, ...]], ...] = (
    ("vllm", "openai/gpt-oss-120b", "h100_sxm", 512.0, ("2025-12-05", "2025-12-08")),
)
"""Runs that kept far fewer requests in flight than their clients and recipe allowed, for a
reason outside the deployment they record: (backend, model, system, concurrency, days
measured). The nine gpt-oss-120b rows vLLM measured on H100 at 512 users on 2025-12-05 and -08
(TP 2, 4 and 8; 1K/1K, 1K/8K and 8K/1K; InferenceX's recipe of those days passes
--max-num-seqs 512) each held 88-98 requests in flight by Little's law on their own TTFT and
TPOT (concurrency / (1 + TTFT / (0.9 x OSL x TPOT)), `benchmarks/silicon_in_flight.py`), the
same whatever their TP (4x the KV memory from TP2 to TP8) and lengths (9x the KV per request),
so neither KV memory nor compute set it. Their TPOT (3.6-27 ms) is that of ~100 requests, and
their TTFT (20-462 s) a queue in front of them. Of the 613 other aggregated rows at 128 users or
more, one holds a smaller share of its users in flight (DeepSeek-R1 on 72 GB200, not covered);
the next, 37-40 %, are rows with full KV memory whose predicted share is the same within 3
points. These rows are counted apart, like P/D rows without worker counts (CAPPED)."""

CAPPED = "the run held ~100 of its 512 users' requests in flight whatever its layout"
"""Why a row of CAPPED_RUNS is not predicted: the deployment it records did not set its load."""


PD_AS_AGG_RUNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gb200", ("2025-11-16", "2025-11-17")),
)
"""Aggregated rows that were multi-node P/D deployments: (system, days measured). The 55 GB200
rows of 2025-11-16 and -17 (DeepSeek-R1 on TensorRT-LLM and SGLang, 3 to 8,192 users) record
mode agg with tp_size 12 to 72 and no worker counts; InferenceX ran GB200 then only through its
multi-node launcher (`runners/launch_gb200-nv.sh` of 2025-11-17: Dynamo's `submit_disagg.sh`
with context and generation workers), so tp_size is the deployment's GPU count, not a TP
group. Their layout is unknown, like P/D rows without worker counts (PD_AS_AGG)."""

PD_AS_AGG = "a multi-node P/D deployment recorded as one aggregated TP group"
"""Why a row of PD_AS_AGG_RUNS is not predicted: its layout is unknown."""


def pd_as_agg(row: pd.Series) -> bool:
    """Whether a row belongs to a run of PD_AS_AGG_RUNS."""
    return row["mode"] == "agg" and any(
        row.system == system and row.measured_day in days for system, days in PD_AS_AGG_RUNS)


def capped_run(row: pd.Series) -> bool:
    """Whether a row belongs to a run of CAPPED_RUNS."""
    return any(row.backend == backend and row.model_path == model and row.system == system
               and _num(row.concurrency) == conc and row.measured_day in days
               for backend, model, system, conc, days in CAPPED_RUNS)


def agg_workers(row: pd.Series) -> int:
    """Aggregated workers a row ran: the file records an aggregated row's batch size per DP
    rank (2,780 of the 2,784 aggregated rows that record their attention DP size run
    concurrency = batch_size x attention_dp_size), so a concurrency that is a whole multiple
    k >= 2 of that product is k workers sharing the users. Three rows read so, k = 32:
    Qwen3-32B-NVFP4 on TensorRT-LLM under Dynamo (B200 and GB200, TP2, 13-14 users a worker
    of 416-448), the run whose P/D rows used 64 GPUs (40 prefill workers of one GPU, 6 decode
    workers of four): 32 workers of TP2 are 64 GPUs too. One worker where the attention DP
    size or the batch size is not recorded."""
    conc, batch = _num(row.concurrency), _num(row.batch_size)
    dp = _num(row.attention_dp_size)
    if batch < 1 or dp < 1:
        return 1
    k = conc / (batch * dp)
    return int(k) if k >= 2 and k == int(k) else 1


def case_from_row(row: pd.Series) -> Case:
    """The deployment and workload of one measured row; SpecError says why it is not covered."""
    if capped_run(row):
        raise SpecError(CAPPED)
    if pd_as_agg(row):
        raise SpecError(PD_AS_AGG)
    if row.system not in SYSTEMS:
        raise SpecError(f"system {row.system} has no hardware preset")
    conc = _num(row.concurrency)
    if conc < 1:
        raise SpecError("concurrency not recorded")
    model_ref = model_source(row.model_path)
    try:
        model = load_model(model_ref)
    except SpecError as e:  # name the measured model, not the config file's location
        raise SpecError(f"{row.model_path}: {str(e).removeprefix(model_ref + ': ')}") from None
    quant = [str(q) for q in (row.moe_quant_mode if model.is_moe else None,
                              row.gemm_quant_mode, row.precision) if isinstance(q, str)]
    weights = next((WEIGHTS[q] for q in quant if q in WEIGHTS), "bf16" if not quant else None)
    if weights is None:
        raise SpecError(f"precision {quant[0]} not modelled")
    precision = {"weights": weights, "kv_cache": kv_cache_dtype(row, weights)}
    isl, osl = int(row.isl), int(row.osl)
    base: dict[str, Any] = {"model": model_ref, "hardware": SYSTEMS[row.system],
                            "engine": row.backend, "precision": precision}
    if row["mode"] == "agg":
        base["aggregated"] = _row_role(row, "", "aggregated", agg_workers(row), conc,
                                       model.is_moe, measured_with_mtp(row, model.mtp_layers))
    else:
        base["prefill"] = _row_role(row, "prefill_", "prefill", row.prefill_num_workers, conc,
                                    model.is_moe)
        base["decode"] = _row_role(row, "decode_", "decode", row.decode_num_workers, conc,
                                   model.is_moe)
    deployment = Deployment(**base)
    workload = Workload.model_validate({
        "arrival": {"kind": "closed", "concurrency": int(conc), "start": CLIENT_START},
        "requests": int(conc) * WAVES, "input_tokens": client_lengths(isl),
        "output_tokens": client_lengths(osl), "seed": 0})
    return Case(str(row.id), deployment, workload, float(row.silicon_ttft_ms),
                float(row.silicon_tpot_ms))


CLIENT_START = "burst"
"""How the replayed benchmark's clients begin: all at once, as InferenceX's client sends the
first `--max-concurrency` requests after its warm-up has drained. Later waves spread out on
their own as requests of different output lengths end (RANGE_RATIO). A spread start
under-predicted TTFT at every concurrency when lengths were fixed (docs/accuracy.md)."""

RANGE_RATIO = 0.8
"""The rows are InferenceX results (their `silicon_data_source` names its database dump, config
and workflow run). InferenceX's client, `benchmark_serving.py --dataset-name random
--random-range-ratio 0.8`, draws every prompt and output length uniformly from
[int(0.8 x L), L] (its workflow default); with `--ignore-eos` each request generates exactly its
drawn output length, so the clients' requests end at different times and later waves arrive
spread out instead of all at once."""


MEAN_OUTPUT = (1 + RANGE_RATIO) / 2
"""The mean drawn output length over the nominal one (uniform on [RANGE_RATIO x OSL, OSL])."""


def in_flight(concurrency: Any, osl: Any, ttft_ms: Any, tpot_ms: Any) -> Any:
    """Requests decoding at once in a closed loop of `concurrency` clients, by Little's law:
    each request waits TTFT, then decodes for about MEAN_OUTPUT x OSL x TPOT."""
    return concurrency / (1 + ttft_ms / (MEAN_OUTPUT * osl * tpot_ms))


def client_lengths(length: int) -> dict[str, Any]:
    """The length distribution the benchmark client draws for a nominal length."""
    return {"kind": "uniform", "low": max(1, int(length * RANGE_RATIO)), "high": length}


WAVES = 10
"""Requests per client in the replayed benchmark (InferenceX sends `--num-prompts` ten times
`--max-concurrency`)."""


def default_predictor(deployment: Deployment, workload: Workload) -> dict[str, Any]:
    """Simulate with the serving stack's fitted fixed latencies."""
    return simulate_with(deployment, workload, fitted_overhead(deployment))


def simulate_with(deployment: Deployment, workload: Workload,
                  overhead: ServingOverhead) -> dict[str, Any]:
    from simulator.des import SimOptions, simulate

    return simulate(deployment, workload, options=SimOptions.serving(overhead)).metrics()


def _mape(pred: pd.Series, meas: pd.Series) -> float | None:
    ok = pred.notna() & meas.notna() & (meas > 0)
    if not ok.any():
        return None
    return float((100 * (pred[ok] - meas[ok]).abs() / meas[ok]).mean())


def predict_row(row: pd.Series, predictor: Predictor = default_predictor) -> dict[str, Any]:
    """One row's record: what was measured, whether it is covered (or why not), the prediction."""
    rec: dict[str, Any] = {"id": row.id, "backend": row.backend, "system": row.system,
                           "mode": row["mode"], "model": row.model_path,
                           "isl": row.isl, "osl": row.osl, "concurrency": row.concurrency,
                           "ttft_ms": row.silicon_ttft_ms, "tpot_ms": row.silicon_tpot_ms,
                           "covered": False, "reason": "", "pred_ttft_ms": np.nan,
                           "pred_tpot_ms": np.nan}
    try:
        case = case_from_row(row)
        metrics = predictor(case.deployment, case.workload)
        rec["pred_ttft_ms"] = metrics["ttft_ms"]["mean"]
        rec["pred_tpot_ms"] = metrics["tpot_ms"]["mean"]
        rec["covered"] = True
    except SpecError as e:
        rec["reason"] = str(e)
    return rec


RECORD_COLUMNS = ("id", "backend", "system", "mode", "model", "isl", "osl", "concurrency",
                  "ttft_ms", "tpot_ms", "covered", "reason", "pred_ttft_ms", "pred_tpot_ms")
"""The columns of one row's record, in the order the journal writes them."""


def read_journal(path: Path) -> list[dict[str, Any]]:
    """The records a killed or finished run wrote to its journal (none when it is absent)."""
    if not path.is_file() or path.stat().st_size == 0:
        return []
    try:
        df = pd.read_csv(path, keep_default_na=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise SpecError(f"{path}: not a validate journal ({e}); remove it to start over") \
            from None
    if tuple(df.columns) != RECORD_COLUMNS:
        raise SpecError(f"{path}: its columns are not a validate journal's; remove it to start "
                        "over")
    df["reason"] = df["reason"].astype(object).where(df["reason"].notna(), "")
    df["covered"] = df["covered"].astype(bool)
    return list(df.to_dict(orient="records"))


def validate(rows: pd.DataFrame, predictor: Predictor = default_predictor,
             progress: Callable[[int, int], None] | None = None,
             workers: int = 1, journal: Path | None = None) -> pd.DataFrame:
    """Predict every row; the frame gains covered, reason, pred_ttft_ms, pred_tpot_ms, moe.

    `workers` > 1 spreads rows over processes (the default predictor only). `journal`: a CSV
    each finished row is appended to at once, so that a killed run keeps its work; rows it
    already holds are not predicted again."""
    done = [r for r in read_journal(journal) if r["id"] in set(rows.id)] if journal else []
    seen = {r["id"] for r in done}
    items = [row for _, row in rows.iterrows() if row.id not in seen]
    out: list[dict[str, Any]] = list(done)
    total = len(done) + len(items)
    sink = None
    if journal is not None:
        fresh = not journal.is_file() or journal.stat().st_size == 0
        sink = journal.open("a", newline="")
        writer = csv.DictWriter(sink, fieldnames=RECORD_COLUMNS, extrasaction="ignore")
        if fresh:
            writer.writeheader()

    def keep(rec: dict[str, Any]) -> None:
        out.append(rec)
        if sink is not None:
            writer.writerow(rec)
            sink.flush()
        if progress:
            progress(len(out), total)

    try:
        if progress and done:
            progress(len(out), total)
        if workers > 1:  # processes that die with this one and leave ^C to it
            pool, finished = worker_pool(workers), False
            try:
                for rec in pool.map(predict_row, items, chunksize=4):
                    keep(rec)
                finished = True
            finally:
                stop_pool(pool, kill=not finished)
        else:
            for row in items:
                keep(predict_row(row, predictor))
    finally:
        if sink is not None:
            sink.close()
    df = pd.DataFrame(out, columns=list(RECORD_COLUMNS))
    df["moe"] = df.model.map({m: is_moe_model(m) for m in df.model.unique()})
    df["fit_row"] = [used_by_fit(i, m, c)
                     for i, m, c in zip(df.id, df["mode"], df.concurrency, strict=True)]
    return df


def is_moe_model(model_path: str) -> bool:
    """Whether a measured model routes to experts, read from its config even when we cannot
    model its architecture."""
    try:
        return load_model(model_source(model_path)).is_moe
    except SpecError:
        pass
    path = _config_path(model_path)
    if not path.is_file():
        return False
    cfg = json.loads(path.read_text())
    cfg = {**cfg, **cfg.get("text_config", {})}
    return any(int(cfg.get(k) or 0) > 0 for k in EXPERT_KEYS)


UNDESCRIBED = "P/D worker counts not recorded"
"""Why a P/D row that records no worker counts is not covered: its instance counts, and so its
layout, are unknown. Such rows are counted apart from the describable ones."""

APART = (UNDESCRIBED, PD_AS_AGG, CAPPED)
"""Reasons that count a row apart from the describable ones: what was measured is not the
deployment and load the row records, or that deployment is unknown."""


def summarize(df: pd.DataFrame, worst: int = 10) -> dict[str, Any]:
    """The JSON report: coverage and MAPE overall, for MoE rows (all, and the describable
    ones: every row but those counted apart, APART), per backend x system x
    mode."""
    cov = df[df.covered]

    def block(sub: pd.DataFrame) -> dict[str, Any]:
        c = sub[sub.covered]
        return {"rows": len(sub), "covered": len(c),
                "tpot_mape": _mape(c.pred_tpot_ms, c.tpot_ms),
                "ttft_mape": _mape(c.pred_ttft_ms, c.ttft_ms)}

    groups = [{"backend": b, "system": s, "mode": m, **block(g)}
              for (b, s, m), g in df.groupby(["backend", "system", "mode"], sort=True)]
    err = (cov.pred_tpot_ms - cov.tpot_ms).abs() / cov.tpot_ms
    worst_rows = cov.assign(tpot_err_pct=100 * err).sort_values(
        "tpot_err_pct", ascending=False).head(worst)
    reasons = df[~df.covered].reason.value_counts().head(10)
    overall = block(df)
    held = df[~df.fit_row]
    return {"rows": overall["rows"], "covered": overall["covered"],
            "overall": {"tpot_mape": overall["tpot_mape"], "ttft_mape": overall["ttft_mape"]},
            "moe": block(df[df.moe]),
            "moe_describable": block(df[df.moe & ~df.reason.isin(APART)]),
            "groups": groups,
            "held_out": {"all": block(held), "moe": block(held[held.moe])},
            "worst": worst_rows[["id", "pred_tpot_ms", "tpot_ms", "pred_ttft_ms", "ttft_ms",
                                 "tpot_err_pct"]].to_dict(orient="records"),
            "not_covered": {str(k): int(v) for k, v in reasons.items()}}
