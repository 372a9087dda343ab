"""Tests for simulator.des: hand-computable cases of the discrete-event simulation."""

from __future__ import annotations

import json
from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simpy

from simulator.calibration import load_calibration
from simulator.cost import (
    Batch,
    Instance,
    check_memory,
    instance_from_role,
    rank_memory,
    step_time,
)
from simulator.des import ExpertLoad, SimOptions, power_law_popularity, read_trace, simulate
from simulator.des.chunks import ChunkScheduler
from simulator.des.kvpool import KvPool
from simulator.des.prefix_cache import BlockLRU, cached_tokens
from simulator.des.pricing import StepPricer, pareto_front, round_bits
from simulator.des.sessions import to_runs
from simulator.des.slots import KV_ADMISSION, DecodeSlots
from simulator.des.transfer import KvNetwork
from simulator.specs.deployment import Deployment, RoleSpec, Speculative
from simulator.specs.errors import SpecError
from simulator.specs.hardware import load_hardware
from simulator.specs.model import load_model
from simulator.specs.topology import InstanceRequest, Topology
from simulator.specs.workload import (
    ClosedArrival,
    FixedLength,
    PoissonArrival,
    Sessions,
    TraceArrival,
    UniformLength,
    Workload,
)

DATA = Path(__file__).parent.parent / "data"
TRACE = DATA / "mooncake_conversation_50.jsonl"
MODEL = load_model("deepseek-v3")
H200 = load_hardware("h200")
CAL = load_calibration(H200)
UNIFORM = np.ones(MODEL.n_routed_experts)
"""Recorded expert counts that load every expert alike: EP ranks get equal shares."""


def pd(prefill: RoleSpec | None = None, decode: RoleSpec | None = None) -> Deployment:
    return Deployment(model="deepseek-v3", hardware="h200",
                      prefill=prefill or RoleSpec(dep=8), decode=decode or RoleSpec(dep=8))


def closed(n: int, concurrency: int, inp: int, out: int, **kw: object) -> Workload:
    return Workload(arrival=ClosedArrival(concurrency=concurrency), requests=n,
                    input_tokens=FixedLength(value=inp), output_tokens=FixedLength(value=out),
                    **kw)


def cost_instance(role: str, spec: RoleSpec, gb_s: float = 450.0) -> Instance:
    return instance_from_role(MODEL, H200, role, spec, "fp8", "fp8", a2a_gb_s=gb_s)


def one_rank_step(inst: Instance, decode: bool, tokens: int) -> float:
    """Seconds of a step in which rank 0 alone works (a decode request over `tokens` of context,
    or a prefill of `tokens`) while the other ranks idle in lock-step."""
    busy, idle = np.eye(inst.dp)[0], np.zeros(inst.dp)
    batch = (Batch(busy, busy * tokens, idle, idle, idle) if decode
             else Batch(idle, idle, busy * tokens, busy, idle))
    with np.errstate(divide="ignore"):  # the cost model takes log(0) for idle ranks' GEMMs
        return step_time(inst, batch, CAL).total_ms / 1e3


# ---- end-to-end, hand-computable ------------------------------------------------------------


def test_decode_only_throughput_is_batch_times_ranks_times_accepted_over_step_time() -> None:
    spec = RoleSpec(dep=8, speculative=Speculative(tokens=1, acceptance=0.8))
    batch, ranks, out, ctx = 16, 8, 36, 2000  # 36 tokens at 1.8 per step: 20 steps
    wl = closed(batch * ranks, batch * ranks, 100, out, mode="decode_only", context_tokens=ctx)
    res = simulate(pd(decode=spec), wl, expert_counts=UNIFORM)
    m = res.metrics()
    assert m["completed"] == batch * ranks and m["gpus"] == ranks
    assert m["prefill_input_tok_s_gpu"] is None
    accepted = 1 + 0.8
    step = step_time(cost_instance("decode", spec), Batch.decode(ranks, batch, ctx + out / 2),
                     CAL)
    assert step.tokens == pytest.approx(batch * ranks * accepted)
    expected = batch * ranks * accepted / (step.total_ms / 1e3) / ranks
    assert m["decode_output_tok_s_gpu"] == pytest.approx(expected, rel=0.01)
    assert res.steps == out / accepted
    assert m["cached_input_tokens"] == batch * ranks * ctx and m["uncached_input_tokens"] == 0


def test_lone_request_ttft_is_prefill_step_plus_kv_transfer_plus_first_decode_step() -> None:
    inp = 2048  # a power of two: the memoized pricing is exact
    res = simulate(pd(), closed(1, 1, inp, 10), expert_counts=UNIFORM)
    placement = Topology.build(H200, 16).place(
        [InstanceRequest("prefill-0", 8), InstanceRequest("decode-0", 8)])
    prefill = one_rank_step(cost_instance("prefill", RoleSpec(dep=8)), False, inp)
    kv_s = MODEL.kv_bytes(inp, "fp8") / (placement.transfer_gb_s("prefill-0", "decode-0") * 1e9)
    decode = one_rank_step(cost_instance("decode", RoleSpec(dep=8)), True, inp)
    expected = prefill + kv_s + decode
    assert res.ttft_s[0] == pytest.approx(expected, rel=1e-9)
    assert kv_s > 0
    # the serving stack's fixed latencies add to it exactly
    slow = simulate(pd(), closed(1, 1, inp, 10), expert_counts=UNIFORM,
                    options=SimOptions(api_overhead_ms=30.0, handoff_ms=120.0))
    assert slow.ttft_s[0] == pytest.approx(expected + 0.150, rel=1e-9)
    # and the API server's time per prompt token grows with the prompt: 2,048 tokens at 4 ms
    # per 1,000 tokens
    longer = simulate(pd(), closed(1, 1, inp, 10), expert_counts=UNIFORM,
                      options=SimOptions(api_overhead_ms=30.0, api_per_ktoken_ms=4.0,
                                         handoff_ms=120.0))
    assert longer.ttft_s[0] == pytest.approx(expected + 0.150 + 0.008192, rel=1e-9)


def test_the_time_per_prompt_token_is_paid_on_the_tokens_the_prefix_cache_does_not_hold():
    inp, per_ktoken = 2048, 4.0
    for hit in (0.0, 0.75):
        plain, slow = (simulate(pd(), closed(1, 1, inp, 10, prefix_hit_rate=hit),
                                expert_counts=UNIFORM,
                                options=SimOptions(api_per_ktoken_ms=k))
                       for k in (0.0, per_ktoken))
        computed = inp - int(hit * inp)
        assert slow.ttft_s[0] - plain.ttft_s[0] == pytest.approx(per_ktoken * computed / 1e6,
                                                                 rel=1e-6)


def test_without_prefix_caching_every_prompt_token_is_computed():
    inp = 2048
    on = simulate(pd(), closed(4, 1, inp, 10, prefix_hit_rate=0.75), expert_counts=UNIFORM)
    off = simulate(pd(RoleSpec(dep=8, prefix_caching=False)),
                   closed(4, 1, inp, 10, prefix_hit_rate=0.75), expert_counts=UNIFORM)
    assert on.metrics()["cache_hit_share"] == pytest.approx(0.75, abs=1e-3)
    assert off.metrics()["cache_hit_share"] == 0.0
    assert off.ttft_s.mean() > on.ttft_s.mean()


def _lockstep_ttft(tmp_path: Path, lengths: list[int]) -> np.ndarray:
    path = tmp_path / f"trace{len(lengths)}-{lengths[0]}.csv"
    rows = ["timestamp,input_length,output_length"] + [f"0,{n},1" for n in lengths]
    path.write_text("\n".join(rows) + "\n")
    wl = Workload(arrival=TraceArrival(path=str(path)), requests=len(lengths),
                  mode="prefill_only")
    res = simulate(pd(), wl, expert_counts=UNIFORM)
    assert res.metrics()["decode_output_tok_s_gpu"] is None
    return res.ttft_s


def test_one_long_request_on_one_rank_slows_every_rank(tmp_path: Path) -> None:
    even = _lockstep_ttft(tmp_path, [1000] * 8)  # one request per rank
    skewed = _lockstep_ttft(tmp_path, [8000] + [1000] * 7)  # the long one lands on rank 0
    assert np.ptp(even) == 0 and np.ptp(skewed) == 0  # one lock-step step ends them all
    assert skewed[1] > 2 * even[1]


def test_a_request_reaching_a_busy_engine_runs_in_the_step_after_the_next(
        tmp_path: Path) -> None:
    """The engines plan step k+1 while step k runs (vLLM's async scheduling, the overlap
    schedulers): a prompt that arrives during a decode step waits for that step and one more
    before its prefill. A request reaching an idle engine starts at once either way."""
    path = tmp_path / "two.csv"
    path.write_text("timestamp,input_length,output_length\n0,2048,400\n1000,2048,1\n")  # ms
    wl = Workload(arrival=TraceArrival(path=str(path)), requests=2)
    dep = Deployment(model="deepseek-v3", hardware="h200", aggregated=RoleSpec(dep=8))
    ahead, now = (simulate(dep, wl, expert_counts=UNIFORM,
                           options=SimOptions(schedule_ahead=flag)) for flag in (True, False))
    assert ahead.ttft_s[0] == now.ttft_s[0]  # the first found the engine idle
    step = one_rank_step(cost_instance("aggregated", RoleSpec(dep=8)), True, 2048 + 64)
    assert ahead.ttft_s[1] - now.ttft_s[1] == pytest.approx(step, rel=0.02)


def _run_trace(tmp_path: Path, dep: Deployment, rows: str) -> Any:
    """`dep` replaying trace `rows` (timestamp ms, prompt, output per line) at their
    timestamps, each engine planning a step only when the one before ends."""
    path = tmp_path / "trace.csv"
    path.write_text("timestamp,input_length,output_length\n" + rows)
    wl = Workload(arrival=TraceArrival(path=str(path)), requests=rows.count("\n"))
    return simulate(dep, wl, expert_counts=UNIFORM, options=SimOptions(schedule_ahead=False))


def test_sglang_takes_in_requests_every_recv_interval_decode_steps(tmp_path: Path) -> None:
    """With --scheduler-recv-interval 10, SGLang's scheduler takes in new requests after every
    10th decode step since its last prompt step: a prompt arriving in decode step 11 waits for
    step 20 to end (9 steps more than taking requests at every step), one arriving in step 20
    waits no longer."""
    dep = Deployment(model="deepseek-v3", hardware="h200", engine="sglang",
                     aggregated=RoleSpec(dep=8, recv_interval=10))
    every = dep.model_copy(update={"aggregated": RoleSpec(dep=8)})
    alone = _run_trace(tmp_path, dep, "0,2048,400\n")
    prefill = float(alone.ttft_s[0])  # the first prompt's step
    step = alone.metrics()["tpot_ms"]["mean"] / 1e3  # a decode step of that one request
    for arrives_in, extra in ((11, 9), (20, 0)):
        at_ms = (prefill + (arrives_in - 0.5) * step) * 1e3  # trace timestamps are in ms
        second = f"0,2048,400\n{at_ms:.6f},2048,1\n"
        late = (_run_trace(tmp_path, dep, second).ttft_s[1]
                - _run_trace(tmp_path, every, second).ttft_s[1])
        assert late == pytest.approx(extra * step, rel=0.02, abs=1e-6)


def test_sglang_computes_a_prompt_in_a_step_of_its_own_while_decode_waits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's scheduler runs a step of prompts alone whenever it can form one (prefill first,
    no --enable-mixed-chunk): a request decoding when another's prompt arrives gets no token in
    that step, so it ends one decode step later than where the prompt's step carries its row."""
    import simulator.des.engines as engines

    rows = "0,2048,400\n1000,8192,1\n"
    dep = Deployment(model="deepseek-v3", hardware="h200", engine="sglang",
                     aggregated=RoleSpec(dep=8))
    alone = _run_trace(tmp_path, dep, rows)
    monkeypatch.setitem(engines.BATCHING, "sglang",
                        engines.BATCHING["sglang"]._replace(mixed_steps=True))
    mixed = _run_trace(tmp_path, dep, rows)
    decode_step = one_rank_step(cost_instance("aggregated", RoleSpec(dep=8)), True, 2048 + 64)
    assert alone.e2e_s[0] - mixed.e2e_s[0] == pytest.approx(decode_step, rel=0.05)
    assert alone.ttft_s[1] <= mixed.ttft_s[1]


def test_redundant_experts_balance_ep_ranks_and_cost_kv_capacity() -> None:
    pop = power_law_popularity(np.random.default_rng(3), MODEL.moe_layers, 256)
    plain = ExpertLoad(pop, 8, 0, MODEL.top_k)
    eplb = ExpertLoad(pop, 8, 32, MODEL.top_k)
    assert plain.expected_imbalance > 0.1
    assert eplb.expected_imbalance < plain.expected_imbalance / 10
    per_rank, _ = plain.step(1000)
    assert per_rank.sum() == pytest.approx(1000 * MODEL.top_k)
    assert per_rank.max() / per_rank.mean() == pytest.approx(1 + plain.expected_imbalance,
                                                              rel=0.2)

    wl = closed(64, 64, 100, 4, mode="decode_only")
    runs = {r: simulate(pd(decode=RoleSpec(dep=8, redundant_experts=r)), wl) for r in (0, 32)}
    assert runs[32].metrics()["expert_imbalance"] < runs[0].metrics()["expert_imbalance"]
    kv = {r: res.instances["decode-0"].kv_tokens_per_rank for r, res in runs.items()}
    assert kv[32] < kv[0]
    assert kv[0] == check_memory("decode", MODEL, H200, RoleSpec(dep=8), "fp8", "fp8").kv_tokens


def test_same_seed_gives_identical_json_and_another_seed_does_not() -> None:
    wl = Workload(arrival=PoissonArrival(rate=20), requests=40,
                  input_tokens=UniformLength(low=200, high=3000),
                  output_tokens=UniformLength(low=5, high=60), prefix_hit_rate=0.3, seed=5)
    dep = pd(prefill=RoleSpec(instances=2, dep=8))
    a, b = (json.dumps(simulate(dep, wl).metrics(), sort_keys=True) for _ in range(2))
    assert a == b
    c = json.dumps(simulate(dep, wl.model_copy(update={"seed": 6})).metrics(), sort_keys=True)
    assert c != a


def test_trace_replay_reads_mooncake_rows_and_finds_prefix_hits() -> None:
    trace = read_trace(TRACE)
    assert len(trace) == 50 and trace.blocks[0] is not None
    assert read_trace(TRACE, time_scale=2.0).arrival_s[-1] == pytest.approx(
        2 * trace.arrival_s[-1])
    wl = Workload(arrival=TraceArrival(path=str(TRACE)), requests=50)
    m = simulate(pd(), wl).metrics()
    assert m["completed"] == 50
    assert m["cached_input_tokens"] > 0
    assert m["cached_input_tokens"] + m["uncached_input_tokens"] == int(trace.input_len.sum())
    assert m["output_tokens"] == int(trace.output_len.sum())


def test_a_trace_replayed_at_a_concurrency_takes_rows_in_file_order_with_their_blocks(
        tmp_path: Path) -> None:
    """AIPerf's and `vllm bench serve`'s trace replay: N users, each the file's next row when
    its last ends, timestamps absent or ignored; a row repeating an earlier row's blocks hits
    the prefix cache for exactly those blocks once that row has been computed."""
    path = tmp_path / "agentic.jsonl"
    rows = [{"input_length": 1024, "output_length": 8, "hash_ids": [0, 1]},
            {"input_length": 1536, "output_length": 8, "hash_ids": [0, 1, 2]},
            {"input_length": 2048, "output_length": 8, "hash_ids": [7, 8, 9, 10]},
            {"timestamp": 99_000, "input_length": 600, "output_length": 8, "hash_ids": [7, 8]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SpecError, match="lacks 'timestamp'"):
        read_trace(path)  # a timed replay needs them
    trace = read_trace(path, in_order=True)
    assert trace.input_len.tolist() == [1024, 1536, 2048, 600]  # file order, not by time
    dep = Deployment(model="deepseek-v3", hardware="h200", aggregated=RoleSpec(dep=8))

    def replay(users: int) -> Any:
        wl = Workload(arrival=TraceArrival(path=str(path), concurrency=users), requests=4)
        return simulate(dep, wl, expert_counts=UNIFORM)

    m = replay(1).metrics()
    assert m["completed"] == 4
    # one user: each row after the last ends, so rows 2 and 4 find their prefixes computed
    # (prefix-aware routing sends them to the rank that holds them): row 2 its two blocks,
    # row 4 all of its 600 tokens but the last, which is computed to sample from
    assert m["cached_input_tokens"] == 2 * 512 + 599
    assert m["uncached_input_tokens"] == 1024 + 1536 + 2048 + 600 - m["cached_input_tokens"]
    four = replay(4).metrics()  # all at once: nothing is computed before the others arrive
    assert four["cached_input_tokens"] == 0 and four["completed"] == 4


def test_sessions_hit_the_prefix_cache_with_the_previous_context() -> None:
    wl = closed(12, 4, 1000, 100, sessions=Sessions(turns=3))
    m = simulate(pd(), wl).metrics()
    # Prompts 1000, 2100, 3200: turn 2 reuses 1 full block of turn 1, turn 3 reuses 4 of turn 2.
    assert m["cached_input_tokens"] == 4 * (512 + 4 * 512)
    assert m["uncached_input_tokens"] == 4 * (1000 + 2100 + 3200) - m["cached_input_tokens"]
    with pytest.raises(SpecError, match="sessions cannot be combined with trace"):
        simulate(pd(), Workload(arrival=TraceArrival(path=str(TRACE)),
                                sessions=Sessions(turns=2)))


def test_aggregated_lone_request_gets_its_first_token_from_the_prefill_step() -> None:
    spec = RoleSpec(dep=8)
    dep = Deployment(model="deepseek-v3", hardware="h200", aggregated=spec)
    res = simulate(dep, closed(1, 1, 2048, 3), expert_counts=UNIFORM)
    prefill = one_rank_step(cost_instance("aggregated", spec), False, 2048)
    assert res.ttft_s[0] == pytest.approx(prefill, rel=1e-9)
    m = res.metrics()
    assert m["prefill_input_tok_s_gpu"] is None and m["decode_output_tok_s_gpu"] is None
    assert m["output_tokens"] == 3 and res.steps == 3  # prefill (token 1) + 2 decode steps


def test_aggregated_serves_many_in_mixed_steps() -> None:
    dep = Deployment(model="deepseek-v3", hardware="h200", aggregated=RoleSpec(dep=8))
    res = simulate(dep, closed(64, 32, 3000, 20))
    assert res.completed == 64
    assert res.timelines["aggregated-0"].batch.max() > 8


def test_full_decode_kv_makes_requests_wait_for_admission() -> None:
    spec = RoleSpec(dep=8)
    mem = rank_memory(MODEL, H200, spec, "fp8", "fp8")
    util = (mem.weights + mem.activations + mem.reserve + 20_000 * mem.kv_bytes_per_token) / (
        H200.hbm_bytes)
    small = RoleSpec(dep=8, gpu_memory_utilization=round(util, 4))
    wl = closed(64, 64, 100, 50, mode="decode_only", context_tokens=4000)  # 4 of 8 per rank fit
    tight = simulate(pd(decode=small), wl)
    roomy = simulate(pd(decode=spec), wl)
    assert tight.completed == roomy.completed == 64
    assert roomy.kv_admission_wait_s == 0
    assert tight.kv_admission_wait_s > 0
    assert tight.timelines["decode-0"].kv_use.max() <= 1.0
    assert tight.duration_s > roomy.duration_s



def test_vllm_admits_on_the_prompt_and_preempts_the_last_admitted_when_kv_runs_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An aggregated vLLM instance whose KV holds every prompt but not every whole output admits
    all users at once and, as outputs grow, gives the requests admitted last back to the prompt
    queue to recompute (vLLM's preemption); reserving the whole length instead makes the later
    users wait for admission. Both serve every token."""
    mem = rank_memory(MODEL, H200, RoleSpec(dep=8), "fp8", "fp8")
    util = (mem.weights + mem.activations + mem.reserve + 12_000 * mem.kv_bytes_per_token) / (
        H200.hbm_bytes)
    dep = Deployment(model="deepseek-v3", hardware="h200",
                     aggregated=RoleSpec(dep=8, gpu_memory_utilization=round(util, 4)))
    wl = closed(64, 64, 1000, 1000)  # 8 a rank: 8,000 prompt tokens fit, 16,000 do not
    optimistic = simulate(dep, wl, expert_counts=UNIFORM)
    monkeypatch.setitem(KV_ADMISSION, "vllm", "whole")
    whole = simulate(dep, wl, expert_counts=UNIFORM)
    m, w = optimistic.metrics(), whole.metrics()
    assert optimistic.completed == whole.completed == 64
    assert m["output_tokens"] == w["output_tokens"] == 64 * 1000
    assert m["preempted_requests"] > 0 and w["preempted_requests"] == 0
    assert m["kv_admission_wait_s"] < w["kv_admission_wait_s"]
    assert m["ttft_ms"]["mean"] < w["ttft_ms"]["mean"]


def test_optimistic_slots_grow_by_the_tokens_and_give_back_the_last_admitted() -> None:
    kv = KvPool(1, 1_000, lambda: 0.0)
    slots = DecodeSlots(1, 4, kv, admission="optimistic")
    a, b, c = (slots.reserve(0, rid, 300, 500) for rid in (7, 8, 9))
    assert None not in (a, b, c) and kv.used[0] == 900  # the prompts alone
    for slot in (a, b):
        assert slot is not None
        slots.activate(0, slot, generated=1.0)
    assert slots.steps_to_full(slots.active) == 50  # 100 tokens free, 2 a step
    slots.advance(slots.active.copy(), None, steps=50)
    assert kv.used[0] + kv.grown[0] == 1_000 and slots.preempt(0) == []
    slots.advance(slots.active.copy(), None)
    assert kv.used[0] == 900 and kv.grown[0] == 102 and kv.over().tolist() == [0]
    assert slots.preempt(0) == [(8, 52.0)]  # admitted after 7; c is not decoding yet
    assert (kv.used[0], kv.grown[0]) == (600, 51) and slots.active.sum() == 1
    kv.used[0] += 1_000  # however full, the last decoding request keeps its KV
    assert slots.preempt(0) == []
    with pytest.raises(ValueError, match="one of whole, optimistic, estimate"):
        DecodeSlots(1, 4, kv, admission="lazy")


def test_estimate_slots_admit_a_prompt_beside_a_share_of_the_outputs_to_come() -> None:
    """SGLang's admission: a prompt fits beside 0.7 of every held request's output left, each
    clipped at 4,096 tokens; what it holds is its prompt, grown step by step as optimistic."""
    def admitted(kind: str) -> list[int | None]:
        slots = DecodeSlots(1, 4, KvPool(1, 10_000, lambda: 0.0), admission=kind)
        return [slots.reserve(0, rid, 1_000, 8_000) for rid in (1, 2, 3)]

    assert admitted("whole")[1] is None  # 9,000 + 9,000 > 10,000
    # 1,000 held + 1,000 + 0.7 x (4,096 + 4,096) = 7,734 fits; a third needs 11,602
    assert admitted("estimate")[:2] != [None, None] and admitted("estimate")[2] is None
    assert None not in admitted("optimistic")
    kv = KvPool(1, 10_000, lambda: 0.0)
    slots = DecodeSlots(1, 4, kv, admission="estimate")
    slot = slots.reserve(0, 1, 1_000, 8_000)
    assert slot is not None and kv.used[0] == 1_000
    slots.activate(0, slot, generated=1.0)
    slots.advance(slots.active.copy(), None, steps=10)
    assert kv.grown[0] == 10 and slots.steps_to_full(slots.active) == 8_990

def test_prefill_only_counts_prefill_gpus_and_one_output_token() -> None:
    dep = pd(prefill=RoleSpec(instances=2, dep=8))
    m = simulate(dep, closed(32, 16, 4000, 500, mode="prefill_only")).metrics()
    assert m["gpus"] == 16 and m["decode_output_tok_s_gpu"] is None
    assert m["output_tokens"] == 32 and m["tpot_ms"]["p50"] is None
    assert m["prefill_input_tok_s_gpu"] == pytest.approx(32 * 4000 / m["duration_s"] / 16)


def test_progress_and_timelines() -> None:
    seen: list[float] = []
    res = simulate(pd(), closed(20, 8, 500, 5), progress=seen.append)
    assert seen[-1] == 1.0 and seen == sorted(seen)
    assert set(res.timelines) == {"prefill-0", "decode-0"}
    for tl in res.timelines.values():
        assert np.all(np.diff(tl.time) >= 0) and len(tl.time) == len(tl.kv_use)


def test_multinomial_expert_sampling_is_seeded() -> None:
    opts = SimOptions(expert_sampling="multinomial")
    a, b = (simulate(pd(), closed(8, 8, 500, 5), options=opts).metrics() for _ in range(2))
    assert a == b and a["expert_imbalance"] > 0


# ---- parts -----------------------------------------------------------------------------------


def test_pricer_matches_the_cost_model_on_a_ragged_batch() -> None:
    inst = cost_instance("decode", RoleSpec(dep=8))
    rng = np.random.default_rng(1)
    n, ctx = rng.integers(20, 60, 8).astype(float), rng.uniform(1000, 3000, 8)
    z = np.zeros(8)
    experts = np.full(8, n.sum() * MODEL.top_k / 8)
    pricer = StepPricer(inst, CAL)
    got = pricer.price(n, ctx, z, z, z, experts)
    want = step_time(inst, Batch(n, ctx, z, z, z, expert_tokens=experts), CAL)
    assert got.total_ms == pytest.approx(want.total_ms, rel=0.01)
    assert pricer.price(n + 0.1, ctx, z, z, z, experts) is got  # same signature: memoized
    assert pricer.accepted_per_request == 1.0


def test_rounding_and_pareto_front() -> None:
    assert list(round_bits(np.array([0.0, 51, 63, 2000, 2048]), 6)) == [0, 51, 63, 1984, 2048]
    rows = np.array([[1, 5], [2, 4], [1, 4], [2, 4], [0, 0]], dtype=float)
    assert pareto_front(rows).tolist() == [[1, 5], [2, 4]]


def test_kv_transfers_share_the_link() -> None:
    env = simpy.Environment()
    net = KvNetwork(env, lambda src, dst, k: 10.0 / k)  # 10 GB/s shared by k transfers
    done: dict[str, float] = {}

    def start(name: str, nbytes: float, at: float) -> Generator[simpy.Event, object, None]:
        yield env.timeout(at)
        yield net.send("p", "d", nbytes)
        done[name] = env.now

    env.process(start("a", 1e9, 0.0))
    env.process(start("b", 1e9, 0.0))
    env.process(start("c", 1e9, 1.0))
    env.run()
    assert done["a"] == pytest.approx(0.2) and done["b"] == pytest.approx(0.2)
    assert done["c"] == pytest.approx(1.1)


def test_prefix_lru_stops_at_the_first_miss_and_evicts_oldest() -> None:
    lru = BlockLRU(3)
    lru.insert(to_runs([1, 2, 3]))
    assert lru.hits(to_runs([1, 2, 9, 3])) == 2
    lru.insert(to_runs([4]))  # evicts 3: the hit run's tail, older than 4
    assert lru.hits(to_runs([1, 2, 3])) == 2 and len(lru) == 3
    assert cached_tokens(4, 2048) == 2047 and cached_tokens(1, 2048) == 512


def test_chunked_prefill_splits_a_long_prompt_over_steps() -> None:
    sched = ChunkScheduler(2, 8192, 256, lambda rank, rid: 0)
    assert sched.enqueue(0, 20000, 0) == 0 and sched.enqueue(1, 100, 0) == 1
    plans = []
    while sched.has_work():
        plan = sched.plan()
        plans.append(plan.tokens.tolist())
        sched.advance(plan)
    assert plans == [[8192, 100], [8192, 0], [3616, 0]]


def test_the_long_prefill_threshold_shares_a_step_with_the_prompts_behind() -> None:
    """vLLM's --long-prefill-token-threshold 4096 with a 16,384-token budget: a 20,000-token
    prompt computes 4,096 tokens a step and the prompts queued behind it take the rest, where
    without it the long prompt takes the whole step and they wait."""
    def steps(cap: int) -> list[list[int]]:
        sched = ChunkScheduler(1, 16384, 256, lambda rank, rid: 0, cap)
        for rid, n in enumerate((20000, 3000, 9000)):
            sched.enqueue(rid, n, 0, rank=0)
        out = []
        while sched.has_work():
            plan = sched.plan()
            out.append([take for _, take in plan.chunks[0]])
            sched.advance(plan)
        return out

    assert steps(4096) == [[4096, 3000, 4096], [4096, 4096], [4096, 808], [4096], [3616]]
    assert steps(0) == [[16384], [3616, 3000, 9000]]


def test_a_slot_activated_during_a_step_joins_the_next_one() -> None:
    kv = KvPool(1, 10_000, lambda: 0.0)
    slots = DecodeSlots(1, 4, kv)
    a = slots.reserve(0, 7, 100, 3)
    b = slots.reserve(0, 8, 100, 3)
    assert a is not None and b is not None and kv.used[0] == 206
    slots.activate(0, a)
    stepped, fresh = slots.active.copy(), slots.fresh.copy()  # the step is planned
    slots.activate(0, b)  # b's KV arrives mid-step
    first, finished, _ = slots.advance(stepped, fresh)
    assert first.tolist() == [7] and not finished.size
    assert slots.generated[0, a] == 1 and slots.generated[0, b] == 0
    for _ in range(2):
        _, finished, ranks = slots.advance(slots.active.copy(), slots.fresh.copy())
    assert finished.tolist() == [7] and ranks == [0] and kv.used[0] == 103


def test_a_finished_request_gives_back_the_pool_tokens_its_context_cost() -> None:
    """Where a request costs the pool more than its context (a window, per-request state: V4,
    gpt-oss, Qwen3.5), what it reserved comes back whole when it finishes, by a decode step or
    at once; the pool is empty again, not left holding each request's fixed part."""
    kv = KvPool(1, 10_000, lambda: 0.0, cost=lambda context: context + 1_000)
    slots = DecodeSlots(1, 4, kv)
    a = slots.reserve(0, 7, 100, 2)
    b = slots.reserve(0, 8, 300, 1)
    assert a is not None and b is not None and kv.used[0] == (1_102 + 1_301)
    slots.activate(0, a)
    for _ in range(2):
        _, finished, _ = slots.advance(slots.active.copy(), slots.fresh.copy())
    assert finished.tolist() == [7] and kv.used[0] == 1_301
    slots.finish_now(0, b)
    assert kv.used[0] == 0


def test_csv_trace_with_hash_ids_and_bad_traces(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text('timestamp,input_length,output_length,hash_ids\n'
                    '1000,600,5,"[0, 1]"\n0,100,2,\n')
    trace = read_trace(path, time_scale=0.5)
    assert trace.arrival_s.tolist() == [0.0, 0.5]  # sorted by time, scaled
    assert trace.blocks == [None, (0, 1)] and trace.input_len.tolist() == [100, 600]
    (tmp_path / "bad.csv").write_text("timestamp,input_length\n0,5\n")
    with pytest.raises(SpecError, match="lacks the column"):
        read_trace(tmp_path / "bad.csv")
    with pytest.raises(SpecError, match="does not exist"):
        read_trace(tmp_path / "missing.jsonl")


def test_a_trace_is_read_once_until_its_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("timestamp,input_length,output_length\n0,100,2\n")
    first = read_trace(path)
    assert read_trace(path) is first  # the check before a run and the run share one read
    with pytest.raises(ValueError):
        first.input_len[0] = 1  # shared, so read-only
    path.write_text("timestamp,input_length,output_length\n0,100,2\n5,300,4\n")
    assert read_trace(path).input_len.tolist() == [100, 300]


def test_trace_sessions_carry_their_context_into_prefix_blocks(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("timestamp,input_length,output_length,session_id\n"
                    "0,1024,512,a\n10,300,20,b\n2000,2048,100,a\n")
    trace = read_trace(path)
    first, other, second = trace.blocks
    assert first is not None and second is not None and other is not None
    assert len(first) == 2 and len(second) == 4
    assert second[:3] == (*first, second[2]) and second[2] not in first  # turn 1 + its output
    assert not set(other) & set(second)


def test_a_single_role_prefill_deck_simulates_and_a_serve_deck_is_refused():
    from simulator.specs.deployment import Deployment
    from simulator.specs.workload import ClosedArrival, FixedLength, Workload
    dep = Deployment(model="deepseek-v3", hardware="h200",
                     prefill={"instances": 1, "dep": 8})
    bench = Workload(arrival=ClosedArrival(concurrency=16), requests=32,
                     input_tokens=FixedLength(value=2048), output_tokens=FixedLength(value=1),
                     mode="prefill_only")
    out = simulate(dep, bench).metrics()
    assert out["completed"] == 32 and out["gpus"] == 8
    assert out["prefill_input_tok_s_gpu"] > 0 and out["decode_output_tok_s_gpu"] is None
    with pytest.raises(SpecError, match=r"only prefill instances.*mode prefill_only.*serve"):
        simulate(dep, bench.model_copy(update={"mode": "serve"}))


def test_dp_imbalance_is_the_time_ranks_wait_for_a_busier_one():
    from simulator.specs.deployment import Deployment
    from simulator.specs.workload import ClosedArrival, FixedLength, LognormalLength, Workload
    dep = Deployment(model="deepseek-v3", hardware="h200", prefill={"instances": 1, "dep": 8})

    def run(lengths, every: int = 1) -> float:
        w = Workload(arrival=ClosedArrival(concurrency=8), requests=8, input_tokens=lengths,
                     output_tokens=FixedLength(value=1), mode="prefill_only")
        out = simulate(dep, w, options=SimOptions(dp_wait_every=every)).metrics()
        assert 0.0 <= out["dp_imbalance"] < 1.0
        return out["dp_imbalance"]

    even = run(FixedLength(value=4096))
    uneven = run(LognormalLength(median=4096, sigma=1.0, max=16384))
    assert even == pytest.approx(0.0, abs=1e-9) and uneven > 0.05
    # the default prices the wait on the first and every 32nd step, scaled to all steps
    assert 0.0 < run(LognormalLength(median=4096, sigma=1.0, max=16384), every=32) < 1.0


def test_dp_waits_settled_together_are_the_waits_settled_one_by_one(monkeypatch):
    """An engine keeps its sampled steps and prices their DP waits together (in batches, and
    at the end of the run): the same dp_imbalance as pricing each sampled step at once."""
    from simulator.des import engines
    from simulator.specs.deployment import Deployment
    from simulator.specs.workload import ClosedArrival, LognormalLength, Workload
    dep = Deployment(model="deepseek-v3", hardware="h200", prefill={"instances": 1, "dep": 8},
                     decode={"instances": 1, "dep": 8})
    w = Workload(arrival=ClosedArrival(concurrency=32), requests=96,
                 input_tokens=LognormalLength(median=2048, sigma=1.0, max=16384),
                 output_tokens=LognormalLength(median=64, sigma=0.5, max=256))

    def imbalance() -> float:
        return float(simulate(dep, w, options=SimOptions(dp_wait_every=4)).metrics()[
            "dp_imbalance"])

    together = imbalance()
    monkeypatch.setattr(engines, "WAITS_HELD", 1)  # each sampled step priced as it comes
    assert imbalance() == together > 0.0


def test_ranks_with_equal_tokens_still_wait_for_a_longer_cached_prefix():
    """The wait follows each rank's attention work, not its token count: two ranks computing
    4096 tokens each, one after a 64K cached prefix, the other cold."""
    from simulator.cost.step import Instance
    from simulator.des.pricing import StepPricer
    from simulator.specs.hardware import load_hardware
    from simulator.specs.model import load_model

    hw = load_hardware("h200")
    inst = Instance(model=load_model("deepseek-v3"), hardware=hw, role="prefill", ranks=2,
                    expert_parallel=True)
    pricer = StepPricer(inst, load_calibration(hw, "vllm"))
    zero, tokens, one = np.zeros(2), np.array([4096.0, 4096.0]), np.ones(2)
    assert pricer.dp_wait(zero, zero, tokens, one, np.zeros(2)) == 0.0
    wait = pricer.dp_wait(zero, zero, tokens, one, np.array([65536.0, 0.0]))
    step = pricer.price(zero, zero, tokens, one, np.array([65536.0, 0.0]), None)
    assert 0.0 < wait < step.breakdown["attention"]


def test_ranks_wait_for_a_busier_ranks_work_outside_attention_too():
    """Lock-step ranks meet at every exchange: a rank computing fewer prompt tokens waits for
    the busier one's attention and its mHC, shared experts, router and logits, so the wait
    exceeds the two ranks' attention difference (V4-Flash prefill, DEP2, both cold)."""
    from simulator.cost import Batch, step_time
    from simulator.cost.step import Instance
    from simulator.des.pricing import StepPricer
    from simulator.specs.hardware import load_hardware
    from simulator.specs.model import load_model

    hw = load_hardware("gb300")
    cal = load_calibration(hw, "vllm")
    inst = Instance(model=load_model("deepseek-v4-flash"), hardware=hw, role="prefill",
                    ranks=2, expert_parallel=True, weights="fp4")
    zero, one = np.zeros(2), np.ones(2)

    def uniform(tokens: float) -> dict[str, float]:
        return step_time(inst, Batch(zero, zero, np.full(2, tokens), one, zero), cal).breakdown

    wait = StepPricer(inst, cal).dp_wait(zero, zero, np.array([4096.0, 1024.0]), one, zero)
    attention = uniform(4096.0)["attention"] - uniform(1024.0)["attention"]
    assert wait > attention * 1.05 > 0.0


def test_spread_clients_leave_the_lock_step_waves_of_a_burst():
    from simulator.specs.deployment import Deployment
    from simulator.specs.workload import ClosedArrival, FixedLength, Workload
    dep = Deployment(model="deepseek-v3", hardware="h200", aggregated={"dep": 8})

    def run(start: str):
        w = Workload(arrival=ClosedArrival(concurrency=32, start=start), requests=320,
                     input_tokens=FixedLength(value=1024), output_tokens=FixedLength(value=256))
        return simulate(dep, w)

    burst, spread = run("burst"), run("spread")
    assert spread.completed == burst.completed == 320
    # a burst keeps every user in one lock-step wave (all TTFTs alike, each prompt queued
    # behind the others); spread users arrive apart and mostly find the prefill free
    assert np.ptp(burst.ttft_s) < 1e-9 < np.ptp(spread.ttft_s)
    assert spread.ttft_s.mean() < 0.9 * burst.ttft_s.mean()
    assert run("spread").metrics() == spread.metrics()  # still deterministic


@pytest.mark.parametrize("router", ["least_requests", "kv_router"])
def test_a_new_request_goes_to_the_dp_rank_with_room_not_the_first_without_prompts(
        router: str) -> None:
    """With one slot a rank and every user's next request sent as its last ends, each request
    goes to the rank that just freed its slot and starts at once: an aggregated DEP instance
    picks the rank for a request no router placed as the engine's DP balancer does (vLLM:
    least 4 x waiting + running), and Dynamo's KV router (`kv_router`) counts the KV each
    rank's requests in flight hold. (By queued prompt work alone every rank ties, the first
    takes it, and it waits there for that rank's own request to end.)"""
    dep = Deployment(model="deepseek-v3", hardware="h200", engine="vllm",
                     aggregated=RoleSpec(dep=8, max_num_seqs=1, router=router))
    wl = Workload(arrival=ClosedArrival(concurrency=8), requests=48,
                  input_tokens=FixedLength(value=512),
                  output_tokens=UniformLength(low=100, high=300), seed=1)
    res = simulate(dep, wl, expert_counts=UNIFORM)
    assert res.completed == 48
    decode = res.e2e_s - res.ttft_s
    assert res.ttft_s.max() < 0.5 * decode.min()  # nobody waited for another's decode


def _fourth_waits(tmp_path: Path, dep: Deployment) -> bool:
    """`dep` (gpt-oss-120b) replaying requests of 30,000, 100 and 100 prompt tokens of 3,000
    output each, then one of 100 four seconds later: whether the last waited for a slot (its
    TTFT above half of another's decode)."""
    path = tmp_path / "trace.csv"
    path.write_text("timestamp,input_length,output_length\n"
                    "0,30000,3000\n1,100,3000\n2,100,3000\n4000,100,50\n")
    res = simulate(dep, Workload(arrival=TraceArrival(path=str(path)), requests=4),
                   expert_counts=np.ones((1, 128)))
    assert res.completed == 4
    return bool(res.ttft_s[3] > 0.5 * (res.e2e_s[1] - res.ttft_s[1]))


@pytest.mark.parametrize(("router", "waits"), [("prefix_aware", False), ("kv_router", True)])
def test_kv_router_weighs_the_kv_a_rank_holds_not_its_free_slots(
        tmp_path: Path, router: str, waits: bool) -> None:
    """Rank 0 decodes one request of 30,000 tokens, rank 1 two of 100, its two slots full. A
    new request: prefix_aware (equal prompt work) takes the rank with fewer requests in
    flight, where a slot is free; Dynamo's KV router (`kv_router`) takes the one holding less
    KV and waits there for a slot."""
    dep = Deployment(model="gpt-oss-120b", hardware="h200", engine="vllm",
                     aggregated=RoleSpec(dep=2, max_num_seqs=2, router=router))
    assert _fourth_waits(tmp_path, dep) == waits


@pytest.mark.parametrize(("router", "waits"), [("least_requests", False), ("kv_router", True)])
def test_kv_router_picks_the_decode_instance_holding_less_kv(
        tmp_path: Path, router: str, waits: bool) -> None:
    """P/D with two decode instances of two slots, and requests of 30,000, 100 and 100 prompt
    tokens, then a fourth. least_requests spreads them by count, and the fourth finds a free
    slot; Dynamo's KV router (`kv_router`, its decode branch: the KV in flight) puts both short
    ones beside each other, away from the long one's KV, and the fourth too, where it waits for
    a slot."""
    spec = RoleSpec(instances=2, tp=1, max_num_seqs=2, router=router)
    dep = Deployment(model="gpt-oss-120b", hardware="h200", engine="vllm",
                     prefill=RoleSpec(tp=1), decode=spec)
    assert _fourth_waits(tmp_path, dep) == waits


def _balanced_run(balance: bool) -> Any:
    spec = RoleSpec(dep=8, max_num_seqs=8, attention_dp_balance=balance)
    dep = Deployment(model="deepseek-v3", hardware="h200", engine="trtllm", aggregated=spec)
    wl = Workload(arrival=ClosedArrival(concurrency=64), requests=256,
                  input_tokens=UniformLength(low=6553, high=8192),
                  output_tokens=UniformLength(low=200, high=256), seed=0)
    return simulate(dep, wl, expert_counts=UNIFORM)


def test_attention_dp_balance_releases_prompts_when_its_running_count_times_out(
        tmp_path: Path) -> None:
    """TensorRT-LLM counts the steps in which not every rank has a prompt to start, whether or
    not a prompt waits, and releases the held ones when the count reaches 60 (then starts from
    0): a prompt arriving in the 20th decode step after the count last started waits ~39 steps,
    one arriving in the 80th (the count then at 20) as long; not 60 steps each."""
    dep = Deployment(model="deepseek-v3", hardware="h200", engine="trtllm",
                     aggregated=RoleSpec(dep=8, attention_dp_balance=True))
    free = dep.model_copy(update={"aggregated": RoleSpec(dep=8)})
    both = "0,2048,400\n" * 8  # a prompt on each rank: started at once, the count at 0
    alone = _run_trace(tmp_path, free, both)
    prefill = float(alone.ttft_s[0])
    step = alone.metrics()["tpot_ms"]["mean"] / 1e3
    for arrives_in in (20, 80):
        at_ms = (prefill + (arrives_in - 0.5) * step) * 1e3
        rows = both + f"{at_ms:.6f},2048,1\n"
        late = (_run_trace(tmp_path, dep, rows).ttft_s[8]
                - _run_trace(tmp_path, free, rows).ttft_s[8])
        assert late == pytest.approx((59 - arrives_in % 60) * step, abs=1.5 * step)


def test_attention_dp_balance_prefills_the_ranks_together() -> None:
    """TensorRT-LLM's attention-DP balance holds a rank's new prompt until every rank has one
    (or 60 steps pass): fewer decode steps stall behind one rank's prefill, so TPOT falls and
    TTFT rises; every request still finishes."""
    free, held = _balanced_run(False), _balanced_run(True)
    assert free.completed == held.completed == 256
    f, h = free.metrics(), held.metrics()
    assert h["tpot_ms"]["mean"] < 0.8 * f["tpot_ms"]["mean"]
    assert h["ttft_ms"]["mean"] > f["ttft_ms"]["mean"]
