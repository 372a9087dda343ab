"""benchmarks/compare_tables.py joins CPU-made tables with the shipped H200 ones on shape."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.kernels.conftest import TORCH_MISSING

pytest.importorskip("torch", reason=TORCH_MISSING)

from kernels import attention, gemm
from kernels.device import detect
from kernels.shapes import AttnShape, GemmShape
from kernels.timing import CpuTimer
from kernels.writer import write_calibration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cpu_tables(tmp_path_factory):
    """Measured on this CPU, on shapes the H200 table also holds, plus one it does not."""
    dev, timer = detect("cpu"), CpuTimer(warmup=1, repeats=3)
    gemms = gemm.run([GemmShape(m, 256, 256, "bf16", "t") for m in (1, 16)]
                     + [GemmShape(3, 250, 256, "bf16", "t")], dev, timer, lambda: True)
    attn = attention.run([AttnShape("decode", 1, 15, 8, 1, 64, "bf16")], dev, timer,
                         lambda: True)
    out = tmp_path_factory.mktemp("cmp") / "cpu"
    write_calibration(out, {"gemm": gemms, "attention_generation": attn}, {}, "vllm",
                      "measured")
    return out


def test_joins_on_shape_and_prints_ratios(cpu_tables, tmp_path):
    csv = tmp_path / "cmp.csv"
    r = subprocess.run([sys.executable, "benchmarks/compare_tables.py", str(cpu_tables),
                        "--hardware", "h200", "--csv", str(csv)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "== gemm: 3 of our rows, 2 with a same-dtype partner" in r.stdout
    assert "== attention_generation: 1 of our rows, 1 with a same-dtype partner" in r.stdout
    df = pd.read_csv(csv)
    g = df[df.table == "gemm"].set_index("m")
    assert g.loc[1, "aic_ms"] == pytest.approx(0.002898, rel=1e-3)  # the shipped H200 row
    assert g.loc[1, "ratio"] == pytest.approx(g.loc[1, "ours_ms"] / g.loc[1, "aic_ms"])
    assert pd.isna(g.loc[3, "aic_ms"])  # a shape H200 was not measured on stays unmatched
    a = df[df.table == "attention_generation"].iloc[0]
    assert a.aic_ms == pytest.approx(0.010208, rel=1e-3) and a.kv_cache_dtype == "bfloat16"


def test_hardware_without_tables_is_refused(cpu_tables):
    r = subprocess.run([sys.executable, "benchmarks/compare_tables.py", str(cpu_tables),
                        "--hardware", "cpu"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "ships no measured tables" in r.stderr
