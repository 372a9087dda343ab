"""vLLM's own rules for a `vllm serve` command line, checked without vLLM.

Each rule mirrors a check vLLM makes when it builds its engine configuration (ParallelConfig,
KVTransferConfig, SpeculativeConfig, `vllm serve`'s load-balancing modes, and, given the
model's architecture and the hardware, the attention and MoE backends of its family), so a
rendered deployment that breaks one is refused here, in one sentence, before anything is written
or started. `flag_problems` checks one process's flags; `check_rendered` checks every process of
a rendered deployment and raises one SpecError naming each problem once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from executor.families import (
    FAMILIES,
    INDEXER_KV_DTYPES,
    SM100_HARDWARE,
    SM100_ONLY,
    family_for,
    indexer_architectures,
)
from simulator.specs.errors import SpecError

if TYPE_CHECKING:
    from executor.render import Rendered

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
"""The kv_role values vLLM's KVTransferConfig accepts."""
PD_KV_ROLES = {"prefill": ("kv_producer", "kv_both"), "decode": ("kv_consumer", "kv_both")}
"""The kv_role each side of a P/D deployment may take."""

Flags = dict[str, str | bool]


def parse_flags(argv: Sequence[str]) -> Flags:
    """The `--flag value` / `--flag=value` / `--flag` options of a command line, by flag name
    (underscores read as dashes, as vLLM does); positional words are skipped."""
    flags: Flags = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--"):
            continue
        name, eq, value = token.partition("=")
        name = "--" + name[2:].replace("_", "-")
        if eq:
            flags[name] = value
        elif i < len(argv) and not argv[i].startswith("--"):
            flags[name] = argv[i]
            i += 1
        else:
            flags[name] = True
    return flags


def _int(flags: Flags, name: str, default: int) -> int:
    value = flags.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not value.lstrip("-").isdigit():
        raise SpecError(f"{name} {value!r} is not a whole number")
    return int(value)


def _json(flags: Flags, name: str) -> dict[str, object] | None:
    value = flags.get(name)
    if value is None:
        return None
    try:
        obj = json.loads(value) if isinstance(value, str) else None
    except json.JSONDecodeError as e:
        raise SpecError(f"{name} {value!r} is not JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise SpecError(f"{name} {value!r} must be a JSON object")
    return obj


def flag_problems(argv: Sequence[str], role: str | None = None,
                  routed_experts: int | None = None, architecture: str | None = None,
                  hardware: str | None = None) -> list[str]:
    """Every rule of vLLM's that these flags break, one sentence each (empty when none).

    `role` (prefill, decode, aggregated) adds the P/D rule on kv_role; `routed_experts` (the
    model's routed experts per MoE layer) adds the EPLB divisibility rule; `architecture` (the
    model's Hugging Face class) adds its family's KV-cache, block-size, indexer and MoE-backend
    rules; `hardware` (a preset name) adds the Blackwell-only ones."""
    try:
        flags = parse_flags(argv)
        problems = [*_eplb(flags, routed_experts), *_data_parallel(flags),
                    *_load_balancing(flags), *_speculative(flags), *_kv_transfer(flags, role),
                    *_attention(flags, architecture), *_moe_backend(flags, architecture),
                    *_blackwell_only(flags, hardware)]
    except SpecError as e:
        return [str(e)]
    return problems


def _eplb(flags: Flags, routed: int | None) -> list[str]:
    eplb = _json(flags, "--eplb-config") or {}
    redundant = eplb.get("num_redundant_experts", 0)
    if not isinstance(redundant, int) or isinstance(redundant, bool) or redundant < 0:
        return [f"--eplb-config num_redundant_experts={redundant!r} must be a whole number "
                ">= 0"]
    if not flags.get("--enable-eplb"):
        if redundant:
            return [f"--eplb-config num_redundant_experts={redundant} needs --enable-eplb; "
                    "add it or drop the redundant experts"]
        return []
    if not flags.get("--enable-expert-parallel"):
        return ["--enable-eplb needs --enable-expert-parallel"]
    tp = _int(flags, "--tensor-parallel-size", 1)
    pcp = _int(flags, "--prefill-context-parallel-size", 1)
    dp = _int(flags, "--data-parallel-size", 1)
    ep = tp * pcp * dp
    if ep <= 1:
        return [f"--enable-eplb needs an expert-parallel group of more than one rank, but "
                f"TP={tp} x PCP={pcp} x DP={dp} = {ep}; raise --data-parallel-size or "
                "--tensor-parallel-size"]
    if routed is not None and (routed + redundant) % ep:
        fix = redundant + (-(routed + redundant)) % ep
        return [f"routed+redundant experts ({routed}+{redundant}={routed + redundant}) must be "
                f"a multiple of the expert-parallel size {ep} (TP={tp} x PCP={pcp} x DP={dp}); "
                f"e.g. num_redundant_experts={fix}"]
    return []


def _data_parallel(flags: Flags) -> list[str]:
    problems = []
    dp = _int(flags, "--data-parallel-size", 1)
    local = _int(flags, "--data-parallel-size-local", dp)
    start = _int(flags, "--data-parallel-start-rank", 0)
    if dp < 1:
        problems.append(f"--data-parallel-size {dp} must be at least 1")
    if local > dp:
        problems.append(f"--data-parallel-size-local {local} must be <= --data-parallel-size "
                        f"{dp}")
    elif start + local > dp:
        problems.append(f"--data-parallel-start-rank {start} + --data-parallel-size-local "
                        f"{local} runs past --data-parallel-size {dp} (ranks 0..{dp - 1})")
    if flags.get("--headless"):
        if dp > 1 and "--data-parallel-address" not in flags:
            problems.append("--headless needs --data-parallel-address (the head host) to "
                            "reach the head's data-parallel RPC port")
        if local < 1:
            problems.append(f"--headless needs --data-parallel-size-local >= 1, got {local}")
        servers = _int(flags, "--api-server-count", 0)
        if servers > 0:
            problems.append(f"--api-server-count {servers} cannot be used with --headless "
                            "(a headless host starts no API server)")
    if flags.get("--data-parallel-external-lb") and dp <= 1:
        problems.append("--data-parallel-external-lb needs --data-parallel-size > 1")
    return problems


def _load_balancing(flags: Flags) -> list[str]:
    multi_port = bool(flags.get("--data-parallel-multi-port-external-lb"))
    external = bool(flags.get("--data-parallel-external-lb")) or "--data-parallel-rank" in flags
    hybrid = bool(flags.get("--data-parallel-hybrid-lb"))
    if not hybrid and not multi_port:  # vLLM: a start rank alone means hybrid LB
        hybrid = "--data-parallel-start-rank" in flags
    problems = []
    if multi_port + external + hybrid > 1:
        chosen = [n for n, on in (("multi-port external", multi_port), ("external", external),
                                  ("hybrid", hybrid)) if on]
        problems.append(f"data-parallel load balancing modes {' and '.join(chosen)} exclude "
                        "each other; give one of --data-parallel-multi-port-external-lb, "
                        "--data-parallel-external-lb (or --data-parallel-rank), "
                        "--data-parallel-hybrid-lb (or --data-parallel-start-rank)")
    if flags.get("--headless") and flags.get("--data-parallel-hybrid-lb"):
        problems.append("--data-parallel-hybrid-lb does not apply to a --headless host")
    return problems


def _speculative(flags: Flags) -> list[str]:
    spec = _json(flags, "--speculative-config")
    if spec is None or spec.get("num_speculative_tokens") is None:
        return []
    k = spec["num_speculative_tokens"]
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        return [f"--speculative-config num_speculative_tokens={k!r} must be a whole number "
                ">= 1"]
    return []


def _kv_transfer(flags: Flags, role: str | None) -> list[str]:
    kv = _json(flags, "--kv-transfer-config")
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


def _attention(flags: Flags, architecture: str | None) -> list[str]:
    """The KV-cache dtype, block size and indexer cache vLLM's attention backends take for the
    model's family (executor/families.py names the vLLM file of each)."""
    attention = _json(flags, "--attention-config") or {}
    problems = []
    if "use_fp4_indexer_cache" in attention:  # vllm/config/attention.py forbids unknown keys
        problems.append("--attention-config use_fp4_indexer_cache is not a field of vLLM "
                        "0.32's attention config; give indexer_kv_dtype 'mxfp4' for an fp4 "
                        "indexer cache (or 'fp8')")
    if architecture is None:
        return problems
    family = family_for(architecture)
    kv = flags.get("--kv-cache-dtype")
    valid_kv = family.vllm_kv_cache_dtypes
    if isinstance(kv, str) and valid_kv is not None and kv not in valid_kv:
        problems.append(f"--kv-cache-dtype {kv} is not one vLLM's attention backends for "
                        f"{architecture} take; use one of {', '.join(valid_kv)}")
    block = flags.get("--block-size")
    if block is not None and family.block_sizes:
        size = _int(flags, "--block-size", 0)
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


def _moe_backend(flags: Flags, architecture: str | None) -> list[str]:
    """A family's own MegaMoE kernel needs expert parallelism and that family."""
    backend = flags.get("--moe-backend")
    mega = {f.mega_moe for f in FAMILIES.values() if f.mega_moe is not None}
    if not isinstance(backend, str) or backend.replace("-", "_") not in mega:
        return []
    problems = []
    if not flags.get("--enable-expert-parallel"):  # vllm/models/deepseek_v4/nvidia/model.py
        problems.append(f"--moe-backend {backend} needs --enable-expert-parallel (its kernel "
                        "dispatches tokens over the expert-parallel group)")
    owners = [a for a, f in FAMILIES.items() if f.mega_moe == backend.replace("-", "_")]
    if architecture is not None and architecture not in owners:
        problems.append(f"--moe-backend {backend} runs in the MoE layers of "
                        f"{', '.join(owners)} only, not {architecture}; drop it (auto)")
    return problems


def _blackwell_only(flags: Flags, hardware: str | None) -> list[str]:
    """Values vLLM runs on Blackwell datacenter GPUs (sm_10x) only."""
    if hardware is None or hardware.lower() in SM100_HARDWARE:
        return []
    attention = _json(flags, "--attention-config") or {}
    given = [flags.get("--kv-cache-dtype"), attention.get("indexer_kv_dtype"),
             str(flags.get("--moe-backend", "")).replace("-", "_")]
    return [f"{SM100_ONLY[v]} needs Blackwell datacenter GPUs ({', '.join(SM100_HARDWARE)}), "
            f"not {hardware}" for v in given if isinstance(v, str) and v in SM100_ONLY]


def check_rendered(rendered: Rendered, routed_experts: int | None = None,
                   architecture: str | None = None, hardware: str | None = None) -> None:
    """Raise one SpecError naming every distinct rule that a rendered process breaks, each with
    the first process that breaks it (e.g. "decode-0 host 1: --headless needs ...").
    `architecture` and `hardware` add the model family's rules (see flag_problems)."""
    seen: dict[str, str] = {}
    for p in rendered.processes:
        for problem in flag_problems(p.argv, p.role, routed_experts, architecture, hardware):
            seen.setdefault(problem, f"{p.instance} host {p.host}")
    if seen:
        raise SpecError("; ".join(f"{where}: {problem}" for problem, where in seen.items()))
