"""Memoized step pricing: `simulator.cost.step_time` on a rounded batch signature.

The cost model charges the slowest DP rank for attention and dense work and the most-loaded EP
rank for the MoE, so a step's time depends on the ranks only through maxima of per-rank
costs that grow with each rank's decode requests, decode context, prefill tokens, prefill
requests and prefill context. Two reductions follow, and they make the signature small:

1. every per-rank value is rounded to `bits` significant bits (6, SimOptions.price_bits:
   within 0.8%; integers below 64 stay exact), and so is the largest EP rank's assignment
   count;
2. a rank whose rounded row is dominated (no larger in any column) by another rank's row cannot
   set any maximum, so only the Pareto front of the rows is kept, sorted.

A step whose rounded rows, rank by rank, are those of a step seen before (most steps: a decode
batch changes rarely and its contexts creep) is answered from those rows without taking the
front. The step is priced once per distinct signature, on a batch made of the front's rows
(padded to the DP size by repeating the first), and the price is reused, also by later runs in
the same process that price the same instance with the same tables (a search simulates many
deployments whose roles repeat): the memo is shared per (calibration, instance), bounded in
size. The expert load is drawn per step, so one front comes back with many loads (three a
front in the default search's decode steps): only the routed experts' price depends on it, so
the cost model composes a front's step once (`simulator.cost.step.open_step`) and finishes it
for each load with one MoE price (`close_step`; the same StepTime as `step_time`, bit for bit).
`misses` counts the composed fronts. The operations they price go through
`simulator.cost.price_cache`, which remembers each operation's price per point.

Against pricing every step directly (benchmarks/price_memo.py, 6 bits): a median error of
0.2-0.5 %, p99 1-4 %; at 8 bits the median is 0.08-0.12 % and 98 % of steps are within 0.5 %.
The worst steps sit where the cost model's own price jumps (a V4 prefill attention module by up
to 2x within 2 % of context, a sparse MoE table by 30 % at 32 tokens), where any rounding errs,
or is not monotone in a rank's work (GB300's measured GEMM at 1 token costs 3x that at 5), where
the front drops a rank that would have set the maximum. A short run whose steps are nearly all
priced once gains nothing from the memo and its results move with the rounding (docs/speed.md).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, cast

import numpy as np

from simulator.calibration import Calibration
from simulator.cost import Batch, Instance, StepTime, step_time
from simulator.cost.price_cache import CachedCalibration, round_bits
from simulator.cost.step import (
    OpenStep,
    close_step,
    open_step,
    rank_work_ms,
    step_replays,
    step_shares,
)

FEW_ROWS = 32
"""Up to this many rows, `pareto_front` works on Python floats (numpy's per-call cost dominates
at a step's few DP ranks)."""


def _front_of_few(rows: np.ndarray) -> np.ndarray:
    """`pareto_front` in plain Python: the same rows, bit for bit, in the same order. Sorted
    ascending, a row can only be dominated by one after it (a dominating row is larger)."""
    unique = sorted(dict.fromkeys(map(tuple, rows.tolist())))
    if rows.shape[1] == 5:  # a step's rows: the comparisons written out
        keep = []
        for i, r in enumerate(unique):
            a, b, c, d, e = r
            for s in unique[i + 1:]:
                if s[0] >= a and s[1] >= b and s[2] >= c and s[3] >= d and s[4] >= e:
                    break
            else:
                keep.append(r)
    else:
        keep = [r for i, r in enumerate(unique)
                if not any(all(x >= y for x, y in zip(s, r, strict=True))
                           for s in unique[i + 1:])]
    return np.array(keep, dtype=float).reshape(len(keep), rows.shape[1])


def pareto_front(rows: np.ndarray) -> np.ndarray:
    """Unique rows not dominated by another row (all columns >=, one >), in sorted order."""
    if 1 < len(rows) <= FEW_ROWS and rows.ndim == 2 and not np.isnan(rows).any():
        return _front_of_few(rows)
    if len(rows) > 1:
        rows = rows[np.lexsort(rows.T[::-1])]
        rows = rows[np.concatenate(([True], np.any(rows[1:] != rows[:-1], axis=1)))]
    if len(rows) <= 1:
        return rows
    ge: np.ndarray = np.all(rows[None, :, :] >= rows[:, None, :], axis=2)  # row j >= row i
    np.fill_diagonal(ge, False)
    front: np.ndarray = rows[~np.any(ge, axis=1)]
    return front


ROWS_ENTRIES = 200_000
"""Prices one pricer keeps by its steps' rows as they came; past it, it starts afresh."""

WAIT_ROWS = 16_384
"""Ranks' rows `dp_waits` prices in one vectorised call."""

SHARED_ENTRIES = 400_000
"""Prices one calibration's shared memo keeps; a pricer created when it holds more starts it
afresh."""

_shared: dict[int, tuple[Calibration, dict[tuple[Any, ...], StepTime],
                        dict[tuple[Any, ...], OpenStep], CachedCalibration]] = {}
"""id(calibration) -> (the calibration, kept alive so that its id stays its own; its memo of
prices; its memo of opened steps; its operation prices per point)."""


def instance_key(inst: Instance) -> tuple[Any, ...]:
    """What prices an instance's steps, hashable (model and hardware by name)."""
    return (inst.model.name, inst.hardware.name, *(
        getattr(inst, f.name) for f in fields(inst) if f.name not in ("model", "hardware")))


def _shared_memo(calibration: Calibration) -> tuple[dict[tuple[Any, ...], StepTime],
                                                   dict[tuple[Any, ...], OpenStep],
                                                   CachedCalibration]:
    entry = _shared.get(id(calibration))
    if entry is None:
        if len(_shared) >= 8:
            _shared.clear()
        entry = _shared[id(calibration)] = (calibration, {}, {}, CachedCalibration(calibration))
    memo, opened = entry[1], entry[2]
    if len(memo) > SHARED_ENTRIES:
        memo.clear()
    if len(opened) > SHARED_ENTRIES:
        opened.clear()
    return memo, opened, entry[3]


def operation_prices(calibration: Calibration) -> Calibration:
    """A stand-in for `calibration` that prices each operation point as it does, bit for bit,
    remembering the prices: the one the step memos of `calibration` share, so that whatever
    else prices steps with these tables (the planner's screen) shares its points with the
    simulations in the process, and they with it."""
    return cast(Calibration, _shared_memo(calibration)[2])


class StepPricer:
    """Prices steps of one cost-model instance, remembering each rounded signature."""

    def __init__(self, instance: Instance, calibration: Calibration, bits: int = 6) -> None:
        self.instance, self.calibration, self.bits = instance, calibration, bits
        self._memo: dict[tuple[bytes, float], StepTime] = {}
        self._opened: dict[bytes, OpenStep] = {}
        """The fronts' steps priced but for their routed experts (`OpenStep`)."""
        self._rows: dict[tuple[bytes, float], StepTime] = {}
        """The same prices by the rounded rows before the front is taken (rank order kept)."""
        self._waits: dict[bytes, float] = {}
        """DP waits by the rounded rows (`dp_wait`)."""
        self._rank_ms: dict[bytes, float] = {}
        """One rank's own work in ms by its rounded row and its step's decisions
        (`rank_work_ms`)."""
        self._shared, self._shared_opened, self._ops = _shared_memo(calibration)
        self._ops.lattice_bits = bits  # decode contexts priced ahead on this memo's lattice
        self._key = instance_key(instance)
        self._ep = instance.ep > 1
        self.calls = 0
        """Prices looked up through this pricer (a run of identical steps looks up one)."""
        probe = step_time(instance, Batch.decode(instance.dp, 1, 1), calibration)
        self.accepted_per_request = probe.tokens / instance.dp
        """Tokens a decode request gains per step (1, or more with speculative decoding)."""

    @property
    def misses(self) -> int:
        """Distinct fronts (rounded rows) whose steps the cost model composed."""
        return len(self._opened)

    @property
    def expert_loads(self) -> int:
        """Distinct signatures (front and most-loaded EP rank), each finished from its front's
        opened step with one routed-experts price."""
        return len(self._memo)

    def price(self, decode_requests: np.ndarray, decode_context: np.ndarray,
              prefill_tokens: np.ndarray, prefill_requests: np.ndarray,
              prefill_context: np.ndarray, expert_tokens: np.ndarray | None) -> StepTime:
        """The StepTime of one step; arrays have one entry per DP rank (expert_tokens per EP
        rank, most-loaded first, or None when the instance has no expert parallelism)."""
        self.calls += 1
        columns = self.rounded_columns(decode_requests, decode_context, prefill_tokens,
                                       prefill_requests, prefill_context)
        top = 0.0 if expert_tokens is None else round_bits(float(expert_tokens[0]), self.bits)
        seen = (columns.tobytes(), top)  # the rows as they are: most steps repeat the last
        hit = self._rows.get(seen)
        if hit is not None:
            return hit
        rows = pareto_front(columns.T)
        front = rows.tobytes()
        key = (front, top)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._shared.get((self._key, *key))
            if hit is not None:
                self._memo[key] = hit
        if hit is not None:
            self._remember(seen, hit)
            return hit
        priced = self._exact(rows, front, top, expert_tokens)
        self._memo[key] = self._shared[(self._key, *key)] = priced
        self._remember(seen, priced)
        return priced

    def repeats(self, decode_requests: np.ndarray, decode_context: np.ndarray) -> int:
        """Of decode-only steps with these requests per rank and `decode_context` (one row per
        step, one column per rank), how many in a row from the first have the first's rounded
        rows, and so its price (with the same expert load)."""
        rounded = round_bits(decode_context, self.bits)
        same = np.all(rounded == rounded[0], axis=1)
        return len(same) if same.all() else int(np.argmin(same))

    def rounded_columns(self, decode_requests: np.ndarray, decode_context: np.ndarray,
                        prefill_tokens: np.ndarray, prefill_requests: np.ndarray,
                        prefill_context: np.ndarray) -> np.ndarray:
        """A step's per-rank figures rounded to `bits` significant bits, one column per rank:
        what `price` looks steps up by, and what `dp_waits` takes."""
        return cast(np.ndarray, round_bits(np.array([decode_requests, decode_context,
                                                     prefill_tokens, prefill_requests,
                                                     prefill_context]), self.bits))

    def dp_wait(self, decode_requests: np.ndarray, decode_context: np.ndarray,
                prefill_tokens: np.ndarray, prefill_requests: np.ndarray,
                prefill_context: np.ndarray) -> float:
        """GPU-ms the DP ranks of a step wait for the rank with the most work of its own
        (`rank_work_ms`: attention, mHC, shared experts, router, logits): the sum over ranks of
        (largest - own), on the rounded rows `price` uses."""
        return self.dp_waits([self.rounded_columns(
            decode_requests, decode_context, prefill_tokens, prefill_requests,
            prefill_context)])[0]

    def dp_waits(self, steps: list[np.ndarray]) -> list[float]:
        """`dp_wait` of several steps (`rounded_columns` each), their ranks' rows priced
        together: one vectorised pricing, WAIT_ROWS at a time, of every row none priced before
        (a rank's price depends on its row and its step's replay and shared-stream decisions
        alone, and is the same priced alone or among others, bit for bit)."""
        keys = [c.tobytes() for c in steps]
        todo = {k: c for k, c in zip(keys, steps, strict=True) if k not in self._waits}
        if not todo:
            return [self._waits[k] for k in keys]
        if len(self._waits) + len(todo) > ROWS_ENTRIES:
            self._waits.clear()
        if len(self._rank_ms) > ROWS_ENTRIES:
            self._rank_ms.clear()
        engine = self.calibration.engine
        rows: dict[tuple[bool, bool], dict[bytes, np.ndarray]] = {}
        named: dict[bytes, list[bytes]] = {}
        for k, c in todo.items():
            step = Batch(*c)
            how = (step_replays(self.instance, step), step_shares(self.instance, step, engine))
            mark = bytes((b"-r"[how[0]], b"-s"[how[1]]))
            named[k] = [row.tobytes() + mark for row in c.T.copy()]
            for name, row in zip(named[k], c.T, strict=True):
                if name not in self._rank_ms:
                    rows.setdefault(how, {})[name] = row
        for (replay, shared), new in rows.items():
            names, values = list(new), list(new.values())
            for at in range(0, len(values), WAIT_ROWS):
                part = np.array(values[at:at + WAIT_ROWS]).T
                priced = rank_work_ms(self.instance, Batch(*part),
                                      cast(Calibration, self._ops), replay, shared)
                for name, got in zip(names[at:at + WAIT_ROWS],  # one row: priced per rank
                                     priced[:part.shape[1]].tolist(), strict=True):
                    self._rank_ms[name] = got
        for k in todo:
            ms = np.array([self._rank_ms[name] for name in named[k]])
            self._waits[k] = float((ms.max() - ms).sum())
        return [self._waits[k] for k in keys]

    def _exact(self, rows: np.ndarray, front: bytes, top: float,
               expert_tokens: np.ndarray | None) -> StepTime:
        """The cost model's price of the step of `rows` (a front, as bytes `front`) whose
        most-loaded EP rank receives `top` assignments."""
        ops = cast(Calibration, self._ops)
        opened = self._opened.get(front)
        if opened is None:
            opened = self._shared_opened.get((self._key, front))
            if opened is None:
                dp = self.instance.dp
                padded = np.concatenate([rows, np.repeat(rows[:1], dp - len(rows), axis=0)])
                batch = Batch(padded[:, 0], padded[:, 1], padded[:, 2], padded[:, 3],
                              padded[:, 4])
                opened = self._shared_opened[(self._key, front)] = open_step(
                    self.instance, batch, ops)
            self._opened[front] = opened
        most = None
        if self._ep and expert_tokens is not None and expert_tokens[0] > 0:
            # the assignments a batch carrying these expert tokens scaled to `top` has
            most = float(np.max(expert_tokens * (top / float(expert_tokens[0]))))
        return close_step(self.instance, opened, ops, most)

    def _remember(self, rows: tuple[bytes, float], priced: StepTime) -> None:
        if len(self._rows) >= ROWS_ENTRIES:
            self._rows.clear()
        self._rows[rows] = priced
