"""Measured kernel tables for one (hardware, engine, version), priced through `Grid`.

Sources, in order: the user's own tables written by `rackplan calibrate` (same layout), the measured
database shipped in the `aiconfigurator-core` package, and the roofline when neither covers an op.
Every price says where it came from.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.calibration import roofline as rf
from simulator.calibration.grid import EXTRAPOLATED, ROOFLINE, SOURCES, Grid, worst
from simulator.specs.errors import SpecError
from simulator.specs.hardware import HardwareSpec

ENGINES = ("vllm", "sglang", "trtllm")

# op -> (folder, file, backend folder override); one table of what is read from where.
OP_FILES: dict[str, tuple[str, str]] = {
    "gemm": ("gemm", "gemm_perf.parquet"),
    "moe": ("moe", "moe_perf.parquet"),
    "attention_context": ("attention", "context_attention_perf.parquet"),
    "attention_generation": ("attention", "generation_attention_perf.parquet"),
    "mla_context": ("mla", "mla_context_module_perf.parquet"),
    "mla_generation": ("mla", "mla_generation_module_perf.parquet"),
    "all_to_all": ("comm", "moe_a2a_perf.parquet"),
    "allreduce": ("comm", "custom_allreduce_perf.parquet"),
    "nccl": ("comm", "nccl_perf.parquet"),
    "moe_wideep_generation": ("moe", "wideep_generation_moe_perf.parquet"),
    "moe_wideep_context": ("moe", "wideep_context_moe_perf.parquet"),
}
OP_ENGINES = {"nccl": ("nccl",), "moe_wideep_generation": ("sglang",),
              "moe_wideep_context": ("sglang",)}
"""Ops whose tables sit under a library's folder rather than the engine's."""
NCCL_OPS = ("all_gather", "reduce_scatter", "all_reduce", "alltoall")

GEMM_DTYPES = {"bf16": ["bfloat16"], "fp8": ["fp8_block", "fp8"], "fp4": ["nvfp4"]}
MOE_DTYPES = {"bf16": ["bfloat16"], "fp8": ["fp8_block", "fp8"],
              "fp4": ["nvfp4", "w4a16_mxfp4"]}
KV_DTYPES = {"bf16": "bfloat16", "fp8": "fp8"}
MLA_GEMM = {"bf16": "bfloat16", "fp8": "fp8_block", "fp4": "fp8_block"}
FALLBACK = {"fp4": "fp8", "fp8": "bf16"}
"""When no row has a dtype, price with the next dtype's efficiency (flagged extrapolated)."""

LATENCY_UNIT_MS = {"all_to_all": 1e-3}
"""Tables whose latency column is not in ms (the all-to-all table is in microseconds)."""

# DeepSeek-V3's MLA block, the model the shipped MLA module tables were measured on.
DSV3_MLA = {"hidden": 7168, "q_lora": 1536, "kv_lora": 512, "nope": 128, "rope": 64, "v": 128}


@dataclass(frozen=True)
class Priced:
    """Latency of one operation for each queried point, and where the numbers came from."""

    ms: np.ndarray
    """Milliseconds per query point."""
    source: str
    """Least trustworthy provenance among the points (measured, interpolated, extrapolated,
    roofline)."""
    table: str
    """The table that priced it (system/op/engine/version), or 'roofline'."""

    def scaled(self, factor: float | np.ndarray) -> Priced:
        return Priced(self.ms * factor, self.source, self.table)


def mla_shape_params(hidden: int, q_lora: int, kv_lora: int, nope: int, rope: int,
                     v: int) -> tuple[float, float]:
    """(params shared by all heads, params per head) of an MLA block's projections."""
    shared = hidden * q_lora + hidden * (kv_lora + rope)
    per_head = q_lora * (nope + rope) + kv_lora * (nope + v) + v * hidden
    return float(shared), float(per_head)


def _version_key(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.replace("rc", ".").replace(".post", ".").split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def aic_system_dir(system: str) -> Path:
    """The measured-data folder of one system inside the aiconfigurator-core package."""
    return Path(str(resources.files("aiconfigurator_core"))) / "systems" / "data" / system


@dataclass
class Calibration:
    """Per-operation latency for one hardware and engine; tables loaded once and cached."""

    hardware: HardwareSpec
    engine: str
    version: str | None = None
    """Engine version to prefer; None: the newest table per op."""
    user_dir: Path | None = None
    """Tables written by `rackplan calibrate`, preferred over the shipped ones."""
    _frames: dict[str, tuple[pd.DataFrame, str] | None] = field(default_factory=dict, repr=False)
    _grids: dict[tuple[Any, ...], tuple[Grid, int, str] | None] = field(
        default_factory=dict, repr=False)

    # ---- table discovery ---------------------------------------------------------------------

    def _locate(self, op: str, engines: tuple[str, ...] | None = None,
                user: bool = True) -> tuple[Path, str] | None:
        folder, fname = OP_FILES[op]
        roots: list[tuple[Path, str]] = []
        if self.user_dir is not None and user:
            roots.append((self.user_dir / folder, "user"))
        if self.hardware.system:
            roots.append((aic_system_dir(self.hardware.system) / folder, self.hardware.system))
        if engines is None:
            engines = OP_ENGINES.get(op, tuple(dict.fromkeys((self.engine, "vllm"))))
        for root, label in roots:
            for engine in engines:
                base = root / engine
                if not base.is_dir():
                    continue
                versions = sorted((p.name for p in base.iterdir() if (p / fname).is_file()),
                                  key=_version_key)
                if not versions:
                    continue
                pick = self.version if self.version in versions else versions[-1]
                return base / pick / fname, f"{label}/{folder}/{engine}/{pick}"
        return None

    def frame(self, op: str) -> tuple[pd.DataFrame, str] | None:
        """The raw table of an op and its label, or None when no table covers it."""
        if op not in self._frames:
            found = self._locate(op)
            self._frames[op] = None if found is None else (pd.read_parquet(found[0]), found[1])
        return self._frames[op]

    def _other_frames(self, op: str) -> list[tuple[pd.DataFrame, str]]:
        """The same op measured on the same system by the other engines, for shapes or dtypes
        the engine's own table lacks."""
        if op in OP_ENGINES:
            return []
        own = self.frame(op)
        out = []
        for engine in ENGINES:
            key = f"{op}@{engine}"
            if key not in self._frames:
                found = self._locate(op, (engine,), user=False)
                self._frames[key] = (None if found is None
                                     else (pd.read_parquet(found[0]), found[1]))
            got = self._frames[key]
            if got is not None and (own is None or got[1] != own[1]):
                out.append(got)
        return out

    def load_all(self) -> Calibration:
        """Read every table now (otherwise each is read on first use)."""
        for op in OP_FILES:
            self.frame(op)
        return self

    def _grid(self, key: tuple[Any, ...], op: str,
              select: Callable[[pd.DataFrame], tuple[pd.DataFrame, int]],
              axes: list[str],
              roof: Callable[[pd.DataFrame], np.ndarray]) -> tuple[Grid, int, str] | None:
        """A cached Grid for the rows `select` keeps; the int is the provenance floor.

        When the engine's own table lacks the shape or dtype (rows only by transfer from another
        shape or dtype), another engine's measurement of the same kernel on the same system is
        preferred to the transfer."""
        if key not in self._grids:

            def build(got: tuple[pd.DataFrame, str] | None) -> tuple[Grid, int, str] | None:
                if got is None:
                    return None
                df, label = got
                rows, floor = select(df)
                if not len(rows):
                    return None
                rows = rows.assign(latency=rows["latency"] * LATENCY_UNIT_MS.get(op, 1.0))
                pts = rows[axes].to_numpy(dtype=float)
                return Grid.build(pts, rows["latency"].to_numpy(float), roof(rows)), floor, label

            built = build(self.frame(op))
            if built is None or built[1] >= EXTRAPOLATED:
                for other in self._other_frames(op):
                    alt = build(other)
                    if alt is not None and alt[1] < EXTRAPOLATED:
                        built = alt
                        break
            self._grids[key] = built
        return self._grids[key]

    @staticmethod
    def _price(grid: tuple[Grid, int, str] | None, points: np.ndarray, roof: np.ndarray,
               default_eff: float) -> Priced:
        if grid is None:
            return Priced(np.asarray(roof, dtype=float) / default_eff, SOURCES[ROOFLINE],
                          "roofline")
        g, floor, label = grid
        ms, codes = g.query(points, roof)
        return Priced(ms, worst(np.maximum(codes, floor)), label)

    # ---- row selection helpers ---------------------------------------------------------------

    @staticmethod
    def _pick_dtype(df: pd.DataFrame, col: str, table: dict[str, list[str]],
                    dtype: str) -> tuple[pd.DataFrame, int]:
        floor, d = 0, dtype
        while True:
            rows = df[df[col].isin(table[d])]
            if len(rows):
                return rows, floor
            if d not in FALLBACK:
                return rows, floor
            d, floor = FALLBACK[d], EXTRAPOLATED

    @staticmethod
    def _nearest(df: pd.DataFrame, want: dict[str, float]) -> tuple[pd.DataFrame, int]:
        """Rows whose shape columns equal `want`, else the nearest shape in log space."""
        if not len(df):
            return df, 0
        mask = np.ones(len(df), dtype=bool)
        for c, v in want.items():
            mask &= df[c].to_numpy() == v
        if mask.any():
            return df[mask], 0
        shapes = df[list(want)].drop_duplicates().to_numpy(dtype=float)
        target = np.log(np.maximum(np.array(list(want.values()), dtype=float), 1))
        best = shapes[np.argmin(np.abs(np.log(np.maximum(shapes, 1)) - target).sum(axis=1))]
        mask = np.ones(len(df), dtype=bool)
        for c, v in zip(want, best, strict=True):
            mask &= df[c].to_numpy() == v
        return df[mask], EXTRAPOLATED

    # ---- operations --------------------------------------------------------------------------

    def gemm(self, m: np.ndarray | float, n: int, k: int, dtype: str) -> Priced:
        """Dense GEMM [m, k] x [k, n] in a weight dtype (bf16, fp8, fp4)."""
        hw = self.hardware

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            return self._pick_dtype(df, "gemm_dtype", GEMM_DTYPES, dtype)

        grid = self._grid(("gemm", dtype), "gemm", select, ["m", "n", "k"],
                          lambda r: rf.gemm(hw, r.m, r.n, r.k, dtype))
        m = np.atleast_1d(np.asarray(m, dtype=float))
        pts = np.stack([m, np.full_like(m, n), np.full_like(m, k)], axis=1)
        return self._price(grid, pts, rf.gemm(hw, m, n, k, dtype), 0.6)

    def moe(self, tokens: np.ndarray | float, hidden: int, inter: int, topk: int, experts: int,
            ep: int, dtype: str, tp: int = 1) -> Priced:
        """MoE grouped GEMM on one rank; `tokens` = tokens over the EP group, balanced.

        Experts are split over `ep` ranks (expert parallel) or each expert over `tp` ranks.

        A rank that receives R token-to-expert assignments costs what a balanced group of
        R * ep / topk tokens costs: pass that to price an imbalanced rank.
        """
        hw = self.hardware

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            rows, floor = self._pick_dtype(df[(df.moe_tp_size == 1) | (df.moe_ep_size == 1)],
                                           "moe_dtype", MOE_DTYPES, dtype)
            dist = "balanced" if (rows.distribution == "balanced").any() else "power_law_1.01"
            rows, f2 = self._nearest(rows[rows.distribution == dist], {
                "hidden_size": hidden, "inter_size": inter, "topk": topk,
                "num_experts": experts})
            return rows, max(floor, f2)

        def roof(r: pd.DataFrame) -> np.ndarray:
            return rf.moe(hw, r.num_tokens, r.hidden_size.to_numpy(), r.inter_size.to_numpy(),
                          r.topk.to_numpy(), r.num_experts.to_numpy(), r.moe_ep_size, dtype,
                          r.moe_tp_size.to_numpy())

        grid = self._grid(("moe", hidden, inter, topk, experts, dtype), "moe", select,
                          ["num_tokens", "moe_ep_size", "moe_tp_size"], roof)
        t = np.maximum(np.atleast_1d(np.asarray(tokens, dtype=float)), 1.0)
        pts = np.stack([t, np.full_like(t, ep), np.full_like(t, tp)], axis=1)
        return self._price(grid, pts,
                           rf.moe(hw, t, hidden, inter, topk, experts, ep, dtype, tp), 0.5)

    def moe_wideep(self, tokens: np.ndarray | float, hidden: int, inter: int, topk: int,
                   experts: int, ep: int, dtype: str, low_latency: bool) -> Priced:
        """Expert compute of one rank behind a DeepEP dispatch (wide EP): it runs only the
        tokens routed to its own experts. `tokens` counts tokens over the EP group, balanced;
        the low-latency table prices decode, the normal one prefill."""
        hw = self.hardware
        op = "moe_wideep_generation" if low_latency else "moe_wideep_context"

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            rows, floor = self._pick_dtype(df, "moe_dtype", MOE_DTYPES, dtype)
            rows, f2 = self._nearest(rows[rows.distribution == "uniform"], {
                "hidden_size": hidden, "inter_size": inter, "topk": topk,
                "num_experts": experts})
            return rows, max(floor, f2)

        def roof(r: pd.DataFrame) -> np.ndarray:
            return rf.moe(hw, r.num_tokens, r.hidden_size.to_numpy(), r.inter_size.to_numpy(),
                          r.topk.to_numpy(), r.num_experts.to_numpy(), r.moe_ep_size, dtype)

        grid = self._grid((op, hidden, inter, topk, experts, dtype), op, select,
                          ["num_tokens", "moe_ep_size"], roof)
        t = np.maximum(np.atleast_1d(np.asarray(tokens, dtype=float)), 1.0)
        pts = np.stack([t, np.full_like(t, ep)], axis=1)
        return self._price(grid, pts, rf.moe(hw, t, hidden, inter, topk, experts, ep, dtype),
                           0.5)

    def _gqa(self, op: str, batch: np.ndarray | float, length: np.ndarray | float, heads: int,
             kv_heads: int, head_dim: int, kv_dtype: str, window: int) -> Priced:
        hw = self.hardware
        axis = "isl" if op == "attention_context" else "step"
        fn = rf.attention_context if op == "attention_context" else rf.attention_generation

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            rows = df[(df.kv_cache_dtype == KV_DTYPES[kv_dtype]) & (df.window_size == window)]
            return self._nearest(rows, {"head_dim": head_dim, "num_key_value_heads": kv_heads})

        def roof(r: pd.DataFrame) -> np.ndarray:
            return fn(hw, r.batch_size, r[axis], r.num_heads.to_numpy(),
                      r.num_key_value_heads.to_numpy(), r.head_dim.to_numpy(), kv_dtype)

        grid = self._grid((op, kv_heads, head_dim, kv_dtype, window), op, select,
                          ["batch_size", axis, "num_heads"], roof)
        b, s = np.broadcast_arrays(np.atleast_1d(np.asarray(batch, dtype=float)),
                                   np.atleast_1d(np.asarray(length, dtype=float)))
        b, s = np.maximum(b, 1.0), np.maximum(s, 1.0)
        pts = np.stack([b, s, np.full_like(b, heads)], axis=1)
        return self._price(grid, pts, fn(hw, b, s, heads, kv_heads, head_dim, kv_dtype), 0.4)

    def attention_context(self, batch: np.ndarray | float, isl: np.ndarray | float, heads: int,
                          kv_heads: int, head_dim: int, kv_dtype: str, window: int = 0) -> Priced:
        """GQA prefill attention kernel: `batch` requests of `isl` new tokens, heads per rank."""
        return self._gqa("attention_context", batch, isl, heads, kv_heads, head_dim, kv_dtype,
                         window)

    def attention_generation(self, batch: np.ndarray | float, context: np.ndarray | float,
                             heads: int, kv_heads: int, head_dim: int, kv_dtype: str,
                             window: int = 0) -> Priced:
        """GQA decode attention kernel: `batch` requests over `context` cached tokens."""
        return self._gqa("attention_generation", batch, context, heads, kv_heads, head_dim,
                         kv_dtype, window)

    def _mla(self, op: str, batch: np.ndarray | float, length: np.ndarray | float, heads: int,
             shape: dict[str, int], weights: str, kv_dtype: str) -> Priced:
        hw = self.hardware
        context = op == "mla_context"
        axis = "isl" if context else "step"

        def roof_for(s: dict[str, int], b: Any, n: Any, h: Any) -> np.ndarray:
            shared, per_head = mla_shape_params(s["hidden"], s["q_lora"], s["kv_lora"],
                                                s["nope"], s["rope"], s["v"])
            new = n if context else 1.0
            return rf.mla_module(hw, b, new, n, h, per_head, shared, s["kv_lora"], s["rope"],
                                 weights, kv_dtype)

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            rows = df[(df.kv_cache_dtype == KV_DTYPES[kv_dtype])
                      & (df.gemm_type == MLA_GEMM[weights])]
            if context:
                rows = rows[rows.step == 0]
            return rows, 0 if shape == DSV3_MLA else EXTRAPOLATED

        grid = self._grid((op, weights, kv_dtype, tuple(shape.items())), op, select,
                          ["batch_size", axis, "num_heads"],
                          lambda r: roof_for(DSV3_MLA, r.batch_size, r[axis],
                                             r.num_heads.to_numpy()))
        b, s = np.broadcast_arrays(np.atleast_1d(np.asarray(batch, dtype=float)),
                                   np.atleast_1d(np.asarray(length, dtype=float)))
        b, s = np.maximum(b, 1.0), np.maximum(s, 1.0)
        pts = np.stack([b, s, np.full_like(b, heads)], axis=1)
        return self._price(grid, pts, roof_for(shape, b, s, heads), 0.4)

    def mla_context(self, batch: np.ndarray | float, isl: np.ndarray | float, heads: int,
                    shape: dict[str, int], weights: str, kv_dtype: str) -> Priced:
        """Whole MLA block (projections + attention) for prefill of `isl` tokens per request."""
        return self._mla("mla_context", batch, isl, heads, shape, weights, kv_dtype)

    def mla_generation(self, batch: np.ndarray | float, context: np.ndarray | float, heads: int,
                       shape: dict[str, int], weights: str, kv_dtype: str) -> Priced:
        """Whole MLA block for one decode token per request over `context` cached tokens."""
        return self._mla("mla_generation", batch, context, heads, shape, weights, kv_dtype)

    def all_to_all(self, tokens: np.ndarray | float, hidden: int, topk: int, experts: int,
                   ep: int, phase: str, low_latency: bool, gb_s: float) -> Priced:
        """MoE dispatch or combine of `tokens` per rank over an EP group at `gb_s` GB/s per GPU."""
        if ep <= 1:
            t = np.atleast_1d(np.asarray(tokens, dtype=float))
            return Priced(np.zeros_like(t), "measured", "none (single rank)")
        elem = 1.0 if phase == "dispatch" else 2.0
        mode = "deepep_ll" if low_latency else "deepep_ht"
        scaleup = self.hardware.scaleup_gb_s

        def nbytes(tok: Any, h: Any, k: Any, n: Any) -> Any:
            return tok * k * h * elem * (n - 1) / n

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            rows = df[(df.comm_backend == mode) & (df.phase == phase)]
            return self._nearest(rows, {"hidden_size": hidden, "topk": topk,
                                        "num_experts": experts})

        grid = self._grid(("a2a", hidden, topk, experts, phase, mode), "all_to_all", select,
                          ["num_tokens", "ep_size"],
                          lambda r: rf.transfer(nbytes(r.num_tokens, r.hidden_size.to_numpy(),
                                                       r.topk.to_numpy(), r.ep_size), scaleup))
        t = np.maximum(np.atleast_1d(np.asarray(tokens, dtype=float)), 1.0)
        pts = np.stack([t, np.full_like(t, ep)], axis=1)
        return self._price(grid, pts, rf.transfer(nbytes(t, hidden, topk, ep), gb_s), 0.5)

    def collective(self, op: str, nbytes: np.ndarray | float, gpus: int, gb_s: float) -> Priced:
        """An NCCL collective (all_gather, reduce_scatter, all_reduce, alltoall) of `nbytes`
        (the whole gathered / reduced buffer) over `gpus` GPUs at `gb_s` GB/s per GPU."""
        if op not in NCCL_OPS:
            raise SpecError(f"collective {op!r} is not one of {', '.join(NCCL_OPS)}")
        if gpus <= 1:
            b = np.atleast_1d(np.asarray(nbytes, dtype=float))
            return Priced(np.zeros_like(b), "measured", "none (single rank)")
        factor = 2.0 if op == "all_reduce" else 1.0

        def roof(size: Any, n: Any, bw: float) -> np.ndarray:
            return rf.transfer(factor * (np.asarray(n, dtype=float) - 1) / n * size, bw)

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            return df[df.op_name == op], 0

        grid = self._grid(("nccl", op), "nccl", select, ["message_size", "num_gpus"],
                          lambda r: roof(r.message_size, r.num_gpus.to_numpy(),
                                         self.hardware.scaleup_gb_s))
        b = np.maximum(np.atleast_1d(np.asarray(nbytes, dtype=float)), 1.0)
        pts = np.stack([b, np.full_like(b, gpus)], axis=1)
        return self._price(grid, pts, roof(b, gpus, gb_s), 0.5)

    def allreduce(self, nbytes: np.ndarray | float, gpus: int, gb_s: float) -> Priced:
        """All-reduce of `nbytes` bf16 over a TP group of `gpus` GPUs (CUDA-graph kernels)."""
        if gpus <= 1:
            b = np.atleast_1d(np.asarray(nbytes, dtype=float))
            return Priced(np.zeros_like(b), "measured", "none (single rank)")

        def select(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
            if "backend" in df.columns:  # vLLM's table has eager and CUDA-graph kernels
                graph = df[df.backend.str.contains("graph")]
                return (graph if len(graph) else df), 0
            return df, 0

        grid = self._grid(("allreduce",), "allreduce", select, ["message_size", "num_gpus"],
                          lambda r: rf.allreduce(r.message_size, r.num_gpus.to_numpy(),
                                                 self.hardware.scaleup_gb_s))
        b = np.maximum(np.atleast_1d(np.asarray(nbytes, dtype=float)), 1.0)
        pts = np.stack([b, np.full_like(b, gpus)], axis=1)
        return self._price(grid, pts, rf.allreduce(b, gpus, gb_s), 0.5)


_LOADED: dict[tuple[str, str, str | None, str | None], Calibration] = {}

CALIBRATION_ENV = "RACKPLAN_CALIBRATION_DIR"
"""Environment variable naming a `rackplan calibrate` folder that load_calibration prefers
when its caller gives none (so simulate, step, search and their worker processes all use it)."""


def user_calibration_dir(user_dir: str | Path | None = None,
                         name: str = "user_dir") -> Path | None:
    """The user tables to prefer: `user_dir`, else $RACKPLAN_CALIBRATION_DIR, else none;
    `name` is what an error calls `user_dir`."""
    chosen = user_dir if user_dir is not None else os.environ.get(CALIBRATION_ENV) or None
    if chosen is None:
        return None
    if not Path(chosen).is_dir():
        given = name if user_dir is not None else CALIBRATION_ENV
        raise SpecError(f"{given}={str(chosen)!r} is not a folder; give one written by "
                        "`rackplan calibrate --out DIR`")
    return Path(chosen)


@contextmanager
def calibration_dir(path: str | Path | None, name: str = "--calibration") -> Iterator[None]:
    """While inside, load_calibration prefers the tables in `path` (None: leave as is)."""
    if path is None:
        yield
        return
    user_calibration_dir(path, name)  # a bad folder fails here, with its name
    before = os.environ.get(CALIBRATION_ENV)
    os.environ[CALIBRATION_ENV] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CALIBRATION_ENV, None)
        else:
            os.environ[CALIBRATION_ENV] = before


def load_calibration(hardware: HardwareSpec, engine: str = "vllm", version: str | None = None,
                     user_dir: str | Path | None = None) -> Calibration:
    """The calibration of one hardware and engine, shared by every caller in the process.

    `user_dir` (default: $RACKPLAN_CALIBRATION_DIR) holds tables written by `rackplan
    calibrate`, preferred over the shipped ones."""
    if engine not in ENGINES:
        raise SpecError(f"engine={engine!r} is not one of {', '.join(ENGINES)}")
    user = user_calibration_dir(user_dir)
    key = (hardware.name, engine, version, str(user) if user else None)
    if key not in _LOADED:
        _LOADED[key] = Calibration(hardware, engine, version, user)
    return _LOADED[key]
