"""Workload spec: defaults, YAML round-trip, one-line errors, sampling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from simulator.specs.errors import SpecError
from simulator.specs.loading import dump_workload, load_workload
from simulator.specs.workload import (
    BurstyArrival,
    ClosedArrival,
    FixedLength,
    LognormalLength,
    PoissonArrival,
    TraceArrival,
    UniformLength,
    Workload,
)


def error(source: Any) -> str:
    with pytest.raises(SpecError) as info:
        load_workload(source)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_defaults() -> None:
    w = load_workload({})
    assert w.arrival == ClosedArrival(concurrency=2048)
    assert w.requests == 4000
    assert w.input_tokens == FixedLength(value=2000)
    assert w.output_tokens == FixedLength(value=1000)
    assert (w.prefix_hit_rate, w.sessions, w.mode, w.context_tokens, w.seed) == (
        0.0, None, "serve", 2000, 0)
    assert dump_workload(w) == {}


def test_kinds_and_their_defaults() -> None:
    w = load_workload({
        "arrival": {"kind": "bursty", "rate": 30},
        "input_tokens": {"kind": "lognormal", "median": 8000},
        "output_tokens": {"kind": "uniform", "low": 100, "high": 4000},
        "sessions": {"turns": 5},
    })
    assert w.arrival == BurstyArrival(rate=30, burstiness=4.0)
    assert w.input_tokens == LognormalLength(median=8000, sigma=1.0, max=131072)
    assert isinstance(w.output_tokens, UniformLength)
    assert w.sessions is not None and w.sessions.think_time_s == 0.0
    trace = load_workload({"arrival": {"kind": "trace", "path": "t.jsonl"}}).arrival
    assert trace == TraceArrival(path="t.jsonl", time_scale=1.0)


def test_round_trip_through_yaml(tmp_path: Path) -> None:
    data = {
        "arrival": {"kind": "poisson", "rate": 30.0},
        "requests": 100,
        "input_tokens": {"kind": "lognormal", "median": 8000.0, "sigma": 0.5, "max": 32768},
        "output_tokens": {"kind": "fixed", "value": 500},
        "prefix_hit_rate": 0.6,
        "sessions": {"turns": 4, "think_time_s": 2.5},
        "seed": 7,
    }
    w = load_workload(data)
    assert dump_workload(w) == data
    path = tmp_path / "workload.yaml"
    path.write_text(yaml.safe_dump(dump_workload(w)))
    assert load_workload(path) == w


def test_dump_keeps_kind_of_objects_built_in_python() -> None:
    w = Workload(arrival=PoissonArrival(rate=3), input_tokens=UniformLength(low=1, high=9))
    dumped = dump_workload(w)
    assert dumped["arrival"] == {"kind": "poisson", "rate": 3.0}
    assert dumped["input_tokens"]["kind"] == "uniform"
    assert load_workload(dumped) == w


# --- one-line errors ------------------------------------------------------------------------


def test_unknown_kind_lists_kinds() -> None:
    assert error({"arrival": {"kind": "uniform", "rate": 3}}) == (
        "workload: arrival.kind='uniform' is not one of closed, poisson, bursty, trace, sessions")
    assert error({"input_tokens": {"kind": "normal"}}) == (
        "workload: input_tokens.kind='normal' is not one of fixed, uniform, lognormal")
    assert "needs a kind, one of fixed, uniform, lognormal" in error({"output_tokens": {"v": 1}})


def test_unknown_key_inside_a_kind() -> None:
    msg = error({"arrival": {"kind": "poisson", "rate": 3, "concurrency": 8}})
    assert msg == "workload: unknown key 'concurrency' in arrival; valid keys: kind, rate"


def test_missing_key_inside_a_kind() -> None:
    assert error({"arrival": {"kind": "poisson"}}) == (
        "workload: missing required key 'rate' in arrival")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"prefix_hit_rate": 1.0}, "workload: prefix_hit_rate=1.0 must be < 1.0"),
        ({"requests": 0}, "workload: requests=0 must be >= 1"),
        ({"requests": "many"}, "workload: requests='many' must be an integer"),
        ({"mode": "bench"},
         "workload: mode='bench' is not one of serve, prefill_only, decode_only"),
        ({"arrival": "poisson"}, "workload: arrival='poisson' must be a mapping with a kind"),
        ({"input_tokens": {"kind": "uniform", "low": 10, "high": 5}},
         "workload: input_tokens: high=5 must be >= low=10"),
        ({"sessions": {"turns": 2}, "mode": "decode_only"},
         "workload: sessions need mode 'serve', not mode='decode_only'"),
        ({"sessions": {"turns": 0}}, "workload: sessions.turns=0 must be >= 1"),
    ],
)
def test_value_errors(data: dict[str, Any], expected: str) -> None:
    assert error(data).startswith(expected)


def test_file_errors(tmp_path: Path) -> None:
    assert error(tmp_path / "nope.yaml") == f"{tmp_path / 'nope.yaml'}: no such file"
    bad = tmp_path / "w.yaml"
    bad.write_text("arrival: {kind: closed\n")
    assert "invalid YAML at line" in error(bad)
    scalar = tmp_path / "s.yaml"
    scalar.write_text("42\n")
    assert "top level must be a mapping" in error(scalar)


# --- sampling -------------------------------------------------------------------------------


LENGTHS = [
    FixedLength(value=7),
    UniformLength(low=100, high=4000),
    LognormalLength(median=8000, sigma=1.0, max=131072),
    LognormalLength(median=50, sigma=2.0, max=200),
]


@pytest.mark.parametrize("dist", LENGTHS, ids=lambda d: d.kind)
def test_sampling_is_deterministic_and_in_bounds(
    dist: FixedLength | UniformLength | LognormalLength,
) -> None:
    a = dist.sample(np.random.default_rng(3), 20000)
    b = dist.sample(np.random.default_rng(3), 20000)
    assert a.dtype == np.int64 and a.shape == (20000,)
    assert np.array_equal(a, b)
    assert a.min() >= 1
    if isinstance(dist, UniformLength):
        assert a.min() >= dist.low and a.max() <= dist.high
    if isinstance(dist, LognormalLength):
        assert a.max() <= dist.max
    assert a.mean() == pytest.approx(dist.mean, rel=0.03)


def test_lognormal_median() -> None:
    x = LognormalLength(median=8000, sigma=1.0).sample(np.random.default_rng(0), 20001)
    assert np.median(x) == pytest.approx(8000, rel=0.05)


@pytest.mark.parametrize("arrival", [PoissonArrival(rate=30), BurstyArrival(rate=30)])
def test_inter_arrivals_have_mean_one_over_rate(arrival: PoissonArrival | BurstyArrival) -> None:
    gaps = arrival.inter_arrivals(np.random.default_rng(1), 100000)
    assert np.array_equal(gaps, arrival.inter_arrivals(np.random.default_rng(1), 100000))
    assert gaps.mean() == pytest.approx(1 / 30, rel=0.03)


def test_bursty_is_burstier_than_poisson() -> None:
    gaps = BurstyArrival(rate=10, burstiness=4.0).inter_arrivals(np.random.default_rng(2), 200000)
    cv2 = gaps.var() / gaps.mean() ** 2
    assert cv2 == pytest.approx(4.0, rel=0.1)
