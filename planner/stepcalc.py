"""`rackplan step`: price one engine step of one instance of a deployment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from planner.evaluate import measured_overhead
from planner.plan import load_plan_or_deployment
from simulator.cost.step import Batch, step_time
from simulator.resolve import resolve
from simulator.specs.errors import SpecError

DEFAULT_ROLES = ("decode", "aggregated", "prefill")
"""The role `rackplan step` prices when none is named: the first of these the deployment has."""


STEP_CONTEXT = 4096
"""The context `rackplan step` prices when none is given (the model's whole context when that is
shorter)."""


def step_report(deployment_path: str | Path, role: str | None, batch: int, context: int | None,
                cached: int = 0, ranks_busy: int | None = None) -> dict[str, Any]:
    """Step time, breakdown and provenance for `batch` requests per rank at `context` tokens.

    Decode and aggregated roles: each request generates one token over `context` cached tokens.
    Prefill: each request prefills `context` prompt tokens in one chunk after `cached` tokens
    already in the prefix cache; `context` None: STEP_CONTEXT, or as much of the model's context
    as `cached` leaves when that is less. `ranks_busy`: only that many ranks get the batch
    (the others step along idle, as DP ranks do in lock-step). The fixed per-step
    overhead is the one measured in the active calibration folder when it holds one, else the
    cost model's default for the hardware kind.
    """
    if batch < 1:
        raise SpecError(f"--batch={batch} must be >= 1")
    if context is not None and context < 1:
        raise SpecError(f"--context={context} must be >= 1")
    if cached < 0:
        raise SpecError(f"--cached={cached} must be >= 0")
    dep = load_plan_or_deployment(deployment_path)[0]
    measured = measured_overhead(dep)
    res = resolve(dep, overhead=measured)
    if role is None:
        role = next(r for r in DEFAULT_ROLES if r in res.roles)
    if cached and role != "prefill":
        raise SpecError(f"--cached={cached} applies to --role prefill only; for decode give the "
                        "whole KV length as --context")
    if role not in res.roles:
        raise SpecError(f"--role={role!r} is not in {deployment_path}; it has "
                        f"{', '.join(res.roles)}")
    r = res.roles[role]
    inst = r.instance
    window = inst.model.context_length
    if context is None:  # the default, within the model's context after what is cached
        context = max(1, min(STEP_CONTEXT, (window or STEP_CONTEXT) - cached))
    if window is not None and context + cached > window:
        what = (f"--cached={cached:,} plus --context={context:,}" if cached
                else f"--context={context:,}")
        raise SpecError(f"{what} tokens exceed {inst.model.name}'s context of {window:,} tokens "
                        "(max_position_embeddings and rope scaling, as vLLM takes it); give at "
                        f"most {window:,}")
    busy = inst.dp if ranks_busy is None else ranks_busy
    if not 1 <= busy <= inst.dp:
        raise SpecError(f"--ranks-busy={ranks_busy} must be between 1 and the instance's "
                        f"{inst.dp} DP ranks")
    if role == "prefill":
        work = Batch.prefill(inst.dp, tokens=batch * context, requests=batch, context=cached)
    else:
        work = Batch.decode(inst.dp, requests=batch, context=context)
    if busy < inst.dp:
        idle = np.arange(inst.dp) >= busy
        work = Batch(*(np.where(idle, 0.0, getattr(work, f))
                       for f in ("decode_requests", "decode_context", "prefill_tokens",
                                 "prefill_requests", "prefill_context")))
    st = step_time(inst, work, res.calibration)
    return {
        "model": res.model.name, "hardware": res.hardware.name, "engine": dep.engine,
        "role": role, "layout": r.spec.layout, "ranks": inst.ranks,
        "batch_per_rank": batch, "context": context, "cached": cached, "ranks_busy": busy,
        "total_ms": st.total_ms, "breakdown_ms": st.breakdown, "parts_ms": st.parts,
        "tokens_per_s_per_gpu": st.tokens / inst.ranks / st.total_ms * 1e3,
        "source": st.source, "provenance": st.provenance,
        "kv_tokens_per_rank": r.memory.kv_tokens,
    }
