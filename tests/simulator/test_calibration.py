"""The calibration layer: measured points exact, interpolation bounded, provenance honest."""

import numpy as np
import pandas as pd
import pytest

from simulator.calibration import Grid, load_calibration
from simulator.calibration.tables import DSV3_MLA, aic_system_dir
from simulator.specs.errors import SpecError
from simulator.specs.hardware import load_hardware


@pytest.fixture(scope="module")
def h200():
    return load_calibration(load_hardware("h200"), "vllm")


@pytest.fixture(scope="module")
def gemm_rows():
    path = aic_system_dir("h200_sxm") / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet"
    df = pd.read_parquet(path)
    return df[df.gemm_dtype == "bfloat16"]


def test_load_is_shared_per_hardware_and_engine():
    hw = load_hardware("h200")
    assert load_calibration(hw, "vllm") is load_calibration(hw, "vllm")
    assert load_calibration(hw, "vllm") is not load_calibration(hw, "sglang")


def test_unknown_engine_is_refused():
    with pytest.raises(SpecError, match="engine='tgi'"):
        load_calibration(load_hardware("h200"), "tgi")


def test_measured_gemm_point_comes_back_exactly(h200, gemm_rows):
    row = gemm_rows[(gemm_rows.n == 7168) & (gemm_rows.k == 2048)].iloc[10]
    got = h200.gemm(float(row.m), 7168, 2048, "bf16")
    assert got.ms[0] == row.latency
    assert got.source == "measured"
    assert got.table == "h200_sxm/gemm/vllm/0.24.0"


def test_interpolated_gemm_lies_between_its_neighbours(h200, gemm_rows):
    rows = gemm_rows[(gemm_rows.n == 7168) & (gemm_rows.k == 2048)].sort_values("m")
    lo, hi = rows[rows.m == 256].latency.min(), rows[rows.m == 512].latency.min()
    got = h200.gemm(384.0, 7168, 2048, "bf16")
    assert got.source == "interpolated"
    assert min(lo, hi) <= got.ms[0] <= max(lo, hi)


def test_outside_the_measured_range_is_extrapolated(h200, gemm_rows):
    beyond = float(gemm_rows.m.max()) * 4
    got = h200.gemm(beyond, 7168, 2048, "bf16")
    assert got.source == "extrapolated"
    inside = h200.gemm(float(gemm_rows.m.max()), 7168, 2048, "bf16")
    assert got.ms[0] > inside.ms[0]


def test_no_table_means_roofline():
    cal = load_calibration(load_hardware("cpu"), "vllm")
    got = cal.gemm(64.0, 1024, 1024, "bf16")
    assert got.source == "roofline"
    assert got.table == "roofline"
    assert np.isfinite(got.ms).all() and (got.ms > 0).all()


def test_moe_is_measured_for_deepseek_shape_and_grows_with_tokens(h200):
    got = h200.moe(np.array([256.0, 1024.0, 4096.0]), 7168, 2048, 8, 256, 8, "fp8")
    assert got.source in ("measured", "interpolated")
    assert np.all(np.diff(got.ms) > 0)


def _moe_rows(system: str, dtype: str) -> pd.DataFrame:
    """The vLLM MoE table's balanced rows of Kimi-K2.5's shape (7168, 2048, top 8 of 384) at
    TP8 in `dtype`."""
    df = pd.read_parquet(aic_system_dir(system) / "moe" / "vllm" / "0.24.0" / "moe_perf.parquet")
    return df[(df.moe_dtype == dtype) & (df.hidden_size == 7168) & (df.inter_size == 2048)
              & (df.num_experts == 384) & (df.topk == 8) & (df.moe_tp_size == 8)
              & (df.moe_ep_size == 1) & (df.distribution == "balanced")]


def test_four_bit_experts_on_hopper_take_the_weight_only_int4_measurement_of_their_shape(h200):
    # Hopper runs 4-bit experts weight-only; only int4_wo measured Kimi's shape there
    rows = _moe_rows("h200_sxm", "int4_wo")
    want = rows[rows.num_tokens == 64].latency.min()
    got = h200.moe(64.0, 7168, 2048, 8, 384, 1, "fp4", tp=8)
    assert got.source == "measured" and got.ms[0] == want
    # where fp4 is native, 4-bit experts are its fp4 kernels, never the weight-only rows
    b200 = load_calibration(load_hardware("b200"), "vllm")
    native = _moe_rows("b200_sxm", "nvfp4")
    got = b200.moe(64.0, 7168, 2048, 8, 384, 1, "fp4", tp=8)
    assert got.source == "measured"
    assert got.ms[0] == native[native.num_tokens == 64].latency.min()


def test_int4_weights_take_the_int4_rows_everywhere_and_bf16_for_their_dense_layers():
    # Kimi-K2.5's INT4 checkpoint on Blackwell: its experts as int4_wo measured them, not nvfp4
    b200 = load_calibration(load_hardware("b200"), "vllm")
    rows = _moe_rows("b200_sxm", "int4_wo")
    got = b200.moe(64.0, 7168, 2048, 8, 384, 1, "int4", tp=8)
    assert got.source == "measured"
    assert got.ms[0] == rows[rows.num_tokens == 64].latency.min()
    assert got.ms[0] > b200.moe(64.0, 7168, 2048, 8, 384, 1, "fp4", tp=8).ms[0]
    # its dense layers are bf16, computed at bf16's rate
    assert b200.gemm(256.0, 7168, 2048, "int4").ms[0] == b200.gemm(256.0, 7168, 2048, "bf16").ms[0]
    hw = load_hardware("b200")
    assert hw.peak_flops("int4") == hw.peak_flops("bf16")


def test_mla_decode_module_grows_with_context(h200):
    short = h200.mla_generation(128.0, 1024.0, 128, DSV3_MLA, "fp8", "fp8")
    long = h200.mla_generation(128.0, 16384.0, 128, DSV3_MLA, "fp8", "fp8")
    assert short.source == "measured"
    assert long.ms[0] > short.ms[0]


def test_all_to_all_table_is_in_ms(h200):
    got = h200.all_to_all(128.0, 7168, 8, 256, 8, "dispatch", True, 450.0)
    assert 0.001 < got.ms[0] < 5.0


def test_grid_is_exact_on_nodes_and_log_linear_between():
    m = np.array([1.0, 4.0, 16.0])
    lat = np.array([1.0, 2.0, 8.0])
    grid = Grid.build(m[:, None], lat, np.ones(3))
    ms, codes = grid.query(np.array([[4.0], [2.0], [64.0]]), np.ones(3))
    assert ms[0] == 2.0 and codes[0] == 0
    assert ms[1] == pytest.approx(np.sqrt(2.0)) and codes[1] == 1  # geometric mean of 1 and 2
    assert ms[2] == pytest.approx(8.0) and codes[2] == 2  # nearest efficiency, same roofline


def test_grid_keeps_the_fastest_kernel_per_point():
    pts = np.array([[8.0], [8.0], [16.0]])
    grid = Grid.build(pts, np.array([3.0, 2.0, 5.0]), np.ones(3))
    ms, _ = grid.query(np.array([[8.0]]), np.ones(1))
    assert ms[0] == 2.0


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("hw", ["h100", "h200", "b200", "b300", "gb200", "gb300"])
def test_every_operation_prices_on_every_system_and_engine(hw, engine):
    cal = load_calibration(load_hardware(hw), engine)
    prices = [
        cal.gemm(np.array([1.0, 300.0]), 7168, 2048, "fp8"),
        cal.moe(np.array([64.0, 5000.0]), 7168, 2048, 8, 256, 16, "fp8"),
        cal.moe(np.array([64.0]), 4096, 1536, 8, 128, 1, "bf16", tp=4),
        cal.attention_context(2.0, 3000.0, 16, 1, 128, "fp8"),
        cal.attention_generation(64.0, 3000.0, 16, 1, 128, "bf16", window=128),
        cal.mla_context(1.0, 3000.0, 128, DSV3_MLA, "fp8", "fp8"),
        cal.mla_generation(64.0, 3000.0, 64, DSV3_MLA, "fp8", "bf16"),
        cal.all_to_all(100.0, 7168, 8, 256, 32, "combine", False, 100.0),
        cal.allreduce(1e6, 4, 450.0),
    ]
    for p in prices:
        assert np.all(np.isfinite(p.ms)) and np.all(p.ms > 0), p
        assert p.source in ("measured", "interpolated", "extrapolated", "roofline")


def test_a_shape_the_newest_table_lacks_is_priced_from_an_older_version_that_measured_it():
    # TensorRT-LLM's newest H200 MoE table has no gpt-oss (MXFP4, 128 experts, top-4) rows;
    # its 1.3.0rc20 table measured that kernel, which beats vLLM's table and any transfer.
    trt = load_calibration(load_hardware("h200"), "trtllm")
    df, label = trt.frame("moe")
    assert "/trtllm/" in label
    assert not ((df.hidden_size == 2880) & (df.num_experts == 128)).any()
    p = trt.moe(256, 2880, 2880, 4, 128, 1, "fp4")
    assert "/trtllm/" in p.table and p.table != label
    assert p.source in ("measured", "interpolated")
    # A shape the engine did measure keeps its own table.
    own = trt.moe(256, 2048, 5120, 22, 512, 8, "fp8")
    assert "/trtllm/" in own.table and own.source in ("measured", "interpolated")


def test_wide_ep_all_to_all_comes_from_the_multi_node_measurement():
    from simulator.specs.topology import all_to_all_rate
    hw = load_hardware("h200")
    cal = load_calibration(hw, "vllm")
    path = aic_system_dir("h200_sxm") / "comm/sglang/0.5.6.post2/wideep_deepep_ll_perf.parquet"
    df = pd.read_parquet(path)
    row = df[(df.node_num == 8) & (df.num_token == 128) & (df.hidden_size == 7168)
             & (df.num_experts == 256)].iloc[0]
    rate = float(all_to_all_rate(64, 8, hw.scaleup_gb_s, hw.nic_gb_s))
    got = cal.all_to_all(128, 7168, 8, 256, 64, "dispatch", True, rate)
    assert got.source == "measured" and "wideep_deepep_ll" in got.table
    assert got.ms[0] == pytest.approx(row.dispatch_avg_t_us * 1e-3)
    # inside one node the engine's own table still prices it
    own = cal.all_to_all(128, 7168, 8, 256, 8, "dispatch", True, hw.scaleup_gb_s)
    assert "comm/vllm" in own.table


def test_sglang_all_to_all_comes_from_its_own_deepep_measurement_at_any_ep_size():
    """SGLang's collector measured DeepEP on GB200 (one 4-GPU host: EP4): an SGLang instance's
    exchange comes from that table, a measured point exactly, not from vLLM's harness (which
    times the same kernels at 62-110 us); vLLM keeps its own."""
    hw = load_hardware("gb200")
    df = pd.read_parquet(aic_system_dir("gb200")
                         / "comm/sglang/0.5.12/wideep_deepep_ll_perf.parquet")
    row = df[(df.node_num == 1) & (df.num_token == 4) & (df.hidden_size == 7168)
             & (df.num_experts == 256) & (df.num_topk == 8)].iloc[0]
    for phase in ("dispatch", "combine"):
        got = load_calibration(hw, "sglang").all_to_all(4, 7168, 8, 256, 4, phase, True,
                                                        hw.scaleup_gb_s)
        assert got.source == "measured" and "wideep_deepep_ll" in got.table
        assert got.ms[0] == pytest.approx(row[f"{phase}_avg_t_us"] * 1e-3)
        own = load_calibration(hw, "vllm").all_to_all(4, 7168, 8, 256, 4, phase, True,
                                                      hw.scaleup_gb_s)
        assert own.table == "gb200/comm/vllm/0.24.0" and own.ms[0] > 3 * got.ms[0]


def test_trtllm_on_gb200_exchanges_over_its_own_nvlink_all_to_all():
    """GB200 ships TensorRT-LLM's NVLink all-to-all measured at EP 2-64: a TensorRT-LLM
    instance's dispatch is its metadata exchange plus the payload's (fp8, as the cost model
    sends it), its combine the bf16 combine, measured points exactly; vLLM keeps its own."""
    hw = load_hardware("gb200")
    df = pd.read_parquet(aic_system_dir("gb200")
                         / "comm/trtllm/1.3.0rc10/trtllm_alltoall_perf.parquet")

    def ms(op: str, dtype: str) -> float:
        rows = df[(df.op_name == op) & (df.moe_dtype == dtype) & (df.num_tokens == 64)
                  & (df.moe_ep_size == 32) & (df.kernel_source == "NVLinkTwoSided")]
        return float(rows.latency.min())

    trt = load_calibration(hw, "trtllm")
    dispatch = ms("alltoall_prepare", "fp8") + ms("alltoall_dispatch", "fp8")
    for phase, want in (("dispatch", dispatch), ("combine", ms("alltoall_combine", "bfloat16"))):
        got = trt.all_to_all(64, 7168, 8, 256, 32, phase, True, hw.scaleup_gb_s)
        assert got.table == "gb200/comm/trtllm/1.3.0rc10" and got.source == "measured"
        assert got.ms[0] == pytest.approx(want)
        other = load_calibration(hw, "vllm").all_to_all(64, 7168, 8, 256, 32, phase, True,
                                                        hw.scaleup_gb_s)
        assert "trtllm" not in other.table
    # GB300 shares GB200's NVLink fabric and ships no such table: GB200's prices it, flagged
    gb300 = load_calibration(load_hardware("gb300"), "trtllm").all_to_all(
        64, 7168, 8, 256, 32, "dispatch", True, hw.scaleup_gb_s)
    assert gb300.table == "gb200/comm/trtllm/1.3.0rc10" and gb300.source == "extrapolated"
    assert gb300.ms[0] == pytest.approx(dispatch)  # the same fabric's roofline
    # a system without the table or a sibling's keeps the DeepEP tables
    b200 = load_calibration(load_hardware("b200"), "trtllm")
    assert "comm/trtllm/1.3.0rc11" in b200.all_to_all(64, 7168, 8, 256, 8, "dispatch", True,
                                                      900.0).table


def test_trtllm_all_to_all_comes_from_its_own_measured_kernels():
    """TensorRT-LLM's collector names its DeepEP kernels trtllm_deepep_{ht,ll} and measures
    several dtypes: its own table prices a TensorRT-LLM instance's exchange (the phase's dtype,
    else bf16), a measured point exactly; vLLM keeps its own."""
    hw = load_hardware("b200")
    path = aic_system_dir("b200_sxm") / "comm/trtllm/1.3.0rc11/moe_a2a_perf.parquet"
    df = pd.read_parquet(path)

    def measured_ms(tokens: int, backend: str, phase: str, dtype: str) -> float:
        rows = df[(df.hidden_size == 7168) & (df.topk == 8) & (df.num_experts == 256)
                  & (df.num_tokens == tokens) & (df.comm_backend == backend)
                  & (df.phase == phase) & (df.comm_dtype == dtype)]
        return float(rows.latency.min()) * 1e-3

    rate = hw.scaleup_gb_s
    for phase in ("dispatch", "combine"):  # normal kernels: bf16 (no fp8 dispatch measured)
        got = load_calibration(hw, "trtllm").all_to_all(8192, 7168, 8, 256, 8, phase, False,
                                                        rate)
        assert got.table == "b200_sxm/comm/trtllm/1.3.0rc11" and got.source == "measured"
        assert got.ms[0] == pytest.approx(measured_ms(8192, "trtllm_deepep_ht", phase,
                                                      "bfloat16"))
    got = load_calibration(hw, "trtllm").all_to_all(128, 7168, 8, 256, 8, "dispatch", True,
                                                    rate)
    assert got.ms[0] == pytest.approx(measured_ms(128, "trtllm_deepep_ll", "dispatch", "fp8"))
    assert "comm/vllm" in load_calibration(hw, "vllm").all_to_all(
        8192, 7168, 8, 256, 8, "dispatch", False, rate).table


def test_unsound_fp8_block_gemm_rows_give_way_to_the_same_kernel_measured_by_another_engine():
    """vLLM 0.24.0's block-scaled fp8 GEMM rows time a fixed cost of its harness (>= 0.24 ms at
    any shape): they are dropped, and SGLang's DeepGEMM rows on the same system stand in. The
    fastest kernel per cell still wins, so a cell where vLLM's own per-tensor fp8 kernel is
    faster keeps it."""
    cal = load_calibration(load_hardware("gb300"), "vllm")
    df, label = cal.frame("gemm")
    assert label == "gb300/gemm/vllm/0.24.0"
    block = df[df.gemm_dtype == "fp8_block"]
    assert len(block) and (block._measured_by == "gb300/gemm/sglang/0.5.14").all()
    assert not block.kernel_source.str.startswith(("DeepGemmFp8", "CutlassFp8Block")).any()

    def measured(path: str, dtype: str, m: int, n: int = 1024, k: int = 4096) -> float:
        t = pd.read_parquet(aic_system_dir("gb300") / "gemm" / path / "gemm_perf.parquet")
        return float(t[(t.gemm_dtype == dtype) & (t.m == m) & (t.n == n) & (t.k == k)]
                     .latency.min())

    got = cal.gemm(8192, 1024, 4096, "fp8")
    assert got.source == "measured" and "gb300/gemm/sglang/0.5.14" in got.table
    deepgemm = measured("sglang/0.5.14", "fp8_block", 8192)
    assert got.ms[0] == pytest.approx(deepgemm)
    assert deepgemm < measured("vllm/0.24.0", "fp8", 8192) / 2  # vLLM's per-tensor kernel
    # bf16 grids keep the engine's own label and rows
    assert cal.gemm(8192, 1024, 4096, "bf16").table == "gb300/gemm/vllm/0.24.0"


def test_vllm_legacy_mla_module_rows_give_way_to_tensorrt_llm_s_except_where_re_collected():
    """vLLM 0.24.0's MLA module rows time RMSNorm's native chain (twice TensorRT-LLM's module
    at small batches) except on B200, whose table was re-collected with the fused ops."""
    def row(system: str, engine: str) -> float:
        t = pd.read_parquet(aic_system_dir(system) / "mla" / engine
                            / "mla_generation_module_perf.parquet")
        t = t[(t.num_heads == 16) & (t.kv_cache_dtype == "fp8") & (t.gemm_type == "fp8_block")
              & (t.batch_size == 4) & (t.step == 1024)]
        return float(t.latency.min())

    for engine in ("vllm", "sglang"):  # SGLang ships no module table: vLLM's stands for it
        got = load_calibration(load_hardware("h200"), engine).mla_generation(
            4, 1024, 16, DSV3_MLA, "fp8", "fp8")
        assert got.table == "h200_sxm/mla/vllm/0.24.0 + h200_sxm/mla/trtllm/1.3.0rc20"
        assert got.ms[0] == pytest.approx(row("h200_sxm", "trtllm/1.3.0rc20"))
        assert got.ms[0] < row("h200_sxm", "vllm/0.24.0") / 2
    b200 = load_calibration(load_hardware("b200"), "vllm").mla_generation(
        4, 1024, 16, DSV3_MLA, "fp8", "fp8")
    assert b200.table == "b200_sxm/mla/vllm/0.24.0"
    assert b200.ms[0] == pytest.approx(row("b200_sxm", "vllm/0.24.0"))


def test_tensorrt_llm_block_fp8_experts_take_the_faster_of_deepgemm_and_trtllm_gen():
    """TensorRT-LLM's collector timed only DeepGEMM for block-scaled fp8 experts on Blackwell,
    while its recipes run its trtllm-gen kernels (moe backend TRTLLM) where they are faster:
    SGLang's measurement of those kernels joins the table and each point takes the faster."""
    cal = load_calibration(load_hardware("b200"), "trtllm")

    def measured(path: str, kernel: str, tokens: int, tp: int, ep: int) -> float:
        t = pd.read_parquet(aic_system_dir("b200_sxm") / "moe" / path / "moe_perf.parquet")
        t = t[(t.moe_dtype == "fp8_block") & (t.hidden_size == 7168) & (t.inter_size == 2048)
              & (t.num_experts == 256) & (t.topk == 8) & (t.distribution == "balanced")
              & (t.num_tokens == tokens) & (t.moe_tp_size == tp) & (t.moe_ep_size == ep)]
        return float(t[t.kernel_source.str.contains(kernel)].latency.min())

    small = cal.moe(4, 7168, 2048, 8, 256, 1, "fp8", tp=8)
    gen = measured("sglang/0.5.14", "flashinfer_trtllm", 4, 8, 1)
    assert gen < measured("trtllm/1.3.0rc20", "deepgemm", 4, 8, 1) / 2
    assert small.source == "measured" and small.ms[0] == pytest.approx(gen)
    assert small.table == "b200_sxm/moe/trtllm/1.3.0rc20 + b200_sxm/moe/sglang/0.5.14"
    large = cal.moe(8192, 7168, 2048, 8, 256, 8, "fp8")
    deepgemm = measured("trtllm/1.3.0rc20", "deepgemm", 8192, 1, 8)
    assert deepgemm < measured("sglang/0.5.14", "flashinfer_trtllm", 8192, 1, 8)
    assert large.ms[0] == pytest.approx(deepgemm)
    # Hopper has no trtllm-gen kernels: its own table alone
    hopper = load_calibration(load_hardware("h200"), "trtllm").moe(4, 7168, 2048, 8, 256, 1,
                                                                     "fp8", tp=8)
    assert "sglang" not in hopper.table


def test_vllm_gpt_oss_experts_take_flashinfer_s_mxfp8_kernel_where_vllm_did_not_time_it():
    """vLLM's collector timed FlashInfer's MXFP4 x MXFP8 experts only at DeepSeek-V4's shapes:
    at gpt-oss's, SGLang's timing of that kernel joins vLLM's BF16-activation rows (the faster
    counts); at V4's, vLLM's own rows stay alone."""
    cal = load_calibration(load_hardware("b200"), "vllm")

    def rows(engine: str, hidden: int) -> pd.DataFrame:
        t = pd.read_parquet(aic_system_dir("b200_sxm") / "moe" / engine / "moe_perf.parquet")
        return t[(t.hidden_size == hidden) & (t.num_experts == 128) & (t.num_tokens == 16)
                 & (t.moe_tp_size == 1) & (t.moe_ep_size == 1) & (t.distribution == "balanced")]

    oss = cal.moe(16, 2880, 2880, 4, 128, 1, "fp4")
    sglang = rows("sglang/0.5.14", 2880)
    mxfp8 = float(sglang[sglang.moe_dtype == "w4a8_mxfp4_mxfp8"].latency.min())
    assert mxfp8 < float(rows("vllm/0.24.0", 2880).latency.min())
    assert oss.ms[0] == pytest.approx(mxfp8)
    assert oss.table == "b200_sxm/moe/vllm/0.24.0 + b200_sxm/moe/sglang/0.5.14"
    v4 = cal.moe(16, 4096, 2048, 6, 256, 1, "fp4")
    assert v4.table == "b200_sxm/moe/vllm/0.24.0"


def test_table_preference_order_on_a_synthetic_table_set(tmp_path, monkeypatch):
    from simulator.calibration import tables
    monkeypatch.setattr(tables, "aic_system_dir", lambda system: tmp_path / system)
    hw = load_hardware("h200").model_copy(update={"system": "synthetic"})

    def table(engine: str, version: str, dtype: str, latency: float) -> None:
        folder = tmp_path / "synthetic" / "gemm" / engine / version
        folder.mkdir(parents=True)
        pd.DataFrame({"m": [64, 128], "n": [4096, 4096], "k": [4096, 4096],
                      "gemm_dtype": [dtype, dtype], "latency": [latency, 2 * latency]}
                     ).to_parquet(folder / "gemm_perf.parquet")

    def price() -> tuple[float, str, str]:
        p = tables.Calibration(hw, "trtllm").gemm(64, 4096, 4096, "fp8")
        return float(p.ms[0]), p.source, p.table

    table("trtllm", "2.0", "bfloat16", 0.30)  # the newest own table lacks fp8
    table("trtllm", "1.0", "fp8", 0.10)
    table("vllm", "1.0", "fp8", 0.20)
    assert price() == (pytest.approx(0.10), "measured", "synthetic/gemm/trtllm/1.0")  # (b)
    (tmp_path / "synthetic/gemm/trtllm/1.0/gemm_perf.parquet").unlink()
    assert price() == (pytest.approx(0.20), "measured", "synthetic/gemm/vllm/1.0")  # (c)
    (tmp_path / "synthetic/gemm/vllm/1.0/gemm_perf.parquet").unlink()
    ms, source, label = price()  # (d): fp8 from the bf16 rows' efficiency
    assert (source, label) == ("extrapolated", "synthetic/gemm/trtllm/2.0") and ms > 0
    table("trtllm", "3.0", "fp8", 0.05)
    assert price() == (pytest.approx(0.05), "measured", "synthetic/gemm/trtllm/3.0")  # (a)


def test_gated_deltanet_kernels_come_back_from_their_table():
    from simulator.cost.step import Instance
    from tests.simulator.test_model import load_shipped
    m = load_shipped("Qwen--Qwen3.5-35B-A3B_config.json")
    hw = load_hardware("h200")
    table = aic_system_dir("h200_sxm") / "linear_attention/vllm/0.24.0/gdn_perf.parquet"
    df = pd.read_parquet(table)
    rows = df[(df.phase == "generation") & (df.model_name == "Qwen/Qwen3.5-35B-A3B")
              & (df.batch_size == 64) & (df.num_k_heads == 16)]
    want = rows.groupby("kernel_source").latency.min().sum()
    inst = Instance(model=m, hardware=hw, role="decode", ranks=1, expert_parallel=False)
    got = load_calibration(hw, "vllm").gdn(False, inst, np.array([64.0]), np.array([1.0]))
    assert got.source == "measured" and "linear_attention/vllm" in got.table
    assert got.ms[0] == pytest.approx(want)


def test_a_single_point_query_prices_as_the_batched_query_does() -> None:
    """Grid.query's one-point path (what a step uses) is the batched path's arithmetic."""
    from simulator.calibration.grid import Grid

    rng = np.random.default_rng(0)
    for d in (1, 2, 3, 4):
        pts = np.round(np.exp(rng.uniform(0, 5, (60, d)))) + 1
        grid = Grid.build(pts, rng.uniform(0.1, 2, 60), rng.uniform(0.05, 1, 60))
        query = np.concatenate([np.exp(rng.uniform(-1, 6, (200, d))), pts[:20]])
        roof = rng.uniform(0.05, 1, len(query))
        for exact in (True, False):
            ms, code = grid.query(query, roof, exact)
            one = [grid.query(query[i:i + 1], roof[i], exact) for i in range(len(query))]
            assert np.allclose(ms, np.concatenate([o[0] for o in one]), rtol=1e-12)
            assert (code == np.concatenate([o[1] for o in one])).all()


def test_a_query_with_no_measured_corner_takes_the_nearest_measured_cell(monkeypatch) -> None:
    """Sparse tables: the nearest measured cell in log-axis space, as a k-d tree finds it
    (compared by distance, so a tie may pick either cell), also across search chunks."""
    from scipy.spatial import cKDTree

    from simulator.calibration import grid as grid_module

    rng = np.random.default_rng(1)
    for d in (1, 2, 3, 4):
        pts = np.round(np.exp(rng.uniform(0, 6, (80, d)))) + 1
        grid = Grid.build(pts, rng.uniform(0.1, 2, 80), np.ones(80))
        cells = grid._cell_logs
        logs = rng.uniform(-1, 7, (500, d))
        want, _ = cKDTree(cells).query(logs)
        for chunk in (grid_module.NEAREST_CHUNK, 7 * len(cells)):  # one pass, several
            monkeypatch.setattr(grid_module, "NEAREST_CHUNK", chunk)
            got = grid.nearest(logs)
            assert np.allclose(np.linalg.norm(cells[got] - logs, axis=1), want, rtol=1e-12)


def test_a_dtype_the_table_lacks_keeps_the_measured_kernels_efficiency():
    """SGLang's wide-EP expert table measured only fp8; fp4 experts are priced at fp8's
    fraction of the fp4 roofline, so a memory-bound decode reads half the bytes in about half
    the time instead of taking fp8's measured latency."""
    from simulator.calibration import roofline as rf

    hw = load_hardware("gb200")
    cal = load_calibration(hw, "sglang")
    args = (np.array([16.0]), 7168, 2048, 8, 256, 4)
    fp8 = cal.moe_wideep(*args, "fp8", low_latency=True)
    fp4 = cal.moe_wideep(*args, "fp4", low_latency=True)
    assert fp8.source == "measured" and fp4.source == "extrapolated"
    ratio = rf.moe(hw, *args, "fp4") / rf.moe(hw, *args, "fp8")
    assert float(fp4.ms[0] / fp8.ms[0]) == pytest.approx(float(ratio[0]), rel=1e-6)
    assert float(fp4.ms[0]) < 0.7 * float(fp8.ms[0])


def test_vllm_tp_all_reduce_takes_flashinfer_s_fused_kernel_up_to_its_size_limit():
    """vLLM fuses a TP all-reduce with its RMSNorm into FlashInfer's port of TensorRT-LLM's
    kernel up to FI_ALLREDUCE_FUSION_MAX_MB: TensorRT-LLM's timing of that kernel joins vLLM's
    own rows there, the faster counting; above the limit vLLM's own kernel prices it alone."""
    from simulator.calibration.tables import FI_ALLREDUCE_FUSION_MAX_MB

    def rows(engine: str) -> pd.Series:
        t = pd.read_parquet(aic_system_dir("b200_sxm") / "comm" / engine
                            / "custom_allreduce_perf.parquet")
        if "backend" in t:
            t = t[t.backend.str.contains("graph")]
        return t[t.num_gpus == 4].set_index("message_size").latency

    vllm, trtllm = rows("vllm/0.24.0"), rows("trtllm/1.3.0rc20")
    cal = load_calibration(load_hardware("b200"), "vllm")
    small, large = 2 ** 17, 2 ** 21  # elements; the TP4 limit is 2 MB of bf16, 2 ** 20
    assert small * 2 <= FI_ALLREDUCE_FUSION_MAX_MB[4] * 2 ** 20 < large * 2
    assert trtllm[small] < vllm[small] and trtllm[large] < vllm[large]
    fused = cal.allreduce(2 * small, 4, 900.0)  # bytes: the tables count bf16 elements
    assert fused.ms[0] == pytest.approx(trtllm[small])
    assert fused.table == "b200_sxm/comm/vllm/0.24.0 + b200_sxm/comm/trtllm/1.3.0rc20"
    assert cal.allreduce(2 * large, 4, 900.0).ms[0] == pytest.approx(vllm[large])
    own = load_calibration(load_hardware("b200"), "trtllm").allreduce(2 * small, 4, 900.0)
    assert own.table == "b200_sxm/comm/trtllm/1.3.0rc20"  # TensorRT-LLM's rows stay its own
