"""What the UI's forms produce, turned into specs: knobs -> Deployment, traffic -> Workload.

Everything here is plain Python (no Streamlit), so the pages stay thin and the conversions are
tested on their own. Bad values surface as `SpecError` with the spec layer's one-sentence message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from planner.defaults import workload_presets
from planner.space import draft_method
from simulator.des.traces import read_trace
from simulator.specs.deployment import Deployment
from simulator.specs.errors import SpecError
from simulator.specs.loading import (
    dump_deployment,
    dump_workload,
    load_deployment,
    load_workload,
)
from simulator.specs.workload import Workload

Layout = Literal["pd", "aggregated"]
LAYOUT_LABELS: dict[Layout, str] = {"pd": "P/D disaggregated", "aggregated": "aggregated"}
TRACE_SUFFIXES = (".jsonl", ".csv")
AGENTX_SUFFIXES = (".jsonl", ".json")


@dataclass(frozen=True)
class RoleKnobs:
    """The knobs of one role, as the what-if form shows them."""

    instances: int = 1
    """Engine instances of the role."""
    dep: int = 8
    """Ranks per instance (DEP-N: attention data-parallel + MoE expert-parallel)."""
    redundant_experts: int = 0
    """Extra expert slots per MoE layer placed by EPLB."""
    max_num_seqs: int = 256
    """Most sequences in a batch, per rank."""
    max_num_batched_tokens: int = 8192
    """Most tokens in one engine step, per rank."""
    mtp_tokens: int = 0
    """Draft tokens per step of the model's own draft layers, MTP or DSpark (0: no
    speculative decoding); ignored for prefill."""
    mtp_acceptance: float = 0.7
    """Probability that a draft token is accepted."""
    host_cache_gb: float = 0.0
    """GiB of host memory per GPU for the prefix cache's second tier (0: none)."""

    def spec(self, role: str, method: str = "mtp") -> dict[str, Any]:
        """The role's entry in a deployment dict (DESIGN.md format); `method` drafts with the
        model's own draft layers (mtp, or dspark for DeepSeek-V4.1's)."""
        out: dict[str, Any] = {
            "instances": self.instances, "dep": self.dep,
            "redundant_experts": self.redundant_experts,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
        }
        if role != "prefill" and self.mtp_tokens > 0:
            out["speculative"] = {"method": method, "tokens": self.mtp_tokens,
                                  "acceptance": self.mtp_acceptance}
        if self.host_cache_gb > 0:
            out["host_cache_gb"] = self.host_cache_gb
        return out


DEFAULT_ROLES: dict[str, RoleKnobs] = {
    "prefill": RoleKnobs(instances=4, dep=8, redundant_experts=32,
                         max_num_batched_tokens=16384),
    "decode": RoleKnobs(instances=1, dep=40, redundant_experts=64, max_num_seqs=256),
    "aggregated": RoleKnobs(instances=9, dep=8, redundant_experts=32, max_num_seqs=128),
}
"""Defaults of the form: DeepSeek-V3 on 72 H200 as examples/deepseek-v3-h200-pd.yaml."""


@dataclass(frozen=True)
class DeploymentKnobs:
    """The whole deployment form."""

    model: str = "deepseek-v3"
    hardware: str = "h200"
    engine: str = "vllm"
    weights: str = "fp8"
    kv_cache: str = "fp8"
    indexer_cache: str = "fp8"
    """Dtype of the sparse-attention indexer's key cache (DeepSeek-V3.2 / V4)."""
    gpu_budget: int = 0
    """Cluster size in GPUs (throughput per GPU counts them all); 0: exactly what the roles
    use."""
    layout: Layout = "pd"
    roles: dict[str, RoleKnobs] = field(default_factory=lambda: dict(DEFAULT_ROLES))

    def as_dict(self) -> dict[str, Any]:
        """The deployment in the DESIGN.md YAML form."""
        names = ("prefill", "decode") if self.layout == "pd" else ("aggregated",)
        missing = [n for n in names if n not in self.roles]
        if missing:
            raise SpecError(f"layout {self.layout!r} needs the role(s) {', '.join(missing)}")
        out: dict[str, Any] = {
            "model": self.model, "hardware": self.hardware, "engine": self.engine,
            "precision": {"weights": self.weights, "kv_cache": self.kv_cache},
        }
        if self.indexer_cache != "fp8":
            out["precision"]["indexer_cache"] = self.indexer_cache
        if self.gpu_budget > 0:
            out["gpus"] = self.gpu_budget
        method = _draft_method(self.model)
        for name in names:
            out[name] = self.roles[name].spec(name, method)
        return out


def _draft_method(model: str) -> str:
    """The speculative method of `model`'s draft layers; mtp where the model does not load
    (loading the deployment then says why)."""
    try:
        return draft_method(model)
    except SpecError:
        return "mtp"


def build_deployment(knobs: DeploymentKnobs) -> Deployment:
    """The Deployment the form describes; SpecError naming the bad knob."""
    return load_deployment(knobs.as_dict())


ROLE_KEYS = {"instances", "dep", "redundant_experts", "max_num_seqs", "max_num_batched_tokens",
             "speculative", "host_cache_gb"}
"""The role keys the form has a knob for."""


def knobs_of(deployment: Deployment) -> DeploymentKnobs:
    """The form's knobs holding `deployment`; SpecError when it sets something the form has no
    knob for (a TP layout, a router policy...), naming it."""
    data = dump_deployment(deployment)
    layout: Layout = "aggregated" if "aggregated" in data else "pd"
    names = ("prefill", "decode") if layout == "pd" else ("aggregated",)
    roles: dict[str, RoleKnobs] = {}
    for name in names:
        if name not in data:
            raise SpecError(f"the form needs both prefill and decode; this deployment has only "
                            f"{', '.join(r for r in names if r in data)}")
        r = data[name]
        extra = sorted(set(r) - ROLE_KEYS)
        if extra or r.get("dep") is None:
            raise SpecError(f"{name} sets {', '.join(extra) or 'no dep'}, which the form has no "
                            "knob for")
        spec = r.get("speculative") or {}
        d = RoleKnobs()  # the spec's own defaults, for the keys the deployment leaves out
        roles[name] = RoleKnobs(
            instances=r.get("instances", 1), dep=r["dep"],
            redundant_experts=r.get("redundant_experts", 0),
            max_num_seqs=r.get("max_num_seqs", d.max_num_seqs),
            max_num_batched_tokens=r.get("max_num_batched_tokens", d.max_num_batched_tokens),
            mtp_tokens=spec.get("tokens", 0), mtp_acceptance=spec.get("acceptance", 0.7),
            host_cache_gb=r.get("host_cache_gb", 0.0))
    for name, d in DEFAULT_ROLES.items():
        roles.setdefault(name, d)
    precision = data.get("precision", {})
    return DeploymentKnobs(model=data["model"], hardware=data["hardware"],
                           engine=data.get("engine", "vllm"),
                           weights=precision.get("weights", "fp8"),
                           kv_cache=precision.get("kv_cache", "fp8"),
                           indexer_cache=precision.get("indexer_cache", "fp8"),
                           gpu_budget=data.get("gpus") or 0, layout=layout, roles=roles)


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
"""The repository's example deployments (absent in an installed package)."""


def example_knobs(folder: Path = EXAMPLES) -> dict[str, DeploymentKnobs]:
    """The examples (deployments or plans) the form can hold, by file name."""
    from planner.plan import load_plan_or_deployment

    out: dict[str, DeploymentKnobs] = {}
    for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
        try:
            out[path.stem] = knobs_of(load_plan_or_deployment(path)[0])
        except (SpecError, ValueError, OSError):
            continue  # a workload, or a deployment with knobs the form lacks
    return out


# --- workloads ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CustomTraffic:
    """Synthetic traffic from a handful of knobs."""

    arrival: Literal["closed", "poisson", "bursty"] = "closed"
    concurrency: int = 256
    """Closed loop: requests in flight."""
    rate: float = 20.0
    """Poisson and bursty: mean requests per second."""
    requests: int = 1000
    input_tokens: int = 2000
    """Median input length (the value itself when lengths are fixed)."""
    output_tokens: int = 500
    """Median output length (the value itself when lengths are fixed)."""
    spread: float = 0.0
    """Log-normal sigma of both lengths; 0: every request has exactly the given lengths."""
    prefix_hit_rate: float = 0.0
    seed: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The workload in the DESIGN.md YAML form."""
        arrival: dict[str, Any] = (
            {"kind": "closed", "concurrency": self.concurrency} if self.arrival == "closed"
            else {"kind": self.arrival, "rate": self.rate})
        return {"arrival": arrival, "requests": self.requests,
                "input_tokens": _length(self.input_tokens, self.spread),
                "output_tokens": _length(self.output_tokens, self.spread),
                "prefix_hit_rate": self.prefix_hit_rate, "seed": self.seed}


def _length(median: int, sigma: float) -> dict[str, Any]:
    if sigma <= 0:
        return {"kind": "fixed", "value": median}
    return {"kind": "lognormal", "median": median, "sigma": sigma,
            "max": max(131072, median)}


def custom_workload(traffic: CustomTraffic) -> Workload:
    """The Workload of the custom-traffic knobs; SpecError naming the bad knob."""
    return load_workload(traffic.as_dict())


def preset_workload(name: str, requests: int | None = None, seed: int | None = None) -> Workload:
    """A shipped workload preset (planner/presets), optionally with another request count or
    seed."""
    if name not in workload_presets():
        raise SpecError(f"workload preset {name!r} does not exist; presets: "
                        f"{', '.join(workload_presets())}")
    with resources.as_file(resources.files("planner").joinpath(f"presets/{name}.yaml")) as p:
        data = dump_workload(load_workload(p))
    if requests is not None:
        data["requests"] = requests
    if seed is not None:
        data["seed"] = seed
    return load_workload(data)


def save_trace(name: str, data: bytes, folder: Path, agentx: bool = False) -> Path:
    """Write an uploaded trace into `folder` under a safe name that keeps its suffix (a
    Mooncake .jsonl or .csv trace; with `agentx`, AgentX session traces in .jsonl or .json)."""
    suffix = Path(name).suffix.lower()
    if agentx and suffix not in AGENTX_SUFFIXES:
        raise SpecError(f"AgentX traces {name!r} must be a .jsonl (one session trace a line) or "
                        ".json file")
    if not agentx and suffix not in TRACE_SUFFIXES:
        raise SpecError(f"trace {name!r} must be a .jsonl (Mooncake format) or .csv file with "
                        "timestamp, input_length and output_length")
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(name).stem)[:80] or "trace"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}{suffix}"
    path.write_bytes(data)
    return path


def trace_workload(path: Path, requests: int, time_scale: float = 1.0,
                   seed: int = 0) -> Workload:
    """A workload that replays the trace at `path` (its first `requests` rows); the trace is
    read once here so that a bad file is reported before any simulation."""
    workload = load_workload({"arrival": {"kind": "trace", "path": str(path),
                                          "time_scale": time_scale},
                              "requests": requests, "seed": seed})
    read_trace(path, time_scale, requests)
    return workload


def agentx_workload(path: Path, concurrency: int, requests: int, seed: int = 0) -> Workload:
    """A workload that replays AgentX ("weka") session traces at `path` as the AgentX harness
    does (`concurrency` session trees alive at once); the traces are read once here so that a
    bad file is reported before any simulation."""
    from simulator.des.weka import read_weka

    workload = load_workload({"arrival": {"kind": "sessions", "concurrency": concurrency,
                                          "traces": str(path)},
                              "requests": requests, "seed": seed})
    read_weka(path)
    return workload
