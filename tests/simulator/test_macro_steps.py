"""Macro-steps (simulator.des.runs): runs of identical decode steps as one event give what the
steps one by one give, exactly: every metric, every request's times, every timeline point."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simpy

from simulator.des import SimOptions, SimResult, simulate
from simulator.des.kvpool import KvPool
from simulator.des.metrics import ExactSum
from simulator.des.runs import Run, delay_to, hops_to
from simulator.des.slots import DecodeSlots
from simulator.specs.deployment import Deployment, RoleSpec, Speculative
from simulator.specs.loading import load_deployment, load_workload
from simulator.specs.workload import (
    ClosedArrival,
    FixedLength,
    PoissonArrival,
    SessionsArrival,
    UniformLength,
    Workload,
)

ROOT = Path(__file__).resolve().parents[2]
MTP = Speculative(tokens=1, acceptance=0.8)


def pd(prefill: RoleSpec, decode: RoleSpec) -> Deployment:
    return Deployment(model="deepseek-v3", hardware="h200", prefill=prefill, decode=decode)


def uniform(low: int, high: int) -> UniformLength:
    return UniformLength(low=low, high=high)


def agentx_sample() -> tuple[Deployment, Workload]:
    """The V4 P/D deck replaying the AgentX sample sessions (examples/)."""
    wl = load_workload(ROOT / "examples" / "agentx-sample-sessions.yaml")
    assert isinstance(wl.arrival, SessionsArrival)
    traces = str(ROOT / "examples" / "traces" / "agentx-sample.jsonl")
    arrival = wl.arrival.model_copy(update={"traces": traces})
    return (load_deployment(ROOT / "examples" / "deepseek-v4-flash-gb300-pd.yaml"),
            wl.model_copy(update={"arrival": arrival}))


def tight_vllm_aggregated() -> tuple[Deployment, Workload]:
    """An aggregated vLLM DEP8 whose KV holds about 12,000 tokens a rank and two MTP tokens a
    step: its 8 users a rank outgrow it, so it preempts (optimistic admission)."""
    from simulator.cost.memory import rank_memory
    from simulator.specs.hardware import load_hardware
    from simulator.specs.model import load_model

    h200, mtp = load_hardware("h200"), Speculative(tokens=2, acceptance=0.7)
    mem = rank_memory(load_model("deepseek-v3"), h200, RoleSpec(dep=8, speculative=mtp), "fp8",
                      "fp8")
    util = (mem.weights + mem.activations + mem.reserve + 12_000 * mem.kv_bytes_per_token) / (
        h200.hbm_bytes)
    dep = Deployment(model="deepseek-v3", hardware="h200", aggregated=RoleSpec(
        dep=8, gpu_memory_utilization=round(util, 4), speculative=mtp))
    return dep, Workload(arrival=ClosedArrival(concurrency=64), requests=160,
                         input_tokens=uniform(500, 1500), output_tokens=uniform(500, 1500),
                         seed=6)


CASES: dict[str, tuple[Deployment, Workload]] = {
    "closed loop, P/D, MTP, two decode instances routed by tokens": (
        pd(RoleSpec(instances=2, dep=8),
           RoleSpec(instances=2, dep=8, speculative=MTP, router="least_tokens")),
        Workload(arrival=ClosedArrival(concurrency=64), requests=300,
                 input_tokens=uniform(200, 3000), output_tokens=uniform(20, 400), seed=1)),
    "closed loop, fixed lengths, lock-step waves": (
        pd(RoleSpec(dep=8), RoleSpec(dep=8)),
        Workload(arrival=ClosedArrival(concurrency=32), requests=200,
                 input_tokens=FixedLength(value=1000), output_tokens=FixedLength(value=200))),
    "poisson, prefix hits": (
        pd(RoleSpec(instances=2, dep=8), RoleSpec(dep=8)),
        Workload(arrival=PoissonArrival(rate=20), requests=200, input_tokens=uniform(200, 3000),
                 output_tokens=uniform(5, 300), prefix_hit_rate=0.3, seed=5)),
    "aggregated DP, spread clients": (
        Deployment(model="deepseek-v3", hardware="h200", aggregated={"dep": 8}),
        Workload(arrival=ClosedArrival(concurrency=32, start="spread"), requests=200,
                 input_tokens=uniform(500, 2000), output_tokens=uniform(50, 300), seed=2)),
    "aggregated TP, two MTP tokens": (
        Deployment(model="deepseek-v3", hardware="h200",
                   aggregated={"tp": 8, "speculative": {"tokens": 2, "acceptance": 0.7}}),
        Workload(arrival=PoissonArrival(rate=5), requests=100, input_tokens=uniform(500, 2000),
                 output_tokens=uniform(50, 300), seed=3)),
    "decode only, MTP": (
        pd(RoleSpec(dep=8), RoleSpec(dep=8, speculative=MTP)),
        Workload(arrival=ClosedArrival(concurrency=64), requests=256,
                 input_tokens=uniform(500, 4000), output_tokens=uniform(10, 300),
                 mode="decode_only", seed=4)),
    "AgentX sample sessions on the V4 P/D deck": agentx_sample(),
    "aggregated vLLM, MTP, KV outgrown: preemption": tight_vllm_aggregated(),
    "aggregated TensorRT-LLM DP, attention-DP balance's waiting count": (
        Deployment(model="deepseek-v3", hardware="h200", engine="trtllm",
                   aggregated={"dep": 8, "attention_dp_balance": True,
                               "router": "least_requests"}),
        Workload(arrival=ClosedArrival(concurrency=32), requests=160,
                 input_tokens=uniform(500, 2000), output_tokens=uniform(50, 300), seed=7)),
    "aggregated SGLang, prompts in steps of their own": (
        Deployment(model="deepseek-v3", hardware="h200", engine="sglang",
                   aggregated={"tp": 8}),
        Workload(arrival=PoissonArrival(rate=5), requests=100, input_tokens=uniform(500, 2000),
                 output_tokens=uniform(50, 300), seed=8)),
}


def assert_same(a: SimResult, b: SimResult) -> None:
    """Every field of two results equal (NaN equal to NaN)."""
    assert a.metrics() == b.metrics()
    for name in ("ttft_s", "tpot_s", "e2e_s", "itl_s", "itl_weight", "depth", "session_tok_s"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name
    # (not priced_steps: a run composes only the fronts no earlier run in the process did)
    assert (a.steps, a.expert_loads, a.dp_wait_ms, a.breakdown_ms) == (
        b.steps, b.expert_loads, b.dp_wait_ms, b.breakdown_ms)
    assert a.timelines.keys() == b.timelines.keys()
    for name, line in a.timelines.items():
        other = b.timelines[name]
        for part in ("time", "queue", "batch", "kv_use"):
            assert np.array_equal(getattr(line, part), getattr(other, part)), (name, part)


def counted(dep: Deployment, wl: Workload, **options: Any) -> tuple[SimResult, int]:
    """The result, and the SimPy events the run processed."""
    events = 0
    step = simpy.Environment.step

    def counting(env: simpy.Environment) -> None:
        nonlocal events
        events += 1
        step(env)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(simpy.Environment, "step", counting)
        res = simulate(dep, wl, options=SimOptions(**options))
    return res, events


@pytest.mark.parametrize("case", list(CASES))
def test_macro_steps_give_the_results_of_single_steps(case: str) -> None:
    dep, wl = CASES[case]
    single, single_events = counted(dep, wl, macro_steps=False)
    macro, macro_events = counted(dep, wl)
    assert_same(single, macro)
    assert macro_events < single_events
    if "preemption" in case:
        assert macro.preempted_requests > 0


def test_every_dp_wait_sampled_and_drawn_expert_loads() -> None:
    """DP waits priced on every step are counted step by step in a run; drawn expert loads
    differ each step, so those steps go one by one (and are the same)."""
    dep, wl = CASES["decode only, MTP"]
    assert_same(simulate(dep, wl, options=SimOptions(macro_steps=False, dp_wait_every=1)),
                simulate(dep, wl, options=SimOptions(dp_wait_every=1)))
    one, single = counted(dep, wl, expert_sampling="multinomial", macro_steps=False)
    res, macro = counted(dep, wl, expert_sampling="multinomial")
    assert macro == single
    assert_same(one, res)


# ---- parts -----------------------------------------------------------------------------------


def test_exact_sums_do_not_depend_on_order() -> None:
    rng = random.Random(0)
    terms = [rng.uniform(-1, 1) * 10.0 ** rng.randint(-8, 8) for _ in range(500)]
    forward, backward, counted_ = ExactSum(), ExactSum(), ExactSum()
    for x in terms:
        forward.add(x)
    for x in reversed(terms):
        backward.add(x)
    for x in terms[:250]:
        counted_.add(x)
    counted_.add(terms[250], 250)
    alike = ExactSum()
    for _ in range(250):
        alike.add(terms[250])
    for x in terms[:250]:
        alike.add(x)
    assert forward.value == backward.value == math.fsum(terms)
    assert counted_.value == alike.value
    assert ExactSum().value == 0.0


def test_a_run_ends_and_records_its_steps_as_the_clock_would() -> None:
    a, b, c = (np.array([x]) for x in (0.25, 0.5, 0.75))  # KV reserved on the one rank
    run = Run(0.1, 0.013, 5, queue=2, kv_used=a)
    clock = [0.1]
    for _ in range(5):
        clock.append(clock[-1] + 0.013)
    assert run.ends.tolist() == clock[1:] and run.end == clock[-1]
    assert run.done_by(clock[2]) == 1  # a boundary's own time: the step before it ends there
    assert run.done_by((clock[2] + clock[3]) / 2) == 2
    run.mark(0.1, 3, b)  # at the run's start: its first step has recorded already
    run.mark(clock[3], 4, c)  # at a boundary: the step starting there records it
    assert run.pieces(5) == [(0.1, 0, 1, 2, a), (clock[1], 1, 2, 3, b), (clock[3], 3, 2, 4, c)]
    assert run.pieces(2) == [(0.1, 0, 1, 2, a), (clock[1], 1, 1, 3, b)]
    for now, t in ((0.0, 1e-300), (1e-3, 0.3), (3.0, 3.0 + 1e-12), (0.1, 1e6)):
        d = delay_to(now, t)
        assert d >= 0 and now + d == t
    # no delay from 0.0977... lands on 0.2329...: the sums skip it; a second hop does
    now, t = 0.09773971578057337, 0.23291901197509332
    assert now + delay_to(now, t) < t < now + math.nextafter(delay_to(now, t), 1.0)
    clock = now
    for d in hops_to(now, t):
        clock += d
    assert clock == t and len(hops_to(now, t)) == 2


@pytest.mark.parametrize("accepted", [1.0, 1.8, 2.41])
def test_slots_step_alike_one_by_one_and_as_a_run(accepted: float) -> None:
    def filled() -> DecodeSlots:
        rng = np.random.default_rng(1)
        slots = DecodeSlots(3, 4, KvPool(3, 10**9, lambda: 0.0), accepted)
        for i in range(10):
            rank = i % 3
            slot = slots.reserve(rank, i, float(rng.integers(10, 5000)),
                                 float(rng.integers(1, 200)))
            assert slot is not None
            slots.activate(rank, slot, generated=float(i % 2))
        return slots

    one, run = filled(), filled()
    stepped = one.active.copy()
    steps = one.steps_to_finish(stepped)
    _, context = run.run_batch(stepped, steps)
    for i in range(steps):
        _, ctx = one.batch()
        assert np.array_equal(ctx, context[i])
        assert run.remaining(stepped, i) == one.remaining()
        _, finished, _ = one.advance(stepped, None)
        assert bool(finished.size) == (i == steps - 1)
    _, finished_run, _ = run.advance(stepped, None, steps)
    assert finished_run.tolist() == finished.tolist()
    assert np.array_equal(one.generated, run.generated)
    assert np.array_equal(one.context, run.context)
