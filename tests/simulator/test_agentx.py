"""The synthetic AgentX corpus: determinism, well-formed trees and block runs, consistent times
and joins, the documented aggregates, and the shape's refusals."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from simulator.des.agentx import corpus_stats, generate
from simulator.des.sessions import Agent, SessionTrace, Turn, check_tree, expand, run_blocks
from simulator.des.weka import read_weka, write_weka
from simulator.specs.agentx import SAMPLE, AgentxShape, Lognormal, LognormalSeconds
from simulator.specs.errors import SpecError
from simulator.specs.loading import load_spec

SMALL = AgentxShape(
    root_turns=Lognormal(median=30, sigma=0.5, max=80),
    spawn_probability=0.2,
    max_input=60_000,
    compact_summary=Lognormal(median=4000, sigma=0.3, max=8000),
)
"""Short traces with many subagents and frequent compactions."""


@pytest.fixture(scope="module")
def small() -> list[SessionTrace]:
    return generate(SMALL, seed=11, traces=40)


@pytest.fixture(scope="module")
def default_corpus() -> list[SessionTrace]:
    return generate(AgentxShape(), seed=0, traces=200)


def ceil_blocks(tokens: int) -> int:
    return -(-tokens // 64)


def test_same_seed_same_corpus_other_seed_another() -> None:
    a = generate(SMALL, seed=5, traces=6)
    assert a == generate(SMALL, seed=5, traces=6)
    assert a != generate(SMALL, seed=6, traces=6)
    assert generate(SMALL, seed=5, traces=3) == a[:3]
    assert len(generate(SAMPLE, seed=1)) == SAMPLE.traces


def test_trees_are_well_formed(small: list[SessionTrace]) -> None:
    assert len({t.name for t in small}) == len(small)
    for trace in small:
        assert check_tree(trace.agents) is None
        assert trace.block_tokens == 64
        for agent in trace.agents[1:]:
            assert agent.parent == 0 and agent.after_turn < len(trace.root.turns) - 1
        # the id span the generator hands out is the one its runs reach
        assert trace.span == max(s + n for a in trace.agents for t in a.turns
                                 for s, n in t.blocks)
    assert sum(len(t.agents) - 1 for t in small) > 20


def test_inputs_are_capped_and_blocks_cover_the_prompt(small: list[SessionTrace]) -> None:
    for trace in small:
        for agent in trace.agents:
            for turn in agent.turns:
                assert 1 <= turn.input_len <= SMALL.max_input
                assert run_blocks(turn.blocks) == ceil_blocks(turn.input_len)
                assert turn.output_len >= 1


def test_a_root_turn_extends_the_previous_prompt_s_whole_blocks(
        small: list[SessionTrace]) -> None:
    """Each turn keeps the ids of the previous prompt's whole blocks and adds new consecutive
    ids, or (a compaction) keeps only the system prompt's 65 blocks."""
    compactions = 0
    for trace in small:
        turns = trace.root.turns
        for prev, turn in itertools.pairwise(turns):
            prev_ids, ids = expand(prev.blocks), expand(turn.blocks)
            whole = prev.input_len // 64
            kept = whole if ids[:whole] == prev_ids[:whole] else 65
            if kept < whole:
                compactions += 1
                assert ids[:65] == list(range(65))
                assert prev.input_len + prev.output_len + 100_000 > SMALL.max_input
            else:
                assert turn.input_len > prev.input_len + prev.output_len
            new = ids[kept:]
            assert new and min(new) > max(prev_ids)
            assert new == list(range(new[0], new[0] + len(new)))
    assert compactions > 5


def test_subagents_share_only_the_system_prompt_s_blocks(small: list[SessionTrace]) -> None:
    for trace in small:
        root_ids = {b for t in trace.root.turns for b in expand(t.blocks)}
        for agent in trace.agents[1:]:
            ids = [b for t in agent.turns for b in expand(t.blocks)]
            assert ids[:65] == list(range(65))
            assert root_ids & set(ids) == set(range(65))


def test_times_are_consistent_and_joins_come_after_the_subagent(
        small: list[SessionTrace]) -> None:
    joined = background = 0
    for trace in small:
        for agent in trace.agents:
            for prev, turn in itertools.pairwise(agent.turns):
                assert turn.api_s is not None and prev.api_s is not None
                assert turn.think_s >= 0.001
                assert turn.t_s == pytest.approx(prev.t_s + prev.api_s + turn.think_s, abs=1e-9)
        root = trace.root.turns
        for agent in trace.agents[1:]:
            spawner = root[agent.after_turn]
            assert agent.turns[0].t_s == pytest.approx(spawner.t_s + (spawner.api_s or 0))
            last = agent.turns[-1]
            end = last.t_s + (last.api_s or 0)
            if agent.join_turn is None:
                background += 1
            else:
                joined += 1
                assert agent.join_turn == agent.after_turn + 1
                assert root[agent.join_turn].t_s > end
    assert joined > background > 0


def test_joins_survive_the_weka_inference(small: list[SessionTrace], tmp_path: Path) -> None:
    """Written without the explicit join fields, the reader's inference finds every join."""
    path = tmp_path / "c.jsonl"
    write_weka(small[:10], path)
    lines = []
    for line in path.read_text().splitlines():
        trace = json.loads(line)
        for entry in trace["requests"]:
            entry.pop("join", None)
        lines.append(json.dumps(trace))
    path.write_text("\n".join(lines) + "\n")
    for got, want in zip(read_weka(path), small[:10], strict=True):
        for a, b in zip(got.agents[1:], want.agents[1:], strict=True):
            if b.join_turn is not None:
                assert a.join_turn == b.join_turn


def test_api_time_is_nominal() -> None:
    (trace,) = generate(SMALL, seed=2, traces=1)
    first = trace.root.turns[0]
    want = SMALL.latency_s + first.input_len / SMALL.prefill_tps \
        + first.output_len / SMALL.decode_tps
    assert first.api_s == pytest.approx(want, abs=6e-4)
    assert first.t_s == 0.0 and first.think_s == 0.0


def test_default_shape_reproduces_the_faq_aggregates(
        default_corpus: list[SessionTrace]) -> None:
    stats = corpus_stats(default_corpus)
    assert stats["traces"] == 200
    assert 100 <= stats["root_turns_per_trace"] <= 190  # FAQ: ~145
    assert 65 <= stats["subagent_requests_per_trace"] <= 150  # FAQ: ~107
    assert 0.40 <= stats["root_share_over_256k"] <= 0.62  # FAQ: 57k -> 28k
    assert 0.24 <= stats["request_share_over_256k"] <= 0.38  # FAQ: 99k -> 68k
    assert stats["subagent_share_over_256k"] <= 0.12  # FAQ: ~42k -> ~40k
    assert 900_000 < stats["max_input"] <= 990_000
    assert 400 <= stats["mean_output"] <= 1000
    assert 0.7 <= stats["join_share"] <= 0.9
    assert stats["requests"] == sum(t.requests for t in default_corpus)


def test_default_shape_matches_the_faq_example_sizes() -> None:
    shape = AgentxShape()
    assert (shape.traces, shape.system_tokens, shape.block_size, shape.max_input) == (
        393, 2304 + 1856, 64, 990_000)
    assert shape.tail_tokens.median == 8704 - 8192
    assert shape.first_message.median + shape.system_tokens == 8192


def test_corpus_stats_of_a_hand_made_trace() -> None:
    turn = Turn(t_s=0.0, input_len=300_000, output_len=10, blocks=(), think_s=2.0)
    small_turn = Turn(t_s=1.0, input_len=1000, output_len=30, blocks=(), think_s=0.0)
    trace = SessionTrace(name="x", block_tokens=64, agents=(
        Agent(turns=(turn, small_turn)),
        Agent(turns=(small_turn,), parent=0, after_turn=0, join_turn=1)))
    stats = corpus_stats([trace])
    assert stats["requests"] == 3 and stats["root_turns_per_trace"] == 2
    assert stats["subagent_requests_per_trace"] == 1 and stats["join_share"] == 1.0
    assert stats["root_share_over_256k"] == 0.5
    assert stats["request_share_over_256k"] == pytest.approx(1 / 3)
    assert stats["max_input"] == 300_000 and stats["mean_output"] == pytest.approx(70 / 3)
    with pytest.raises(SpecError, match="at least one trace"):
        corpus_stats([])


def test_generate_refuses_bad_counts() -> None:
    with pytest.raises(SpecError, match="traces=0 must be an integer >= 1"):
        generate(SAMPLE, seed=0, traces=0)
    with pytest.raises(SpecError, match="seed=-1 must be an integer >= 0"):
        generate(SAMPLE, seed=-1)


@pytest.mark.parametrize(("data", "part"), [
    ({"system_tokens": 990_000}, "system_tokens=990000 must be below max_input=990000"),
    ({"fanout_mean": 9.0}, "fanout_mean=9 must be <= fanout_max=8"),
    ({"spawn_probability": 1.5}, "spawn_probability=1.5 must be <= 1"),
    ({"block_size": 0}, "block_size=0 must be >= 1"),
    ({"tail_tokens": {"median": 900, "max": 100}}, "median=900 must be <= max=100"),
    ({"think_s": {"median": 5.0, "max": 1.0}}, "median=5 s must be <= max=1 s"),
    ({"root_turns": {"median": 9, "max": 90, "mean": 3}}, "unknown key 'mean'"),
])
def test_shape_refusals_are_one_sentence(data: dict, part: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(AgentxShape, data, "shape")
    assert part in str(info.value) and "\n" not in str(info.value)


def test_shape_is_frozen_and_its_distributions_sample_in_range() -> None:
    shape = AgentxShape()
    with pytest.raises(ValidationError):
        shape.traces = 3
    rng = np.random.default_rng(0)
    x = Lognormal(median=10, sigma=3.0, max=50).sample(rng, 1000)
    assert x.min() >= 1 and x.max() <= 50 and x.dtype == np.int64
    s = LognormalSeconds(median=1.0, sigma=3.0, max=5.0).sample(rng, 1000)
    assert s.min() > 0 and s.max() <= 5.0
