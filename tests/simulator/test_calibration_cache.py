"""The disk cache of derived calibration values: prices bit-identical to reading the tables,
stale and corrupt files rebuilt, and a warm cache that reads no table."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from planner.stepcalc import step_report
from simulator.calibration import Grid, cache, tables
from simulator.specs.hardware import load_hardware

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
STEPS = [  # (deployment, role, batch per rank, context): MLA, DSv4 CSA/HCA, wide EP, prefill
    ("deepseek-v3-h200-pd.yaml", "decode", 64, 4096),
    ("deepseek-v3-h200-pd.yaml", "prefill", 2, 8192),
    ("deepseek-v3-h200-dep8.yaml", "decode", 1, 100),
    ("deepseek-v4-flash-gb300-pd.yaml", "decode", 16, 300_000),
    ("deepseek-v4-flash-gb300-pd.yaml", "prefill", 1, 16384),
    ("deepseek-v4-flash-gb300-dep-wide.yaml", "decode", 128, 2048),
]


def prices(monkeypatch: pytest.MonkeyPatch, folder: str | Path) -> list[str]:
    """Every step's full report (as exact JSON) priced by fresh calibrations."""
    monkeypatch.setenv(cache.CACHE_ENV, str(folder))
    monkeypatch.setattr(tables, "_LOADED", {})
    return [json.dumps(step_report(EXAMPLES / d, role, b, c)) for d, role, b, c in STEPS]


def no_table_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: Path) -> None:
        raise AssertionError(f"read {path} although the cache is warm")

    monkeypatch.setattr(tables, "_read_parquet", refuse)


def test_cached_prices_are_bit_identical_to_the_tables(tmp_path, monkeypatch):
    uncached = prices(monkeypatch, cache.OFF)
    assert not tmp_path.joinpath("cache").exists()
    cold = prices(monkeypatch, tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("*.npz"))) > 10
    no_table_reads(monkeypatch)
    warm = prices(monkeypatch, tmp_path / "cache")
    assert cold == uncached
    assert warm == uncached


def test_corrupt_or_truncated_files_are_rebuilt(tmp_path, monkeypatch):
    uncached = prices(monkeypatch, cache.OFF)
    prices(monkeypatch, tmp_path)
    files = sorted(tmp_path.glob("*.npz"))
    for i, f in enumerate(files):
        f.write_bytes(b"not a zip" if i % 2 else f.read_bytes()[:100])
    assert prices(monkeypatch, tmp_path) == uncached
    for f in files:  # rewritten whole
        with np.load(f, allow_pickle=False) as npz:
            assert "_sources" in npz.files
    no_table_reads(monkeypatch)
    assert prices(monkeypatch, tmp_path) == uncached


def synthetic_gemm(tmp_path: Path, latency: float) -> None:
    folder = tmp_path / "tables" / "synthetic" / "gemm" / "vllm" / "1.0"
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"m": [64, 128], "n": [4096, 4096], "k": [4096, 4096],
                  "gemm_dtype": ["fp8", "fp8"], "latency": [latency, 2 * latency]}
                 ).to_parquet(folder / "gemm_perf.parquet")


def test_a_changed_table_makes_its_cached_grid_stale(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "aic_system_dir", lambda system: tmp_path / "tables" / system)
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    hw = load_hardware("h200").model_copy(update={"system": "synthetic"})

    def price() -> float:
        return float(tables.Calibration(hw, "vllm").gemm(64, 4096, 4096, "fp8").ms[0])

    synthetic_gemm(tmp_path, 0.10)
    assert price() == 0.10
    (written,) = (tmp_path / "cache").glob("*.npz")
    synthetic_gemm(tmp_path, 0.30)  # same shape and size, new contents
    assert price() == 0.30
    assert list((tmp_path / "cache").glob("*.npz")) == [written]  # replaced in place
    assert not list((tmp_path / "cache").glob("*.tmp"))
    no_table_reads(monkeypatch)
    assert price() == 0.30


def test_the_cache_off_or_unwritable_changes_nothing(tmp_path, monkeypatch):
    uncached = prices(monkeypatch, cache.OFF)
    blocked = tmp_path / "a file"
    blocked.write_text("")
    assert prices(monkeypatch, blocked / "cache") == uncached  # cannot mkdir: no error
    monkeypatch.delenv(cache.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "rackplan" / "calibration"


def test_a_recipe_without_a_stable_description_is_built_every_time(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))

    class Opaque:
        __slots__ = ()

    built = []

    def build() -> dict[str, np.ndarray]:
        built.append(1)
        return {"x": np.arange(3.0)}

    for _ in range(2):
        got = cache.cached(("op", Opaque()), [], build)
        assert got["x"].tolist() == [0.0, 1.0, 2.0]
    assert len(built) == 2 and not list(tmp_path.iterdir())
    got = cache.cached(("op", 1), [], build)
    got = cache.cached(("op", 1), [], build)
    assert len(built) == 3 and len(list(tmp_path.glob("*.npz"))) == 1


def test_descriptions_follow_closed_over_values():
    def recipe(k: int):
        return lambda x: x * k

    assert cache.describe(recipe(2)) == cache.describe(recipe(2))
    assert cache.describe(recipe(2)) != cache.describe(recipe(3))
    assert cache.describe(np.array([1.0, 2.0])) != cache.describe(np.array([1.0, 2.5]))


def test_a_grid_comes_back_from_its_arrays_bit_for_bit():
    rng = np.random.default_rng(3)
    pts = rng.choice([1.0, 2.0, 8.0, 64.0], size=(40, 3))
    grid = Grid.build(pts, rng.uniform(0.1, 2, 40), rng.uniform(0.05, 1, 40))
    back = Grid.from_arrays(grid.to_arrays())
    q = rng.uniform(0.5, 100, size=(50, 3))  # outside and between cells: the tree fallback too
    for a, b in zip(grid.query(q, np.ones(50)), back.query(q, np.ones(50)), strict=True):
        assert a.tobytes() == b.tobytes()


def test_a_warm_step_imports_neither_pandas_nor_scipy_nor_networkx(tmp_path):
    code = ("import sys; from planner.cli import main; main(['step', sys.argv[1], '--role', "
            "'decode', '--batch', '8', '--context', '1024', '--json']); "
            "print(sorted(m for m in ('pandas', 'pyarrow', 'scipy', 'networkx', 'simpy') "
            "if m in sys.modules), file=sys.stderr)")
    env = {**os.environ, "RACKPLAN_CACHE_DIR": str(tmp_path)}
    argv = [sys.executable, "-c", code, str(EXAMPLES / "deepseek-v3-h200-pd.yaml")]
    first = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    second = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "pandas" in first.stderr  # the cold run read the tables
    assert second.stderr.strip().splitlines()[-1] == "[]"
    assert json.loads(second.stdout) == json.loads(first.stdout)
