"""AgentX session trees in the simulation: prefix hits from the traffic, per-rank LRU caches and
the host tier, routing that knows where KV lives, subagent joins, and warmup turns kept out of
the metrics. Numbers by hand on small traces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simulator.des import simulate
from simulator.des.prefix_cache import BlockLRU, RankCaches
from simulator.des.sessions import Agent, SessionTrace, Turn, to_runs
from simulator.des.simulate import SimOptions, _Run
from simulator.des.weka import write_weka
from simulator.specs.agentx import AgentxShape, Lognormal
from simulator.specs.deployment import Deployment, RoleSpec
from simulator.specs.workload import Sessions, SessionsArrival, Workload

BLOCK = 64


def turn(t: float, blocks: int, out: int = 10, think: float = 0.0) -> Turn:
    """A turn whose prompt is `blocks` whole 64-token blocks, ids 0.. in order (so each turn of
    an agent extends the previous one's prompt)."""
    return Turn(t_s=t, input_len=blocks * BLOCK, output_len=out,
                blocks=to_runs(range(blocks)), think_s=think, api_s=0.5)


def trace_file(tmp_path: Path, *traces: SessionTrace) -> str:
    path = tmp_path / "traces.jsonl"
    write_weka(list(traces), path)
    return str(path)


def deployment(prefill_instances: int = 1, router: str | None = None) -> Deployment:
    """DeepSeek-V3 on H200: TP8 prefill instances (one DP rank each: one prefix cache each)
    and one DEP8 decode instance."""
    return Deployment(model="deepseek-v3", hardware="h200",
                      prefill=RoleSpec(instances=prefill_instances, tp=8, router=router),
                      decode=RoleSpec(dep=8))


def run(dep: Deployment, path: str, requests: int, **arrival: object) -> _Run:
    wl = Workload(arrival=SessionsArrival(traces=path, **{"concurrency": 1, "start": "turn0",
                                                           **arrival}), requests=requests)
    r = _Run(dep, wl, None, None, None, SimOptions())
    r.result()
    return r


THREE_TURNS = SessionTrace("three", BLOCK, (Agent((turn(0, 10), turn(5, 15), turn(10, 20))),))
"""Prompts of 640, 960 and 1280 tokens, each the previous one plus 5 new blocks."""


def test_a_turn_repeating_the_previous_turns_blocks_hits_exactly_those(tmp_path: Path) -> None:
    path = trace_file(tmp_path, SessionTrace("two", BLOCK, (Agent((turn(0, 10), turn(5, 15))),)))
    r = run(deployment(), path, 2)
    t = r.table
    assert t.cached[:2].tolist() == [0, 10 * BLOCK]  # turn 2 hits turn 1's ten blocks
    assert t.uncached[:2].tolist() == [640, 320]


def test_lru_evicts_the_least_recently_used_blocks_tails_first() -> None:
    lru = BlockLRU(8)
    lru.insert(to_runs(range(0, 4)))      # prompt A: blocks 0-3
    lru.insert(to_runs(range(100, 104)))  # prompt B: blocks 100-103 (cache full)
    assert lru.hits(to_runs(range(0, 4))) == 4  # A is now the most recently used
    lru.insert(to_runs(range(200, 202)))  # two more: B, the least recently used, loses its tail
    assert len(lru) == 8
    assert lru.peek(to_runs(range(100, 104))) == 2 and lru.peek(to_runs(range(0, 4))) == 4
    assert lru.peek(to_runs([100, 101, 102])) == 2  # a prefix cache stops at the first miss
    lru.capacity = 3  # the running requests took the room: evict at once, oldest first
    assert len(lru) == 3 and lru.peek(to_runs(range(100, 104))) == 0


def test_the_hbm_cache_holds_what_running_requests_leave_and_the_host_tier_the_rest() -> None:
    free = {0: 4}
    caches = RankCaches(1, lambda rank: free[rank], host_blocks=100, block_tokens=BLOCK,
                        load_s_per_block=0.001)
    caches.insert(0, to_runs(range(10)))
    assert caches.lookup(0, to_runs(range(10))) == (4, 6)  # 4 in HBM, 6 more from the host
    free[0] = 0
    assert caches.lookup(0, to_runs(range(10))) == (0, 10)
    # loads on one rank's host link queue behind each other
    assert caches.load_done(0, 10, 0.0) == pytest.approx(0.010)
    assert caches.load_done(0, 5, 0.004) == pytest.approx(0.015)


def test_session_affinity_keeps_its_hits_where_round_robin_loses_them(tmp_path: Path) -> None:
    path = trace_file(tmp_path, THREE_TURNS)
    cached = {}
    for policy in ("session_affinity", "prefix_aware", "round_robin"):
        r = run(deployment(2, policy), path, 3)
        cached[policy] = r.table.cached[:3].tolist()
    # affine: turns 2 and 3 find turns 1 and 2 on their instance
    assert cached["session_affinity"] == [0, 640, 960]
    assert cached["prefix_aware"] == [0, 640, 960]
    # round-robin: turn 2 goes to the other instance (nothing), turn 3 back (turn 1's blocks)
    assert cached["round_robin"] == [0, 0, 640]


def test_a_subagent_that_gates_its_parent_delays_the_parents_next_turn(tmp_path: Path) -> None:
    root = (turn(0, 10), turn(1, 12, think=0.1))
    child = (turn(0, 5, think=3.0),)  # starts 3 s after the parent's first turn ends
    gated = SessionTrace("gated", BLOCK, (Agent(root), Agent(child, 0, 0, join_turn=1)))
    free = SessionTrace("background", BLOCK, (Agent(root), Agent(child, 0, 0, join_turn=None)))
    times = {}
    for trace in (gated, free):
        r = run(deployment(), trace_file(tmp_path, trace), 3)
        t = r.table
        rid = {int(n) // BLOCK: i for i, n in enumerate(t.input_len[:3])}  # by prompt blocks
        first, child_rid, second = rid[10], rid[5], rid[12]
        times[trace.name] = (t.finish[first], t.finish[child_rid], t.arrival[second])
    end, child_end, parent = times["gated"]
    assert parent >= child_end > end + 3.0  # the join waits for the subagent
    end, child_end, parent = times["background"]
    assert parent == pytest.approx(end + 0.1, abs=1e-9) and parent < child_end


def test_warmup_turns_before_t_star_are_not_in_the_metrics(tmp_path: Path) -> None:
    long = SessionTrace("long", BLOCK, (Agent(tuple(turn(10.0 * k, 10 + 2 * k, think=0.5)
                                                    for k in range(12))),))
    r = run(deployment(), trace_file(tmp_path, long), 8, concurrency=4, start="t_star")
    t = r.table
    warm = t.warmup[: t.count]
    res = r._collect()
    m = res.metrics()
    assert warm.sum() == m["warmup_requests"] >= 1
    assert m["completed"] == 8 == int((~warm).sum())
    # throughput counts the measured turns served by the last measured dispatch
    start, stop = r.traffic.window
    assert stop is not None and m["duration_s"] == pytest.approx(stop - start)
    served = ~warm & (t.finish[: t.count] <= stop)
    assert m["cached_input_tokens"] + m["uncached_input_tokens"] == int(
        t.input_len[: t.count][served].sum())
    # every lane's measured turns start once the last warmup turn has finished
    assert t.arrival[: t.count][~warm].min() >= np.nanmax(t.finish[: t.count][warm])
    assert r.traffic.window[0] == pytest.approx(np.nanmax(t.finish[: t.count][warm]))


def test_the_default_corpus_replays_and_reports_agentic_metrics() -> None:
    dep = deployment(2)
    wl = Workload(arrival=SessionsArrival(concurrency=8), requests=40)
    m = simulate(dep, wl).metrics()
    assert m["completed"] == 40 and m["warmup_requests"] > 0
    assert 0.5 < m["cache_hit_share"] < 1.0  # agentic turns resend their context
    assert set(m["ttft_by_depth_ms"]) <= {"0", "1-3", "4-15", "16-63", "64+"}
    assert m["session_tok_s"]["p50"] > 0
    assert simulate(dep, wl).metrics() == m  # deterministic


def test_sessions_arrival_refuses_the_old_sessions_block() -> None:
    with pytest.raises(ValueError, match="drop `sessions`"):
        Workload(arrival=SessionsArrival(concurrency=4), sessions=Sessions(turns=2))
    with pytest.raises(ValueError, match=r"t_star_max=0\.1 must be >= t_star_min=0\.5"):
        SessionsArrival(concurrency=4, t_star_min=0.5, t_star_max=0.1)


def test_sizes_that_would_exhaust_memory_are_refused_up_front() -> None:
    with pytest.raises(ValueError, match="less than or equal to 1000000"):
        SessionsArrival(concurrency=5_000_000)
    with pytest.raises(ValueError, match="less than or equal to 10000000"):
        Workload(requests=20_000_000)


def test_a_prefill_only_replay_computes_each_turn_and_samples_one_token(tmp_path: Path) -> None:
    path = trace_file(tmp_path, THREE_TURNS)
    wl = Workload(arrival=SessionsArrival(traces=path, concurrency=1, start="turn0"),
                  requests=3, mode="prefill_only")
    prefill = Deployment(model="deepseek-v3", hardware="h200", prefill=RoleSpec(tp=8))
    r = _Run(prefill, wl, None, None, None, SimOptions())
    m = r.result().metrics()
    t = r.table
    assert t.output_len[:3].tolist() == [1, 1, 1]  # recorded outputs of 10 are not generated
    assert t.cached[:3].tolist() == [0, 640, 960]  # each turn still hits the one before
    # computed tokens only (the turns the window counts), over the prefill GPUs
    assert m["uncached_input_tokens"] in (640 + 320, 640 + 320 + 320)
    assert m["prefill_computed_tok_s_gpu"] == pytest.approx(
        m["uncached_input_tokens"] / m["duration_s"] / 8)
    assert m["prefill_input_tok_s_gpu"] > m["prefill_computed_tok_s_gpu"]
    with pytest.raises(ValueError, match="mode decode_only holds a fixed context"):
        Workload(arrival=SessionsArrival(concurrency=4), mode="decode_only")


def _routed(dep: Deployment, wl: Workload, indexed: bool,
            looks: dict[str, int]) -> list[tuple[int, str, int | None]]:
    """(request, instance, rank) of each prompt's routing in a run whose prefill caches hold
    ~19K tokens per rank; `indexed`: through the holders index, each look checked against a
    look into every rank's cache; else through the look into every rank's cache."""
    r = _Run(dep, wl, None, None, None, SimOptions())
    for e in r.engines["prefill"]:
        assert e.cache is not None
        e.cache.free_blocks = lambda rank: 300
    index = r._cached

    def scan(role: str, engines: list[Any], rid: int) -> np.ndarray:
        return np.concatenate([e.rank_cached(rid) for e in engines])

    def checked(role: str, engines: list[Any], rid: int) -> np.ndarray:
        got, want = index(role, engines, rid), scan(role, engines, rid)
        assert got.tolist() == want.tolist()
        looks["hit"] += bool(want.any())
        looks["partial"] += bool(want.any() and not want.all())
        return got

    r._cached = checked if indexed else scan  # type: ignore[method-assign]
    holders = r._holders["prefill"]
    drop = holders.drop

    def dropped(block: int, key: int) -> None:
        looks["evicted"] += 1
        drop(block, key)

    holders.drop = dropped  # type: ignore[method-assign]
    picks = []
    place = r._place_prompt

    def recorded(role: str, rid: int) -> tuple[Any, int | None]:
        engine, rank = place(role, rid)
        picks.append((rid, engine.name, rank))
        return engine, rank

    r._place_prompt = recorded  # type: ignore[method-assign]
    r.result()
    return picks


@pytest.mark.parametrize("host_gb", [0.0, 0.5])
def test_the_holders_index_routes_as_a_look_into_every_ranks_cache(host_gb: float) -> None:
    """The prefix-aware router looks only into the ranks its role's holders index names for a
    prompt's first block; on a seeded replay over three instances of eight ranks, with caches
    small enough to evict (and a host tier), every look gives what a look into every rank's
    cache gives, so every routing decision is the same."""
    shape = AgentxShape(traces=12, root_turns=Lognormal(median=12, sigma=0.5, max=30),
                        spawn_probability=0.2, max_input=40_000)
    wl = Workload(arrival=SessionsArrival(concurrency=8, shape=shape, start="turn0",
                                          sampling="sequential"), requests=200, seed=3)
    dep = Deployment(model="deepseek-v3", hardware="h200",
                     prefill=RoleSpec(instances=3, dep=8, host_cache_gb=host_gb),
                     decode=RoleSpec(dep=8))
    looks = {"hit": 0, "partial": 0, "evicted": 0}
    indexed = _routed(dep, wl, True, looks)
    assert len(indexed) == 200 and indexed == _routed(dep, wl, False, looks)
    assert looks["hit"] > 100 and looks["partial"] > 100 and looks["evicted"] > 100


def test_a_ranks_host_tier_holds_blocks_of_its_own_share_of_the_cache() -> None:
    """host_cache_gb is per GPU, and a GPU of a TP group holds its share of each block: Qwen3's
    4 KV heads over TP4, a quarter of the whole model's bytes a block; DeepSeek's latent cache
    whole on every rank."""
    from simulator.specs.model import load_model

    wl = Workload(arrival=SessionsArrival(concurrency=2), requests=4, seed=1)
    for model, tp, share in (("qwen3-235b-a22b", 4, 4), ("deepseek-v3", 8, 1)):
        dep = Deployment(model=model, hardware="h200",
                         aggregated=RoleSpec(tp=tp, host_cache_gb=1.0))
        r = _Run(dep, wl, None, None, None, SimOptions())
        cache = r.engines["aggregated"][0].cache
        assert cache is not None and cache.host is not None
        m, block = load_model(model), r.table.block_tokens
        whole = (m.kv_bytes(2.0 ** 20, "fp8") - m.kv_bytes(2.0 ** 19, "fp8")) / 2.0 ** 19 * block
        assert cache.host[0]._capacity == int(2 ** 30 // (whole / share))
