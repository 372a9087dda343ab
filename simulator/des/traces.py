"""Read request traces: the public Mooncake JSONL format, or a CSV with the same columns.

Each row: ``timestamp`` (ms from the trace start), ``input_length``, ``output_length`` and,
optionally, ``hash_ids`` (ids of the prompt's 512-token prefix blocks) and ``session_id``. A CSV
gives hash_ids as numbers separated by spaces, semicolons or commas inside one field
(``"[0, 1, 2]"`` works too). A row with a session id but no hash_ids gets block ids from its
session: its prompt starts with the blocks of the session's previous turn (prompt and output),
so multi-turn traces hit the prefix cache as the conversation grows.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simulator.des.prefix_cache import BLOCK_TOKENS
from simulator.specs.errors import SpecError

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


def read_trace(path: str | Path, time_scale: float = 1.0, limit: int | None = None) -> Trace:
    """The first `limit` rows (by arrival) of a .jsonl or .csv trace."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"trace file {str(p)!r} does not exist; give a .jsonl or .csv trace")
    rows = _read_csv(p) if p.suffix.lower() == ".csv" else _read_jsonl(p)
    if not rows:
        raise SpecError(f"trace {p} has no rows")
    parsed = [_row(r, p, i + 1) for i, r in enumerate(rows)]
    order = sorted(range(len(parsed)), key=lambda i: (parsed[i][0], i))
    if limit is not None:
        order = order[:limit]
    ts = np.array([parsed[i][0] for i in order], dtype=float)
    sessions = [_session(rows[i]) for i in order]
    return Trace(
        arrival_s=(ts - ts.min()) / 1000.0 * time_scale,
        input_len=np.array([parsed[i][1] for i in order], dtype=np.int64),
        output_len=np.array([parsed[i][2] for i in order], dtype=np.int64),
        blocks=_session_blocks([parsed[i] for i in order], sessions),
    )


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
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecError(f"{p}:{n}: not a JSON object ({e.msg})") from None
        if not isinstance(row, dict):
            raise SpecError(f"{p}:{n}: each line must be a JSON object")
        rows.append(row)
    return rows


def _read_csv(p: Path) -> list[dict[str, Any]]:
    with p.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise SpecError(f"{p}: CSV lacks the column(s) {', '.join(missing)}; "
                            f"needed: {', '.join(COLUMNS)} (hash_ids optional)")
        return list(reader)


def _row(row: dict[str, Any], p: Path, n: int) -> tuple[float, int, int, tuple[int, ...] | None]:
    try:
        ts = float(row["timestamp"])
        inp, out = int(float(row["input_length"])), int(float(row["output_length"]))
    except KeyError as e:
        raise SpecError(f"{p} row {n}: lacks {e.args[0]!r}; needed: {', '.join(COLUMNS)}") \
            from None
    except (TypeError, ValueError):
        raise SpecError(f"{p} row {n}: timestamp, input_length and output_length must be "
                        "numbers") from None
    if inp < 1 or out < 1 or ts < 0:
        raise SpecError(f"{p} row {n}: input_length={inp} and output_length={out} must be >= 1 "
                        f"and timestamp={ts:g} >= 0")
    ids = row.get("hash_ids")
    blocks: tuple[int, ...] | None
    if ids is None or ids == "":
        blocks = None
    elif isinstance(ids, list):
        blocks = tuple(int(x) for x in ids)
    else:
        blocks = tuple(int(x) for x in re.findall(r"-?\d+", str(ids)))
    return ts, inp, out, blocks
