"""FlashMLA's mega-attention kernel for DeepSeek-V4.1 decode, as vLLM measured it on one GB300.

The figures are `data/dsv41_mega_attn.csv` (source, conditions and licence in
`data/dsv41_mega_attn.md`): one attention layer's decode operations (the query's pad with the
window KV insert, then the fused kernel) in a CUDA graph, for a 64-head model whose queries each
attend 128 window entries (fp8 records) and 512 compressed ones (NVFP4 records), at 1 to 512
query tokens a GPU and 8 to 64 live heads. `Calibration.dsv41_attention` carries them to other
conditions.
"""

from __future__ import annotations

import csv
import functools
from importlib import resources

import numpy as np

from simulator.calibration.grid import EXTRAPOLATED, INTERPOLATED, MEASURED

HARDWARE = "gb300"
"""The system the table was measured on."""
HEADS, HEAD_DIM, WINDOW, TOPK = 64, 512, 128, 512
"""The measured model's query heads and head dim, and the entries each query attends: its
window and the indexer's top-k compressed records."""
KV_CACHE = "fp4"
"""The compressed records' dtype in the measurement (NVFP4; the window's are fp8 either way)."""
TABLE = "vllm/benchmark_dsv41_mega_attn (gb300)"
"""How a price read from the table names it in provenance."""


@functools.cache
def _rows() -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Live heads -> (query tokens, ms of the mega path), sorted by query tokens."""
    text = resources.files("simulator.calibration").joinpath("data/dsv41_mega_attn.csv")
    points: dict[int, list[tuple[float, float]]] = {}
    with text.open() as f:
        for r in csv.DictReader(f):
            points.setdefault(int(r["live_heads"]), []).append(
                (float(r["s_q"]), float(r["mega_us"]) / 1000))
    return {h: (np.array([q for q, _ in sorted(p)]), np.array([ms for _, ms in sorted(p)]))
            for h, p in points.items()}


def measured_ms(live_heads: int, s_q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ms of one layer's mega attention at `s_q` query tokens a GPU for a shard of `live_heads`
    heads under the table's conditions, and each point's provenance code: measured on the
    table's points; interpolated between them, linearly in the query tokens (a fixed part and a
    part per query token); past the largest, extrapolated by the last segment's time per query
    token (the kernel is bound by its work there); for a head count the table lacks, the
    nearest measured one (in log), extrapolated."""
    rows = _rows()
    near = min(rows, key=lambda h: (abs(np.log(h / max(live_heads, 1))), h))
    q, ms = rows[near]
    s = np.maximum(np.atleast_1d(np.asarray(s_q, dtype=float)), q[0])
    slope = (ms[-1] - ms[-2]) / (q[-1] - q[-2])
    out = np.where(s > q[-1], ms[-1] + (s - q[-1]) * slope, np.interp(s, q, ms))
    codes = np.where(np.isin(s, q), MEASURED, INTERPOLATED)
    codes = np.where(s > q[-1], EXTRAPOLATED, codes)
    if near != live_heads:
        codes = np.maximum(codes, EXTRAPOLATED)
    return out, codes
