"""Load as an answer: the --loads ladder, a workload at another load, a search whose feasible
plans need a lower load, the curves across load, and the fewest GPUs for a target rate."""

import json

import pytest

from planner.cli import main
from planner.curves import curves
from planner.load import at_load, for_target, ladder, offered
from planner.objectives import SLO, parse_target_rate
from planner.plan import build_plan, summarize
from planner.search import SearchConfig, finished, records, run_search, simulations
from planner.space import build_space, deployment_from_params, enumerate_params
from simulator.specs.errors import SpecError
from simulator.specs.workload import (
    ClosedArrival,
    FixedLength,
    PoissonArrival,
    SessionsArrival,
    TraceArrival,
    Workload,
)
from tests.planner.cli_run import assert_one_line_error, run_cli
from tests.planner.fakes import LoadAware

CLOSED = Workload(arrival=ClosedArrival(concurrency=256), requests=512,
                  input_tokens=FixedLength(value=1000), output_tokens=FixedLength(value=200))
SLOW_USERS = (SLO("tok_s_user_p90", 30.0),)
"""1000 / load tokens/s per user (LoadAware): only loads up to 33 users meet it."""


def space(gpus=32):
    return build_space("deepseek-r1", "h200", gpus, layouts=("pd",), deps=(8, 16),
                       max_num_seqs=(64,), max_num_batched_tokens=(8192,), mtp_tokens=(0,),
                       all2all=("deepep_low_latency",), dbo=(False,))


def config(tmp_path, **kw):
    base = dict(space=space(), workload=CLOSED, trials=24, seed=0, screen=False,
                storage=f"sqlite:///{tmp_path}/load.db", startup_trials=8, slos=SLOW_USERS)
    return SearchConfig(**{**base, **kw})


def test_auto_ladder_halves_from_twice_the_workloads_load():
    assert ladder(CLOSED, "auto") == (8, 16, 32, 64, 128, 256, 512)
    assert ladder(CLOSED, "3, 1.4,3") == (1, 3)  # whole users, each once, ascending
    open_ = CLOSED.model_copy(update={"arrival": PoissonArrival(rate=10.0)})
    assert ladder(open_, "auto")[-1] == 20.0 and ladder(open_, "0.5")[0] == 0.5


@pytest.mark.parametrize("text, needle", [("x", "'x' is not a number"),
                                          ("8,-2", "'-2' must be a positive number of users"),
                                          ("nan", "must be a positive")])
def test_a_bad_ladder_names_the_value(text, needle):
    with pytest.raises(SpecError, match=needle):
        ladder(CLOSED, text)


def test_a_trace_sweeps_its_users_where_it_replays_at_a_concurrency():
    timed = CLOSED.model_copy(update={"arrival": TraceArrival(path="t.jsonl")})
    with pytest.raises(SpecError, match="replayed at its timestamps has no load to sweep; "
                                        "give it a concurrency"):
        ladder(timed, "auto")
    rows = CLOSED.model_copy(update={"arrival": TraceArrival(path="t.jsonl", concurrency=88)})
    assert ladder(rows, "44,88,176") == (44, 88, 176)
    more = at_load(rows, 176)  # AIPerf replays the whole file at every concurrency
    assert more.arrival.concurrency == 176 and more.requests == rows.requests
    assert more.arrival.path == "t.jsonl"


def test_a_workload_at_another_load_keeps_its_requests_per_user():
    low = at_load(CLOSED, 32)
    assert low.arrival.concurrency == 32 and low.requests == 64  # 512 x 32/256
    assert at_load(CLOSED, 8).requests == 64  # at least MIN_REQUESTS
    assert at_load(CLOSED, 1024).requests == 2048
    assert at_load(CLOSED, 256) is CLOSED
    lanes = Workload(arrival=SessionsArrival(concurrency=16), requests=200)
    assert offered(at_load(lanes, 64)) == 64 and at_load(lanes, 64).requests == 800


def test_only_a_lower_load_meets_the_slo_and_the_search_finds_it(tmp_path):
    none = run_search(config(tmp_path, study="own"), evaluate=LoadAware(CLOSED))
    assert summarize(records(finished(none)), SLOW_USERS).best is None
    study = run_search(config(tmp_path, loads=ladder(CLOSED, "auto")),
                       evaluate=LoadAware(CLOSED))
    summary = summarize(records(finished(study)), SLOW_USERS)
    assert summary.best is not None and summary.best["load"] == 32  # the most users that fit
    plan = build_plan(summary, CLOSED, SLOW_USERS, "slo", 0, "s", "sqlite://")
    assert plan["workload"]["arrival"]["concurrency"] == 32  # the plan is what was simulated


def test_the_best_deployments_are_simulated_at_every_load_and_kept_in_the_study(tmp_path):
    cfg = config(tmp_path, loads=ladder(CLOSED, "auto"), curves=2)
    study = run_search(cfg, evaluate=LoadAware(CLOSED))
    recs = records(finished(study))
    summary = summarize(recs, SLOW_USERS)
    sweep = curves(summary, recs, cfg.curves)
    assert len(sweep["curves"]) == 2
    for curve in sweep["curves"]:
        assert [p["load"] for p in curve["points"]] == list(cfg.loads)
        assert [p["meets_slo"] for p in curve["points"]] == [True] * 3 + [False] * 4
        speeds = [p["tok_s_user_p50"] for p in curve["points"]]
        assert speeds == sorted(speeds, reverse=True)
    env = sweep["envelope"]
    assert [p["tok_s_user_p50"] for p in env] == sorted(p["tok_s_user_p50"] for p in env)
    ran = simulations(finished(study))
    again = run_search(cfg, evaluate=LoadAware(CLOSED))  # resumed: nothing left to simulate
    assert simulations(finished(again)) == ran


def test_target_rate_gives_the_fewest_gpus_that_carry_it(tmp_path):
    target = parse_target_rate("100req/s")  # LoadAware: 10 x min(load, 4 x GPUs) / 10 s
    workload, loads = for_target(CLOSED, target.metric, target.value, ())
    assert loads == ladder(CLOSED, "auto")
    s = space(48)
    cfg = config(tmp_path, space=s, workload=workload, loads=loads, objective="gpus",
                 slos=(target,), trials=40)
    summary = summarize(records(finished(run_search(cfg, evaluate=LoadAware(CLOSED)))),
                        cfg.slos, "gpus")
    fewest = min(d.gpus_used for d in (deployment_from_params(s, p)
                                       for p in enumerate_params(s)) if 4 * d.gpus_used >= 100)
    assert summary.best is not None and summary.best["metrics"]["gpus"] == fewest == 32
    assert summary.best["load"] >= 100


def test_target_rate_offers_an_open_loop_the_rate_itself():
    poisson = CLOSED.model_copy(update={"arrival": PoissonArrival(rate=1.0)})
    workload, loads = for_target(poisson, "request_rate", 12.0, ())
    assert workload.arrival.rate == 12.0 and loads == ()
    per_token, _ = for_target(poisson, "token_rate", 12000.0, ())
    assert per_token.arrival.rate == pytest.approx(10.0)  # 1200 tokens a request


def test_search_cli_plots_the_sweep_and_reports_curves(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr("planner.search.Simulator", LoadAware)
    wl = tmp_path / "w.yaml"
    wl.write_text("arrival: {kind: closed, concurrency: 64}\nrequests: 64\n")
    code = main(["search", "--model", "deepseek-r1", "--hardware", "h200", "--gpus", "16",
                 "--workload", str(wl), "--slo", "tok_s_user_p90=30", "--loads", "8,32,128",
                 "--trials", "12", "--no-screen", "--storage", f"sqlite:///{tmp_path}/c.db",
                 "--out", str(tmp_path / "plan.yaml"), "--plot", str(tmp_path / "c.png"),
                 "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["best"]["load"] == 32
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out["chart"] == str(tmp_path / "c.png")
    assert [p["load"] for p in out["curves"]["curves"][0]["points"]] == [8, 32, 128]


def test_search_cli_refuses_a_bad_plot_path_before_searching(tmp_path):
    r = run_cli("search", "--plot", str(tmp_path / "chart.gif"), "--storage",
                f"sqlite:///{tmp_path}/x.db")
    assert_one_line_error(r, "chart.gif", ".png")
    assert not (tmp_path / "x.db").exists()


def test_search_cli_refuses_a_bad_target_rate(tmp_path):
    r = run_cli("search", "--target-rate", "fast", "--storage", f"sqlite:///{tmp_path}/x.db")
    assert_one_line_error(r, "--target-rate 'fast'", "tok/s")
