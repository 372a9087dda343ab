"""benchmarks/closed_loop.py: its fit, engine-metric and report parts on synthetic numbers, and
the whole loop with --quick against the real CPU engine (skipped without .venv-engine)."""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from executor.backends.local import default_vllm, group_members
from kernels.from_run import fit_handoff, fit_overheads
from simulator.calibration.serving import ServingOverhead
from tests.benchmarks.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "closed_loop.py"


cl = load_script("closed_loop")


def fake_simulate(kernel_ms=0.8, prefill_ms=3.0):
    """A simulation whose TPOT is kernels + step overhead and whose TTFT is a prefill step plus
    the API overhead and the handoff, as at concurrency 1."""
    calls = []

    def simulate(o):
        step = o.step_overhead_ms or 0.0
        calls.append((step, o.api_overhead_ms, o.handoff_ms))
        return {"tpot_ms": {"p50": kernel_ms + step},
                "ttft_ms": {"p50": prefill_ms + step + o.api_overhead_ms + o.handoff_ms}}

    return simulate, calls


def test_fit_recovers_step_and_api_overheads_from_synthetic_measurements():
    simulate, calls = fake_simulate()
    fit = fit_overheads(engine_tpot_ms=2.3, ttft_p50_ms=30.0, simulate=simulate)
    assert fit["kernel_tpot_ms"] == pytest.approx(0.8)
    assert fit["step_overhead_ms"] == pytest.approx(1.5)
    assert fit["simulated_ttft_ms"] == pytest.approx(4.5)
    assert fit["api_overhead_ms"] == pytest.approx(25.5)
    assert calls[0] == (0.0, 0.0, 0.0)  # the kernels alone first
    handoff = fit_handoff(60.0, ServingOverhead(step_overhead_ms=fit["step_overhead_ms"],
                                                api_overhead_ms=fit["api_overhead_ms"]),
                          simulate)
    assert handoff == pytest.approx(30.0)


def test_fit_floors_at_zero_and_refuses_non_numbers():
    simulate, _ = fake_simulate(kernel_ms=5.0, prefill_ms=50.0)
    fit = fit_overheads(engine_tpot_ms=2.0, ttft_p50_ms=10.0, simulate=simulate)
    assert fit["step_overhead_ms"] == 0.0 and fit["api_overhead_ms"] == 0.0
    with pytest.raises(ValueError, match="TTFT p50 is nan"):
        fit_overheads(2.0, float("nan"), simulate)


PROM_BEFORE = """# HELP vllm:e2e_request_latency_seconds x
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 10.0
vllm:request_time_per_output_token_seconds_sum{engine="0",model_name="m"} 0.02
vllm:request_time_per_output_token_seconds_count{engine="0",model_name="m"} 10.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 100.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 400.0
vllm:generation_tokens_total{engine="0",model_name="m"} 300.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.0
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 10.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 0.0
"""
PROM_AFTER = """vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 14.0
vllm:request_time_per_output_token_seconds_sum{engine="0",model_name="m"} 0.03
vllm:request_time_per_output_token_seconds_count{engine="0",model_name="m"} 14.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 150.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 600.0
vllm:iteration_tokens_total_sum{engine="1",model_name="m"} 10.0
vllm:generation_tokens_total{engine="0",model_name="m"} 400.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.04
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 14.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 2000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 128.0
"""


def test_engine_figures_are_the_means_between_two_reads():
    names = cl.ENGINE_SERIES.values()
    before, after = cl.parse_prometheus(PROM_BEFORE, names), cl.parse_prometheus(PROM_AFTER,
                                                                                  names)
    assert after["vllm:iteration_tokens_total_sum"] == 610.0  # summed over label sets
    got = cl.engine_figures(before, after)
    assert got["requests"] == 4 and got["steps"] == 50
    assert got["tokens_per_step"] == pytest.approx(210 / 50)
    assert got["generated_per_step"] == pytest.approx(100 / 50)
    assert got["tpot_mean_ms"] == pytest.approx(2.5)
    assert got["queue_mean_ms"] == pytest.approx(10.0)
    assert got["prefill_mean_ms"] is None and got["itl_mean_ms"] is None
    assert got["prefix_hit_rate"] == pytest.approx(128 / 1000)  # hits / lookups between reads
    assert cl.engine_figures(before, before)["prefix_hit_rate"] is None


def test_the_runs_of_a_workload_add_up_across_rounds():
    """Runs of one workload interleaved with others: their reads summed give the figures of
    those runs together, not of what ran between them."""
    names = cl.ENGINE_SERIES.values()
    before, after = cl.parse_prometheus(PROM_BEFORE, names), cl.parse_prometheus(PROM_AFTER,
                                                                                  names)
    later = {k: v + 1000.0 for k, v in after.items()}  # a second run after other workloads
    total_before: dict = {}
    total_after: dict = {}
    for b, a in ((before, after), ({k: v + 900.0 for k, v in after.items()}, later)):
        cl._add_reads(total_before, {"e": b})
        cl._add_reads(total_after, {"e": a})
    got = cl.engine_figures(total_before["e"], total_after["e"])
    one = cl.engine_figures(before, after)
    assert got["steps"] == one["steps"] + 100 and got["requests"] == one["requests"] + 100


def test_the_engines_own_tpot_is_the_median_run_of_the_decoding_engine():
    """Kept beside the fit's measured TPOT p50: one slow run moves it less than a mean over
    all runs would."""

    def run(tpot_ms):
        return {"prefill-0": {"tpot_mean_ms": None}, "decode-0": {"tpot_mean_ms": tpot_ms}}

    slow_first = cl.Measured([], {}, (0.0, 0.0), (run(5.4), run(3.5), run(3.6)))
    assert slow_first.engine_tpot_ms() == 3.6
    assert cl.Measured([], {}, (0.0, 0.0), (run(2.0), run(3.0))).engine_tpot_ms() == 2.5
    assert cl.Measured([], {}, (0.0, 0.0), (run(None),)).engine_tpot_ms() is None


def test_points_score_errors_against_the_measurement_and_the_targets():
    p = cl.Point("aggregated", 4, 16,
                 predicted={"ttft_ms": 11.5, "tpot_ms": 2.3, "itl_ms": 2.0, "output_tok_s": 90.0},
                 measured={"ttft_ms": 10.0, "tpot_ms": 2.5, "itl_ms": 0.0, "output_tok_s": None},
                 spread={"ttft_ms": [8.0, 12.0], "tpot_ms": [2.5, 2.5], "itl_ms": [0.0, 0.0],
                         "output_tok_s": None}, runs=3, streamed=0.25,
                 engine={"aggregated-0": {"tpot_mean_ms": 2.4, "queue_mean_ms": 1.0,
                                          "prefill_mean_ms": 4.0, "ttft_mean_ms": 7.0,
                                          "generated_per_step": 3.5,
                                          "prefix_hit_rate": 0.015}}, load=(1.0, 1.5))
    assert p.error("ttft_ms") == pytest.approx(0.15) and p.within("ttft_ms") is True
    assert p.error("tpot_ms") == pytest.approx(-0.08) and p.within("tpot_ms") is True
    assert replace(p, predicted={**p.predicted, "tpot_ms": 2.0}).within("tpot_ms") is False
    assert p.error("itl_ms") is None and p.within("itl_ms") is None  # measured 0
    assert p.within("output_tok_s") is None
    d = p.to_dict()
    assert d["within_target"] == {"ttft_ms": True, "tpot_ms": True, "output_tok_s": None}
    json.dumps(d)
    report = {"date": "2026-11-29", "machine": {"cpus": 2, "gpu": None, "engine": "0.32.0+cpu"},
              "calibration": {"source": "reused (full sweep)", "threads": 1},
              "settings": vars(cl.Settings()) | {"concurrencies": [1, 4, 16]},
              "fit": {"step_overhead_ms": 1.5, "api_overhead_ms": 20.0}}
    md = cl.to_markdown(report, [p])
    assert "| aggregated | 4 | 11.5 / 10 [8-12] (+15%) | 2.3 / 2.5 [2.5-2.5] (-8%) |" in md
    assert "| 90 / n/a (n/a) | yes / yes /  |" in md
    assert "| aggregated | 4 | 16 x 3 | 25% | 2.3 / 2.4 (-4%) | 3.5 | 5 | 7 |  | 2% | 1.0 / 1.5 |" \
        in md
    assert p.engine_tpot_error() == pytest.approx(2.3 / 2.4 - 1)
    assert "handoff not fitted" in md and "aggregated step overhead 1.50 ms" in md


def test_a_pd_point_shows_each_engine_s_part_of_the_first_token():
    """On P/D the prefill instance's queue + prefill and API-server TTFT, and the decode
    instance's queue + first step (the handed-over KV loaded, the tail computed) and its own."""
    p = cl.Point("pd", 4, 64, predicted={"ttft_ms": 29.0, "tpot_ms": 3.6, "itl_ms": 3.6,
                                          "output_tok_s": 990.0},
                 measured={"ttft_ms": 38.4, "tpot_ms": 3.5, "itl_ms": 3.4, "output_tok_s": 985.0},
                 runs=5, streamed=1.0, load=(2.4, 2.3),
                 engine={"prefill-0": {"queue_mean_ms": 1.5, "prefill_mean_ms": 8.4,
                                       "ttft_mean_ms": 15.7, "prefix_hit_rate": 0.0},
                         "decode-0": {"tpot_mean_ms": 3.66, "generated_per_step": 3.83,
                                      "queue_mean_ms": 2.0, "prefill_mean_ms": 7.0,
                                      "ttft_mean_ms": 12.0, "prefix_hit_rate": 0.0}})
    view = cl.engine_view(p)
    assert view["queue_prefill_mean_ms"] == pytest.approx(9.9)
    assert (view["decode_queue_first_mean_ms"], view["decode_api_ttft_mean_ms"]) == (9.0, 12.0)
    report = {"date": "2026-12-05", "machine": {"cpus": 2, "gpu": None, "engine": "0.32.0+cpu"},
              "calibration": {"source": "reused (full sweep)", "threads": 1},
              "settings": vars(cl.Settings()), "fit": {}}
    assert "| 3.83 | 9.9 | 15.7 | 9 / 12 | 0% |" in cl.to_markdown(report, [p])


def test_the_core_probe_times_each_core_and_gives_the_process_its_cores_back():
    cores = os.sched_getaffinity(0)
    got = cl.probe_cores(0.2)
    assert os.sched_getaffinity(0) == cores
    assert set(got) == {str(c) for c in cores}
    for p in got.values():
        assert p["samples"] >= 1 and 0.0 <= p["slow_share"] <= 1.0
        assert 0 < p["fastest_ms"] <= p["median_ms"] <= p["slowest_ms"]
    line = cl.probe_line({"before": {"0": {"samples": 10, "fastest_ms": 12.4,
                                           "median_ms": 13.0, "slowest_ms": 22.6,
                                           "slow_share": 0.35}}, "after": {}})
    assert line is not None and "before: core 0 12.4-22.6 ms, 35 % slow" in line
    assert "not steady (up to 35 % of samples slow)" in line
    assert "after" not in line and cl.probe_line({}) is None
    steady = cl.probe_line({"after": {"1": {"samples": 10, "fastest_ms": 12.4, "median_ms": 12.5,
                                            "slowest_ms": 13.0, "slow_share": 0.0}}})
    assert steady is not None and "not steady" not in steady


def test_runs_combine_to_their_median_and_range_and_bursts_are_counted():
    runs = [{"p50_ttft_ms": 30.0, "p50_tpot_ms": 2.0, "output_throughput": 100.0,
             "itls": [[0.003, 0.00001, 0.00001], [0.002]]},
            {"p50_ttft_ms": 10.0, "p50_tpot_ms": None, "output_throughput": 300.0},
            {"p50_ttft_ms": 20.0, "p50_tpot_ms": 4.0, "output_throughput": 200.0}]
    median, spread = cl.combine(runs)
    assert median["ttft_ms"] == 20.0 and spread["ttft_ms"] == [10.0, 30.0]
    assert median["tpot_ms"] == 3.0 and spread["tpot_ms"] == [2.0, 4.0]
    assert median["itl_ms"] is None and spread["itl_ms"] is None
    assert cl.streamed_share(runs) == pytest.approx(0.5)
    assert cl.streamed_share(runs[1:]) is None


def test_both_sides_get_the_same_closed_loop_workload():
    from executor.bench import bench_settings
    from simulator.specs.loading import load_workload

    s = cl.Settings()
    w = load_workload(cl.workload_dict(s, 16, s.prompts(16), 0))
    b = bench_settings(w)
    assert (b.max_concurrency, b.num_prompts, b.input_len, b.output_len) == (16, 256, 64, 64)
    assert w.requests == 256 and s.prompts(1) == 32
    assert cl.measured_metrics({"p50_ttft_ms": 5.0, "p50_tpot_ms": float("nan"),
                                "output_throughput": 7})["tpot_ms"] is None
    pred = cl.predicted_metrics({"ttft_ms": {"p50": 1.0}, "tpot_ms": {"p50": 2.0},
                                 "itl_ms": {"p50": 3.0}, "output_tok_s_gpu": 50.0}, 2)
    assert pred["output_tok_s"] == 100.0


@pytest.mark.skipif(not default_vllm().exists(),
                    reason=f"the engine environment is missing ({default_vllm()} not found); "
                           "run `make engine`")
def test_quick_loop_against_the_real_engine(tmp_path):
    pytest.importorskip("torch", reason="rackplan calibrate needs torch")
    out = tmp_path / "loop"
    r = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "closed-loop.json").read_text())
    assert [p["concurrency"] for p in report["points"]] == [1, 4]
    for p in report["points"]:
        assert p["measured"]["output_tok_s"] > 0 and p["predicted"]["output_tok_s"] > 0
        engine = p["engine"]["aggregated-0"]
        assert engine["requests"] == p["prompts"] and engine["tpot_mean_ms"] > 0
    assert report["fit"]["step_overhead_ms"] >= 0 and report["fit"]["api_overhead_ms"] >= 0
    # the step overhead is fitted on the TPOT p50 the runs measured, the figure compared
    assert report["fit"]["aggregated_tpot_p50_ms_c1"] > 0
    assert "| aggregated | 4 |" in (out / "closed-loop.md").read_text()
    saved = json.loads((out / "calibration" / "serving_overhead.json").read_text())
    assert set(saved["hardware"]["cpu"]["vllm"]) >= {"step_overhead_ms", "api_overhead_ms"}
    # the prediction comes back from `rackplan simulate PLAN --calibration DIR` alone
    sim = subprocess.run([sys.executable, "-m", "planner.cli", "simulate",
                          str(out / "plans" / "aggregated-c4.yaml"), "--calibration",
                          str(out / "calibration"), "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert sim.returncode == 0, sim.stderr
    got = json.loads(sim.stdout)
    assert got["ttft_ms"]["p50"] == pytest.approx(report["points"][1]["predicted"]["ttft_ms"])
    assert got["tpot_ms"]["p50"] == pytest.approx(report["points"][1]["predicted"]["tpot_ms"])
    runs = sorted((out / "runs").glob("*/run*/report.json"))
    seeds = {json.loads(f.read_text())["settings"]["seed"] for f in runs}
    assert len(runs) == 4 and len(seeds) == 4  # no run repeats another's prompts
    pids = json.loads((out / "deploy" / "aggregated" / "pids.json").read_text())
    assert pids and not [r for r in pids if group_members(r["pgid"])]
    # replayed with the same code, the loop's runs give its fit and predictions again
    again = tmp_path / "replayed"
    r = subprocess.run([sys.executable, str(SCRIPT), "--replay", str(out), "--out", str(again)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    replayed = json.loads((again / "closed-loop.json").read_text())
    assert replayed["replayed"]["loop"] == str(out)
    for key in ("step_overhead_ms", "step_overhead_per_seq_ms", "api_overhead_ms"):
        assert replayed["fit"][key] == pytest.approx(report["fit"][key])
    for old, new in zip(report["points"], replayed["points"], strict=True):
        assert new["measured"] == old["measured"] and new["engine"] == old["engine"]
        for m in ("ttft_ms", "tpot_ms", "output_tok_s"):
            assert new["predicted"][m] == pytest.approx(old["predicted"][m])
    assert not (out / "calibration").samefile(again / "calibration")
    met = sum(1 for p in report["points"] for v in p["within_target"].values() if v)
    of = sum(1 for p in report["points"] for v in p["within_target"].values() if v is not None)
    assert f"targets met: {met} -> {met} of {of}" in (again / "closed-loop.md").read_text()
    # several loops at once: a line each in OUT/replays.md
    twin = tmp_path / "twin"
    shutil.copytree(out, twin, ignore=shutil.ignore_patterns("deploy"))
    r = subprocess.run([sys.executable, str(SCRIPT), "--replay", str(out), str(twin), "--out",
                        str(tmp_path / "many")], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = (tmp_path / "many" / "replays.md").read_text().splitlines()
    assert [line.split(" | ")[2] for line in lines[2:]] == [f"{met} -> {met} of {of}"] * 2


def test_a_replay_needs_a_loop_s_folder_and_another_to_write(tmp_path, capsys):
    assert cl.main(["--replay", str(tmp_path), "--out", str(tmp_path / "new")]) == 1
    assert f"--replay {tmp_path} holds no closed-loop.json" in capsys.readouterr().err
    (tmp_path / "closed-loop.json").write_text("{}")
    assert cl.main(["--replay", str(tmp_path), "--out", str(tmp_path)]) == 1
    assert "is the replayed loop's own folder" in capsys.readouterr().err
    assert cl.main(["--replay", str(tmp_path), "--out", str(tmp_path / "new")]) == 1
    assert "closed-loop.json has no settings, fit, points" in capsys.readouterr().err
    (tmp_path / "closed-loop.json").write_text(json.dumps({"settings": {}, "fit": {},
                                                           "points": []}))
    assert cl.main(["--replay", str(tmp_path), "--out", str(tmp_path / "new")]) == 1
    assert "holds no recorded runs" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_several_replays_are_checked_before_any_is_written(tmp_path, capsys):
    a, b = tmp_path / "one" / "loop", tmp_path / "two" / "loop"
    for d in (a, b):
        d.mkdir(parents=True)
        (d / "closed-loop.json").write_text("{}")
    out = tmp_path / "out"
    assert cl.main(["--replay", str(a), str(b), "--out", str(out)]) == 1
    assert "--replay names loop more than once" in capsys.readouterr().err
    assert cl.main(["--replay", str(a), str(tmp_path / "none"), "--out", str(out)]) == 1
    assert f"--replay {tmp_path / 'none'} holds no closed-loop.json" in capsys.readouterr().err
    assert not out.exists()


def test_an_engine_that_ended_the_loop_is_named_with_its_exception(tmp_path):
    logs = tmp_path / "deploy" / "pd" / "logs"
    logs.mkdir(parents=True)
    (logs / "proxy.log").write_text("rackplan proxy on http://127.0.0.1:1\n")
    (logs / "prefill-0-h0.log").write_text(
        "(APIServer pid=1) WARNING ... failed with error current limit exceeds maximum\n"
        "(APIServer pid=1) ERROR 12-05 [async_llm.py:906] Traceback (most recent call last):\n"
        "(APIServer pid=1) ERROR 12-05 [async_llm.py:906] ValueError: Counters can only be "
        "incremented by non-negative amounts.\n")
    got = cl.engine_failure(tmp_path)
    assert got == (f"{logs / 'prefill-0-h0.log'}: ValueError: Counters can only be "
                   "incremented by non-negative amounts.")
    assert cl.engine_failure(tmp_path / "nothing") is None
