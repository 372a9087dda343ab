"""Operation prices remembered per point (simulator.cost.price_cache) are the direct prices."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest

from simulator.calibration import Calibration, load_calibration
from simulator.cost import Batch, step_time
from simulator.cost.price_cache import LATTICE_UP, CachedCalibration, lattice_around
from simulator.cost.step import instance_from_role
from simulator.des.pricing import StepPricer, round_bits
from simulator.specs.attention import kind
from simulator.specs.deployment import RoleSpec, Speculative
from simulator.specs.hardware import load_hardware
from simulator.specs.model import load_model


def as_cal(cached: CachedCalibration) -> Calibration:
    """What the cost model takes (a CachedCalibration stands in for one)."""
    return cast(Calibration, cached)


ROLES = [
    ("decode", RoleSpec(instances=1, dep=8, speculative=Speculative(tokens=2, acceptance=0.7))),
    ("prefill", RoleSpec(instances=1, dep=4)),
    ("decode", RoleSpec(instances=1, dep=8, dbo=True)),
    ("aggregated", RoleSpec(instances=1, tp=8)),
]


def _batches(role: str, dp: int, seed: int, n: int) -> list[Batch]:
    rng = np.random.default_rng(seed)

    def spread(lo: float, hi: float) -> np.ndarray:
        return np.exp(rng.uniform(np.log(lo), np.log(hi), dp))

    out = []
    for _ in range(n):
        z = np.zeros(dp)
        if role == "decode":
            out.append(Batch(rng.integers(1, 129, dp).astype(float), spread(100, 1e6), z, z, z))
        elif role == "prefill":
            out.append(Batch(z, z, rng.integers(1, 16385, dp).astype(float),
                             rng.integers(1, 5, dp).astype(float),
                             np.where(rng.random(dp) < 0.3, 0.0, spread(1, 5e5))))
        else:
            out.append(Batch(rng.integers(0, 64, dp).astype(float), spread(100, 2e5),
                             rng.integers(1, 8193, dp).astype(float), np.ones(dp),
                             spread(1, 1e5)))
    return out


@pytest.mark.parametrize("model,hardware", [("deepseek-v4-flash", "gb300"),
                                            ("deepseek-v4.1-flash", "gb300"),
                                            ("deepseek-v3", "h200")])
def test_cached_prices_are_the_direct_prices_with_their_provenance(model: str,
                                                                   hardware: str) -> None:
    hw, m = load_hardware(hardware), load_model(model)
    cal = load_calibration(hw)
    cached = CachedCalibration(cal)
    for k, (role, spec) in enumerate(ROLES):
        inst = instance_from_role(m, hw, role, spec, "fp8", "fp8")
        batches = _batches(role, inst.dp, k, 25)
        for batch in batches + batches[:5]:  # the repeats come from the memo
            direct = step_time(inst, batch, cal)
            got = step_time(inst, batch, as_cal(cached))
            assert got.total_ms == pytest.approx(direct.total_ms, rel=1e-12)
            assert got.parts == pytest.approx(direct.parts, rel=1e-12)
            assert got.provenance == direct.provenance
            assert got.source == direct.source


def test_a_point_priced_once_is_not_priced_again() -> None:
    hw, m = load_hardware("h200"), load_model("deepseek-v3")
    cached = CachedCalibration(load_calibration(hw))
    inst = instance_from_role(m, hw, "decode", RoleSpec(instances=1, dep=8), "fp8", "fp8")
    batch = _batches("decode", inst.dp, 7, 1)[0]
    first = step_time(inst, batch, as_cal(cached))
    calls, points = cached.calls, cached.points
    assert calls > 0 and points > 0
    again = step_time(inst, batch, as_cal(cached))
    assert (cached.calls, cached.points) == (calls, points)
    assert again.total_ms == first.total_ms
    # one rank's row changed: only that rank's points are new
    rows = batch.decode_requests.copy()
    rows[0] += 1
    step_time(inst, Batch(rows, batch.decode_context, batch.prefill_tokens,
                          batch.prefill_requests, batch.prefill_context), as_cal(cached))
    assert cached.points - points < points / 2


def test_a_tuple_argument_made_anew_each_call_is_found_by_its_content() -> None:
    """A GEMM chain's shapes come as a new tuple each call: the cache finds its points by the
    tuple's content, holds no object per call, and so never starts afresh for them (which
    would forget every price it had)."""
    hw = load_hardware("gb300")
    cached = CachedCalibration(load_calibration(hw))
    tokens = np.array([64.0])
    for _ in range(50):
        shapes = tuple((1, n, 7168, "fp8") for n in (1536, 512))  # a new object each time
        cached.gemm_chain(tokens, shapes)
    assert cached.calls == 1 and len(cached._objects) <= 1
    # a tuple holding something unhashable is still priced (by tokens, as any object)
    cached.gemm_chain(tokens, ([1, 1536, 7168, "fp8"],))


@pytest.mark.parametrize("model,hardware", [("deepseek-v4-flash", "gb300"),
                                            ("deepseek-v3", "h200")])
def test_the_step_memo_errs_by_its_rounding_of_direct_pricing(model: str,
                                                                  hardware: str) -> None:
    """At the simulator's 6 significant bits (each value within 0.8 %, batch counts over 64
    among them): a median error under 0.8 % and nine steps in ten within 2 %. The others sit
    where the cost model's own price jumps (a V4 prefill attention module at the end of its
    table's range) or is not monotone in a rank's work (GB300's measured GEMM at 1 token costs
    3x that at 5), which the memo's rounding and its Pareto front cannot follow. At 8 bits,
    nine in ten within 0.5 %."""
    hw, m = load_hardware(hardware), load_model(model)
    cal = load_calibration(hw)
    for k, (role, spec) in enumerate(ROLES):
        inst = instance_from_role(m, hw, role, spec, "fp8", "fp8")
        pricer, finer = StepPricer(inst, cal), StepPricer(inst, cal, 8)
        errors, finer_errors = [], []
        for batch in _batches(role, inst.dp, 10 + k, 40):
            tokens = batch.decode_requests * (1 + inst.spec_tokens) + batch.prefill_tokens
            experts = None if inst.ep == 1 else np.full(inst.ep, tokens.sum() * m.top_k / inst.ep)
            direct = step_time(inst, Batch(batch.decode_requests, batch.decode_context,
                                           batch.prefill_tokens, batch.prefill_requests,
                                           batch.prefill_context, expert_tokens=experts), cal)
            got = pricer.price(batch.decode_requests, batch.decode_context,
                               batch.prefill_tokens, batch.prefill_requests,
                               batch.prefill_context, experts)
            errors.append(abs(got.total_ms / direct.total_ms - 1))
            fine = finer.price(batch.decode_requests, batch.decode_context,
                               batch.prefill_tokens, batch.prefill_requests,
                               batch.prefill_context, experts)
            finer_errors.append(abs(fine.total_ms / direct.total_ms - 1))
        e, f = np.array(errors), np.array(finer_errors)
        assert np.median(e) <= 0.008 and (e <= 0.02).mean() >= 0.9, (role, np.sort(e)[-5:])
        assert np.median(f) <= 0.002 and (f <= 0.005).mean() >= 0.9, (role, np.sort(f)[-5:])


@pytest.mark.parametrize("bits", [6, 8])
def test_the_memo_rounds_to_nearest_significant_bits_ties_to_even(bits: int) -> None:
    rng = np.random.default_rng(bits)
    x = np.concatenate([np.arange(0.0, 70_000.0), np.arange(0, 4000) / 4.0,
                        np.exp(rng.uniform(-5.0, 30.0, 50_000))])
    m, e = np.frexp(x)
    scale = float(1 << bits)
    expected = np.ldexp(np.round(m * scale) / scale, e)  # np.round: half to even
    assert np.array_equal(round_bits(x, bits), expected)
    assert all(round_bits(float(v), bits) == float(r) for v, r in zip(x[::97], expected[::97],
                                                                        strict=True))


@pytest.mark.parametrize("context", [False, True])
def test_a_reindexing_layer_past_its_pool_is_one_point(context: bool) -> None:
    """A V4.1 re-indexing layer scores at most its candidate pool: every past beyond that many
    tokens is one remembered point, priced as the direct pricing prices each of them."""
    hw, m = load_hardware("gb300"), load_model("deepseek-v4.1-flash")
    cal = load_calibration(hw)
    cached = CachedCalibration(cal)
    inst = instance_from_role(m, hw, "prefill" if context else "decode",
                              RoleSpec(instances=1, dep=8), "fp8", "fp8")
    reindex = kind("csa2_reindex_r1")
    pool = float(reindex.reads * m.candidate_pool)
    new = np.array([512.0 if context else 1.0])
    first = cached.dsv41_indexer(reindex, context, inst, np.array([4.0]), new,
                                 np.array([pool + 100]))
    points = cached.points
    for past in (pool * 2, pool * 30):
        got = cached.dsv41_indexer(reindex, context, inst, np.array([4.0]), new,
                                   np.array([past]))
        direct = cal.dsv41_indexer(reindex, context, inst, np.array([4.0]), new,
                                   np.array([past]))
        assert got is not None and direct is not None and first is not None
        assert got.ms[0] == direct.ms[0] == first.ms[0]
        assert got.source == direct.source
    assert cached.points == points
    # below the pool the past still counts
    short = cached.dsv41_indexer(reindex, context, inst, np.array([4.0]), new,
                                 np.array([pool / 4]))
    assert short is not None and short.ms[0] < first.ms[0]


def test_a_one_point_call_is_priced_as_the_points_of_a_longer_call() -> None:
    """The one-point path (a step's single distinct rank row) keys, prices and shapes a call
    as the general path does: the same price and provenance as that point among others, and
    shape (1,) whether they come as numbers or as one-element arrays."""
    hw, m = load_hardware("gb300"), load_model("deepseek-v4-flash")
    cal = load_calibration(hw)
    inst = instance_from_role(m, hw, "prefill", RoleSpec(instances=1, dep=4), "fp8", "fp8")
    csa = kind("csa")
    cases = [
        ("gemm", lambda t: (t, 4096, 7168, "fp8"), [64.0, 64, np.array([64.0])], 64.0),
        ("dsv4_module", lambda t: (csa, True, inst, t, np.array([4096.0]), 5000.0),
         [2.0, np.array([2.0]), np.array([2])], 2.0),
    ]
    for name, call, points, value in cases:
        many = getattr(cal, name)(*call(np.array([value, value + 1.0])))
        for point in points:
            cached = CachedCalibration(cal)
            got = getattr(cached, name)(*call(point))
            direct = getattr(cal, name)(*call(point))
            assert got.ms.shape == (1,)
            assert float(got.ms.ravel()[0]) == float(direct.ms.ravel()[0]) == float(many.ms[0])
            assert (got.source, got.table) == (direct.source, direct.table)
            again = getattr(cached, name)(*call(point))  # from the memo now
            assert again.ms.shape == got.ms.shape and (again.ms == got.ms).all()
            assert cached.calls == 1
            twice = getattr(cached, name)(*call(np.array([value, value])))  # the general path
            assert cached.calls == 1 and (twice.ms == got.ms[0]).all()  # finds the same key


def test_a_call_of_many_points_keys_them_alike_however_its_arguments_come() -> None:
    """Arrays of one shape (stacked in one call) and a number beside arrays (broadcast) key
    the same points: each comes back at the direct price, in the call's shape, and a point
    priced one way is found the other."""
    hw, m = load_hardware("gb300"), load_model("deepseek-v4-flash")
    cal = load_calibration(hw)
    inst = instance_from_role(m, hw, "prefill", RoleSpec(instances=1, dep=4), "fp8", "fp8")
    csa = kind("csa")
    batch, past = np.array([1.0, 2.0, 4.0]), np.array([0.0, 3000.0, 90000.0])
    new = np.full(3, 4096.0)
    cached = CachedCalibration(cal)
    ways = [(batch, new, past), (batch, 4096.0, past)]
    for b, n, p in ways:
        got = cached.dsv4_module(csa, True, inst, b, n, p)
        direct = cal.dsv4_module(csa, True, inst, b, n, p)
        assert got.ms.shape == np.shape(b)
        assert (got.ms.ravel() == direct.ms.ravel()).all()
        assert (got.source, got.table) == (direct.source, direct.table)
    assert cached.calls == 1 and cached.points == 3


def test_a_point_inside_a_table_keeps_its_provenance_beside_one_carried_past_it() -> None:
    """A V4 long-context kernel carries a context past its table's range by what it reads
    (flagged extrapolated); a point inside the range priced in the same call keeps its own
    provenance and price, so the price cache remembers each as priced alone."""
    from simulator.calibration.grid import EXTRAPOLATED, SOURCES

    hw, m = load_hardware("gb300"), load_model("deepseek-v4-flash")
    cal = load_calibration(hw)
    inst = instance_from_role(m, hw, "decode", RoleSpec(instances=1, dep=8), "fp8", "fp8")
    one = np.ones(2)
    both = cal.dsv4_kernel("dsv4_indexer", inst, np.full(2, 8.0), one,
                           np.array([4096.0, 8.0 * 2 ** 20]))
    near = cal.dsv4_kernel("dsv4_indexer", inst, np.array([8.0]), one[:1], np.array([4096.0]))
    far = cal.dsv4_kernel("dsv4_indexer", inst, np.array([8.0]), one[:1],
                          np.array([8.0 * 2 ** 20]))
    assert SOURCES.index(far.source) >= EXTRAPOLATED > SOURCES.index(near.source)
    assert list(both.point_codes()) == [SOURCES.index(near.source), SOURCES.index(far.source)]
    assert both.source == far.source
    assert list(both.ms) == [near.ms[0], far.ms[0]]


@pytest.mark.parametrize("bits", [3, 6])
def test_the_lattice_around_a_context_is_every_rounded_value_next_to_it(bits: int) -> None:
    """The contexts priced ahead are the step memo's rounded values nearest the new one,
    none skipped: every value of the lattice between them, across powers of two."""
    half = 1 << (bits - 1)  # the lattice: every mantissa of `bits` bits at every exponent
    lattice = np.unique([m * 2.0 ** e for m in range(half, 2 * half) for e in range(-8, 20)])
    lattice = lattice[lattice >= 1.0]
    assert (round_bits(lattice, bits) == lattice).all()
    for x in (1.0, float(1 << bits), 96.0 if bits == 6 else 12.0, float(round_bits(3000.0,
                                                                                   bits))):
        at = int(np.searchsorted(lattice, x))
        assert lattice[at] == x
        around = lattice_around(x, bits, 10, 10)
        up = [v for v in around if v > x]
        down = [v for v in around if v < x]
        assert up == lattice[at + 1:at + 11].tolist()
        assert down == lattice[max(at - 10, 0):at][::-1].tolist()


def test_a_decode_point_prices_its_next_contexts_with_it() -> None:
    """A new decode point of an operation whose price grows with the context is priced with
    its neighbours on the step memo's lattice, in the same call: the steps that follow as the
    context creeps up find their prices without another call, each the direct price bit for
    bit with its provenance; a prefill point prices itself alone, and so does every point
    without the lattice."""
    hw, m = load_hardware("gb300"), load_model("deepseek-v4.1-flash")
    cal = load_calibration(hw)
    inst = instance_from_role(m, hw, "decode", RoleSpec(instances=1, dep=8), "fp8", "fp8")
    source = kind("csa2_source_r2")
    one = np.array([1.0])
    for bits in (None, 6):
        cached = CachedCalibration(cal, lattice_bits=bits)
        context = float(round_bits(40_000.0, 6))
        cached.dsv41_indexer(source, False, inst, np.array([8.0]), one, np.array([context]))
        for _ in range(LATTICE_UP):
            context = lattice_around(context, 6, 1, 0)[0]
            got = cached.dsv41_indexer(source, False, inst, np.array([8.0]), one,
                                       np.array([context]))
            direct = cal.dsv41_indexer(source, False, inst, np.array([8.0]), one,
                                       np.array([context]))
            assert got is not None and direct is not None
            assert got.ms[0] == direct.ms[0] and got.source == direct.source
        assert cached.calls == (1 if bits else 1 + LATTICE_UP)
    cached = CachedCalibration(cal, lattice_bits=6)
    cached.dsv41_indexer(source, True, inst, np.array([8.0]), np.array([64.0]),
                         np.array([40_960.0]))
    cached.dsv41_indexer(source, False, inst, np.array([8.0]), one, np.array([40_961.0]))
    assert cached.points == 2
