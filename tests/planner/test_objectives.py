"""SLOs (parsing, files, checks), objectives and the Pareto front."""

import numpy as np
import pytest

from planner.objectives import (
    SLO,
    load_slo_file,
    meets,
    merge_slos,
    metric_value,
    objective_values,
    pareto_front,
    parse_slo,
    slo_metric_names,
    violation,
)
from simulator.specs.errors import SpecError
from tests.planner.cli_run import assert_one_line_error, run_cli
from tests.planner.fakes import metrics


@pytest.mark.parametrize(("text", "metric", "value", "bound"), [
    ("ttft_p90_ms=2000", "ttft_p90_ms", 2000.0, "upper"),
    ("tpot_p50_ms <= 25", "tpot_p50_ms", 25.0, "upper"),
    ("tok_s_user_p90=20", "tok_s_user_p90", 20.0, "lower"),
    ("tok_s_user_p50>=35.5", "tok_s_user_p50", 35.5, "lower"),
])
def test_parse_slo_forms(text, metric, value, bound):
    slo = parse_slo(text)
    assert (slo.metric, slo.value, slo.bound) == (metric, value, bound)


@pytest.mark.parametrize(("text", "needles"), [
    ("ttft=2000", ["'ttft'", "ttft_{p50,p90,p99,mean}_ms"]),
    ("ttft_p90_ms", ["not NAME=VALUE", "tok_s_user_"]),
    ("ttft_p90_ms=fast", ["'fast' is not a number"]),
    ("ttft_p90_ms=-5", ["positive"]),
    ("tok_s_user_p90<=20", ["lower bound", "tok_s_user_p90>=20"]),
    ("ttft_p90_ms>=20", ["upper bound"]),
])
def test_malformed_slo_names_itself_and_what_is_valid(text, needles):
    with pytest.raises(SpecError) as e:
        parse_slo(text)
    msg = str(e.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, msg


def test_slo_file_mapping_and_list(tmp_path):
    path = tmp_path / "slo.yaml"
    path.write_text("ttft_p90_ms: 2000\ntok_s_user_p90: 20\n")
    assert load_slo_file(path) == (SLO("ttft_p90_ms", 2000), SLO("tok_s_user_p90", 20))
    path.write_text("- ttft_p99_ms=5000\n")
    assert load_slo_file(path) == (SLO("ttft_p99_ms", 5000),)
    path.write_text("ttft: 2000\n")
    with pytest.raises(SpecError, match="unknown SLO metric 'ttft'"):
        load_slo_file(path)


def test_merge_keeps_the_last_bound_per_metric():
    slos = merge_slos([SLO("ttft_p90_ms", 1), SLO("tok_s_user_p90", 5), SLO("ttft_p90_ms", 2)])
    assert slos == (SLO("tok_s_user_p90", 5), SLO("ttft_p90_ms", 2))


def test_metric_values_and_violations():
    m = metrics(throughput=900, user=40, ttft=2500)
    assert metric_value(m, "ttft_p90_ms") == 2500
    assert metric_value(m, "tok_s_user_p50") == 40
    assert metric_value(m, "throughput_tok_s_gpu") == 900
    assert metric_value(m, "itl_p90_ms") is None
    slos = (SLO("ttft_p90_ms", 2000), SLO("tok_s_user_p90", 20))
    assert not meets(m, slos)
    assert violation(m, slos) == pytest.approx(0.25)
    assert meets(m, (SLO("ttft_p90_ms", 3000), SLO("tok_s_user_p90", 40)))
    assert SLO("itl_p90_ms", 10).violation(m) == 1.0  # missing counts as missed
    assert objective_values(m, "pareto") == [900, 40]
    assert set(slo_metric_names()) >= {"ttft_p90_ms", "tpot_p99_ms", "tok_s_user_p90"}


def test_a_speed_bound_at_p90_holds_for_90_percent_of_requests():
    # ten requests at 10..100 ms per output token: 1000/TPOT gives 100..10 tokens/s
    tpot = np.arange(10.0, 101.0, 10.0)
    m = {"tpot_ms": {"p50": float(np.percentile(tpot, 50)),
                     "p90": float(np.percentile(tpot, 90))},
         "tok_s_user": {"p90": float(np.percentile(1000 / tpot, 90)), "mean": 29.0}}
    floor = metric_value(m, "tok_s_user_p90")
    assert floor == pytest.approx(1000 / 91.0)  # the slow tail, not the fast one (~55 tok/s)
    assert np.mean(1000 / tpot >= floor - 1e-9) >= 0.9
    assert metric_value(m, "tok_s_user_mean") == 29.0
    assert meets(m, (SLO("tok_s_user_p90", 10.9),))
    assert not meets(m, (SLO("tok_s_user_p90", 20),))


def test_pareto_front():
    pts = [[10, 1], [8, 5], [8, 5], [5, 4], [1, 9], [9, 1]]
    assert pareto_front(pts) == [0, 1, 4]
    assert pareto_front([]) == []




def test_cli_malformed_slo_is_one_clear_line():
    assert_one_line_error(run_cli("search", "--slo", "ttft=2000"), "ttft=2000",
                          "ttft_{p50,p90,p99,mean}_ms", "tok_s_user_")


def test_cli_malformed_slo_file_is_one_clear_line(tmp_path):
    path = tmp_path / "slo.yaml"
    path.write_text("tok_s_user_p90: lots\n")
    assert_one_line_error(run_cli("search", "--slo-file", str(path)), "slo.yaml",
                          "'lots' is not a number")


def test_shorthands_and_vllm_goodput_are_p90_bounds():
    from planner.objectives import goodput_slos, shorthand_slo

    assert shorthand_slo("ttft", "2000") == SLO("ttft_p90_ms", 2000.0)
    assert goodput_slos(["ttft:2000 tpot:50", "itl:40"]) == (
        SLO("ttft_p90_ms", 2000.0), SLO("tpot_p90_ms", 50.0), SLO("itl_p90_ms", 40.0))
    with pytest.raises(SpecError, match="'e2el:9' is not KEY:MS"):
        goodput_slos(["e2el:9"])
    with pytest.raises(SpecError, match="--tpot 'fast'"):
        shorthand_slo("tpot", "fast")


def test_a_target_rate_is_a_lower_bound_on_what_the_deployment_carries():
    from planner.objectives import parse_target_rate

    slo = parse_target_rate("50000tok/s")
    assert slo == SLO("token_rate", 50000.0) and slo.bound == "lower"
    carried = {"throughput_tok_s_gpu": 4000.0, "gpus": 16, "completed": 300, "duration_s": 20.0}
    assert meets(carried, (slo,)) and not meets(carried, (parse_target_rate("16req/s"),))
    with pytest.raises(SpecError, match="--target-rate '12 users'"):
        parse_target_rate("12 users")
