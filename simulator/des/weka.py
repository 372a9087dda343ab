"""Read and write AgentX traces in the "weka" JSON format, as `SessionTrace`s.

A trace is a JSON object: `id`, `block_size` (tokens per hash id, default 64) and `requests`, a
list of entries in recorded order. An entry of type "n" (the default when `type` is missing) is
one request of the agent: `in` and `out` token counts, `hash_ids` (the prompt's KV block ids,
local to the trace; at most ceil(in / block_size) of them; missing or null: ids of its own, that
no other request shares; an empty list: no blocks), `t` (recorded start, seconds from the
trace's start, default 0), `think_time` (the client gap before it, end to start, default 0) and
`api_time` (recorded service time, optional). An entry of type "subagent" is a child agent
with its own `requests` (which may hold subagents again) and `subagent_type`; other fields are
ignored.

A subagent starts after the parent's last "n" request listed before it (or at the parent's start)
and joins, by inference from the recorded times, the first later parent request whose `t` is at
or after the subagent tree's end (the latest `t + api_time` of its requests and theirs, `t` where
`api_time` is missing); when no later parent request starts after that end, it runs in the
background and gates nothing. rackplan's extension overrides the inference: `"join": k` on the
subagent entry gates the parent's "n" request k (counting from 0), `"background": true` gates
none. `write_weka` always writes one of the two, so a round trip is exact.

Errors name the file, the trace (its id, or its position) and the request (its position in its
list, counting from 0, behind "subagent k" for each nesting level).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simulator.des.sessions import Agent, Runs, SessionTrace, Turn, check_tree, expand, to_runs
from simulator.specs.errors import SpecError
from simulator.specs.limits import MAX_CONTEXT_TOKENS

BLOCK_SIZE = 64
"""Tokens per hash id when a trace gives no block_size (the harness's)."""
MAX_FILE_BYTES = 2 * 1024**3
"""Largest trace file read (the whole of a .json file is parsed at once)."""
MAX_REQUESTS = 2_000_000
"""Most requests one read_weka call holds (the public corpus has ~99k); pass limit for fewer."""
SUFFIXES = (".json", ".jsonl")


def read_weka(path: str | Path, limit: int | None = None) -> list[SessionTrace]:
    """The traces of a .json file (one trace or an array), a .jsonl file (one trace a line) or a
    folder of such files (by name), the first `limit` of them when given."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 1):
        raise SpecError(f"limit={limit!r} must be an integer >= 1, or None for every trace")
    budget = _Budget()
    out: list[SessionTrace] = []
    for file in _files(Path(path)):
        for where, position, obj in _objects(file):
            out.append(_Trace(where, position, obj, budget, file).build())
            if limit is not None and len(out) >= limit:
                return out
    return out


def write_weka(traces: Sequence[SessionTrace], path: str | Path) -> None:
    """Write `traces` as JSONL, one trace a line, hash ids expanded and every subagent's join
    explicit; through a temporary file in the same folder, renamed over `path` at the end.
    read_weka reads them back equal when their agents are numbered depth-first, siblings in
    spawn order (as read_weka and the generator number them)."""
    p = Path(path)
    for k, trace in enumerate(traces):
        why = check_tree(trace.agents)
        if why is not None:
            raise SpecError(f"trace {k} ({trace.name!r}) cannot be written: {why}")
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("x", encoding="utf-8") as f:
            for trace in traces:
                f.write(json.dumps(_trace_json(trace), separators=(",", ":")))
                f.write("\n")
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# --- files ---------------------------------------------------------------------------------


def _files(p: Path) -> list[Path]:
    """The trace files at `p`: itself, or a folder's .json/.jsonl files by name."""
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in SUFFIXES)
        if not files:
            raise SpecError(f"{p}: the folder holds no .json or .jsonl trace files")
        return files
    if not p.is_file():
        raise SpecError(f"{p}: no such file or folder; give a .json or .jsonl trace file or a "
                        "folder of them")
    if p.suffix.lower() not in SUFFIXES:
        raise SpecError(f"{p}: unknown trace file type {p.suffix!r}; give .json or .jsonl")
    return [p]


def _objects(file: Path) -> Iterator[tuple[str, int, Any]]:
    """(how errors name the trace, its position in the file, the parsed trace) of each trace."""
    size = file.stat().st_size
    if size > MAX_FILE_BYTES:
        raise SpecError(f"{file}: its {size:,} bytes are over the {MAX_FILE_BYTES:,} a trace "
                        "file may hold; split it into several files in one folder")
    if file.suffix.lower() == ".jsonl":
        yield from _lines(file)
        return
    try:
        data = json.loads(_text(file))
    except json.JSONDecodeError as exc:
        raise SpecError(f"{file}: not valid JSON at line {exc.lineno} column {exc.colno} "
                        f"({exc.msg}); give one trace object or an array of them") from None
    items = data if isinstance(data, list) else [data]
    for k, obj in enumerate(items):
        yield _label(obj, f"trace {k}"), k, obj


def _lines(file: Path) -> Iterator[tuple[str, int, Any]]:
    position = 0
    with file.open(encoding="utf-8") as f:
        try:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SpecError(f"{file} line {number}: not valid JSON ({exc.msg} at column "
                                    f"{exc.colno}); give one trace object per line") from None
                yield _label(obj, f"trace on line {number}"), position, obj
                position += 1
        except UnicodeDecodeError:
            raise SpecError(f"{file}: is not UTF-8 text") from None


def _text(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{file}: is not UTF-8 text") from None


def _label(obj: Any, fallback: str) -> str:
    name = obj.get("id") if isinstance(obj, dict) else None
    return f"trace {name!r}" if isinstance(name, str) and name else fallback


# --- one trace -----------------------------------------------------------------------------


@dataclass
class _Budget:
    """Requests read so far by one read_weka call."""

    requests: int = 0

    def take(self, file: Path) -> None:
        self.requests += 1
        if self.requests > MAX_REQUESTS:
            raise SpecError(f"{file}: the traces read hold more than {MAX_REQUESTS:,} requests; "
                            "pass limit= to read fewer traces")


@dataclass
class _Raw:
    """One agent while its trace is read: turns still without ids, join not yet decided."""

    parent: int
    after_turn: int
    kind: str
    where: str
    turns: list[tuple[float, int, int, Runs | None, float, float | None]] = field(
        default_factory=list)
    join: int | None = None
    background: bool = False


class _Trace:
    """Reads one trace object into a SessionTrace."""

    def __init__(self, where: str, position: int, obj: Any, budget: _Budget,
                 file: Path) -> None:
        self.file, self.where, self.position, self.obj, self.budget = (
            file, where, position, obj, budget)
        self.agents: list[_Raw] = []
        self.top = -1
        self.block = BLOCK_SIZE

    def fail(self, loc: str, what: str) -> SpecError:
        at = f", {loc}" if loc else ""
        return SpecError(f"{self.file}: {self.where}{at}: {what}")

    def build(self) -> SessionTrace:
        obj = self.obj
        if not isinstance(obj, dict):
            raise self.fail("", f"is {type(obj).__name__}, not a trace object")
        self.block = self._block_size(obj.get("block_size", BLOCK_SIZE))
        self._agent(obj.get("requests"), "", -1, -1, "")
        agents, span = self._finish()
        name = obj.get("id")
        if not isinstance(name, str) or not name:
            name = f"{self.file.stem}-{self.position}"
        return SessionTrace(name=name, block_tokens=self.block, agents=tuple(agents), span=span)

    def _block_size(self, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise self.fail("", f"block_size={v!r} must be an integer >= 1 (tokens per hash "
                                "id; the harness's is 64)")
        return v

    def _agent(self, entries: Any, prefix: str, parent: int, after_turn: int,
               kind: str) -> int:
        """Read an agent's entries (its subagents too); its index in the trace."""
        where = prefix.rstrip(", ")
        if not isinstance(entries, list) or not entries:
            what = "has no requests" if entries is None or entries == [] else \
                f"has requests of type {type(entries).__name__}"
            raise self.fail(where, f"{what}; give a non-empty list of request objects")
        me = len(self.agents)
        raw = _Raw(parent=parent, after_turn=after_turn, kind=kind, where=where)
        self.agents.append(raw)
        for k, entry in enumerate(entries):
            loc = f"{prefix}request {k}"
            if not isinstance(entry, dict):
                raise self.fail(loc, f"is {type(entry).__name__}, not a request object")
            kind_of = entry.get("type", "n")
            if kind_of == "n":
                self.budget.take(self.file)
                raw.turns.append(self._turn(entry, loc))
            elif kind_of == "subagent":
                sub = f"{prefix}subagent {k}"
                child = self._agent(entry.get("requests"), f"{sub}, ", me, len(raw.turns) - 1,
                                    str(entry.get("subagent_type") or ""))
                self._override(self.agents[child], entry, sub)
            else:
                raise self.fail(loc, f"type={kind_of!r} is not a request type; valid: 'n' "
                                     "(a request) or 'subagent'")
        if not raw.turns:
            raise self.fail(where, "has no requests of type 'n'; an agent needs at least one")
        return me

    def _override(self, raw: _Raw, entry: dict[str, Any], loc: str) -> None:
        """rackplan's explicit join: "join": k or "background": true."""
        join, bg = entry.get("join"), entry.get("background", False)
        if not isinstance(bg, bool):
            raise self.fail(loc, f"background={bg!r} must be true or false")
        if join is not None:
            if bg:
                raise self.fail(loc, f"has both join={join!r} and background=true; give one")
            if isinstance(join, bool) or not isinstance(join, int):
                raise self.fail(loc, f"join={join!r} must be the index of a parent request "
                                     "(an integer, counting its 'n' requests from 0)")
        raw.join, raw.background = join, bg

    def _turn(self, req: dict[str, Any],
              loc: str) -> tuple[float, int, int, Runs | None, float, float | None]:
        n_in = self._count(req, "in", loc)
        n_out = self._count(req, "out", loc)
        t = self._seconds(req, "t", loc)
        think = self._seconds(req, "think_time", loc)
        api = self._seconds(req, "api_time", loc) if req.get("api_time") is not None else None
        return t, n_in, n_out, self._blocks(req.get("hash_ids"), n_in, loc), think, api

    def _count(self, req: dict[str, Any], key: str, loc: str) -> int:
        v = req.get(key)
        if v is None:
            raise self.fail(loc, f"has no {key!r}; give its token count, an integer >= 1")
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_CONTEXT_TOKENS:
            raise self.fail(loc, f"{key}={v!r} must be an integer >= 1 (tokens), at most "
                                 f"{MAX_CONTEXT_TOKENS:,} (the longest context)")
        return v

    def _seconds(self, req: dict[str, Any], key: str, loc: str) -> float:
        v = req.get(key)
        if v is None:
            return 0.0
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or v < 0:
            raise self.fail(loc, f"{key}={v!r} must be a number of seconds >= 0")
        return float(v)

    def _blocks(self, ids: Any, n_in: int, loc: str) -> Runs | None:
        if ids is None:
            return None
        if not isinstance(ids, list):
            raise self.fail(loc, f"hash_ids is {type(ids).__name__}; give a list of integers")
        most = -(-n_in // self.block)
        if len(ids) > most:
            raise self.fail(loc, f"has {len(ids)} hash_ids, more than the {most} blocks of "
                                 f"{self.block} tokens its in={n_in} tokens fill")
        if not ids:
            return ()
        try:
            arr = np.asarray(ids)
        except (ValueError, OverflowError):
            arr = np.asarray([], dtype=object)
        if arr.ndim != 1 or arr.dtype.kind not in "iu" or arr.min() < 0 \
                or (arr.dtype.kind == "u" and arr.max() >= 2**63):
            bad = next((x for x in ids if isinstance(x, bool) or not isinstance(x, int)
                        or not 0 <= x < 2**63), ids[0])
            raise self.fail(loc, f"hash_ids holds {bad!r}; every hash id must be an integer "
                                 ">= 0")
        self.top = max(self.top, int(arr.max()))
        return _runs(arr.astype(np.int64))

    def _finish(self) -> tuple[list[Agent], int]:
        """Fresh ids for turns without hash_ids, joins decided, Agents built; and one more than
        the largest id (the trace's id span)."""
        fresh = self.top + 1
        turns: list[tuple[Turn, ...]] = []
        for raw in self.agents:
            built = []
            for t, n_in, n_out, runs, think, api in raw.turns:
                if runs is None:
                    count = -(-n_in // self.block)
                    runs = to_runs(range(fresh, fresh + count))
                    fresh += count
                built.append(Turn(t_s=t, input_len=n_in, output_len=n_out, blocks=runs,
                                  think_s=think, api_s=api))
            turns.append(tuple(built))
        ends = self._ends(turns)
        return [Agent(turns=turns[i], parent=raw.parent, after_turn=raw.after_turn,
                      join_turn=self._join(i, raw, turns, ends) if i else None, kind=raw.kind)
                for i, raw in enumerate(self.agents)], fresh

    def _ends(self, turns: list[tuple[Turn, ...]]) -> list[float]:
        """Each agent's recorded end, its subagents' included."""
        ends = [max(t.t_s + (t.api_s or 0.0) for t in ts) for ts in turns]
        for i in range(len(self.agents) - 1, 0, -1):
            p = self.agents[i].parent
            ends[p] = max(ends[p], ends[i])
        return ends

    def _join(self, i: int, raw: _Raw, turns: list[tuple[Turn, ...]],
              ends: list[float]) -> int | None:
        parent = turns[raw.parent]
        if raw.background:
            return None
        if raw.join is not None:
            first, last = raw.after_turn + 1, len(parent) - 1
            if first > last:
                raise self.fail(raw.where, f"join={raw.join} names no parent request after its "
                                           f"spawn (the parent has none after its request "
                                           f"{raw.after_turn}); give background=true instead")
            if not first <= raw.join <= last:
                raise self.fail(raw.where, f"join={raw.join} must be a parent request after its "
                                           f"spawn, {first} to {last} (counting the parent's "
                                           "'n' requests from 0)")
            return raw.join
        return next((k for k in range(raw.after_turn + 1, len(parent))
                     if parent[k].t_s >= ends[i]), None)


def _runs(ids: np.ndarray) -> Runs:
    """to_runs of an int64 array, vectorized (a prompt may hold ~15,000 ids)."""
    starts = np.flatnonzero(np.diff(ids) != 1) + 1
    first = np.concatenate(([0], starts))
    counts = np.diff(np.concatenate((first, [len(ids)])))
    return tuple(zip(ids[first].tolist(), counts.tolist(), strict=True))


# --- writing -------------------------------------------------------------------------------


def _trace_json(trace: SessionTrace) -> dict[str, Any]:
    return {"id": trace.name, "block_size": trace.block_tokens, "hash_id_scope": "local",
            "requests": _entries(trace, 0)}


def _entries(trace: SessionTrace, agent: int) -> list[dict[str, Any]]:
    """An agent's requests, each child's entry right after the turn that spawns it."""
    kids = trace.children(agent)
    out: list[dict[str, Any]] = [_subagent_json(trace, c) for c in kids
                                 if trace.agents[c].after_turn == -1]
    for k, turn in enumerate(trace.agents[agent].turns):
        out.append(_turn_json(turn))
        out.extend(_subagent_json(trace, c) for c in kids if trace.agents[c].after_turn == k)
    return out


def _turn_json(turn: Turn) -> dict[str, Any]:
    out: dict[str, Any] = {"t": turn.t_s, "type": "n", "in": turn.input_len,
                           "out": turn.output_len, "hash_ids": expand(turn.blocks),
                           "think_time": turn.think_s}
    if turn.api_s is not None:
        out["api_time"] = turn.api_s
    return out


def _subagent_json(trace: SessionTrace, agent: int) -> dict[str, Any]:
    a = trace.agents[agent]
    out: dict[str, Any] = {"t": a.turns[0].t_s, "type": "subagent",
                           "agent_id": f"agent_{agent}"}
    if a.kind:
        out["subagent_type"] = a.kind
    if a.join_turn is None:
        out["background"] = True
    else:
        out["join"] = a.join_turn
    out["requests"] = _entries(trace, agent)
    return out
