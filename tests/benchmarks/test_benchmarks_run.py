"""The benchmark scripts run (on a small size) and print their figures."""

import subprocess
import sys
from pathlib import Path

from simulator.calibration.tables import OP_FILES
from tests.benchmarks.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> str:
    r = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_simulate_speed_prints_wall_time_rate_memory_floor_and_series():
    out = run("benchmarks/simulate_speed.py", "--requests", "300", "--series",
              "--max-requests", "1000", "--series-gpus", "72")
    assert "wall time:" in out and "for 300 requests" in out
    assert "simulated tokens per wall-second" in out and "peak memory" in out
    assert "CPU time:" in out and "of simulation CPU for 300 requests" in out
    floor = next(line for line in out.splitlines() if line.startswith("rackplan "))
    assert "events/s vs bare SimPy" in floor and "(the floor):" in floor
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and "@" in line.split()[0]}
    assert rows["1k@72"][1:4] == ["1,000", "72", "1,000"]  # requests, GPUs, completed
    assert len(rows["1k@72"]) == 10  # steps, events, CPU s, us/req, RSS cal, peak RSS follow
    assert "skipped (--max-requests 1,000)" in " ".join(rows["1M@72"])
    assert "CPU ratio per 10x requests" in out and "target 1M requests" in out


def test_calibration_load_prints_every_table():
    out = run("benchmarks/calibration_load.py", "gb200")  # GB200 ships every table we read
    assert f"{len(OP_FILES)}/{len(OP_FILES)} tables" in out


def test_search_quality_prints_both_optima_and_the_gap():
    out = run("benchmarks/search_quality.py", "--tiny")
    assert "exhaustive optimum:" in out and "search best:" in out and "gap to the optimum" in out


def test_silicon_repeatability_prints_the_noise_floor():
    out = run("benchmarks/silicon_repeatability.py")
    assert "configurations with more than one distinct measurement:" in out
    assert "TTFT between repeats: MAPE" in out and "TPOT between repeats: MAPE" in out


def test_silicon_in_flight_finds_the_capped_run_first():
    out = run("benchmarks/silicon_in_flight.py", "--rows", "12")
    lines = out.splitlines()
    assert sum(line.split()[-1] == "True" for line in lines[1:-1]) == 9
    assert "9 in CAPPED_RUNS" in lines[-1]


def test_report_figures_prints_every_figure_with_its_command():
    import json

    got = json.loads(run("benchmarks/report_figures.py", "--json", "--no-rack"))
    assert got["models"] == ["deepseek-v4.1-flash", "deepseek-v4-flash"]
    rows = got["figures"]
    assert len(rows) == 13  # the rack line takes minutes
    for r in rows:
        for model in got["models"]:  # each figure priced for both, with its command
            p = r[model]
            assert p["command"] and p["predicted"] is not None and p["predicted"] > 0
            assert p["rel_error"] == (p["predicted"] - r["published"]) / r["published"]


def test_wide_ep_comm_prints_deepep_beside_rackplan():
    out = run("benchmarks/wide_ep_comm.py")
    kernels = [line.split()[0] for line in out.splitlines()[1:-1]]
    assert kernels.count("low_latency") == 12 and kernels.count("normal") == 8
    assert "mean absolute error" in out


def test_agentx_speed_prints_trees_requests_and_cpu_time():
    out = run("benchmarks/agentx_speed.py", "--trees", "2", "--lanes", "2")
    assert "2 trees," in out and "s CPU" in out and "target 1,000 trees in 10 s" in out
    single = run("benchmarks/agentx_speed.py", "--trees", "2", "--lanes", "2", "--single-steps")
    assert single.split("engine steps")[0] == out.split("engine steps")[0]  # the same steps


def test_capacity_question_prints_each_answer_and_its_cost():
    out = run("benchmarks/capacity_question.py", "--trials", "6", "--gpus", "16",
              "--no-screen")
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["kimi-16gpu", "kimi-target-1req_s"]
    for line in lines:
        assert " s wall, " in line and " s CPU, " in line and " simulated" in line
        assert ("tok/s/GPU" in line and "why:" in line) or "no plan; " in line


def test_dynamo_v41_stand_in_has_the_published_statistics_and_a_target_runs(tmp_path):
    import json

    from tests.benchmarks.scripts import load_script

    mod = load_script("dynamo_v41")
    path = tmp_path / "t.jsonl"
    mod.stand_in(path)
    st = mod.trace_stats(path)  # the recipes' trace: 3,541 rows, input median ~67,600, p99
    assert st["rows"] == 3541  # over 450,000, output median ~400, ~90 % designed reuse
    assert abs(st["input_median"] / 67_600 - 1) < 0.1 and st["input_p99"] > 450_000
    assert abs(st["output_median"] / 400 - 1) < 0.1 and 0.85 < st["reuse"] < 0.95
    again = tmp_path / "again.jsonl"
    mod.stand_in(again)
    assert again.read_bytes() == path.read_bytes()  # seeded
    got = json.loads(run("benchmarks/dynamo_v41.py", "--only", "guide-h200-agg", "--trace",
                         str(path), "--workers", "1", "--json"))
    (row,) = got["targets"]
    assert row["command"] == "benchmarks/dynamo_v41.py --only guide-h200-agg"
    assert row["predicted"]["gpus"] == 16 and set(row["published"]) <= set(row["predicted"])
    for k, v in row["published"].items():
        assert row["rel_error"][k] == (row["predicted"][k] - v) / v


def test_ttft_waves_prints_each_engines_first_wave_share():
    out = run("benchmarks/ttft_waves.py", "--sample", "1", "--workers", "1")
    assert "aggregated MoE rows at 128+ users, 3 covered of 3 sampled" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines()[2:] if line.strip()}
    assert sorted(lines) == ["sglang", "trtllm", "vllm"]
    for cells in lines.values():
        share = float(cells[4].rstrip("%"))
        assert 0 < share < 100  # the first wave carries part of the mean, never all of it


def test_grid_cells_counts_rows_and_points_by_cell(tmp_path, capsys, monkeypatch):
    import pickle

    from simulator.cost.step import Batch, Instance
    from simulator.specs.hardware import load_hardware
    from simulator.specs.model import load_model

    grid = load_script("grid_cells")
    # knots at 3 significant bits: 8, 10, 12, 14, 16, 20, 24, ...
    assert [grid.knot_below(v, 3) for v in (0.0, 9.0, 10.0, 15.9, 17.0, 100.0)] == [
        0.0, 8.0, 10.0, 14.0, 16.0, 96.0]
    inst = Instance(model=load_model("deepseek-v4.1-flash"), hardware=load_hardware("gb300"),
                    role="decode", ranks=2, expert_parallel=True, weights="fp4",
                    kv_cache="fp4", indexer_cache="fp4")
    # two decode rows 2 % apart share a cell at 3 bits; a prefill row is its own kind
    steps = [(inst, Batch.decode(2, 8, 100_000), "vllm", None),
             (inst, Batch.decode(2, 8, 102_000), "vllm", None),
             (inst, Batch.prefill(2, 4096, 1, 8192), "vllm", None)]
    path = tmp_path / "steps.pkl"
    path.write_bytes(pickle.dumps(steps))
    monkeypatch.setattr("sys.argv", ["grid_cells.py", "--record", str(path), "--bits", "3"])
    grid.main()
    out = capsys.readouterr().out
    assert "3 composed steps" in out
    assert "3 bits, step level, decode rows: 2 in 1 cells (2.00 a cell)" in out
    assert "3 bits, step level, prefill rows: 1 in 1 cells" in out
    assert "operation dsv41_indexer:" in out


def test_vllm_gb300_blog_prints_every_figure_with_its_error_and_command(tmp_path):
    import json

    import pytest
    import yaml

    from simulator.specs.deployment import Deployment
    from simulator.specs.workload import Workload

    blog = load_script("vllm_gb300_blog")
    assert blog.error(2.0, (2.0, 2.0)) == 0.0 and blog.error(1.0, (2.0, 2.0)) == -0.5
    assert blog.error(1.12, (1.10, 1.15)) == 0.0  # anywhere inside a published range
    assert blog.error(2.3, (1.5, 2.0)) == 2.3 / 2.0 - 1
    assert blog.error(1.2, (1.5, 2.0)) == pytest.approx(-0.2)
    got = json.loads(run("benchmarks/vllm_gb300_blog.py", "--json"))
    rows = got["figures"]
    assert len(rows) == len(blog.FIGURES) == 10
    for r in rows:
        assert r["command"].startswith("rackplan simulate ")
        assert r["predicted"] and all(v > 0 for v in r["predicted"])
        assert r["rel_error"] == [blog.error(v, tuple(r["published"])) for v in r["predicted"]]
    # the commands' files: every deployment and workload they name, as rackplan reads them
    run("benchmarks/vllm_gb300_blog.py", "--decks", str(tmp_path))
    named = {w for r in rows for w in r["command"].split() if w.endswith(".yaml")}
    for name in named - {"mixed-cN.yaml", "short-cN.yaml"}:
        text = (tmp_path / name).read_text()
        spec = Workload if "arrival" in text else Deployment
        spec.model_validate(yaml.safe_load(text))
    assert sorted(p.name for p in tmp_path.glob("mixed-c*.yaml")) == sorted(
        f"mixed-c{c}.yaml" for c in blog.MIXED_LOADS)
