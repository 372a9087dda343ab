"""`rackplan calibrate --from-run RUN_DIR --out DIR`: the serving latencies fitted from a bench
run's report, written where `rackplan simulate --calibration DIR` reads them back, so that the
simulation of the run's own traffic gives back what was measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from tests.executor.fake_vllm import BENCH_RESULT
from tests.executor.local_helpers import TINY_AGG, TINY_PD


def recorded_run(tmp_path: Path, plan: Path, name: str, **result: float) -> Path:
    """A bench run folder as `rackplan bench --from-file` records one."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({**BENCH_RESULT, **result}))
    run = tmp_path / name
    assert main(["bench", str(plan), "--from-file", str(path), "--out", str(run)]) == 0
    return run


def simulated(plan: Path, calibration: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    capsys.readouterr()
    assert main(["simulate", str(plan), "--calibration", str(calibration), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_fit_gives_back_the_measured_medians_and_then_the_handoff(tmp_path, capsys):
    cal = tmp_path / "cal"
    agg = recorded_run(tmp_path, TINY_AGG, "agg", median_tpot_ms=9.0, p50_tpot_ms=9.0,
                       median_ttft_ms=120.0, p50_ttft_ms=120.0)
    capsys.readouterr()
    assert main(["calibrate", "--from-run", str(agg), "--out", str(cal), "--json"]) == 0
    fitted = json.loads(capsys.readouterr().out)
    assert fitted["step_overhead_ms"] > 0 and fitted["api_overhead_ms"] > 0
    entry = json.loads((cal / "serving_overhead.json").read_text())["hardware"]["cpu"]["vllm"]
    assert entry["step_overhead_ms"] == pytest.approx(fitted["step_overhead_ms"], abs=1e-4)
    got = simulated(TINY_AGG, cal, capsys)
    assert got["tpot_ms"]["p50"] == pytest.approx(9.0, rel=0.02)
    assert got["ttft_ms"]["p50"] == pytest.approx(120.0, rel=0.02)

    # a P/D run fits its own (here slower) steps, keeps the aggregated API overhead, and
    # leaves the aggregated plan's prediction as it was
    pd = recorded_run(tmp_path, TINY_PD, "pd", median_tpot_ms=12.0, p50_tpot_ms=12.0,
                      median_ttft_ms=200.0, p50_ttft_ms=200.0)
    capsys.readouterr()
    assert main(["calibrate", "--from-run", str(pd), "--out", str(cal), "--json"]) == 0
    fitted_pd = json.loads(capsys.readouterr().out)
    assert fitted_pd["api_from"] == "the folder's aggregated fit"
    assert fitted_pd["api_overhead_ms"] == pytest.approx(fitted["api_overhead_ms"])
    assert fitted_pd["handoff_ms"] > 0
    got_pd = simulated(TINY_PD, cal, capsys)
    assert got_pd["ttft_ms"]["p50"] == pytest.approx(200.0, rel=0.02)
    assert got_pd["tpot_ms"]["p50"] == pytest.approx(12.0, rel=0.02)
    assert simulated(TINY_AGG, cal, capsys)["tpot_ms"]["p50"] == pytest.approx(9.0, rel=0.02)


def plan_at(tmp_path: Path, plan: Path, concurrency: int) -> Path:
    """A copy of `plan` whose closed loop has `concurrency` users."""
    text = plan.read_text().replace("arrival: {kind: closed, concurrency: 4}",
                                    f"arrival: {{kind: closed, concurrency: {concurrency}}}")
    assert f"concurrency: {concurrency}}}" in text
    path = tmp_path / f"{plan.stem}-c{concurrency}.yaml"
    path.write_text(text)
    return path


def test_two_loads_fit_a_step_cost_per_running_request(tmp_path, capsys):
    """TPOT that grows with the batch faster than the kernels do (an API server sharing the
    engine's core) is fitted as fixed + per request, and each load's TPOT comes back."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    tpots = {1: 6.0, 8: 13.0}
    plans = {c: plan_at(tmp_path, TINY_AGG, c) for c in tpots}
    for c, tpot in tpots.items():
        run = recorded_run(tmp_path, plans[c], f"c{c}", median_tpot_ms=tpot, p50_tpot_ms=tpot,
                           median_ttft_ms=40.0, p50_ttft_ms=40.0)
        run.rename(sweep / f"load-{c}")
    cal = tmp_path / "cal"
    capsys.readouterr()
    assert main(["calibrate", "--from-run", str(sweep), "--out", str(cal), "--json"]) == 0
    fitted = json.loads(capsys.readouterr().out)
    assert fitted["concurrency"] == 1 and fitted["second_concurrency"] == 8
    assert fitted["step_overhead_per_seq_ms"] > 0.3
    for c, tpot in tpots.items():
        assert simulated(plans[c], cal, capsys)["tpot_ms"]["p50"] == pytest.approx(tpot, rel=0.05)


@pytest.mark.parametrize(("extra", "needle"), [
    ([], "--from-run needs --out DIR"),
    (["--out", "CAL", "--quick"], "it takes no --quick"),
    (["--out", "CAL", "--device", "cpu"], "it takes no --device"),
])
def test_bad_from_run_options_are_one_line(tmp_path, capsys, extra, needle):
    args = [a.replace("CAL", str(tmp_path / "cal")) for a in extra]
    assert main(["calibrate", "--from-run", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err


def test_a_folder_without_a_bench_report_is_named(tmp_path, capsys):
    assert main(["calibrate", "--from-run", str(tmp_path), "--out", str(tmp_path / "c")]) == 2
    assert f"--from-run {str(tmp_path)!r} holds no report.json" in capsys.readouterr().err
