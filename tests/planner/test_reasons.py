"""Why a search chose what it chose, or nothing: trials counted per reason, and each SLO's
standing against the chosen (or the closest) plan."""

import subprocess
import sys

import pytest

from planner.objectives import SLO
from planner.plan import (
    advice,
    reasons,
    slo_standing,
    standing_text,
    summarize,
    to_json,
    why_chosen,
)
from planner.search import finished, records, run_search
from tests.planner.fakes import BatchTradeoff, metrics
from tests.planner.test_search import config

SLOS = (SLO("tok_s_user_p90", 50.0), SLO("ttft_p90_ms", 1000.0))


def record(number, stage, reason="", m=None):
    r = {"number": number, "stage": stage, "deployment": {"model": "m", "n": number},
         "layout": "pd"}
    if reason:
        r["reason"] = reason
    if m is not None:
        r.update(metrics=m, meets_slo=all(s.violation(m) <= 0 for s in SLOS))
    return r


def test_reasons_are_counted_by_kind_and_missed_slo():
    recs = [
        record(0, "rejected", "uses 40 GPUs (prefill 1 x DEP8 decode 1 x DEP32) but the "
                              "budget is 32"),
        record(1, "rejected", "uses 48 GPUs (decode 3 x DEP16) but the budget is 32"),
        record(2, "rejected", "decode: weights 700 GiB do not fit: HBM 141 GiB x 0.9 per GPU"),
        record(3, "rejected", "something new"),
        record(11, "rejected", "decode: redundant_experts=32 is more than dep=1 can place: 256 "
                               "experts x (1 - 1) = 0 extra slots already put every expert on "
                               "every rank"),
        record(4, "screened_out", "screen: tok_s_user_p90 ~31.0 < 50 (SLO)"),
        record(5, "screened_out", "screen: throughput ~1,200 tok/s/GPU < 85% of the best "
                                  "simulated 2,000"),
        record(6, "screened_out", "screen: ttft_p90_ms unbounded (capacity below the load)"),
        record(7, "screened_out", "screen: same estimate as simulated trial 9"),
        record(8, "simulated", m=metrics(1000.0, user=40.0, ttft=1500.0)),
        record(9, "simulated", m=metrics(900.0, user=60.0, ttft=800.0)),
        record(10, "failed", "ValueError: boom"),
    ]
    got = reasons(recs, SLOS)
    assert got["rejected"] == {"over the GPU budget": 2, "weights or KV do not fit memory": 1,
                               "a vLLM rule": 1, "other": 1}
    assert got["screened_out"] == {"estimate below the best": 1,
                                   "estimate misses tok_s_user_p90": 1,
                                   "estimate misses ttft_p90_ms": 1,
                                   "same estimate as a simulated plan": 1}
    assert got["missed_slo"] == {"tok_s_user_p90 >= 50": 1, "ttft_p90_ms <= 1000": 1}
    assert got["failed"] == {"ValueError": 1}


def test_the_standing_says_which_slo_binds_and_by_how_much():
    standing = slo_standing(metrics(1000.0, user=55.0, ttft=500.0), SLOS)
    assert [e["metric"] for e in standing] == ["tok_s_user_p90", "ttft_p90_ms"]  # tightest
    assert standing[0]["margin"] == pytest.approx(0.1)
    assert standing[1]["margin"] == pytest.approx(0.5)
    assert standing_text(standing[0]) == "tok_s_user_p90 55 against >= 50: 10% headroom"
    missed = slo_standing(metrics(1000.0, user=40.0, ttft=1500.0), SLOS)
    assert standing_text(missed[0]) == "ttft_p90_ms 1,500 against <= 1000: 50% short"


def test_an_infeasible_search_says_why_and_how_close_it_came(tmp_path):
    # BatchTradeoff: tokens/s per user is 4000 / max_num_seqs, at most 250; ask for 1000
    slos = (SLO("tok_s_user_p90", 1000.0),)
    study = run_search(config(tmp_path, slos=slos), evaluate=BatchTradeoff())
    summary = summarize(records(finished(study)), slos)
    assert summary.best is None and summary.closest is not None
    simulated = [r for r in records(finished(study)) if r["stage"] == "simulated"]
    assert summary.reasons["missed_slo"] == {"tok_s_user_p90 >= 1000": len(simulated)}
    (standing,) = summary.standing
    assert standing["value"] == 250.0  # max_num_seqs 16, the space's smallest
    assert standing["margin"] == pytest.approx(-0.75)
    out = to_json(summary)
    assert out["reasons"] == summary.reasons and out["slo_standing"] == summary.standing
    assert out["closest"]["trial"] == summary.closest["number"]


def test_the_cli_prints_the_reasons_of_an_infeasible_search(tmp_path):
    wl = tmp_path / "w.yaml"
    wl.write_text("arrival: {kind: closed, concurrency: 4}\nrequests: 8\n"
                  "input_tokens: {kind: fixed, value: 256}\n"
                  "output_tokens: {kind: fixed, value: 8}\n")
    r = subprocess.run([sys.executable, "-m", "planner.cli", "search", "--hardware", "h200",
                        "--gpus", "16", "--workload", str(wl), "--slo", "ttft_p90_ms<=0.001",
                        "--trials", "4", "--no-screen", "--storage",
                        f"sqlite:///{tmp_path}/s.db", "--out", str(tmp_path / "plan.yaml")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    assert "simulated, missed: ttft_p90_ms <= 0.001" in r.stdout
    assert "SLOs against the closest plan" in r.stdout
    line = r.stderr.strip().splitlines()[-1]  # after any progress lines
    assert "no plan met the SLOs" in line and "% short" in line and "closest:" in line
    assert not (tmp_path / "plan.yaml").exists()


def test_progress_reaches_a_log_when_stderr_is_not_a_terminal(tmp_path, monkeypatch, capsys):
    import planner.cli

    monkeypatch.setattr(planner.cli, "LOG_EVERY_S", 0.0)
    wl = tmp_path / "w.yaml"
    wl.write_text("arrival: {kind: closed, concurrency: 4}\nrequests: 8\n"
                  "input_tokens: {kind: fixed, value: 256}\n"
                  "output_tokens: {kind: fixed, value: 8}\n")
    code = planner.cli.main(["search", "--hardware", "h200", "--gpus", "16", "--workload",
                             str(wl), "--slo", "ttft_p90_ms<=100000", "--trials", "3",
                             "--no-screen", "--storage", f"sqlite:///{tmp_path}/s.db",
                             "--out", str(tmp_path / "plan.yaml")])
    assert code == 0
    err = capsys.readouterr().err.splitlines()
    assert "searching: 3/3 trials" in " ".join(err)
    assert all(line.startswith("searching: ") for line in err)
    refined = [line for line in err if "3 trials and " in line]  # the refinement's rounds
    assert refined and all("more around the best plans" in line for line in refined)
    assert not any("4/3" in line for line in err)


def test_an_infeasible_search_says_what_would_make_it_feasible(tmp_path):
    slos = (SLO("tok_s_user_p90", 1000.0),)  # BatchTradeoff reaches at most 250
    study = run_search(config(tmp_path, slos=slos), evaluate=BatchTradeoff())
    summary = summarize(records(finished(study)), slos)
    hints = advice(summary, (), 32)
    assert hints[0] == "a looser SLO: tok_s_user_p90 >= 250 admits the closest plan"
    assert any("--loads auto" in h for h in hints) and any("--gpus 64" in h for h in hints)
    assert "a load below 8 users" in " ".join(advice(summary, (8.0, 16.0), 32, "users"))
    assert why_chosen(summary) == ""


def test_a_found_plan_says_why_it_beat_the_next_one(tmp_path):
    slos = (SLO("tok_s_user_p90", 50.0),)  # 4000 / max_num_seqs: at most 64 seqs
    study = run_search(config(tmp_path, slos=slos, trials=30), evaluate=BatchTradeoff())
    summary = summarize(records(finished(study)), slos)
    assert advice(summary, (), 32) == []
    why = why_chosen(summary)
    a, b = (r["metrics"]["throughput_tok_s_gpu"] for r in (summary.best,
                                                            summary.alternatives[0]))
    said = f"{a / b - 1:.0%} more tok/s/GPU" if a > b * 1.005 else "as many tok/s/GPU"
    assert why.startswith(f"{said} as the next alternative" if a <= b * 1.005
                          else f"{said} than the next alternative")
    assert why.endswith(standing_text(summary.standing[0]))
