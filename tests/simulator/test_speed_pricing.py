"""The shortcuts that make pricing cheap give the prices of the slow way, bit for bit: a step
composed once and finished per expert load (simulator.cost.step.open_step / close_step, as the
step memo uses them) is the step priced directly, and a single-point grid query that skips the
corners of the axes it sits on is the sum over all of them, and a DP wait priced from the
ranks' remembered rows is the wait of the whole step."""

from __future__ import annotations

import bisect
import itertools
import math
from typing import cast

import numpy as np
import pytest

from simulator.calibration import Calibration, load_calibration
from simulator.calibration import roofline as rf
from simulator.calibration.grid import EXTRAPOLATED, INTERPOLATED, MEASURED, Grid
from simulator.cost import Batch, Instance, step_time
from simulator.cost.price_cache import CachedCalibration
from simulator.cost.step import (
    close_step,
    instance_from_role,
    most_loaded,
    open_step,
    rank_work_ms,
)
from simulator.des import pricing
from simulator.des.pricing import StepPricer, pareto_front, round_bits
from simulator.specs.deployment import RoleSpec, Speculative
from simulator.specs.hardware import load_hardware
from simulator.specs.model import load_model

ROLES = [
    ("decode", RoleSpec(instances=1, dep=16, speculative=Speculative(tokens=3, acceptance=0.8))),
    ("decode", RoleSpec(instances=1, dep=8, dbo=True)),
    ("prefill", RoleSpec(instances=1, dep=4, dbo=True)),
    ("aggregated", RoleSpec(instances=1, dep=8)),
    ("aggregated", RoleSpec(instances=1, tp=8)),
]


def _batch(role: str, dp: int, ranks: int, rng: np.random.Generator) -> Batch:
    z = np.zeros(dp)
    dec = z if role == "prefill" else rng.integers(0, 200, dp).astype(float)
    ctx = np.exp(rng.uniform(3, 11, dp)) * (dec > 0)
    pre = z if role == "decode" else rng.integers(0, 8000, dp).astype(float)
    req = np.ceil(pre / 2000)
    past = np.exp(rng.uniform(0, 11, dp)) * (pre > 0)
    experts = None if rng.random() < 0.3 else np.sort(rng.uniform(0, 5000, ranks))[::-1]
    return Batch(dec, ctx, pre, req, past, expert_tokens=experts)


def _instances(model: str, hardware: str) -> tuple[Calibration, list[tuple[str, Instance]]]:
    """The calibration of `hardware`, and an instance of `model` for each of ROLES."""
    hw, m = load_hardware(hardware), load_model(model)
    return load_calibration(hw), [(role, instance_from_role(m, hw, role, spec, "fp8", "fp8"))
                                  for role, spec in ROLES]


MODELS = pytest.mark.parametrize("model,hardware", [("deepseek-v4-flash", "gb300"),
                                                    ("deepseek-v3", "h200")])


@MODELS
def test_an_opened_step_closed_at_its_expert_load_is_the_direct_price(model: str,
                                                                      hardware: str) -> None:
    cal, instances = _instances(model, hardware)
    rng = np.random.default_rng(1)
    for role, inst in instances:
        for _ in range(12):
            batch = _batch(role, inst.dp, inst.ranks, rng)
            direct = step_time(inst, batch, cal)
            got = close_step(inst, open_step(inst, batch, cal), cal, most_loaded(inst, batch))
            assert got.total_ms == direct.total_ms
            assert got.breakdown == direct.breakdown and got.tokens == direct.tokens
            assert list(got.parts.items()) == list(direct.parts.items())
            assert list(got.provenance.items()) == list(direct.provenance.items())


def test_a_front_is_composed_once_for_every_expert_load() -> None:
    """The memo prices a step at its rounded rows and its most-loaded EP rank's assignments
    exactly as the cost model would; a front seen with another load costs no new
    composition."""
    hw, m = load_hardware("gb300"), load_model("deepseek-v4-flash")
    cal = load_calibration(hw)
    inst = instance_from_role(m, hw, "decode", RoleSpec(
        instances=1, dep=8, speculative=Speculative(tokens=3, acceptance=0.8)), "fp8", "fp8")
    pricer = StepPricer(inst, cal)
    rng = np.random.default_rng(2)
    dp = inst.dp
    dec, ctx, z = rng.integers(1, 9, dp).astype(float), np.exp(rng.uniform(8, 11, dp)), np.zeros(dp)
    for k in range(6):
        tokens = dec.sum() * (1 + inst.spec_tokens)
        experts = np.sort(rng.uniform(1.0, 1.0 + 0.2 * k, inst.ep))[::-1] * (
            tokens * m.top_k / inst.ep)
        got = pricer.price(dec, ctx, z, z, z, experts)
        rows = pareto_front(round_bits(np.array([dec, ctx, z, z, z]), pricer.bits).T)
        padded = np.concatenate([rows, np.repeat(rows[:1], dp - len(rows), axis=0)])
        top = round_bits(float(experts[0]), pricer.bits)
        direct = step_time(inst, Batch(*padded.T, expert_tokens=experts * (top / experts[0])),
                           cal)
        assert got.total_ms == direct.total_ms and got.provenance == direct.provenance
    assert pricer.misses == 1 and pricer.expert_loads > 1


def _rows(batch: Batch) -> list[np.ndarray]:
    return [batch.decode_requests, batch.decode_context, batch.prefill_tokens,
            batch.prefill_requests, batch.prefill_context]


@MODELS
def test_a_dp_wait_from_remembered_rank_rows_is_the_whole_steps(model: str,
                                                                hardware: str) -> None:
    cal, instances = _instances(model, hardware)
    ops = cast(Calibration, CachedCalibration(cal))  # the operation prices a pricer uses
    rng = np.random.default_rng(3)
    for role, inst in instances:
        pricer = StepPricer(inst, cal)
        rows = _rows(_batch(role, inst.dp, inst.ranks, rng))
        for _ in range(6):  # each step moves a rank or two: the others' rows are remembered
            for r in rng.choice(inst.dp, size=min(2, inst.dp), replace=False):
                for col, fresh in zip(rows, _rows(_batch(role, inst.dp, inst.ranks, rng)),
                                      strict=True):
                    col[r] = fresh[r]
            columns = round_bits(np.array(rows), pricer.bits)
            ms = rank_work_ms(inst, Batch(*columns), ops)
            assert pricer.dp_wait(*rows) == float((ms.max() - ms).sum())


def test_dp_waits_priced_together_are_each_steps_own() -> None:
    """Several steps' waits priced in one go (a run settles its sampled steps together): each
    is its whole step's, also where a rank's attention depends on its step's replay decision
    (V4.1 aggregated: a small prompt chunk beside a large one runs the bounded replay, alone it
    does not)."""
    hw, m = load_hardware("gb300"), load_model("deepseek-v4.1-flash")
    cal = load_calibration(hw)
    ops = cast(Calibration, CachedCalibration(cal))
    inst = instance_from_role(m, hw, "aggregated", RoleSpec(instances=1, dep=4), "fp8", "fp8")
    small = [8.0, 40_000.0, 200.0, 1.0, 9_000.0]  # a rank's row: decode and a 200-token chunk
    steps = [np.array([small, [8.0, 30_000.0, 4_096.0, 1.0, 500.0],  # beside a 4K chunk
                       [4.0, 20_000.0, 0.0, 0.0, 0.0], [2.0, 1_000.0, 0.0, 0.0, 0.0]]).T,
             np.array([small, [8.0, 30_000.0, 100.0, 1.0, 500.0],  # beside small chunks only
                       [4.0, 20_000.0, 0.0, 0.0, 0.0], [2.0, 1_000.0, 0.0, 0.0, 0.0]]).T]
    steps = [round_bits(c, 6) for c in steps]
    pricer = StepPricer(inst, cal)
    got = pricer.dp_waits(steps)
    alone = [rank_work_ms(inst, Batch(*c), ops) for c in steps]
    assert got == [float((ms.max() - ms).sum()) for ms in alone]
    assert alone[0][0] != alone[1][0]  # the same row, priced by its step's decision
    assert StepPricer(inst, cal).dp_wait(*steps[1]) == got[1]


def _query_all_corners(g: Grid, point: np.ndarray, roofline: float) -> tuple[float, int]:
    """A single-point grid query that visits every corner of the point's cell (the form
    `Grid._query_one` had before it skipped the corners of the axes the point sits on)."""
    lo, hi, t, outside = [], [], [], False
    for x, la in zip(np.log(point).tolist(), g._log_axes_lists, strict=True):
        if len(la) == 1:
            lo.append(0)
            hi.append(0)
            t.append(0.0)
            outside = outside or abs(x - la[0]) > 1e-9
            continue
        h = min(max(bisect.bisect_left(la, x), 1), len(la) - 1)
        tj = (x - la[h - 1]) / (la[h] - la[h - 1])
        outside = outside or tj < -1e-9 or tj > 1 + 1e-9
        lo.append(h - 1)
        hi.append(h)
        t.append(min(max(tj, 0.0), 1.0))
    flat_eff, flat_lat, strides = g._flat
    acc = wsum = 0.0
    for corner in itertools.product((0, 1), repeat=len(t)):
        w = 1.0
        for c, tj in zip(corner, t, strict=True):
            w *= tj if c else 1.0 - tj
        if w <= 0:
            continue
        v = flat_eff[sum((h if c else lw) * st
                         for c, h, lw, st in zip(corner, hi, lo, strides, strict=True))]
        if v == v:
            acc += w * v
            wsum += w
    if wsum <= 1e-12:
        return float("nan"), -1  # the nearest-cell fallback: the same code path either way
    ms, code = roofline / math.exp(acc / wsum), EXTRAPOLATED if outside else INTERPOLATED
    if not outside and all(tj < 1e-12 or tj > 1 - 1e-12 for tj in t):
        lat = flat_lat[sum((h if tj > 0.5 else lw) * st
                           for tj, h, lw, st in zip(t, hi, lo, strides, strict=True))]
        if lat == lat:
            ms, code = lat, MEASURED
    return ms, code


def test_a_single_point_grid_query_is_the_all_corners_sum_bit_for_bit() -> None:
    rng = np.random.default_rng(4)
    axes = (np.array([1.0, 2.0, 8.0, 64.0]), np.array([16.0, 128.0, 1024.0]), np.array([8.0]))
    shape = tuple(len(a) for a in axes)
    latency = np.exp(rng.normal(size=shape))
    latency[rng.random(shape) < 0.2] = np.nan  # unmeasured cells
    pts = np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")], axis=1)
    keep = ~np.isnan(latency.ravel())
    grid = Grid.build(pts[keep], latency.ravel()[keep], np.ones(int(keep.sum())))
    checked = 0
    for _ in range(400):
        point = np.array([rng.choice(ax) if rng.random() < 0.4 else
                          np.exp(rng.uniform(np.log(ax[0]) - 0.5, np.log(ax[-1]) + 0.5))
                          for ax in axes])
        want = _query_all_corners(grid, point, 0.7)
        if want[1] < 0:
            continue
        ms, code = grid._query_one(point, 0.7, True)
        assert (float(ms[0]), int(code[0])) == want, point
        checked += 1
    assert checked > 300


def test_the_one_point_sparse_attention_roofline_is_the_array_one_bit_for_bit() -> None:
    rng = np.random.default_rng(5)
    for name in ("gb300", "h200"):
        hw = load_hardware(name)
        for _ in range(500):
            kw = dict(qk_dim=float(rng.choice([0, 576])), v_dim=float(rng.choice([0, 512])),
                      window=int(rng.choice([0, 128])), ratio=int(rng.choice([0, 1, 4, 128])),
                      topk=int(rng.choice([0, 512])), index_heads=int(rng.choice([0, 64])),
                      index_dim=int(rng.choice([0, 128])),
                      entry_bytes=float(rng.choice([0.0, 584.0])),
                      index_bytes=float(rng.choice([0.0, 132.0])),
                      weights=str(rng.choice(["fp8", "bf16"])))
            params = float(rng.choice([0.0, rng.uniform(1e6, 1e9)]))
            heads = float(rng.choice([0, 8, 128]))
            b, n = float(rng.integers(1, 300)), float(rng.choice([1, rng.integers(1, 20000)]))
            p = float(rng.choice([0.0, np.exp(rng.uniform(0, 14))]))
            bound = str(rng.choice(["both", "compute", "memory", "each"]))
            one = rf.sparse_attention(hw, np.array([b]), np.array([n]), np.array([p]),
                                      params=params, heads=heads, bound=bound, **kw)
            two = rf.sparse_attention(hw, np.full(2, b), np.full(2, n), np.full(2, p),
                                      params=params, heads=heads, bound=bound, **kw)
            assert one.shape == ((2, 1) if bound == "each" else (1,))
            assert (one[..., 0] == two[..., 0]).all() and (two[..., 0] == two[..., 1]).all()
            if bound == "each":  # the two sides, each as asked alone
                for side, got in zip(("compute", "memory"), two, strict=True):
                    assert (got == rf.sparse_attention(hw, np.full(2, b), np.full(2, n),
                                                       np.full(2, p), params=params,
                                                       heads=heads, bound=side, **kw)).all()
            assert rf.sparse_attention(hw, b, n, p, params=params, heads=heads, bound=bound,
                                       **kw).shape == ((2,) if bound == "each" else ())


@pytest.mark.parametrize("columns", [5, 2])
def test_the_front_of_few_rows_in_python_is_the_numpy_front_bit_for_bit(
        columns: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(6)
    cases = []
    for _ in range(600):
        n = int(rng.integers(2, pricing.FEW_ROWS + 1))
        rows = round_bits(rng.integers(0, 4, (n, columns)) * np.exp(rng.uniform(0, 9, (n, 1))),
                          6)
        if rng.random() < 0.5:  # a step's ranks: many repeat the first (padding, idle ranks)
            rows[rng.random(n) < 0.6] = rows[0]
        cases.append(rows)
    few = [pareto_front(rows) for rows in cases]
    monkeypatch.setattr(pricing, "FEW_ROWS", 0)  # numpy for every size
    for rows, got in zip(cases, few, strict=True):
        want = pareto_front(rows)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


def test_a_grid_query_of_one_point_is_that_point_queried_among_many_bit_for_bit() -> None:
    """The single-point path (plain floats, math.exp) and the vectorised one (numpy) give the
    same latency and provenance, so an operation price does not depend on which other points
    it was priced beside (`simulator.cost.price_cache` prices new points together)."""
    rng = np.random.default_rng(7)
    axes = (np.array([1.0, 2.0, 8.0, 64.0, 512.0]), np.array([16.0, 128.0, 1024.0]),
            np.array([8.0]), np.array([1.0, 4.0]))
    shape = tuple(len(a) for a in axes)
    latency = np.exp(rng.normal(size=shape))
    latency[rng.random(shape) < 0.2] = np.nan
    pts = np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")], axis=1)
    keep = ~np.isnan(latency.ravel())
    grid = Grid.build(pts[keep], latency.ravel()[keep], np.exp(rng.normal(size=int(keep.sum()))))
    points = np.array([[rng.choice(ax) if rng.random() < 0.4 else
                        np.exp(rng.uniform(np.log(ax[0]) - 0.5, np.log(ax[-1]) + 0.5))
                        for ax in axes] for _ in range(500)])
    roofline = np.exp(rng.uniform(-3, 3, len(points)))
    for exact in (True, False):
        many_ms, many_code = grid.query(points, roofline, exact)
        for i in range(len(points)):
            one_ms, one_code = grid.query(points[i:i + 1], roofline[i:i + 1], exact)
            assert one_ms.tobytes() == many_ms[i:i + 1].tobytes(), points[i]
            assert int(one_code[0]) == int(many_code[i])


@MODELS
def test_ranks_with_the_same_row_price_the_attention_of_every_rank_bit_for_bit(
        model: str, hardware: str) -> None:
    """A step prices each distinct rank row's attention once (a composed front is its few rows
    padded by repeating the first): the slowest rank, each part and its provenance are those
    of pricing every rank, through the operation prices a pricer uses and directly."""
    from simulator.cost.step import _attention, _charge_parts, _Ledger, _rank_columns, _tail

    cal, instances = _instances(model, hardware)
    rng = np.random.default_rng(5)
    for role, inst in instances:
        for ops in (cal, cast(Calibration, CachedCalibration(cal))):
            for _ in range(4):
                rows = _rows(_batch(role, inst.dp, inst.ranks, rng))
                for col in range(1, min(inst.dp, 6)):  # rows differing from the first in one
                    rows[col % 5][col] = rows[col % 5][0] * 1.5 + 1  # figure: each its own
                    for other in range(5):
                        if other != col % 5:
                            rows[other][col] = rows[other][0]
                pick = rng.integers(0, min(6, inst.dp), inst.dp)  # repeated in any order
                batch = Batch(*(c[pick] for c in rows))
                cols = _rank_columns(batch, inst.dp)
                tail = _tail(inst, cols[0] * (1 + inst.spec_tokens) + cols[2], cols[2], cols[3])
                led = _Ledger()
                every = _attention(inst, ops, *cols, led, tail)
                _charge_parts(led, "attention", "attention.", float(every.max()))
                got = step_time(inst, batch, ops)
                assert got.breakdown["attention"] == float(every.max())
                for key, ms in led.parts.items():
                    assert got.parts[key] == ms and got.provenance[key] == led.provenance[key]


def test_the_nearest_measured_cell_is_the_direct_searchs_bit_for_bit() -> None:
    """Grid.nearest's two passes (candidates by a matrix product, then the direct distances)
    and its one-axis-at-a-time path for a query or two pick the cell the direct search over
    every cell picks, ties (points halfway between cells, on cells) to the first."""
    rng = np.random.default_rng(6)
    for d in (1, 2, 3, 4):
        axes = [np.unique(np.round(np.exp(rng.uniform(0, 9, 9)))) for _ in range(d)]
        pts = np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")], axis=1)
        keep = rng.random(len(pts)) < 0.15  # a sparse table, as the sparse-attention ones
        grid = Grid.build(pts[keep], rng.uniform(0.1, 2, int(keep.sum())), np.ones(int(keep.sum())))
        logs = [np.log(a) for a in axes]
        far = np.stack([rng.uniform(a[0] - 2, a[-1] + 2, 300) for a in logs], axis=1)
        nodes = np.stack([rng.choice(a, 300) for a in logs], axis=1)
        halfway = np.stack([(a[i] + a[np.minimum(i + 1, len(a) - 1)]) / 2 for a, i in
                            ((a, rng.integers(0, len(a), 300)) for a in logs)], axis=1)
        for queries in (far, nodes, halfway):
            want = grid.nearest_direct(queries)
            assert (grid.nearest(queries) == want).all()
            assert all(grid.nearest(queries[i:i + 1])[0] == want[i] for i in range(0, 300, 7))
            assert (grid.nearest(queries[:2]) == want[:2]).all()
