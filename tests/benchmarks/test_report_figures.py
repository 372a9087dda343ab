"""benchmarks/report_figures.py's rack search: how many turns each lane is measured for, and the
bisection of the lanes (the simulations themselves take minutes; the benchmark runs them)."""

import subprocess
import sys

from tests.benchmarks.scripts import ROOT, load_script

figures = load_script("report_figures")


def test_each_rack_run_measures_the_turns_asked_and_the_bisection_keeps_the_speed(
        monkeypatch):
    asked = []

    def point(p):  # a user gets 196 tok/s up to 3,000 lanes, less beyond
        *_, lanes, turns = p
        asked.append((lanes, turns))
        speed = 250.0 if lanes <= 3000 else 150.0
        return {"lanes": lanes, "turns": turns, "tok_s_user": {"p90": speed}}

    said = []
    monkeypatch.setattr(figures, "_rack_point", point)
    monkeypatch.setattr(figures, "_say_run", lambda s, r: said.append(r["lanes"]))
    runs = figures._rack_layout((figures.V41, 20, 2, 16, "session_affinity", 7))
    assert said == [lanes for lanes, _ in asked]  # each run reported as it ends
    assert {t for _, t in asked} == {7}
    low, high, step = figures.RACK_LOADS
    assert asked[:2] == [(high, 7), (low, 7)]
    kept = max(r["lanes"] for r in runs if figures._fast_enough(r))
    assert 3000 - step < kept <= 3000


def test_a_rack_window_outside_its_range_is_refused_in_one_line():
    for bad in ("0", str(figures.MAX_RACK_TURNS + 1)):
        r = subprocess.run([sys.executable, "benchmarks/report_figures.py", "--rack-turns", bad],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stdout == ""
        assert f"--rack-turns={bad} must be between 1 and {figures.MAX_RACK_TURNS}" in r.stderr
