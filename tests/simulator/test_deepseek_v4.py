"""DeepSeek-V4: the spec from its config, its compressed KV, and its step priced from the dsv4
tables."""

import copy
import json
from importlib import resources

import numpy as np
import pytest

from simulator.calibration import load_calibration
from simulator.cost.memory import check_memory
from simulator.cost.step import Batch, Instance, step_time
from simulator.specs.attention import KINDS, kind
from simulator.specs.deployment import RoleSpec
from simulator.specs.errors import SpecError
from simulator.specs.hardware import HARDWARE, load_hardware
from simulator.specs.model import PRESET_DIR, load_model, model_from_config

FLASH = load_model("deepseek-v4-flash")
PRO = load_model("deepseek-v4-pro")
GB300 = load_hardware("gb300")


def _config(name: str) -> dict:
    return json.loads(resources.files("simulator.specs").joinpath(
        f"{PRESET_DIR}/{name}.json").read_text())


def test_layer_kinds_come_from_compress_ratios():
    ratios = _config("deepseek-v4-flash")["compress_ratios"]
    assert dict(FLASH.layer_kinds) == {
        "swa": ratios[:43].count(0), "csa": ratios[:43].count(4), "hca": ratios[:43].count(128)}
    assert dict(FLASH.layer_kinds) == {"swa": 2, "csa": 21, "hca": 20}
    assert dict(PRO.layer_kinds) == {"csa": 30, "hca": 31}
    assert FLASH.mtp_kind.name == "swa"  # the entry after the decoder layers
    assert (FLASH.hash_layers, FLASH.hc_mult, FLASH.expert_dtype) == (3, 4, "fp4")


@pytest.mark.parametrize(("model", "total", "active"), [(FLASH, 284.0, 13.0), (PRO, 1600.0, 49.0)])
def test_params_match_the_published_totals(model, total, active):
    p = model.params()
    assert (model.total_params() - p["mtp"]) / 1e9 == pytest.approx(total, rel=0.03)
    # active quoted without the input embedding, as for the other models
    assert (model.active_params() - p["embedding"]) / 1e9 == pytest.approx(active, rel=0.03)


def test_kv_bytes_per_token_by_hand():
    # fp8_ds_mla entry: 448 fp8 + 64 x 2 bf16 rope + 7 scales + 1 pad = 584 bytes;
    # fp8 indexer key: 128 + 4-byte scale = 132 bytes.
    csa, hca, swa = kind("csa"), kind("hca"), kind("swa")
    assert csa.kv_token_bytes(FLASH, "fp8") == (584 + 132) / 4
    assert hca.kv_token_bytes(FLASH, "fp8") == 584 / 128
    assert swa.kv_token_bytes(FLASH, "fp8") == 0
    assert csa.kv_token_bytes(FLASH, "fp8", "fp4") == (584 + 68) / 4
    assert FLASH.kv_bytes_per_token("fp8") == 21 * (584 + 132) / 4 + 20 * 584 / 128
    # one request at 1024 tokens: the 128-token window on every layer, compressed entries,
    # and the compressors' fp32 state (CSA 8 slots x 2*2*512, indexer 8 x 2*2*128, HCA 128 x
    # 2*512, 4 bytes each)
    c = 1024
    want_csa = 128 * 584 + (c // 4) * (584 + 132) + 4 * (8 * 2048 + 8 * 512)
    want_hca = 128 * 584 + (c // 128) * 584 + 4 * 128 * 1024
    assert csa.kv_bytes(FLASH, c, "fp8") == want_csa
    assert hca.kv_bytes(FLASH, c, "fp8") == want_hca
    assert FLASH.kv_bytes(c, "fp8") == 21 * want_csa + 20 * want_hca + 2 * 128 * 584


def test_a_request_costs_window_and_compressed_tokens_not_context_times_bytes():
    cost = FLASH.kv_token_cost("fp8")
    per = FLASH.kv_bytes_per_token("fp8")
    assert cost(100_000) == pytest.approx(FLASH.kv_bytes(100_000, "fp8") / per)
    # 100K more tokens of context cost 100K pool tokens; the fixed state is paid once
    assert cost(200_000) - cost(100_000) == pytest.approx(100_000, rel=0.01)
    dense = load_model("deepseek-v3.2")
    assert FLASH.kv_bytes(131072, "fp8") < dense.kv_bytes(131072, "fp8") / 5


@pytest.mark.parametrize(("ratios", "needle"), [
    (lambda r: r[:-2], "compress_ratios has 42 entries"),
    (lambda r: [*r[:-1], 16], "compress_ratios holds 16"),
])
def test_bad_compress_ratios_are_named(ratios, needle):
    cfg = copy.deepcopy(_config("deepseek-v4-flash"))
    cfg["compress_ratios"] = ratios(cfg["compress_ratios"])
    with pytest.raises(SpecError, match=needle) as e:
        model_from_config("v4-bad", cfg)
    assert "\n" not in str(e.value)


def _decode(model, ranks, batch, context, hw=GB300):
    inst = Instance(model=model, hardware=hw, role="decode", ranks=ranks, expert_parallel=True,
                    weights="fp4", kv_cache="fp8")
    return step_time(inst, Batch.decode(ranks, batch, context), load_calibration(hw, "vllm"))


def test_a_measured_dsv4_point_comes_back_exactly():
    import pandas as pd

    from simulator.calibration.tables import aic_system_dir
    path = aic_system_dir("gb300") / "sparse_attention/vllm/0.24.0"
    df = pd.read_parquet(path / "dsv4_csa_generation_module_perf.parquet")
    row = df[(df.model.str.contains("Flash")) & (df.num_heads == 64) & (df.tp_size == 1)
             & (df.batch_size == 32) & (df.step == 4096)].iloc[0]
    inst = Instance(model=FLASH, hardware=GB300, role="decode", ranks=8, expert_parallel=True)
    got = load_calibration(GB300, "vllm").dsv4_module(kind("csa"), False, inst,
                                                      np.array([32.0]), np.array([1.0]),
                                                      np.array([4096.0]))
    assert got.source == "measured"
    assert got.ms[0] == pytest.approx(row.latency)
    assert "sparse_attention/vllm" in got.table


def test_v4_decode_grows_far_less_with_context_than_v32():
    v4 = _decode(FLASH, 8, 16, 855_000).total_ms / _decode(FLASH, 8, 16, 131_072).total_ms
    v32 = load_model("deepseek-v3.2")
    dense = _decode(v32, 8, 16, 855_000).total_ms / _decode(v32, 8, 16, 131_072).total_ms
    assert v4 - 1 < (dense - 1) / 2, (v4, dense)


@pytest.mark.parametrize("name", ["deepseek-v4-flash", "deepseek-v3", "deepseek-v3.2",
                                  "gpt-oss-120b", "qwen3-235b-a22b"])
def test_a_cached_prefix_prefill_costs_less_than_a_cold_one(name):
    m = load_model(name)
    hw = load_hardware("h200") if name != "deepseek-v4-flash" else GB300
    inst = Instance(model=m, hardware=hw, role="prefill", ranks=1, expert_parallel=False,
                    weights="fp8", kv_cache="fp8")
    cal = load_calibration(hw, "vllm")
    cold = step_time(inst, Batch.prefill(1, 32768, 1, 0), cal).total_ms
    warm = step_time(inst, Batch.prefill(1, 4096, 1, 32768 - 4096), cal).total_ms
    longer = step_time(inst, Batch.prefill(1, 4096, 1, 65536), cal).total_ms
    assert warm < cold
    assert longer >= warm  # a longer prefix never makes the chunk cheaper


@pytest.mark.parametrize("hw", [h for h in HARDWARE if h != "cpu"])
@pytest.mark.parametrize("model", [FLASH, PRO, load_model("deepseek-v4.1-flash")],
                         ids=["flash", "pro", "v4.1-flash"])
def test_v4_step_on_every_gpu(hw, model):
    st = _decode(model, 8, 32, 32768, load_hardware(hw))
    assert np.isfinite(st.total_ms) and st.total_ms > 0
    assert sum(st.breakdown.values()) == pytest.approx(st.total_ms)
    assert sum(st.parts.values()) == pytest.approx(st.total_ms)
    attn = {k: v for k, v in st.provenance.items() if k.startswith("attention.")}
    # the attention kernels from the engine's own sparse-attention tables; V4.1's projections
    # under mega attention (Blackwell) from its GEMM table, its fused kernel from vLLM's
    # measurement of it

    def source(part: str) -> str:
        if part.endswith((".projections", ".compressor")):
            return "gemm/vllm"
        return ("benchmark_dsv41_mega_attn" if part.endswith(".decode.attention")
                else "sparse_attention/vllm")

    assert attn and all(source(k) in v for k, v in attn.items()), attn
    assert "mhc" in st.provenance


def test_v4_over_memory_is_refused_with_the_numbers():
    role = RoleSpec(dep=1, max_num_batched_tokens=8192)
    with pytest.raises(SpecError, match=r"deepseek-v4-pro does not fit DEP1 on h200: per rank "
                                        r"[0-9.]+ GB weights") as e:
        check_memory("decode", PRO, load_hardware("h200"), role, "fp4", "fp8")
    assert "\n" not in str(e.value)
    check_memory("decode", FLASH, GB300, RoleSpec(dep=4, max_num_batched_tokens=8192), "fp4",
                 "fp8")


# ---- one suite over every attention kind -----------------------------------------------------

MODEL_OF = {"gqa": "qwen3-235b-a22b", "swa_gqa": "gpt-oss-120b", "mla": "deepseek-v3",
            "dsa": "deepseek-v3.2", "swa": "deepseek-v4-flash", "csa": "deepseek-v4-flash",
            "hca": "deepseek-v4-flash", "linear": "Qwen--Qwen3.5-35B-A3B_config.json",
            **{k: "deepseek-v4.1-flash" for k in KINDS if k.startswith("csa2_")}}


def _model_of(name: str):
    from tests.simulator.test_model import load_shipped
    return load_shipped(MODEL_OF[name]) if MODEL_OF[name].endswith(".json") else load_model(
        MODEL_OF[name])


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_keeps_its_kv_and_flops_consistent(name):
    k, m = kind(name), _model_of(name)
    assert k.params(m) > 0
    grow = k.kv_bytes(m, 300_000, "fp8") - k.kv_bytes(m, 200_000, "fp8")
    assert grow == pytest.approx(100_000 * k.kv_token_bytes(m, "fp8"), rel=0.01)
    assert k.kv_bytes(m, 1000, "bf16") >= k.kv_bytes(m, 1000, "fp8") >= k.kv_bytes(m, 1000, "fp4")
    assert k.kv_fixed_bytes(m, "fp8") >= 0
    assert np.all(np.diff(k.core_flops(m, np.array([1.0, 1e3, 1e5]))) >= 0)
    read = k.attended(m, np.array([10.0, 1e4, 1e6]))
    assert np.all(np.diff(read) >= 0) and read[-1] <= 1e6


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_prices_decode_and_prefill(name):
    m = _model_of(name)
    hw = GB300 if m.attention in ("dsv4", "dsv41") else load_hardware("h200")
    inst = Instance(model=m, hardware=hw, role="aggregated", ranks=1, expert_parallel=False)
    cal = load_calibration(hw, "vllm")
    k = kind(name)
    for parts in (k.decode(cal, inst, np.array([8.0]), np.array([4096.0])),
                  k.prefill(cal, inst, np.array([1.0]), np.array([2048.0]), np.array([0.0]))):
        assert parts and all(np.all(np.isfinite(p.ms)) and np.all(p.ms > 0)
                             for p in parts.values())


def test_megamoe_prices_v4_experts_on_blackwell_with_its_exchange_inside():
    from simulator.specs.deployment import uses_mega_moe
    role = RoleSpec(dep=8)
    assert uses_mega_moe(FLASH.architecture, "gb300", role, "fp4")
    assert not uses_mega_moe(FLASH.architecture, "h200", role, "fp4")
    assert not uses_mega_moe(FLASH.architecture, "gb300", RoleSpec(dep=8, all2all_backend=
                                                                    "deepep_low_latency"), "fp4")
    cal = load_calibration(GB300, "vllm")
    fused = Instance(model=FLASH, hardware=GB300, role="decode", ranks=8, expert_parallel=True,
                     weights="fp4", mega_moe=True)
    split = Instance(model=FLASH, hardware=GB300, role="decode", ranks=8, expert_parallel=True,
                     weights="fp4")
    a = step_time(fused, Batch.decode(8, 64, 8192), cal)
    b = step_time(split, Batch.decode(8, 64, 8192), cal)
    assert "moe/sglang" in a.provenance["routed_experts"]
    assert "all_to_all.dispatch" not in a.parts and a.breakdown["communication"] == 0
    assert "all_to_all.dispatch" in b.parts


def test_another_shape_scales_even_the_measured_points():
    # The MegaMoE table measures V4-Pro's experts only: V4-Flash's smaller experts at the same
    # tokens and EP size must cost less, by the roofline's ratio, not come back as Pro's point.
    cal = load_calibration(GB300, "vllm")
    pro = cal.mega_moe(64, 7168, 3072, 6, 384, 32, "fp4", True, GB300.scaleup_gb_s)
    flash = cal.mega_moe(64, 4096, 2048, 6, 256, 32, "fp4", True, GB300.scaleup_gb_s)
    assert pro.source == "measured" and flash.source == "extrapolated"
    assert flash.ms[0] < pro.ms[0] / 2


def test_long_decode_reads_beyond_the_kernel_table_stream_at_the_measured_rate():
    """The indexer table's largest decode rows are launch-bound (a few us); 64 requests at 855K
    read ~0.8 GB more keys per layer than at 128K, which costs those bytes at the rate this
    system's measured decode attention streams reads of 1 GB or more, not at the efficiency of
    launch-bound rows."""
    from simulator.specs.attention import INDEXER_KEY_BYTES
    cal = load_calibration(GB300, "vllm")
    stream = cal.stream_efficiency()
    assert stream is not None and 0.7 < stream <= 1.0  # GQA decode rows >= 1 GB on GB300
    inst = Instance(model=FLASH, hardware=GB300, role="decode", ranks=32, expert_parallel=True,
                    weights="fp4", kv_cache="fp8", indexer_cache="fp4")
    b, one = np.array([64.0]), np.array([1.0])
    near, far = (cal.dsv4_kernel("dsv4_indexer", inst, b, one, np.array([c]))
                 for c in (131072.0, 855000.0))
    assert far.source == "extrapolated"
    extra = 64 * (855000 - 131072) / 4 * INDEXER_KEY_BYTES["fp4"](FLASH.index_head_dim)
    assert far.ms[0] - near.ms[0] == pytest.approx(extra / (GB300.hbm_bytes_s * stream) * 1e3,
                                                   rel=0.02)


def test_a_csa_prompt_chunk_past_the_module_table_grows_by_scoring_and_selection():
    """Past the CSA module table's measured contexts (64K) a prompt chunk's layer grows by what
    its indexer scores and, from the measured top-k table, by each row's selection among the
    more keys: between two contexts past the edge, exactly the two kernels' differences."""
    cal = load_calibration(GB300, "vllm")
    inst = Instance(model=FLASH, hardware=GB300, role="prefill", ranks=2,
                    expert_parallel=True, weights="fp4", kv_cache="fp8", indexer_cache="fp4")
    b, n = np.ones(2), np.full(2, 4096.0)
    p = np.array([200_000.0, 524_288.0])
    module = cal.dsv4_module(kind("csa"), True, inst, b, n, p).ms
    scoring = cal.dsv4_kernel("dsv4_indexer", inst, b, n, p).ms
    selection = cal.dsv4_topk(inst, b, n, p).ms
    assert selection[1] == pytest.approx(0.904, abs=5e-4)  # the table's point after 512K
    assert module[1] - module[0] == pytest.approx(
        (scoring[1] - scoring[0]) + (selection[1] - selection[0]), rel=1e-9)
    assert selection[1] - selection[0] > 0.4
    # V4-Pro selects its own top-k (1,024) from its own runs of the kernel (128 heads)
    pro = Instance(model=PRO, hardware=GB300, role="prefill", ranks=2, expert_parallel=True,
                   weights="fp4", kv_cache="fp8", indexer_cache="fp4")
    got = cal.dsv4_topk(pro, np.ones(2), np.array([4096.0, 1024.0]), np.array([524_288.0, 2048.0]))
    assert got.ms[0] == pytest.approx(0.7986, abs=5e-4) and got.ms[1] == 0.0  # 768 keys
    assert (got.point_codes() == 0).all()
