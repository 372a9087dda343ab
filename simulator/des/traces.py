"""Read request traces: the public Mooncake JSONL format, or a CSV with the same columns.

Each row: ``timestamp`` (ms from the trace start), ``input_length``, ``output_length`` and,
optionally, ``hash_ids`` (ids of the prompt's 512-token prefix blocks) and ``session_id``. A CSV
gives hash_ids as numbers separated by spaces, semicolons or commas inside one field
(``"[0, 1, 2]"`` works too). A row with a session id but no hash_ids gets block ids from its
session: its prompt starts with the blocks of the session's previous turn (prompt and output),
so multi-turn traces hit the prefix cache as the conversation grows. A trace replayed at a fixed
concurrency (AIPerf's and `vllm bench serve`'s replay, rows in file order) needs no timestamps.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simulator.des.prefix_cache import BLOCK_TOKENS
from simulator.specs.errors import SpecError
from simulator.specs.workload import TraceArrival

COLUMNS = ("timestamp", "input_length", "output_length")
"""Columns a trace row must have; hash_ids is optional."""


@dataclass(frozen=True)
class Trace:
    """Rows of a trace, sorted by arrival time (ties keep file order)."""

    arrival_s: np.ndarray
    """Arrival time in seconds from the trace start, already multiplied by time_scale."""
    input_len: np.ndarray
    output_len: np.ndarray
    blocks: list[tuple[int, ...] | None]

    def __len__(self) -> int:
        return len(self.input_len)


def file_stamp(path: Path) -> tuple[str, int, int]:
    """A file's path, size and modification time: what a per-process cache of what was read
    from it is keyed by ((path, -1, -1) when it cannot be stat'ed; the reader says why)."""
    try:
        st = path.stat()
    except OSError:
        return (str(path), -1, -1)
    return (str(path), st.st_size, st.st_mtime_ns)


def read_trace(path: str | Path, time_scale: float = 1.0, limit: int | None = None,
               in_order: bool = False) -> Trace:
    """The first `limit` rows (by arrival) of a .jsonl or .csv trace, read once per process
    while the file's path, size and modification time stay the same (a search simulates one
    trace many times, after checking its rows fit the model); its arrays are read-only.
    `in_order`: the rows in file order, timestamps optional (0 where absent): a replay at a
    fixed concurrency takes them so and ignores their times."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"trace file {str(p)!r} does not exist; give a .jsonl or .csv trace")
    return _read_trace(p, file_stamp(p), time_scale, limit, in_order)


def arrival_trace(arrival: TraceArrival, limit: int | None = None) -> Trace:
    """The first `limit` rows a trace arrival replays: by arrival at its timestamps, or in file
    order at a fixed concurrency."""
    return read_trace(arrival.path, arrival.time_scale, limit,
                      in_order=arrival.concurrency is not None)


@functools.lru_cache(maxsize=4)
def _read_trace(p: Path, stamp: tuple[str, int, int], time_scale: float,
                limit: int | None, in_order: bool = False) -> Trace:
    rows = _read_csv(p, timed=not in_order) if p.suffix.lower() == ".csv" else _read_jsonl(p)
    if not rows:
        raise SpecError(f"trace {p} has no rows")
    parsed = [_row(r, p, i + 1, timed=not in_order) for i, r in enumerate(rows)]
    order = (list(range(len(parsed))) if in_order
             else sorted(range(len(parsed)), key=lambda i: (parsed[i][0], i)))
    if limit is not None:
        order = order[:limit]
    ts = np.array([parsed[i][0] for i in order], dtype=float)
    sessions = [_session(rows[i]) for i in order]
    arrays = ((ts - ts.min()) / 1000.0 * time_scale,
              np.array([parsed[i][1] for i in order], dtype=np.int64),
              np.array([parsed[i][2] for i in order], dtype=np.int64))
    for a in arrays:
        a.setflags(write=False)  # shared by every run of the process that reads the file
    return Trace(*arrays, blocks=_session_blocks([parsed[i] for i in order], sessions))


def _session(row: dict[str, Any]) -> str | None:
    sid = row.get("session_id", row.get("session"))
    return None if sid is None or sid == "" else str(sid)


def _session_blocks(parsed: list[tuple[float, int, int, tuple[int, ...] | None]],
                    sessions: list[str | None]) -> list[tuple[int, ...] | None]:
    """Block ids of each row: its own hash_ids, else ids that carry its session's context
    (negative, so they never meet a trace's own ids)."""
    context: dict[str, list[int]] = {}
    next_id = -1
    out: list[tuple[int, ...] | None] = []
    for (_, inp, outp, blocks), sid in zip(parsed, sessions, strict=True):
        if blocks is not None or sid is None:
            out.append(blocks)
            continue
        held = context.get(sid, [])
        need = -(-inp // BLOCK_TOKENS)
        mine = held[:need]
        while len(mine) < need:
            mine.append(next_id)
            next_id -= 1
        out.append(tuple(mine))
        # the next turn's prompt holds this prompt and its output
        grown = list(mine[: inp // BLOCK_TOKENS])
        full = (inp + outp) // BLOCK_TOKENS
        while len(grown) < full:
            grown.append(next_id)
            next_id -= 1
        context[sid] = grown
    return out


def _read_jsonl(p: Path) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(_text(p).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecError(f"{p}:{n}: not a JSON object ({e.msg})") from None
        except ValueError as e:  # an integer of more digits than Python converts (4,300)
            raise SpecError(f"{p}:{n}: not a JSON object ({str(e).split(':')[0]})") from None
        except RecursionError:
            raise SpecError(f"{p}:{n}: nested too deeply to be a trace row") from None
        if not isinstance(row, dict):
            raise SpecError(f"{p}:{n}: each line must be a JSON object")
        rows.append(row)
    return rows


def _text(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"trace {p} is not UTF-8 text") from None
    except OSError as e:
        raise SpecError(f"trace {p} cannot be read ({e.strerror or e})") from None


def _read_csv(p: Path, timed: bool = True) -> list[dict[str, Any]]:
    reader = csv.DictReader(io.StringIO(_text(p), newline=""))
    need = COLUMNS if timed else COLUMNS[1:]
    try:
        missing = [c for c in need if c not in (reader.fieldnames or [])]
        if missing:
            raise SpecError(f"{p}: CSV lacks the column(s) {', '.join(missing)}; "
                            f"needed: {', '.join(need)} (hash_ids optional)")
        return list(reader)
    except csv.Error as e:  # a NUL byte, a field over csv's size limit
        raise SpecError(f"{p} line {reader.line_num}: not CSV ({e})") from None


MAX_TOKENS = 1 << 27
"""Most tokens a row's prompt or output may hold: 134M, ten times the longest context any model
serves (10M); past it a row is a typo, and a prompt's block ids would fill memory."""
MAX_BLOCK_ID = (1 << 63) - 1
"""hash_ids are non-negative 64-bit integers (negative ids are the sessions' own, see
`_session_blocks`)."""


def _number(row: dict[str, Any], key: str, p: Path, n: int) -> float:
    """A row's number (a JSON number, or its text in a CSV); SpecError naming the column for a
    missing one, true/false, text that is no number, NaN or infinity."""
    if row.get(key) is None:
        raise SpecError(f"{p} row {n}: lacks {key!r}; needed: {', '.join(COLUMNS)}")
    value, number = row[key], math.nan
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        # text that is no number, or an integer past float's range, stays NaN
        with contextlib.suppress(ValueError, OverflowError):
            number = float(value)
    if not math.isfinite(number):
        raise SpecError(f"{p} row {n}: {key}={_show(value)} must be a finite number")
    return number


def _length(row: dict[str, Any], key: str, p: Path, n: int) -> int:
    value = _number(row, key, p, n)
    if not value.is_integer() or not 1 <= value <= MAX_TOKENS:
        raise SpecError(f"{p} row {n}: {key}={_show(row[key])} must be a whole number of "
                        f"tokens from 1 to {MAX_TOKENS:,}")
    return int(value)


def _show(value: Any) -> str:
    """A row's value as the other spec errors show it (true, null, nan, inf), cut short."""
    text = json.dumps(value) if isinstance(value, bool) or value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _row(row: dict[str, Any], p: Path, n: int,
         timed: bool = True) -> tuple[float, int, int, tuple[int, ...] | None]:
    if timed and row.get("timestamp") is None:
        raise SpecError(f"{p} row {n}: lacks 'timestamp'; needed: {', '.join(COLUMNS)}, or "
                        "replay the rows at a fixed concurrency (arrival: {kind: trace, "
                        "concurrency: N}), which needs no timestamps")
    ts = (_number(row, "timestamp", p, n) if timed or row.get("timestamp") not in (None, "")
          else 0.0)
    if ts < 0:
        raise SpecError(f"{p} row {n}: timestamp={ts:g} must be >= 0 (ms from the trace start)")
    inp, out = _length(row, "input_length", p, n), _length(row, "output_length", p, n)
    ids = row.get("hash_ids")
    if ids is None or ids == "":
        return ts, inp, out, None
    if isinstance(ids, str):  # a CSV field: "0 1 2", "0;1;2" or "[0, 1, 2]"
        ids = [int(x) if len(x) <= 20 else x for x in re.findall(r"-?\d+", ids)]
    if not isinstance(ids, list):
        raise SpecError(f"{p} row {n}: hash_ids={_show(ids)} must be a list of block ids")
    bad = next((i for i, x in enumerate(ids)
                if type(x) is not int or not 0 <= x <= MAX_BLOCK_ID), None)
    if bad is not None:
        raise SpecError(f"{p} row {n}: hash_ids[{bad}]={_show(ids[bad])}; each block id must "
                        "be an integer from 0 to 2**63-1")
    return ts, inp, out, tuple(ids)
