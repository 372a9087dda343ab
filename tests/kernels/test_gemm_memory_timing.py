"""GEMM and copy kernels against their references, and the timers' statistics."""

import time

import pytest

from tests.kernels.conftest import TORCH_MISSING

torch = pytest.importorskip("torch", reason=TORCH_MISSING)

from kernels import gemm, memory  # noqa: E402
from kernels.device import detect  # noqa: E402
from kernels.shapes import CopyShape, GemmShape  # noqa: E402
from kernels.timing import CpuTimer, summarize, timer_for  # noqa: E402


def test_gemm_and_copy_checks_pass_on_cpu():
    dev = detect("cpu")
    assert not dev.fp8 and dev.kind == "cpu" and dev.threads >= 1
    gemm.check(dev)
    memory.check(dev)


@pytest.fixture
def one_thread():
    """One intra-op thread: on a busy machine two threads wait on each other for whole
    scheduler slices, which would swamp a small GEMM's time."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_gemm_rows_carry_the_table_columns_and_scale_with_work(one_thread):
    shapes = [GemmShape(m, 1024, 1024, "bf16", "test") for m in (1, 2048)]
    rows = gemm.run(shapes, detect("cpu"), CpuTimer(warmup=1, repeats=5), lambda: True)
    assert [r["m"] for r in rows] == [1, 2048]
    assert all(r["gemm_dtype"] == "bfloat16" and r["latency"] > 0 for r in rows)
    assert rows[1]["latency"] > 5 * rows[0]["latency"]  # 2048x the FLOPs


def test_a_spent_budget_stops_the_sweep():
    shapes = [GemmShape(m, 64, 64, "bf16", "test") for m in (1, 2, 4)]
    rows = gemm.run(shapes, detect("cpu"), CpuTimer(warmup=0, repeats=3), lambda: False)
    assert len(rows) == 1


def test_copy_reports_bandwidth():
    (row,) = memory.run([CopyShape(1 << 20)], detect("cpu"), timer_for("cpu", True),
                        lambda: True)
    assert row["bandwidth_gb_s"] == pytest.approx(2 * (1 << 20) / row["latency"] / 1e6)


def test_summarize_gives_median_and_iqr_in_ms():
    t = summarize([0.001, 0.002, 0.003, 0.004, 0.1])
    assert t.median_ms == pytest.approx(3.0)
    assert t.iqr_ms == pytest.approx(2.0)
    assert t.samples == 5


def test_cpu_timer_measures_a_known_sleep():
    t = CpuTimer(warmup=1, repeats=5, min_repeats=3)(lambda: time.sleep(0.002))
    assert t.median_ms >= 2.0  # a sleeper wakes late on a busy machine (no bound), never early
    assert 3 <= t.samples <= 5
