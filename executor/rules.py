"""vLLM's own rules for a `vllm serve` process, checked on its launch record without vLLM.

Each rule mirrors a check vLLM makes when it builds its engine configuration (ParallelConfig,
KVTransferConfig, SpeculativeConfig, `vllm serve`'s load-balancing modes, and, given the
model's architecture and the hardware, the attention and MoE backends of its family), so a
rendered deployment that breaks one is refused here, in one sentence, before anything is written
or started. The rules read the record's typed fields (its data-parallel slice, its tensor-parallel
size) and typed flag values (JSON objects as objects); the expert divisibility rule is the
spec's own (simulator/specs/deployment.py, experts_error). `record_problems` checks one
process; `check_rendered` checks every process of a rendered deployment and raises one
SpecError naming each problem once.
"""

from __future__ import annotations

from collections.abc import Mapping

from executor.families import (
    FAMILIES,
    INDEXER_KV_DTYPES,
    SM100_HARDWARE,
    SM100_ONLY,
    family_for,
    indexer_architectures,
)
from executor.records import LaunchRecord, Rendered
from simulator.specs.deployment import experts_error
from simulator.specs.errors import SpecError

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
"""The kv_role values vLLM's KVTransferConfig accepts."""
PD_KV_ROLES = {"prefill": ("kv_producer", "kv_both"), "decode": ("kv_consumer", "kv_both")}
"""The kv_role each side of a P/D deployment may take."""


def _int(record: LaunchRecord, name: str, default: int) -> int:
    value = record.value(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{name} {value!r} is not a whole number")
    return value


def _config(record: LaunchRecord, name: str) -> Mapping[str, object] | None:
    value = record.value(name)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError(f"{name} {value!r} must be a JSON object")
    return value


def record_problems(record: LaunchRecord, routed_experts: int | None = None,
                    architecture: str | None = None, hardware: str | None = None) -> list[str]:
    """Every rule of vLLM's that this process breaks, one sentence each (empty when none).

    The record's role (prefill, decode) adds the P/D rule on kv_role; `routed_experts` (the
    model's routed experts per MoE layer) adds the expert divisibility rule (the spec's own);
    `architecture` (the model's Hugging Face class) adds its family's KV-cache, block-size,
    indexer and MoE-backend rules; `hardware` (a preset name) adds the Blackwell-only ones."""
    try:
        problems = [*_eplb(record, routed_experts), *_data_parallel(record),
                    *_load_balancing(record), *_speculative(record), *_kv_transfer(record),
                    *_attention(record, architecture), *_moe_backend(record, architecture),
                    *_blackwell_only(record, hardware)]
    except SpecError as e:
        return [str(e)]
    return problems


def _eplb(record: LaunchRecord, routed: int | None) -> list[str]:
    eplb = _config(record, "--eplb-config") or {}
    redundant = eplb.get("num_redundant_experts", 0)
    if not isinstance(redundant, int) or isinstance(redundant, bool) or redundant < 0:
        return [f"--eplb-config num_redundant_experts={redundant!r} must be a whole number "
                ">= 0"]
    if not record.has("--enable-eplb"):
        if redundant:
            return [f"--eplb-config num_redundant_experts={redundant} needs --enable-eplb; "
                    "add it or drop the redundant experts"]
        return []
    if not record.has("--enable-expert-parallel"):
        return ["--enable-eplb needs --enable-expert-parallel"]
    tp = record.tp
    pcp = _int(record, "--prefill-context-parallel-size", 1)
    dp = record.dp.size if record.dp is not None else 1
    ep = tp * pcp * dp
    if ep <= 1:
        return [f"--enable-eplb needs an expert-parallel group of more than one rank, but "
                f"TP={tp} x PCP={pcp} x DP={dp} = {ep}; raise --data-parallel-size or "
                "--tensor-parallel-size"]
    if routed is not None:
        error = experts_error(routed, redundant, ep, f"the expert-parallel size {ep} (TP={tp} "
                                                     f"x PCP={pcp} x DP={dp})")
        if error:
            return [error]
    return []


def _data_parallel(record: LaunchRecord) -> list[str]:
    dp = record.dp
    external = record.has("--data-parallel-external-lb")
    if dp is None:
        return ["--data-parallel-external-lb needs --data-parallel-size > 1"] if external else []
    problems = []
    if dp.size < 1:
        problems.append(f"--data-parallel-size {dp.size} must be at least 1")
    if dp.local > dp.size:
        problems.append(f"--data-parallel-size-local {dp.local} must be <= "
                        f"--data-parallel-size {dp.size}")
    elif dp.start_rank + dp.local > dp.size:
        problems.append(f"--data-parallel-start-rank {dp.start_rank} + "
                        f"--data-parallel-size-local {dp.local} runs past --data-parallel-size "
                        f"{dp.size} (ranks 0..{dp.size - 1})")
    if dp.headless:
        if dp.size > 1 and dp.address is None:
            problems.append("--headless needs --data-parallel-address (the head host) to "
                            "reach the head's data-parallel RPC port")
        if dp.local < 1:
            problems.append(f"--headless needs --data-parallel-size-local >= 1, got {dp.local}")
        servers = _int(record, "--api-server-count", 0)
        if servers > 0:
            problems.append(f"--api-server-count {servers} cannot be used with --headless "
                            "(a headless host starts no API server)")
    if external and dp.size <= 1:
        problems.append("--data-parallel-external-lb needs --data-parallel-size > 1")
    return problems


def _load_balancing(record: LaunchRecord) -> list[str]:
    multi_port = record.has("--data-parallel-multi-port-external-lb")
    external = record.has("--data-parallel-external-lb") or record.has("--data-parallel-rank")
    hybrid = record.has("--data-parallel-hybrid-lb")
    headless = record.dp is not None and record.dp.headless
    if not hybrid and not multi_port:  # vLLM: a start rank alone means hybrid LB
        hybrid = record.dp is not None and record.dp.gives_start_rank
    problems = []
    if multi_port + external + hybrid > 1:
        chosen = [n for n, on in (("multi-port external", multi_port), ("external", external),
                                  ("hybrid", hybrid)) if on]
        problems.append(f"data-parallel load balancing modes {' and '.join(chosen)} exclude "
                        "each other; give one of --data-parallel-multi-port-external-lb, "
                        "--data-parallel-external-lb (or --data-parallel-rank), "
                        "--data-parallel-hybrid-lb (or --data-parallel-start-rank)")
    if headless and record.has("--data-parallel-hybrid-lb"):
        problems.append("--data-parallel-hybrid-lb does not apply to a --headless host")
    return problems


def _speculative(record: LaunchRecord) -> list[str]:
    spec = _config(record, "--speculative-config")
    if spec is None or spec.get("num_speculative_tokens") is None:
        return []
    k = spec["num_speculative_tokens"]
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        return [f"--speculative-config num_speculative_tokens={k!r} must be a whole number "
                ">= 1"]
    return []


def _kv_transfer(record: LaunchRecord) -> list[str]:
    role = record.role
    kv = _config(record, "--kv-transfer-config")
    if kv is None:
        if role in PD_KV_ROLES:
            return [f"a {role} instance of a P/D deployment needs --kv-transfer-config with "
                    f"kv_role {' or '.join(PD_KV_ROLES[role])}"]
        return []
    kv_role = kv.get("kv_role")
    if kv.get("kv_connector") is not None and kv_role is None:
        return [f"--kv-transfer-config sets kv_connector={kv['kv_connector']!r} but no "
                f"kv_role; give one of {', '.join(KV_ROLES)}"]
    if kv_role is not None and kv_role not in KV_ROLES:
        return [f"--kv-transfer-config kv_role={kv_role!r} is not one of {', '.join(KV_ROLES)}"]
    if role in PD_KV_ROLES:
        if kv.get("kv_connector") is None:
            return [f"a {role} instance of a P/D deployment needs a kv_connector in "
                    "--kv-transfer-config"]
        if kv_role not in PD_KV_ROLES[role]:
            return [f"a {role} instance needs kv_role {' or '.join(PD_KV_ROLES[role])} in "
                    f"--kv-transfer-config, not {kv_role!r}"]
    return []


def _attention(record: LaunchRecord, architecture: str | None) -> list[str]:
    """The KV-cache dtype, block size and indexer cache vLLM's attention backends take for the
    model's family (executor/families.py names the vLLM file of each)."""
    attention = _config(record, "--attention-config") or {}
    problems = []
    if "use_fp4_indexer_cache" in attention:  # vllm/config/attention.py forbids unknown keys
        problems.append("--attention-config use_fp4_indexer_cache is not a field of vLLM "
                        "0.32's attention config; give indexer_kv_dtype 'mxfp4' for an fp4 "
                        "indexer cache (or 'fp8')")
    if architecture is None:
        return problems
    family = family_for(architecture)
    kv = record.value("--kv-cache-dtype")
    valid_kv = family.vllm_kv_cache_dtypes
    if isinstance(kv, str) and valid_kv is not None and kv not in valid_kv:
        problems.append(f"--kv-cache-dtype {kv} is not one vLLM's attention backends for "
                        f"{architecture} take; use one of {', '.join(valid_kv)}")
    if record.value("--block-size") is not None and family.block_sizes:
        size = _int(record, "--block-size", 0)
        if size not in family.block_sizes:
            sizes = " or ".join(str(b) for b in family.block_sizes)
            problems.append(f"--block-size {size} is not one the attention kernels of "
                            f"{architecture} support; use --block-size {sizes}")
    indexer = attention.get("indexer_kv_dtype")
    if indexer is not None and indexer != "auto":
        if not family.sparse_indexer:
            problems.append(f"--attention-config indexer_kv_dtype={indexer!r} applies to models "
                            f"with a DeepSeek sparse-attention indexer "
                            f"({', '.join(indexer_architectures())}), not {architecture}; "
                            "drop it")
        elif indexer not in INDEXER_KV_DTYPES:
            problems.append(f"--attention-config indexer_kv_dtype={indexer!r} is not one the "
                            f"DeepSeek sparse indexer supports; use one of "
                            f"{', '.join(INDEXER_KV_DTYPES)}")
    return problems


def _moe_backend(record: LaunchRecord, architecture: str | None) -> list[str]:
    """A family's own MegaMoE kernel needs expert parallelism and that family."""
    backend = record.value("--moe-backend")
    mega = {f.mega_moe for f in FAMILIES.values() if f.mega_moe is not None}
    if not isinstance(backend, str) or backend.replace("-", "_") not in mega:
        return []
    problems = []
    if not record.has("--enable-expert-parallel"):  # vllm/models/deepseek_v4/nvidia/model.py
        problems.append(f"--moe-backend {backend} needs --enable-expert-parallel (its kernel "
                        "dispatches tokens over the expert-parallel group)")
    owners = [a for a, f in FAMILIES.items() if f.mega_moe == backend.replace("-", "_")]
    if architecture is not None and architecture not in owners:
        problems.append(f"--moe-backend {backend} runs in the MoE layers of "
                        f"{', '.join(owners)} only, not {architecture}; drop it (auto)")
    return problems


def _blackwell_only(record: LaunchRecord, hardware: str | None) -> list[str]:
    """Values vLLM runs on Blackwell datacenter GPUs (sm_10x) only."""
    if hardware is None or hardware.lower() in SM100_HARDWARE:
        return []
    attention = _config(record, "--attention-config") or {}
    given = [record.value("--kv-cache-dtype"), attention.get("indexer_kv_dtype"),
             str(record.value("--moe-backend") or "").replace("-", "_")]
    return [f"{SM100_ONLY[v]} needs Blackwell datacenter GPUs ({', '.join(SM100_HARDWARE)}), "
            f"not {hardware}" for v in given if isinstance(v, str) and v in SM100_ONLY]


def check_rendered(rendered: Rendered, routed_experts: int | None = None,
                   architecture: str | None = None, hardware: str | None = None) -> None:
    """Raise one SpecError naming every distinct rule that a rendered process breaks, each with
    the first process that breaks it (e.g. "decode-0 host 1: --headless needs ...").
    `architecture` and `hardware` add the model family's rules (see record_problems)."""
    seen: dict[str, str] = {}
    for p in rendered.processes:
        for problem in record_problems(p, routed_experts, architecture, hardware):
            seen.setdefault(problem, f"{p.instance} host {p.host}")
    if seen:
        raise SpecError("; ".join(f"{where}: {problem}" for problem, where in seen.items()))
