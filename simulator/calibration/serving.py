"""Fixed latencies of the serving stack around the engine, fitted on measured deployments.

A measured TTFT holds more than engine steps: the API server (HTTP, tokenization, routing) and, for
P/D, the handoff between prefill and decode (proxy hop, transfer setup, the decode side picking the
request up). Each engine step also carries a fixed cost that the kernel tables do not (scheduling
and launches the GPU does not hide). `benchmarks/fit_serving_overhead.py` fits one value of each
per engine on the low-concurrency rows of a fixed half of aiconfigurator-core's silicon sample
(where queueing is negligible), and writes `data/serving_overhead.json`; `rackplan validate`
reports its error on the rows that were not fitted as well.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

FIT_MAX_CONCURRENCY = 8
"""Rows at or below this concurrency are queue-free enough to fit fixed latencies on."""


@dataclass(frozen=True)
class ServingOverhead:
    """Fixed latencies of one engine's serving stack, in ms."""

    api_overhead_ms: float = 0.0
    """Arrival to scheduler."""
    step_overhead_ms: float | None = None
    """Per engine step; None: the cost model's default."""
    handoff_ms: float = 0.0
    """P/D handoff besides the KV bytes."""


def in_fit_half(row_id: str) -> bool:
    """The fixed half of the measured rows that fitting may use (a hash of the row id)."""
    return zlib.crc32(row_id.encode()) % 2 == 0


@cache
def _table() -> dict[str, Any]:
    path = resources.files("simulator.calibration").joinpath("data/serving_overhead.json")
    if not path.is_file():
        return {}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def serving_overhead(engine: str, disaggregated: bool) -> ServingOverhead:
    """The fitted overhead of an engine (zeros where nothing was fitted)."""
    fitted = _table().get("engines", {}).get(engine, {})
    step = fitted.get("step_overhead_ms")
    return ServingOverhead(
        api_overhead_ms=float(fitted.get("api_overhead_ms", 0.0)),
        step_overhead_ms=None if step is None else float(step),
        handoff_ms=float(fitted.get("handoff_ms", 0.0)) if disaggregated else 0.0)
