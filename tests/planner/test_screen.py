"""The analytic screen and the multi-fidelity gate."""

import pytest

from planner.evaluate import Simulator, calibration_for, overhead_for
from planner.fidelity import Decision, Gate, Seen
from planner.objectives import SLO, metric_value
from planner.screen import SATURATED_TTFT_MS, Screen, traffic
from simulator.resolve import resolve
from simulator.specs.deployment import Deployment, RoleSpec
from simulator.specs.errors import SpecError
from simulator.specs.workload import (
    ClosedArrival,
    FixedLength,
    PoissonArrival,
    Sessions,
    TraceArrival,
    UniformLength,
    Workload,
)
from tests.planner.fakes import metrics

PD = Deployment(model="deepseek-r1", hardware="h200", prefill=RoleSpec(dep=8),
                decode=RoleSpec(dep=8, max_num_seqs=64))
AGG = Deployment(model="deepseek-r1", hardware="h200", aggregated=RoleSpec(dep=16))


def test_session_traffic_means():
    w = Workload(input_tokens=FixedLength(value=1000), output_tokens=FixedLength(value=100),
                 sessions=Sessions(turns=3, think_time_s=3.0))
    t = traffic(w)
    assert t.prompt == pytest.approx((1000 + 2100 + 3200) / 3)
    assert t.session_cached == pytest.approx((0 + 744 + 1844) / 3)
    assert t.think_s == pytest.approx(2.0) and t.users == 2048
    with pytest.raises(SpecError, match="trace"):
        traffic(Workload(arrival=TraceArrival(path="x.jsonl")))


@pytest.mark.parametrize("deployment", [PD, AGG], ids=["pd", "aggregated"])
def test_estimates_are_shaped_like_simulate_and_react_to_load(deployment):
    light = Workload(arrival=PoissonArrival(rate=1.0), input_tokens=FixedLength(value=2000),
                     output_tokens=FixedLength(value=200))
    heavy = light.model_copy(update={"arrival": PoissonArrival(rate=1000.0)})
    res = resolve(deployment)
    a, b = Screen(light)(res), Screen(heavy)(res)
    for key in ("throughput_tok_s_gpu", "ttft_ms", "tpot_ms", "tok_s_user", "keeps_up"):
        assert key in a
    assert a["keeps_up"] and not b["keeps_up"]
    assert b["ttft_ms"]["p90"] == SATURATED_TTFT_MS
    assert a["tok_s_user"]["p50"] > 0 and a["throughput_tok_s_gpu"] > 0
    closed = Screen(light.model_copy(update={"arrival": ClosedArrival(concurrency=64)}))(res)
    assert closed["request_rate"] > 0 and closed["tpot_ms"]["p50"] >= a["tpot_ms"]["p50"]


def test_aggregated_steps_are_decode_steps_and_some_chunk_steps():
    """Kimi-K2 aggregated DEP16 at 8 seqs/rank, 4000 in / 1000 out, 16 users. A rank prefills
    one prompt per request, so most steps are plain decode steps and a few carry a whole chunk
    (which every rank waits for); the screen had priced every step with a 256-token chunk (TPOT
    175 ms against the simulation's ~45, throughput a quarter)."""
    w = Workload(arrival=ClosedArrival(concurrency=16), requests=96,
                 input_tokens=UniformLength(low=3200, high=4800),
                 output_tokens=UniformLength(low=800, high=1200))
    d = Deployment(model="kimi-k2", hardware="h200",
                   aggregated=RoleSpec(dep=16, max_num_seqs=8))
    overhead = overhead_for(d)
    res = resolve(d, calibration_for(d), overhead=overhead)
    est, sim = Screen(w, overhead)(res), Simulator(w)(d)
    for metric in ("tpot_p50_ms", "throughput_tok_s_gpu", "ttft_p50_ms"):
        a, b = metric_value(est, metric), metric_value(sim, metric)
        assert a and b and 0.8 < b / a < 1.25, (metric, a, b)


def seen(n, screen, sim=None, feasible=False, layout="pd"):
    return Seen(n, layout, screen, sim, feasible)


def test_gate_warms_up_then_corrects_and_compares():
    gate = Gate((SLO("tok_s_user_p90", 50.0),), warmup=2, margin=0.2)
    est = metrics(throughput=1000, user=60)
    d = gate.decide("pd", est, [])
    assert not d.simulate and "warming up" in d.reason
    history = [seen(0, metrics(2000, 45)), seen(1, metrics(500, 45))]
    assert gate.decide("pd", est, history) == Decision(
        False, "screen: throughput ~1,000 tok/s/GPU < 80% of the best screened 2,000", 0)
    assert gate.decide("pd", metrics(1900, 60), history).simulate
    # simulation runs at half the screen's throughput and speed: corrections follow
    pairs = [seen(i, metrics(1000 + i, 100 + i), metrics(500 + i, 50 + i), True)
             for i in range(3)]
    assert gate.correction("throughput_tok_s_gpu", "pd", pairs) == pytest.approx(0.5, 0.01)
    # ~30 after correction: beyond the error three exact pairs leave (the prior, x1.5, still
    # weighs as much as they do: 50 x 1.5^-1/2 = 41)
    assert gate.decide("pd", metrics(3000, 85), pairs).simulate  # ~43
    d = gate.decide("pd", metrics(3000, 60), pairs)
    assert not d.simulate and "tok_s_user_p90 ~30" in d.reason


def test_gate_skips_twins_of_simulated_points():
    gate = Gate((), warmup=0)
    history = [seen(7, metrics(1000, 60), metrics(900, 55), True)]
    assert gate.decide("pd", metrics(1000, 60), history) == Decision(
        False, "screen: same estimate as simulated trial 7")
    assert gate.decide("aggregated", metrics(1000, 60), history).simulate


@pytest.mark.parametrize("deployment", [PD, AGG], ids=["pd", "aggregated"])
def test_the_screen_through_the_shared_operation_prices_is_the_direct_estimate(
        deployment, monkeypatch):
    """The screen prices its steps' operations through the prices per point the simulations
    share (`operation_prices`): the estimate is the one priced on the tables directly."""
    import planner.screen as screen

    w = Workload(arrival=ClosedArrival(concurrency=64), input_tokens=UniformLength(low=500,
                 high=3000), output_tokens=FixedLength(value=300),
                 sessions=Sessions(turns=3, think_time_s=1.0))
    res = resolve(deployment)
    shared = Screen(w)(res)
    again = Screen(w)(res)  # every point now remembered
    monkeypatch.setattr(screen, "operation_prices", lambda calibration: calibration)
    assert shared == again == Screen(w)(res)
