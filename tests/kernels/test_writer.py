"""Tables written by kernels/ read back through the calibration layer, written atomically."""

import json

import pytest

from tests.kernels.conftest import TORCH_MISSING

torch = pytest.importorskip("torch", reason=TORCH_MISSING)

from kernels import gemm  # noqa: E402
from kernels.device import detect  # noqa: E402
from kernels.shapes import GemmShape  # noqa: E402
from kernels.timing import CpuTimer  # noqa: E402
from kernels.writer import MANIFEST, table_path, write_calibration  # noqa: E402
from simulator.calibration.tables import Calibration  # noqa: E402
from simulator.specs.errors import SpecError  # noqa: E402
from simulator.specs.hardware import load_hardware  # noqa: E402


@pytest.fixture(scope="module")
def gemm_rows():
    shapes = [GemmShape(m, 96, 64, "bf16", "test") for m in (1, 8, 64)]
    return gemm.run(shapes, detect("cpu"), CpuTimer(warmup=1, repeats=3), lambda: True)


def test_round_trip_through_the_calibration_layer(tmp_path, gemm_rows):
    out = tmp_path / "cal"
    files = write_calibration(out, {"gemm": gemm_rows}, {"model": "t"}, "vllm", "measured")
    assert files == {"gemm": "gemm/vllm/measured/gemm_perf.parquet"}
    assert json.loads((out / MANIFEST).read_text())["tables"] == files
    cal = Calibration(load_hardware("cpu"), "vllm", user_dir=out)
    for row in gemm_rows:
        got = cal.gemm(float(row["m"]), 96, 64, "bf16")
        assert got.source == "measured"
        assert got.table == "user/gemm/vllm/measured"
        assert got.ms[0] == pytest.approx(row["latency"])
    between = cal.gemm(20.0, 96, 64, "bf16")
    assert between.source == "interpolated" and between.table == "user/gemm/vllm/measured"
    # An sglang deployment reads the same tables (the engine folder falls back to vllm).
    assert Calibration(load_hardware("cpu"), "sglang", user_dir=out).gemm(
        1.0, 96, 64, "bf16").table == "user/gemm/vllm/measured"


def test_comm_tables_go_under_the_nccl_folder():
    assert table_path("nccl", "vllm", "measured").as_posix() == (
        "comm/nccl/measured/nccl_perf.parquet")
    assert table_path("attention_generation", "vllm", "v").as_posix() == (
        "attention/vllm/v/generation_attention_perf.parquet")


def test_a_second_write_replaces_the_first(tmp_path, gemm_rows):
    out = tmp_path / "cal"
    write_calibration(out, {"gemm": gemm_rows}, {"run": 1}, "vllm", "measured")
    write_calibration(out, {"gemm": gemm_rows[:1]}, {"run": 2}, "vllm", "measured")
    assert json.loads((out / MANIFEST).read_text())["run"] == 2
    cal = Calibration(load_hardware("cpu"), "vllm", user_dir=out)
    assert len(cal.frame("gemm")[0]) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["cal"]  # no temporary folders left


def test_a_failed_write_leaves_the_old_calibration(tmp_path, gemm_rows):
    out = tmp_path / "cal"
    write_calibration(out, {"gemm": gemm_rows}, {"run": 1}, "vllm", "measured")
    bad = [{**gemm_rows[0], "latency": object()}]  # not serialisable
    with pytest.raises(Exception):  # noqa: B017 - pyarrow's own error type
        write_calibration(out, {"gemm": bad}, {"run": 2}, "vllm", "measured")
    assert json.loads((out / MANIFEST).read_text())["run"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["cal"]


def test_a_folder_that_is_not_a_calibration_is_refused(tmp_path, gemm_rows):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SpecError, match=r"non-empty folder without manifest\.json"):
        write_calibration(tmp_path, {"gemm": gemm_rows}, {}, "vllm", "measured")
    assert (tmp_path / "notes.txt").read_text() == "mine"
