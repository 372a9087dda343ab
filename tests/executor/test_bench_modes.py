"""`rackplan bench --mode decode_only|prefill_only` and `--sweep`: one role deployed alone
with the mode's connector, the bench traffic, and a benchmark per load beside the simulator's
prediction at that load. The engine is the fake (tests/executor/fake_vllm.py) here;
test_engine_bench_modes.py runs the same on vLLM's CPU build."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from executor.backends.local import free_base_port, render_local
from executor.bench import median_result
from executor.isolated import (
    DECODE_BENCH,
    MODES,
    rendering_alone,
    role_alone,
    with_context_room,
    workload_alone,
)
from executor.sweep import own_prompts, parse_loads
from simulator.specs.errors import SpecError
from simulator.specs.workload import Workload
from tests.executor.fake_vllm import BENCH_RESULT
from tests.executor.local_helpers import TINY_AGG, TINY_PD, engine_venv, plan_deployment

ROOT = Path(__file__).resolve().parents[2]


def test_decode_only_keeps_the_decode_role_with_decode_bench_connector():
    d = plan_deployment(TINY_PD)
    role, alone = role_alone(d, MODES["decode_only"])
    assert role == "decode" and list(alone.roles) == ["decode"]
    assert alone.single_role == "decode" and alone.gpus_used == d.decode.gpus  # type: ignore
    r = rendering_alone(render_local(d, "/m"), role, MODES["decode_only"])
    assert [p.instance for p in r.processes] == ["decode-0"]
    (p,) = r.processes
    assert p.value("--kv-transfer-config") == DECODE_BENCH
    assert not p.has("--no-enable-chunked-prefill")  # only ExampleConnector's handoff needs it
    assert r.router == {"port": render_local(d, "/m").router["port"],
                        "aggregated_urls": [f"http://127.0.0.1:{p.port}"],
                        "aggregated_policy": "least_requests"}


def test_prefill_only_drops_the_connector_and_an_aggregated_plan_benches_itself():
    d = plan_deployment(TINY_PD)
    r = rendering_alone(render_local(d, "/m"), "prefill", MODES["prefill_only"])
    assert [p.instance for p in r.processes] == ["prefill-0"]
    assert not r.processes[0].has("--kv-transfer-config")
    role, alone = role_alone(plan_deployment(TINY_AGG), MODES["prefill_only"])
    assert role == "aggregated" and list(alone.roles) == ["aggregated"]


def test_the_bench_traffic_is_a_closed_loop_at_the_context():
    w = workload_alone(Workload(), MODES["decode_only"], 1000, 4, None)
    assert (w.mode, w.context_tokens, w.requests, w.arrival.concurrency) == (  # type: ignore
        "decode_only", 1000, 16, 4)
    assert w.input_tokens.value == 1000  # type: ignore[union-attr]
    p = workload_alone(Workload(), MODES["prefill_only"], 300, 1, 5)
    assert (p.mode, p.requests, p.output_tokens.value) == ("prefill_only", 5, 1)  # type: ignore


def test_each_load_of_a_sweep_has_prompts_of_its_own():
    w = Workload(seed=3)
    assert own_prompts(w, 0) is w
    assert [own_prompts(w, i).seed for i in (1, 2)] == [4, 5]
    assert own_prompts(w, 2).model_dump() == {**w.model_dump(), "seed": 5}


def test_the_context_limit_makes_room_for_the_asked_context():
    r = render_local(plan_deployment(TINY_PD), "/m")
    wider = with_context_room(r, 1100)
    assert {p.value("--max-model-len") for p in wider.processes} == {1100}
    assert with_context_room(r, 10) == r


@pytest.mark.parametrize(("text", "needle"), [
    ("1,x", "'x' is not a number"), ("0,4", "'0' must be a positive, finite load"),
    ("4,4", "repeats a load"), ("nan", "positive, finite"),
    (",".join(str(i) for i in range(1, 18)), "at most 16")])
def test_bad_sweeps_are_named(text, needle):
    with pytest.raises(SpecError, match=needle):
        parse_loads(text)


def rackplan(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planner.cli", "bench", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "RACKPLAN_ENGINE_VENV": str(engine_venv(tmp_path))})


def test_a_decode_only_sweep_deploys_the_role_benches_each_load_and_tears_down(tmp_path):
    out = tmp_path / "bench"
    r = rackplan(tmp_path, str(TINY_PD), "--mode", "decode_only", "--context", "300",
                 "--sweep", "1,2", "--model-path", "/models/tiny-moe", "--out", str(out),
                 "--base-port", str(free_base_port(1)), "--plot", str(tmp_path / "s.png"))
    assert r.returncode == 0, r.stderr
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["mode"] == "decode_only" and sweep["loads"] == [1.0, 2.0]
    for curve in ("predicted", "measured"):
        assert [p["load"] for p in sweep[curve]] == [1.0, 2.0]
        assert all(p["tok_s_user_p50"] > 0 and p["throughput_tok_s_gpu"] > 0
                   for p in sweep[curve])
    measured = sweep["measured"][0]
    assert measured["tok_s_user_p50"] == pytest.approx(1000 / BENCH_RESULT["median_tpot_ms"])
    metrics = [row["metric"] for row in sweep["points"][0]["comparison"]]
    assert metrics == list(MODES["decode_only"].metrics)
    log = (out / "load-2" / "logs" / "bench.log").read_text()
    assert "--random-input-len 300" in log and "--max-concurrency 2" in log
    seeds = [re.search(r"--seed (\d+)", (out / f"load-{n}" / "logs" / "bench.log").read_text())
             for n in (1, 2)]
    assert [int(m[1]) for m in seeds if m] == [0, 1]  # each load sends prompts of its own
    serve_log = (out / "deploy" / "logs" / "decode-0-h0.log").read_text()
    assert "fake vllm serving /models/tiny-moe" in serve_log
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    assert "| load | tpot_ms.p50 |" in (out / "sweep.md").read_text()
    assert not (out / "deploy" / "logs" / "prefill-0-h0.log").exists()  # the role alone


def test_repeated_runs_of_a_load_send_prompts_of_their_own_and_compare_their_median(tmp_path):
    out = tmp_path / "bench"
    r = rackplan(tmp_path, str(TINY_PD), "--mode", "decode_only", "--context", "300",
                 "--concurrency", "2", "--repeats", "3", "--model-path", "/models/tiny-moe",
                 "--out", str(out), "--base-port", str(free_base_port(1)))
    assert r.returncode == 0, r.stderr
    seeds = [re.search(r"--seed (\d+)", (out / "load-2" / f"run-{k}" / "logs" / "bench.log")
                       .read_text()) for k in (1, 2, 3)]
    assert [int(m[1]) for m in seeds if m] == [0, 1000, 2000]
    report = json.loads((out / "load-2" / "report.json").read_text())
    assert report["measured"]["runs"] == 3
    tpot = next(row for row in report["comparison"] if row["metric"] == "tpot_ms.p50")
    assert tpot["measured"] == pytest.approx(BENCH_RESULT["median_tpot_ms"])


def test_each_repeated_run_writes_prompts_of_its_own(tmp_path, monkeypatch):
    """A run's prompt file is its own: the next run is sent its own seed and no file, so that
    `measure` writes it new prompts (a file sent again would be served from the cache)."""
    from dataclasses import replace

    from executor import sweep
    from simulator.specs.loading import load_workload

    sent = []

    def measure(settings, url, model, run_dir, exe, **_):
        sent.append(settings)
        return ["vllm", "bench"], dict(BENCH_RESULT), replace(
            settings, dataset_path=str(run_dir / "bench.prompts.jsonl"))

    monkeypatch.setattr(sweep, "measure", measure)
    traffic = load_workload({"arrival": {"kind": "closed", "concurrency": 2}, "requests": 8,
                             "input_tokens": {"kind": "fixed", "value": 64},
                             "output_tokens": {"kind": "fixed", "value": 8}})
    report = sweep._point(TINY_PD, tmp_path, 2, traffic, {}, "http://127.0.0.1:9", "m",
                          tmp_path / "vllm", 2, None, None, "serve", repeats=3)
    assert [(s.seed, s.dataset_path) for s in sent] == [(0, None), (1000, None), (2000, None)]
    assert report.settings is not None
    assert report.settings.dataset_path == str(tmp_path / "load-2" / "run-1" /
                                               "bench.prompts.jsonl")


def test_the_median_of_runs_takes_each_figure_the_runs_all_give():
    runs = [{"median_tpot_ms": t, "completed": n, "date": d, "itls": [[0.1]], "odd": o}
            for t, n, d, o in ((12.0, 8, "a", 1.0), (10.0, 8, "b", None), (30.0, 7, "c", 2.0))]
    got = median_result(runs)
    assert got["median_tpot_ms"] == 12.0 and got["completed"] == 8
    assert got["spread"]["median_tpot_ms"] == [10.0, 30.0]
    assert got["runs"] == 3 and got["date"] == "a"
    assert "itls" not in got and got["odd"] == 1.0 and "odd" not in got["spread"]


def test_a_single_isolated_bench_prints_its_comparison(tmp_path):
    out = tmp_path / "bench"
    r = rackplan(tmp_path, str(TINY_PD), "--mode", "prefill_only", "--context", "200",
                 "--concurrency", "2", "--model-path", "/models/tiny-moe", "--out", str(out),
                 "--base-port", str(free_base_port(1)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1].split() == ["metric", "predicted", "measured", "error"]
    assert [line.split()[0] for line in r.stdout.splitlines()[2:6]] == list(
        MODES["prefill_only"].metrics)
    assert json.loads((out / "load-2" / "report.json").read_text())["settings"][
        "output_len"] == 1


@pytest.mark.parametrize(("args", "needle"), [
    (["--mode", "decode_everything", "--context", "9"], "--mode 'decode_everything' is not"),
    (["--mode", "decode_only"], "needs --context TOKENS between 1 and"),
    (["--mode", "decode_only", "--context", "0"], "needs --context TOKENS between 1 and"),
    (["--mode", "decode_only", "--context", "9", "--url", "http://x:1"], "takes no --url"),
    (["--mode", "decode_only", "--context", "9", "--concurrency", "2", "--sweep", "1,2"],
     "not both"),
    (["--mode", "decode_only", "--context", "9", "--concurrency", "0"],
     "--concurrency 0 must be between 1 and"),
    (["--context", "9"], "--context goes with --mode"),
    (["--sweep", "1,2", "--from-file", "r.json"], "cannot go with --from-file"),
    (["--mode", "decode_only", "--context", "9", "--plot", "x.png"], "--plot draws a --sweep"),
    (["--sweep", "1,2", "--plot", "x.gif"], "must end in .png"),
    (["--num-prompts", "0"], "--num-prompts 0 must be between 1 and"),
    (["--repeats", "3"], "--repeats goes with --mode"),
    (["--sweep", "1,2", "--repeats", "0"], "--repeats 0 must be between 1 and 20"),
])
def test_bad_bench_options_are_one_line(tmp_path, args, needle):
    r = rackplan(tmp_path, str(TINY_PD), "--out", str(tmp_path / "b"), *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
