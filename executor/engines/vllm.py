"""vLLM: the `vllm serve` flags of each role, its rules, and NIXL's environment.

P/D roles get NixlConnector with explicit producer (prefill) and consumer (decode) roles, and
each P/D process NIXL's side channel (its host, a port per instance). On the `cpu` hardware
(vLLM's CPU build serving the tiny-moe preset) a role gets what that build can run:
ExampleConnector (KV handed over through a shared folder) with the same producer/consumer roles,
`--enforce-eager` instead of a CUDA-graph compilation config, an explicit `--max-model-len`, a
fixed KV-cache size and block size instead of a memory share, and no NIXL environment; its P/D
roles also run without chunked prefill (see CPU_PD_NO_CHUNKING).
What a model family needs beyond that (DeepSeek-V4's block size, tokenizer mode, indexer cache
and MegaMoE backend; the vLLM name of each KV-cache precision) comes from the table in
executor/families.py, keyed by the model's architecture.
"""

from __future__ import annotations

from typing import ClassVar

from executor.engines.base import Engine
from executor.families import deployment_problems, family_for
from executor.records import Flag
from simulator.cost.memory import prefetch_plan
from simulator.specs.deployment import Deployment, RoleSpec, check_against_model
from simulator.specs.errors import SpecError
from simulator.specs.handoff import CPU_BLOCK_SIZE, CPU_HARDWARE, handoff_for
from simulator.specs.hardware import load_hardware
from simulator.specs.model import load_model

KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
CUDA_GRAPHS = {"prefill": "NONE", "decode": "FULL_DECODE_ONLY", "aggregated": "FULL_AND_PIECEWISE"}
"""Per-role CUDA-graph mode: prefill steps vary too much to capture; decode captures whole steps."""
NIXL_BASE_PORT = 5600
CPU_MAX_MODEL_LEN = 2048
"""--max-model-len on CPU (the tiny-moe preset's context); the GPU engine takes the model's own."""
CPU_KV_CACHE_BYTES = 512 * 2**20
"""KV-cache size per CPU instance (--kv-cache-memory-bytes). On CPU --gpu-memory-utilization
is a share of the whole machine's memory, which two instances on one machine cannot both take."""
CPU_PD_NO_CHUNKING: Flag = ("--no-enable-chunked-prefill", None)
"""Flag of each P/D role on CPU. ExampleConnector records a prompt's KV for saving at the
prompt's first engine step only, with the blocks allocated by then: a prompt split by chunked
prefill (several new prompts sharing one step's --max-num-batched-tokens) is saved short under
its whole prompt's name, and the decode instance that loads it dies on the shape mismatch
(vLLM issue 16928). Without chunked prefill a prompt runs in one step, so vLLM needs it to fit
one step: the role's --max-model-len is at most its --max-num-batched-tokens."""
CPU_KV_DIR = "kv"
"""ExampleConnector's shared folder on CPU; relative, so it lies in the processes' working
directory (the local backend runs them in the run directory)."""
HOST_TIER_CONNECTORS = {"native": "OffloadingConnector", "lmcache": "LMCacheConnectorV1"}
"""The connector vLLM runs for a prefix-cache host tier of each backend (what
--kv-offloading-backend picks, vllm/config/vllm.py), named here because a P/D role must list it
beside its handoff connector in a MultiConnector."""


def is_cpu(deployment: Deployment) -> bool:
    """Whether the deployment runs on vLLM's CPU build."""
    return deployment.hardware.lower() == CPU_HARDWARE


class VllmEngine(Engine):
    """`vllm serve`, one process per host of each instance."""

    name: ClassVar[str] = "vllm"
    launcher: ClassVar[tuple[str, ...]] = ("vllm", "serve")

    def check(self, deployment: Deployment) -> None:
        """vLLM's rules for the flags we render, as one clear SpecError each: the model's rules
        (the spec's: expert divisibility, MTP layers, TP and heads), the precisions vLLM has for
        the model's family on this hardware (executor/families.py), and the flags' own."""
        if deployment.single_role is not None:
            raise SpecError(f"the deployment has only {deployment.single_role} instances, an "
                            "isolated-role bench for `rackplan simulate`; to deploy it, give "
                            "prefill and decode (P/D) or aggregated")
        model = load_model(deployment.model)
        check_against_model(deployment, model)
        problems = deployment_problems(deployment, model.architecture)
        if problems:
            raise SpecError(problems[0])
        per_host = load_hardware(deployment.hardware).gpus_per_host
        for name, role in deployment.roles.items():
            if role.dep and role.tp and role.tp > 1 and role.ranks > per_host and (
                    per_host % role.tp):
                raise SpecError(f"{name}: tp={role.tp} must divide the {per_host} GPUs of a "
                                f"host for {role.layout} to span hosts")
            if role.all2all_backend is not None and not role.expert_parallel:
                raise SpecError(f"{name}: all2all_backend={role.all2all_backend!r} needs expert "
                                "parallelism; give dep or enable_expert_parallel")

    def role_flags(self, deployment: Deployment, role_name: str, role: RoleSpec, *,
                   kv_dir: str = CPU_KV_DIR,
                   max_model_len: int = CPU_MAX_MODEL_LEN) -> tuple[Flag, ...]:
        """Flags every host of an instance of this role gets (its tensor and data parallelism
        and its port are the record's own fields)."""
        cpu = is_cpu(deployment)
        architecture = load_model(deployment.model).architecture
        family = family_for(architecture)
        kv_dtype = family.kv_cache_dtype(deployment.precision.kv_cache)
        if kv_dtype is None:
            raise SpecError(deployment_problems(deployment, architecture)[0])
        block = family.block_sizes[0] if family.block_sizes else (CPU_BLOCK_SIZE if cpu else None)
        memory: Flag = (("--kv-cache-memory-bytes", CPU_KV_CACHE_BYTES) if cpu else
                        ("--gpu-memory-utilization", str(role.gpu_memory_utilization)))
        flags: list[Flag] = [("--max-num-seqs", role.max_num_seqs),
                             ("--max-num-batched-tokens", role.max_num_batched_tokens),
                             *([("--long-prefill-token-threshold",
                                 role.long_prefill_token_threshold)]
                               if role.long_prefill_token_threshold else []), memory,
                             *([("--block-size", block)] if block is not None else []),
                             ("--kv-cache-dtype", kv_dtype), *family.flags(deployment)]
        if role.expert_parallel:
            flags.append(("--enable-expert-parallel", None))
            if family.uses_mega_moe(deployment, role, architecture):  # dispatches and combines
                flags.append(("--moe-backend", str(family.mega_moe)))
            else:
                flags.append(("--all2all-backend", role.backend(role_name)))
        plan = prefetch_plan(load_model(deployment.model), role, deployment.precision.weights)
        if plan is not None:  # vllm/config/offload.py: one layer of each group, one ahead
            flags += [("--offload-backend", "prefetch"), ("--offload-group-size", plan.group),
                      ("--offload-num-in-group", 1), ("--offload-prefetch-step", 1)]
        elif role.cpu_offload_gb:  # vllm/config/offload.py: UVA offload, GiB per GPU
            flags.append(("--cpu-offload-gb", f"{role.cpu_offload_gb:g}"))
        if not role.prefix_caching:  # vllm/config/cache.py: enable_prefix_caching
            flags.append(("--no-enable-prefix-caching", None))
        if role.dbo:  # vllm/config/parallel.py: enable_dbo and its two thresholds
            flags += [("--enable-dbo", None),
                      ("--dbo-decode-token-threshold", role.dbo_decode_token_threshold),
                      ("--dbo-prefill-token-threshold", role.dbo_prefill_token_threshold)]
        if role.redundant_experts:
            flags += [("--enable-eplb", None),
                      ("--eplb-config", {"num_redundant_experts": role.redundant_experts})]
        if role.speculative is not None:
            flags.append(("--speculative-config",
                          {"method": family.speculative_method,
                           "num_speculative_tokens": role.speculative.tokens}))
        host_gib = role.host_cache_gb * (role.attention_tp if role.expert_parallel else
                                         (role.tp or 1))  # vLLM counts an engine's TP ranks
        if role_name in KV_ROLE:
            handoff = handoff_for(deployment.hardware)
            connector: dict[str, object] = {
                "kv_connector": handoff.connector, "kv_role": KV_ROLE[role_name],
                **({"kv_connector_extra_config": {"shared_storage_path": kv_dir}}
                   if handoff.shared_folder else {})}
            if role.host_cache_gb:  # the P/D handoff and the host tier side by side
                connector = {"kv_connector": "MultiConnector", "kv_role": KV_ROLE[role_name],
                             "kv_connector_extra_config": {"connectors": [
                                 connector, _host_tier(role.host_cache_backend, host_gib)]}}
            flags.append(("--kv-transfer-config", connector))
        elif role.host_cache_gb:  # vllm/config/cache.py: kv_offloading_size, GiB over TP ranks
            flags += [("--kv-offloading-size", f"{host_gib:g}"),
                      ("--kv-offloading-backend", role.host_cache_backend)]
        if cpu:
            pd = role_name in KV_ROLE
            context = min(max_model_len, role.max_num_batched_tokens) if pd else max_model_len
            flags += [("--enforce-eager", None), ("--max-model-len", context),
                      *([CPU_PD_NO_CHUNKING] if pd else [])]
        else:
            flags.append(("--compilation-config", {"cudagraph_mode": CUDA_GRAPHS[role_name]}))
        return tuple(flags)

    def env(self, deployment: Deployment, role_name: str, host: str,
            instance: int) -> dict[str, str]:
        """NIXL's side channel for a P/D process on a GPU: its own host and a port per
        instance."""
        if role_name not in KV_ROLE or is_cpu(deployment):
            return {}
        return {"VLLM_NIXL_SIDE_CHANNEL_HOST": host,
                "VLLM_NIXL_SIDE_CHANNEL_PORT": str(NIXL_BASE_PORT + instance)}


def _host_tier(backend: str, gib: float) -> dict[str, object]:
    """The host tier's connector entry: vLLM's offloading connector with its CPU bytes, or
    LMCache (which sizes its own store)."""
    entry: dict[str, object] = {"kv_connector": HOST_TIER_CONNECTORS[backend],
                                "kv_role": "kv_both"}
    if backend == "native":
        entry["kv_connector_extra_config"] = {"cpu_bytes_to_use": int(gib * 2 ** 30)}
    return entry
