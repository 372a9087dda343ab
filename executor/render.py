"""A deployment rendered as the exact `vllm serve` processes that run it.

One process per host of each instance. A DEP-N instance spans ceil(N / GPUs per host) hosts: the
first is the head (it serves the API and owns the data-parallel RPC port), the others run
`--headless` with their slice of data-parallel ranks. P/D roles get NixlConnector with explicit
producer (prefill) and consumer (decode) roles; the router (our P/D proxy) gets the URLs of both
and the plan's router policy of each role.

On the `cpu` hardware (vLLM's CPU build serving the tiny-moe preset) the same layout renders
with what that build can run: ExampleConnector (KV handed over through a shared folder) with
the same producer/consumer roles, `--enforce-eager` instead of a CUDA-graph compilation config,
an explicit `--max-model-len`, a fixed KV-cache size and block size instead of a memory share,
and no NIXL environment.
What a model family needs beyond that (DeepSeek-V4's block size, tokenizer mode, indexer cache
and MegaMoE backend; the vLLM name of each KV-cache precision) comes from the table in
executor/families.py, keyed by the model's architecture.
Rendering is pure: no process is started and nothing is written.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field

from executor.families import deployment_problems, family_for
from simulator.specs.deployment import Deployment, RoleSpec, check_against_model
from simulator.specs.errors import SpecError
from simulator.specs.hardware import load_hardware
from simulator.specs.model import load_model

KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
CUDA_GRAPHS = {"prefill": "NONE", "decode": "FULL_DECODE_ONLY", "aggregated": "FULL_AND_PIECEWISE"}
"""Per-role CUDA-graph mode: prefill steps vary too much to capture; decode captures whole steps."""
NIXL_BASE_PORT = 5600
CPU_HARDWARE = "cpu"
"""Hardware preset whose deployments run on vLLM's CPU build."""
CPU_MAX_MODEL_LEN = 2048
"""--max-model-len on CPU (the tiny-moe preset's context); the GPU engine takes the model's own."""
CPU_KV_CACHE_BYTES = 512 * 2**20
"""KV-cache size per CPU instance (--kv-cache-memory-bytes). On CPU --gpu-memory-utilization
is a share of the whole machine's memory, which two instances on one machine cannot both take."""
CPU_BLOCK_SIZE = 32
"""KV block size on CPU. ExampleConnector hands over whole blocks only: the CPU default of 128
would hand over nothing for prompts shorter than 130 tokens."""
CPU_KV_DIR = "kv"
"""ExampleConnector's shared folder on CPU; relative, so it lies in the processes' working
directory (the local backend runs them in the run directory)."""


@dataclass(frozen=True)
class Process:
    """One `vllm serve` process on one host."""

    instance: str
    """e.g. decode-0."""
    role: str
    host: int
    """Host index inside the instance (0 is the head)."""
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    port: int | None = None
    """HTTP port of the head; None for headless hosts."""

    def command_line(self) -> str:
        """The process as one shell line (environment first, arguments quoted)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + shlex.join(self.argv)


@dataclass(frozen=True)
class Rendered:
    """Every process of a deployment and the router in front of them."""

    processes: tuple[Process, ...]
    router: dict[str, object]
    """Proxy configuration: its port, the prefill and decode (or aggregated) URLs, and each
    role's router policy (`prefill_policy`, ...: the plan's, see simulator/specs/routing.py)."""

    @property
    def router_policies(self) -> dict[str, str]:
        """The router's `<role>_policy` entries, for backends that write the proxy's config."""
        return {k: str(v) for k, v in self.router.items() if k.endswith("_policy")}


def _compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def role_flags(deployment: Deployment, role_name: str, role: RoleSpec,
               kv_dir: str = CPU_KV_DIR, max_model_len: int = CPU_MAX_MODEL_LEN) -> list[str]:
    """Flags every host of an instance of this role gets (before its per-host DP flags).
    `kv_dir` and `max_model_len` only matter on the cpu hardware."""
    cpu = deployment.hardware.lower() == CPU_HARDWARE
    architecture = load_model(deployment.model).architecture
    family = family_for(architecture)
    kv_dtype = family.kv_cache_dtype(deployment.precision.kv_cache)
    if kv_dtype is None:
        raise SpecError(deployment_problems(deployment, architecture)[0])
    block = family.block_sizes[0] if family.block_sizes else (CPU_BLOCK_SIZE if cpu else None)
    memory = (["--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES)] if cpu else
              ["--gpu-memory-utilization", str(role.gpu_memory_utilization)])
    flags = ["--max-num-seqs", str(role.max_num_seqs),
             "--max-num-batched-tokens", str(role.max_num_batched_tokens), *memory,
             *(["--block-size", str(block)] if block is not None else []),
             "--kv-cache-dtype", kv_dtype, *family.flags(deployment)]
    if role.tp is not None and role.tp > 1:
        flags += ["--tensor-parallel-size", str(role.tp)]
    if role.expert_parallel:
        flags.append("--enable-expert-parallel")
        if family.uses_mega_moe(deployment, role, architecture):  # dispatches and combines itself
            flags += ["--moe-backend", str(family.mega_moe)]
        else:
            flags += ["--all2all-backend", role.backend(role_name)]
    if role.cpu_offload_gb:  # vllm/config/offload.py: UVA offload, GiB per GPU
        flags += ["--cpu-offload-gb", f"{role.cpu_offload_gb:g}"]
    if role.dbo:  # vllm/config/parallel.py: enable_dbo and its two thresholds
        flags += ["--enable-dbo",
                  "--dbo-decode-token-threshold", str(role.dbo_decode_token_threshold),
                  "--dbo-prefill-token-threshold", str(role.dbo_prefill_token_threshold)]
    if role.redundant_experts:
        flags += ["--enable-eplb", "--eplb-config",
                  _compact({"num_redundant_experts": role.redundant_experts})]
    if role.speculative is not None:
        flags += ["--speculative-config", _compact(
            {"method": family.speculative_method,
             "num_speculative_tokens": role.speculative.tokens})]
    host_gib = role.host_cache_gb * (role.attention_tp if role.expert_parallel else
                                     (role.tp or 1))  # vLLM counts an engine's TP ranks
    if role_name in KV_ROLE:
        connector: dict[str, object] = {"kv_connector": "NixlConnector",
                                        "kv_role": KV_ROLE[role_name]}
        if cpu:
            connector = {"kv_connector": "ExampleConnector", "kv_role": KV_ROLE[role_name],
                         "kv_connector_extra_config": {"shared_storage_path": kv_dir}}
        if role.host_cache_gb:  # the P/D handoff and the host tier side by side
            connector = {"kv_connector": "MultiConnector", "kv_role": KV_ROLE[role_name],
                         "kv_connector_extra_config": {"connectors": [
                             connector, _host_tier(role.host_cache_backend, host_gib)]}}
        flags += ["--kv-transfer-config", _compact(connector)]
    elif role.host_cache_gb:  # vllm/config/cache.py: kv_offloading_size, GiB over TP ranks
        flags += ["--kv-offloading-size", f"{host_gib:g}",
                  "--kv-offloading-backend", role.host_cache_backend]
    if cpu:
        flags += ["--enforce-eager", "--max-model-len", str(max_model_len)]
    else:
        flags += ["--compilation-config", _compact({"cudagraph_mode": CUDA_GRAPHS[role_name]})]
    return flags


HOST_TIER_CONNECTORS = {"native": "OffloadingConnector", "lmcache": "LMCacheConnectorV1"}
"""The connector vLLM runs for a prefix-cache host tier of each backend (what
--kv-offloading-backend picks, vllm/config/vllm.py), named here because a P/D role must list it
beside its handoff connector in a MultiConnector."""


def _host_tier(backend: str, gib: float) -> dict[str, object]:
    """The host tier's connector entry: vLLM's offloading connector with its CPU bytes, or
    LMCache (which sizes its own store)."""
    entry: dict[str, object] = {"kv_connector": HOST_TIER_CONNECTORS[backend],
                                "kv_role": "kv_both"}
    if backend == "native":
        entry["kv_connector_extra_config"] = {"cpu_bytes_to_use": int(gib * 2 ** 30)}
    return entry


def render(deployment: Deployment, model_path: str | None = None, base_port: int = 8100,
           rpc_base_port: int = 29550, hosts: list[str] | None = None,
           kv_dir: str = CPU_KV_DIR, max_model_len: int = CPU_MAX_MODEL_LEN) -> Rendered:
    """The processes of `deployment`. `model_path` is what vllm serves (default: the model
    field); `hosts` names the machines in placement order (default host0, host1, ...).
    On the cpu hardware, `kv_dir` is ExampleConnector's shared folder and `max_model_len` the
    engine's context limit."""
    check_rules(deployment)
    if max_model_len < 1:
        raise SpecError(f"max_model_len={max_model_len} must be >= 1")
    hw = load_hardware(deployment.hardware)
    cpu = hw.name == CPU_HARDWARE
    per_host = hw.gpus_per_host
    model = model_path or deployment.model
    procs: list[Process] = []
    next_host, port, rpc = 0, base_port, rpc_base_port
    urls: dict[str, list[str]] = {}
    for role_name, role in deployment.roles.items():
        flags = role_flags(deployment, role_name, role, kv_dir, max_model_len)
        n_hosts = math.ceil(role.ranks / per_host)
        for i in range(role.instances):
            name = f"{role_name}-{i}"
            head = _host(hosts, next_host)
            urls.setdefault(role_name, []).append(f"http://{head}:{port}")
            for h in range(n_hosts):
                local = min(per_host, role.ranks - h * per_host)
                argv = ["vllm", "serve", model, *flags]
                if role.dep is not None and role.dep > 1:
                    tp = role.attention_tp  # each DP rank is a TP group of tp GPUs
                    argv += ["--data-parallel-size", str(role.dep),
                             "--data-parallel-size-local", str(local // tp),
                             "--data-parallel-address", head,
                             "--data-parallel-rpc-port", str(rpc)]
                    if h:
                        argv += ["--data-parallel-start-rank", str(h * per_host // tp),
                                 "--headless"]
                if h == 0:
                    argv += ["--port", str(port)]
                env = {}
                if role_name in KV_ROLE and not cpu:  # NIXL's side channel, one per instance
                    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": _host(hosts, next_host + h),
                           "VLLM_NIXL_SIDE_CHANNEL_PORT": str(NIXL_BASE_PORT + port - base_port)}
                procs.append(Process(name, role_name, h, tuple(argv), env,
                                     port if h == 0 else None))
            next_host += n_hosts
            port += 1
            rpc += 1
    router: dict[str, object] = {"port": base_port - 1, **{
        f"{r}_urls": u for r, u in urls.items()}, **{
        f"{r}_policy": role.router_policy(r) for r, role in deployment.roles.items()}}
    return Rendered(tuple(procs), router)


def _host(hosts: list[str] | None, index: int) -> str:
    if hosts is None:
        return f"host{index}"
    if index >= len(hosts):
        raise SpecError(f"the deployment needs more than the {len(hosts)} hosts given")
    return hosts[index]


def check_rules(deployment: Deployment) -> None:
    """vLLM's own rules for the flags we render, as one clear SpecError each: the model's rules
    (expert divisibility, MTP layers, TP and heads), the precisions vLLM has for the model's
    family on this hardware (executor/families.py), and the flags' own."""
    if deployment.single_role is not None:
        raise SpecError(f"the deployment has only {deployment.single_role} instances, an "
                        "isolated-role bench for `rackplan simulate`; to deploy it, give prefill "
                        "and decode (P/D) or aggregated")
    model = load_model(deployment.model)
    check_against_model(deployment, model)
    problems = deployment_problems(deployment, model.architecture)
    if problems:
        raise SpecError(problems[0])
    per_host = load_hardware(deployment.hardware).gpus_per_host
    for name, role in deployment.roles.items():
        if role.dep and role.tp and role.tp > 1 and role.ranks > per_host and (
                per_host % role.tp):
            raise SpecError(f"{name}: tp={role.tp} must divide the {per_host} GPUs of a host "
                            f"for {role.layout} to span hosts")
        if role.redundant_experts and not role.expert_parallel:
            raise SpecError(f"{name}: --enable-eplb needs --enable-expert-parallel; give dep")
        if role.all2all_backend is not None and not role.expert_parallel:
            raise SpecError(f"{name}: all2all_backend={role.all2all_backend!r} needs expert "
                            "parallelism; give dep or enable_expert_parallel")
