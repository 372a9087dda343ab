"""executor/bench: the plan's workload as `vllm bench serve` arguments, and the report
comparing its result with the prediction (the benchmark itself faked here), also for a result
file measured elsewhere (`rackplan bench PLAN --from-file RESULT.json`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from executor.bench import (
    BenchError,
    Comparison,
    aiperf_result,
    bench_command,
    bench_settings,
    compare,
    compare_file,
    read_result,
    run_bench,
)
from planner.cli import main
from simulator.specs.errors import SpecError
from simulator.specs.loading import load_workload
from tests.executor.fake_vllm import BENCH_RESULT
from tests.executor.local_helpers import TINY_PD, fake_vllm


def settings(**workload: object):
    return bench_settings(load_workload(workload))


def arg(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_closed_loop_fixed_lengths_map_exactly():
    s = settings(arrival={"kind": "closed", "concurrency": 4}, requests=8,
                 input_tokens={"kind": "fixed", "value": 64},
                 output_tokens={"kind": "fixed", "value": 16}, seed=3)
    args = s.args()
    assert (arg(args, "--random-input-len"), arg(args, "--random-output-len")) == ("64", "16")
    assert arg(args, "--max-concurrency") == "4" and arg(args, "--request-rate") == "inf"
    assert arg(args, "--num-prompts") == "8" and arg(args, "--seed") == "3"
    assert json.loads(arg(args, "--random-range-ratio")) == {"input": 0.0, "output": 0.0}
    assert arg(args, "--dataset-name") == "random" and s.notes == ()


def test_uniform_lengths_become_centre_and_range_ratio():
    s = settings(input_tokens={"kind": "uniform", "low": 100, "high": 300},
                 output_tokens={"kind": "uniform", "low": 10, "high": 30})
    assert (s.input_len, s.input_range) == (200, 0.5)
    assert (s.output_len, s.output_range) == (20, 0.5)
    assert s.input_len * (1 - s.input_range) == 100 and s.input_len * (1 + s.input_range) == 300


def test_open_loop_arrivals_map_to_rate_and_burstiness():
    poisson = settings(arrival={"kind": "poisson", "rate": 2.5})
    assert (poisson.request_rate, poisson.burstiness, poisson.max_concurrency) == (2.5, 1.0, None)
    bursty = settings(arrival={"kind": "bursty", "rate": 3, "burstiness": 4})
    assert (bursty.request_rate, bursty.burstiness) == (3, 0.25)  # vLLM's gamma shape = 1/CV²
    assert arg(bursty.args(), "--burstiness") == "0.25"


def test_approximations_are_noted():
    s = bench_settings(load_workload({
        "input_tokens": {"kind": "lognormal", "median": 100, "sigma": 0.5},
        "prefix_hit_rate": 0.25, "sessions": {"turns": 3}, "requests": 40}), num_prompts=8)
    assert s.prefix_len + s.input_len == round(load_workload(
        {"input_tokens": {"kind": "lognormal", "median": 100, "sigma": 0.5}}
    ).input_tokens.mean)
    assert s.prefix_len == round(0.25 * (s.prefix_len + s.input_len))
    assert s.num_prompts == 8
    text = " | ".join(s.notes)
    for needle in ("lognormal", "shared prefix", "sessions of 3 turns", "8 prompts instead of"):
        assert needle in text


@pytest.mark.parametrize(("workload", "needle"), [
    ({"arrival": {"kind": "trace", "path": "t.jsonl"}}, "arrival kind 'trace' has no"),
    ({"mode": "decode_only"}, "mode='decode_only' cannot be measured"),
])
def test_unmappable_workloads_are_refused(workload, needle):
    with pytest.raises(SpecError, match=needle):
        bench_settings(load_workload(workload))


def test_compare_reads_percentiles_and_scales_per_gpu_throughput():
    predicted = {"ttft_ms": {"p50": 50.0, "p90": 100.0, "p99": None},
                 "tpot_ms": {"p50": 10.0, "p90": 10.0, "p99": 10.0},
                 "itl_ms": {"p50": 20.0, "p90": 20.0, "p99": 20.0},
                 "output_tok_s_gpu": 16.0, "throughput_tok_s_gpu": 200.0}
    result = {**BENCH_RESULT}
    del result["p50_ttft_ms"]  # an older vLLM writes only the median
    rows = {r.metric: r for r in compare(predicted, result, gpus=2)}
    assert rows["ttft_ms.p50"] == Comparison("ttft_ms.p50", 50.0, 100.0)
    assert rows["ttft_ms.p50"].rel_error == 1.0
    assert rows["ttft_ms.p90"].rel_error == 0.5
    assert rows["ttft_ms.p99"].rel_error is None  # nothing predicted
    assert rows["itl_ms.p50"].rel_error == -0.5
    assert rows["output_throughput_tok_s"] == Comparison("output_throughput_tok_s", 32.0, 64.0)
    assert math.isclose(rows["total_throughput_tok_s"].rel_error or 0, -0.2)
    assert len(rows) == 11


def test_run_bench_writes_both_reports(tmp_path):
    run_dir = tmp_path / "run"
    report = run_bench(TINY_PD, "http://127.0.0.1:9/", run_dir, vllm=fake_vllm(tmp_path),
                       model="/models/tiny-moe", num_prompts=4)
    log = (run_dir / "logs" / "bench.log").read_text()
    assert "--base-url http://127.0.0.1:9 " in log and "--num-prompts 4 " in log
    assert "--max-concurrency 4" in log and "--ignore-eos" in log
    assert "--tokenizer /models/tiny-moe" in log
    predicted = yaml.safe_load(TINY_PD.read_text())["predicted"]
    ttft = report.row("ttft_ms.p90")
    assert (ttft.predicted, ttft.measured) == (predicted["ttft_ms"]["p90"], 150.0)
    out = report.row("output_throughput_tok_s")
    assert out.predicted == pytest.approx(predicted["output_tok_s_gpu"] * 2)
    saved = json.loads((run_dir / "report.json").read_text())
    assert saved["gpus"] == 2 and saved["measured"]["completed"] == 8
    assert {r["metric"]: r["rel_error"] for r in saved["comparison"]}["ttft_ms.p90"] == \
        pytest.approx(150.0 / predicted["ttft_ms"]["p90"] - 1)
    assert saved["notes"][0] == "4 prompts instead of the plan's 8"
    assert "random dataset" in saved["notes"][1]  # no interpreter beside the fake engine
    md = (run_dir / "report.md").read_text()
    assert "| ttft_ms.p90 |" in md and "closed loop, concurrency 4" in md
    assert report.paths == (run_dir / "report.json", run_dir / "report.md")
    assert report.table().splitlines()[0].split() == ["metric", "predicted", "measured", "error"]


def test_detailed_asks_for_every_requests_timings(tmp_path):
    run_dir = tmp_path / "run"
    run_bench(TINY_PD, "http://127.0.0.1:9", run_dir, vllm=fake_vllm(tmp_path), model="m")
    assert "--save-detailed" not in (run_dir / "logs" / "bench.log").read_text()
    run_bench(TINY_PD, "http://127.0.0.1:9", run_dir, vllm=fake_vllm(tmp_path), model="m",
              detailed=True)
    assert "--save-detailed" in (run_dir / "logs" / "bench.log").read_text()


def test_a_repeated_run_sends_prompts_of_its_own(tmp_path):
    """A seed of its own: the deployment's prefix cache holds the prompts it served before."""
    run_dir = tmp_path / "run"
    run_bench(TINY_PD, "http://127.0.0.1:9", run_dir, vllm=fake_vllm(tmp_path), model="m")
    assert "--seed 0 " in (run_dir / "logs" / "bench.log").read_text()
    run_bench(TINY_PD, "http://127.0.0.1:9", run_dir, vllm=fake_vllm(tmp_path), model="m",
              seed=7)
    assert "--seed 7 " in (run_dir / "logs" / "bench.log").read_text()


def test_run_bench_simulates_a_plan_without_prediction(tmp_path):
    plan = yaml.safe_load(TINY_PD.read_text())
    del plan["predicted"]
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    report = run_bench(path, "http://127.0.0.1:9", tmp_path / "run", vllm=fake_vllm(tmp_path),
                       model="m")
    assert report.row("ttft_ms.p50").predicted is not None
    assert report.row("total_throughput_tok_s").predicted is not None


def test_failed_benchmark_raises_with_its_log(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_BENCH_FAIL", "1")
    needle = r"(?s)exited with code 1 .*bench.log:\n.*refused the connection"
    with pytest.raises(BenchError, match=needle):
        run_bench(TINY_PD, "http://127.0.0.1:9", tmp_path, vllm=fake_vllm(tmp_path), model="m")
    assert not (tmp_path / "report.json").exists()


def test_missing_engine_is_named(tmp_path):
    with pytest.raises(BenchError, match=r"engine executable /nothing/vllm does not exist"):
        run_bench(TINY_PD, "http://127.0.0.1:9", tmp_path, vllm=Path("/nothing/vllm"),
                  model="m")


def test_repredict_simulates_the_plan_with_the_active_tables(tmp_path):
    plan = yaml.safe_load(TINY_PD.read_text())
    plan["predicted"]["ttft_ms"]["p90"] = 1e9  # a stale prediction
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    stale = run_bench(path, "http://127.0.0.1:9", tmp_path / "a", vllm=fake_vllm(tmp_path),
                      model="m")
    assert stale.row("ttft_ms.p90").predicted == 1e9
    fresh = run_bench(path, "http://127.0.0.1:9", tmp_path / "b", vllm=fake_vllm(tmp_path),
                      model="m", repredict=True)
    got = fresh.row("ttft_ms.p90").predicted
    assert got is not None and got < 1e6


def test_run_bench_runs_the_one_bench_command(tmp_path):
    run_dir = tmp_path / "run"
    report = run_bench(TINY_PD, "http://127.0.0.1:9/", run_dir, vllm=fake_vllm(tmp_path),
                       model="/models/tiny-moe", num_prompts=4)
    workload = load_workload(yaml.safe_load(TINY_PD.read_text())["workload"])
    command = bench_command(bench_settings(workload, 4), "http://127.0.0.1:9/",
                            "/models/tiny-moe", str(run_dir.resolve()),
                            exe=str(fake_vllm(tmp_path)))
    assert list(report.command) == command
    assert command[1:3] == ["bench", "serve"] and arg(command, "--base-url") == \
        "http://127.0.0.1:9"
    assert arg(command, "--result-filename") == "bench.json"
    log = (run_dir / "logs" / "bench.log").read_text()
    assert log.splitlines()[0] == "fake vllm bench " + " ".join(command[3:])


def write_result(path: Path, **changes: object) -> Path:
    path.write_text(json.dumps({**BENCH_RESULT, **changes}))
    return path


def test_a_result_file_is_compared_like_a_run_and_nothing_runs(tmp_path):
    result = write_result(tmp_path / "result.json", num_prompts=8)
    ran = run_bench(TINY_PD, "http://127.0.0.1:9", tmp_path / "ran", vllm=fake_vllm(tmp_path),
                    model="m")
    report = compare_file(TINY_PD, result, tmp_path / "file")
    assert report.rows == ran.rows and report.measured == ran.measured
    assert report.command == () and report.result_file == str(result)
    saved = json.loads((tmp_path / "file" / "report.json").read_text())
    assert saved["result_file"] == str(result) and saved["notes"] == []
    assert saved["comparison"] == json.loads((tmp_path / "ran" / "report.json").read_text()
                                             )["comparison"]
    assert f"- result: {result}, measured elsewhere" in (tmp_path / "file" / "report.md"
                                                         ).read_text()
    assert not (tmp_path / "file" / "logs").exists()
    fewer = compare_file(TINY_PD, write_result(tmp_path / "r4.json", num_prompts=4),
                         tmp_path / "four")
    assert fewer.settings is not None
    assert fewer.settings.notes == ("4 prompts instead of the plan's 8",)


def test_a_result_for_a_workload_bench_serve_cannot_describe_is_still_compared(tmp_path):
    plan = yaml.safe_load(TINY_PD.read_text())
    plan["workload"]["arrival"] = {"kind": "trace", "path": "t.jsonl"}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    report = compare_file(path, write_result(tmp_path / "r.json"), tmp_path / "out")
    assert report.settings is None and report.row("ttft_ms.p90").measured == 150.0
    assert "- traffic" not in (tmp_path / "out" / "report.md").read_text()


def test_bench_from_file_prints_the_comparison_and_writes_the_reports(tmp_path, capsys):
    result = write_result(tmp_path / "result.json")
    out = tmp_path / "out"
    assert main(["bench", str(TINY_PD), "--from-file", str(result), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "prediction: the plan's own"
    assert lines[1].split() == ["metric", "predicted", "measured", "error"]
    assert lines[-2:] == [f"report: {out / 'report.json'}", f"report: {out / 'report.md'}"]
    assert (out / "report.json").is_file() and (out / "report.md").is_file()


def test_bench_of_a_deployment_says_its_prediction_is_simulated_now(tmp_path, capsys):
    """A deployment YAML holds no prediction: the predicted column is a simulation now, and the
    first line says so (not "the plan's own")."""
    deck = tmp_path / "deck.yaml"
    deck.write_text(yaml.safe_dump(yaml.safe_load(TINY_PD.read_text())["deployment"]))
    out = tmp_path / "out"
    assert main(["bench", str(deck), "--from-file", str(write_result(tmp_path / "r.json")),
                 "--out", str(out)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"prediction: simulated now: {deck} holds no prediction, so under "
                            'the built-in workload {"arrival": {"kind": "closed", '
                            '"concurrency": 2048'), first


@pytest.mark.parametrize(("content", "needle"), [
    (None, "result.json: no such file"),
    ("{not json", "result.json is not JSON (Expecting property name"),
    ('{"model_id": "m"}', "result.json holds no benchmark result; expected the JSON of "
                          "`vllm bench serve --save-result`"),
    ('{"time_to_first_token": {"unit": "parsecs", "p90": 1}}', "holds no benchmark result"),
    ("[1, 2]", "holds no benchmark result"),
])
def test_a_bad_result_file_is_one_line_and_exit_2(tmp_path, capsys, content, needle):
    result = tmp_path / "result.json"
    if content is not None:
        result.write_text(content)
    out = tmp_path / "out"
    assert main(["bench", str(TINY_PD), "--from-file", str(result), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("rackplan: error: result file ") and needle in captured.err
    assert not out.exists()


AIPERF_EXPORT = {
    "time_to_first_token": {"unit": "ms", "avg": 110.0, "p50": 100.0, "p90": 150.0,
                            "p99": 200.0, "min": 50.0, "max": 250.0, "std": 20.0, "count": 8},
    "inter_token_latency": {"unit": "ms", "avg": 11.0, "p50": 10.0, "p90": 12.0, "p99": 14.0},
    "request_latency": {"unit": "s", "avg": 0.3, "p50": 0.28, "p90": 0.35, "p99": 0.4},
    "request_count": {"unit": "requests", "avg": 8.0},
    "error_request_count": {"unit": "requests", "avg": 0.0},
    "benchmark_duration": {"unit": "sec", "avg": 2.0},
    "request_throughput": {"unit": "requests/sec", "avg": 4.0},
    "output_token_throughput": {"unit": "tokens/sec", "avg": 64.0},
    "input_config": {"endpoint": {"model_names": ["m"]}},
}
"""aiperf's profile_export_aiperf.json as its schema documents it: a stats block per metric."""


def test_aiperf_s_summary_reads_as_vllm_s_result_keys():
    got = aiperf_result(AIPERF_EXPORT)
    assert (got["p50_ttft_ms"], got["p90_ttft_ms"], got["p99_ttft_ms"]) == (100.0, 150.0, 200.0)
    assert got["mean_ttft_ms"] == 110.0 and got["p90_tpot_ms"] == 12.0
    assert got["p90_e2el_ms"] == pytest.approx(350.0)  # seconds become ms
    assert (got["completed"], got["failed"], got["duration"]) == (8, 0, 2.0)
    assert got["output_throughput"] == 64.0 and "total_token_throughput" not in got
    assert not any(key.endswith("_itl_ms") for key in got)  # aiperf has no per-gap ITL


def test_an_aiperf_export_is_compared_like_a_vllm_result(tmp_path):
    path = tmp_path / "profile_export_aiperf.json"
    path.write_text(json.dumps(AIPERF_EXPORT))
    assert read_result(path) == aiperf_result(AIPERF_EXPORT)
    vllm = write_result(tmp_path / "bench.json")
    from_aiperf = compare_file(TINY_PD, path, tmp_path / "a")
    from_vllm = compare_file(TINY_PD, vllm, tmp_path / "v")
    for metric in ("ttft_ms.p50", "ttft_ms.p90", "ttft_ms.p99", "tpot_ms.p90",
                   "output_throughput_tok_s"):
        assert from_aiperf.row(metric) == from_vllm.row(metric)
    assert from_aiperf.row("itl_ms.p90").measured is None
    assert from_aiperf.measured["completed"] == 8
