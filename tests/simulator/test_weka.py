"""AgentX weka traces: reading, join inference, one-sentence refusals, and the write/read round
trip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import simulator.des.weka as weka
from simulator.des.agentx import generate
from simulator.des.sessions import Agent, SessionTrace, Turn, check_tree, to_runs
from simulator.des.weka import read_weka, write_weka
from simulator.specs.agentx import SAMPLE
from simulator.specs.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]


def req(t: float, n_in: Any, n_out: int, ids: Any = None, **extra: Any) -> dict:
    out: dict[str, Any] = {"t": t, "type": "n", "in": n_in, "out": n_out, **extra}
    if ids is not None:
        out["hash_ids"] = ids
    return out


def sub(requests: list[dict], **extra: Any) -> dict:
    return {"t": requests[0].get("t", 0.0), "type": "subagent", "subagent_type": "Explore",
            "requests": requests, **extra}


def write(tmp_path: Path, name: str, *traces: Any) -> Path:
    p = tmp_path / name
    p.write_text("".join(json.dumps(t) + "\n" for t in traces))
    return p


def one(tmp_path: Path, requests: list[dict], **extra: Any) -> SessionTrace:
    trace = {"id": "t1", "block_size": 64, "requests": requests, **extra}
    (got,) = read_weka(write(tmp_path, "t.jsonl", trace))
    return got


def refusal(path: Path, **kwargs: Any) -> str:
    with pytest.raises(SpecError) as info:
        read_weka(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


FAQ_EXAMPLE = {
    "id": "trace_a1b2c3", "models": ["claude-sonnet"], "block_size": 64,
    "hash_id_scope": "local", "tool_tokens": 1856, "system_tokens": 2304,
    "requests": [
        req(0.0, 8192, 312, list(range(1001, 1129)), api_time=4.1, think_time=0.0,
            stop="tool_use", input_types=["text"]),
        req(9.7, 8704, 540, list(range(1001, 1137)), api_time=6.3, think_time=5.6),
        sub([req(22.4, 5120, 822, list(range(7001, 7081)), api_time=9.8, think_time=0.0)],
            agent_id="agent_007", status="completed", models=["claude-haiku"]),
    ],
}


def test_the_faq_example_reads(tmp_path: Path) -> None:
    (trace,) = read_weka(write(tmp_path, "faq.jsonl", FAQ_EXAMPLE))
    assert trace.name == "trace_a1b2c3" and trace.block_tokens == 64
    root, child = trace.agents
    assert root.turns[0] == Turn(t_s=0.0, input_len=8192, output_len=312,
                                 blocks=((1001, 128),), think_s=0.0, api_s=4.1)
    assert root.turns[1].blocks == ((1001, 136),)
    assert root.turns[1].blocks[0][0] == root.turns[0].blocks[0][0]
    assert (child.parent, child.after_turn, child.join_turn, child.kind) == (0, 1, None, "Explore")
    assert child.turns[0].blocks == ((7001, 80),)
    assert check_tree(trace.agents) is None


def test_a_turn_that_repeats_the_previous_ids_extends_its_runs(tmp_path: Path) -> None:
    first = [1, 2, 3, 9, 10]
    trace = one(tmp_path, [req(0, 320, 10, first), req(1, 640, 10, [*first[:4], 11, 12, 13])])
    a, b = (t.blocks for t in trace.root.turns)
    assert a == ((1, 3), (9, 2)) and b == ((1, 3), (9, 1), (11, 3))
    assert b[:1] == a[:1] and b[1][0] == a[1][0]


def test_missing_hash_ids_get_fresh_ids_above_the_trace_s(tmp_path: Path) -> None:
    trace = one(tmp_path, [req(0, 128, 1, [5, 6]), req(1, 130, 1), req(2, 64, 1),
                           sub([req(3, 100, 1, [40])])])
    blocks = [t.blocks for t in trace.root.turns]
    assert blocks == [((5, 2),), ((41, 3),), ((44, 1),)]
    assert trace.agents[1].turns[0].blocks == ((40, 1),)
    assert trace.id_span == 45  # the reader's own count of the ids it handed out
    assert one(tmp_path, [req(0, 10, 1, [])]).root.turns[0].blocks == ()


def test_json_arrays_single_objects_folders_and_limit(tmp_path: Path) -> None:
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "b.json").write_text(json.dumps(FAQ_EXAMPLE))
    (folder / "a.json").write_text(json.dumps([{"requests": [req(0, 1, 1)]},
                                               {"id": "x", "requests": [req(0, 2, 2)]}]))
    (folder / "notes.txt").write_text("not a trace")
    names = [t.name for t in read_weka(folder)]
    assert names == ["a-0", "x", "trace_a1b2c3"]
    assert [t.name for t in read_weka(folder, limit=2)] == ["a-0", "x"]
    assert len(read_weka(folder / "b.json")) == 1
    jsonl = write(tmp_path, "many.jsonl", FAQ_EXAMPLE, FAQ_EXAMPLE, FAQ_EXAMPLE)
    assert len(read_weka(jsonl, limit=2)) == 2


def test_a_subagent_that_ends_before_a_later_parent_turn_gates_it(tmp_path: Path) -> None:
    trace = one(tmp_path, [
        req(0, 64, 1, api_time=2.0),
        sub([req(2.0, 64, 1, api_time=1.0), req(3.5, 64, 1, api_time=1.5)]),  # ends at 5.0
        req(4.0, 64, 1, api_time=0.5),
        req(5.0, 64, 1),
    ])
    child = trace.agents[1]
    assert (child.after_turn, child.join_turn) == (0, 2)


def test_a_nested_subagent_s_end_counts_for_its_parent(tmp_path: Path) -> None:
    trace = one(tmp_path, [
        req(0, 64, 1, api_time=1.0),
        sub([req(1.0, 64, 1, api_time=1.0), sub([req(2.0, 64, 1, api_time=7.0)])]),
        req(5.0, 64, 1),
        req(9.0, 64, 1),
    ])
    assert [a.parent for a in trace.agents] == [-1, 0, 1]
    assert trace.agents[1].join_turn == 2
    assert (trace.agents[2].after_turn, trace.agents[2].join_turn) == (0, None)


def test_a_subagent_that_outlives_the_parent_runs_in_the_background(tmp_path: Path) -> None:
    trace = one(tmp_path, [
        sub([req(0.0, 64, 1, api_time=100.0)]),
        req(0.0, 64, 1, api_time=1.0),
        req(3.0, 64, 1, api_time=1.0),
    ])
    child = trace.agents[1]
    assert (child.after_turn, child.join_turn) == (-1, None)


def test_explicit_join_and_background_override_the_inference(tmp_path: Path) -> None:
    trace = one(tmp_path, [
        req(0, 64, 1, api_time=1.0),
        sub([req(1.0, 64, 1, api_time=100.0)], join=1),
        sub([req(1.0, 64, 1, api_time=1.0)], background=True),
        req(2.0, 64, 1, api_time=1.0),
        req(4.0, 64, 1),
    ])
    assert [a.join_turn for a in trace.agents[1:]] == [1, None]


def test_write_then_read_is_exact(tmp_path: Path) -> None:
    turn = Turn(t_s=0.25, input_len=130, output_len=7, blocks=((0, 2), (9, 1)), think_s=0.5)
    hand = SessionTrace(name="hand", block_tokens=64, agents=(
        Agent(turns=(turn, turn, turn)),
        Agent(turns=(turn, turn), parent=0, after_turn=-1, join_turn=1, kind="Plan"),
        Agent(turns=(turn,), parent=1, after_turn=0, join_turn=None),
        Agent(turns=(Turn(t_s=3.0, input_len=1, output_len=1, blocks=()),), parent=0,
              after_turn=1, join_turn=2),
    ))
    traces = [*generate(SAMPLE, seed=3, traces=3), hand]
    path = tmp_path / "out" / "corpus.jsonl"
    path.parent.mkdir()
    write_weka(traces, path)
    assert read_weka(path) == traces
    assert [t.id_span for t in read_weka(path)] == [t.id_span for t in traces]
    assert [p.name for p in path.parent.iterdir()] == ["corpus.jsonl"]


def test_write_refuses_a_broken_tree(tmp_path: Path) -> None:
    turn = Turn(t_s=0.0, input_len=1, output_len=1, blocks=())
    bad = SessionTrace(name="bad", block_tokens=64,
                       agents=(Agent(turns=(turn,)), Agent(turns=(turn,), parent=0, join_turn=1)))
    with pytest.raises(SpecError, match="trace 0 \\('bad'\\) cannot be written"):
        write_weka([bad], tmp_path / "bad.jsonl")
    assert not list(tmp_path.iterdir())


def test_the_example_sample_reads_and_is_the_documented_generation() -> None:
    traces = read_weka(ROOT / "examples" / "traces" / "agentx-sample.jsonl")
    assert len(traces) == 8
    assert all(check_tree(t.agents) is None for t in traces)
    assert any(len(t.agents) > 1 for t in traces)
    assert traces == generate(SAMPLE, seed=0)


MALFORMED = [
    ([req(0, 64, 1), {"type": "n", "out": 5}], ["trace 't1', request 1", "has no 'in'"]),
    ([req(0, 0, 1)], ["request 0", "in=0 must be an integer >= 1"]),
    ([req(0, 1.5, 1)], ["in=1.5 must be an integer"]),
    ([req(0, "64", 1)], ["in='64' must be an integer"]),
    ([req(0, 64, 0)], ["out=0 must be an integer >= 1"]),
    ([{"type": "n", "in": 64}], ["has no 'out'"]),
    ([req(0, 64, 1, think_time=-1)], ["request 0", "think_time=-1 must be a number of seconds"]),
    ([req(-2, 64, 1)], ["t=-2 must be a number of seconds >= 0"]),
    ([req(0, 64, 1, api_time=-0.5)], ["api_time=-0.5"]),
    ([req(0, 100, 1, [1, 2, 3])], ["request 0", "has 3 hash_ids, more than the 2 blocks"]),
    ([req(0, 128, 1, [1, 2.5])], ["hash_ids holds 2.5", "integer >= 0"]),
    ([req(0, 128, 1, [1, -4])], ["hash_ids holds -4"]),
    ([req(0, 128, 1, "1 2")], ["hash_ids is str"]),
    ([{"type": "x", "in": 1, "out": 1}], ["type='x' is not a request type", "'subagent'"]),
    ([req(0, 64, 1), sub([req(1, 64, 1), req(2, 64, -3)])],
     ["trace 't1', subagent 1, request 1", "out=-3"]),
    ([req(0, 64, 1), sub([req(1, 64, 1), sub([{"in": 5}])])],
     ["subagent 1, subagent 1, request 0", "has no 'out'"]),
    ([req(0, 64, 1), {"type": "subagent", "requests": []}], ["subagent 1: has no requests"]),
    ([sub([req(0, 64, 1)])], ["trace 't1': has no requests of type 'n'"]),
    ([req(0, 64, 1), sub([req(1, 64, 1)], join=0)],
     ["subagent 1", "join=0 names no parent request after", "background=true"]),
    ([req(0, 64, 1), req(1, 64, 1), req(2, 64, 1), sub([req(1, 64, 1)], join=1)],
     ["subagent 3", "join=1 names no parent request after"]),
    ([req(0, 64, 1), sub([req(1, 64, 1)], join=5), req(2, 64, 1), req(3, 64, 1)],
     ["subagent 1", "join=5 must be a parent request after its spawn, 1 to 2"]),
    ([req(0, 64, 1), sub([req(1, 64, 1)], join=1, background=True)], ["has both join=1"]),
    ([req(0, 64, 1), sub([req(1, 64, 1)], background="yes")], ["background='yes'"]),
    ([], ["trace 't1': has no requests"]),
    ([7], ["request 0: is int, not a request object"]),
]


@pytest.mark.parametrize(("requests", "parts"), MALFORMED)
def test_malformed_requests_are_refused_naming_trace_and_request(
        tmp_path: Path, requests: list[Any], parts: list[str]) -> None:
    path = write(tmp_path, "bad.jsonl", {"id": "t1", "requests": requests})
    message = refusal(path)
    assert message.startswith(str(path))
    for part in parts:
        assert part in message


def test_trace_level_refusals(tmp_path: Path) -> None:
    no_requests = write(tmp_path, "a.jsonl", {"id": "t9", "block_size": 64})
    assert "trace 't9': has no requests" in refusal(no_requests)
    block = write(tmp_path, "b.jsonl", {"block_size": 0, "requests": [req(0, 1, 1)]})
    assert "trace on line 1: block_size=0 must be an integer >= 1" in refusal(block)
    bad_line = tmp_path / "c.jsonl"
    bad_line.write_text(json.dumps(FAQ_EXAMPLE) + "\n{\"id\": \"x\", \n")
    assert f"{bad_line} line 2: not valid JSON" in refusal(bad_line)
    array = tmp_path / "d.json"
    array.write_text(json.dumps([FAQ_EXAMPLE, {"requests": [req(0, 1, 1, think_time=-3)]}]))
    message = refusal(array)
    assert "trace 1, request 0: think_time=-3" in message
    broken = tmp_path / "e.json"
    broken.write_text("[{")
    assert "not valid JSON at line 1" in refusal(broken)
    not_object = write(tmp_path, "f.jsonl", [1, 2])
    assert "trace on line 1: is list, not a trace object" in refusal(not_object)


def test_file_and_argument_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "no such file or folder" in refusal(tmp_path / "none.jsonl")
    (tmp_path / "t.csv").write_text("x")
    assert "unknown trace file type '.csv'" in refusal(tmp_path / "t.csv")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no .json or .jsonl trace files" in refusal(empty)
    path = write(tmp_path, "ok.jsonl", FAQ_EXAMPLE, FAQ_EXAMPLE)
    assert "limit=0 must be an integer >= 1" in refusal(path, limit=0)
    monkeypatch.setattr(weka, "MAX_REQUESTS", 4)
    assert "more than 4 requests; pass limit=" in refusal(path)
    assert len(read_weka(path, limit=1)) == 1
    monkeypatch.setattr(weka, "MAX_FILE_BYTES", 100)
    assert "a trace file may hold" in refusal(path)
    (tmp_path / "latin.jsonl").write_bytes(b"\xff\xfe{}\n")
    monkeypatch.setattr(weka, "MAX_FILE_BYTES", 2**31)
    assert "is not UTF-8 text" in refusal(tmp_path / "latin.jsonl")


def test_hash_id_runs_match_to_runs() -> None:
    ids = [4, 5, 6, 1, 2, 9, 10, 11, 12, 3]
    assert weka._runs(np.array(ids, dtype=np.int64)) == to_runs(ids)
