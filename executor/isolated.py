"""One role of a plan benched alone, the way vLLM's reports time prefill and decode apart.

`rackplan bench PLAN --mode decode_only --context C --concurrency N` deploys the plan's decode
role by itself (every decode instance, behind our router as an aggregated pool) with vLLM's
DecodeBenchConnector: each request's KV cache is filled with dummy values instead of being
prefilled, so the engine decodes at context C from the first step. `vllm bench serve` sends
prompts of C tokens in a closed loop of N; what is compared is what decode alone decides (TPOT,
ITL, output throughput) with the simulator's decode_only mode of the same role at the same
context and load. `--mode prefill_only` deploys the prefill role without its KV-transfer
connector and sends prompts of C tokens for one output token each: TTFT and input throughput,
against the simulator's prefill_only mode.

vLLM's exact-batch timing (`vllm bench forward`) is not in the engine this project deploys
(vLLM 0.32.0 ships `bench serve`, `latency`, `throughput`, `startup` and `sweep`); the closest
exact batch here is a closed loop of N equal prompts, which is what prefill_only sends.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from executor.backends.local import LocalBackend
from executor.engines.vllm import CPU_PD_NO_CHUNKING
from executor.records import Rendered
from simulator.specs.deployment import Deployment
from simulator.specs.errors import SpecError
from simulator.specs.workload import ClosedArrival, FixedLength, Workload

KV_FLAG = "--kv-transfer-config"
HANDOFF_ONLY = (KV_FLAG, CPU_PD_NO_CHUNKING[0])
"""Flags a P/D role has for its KV handoff only (the connector, and on CPU no chunked prefill
for ExampleConnector's sake): an isolated role hands nothing over."""
MAX_LEN_FLAG = "--max-model-len"
DECODE_BENCH = {"kv_connector": "DecodeBenchConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"fill_mean": 0.015, "fill_std": 0.0}}
"""vLLM's DecodeBenchConnector with its documented defaults (constant fill 0.015): the KV of a
request's prompt is written, not computed."""
MIN_PROMPTS = 8


@dataclass(frozen=True)
class Mode:
    """An isolated-role bench mode."""

    name: str
    role: str
    """The role of a P/D plan that runs alone."""
    connector: dict[str, Any] | None
    """The role's --kv-transfer-config in this mode (None: no connector)."""
    metrics: tuple[str, ...]
    """The comparison rows that this mode measures."""


MODES = {
    "decode_only": Mode("decode_only", "decode", DECODE_BENCH, (
        "tpot_ms.p50", "tpot_ms.p90", "tpot_ms.p99", "itl_ms.p50", "itl_ms.p90", "itl_ms.p99",
        "output_throughput_tok_s")),
    "prefill_only": Mode("prefill_only", "prefill", None, (
        "ttft_ms.p50", "ttft_ms.p90", "ttft_ms.p99", "total_throughput_tok_s")),
}


def mode_for(name: str) -> Mode:
    """The mode called `name`; SpecError naming the valid ones."""
    try:
        return MODES[name]
    except KeyError:
        raise SpecError(f"--mode {name!r} is not an isolated-role mode; valid: serve, "
                        f"{', '.join(MODES)}") from None


def role_alone(deployment: Deployment, mode: Mode) -> tuple[str, Deployment]:
    """(the role that runs, the deployment of that role alone). An aggregated plan benches its
    aggregated instances in either mode."""
    roles = deployment.roles
    role = "aggregated" if "aggregated" in roles else mode.role
    if role not in roles:
        raise SpecError(f"the plan has no {mode.role} instances to bench in {mode.name} mode")
    data = deployment.model_dump()
    for other in [r for r in roles if r != role]:
        data[other] = None
    return role, Deployment.model_validate(data)


def workload_alone(workload: Workload, mode: Mode, context: int, concurrency: int,
                   prompts: int | None) -> Workload:
    """The plan's workload as the isolated bench sends it: a closed loop of `concurrency`,
    `prompts` requests (default 4 per user, at least MIN_PROMPTS), prompts of `context` tokens;
    decode_only keeps the plan's output lengths and starts with `context` tokens of KV,
    prefill_only asks one output token."""
    n = prompts if prompts is not None else max(MIN_PROMPTS, 4 * concurrency)
    data = {**workload.model_dump(), "mode": mode.name,
            "arrival": ClosedArrival(concurrency=concurrency).model_dump(), "requests": n,
            "input_tokens": FixedLength(value=context).model_dump(), "prefix_hit_rate": 0.0,
            "sessions": None}
    if mode.name == "decode_only":
        data["context_tokens"] = context
    else:
        data["output_tokens"] = FixedLength(value=1).model_dump()
    return Workload.model_validate(data)


def serve_workload(alone: Workload) -> Workload:
    """The same traffic with mode serve: what `vllm bench serve` is told to send."""
    return Workload.model_validate({**alone.model_dump(), "mode": "serve"})


def rendering_alone(rendered: Rendered, role: str, mode: Mode) -> Rendered:
    """The processes of `role` in the plan's rendering, with the mode's connector, behind the
    router as an aggregated pool (least requests first: a bench's prompts share nothing to
    route by). vLLM's rules are those of the plan's rendering, which deploy checks."""
    procs = []
    for p in rendered.processes:
        if p.role != role:
            continue
        flags = tuple(f for f in p.flags if f[0] not in HANDOFF_ONLY)
        if mode.connector is not None:
            flags = (*flags, (KV_FLAG, mode.connector))
        procs.append(replace(p, flags=flags))
    urls = rendered.router.get(f"{role}_urls")
    router = {"port": rendered.router["port"], "aggregated_urls": urls,
              "aggregated_policy": "least_requests"}
    return Rendered(tuple(procs), router)


def with_context_room(rendered: Rendered, tokens: int) -> Rendered:
    """Where the rendering limits the context (--max-model-len, the CPU build's), room for
    `tokens` (prompt and output): the isolated bench asks for a context, not the plan's."""
    procs = []
    for p in rendered.processes:
        limit = p.value(MAX_LEN_FLAG)
        if isinstance(limit, int) and limit < tokens:
            p = replace(p, flags=tuple((n, tokens if n == MAX_LEN_FLAG else v)
                                       for n, v in p.flags))
        procs.append(p)
    return Rendered(tuple(procs), rendered.router)


@dataclass
class Alone:
    """An isolated-role bench set up: the role's deployment, the traffic, the prediction."""

    mode: Mode
    role: str
    plan: Deployment
    """The plan's whole deployment (it is rendered, then the role kept)."""
    deployment: Deployment
    """The role alone (what is simulated)."""
    workload: Workload
    predicted: dict[str, Any]


def predict_alone(deployment: Deployment, workload: Workload, mode: Mode, context: int,
                  concurrency: int, prompts: int | None = None) -> Alone:
    """The role alone at `context` and `concurrency`, simulated in the mode (with the
    calibration tables active now)."""
    from planner.evaluate import calibration_for, sim_options
    from simulator.des import simulate

    role, alone = role_alone(deployment, mode)
    traffic = workload_alone(workload, mode, context, concurrency, prompts)
    predicted = simulate(alone, traffic, calibration=calibration_for(alone),
                         options=sim_options(alone)).metrics()
    return Alone(mode, role, deployment, alone, traffic, predicted)


def launch_alone(alone: Alone, model: str, run_dir: Path, *, base_port: int | None = None,
                 vllm: str | Path | None = None, ready_timeout_s: float = 1800.0,
                 room: int = 0) -> LocalBackend:
    """The role alone launched on this machine (local backend) and ready; the caller tears it
    down. `room`: the context (prompt and output tokens) the bench will ask for."""
    rendered = LocalBackend.render_for(alone.plan, model, base_port)
    rendered = with_context_room(rendering_alone(rendered, alone.role, alone.mode), room)
    backend = LocalBackend(rendered, run_dir, vllm=vllm)
    try:
        backend.launch()
        backend.wait_ready(ready_timeout_s)
    except BaseException:
        backend.teardown()
        raise
    return backend
