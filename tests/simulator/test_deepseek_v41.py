"""DeepSeek-V4.1: the spec from its config (CSA2 layer kinds, records shared across layers, the
causal encoder-decoder's replayed layers, Engram, DSpark), its KV by hand, and its steps."""

import copy
import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from simulator.calibration import load_calibration
from simulator.calibration.tables import _v4_instance
from simulator.cost.memory import check_memory, rank_memory
from simulator.cost.step import Batch, Instance, prefix_rewind, step_time
from simulator.specs.attention import kind
from simulator.specs.deployment import RoleSpec
from simulator.specs.errors import SpecError
from simulator.specs.hardware import load_hardware
from simulator.specs.model import PRESET_DIR, load_model, model_from_config
from tests.simulator.test_replay import BLOCK, run, trace_file, turn

V41 = load_model("deepseek-v4.1-flash")
V4 = load_model("deepseek-v4-flash")
GB300 = load_hardware("gb300")


def _config() -> dict:
    return json.loads(resources.files("simulator.specs").joinpath(
        f"{PRESET_DIR}/deepseek-v4.1-flash.json").read_text())


def _inst(model=V41, role="decode", ranks=4, hardware=GB300, **kw) -> Instance:
    fields = {"weights": "fp4", "kv_cache": "fp4", "indexer_cache": "fp4", "mega_moe": True,
              **kw}
    return Instance(model=model, hardware=hardware, role=role, ranks=ranks, expert_parallel=True,
                    **fields)


def test_layer_kinds_come_from_ratios_and_the_kv_and_index_sources():
    assert V41.architecture == "DeepseekV41ForCausalLM" and V41.attention == "dsv41"
    names = V41.layer_kind_names()
    assert names[:3] == ("csa2_window", "csa2_window", "csa2_source_r2")
    assert names[3:8] == ("csa2_reuse_r2",) * 5  # read layer 2's records
    assert names[20] == "csa2_source_r1" and names[24] == "csa2_reindex_r1"
    assert dict(V41.layer_kinds) == {"csa2_window": 2, "csa2_source_r2": 3, "csa2_reuse_r2": 15,
                                     "csa2_source_r1": 1, "csa2_reuse_r1": 15,
                                     "csa2_reindex_r1": 4}
    # prefill runs the last source (but its compressor) and every layer after it on a window
    assert V41.replay_from == 20
    assert dict(V41.replay_kinds) == {"csa2_source_r1": 1, "csa2_reuse_r1": 15,
                                      "csa2_reindex_r1": 4}
    assert V41.candidate_pool == 2048 * 8 and V41.mtp_kind.name == "csa2_window"
    assert (V41.dspark_block, V41.mtp_layers, V41.mtp_experts) == (5, 3, 128)
    assert V41.context_length == 65536 * 16


def test_params_match_the_published_totals():
    p = V41.params()
    # 552B backbone (no Engram tables, no DSpark draft), 196.6B of Engram tables, 16B active
    # per output token and 8B per prompt token (without the input embedding)
    assert (V41.total_params() - p["mtp"] - p["engram_tables"]) / 1e9 == pytest.approx(
        552, rel=0.03)
    assert p["engram_tables"] / 1e9 == pytest.approx(196.6, rel=0.01)
    assert (V41.active_params() - p["embedding"]) / 1e9 == pytest.approx(16, rel=0.03)
    assert (V41.prefill_active_params() - p["embedding"]) / 1e9 == pytest.approx(8, rel=0.03)
    assert p["mtp"] / 1e9 == pytest.approx(14.2, rel=0.03)  # three DSpark layers, 128 experts


def test_kv_bytes_by_hand():
    # nvfp4_ds_mla record: 512 e2m1 + 32 e4m3 scales = 288 bytes; an MXFP4 index key 68 bytes;
    # window entries stay the 528-byte MXFP8 record
    src2, src1, reuse = kind("csa2_source_r2"), kind("csa2_source_r1"), kind("csa2_reuse_r2")
    assert src2.kv_token_bytes(V41, "fp4", "fp4") == (288 + 68) / 2
    assert src1.kv_token_bytes(V41, "fp4", "fp4") == 288 + 68
    assert reuse.kv_token_bytes(V41, "fp4", "fp4") == 0
    assert V41.kv_bytes_per_token("fp4", "fp4") == 890  # the V4.1 paper's figure
    assert V41.kv_bytes_per_token("fp8", "fp4") == 2.5 * (528 + 68)
    c = 1000  # one request: every layer's window, the sources' records, the pair ring
    assert src2.kv_bytes(V41, c, "fp4", "fp4") == 128 * 528 + (c // 2) * (288 + 68) + 8 * 4096
    assert src1.kv_bytes(V41, c, "fp4", "fp4") == 128 * 528 + c * (288 + 68)
    assert reuse.kv_bytes(V41, c, "fp4", "fp4") == 128 * 528
    assert V41.kv_bytes(c, "fp4", "fp4") == (40 * 128 * 528 + 3 * ((c // 2) * 356 + 32768)
                                             + c * 356)


@pytest.mark.parametrize(("change", "needle"), [
    (lambda t: t.update(compress_ratios=t["compress_ratios"][:-1]),
     "compress_ratios has 42 entries"),
    (lambda t: t["compress_ratios"].__setitem__(5, 4), "compress_ratios holds 4"),
    (lambda t: t["compress_ratios"].__setitem__(21, 2),
     "layer 21 reading records of ratio 2 but its nearest KV source at or before it, layer 20, "
     "has ratio 1"),
    (lambda t: t.update(index_source_layer_ids=[2, 8, 14, 24]),
     "KV source layer 20 with compress ratio 1; a source must compress"),
    (lambda t: t.update(kv_source_layer_ids=[50]), r"kv_source_layer_ids=\[50\]"),
    (lambda t: t.update(engram_num_embeddings=[1]), "1 engram_num_embeddings for 2"),
])
def test_bad_configs_are_refused_in_one_sentence(change, needle):
    cfg = copy.deepcopy(_config())
    change(cfg["text_config"])
    with pytest.raises(SpecError, match=needle) as e:
        model_from_config("v41-bad", cfg)
    assert "\n" not in str(e.value)


def test_decode_grows_far_less_with_context_than_v4():
    cal = load_calibration(GB300, "vllm")

    def step(model, context):
        inst = _inst(model, kv_cache="fp8" if model is V4 else "fp4")
        return step_time(inst, Batch.decode(4, 64, context), cal).total_ms

    v41 = step(V41, 855_000) / step(V41, 131_072)
    v4 = step(V4, 855_000) / step(V4, 131_072)
    assert v41 - 1 < (v4 - 1) / 2, (v41, v4)


def test_prefill_runs_the_late_layers_on_each_chunks_last_window_only():
    cal = load_calibration(GB300, "vllm")
    inst = _inst(role="prefill", ranks=2)

    def parts(tokens):
        st = step_time(inst, Batch.prefill(2, tokens), cal)
        head = sum(v for k, v in st.parts.items() if k.endswith((".prefill.module",
                                                                 ".prefill.indexer")))
        tail = sum(v for k, v in st.parts.items() if ".prefill_tail." in k)
        return head, tail, st

    head1, tail1, _ = parts(1024)
    head8, tail8, st = parts(8192)
    assert head8 > 4 * head1  # the encoder layers compute every token
    assert tail8 == pytest.approx(tail1, rel=0.25)  # the late ones 128 rows either way
    assert "attention.csa2_source_r1.prefill.compressor" in st.parts  # records for every token
    off = _inst(role="prefill", ranks=2, attn_tp=2)  # sequence parallel: no bounded replay
    whole = step_time(off, Batch.prefill(1, 8192), cal)
    assert not any(".prefill_tail." in k for k in whole.parts)


def test_sequence_parallel_ranks_keep_a_quarter_of_the_tokens_outside_attention():
    """TP4 with expert parallelism on MegaMoE (vLLM's sequence parallelism): each rank keeps
    1/4 of the step's tokens through the hyper-connections and the router, dispatches its own
    quarter on MegaMoE, and attention gathers its input and scatters its output instead of two
    all-reduces a layer; the same instance on the plain MoE kernel all-reduces every token."""
    cal = load_calibration(GB300, "vllm")
    tp4 = {"ranks": 4, "expert_parallel": False, "tp_expert_parallel": True}
    sp = Instance(model=V41, hardware=GB300, role="prefill", weights="fp4", kv_cache="fp4",
                  indexer_cache="fp4", mega_moe=True, **tp4)
    plain = Instance(model=V41, hardware=GB300, role="prefill", weights="fp4", kv_cache="fp4",
                     indexer_cache="fp4", mega_moe=False, **tp4)
    assert sp.tp == 4 and sp.dp == 1 and sp.ep == 4
    batch = Batch.prefill(1, 8192)
    a, b = step_time(sp, batch, cal), step_time(plain, batch, cal)
    quarter = cal.mhc(np.array([2048.0]), V41.hidden, V41.hc_mult, V41.hc_sinkhorn_iters)
    assert a.parts["mhc"] == pytest.approx(V41.layers * float(quarter.ms[0]))  # no replay
    assert not any(".prefill_tail." in k for k in a.parts)  # the replay is off under it
    assert any(".prefill_tail." in k for k in b.parts)
    assert {"sp_all_gather", "sp_reduce_scatter"} <= set(a.parts) and "allreduce" not in a.parts
    assert "allreduce" in b.parts and "sp_all_gather" not in b.parts
    own = cal.mega_moe(2048.0, V41.hidden, V41.moe_intermediate, V41.top_k,
                       V41.n_routed_experts, 4, V41.expert_weights("fp4"), False,
                       sp.a2a_bandwidth)
    assert a.parts["routed_experts"] == pytest.approx(V41.moe_layers * float(own.ms[0]))


def test_a_prefix_hit_computes_its_last_window_again():
    assert prefix_rewind(_inst(role="prefill", ranks=2)) == 128
    assert prefix_rewind(_inst(V4, role="prefill", ranks=2)) == 0
    assert prefix_rewind(_inst(role="prefill", ranks=8, attn_tp=2)) == 0  # sequence parallel


def test_a_repeated_turn_on_v41_hits_all_but_the_window(tmp_path: Path):
    from simulator.des.sessions import Agent, SessionTrace
    from simulator.specs.deployment import Deployment, Precision

    dep = Deployment(model="deepseek-v4.1-flash", hardware="gb300",
                     precision=Precision(weights="fp4", kv_cache="fp4", indexer_cache="fp4"),
                     prefill=RoleSpec(dep=4), decode=RoleSpec(dep=4))
    path = trace_file(tmp_path, SessionTrace("two", BLOCK, (Agent((turn(0, 10),
                                                                   turn(5, 15))),)))
    t = run(dep, path, 2).table
    assert t.cached[:2].tolist() == [0, 10 * BLOCK - 128]
    assert t.uncached[:2].tolist() == [640, 320 + 128]


def test_engram_tables_stay_in_host_memory():
    role = RoleSpec(dep=4, max_num_batched_tokens=8192)
    mem = rank_memory(V41, GB300, role, "fp4", "fp4", "fp4")
    tables = V41.weight_bytes("fp4")["engram_tables"]
    assert tables / 1e9 == pytest.approx(202.8, rel=0.01)  # 264 bytes a row
    assert mem.weights < 100e9 < tables
    with pytest.raises(SpecError, match=r"plus 203 GB of Engram tables exceed the 240 GB of "
                                        r"host memory per GPU of gb300"):
        check_memory("decode", V41, GB300, RoleSpec(dep=1, host_cache_gb=100.0), "fp4", "fp4",
                     indexer="fp4")
    check_memory("decode", V41, GB300, RoleSpec(dep=4, max_num_batched_tokens=8192), "fp4",
                 "fp4", indexer="fp4")


def test_every_v41_part_is_priced_from_the_measured_kernels():
    st = step_time(_inst(), Batch.decode(4, 64, 131_072), load_calibration(GB300, "vllm"))
    attn = {k: v for k, v in st.provenance.items() if k.startswith("attention.")}
    # mega attention (Blackwell, attention TP 1): projections and a source's compressor as
    # GEMMs, the fused kernel from vLLM's measurement of it (64 query tokens: between its
    # points; a window-only layer, which reads fewer entries, carried by V4's kernel), the
    # indexer by transfer from V4's measured kernel
    kernels = {k: v for k, v in attn.items() if k.endswith(".attention")}
    assert kernels and all(v == "interpolated (vllm/benchmark_dsv41_mega_attn (gb300))"
                           for k, v in kernels.items() if "window" not in k), kernels
    assert kernels["attention.csa2_window.decode.attention"].startswith("extrapolated (vllm/")
    indexers = {k: v for k, v in attn.items() if k.endswith(".indexer")}
    assert indexers and all(v.startswith("extrapolated (gb300/sparse_attention/vllm")
                            for v in indexers.values()), indexers
    assert all("gemm" in v for k, v in attn.items() if k not in kernels | indexers)
    assert "attention.csa2_source_r2.decode.indexer" in attn
    assert "attention.csa2_reuse_r2.decode.indexer" not in attn  # reuses the top-k
    assert "attention.csa2_source_r2.decode.compressor" in attn  # a KV source compresses
    assert "attention.csa2_reuse_r2.decode.compressor" not in attn
    assert "engram" in st.parts and "mhc" in st.parts
    assert sum(st.parts.values()) == pytest.approx(st.total_ms)
    assert np.isfinite(st.total_ms) and st.total_ms > 0


def test_a_dspark_draft_layer_reads_its_own_share_of_the_experts():
    cal = load_calibration(GB300, "vllm")
    full = V41.model_copy(update={"mtp_experts": 0})  # draft layers as large as decoder layers

    def draft(model):
        inst = _inst(model, ranks=16, spec_tokens=5, spec_acceptance=0.78)
        st = step_time(inst, Batch.decode(16, 32, 131_072), cal)
        return st.parts["mtp_draft"], st.breakdown, st.parts

    small, b, parts = draft(V41)
    big, _, _ = draft(full)
    assert small < big
    # the drafts' logits: one LM head over the block's 5 rows a request, then the Markov
    # head's rank-256 bias on each of the 5 positions
    vocab = V41.vocab
    logits = (cal.gemm(np.array([32.0 * 5]), vocab, V41.hidden, "bf16").ms[0]
              + 5 * cal.gemm(np.array([32.0]), vocab, 256, "bf16").ms[0])
    assert logits < 5 * parts["lm_head"]  # not five heads over the step's six rows a request
    # the same attention, a window-only layer's (the draft layers' kind) over 40 layers, and a
    # third of the expert work (128 of 384 experts); per decode token (six a request)
    window = sum(v for k, v in parts.items()
                 if k.startswith("attention.csa2_window.decode.")) / 2 * 40
    assert window < b["attention"]  # the window-only layers read no records, score no keys
    experts = b["moe"] + b["communication"]
    ratio = (window + experts / 3) / (window + experts)
    assert small - logits == pytest.approx((big - logits) * ratio, rel=1e-9)
    assert small - logits == pytest.approx(5 * 3 / 40 * (window + experts / 3) / 6, rel=1e-9)


def test_an_mtp_draft_pays_one_lm_head_a_drafted_token():
    """V4-Flash's MTP layer (an SWA layer) drafts one token a pass: three passes, each with
    its LM head and one SWA layer's attention and expert work per token."""
    v4 = _inst(V4, ranks=16, spec_tokens=3, spec_acceptance=0.8, kv_cache="fp8",
               indexer_cache="fp8")
    st = step_time(v4, Batch.decode(16, 32, 131_072), load_calibration(GB300, "vllm"))
    assert V4.mtp_kind.name == "swa" and V4.layers == 43
    swa = sum(v for k, v in st.parts.items() if k.startswith("attention.swa.decode.")) / 2
    experts = st.breakdown["moe"] + st.breakdown["communication"]
    assert st.parts["mtp_draft"] == pytest.approx(
        3 * st.parts["lm_head"] + 3 / 43 * (swa * 43 + experts) / 4, rel=1e-9)


def test_a_decode_indexer_reads_a_requests_keys_once_per_pair_of_its_rows():
    """vLLM's V4.1 indexer on DeepGEMM pairs two query rows of one request (drafts + 1) and
    loads their keys once: at 128K the scoring is memory-bound, so six rows a request cost half
    of six requests' rows on Blackwell; on Hopper six rows are flattened (no pairing), four
    (a native next_n) pair. (Each row's top-k selection after it stays per row.)"""
    source = kind("csa2_source_r2")

    def scoring(hardware, requests, drafts, kv="fp4"):
        inst = _inst(hardware=hardware, spec_tokens=drafts, kv_cache=kv, indexer_cache=kv)
        cal = load_calibration(hardware, "vllm")
        rows = np.array([float(requests)])
        both = cal.dsv41_indexer(source, False, inst, rows, np.ones(1), np.array([131_072.0]))
        # the pair source's 64K keys a row: V4's past of 256K tokens
        chosen = cal.dsv4_decode_topk(_v4_instance(inst), rows, np.array([262_144.0]))
        return float(both.ms[0] - chosen.ms[0])

    assert scoring(GB300, 64 * 6, 5) == pytest.approx(scoring(GB300, 64 * 6, 0) / 2, rel=1e-12)
    assert scoring(GB300, 64 * 3, 2) == pytest.approx(scoring(GB300, 64 * 3, 0) * 2 / 3,
                                                      rel=1e-12)
    h200 = load_hardware("h200")
    assert scoring(h200, 64 * 6, 5, "fp8") == scoring(h200, 64 * 6, 0, "fp8")
    assert scoring(h200, 64 * 4, 3, "fp8") == pytest.approx(
        scoring(h200, 64 * 4, 0, "fp8") / 2, rel=1e-12)


def test_a_prompt_chunks_indexer_pays_its_top_k_selection_from_the_measured_table():
    """After scoring a long cached prefix's keys, each prompt row keeps its top-k of them: the
    measured top-k table (SGLang's kernel-level collector, ordered scores) gives V4's points
    back exactly, a V4.1 source layer pays it at V4's past of as many keys on top of the
    scoring, and nothing is selected where a row has no more than top-k keys."""
    cal = load_calibration(GB300, "vllm")
    v4 = _inst(model=V4, role="prefill", ranks=2)
    # the table's rows: 4,096 new tokens after 512K (1,000,000) tokens; 8,192 after none
    got = cal.dsv4_topk(v4, np.array([1.0, 1.0, 1.0]), np.array([4096.0, 4096.0, 8192.0]),
                        np.array([524_288.0, 1_000_000.0, 0.0]))
    assert got.ms.tolist() == pytest.approx([0.904, 1.729, 0.046], abs=5e-4)
    assert got.table == "gb300/sparse_attention/sglang/0.5.14"
    assert (got.point_codes() == 0).all()  # measured
    # at most top-k (512) keys a row, one per 4 tokens: nothing to select
    assert cal.dsv4_topk(v4, np.ones(1), np.array([1024.0]), np.array([1024.0])).ms[0] == 0.0

    source, inst = kind("csa2_source_r2"), _inst(role="prefill", ranks=2)
    one = (np.ones(1), np.array([4096.0]))
    cold = cal.dsv41_indexer(source, True, inst, *one, np.zeros(1))
    warm = cal.dsv41_indexer(source, True, inst, *one, np.array([524_288.0]))
    # 512K cached tokens are 256K keys of a pair source: V4's past of 1,050,624 tokens, 5 %
    # more keys a row than the table's last measured past (1M: 1.729 ms)
    assert "gb300/sparse_attention/sglang/0.5.14" in warm.table
    selection = cal.dsv4_topk(v4, *one, np.array([4 * (524_288.0 + 2048) / 2 - 2048]))
    assert 1.729 < selection.ms[0] < 1.729 * 1.06
    assert warm.ms[0] - cold.ms[0] > selection.ms[0]


def test_decode_rows_pay_their_top_k_selection_rows_side_by_side_keys_by_one_rows_runs():
    """A decode step's query rows each select their top-k: the table's one-token runs where
    they reach (4 rows after 128K tokens: measured), past them one row's measured time at the
    context (the rows run side by side: 64 rows after 512K cost what one row does) and, past
    the most rows the table ran (256), in proportion to the rows; a V4.1 decode indexer pays
    it on top of its scoring."""
    cal = load_calibration(GB300, "vllm")
    v4 = _inst(model=V4)
    rows, past = np.array([4.0, 64.0, 1.0, 256.0, 512.0]), np.array([131_072.0, *[524_288.0] * 4])
    got = cal.dsv4_decode_topk(v4, rows, past)
    assert got.ms[0] == pytest.approx(0.01233, abs=5e-5)  # measured, 4 rows of 32K keys
    assert got.point_codes()[0] == 0 and (got.point_codes()[[1, 3, 4]] > 0).all()
    assert got.ms[2] == pytest.approx(0.0391, abs=1e-4)  # one row of 128K keys, measured
    assert got.ms[1] == pytest.approx(got.ms[2], rel=0.02)
    assert got.ms[4] == pytest.approx(2 * got.ms[3])
    # grows with the context; nothing to select at 512 keys
    longer = cal.dsv4_decode_topk(v4, np.array([64.0]), np.array([2_000_000.0]))
    assert longer.ms[0] > 3 * got.ms[1]
    assert cal.dsv4_decode_topk(v4, np.array([64.0]), np.array([2048.0])).ms[0] == 0.0

    source = kind("csa2_source_r2")
    decode = cal.dsv41_indexer(source, False, _inst(), np.array([64.0]), np.ones(1),
                               np.array([131_072.0]))
    assert "gb300/sparse_attention/sglang/0.5.14" in decode.table
    # the pair source's 64K keys a row: V4's past of 256K tokens
    chosen = cal.dsv4_decode_topk(_inst(model=V4), np.array([64.0]), np.array([262_144.0]))
    far = cal.dsv41_indexer(source, False, _inst(), np.array([64.0]), np.ones(1),
                            np.array([855_000.0]))
    assert decode.ms[0] > chosen.ms[0] > 0
    assert far.ms[0] > decode.ms[0]


def test_mega_attention_prices_blackwell_decode():
    cal = load_calibration(GB300, "vllm")

    def parts(inst, batch):
        return {k.rsplit(".", 1)[1] for k in step_time(inst, batch, cal).provenance
                if k.startswith("attention.csa2_reuse_r2.")}

    assert parts(_inst(), Batch.decode(4, 64, 131_072)) == {"projections", "attention"}
    # a prefill chunk keeps the measured module, and so does Hopper (no mega attention)
    assert parts(_inst(role="prefill"), Batch.prefill(4, 4096)) == {"module"}
    # TP attention shards the projections, but the kernel pays for its 64 padded heads: at 8
    # query tokens vLLM measured it alike at TP1 and TP4
    one, four = (cal.dsv41_attention(kind("csa2_reuse_r2"), False, _inst(attn_tp=tp),
                                     np.array([8.0]), np.ones(1), np.array([65536.0])).ms[0]
                 for tp in (1, 4))
    assert one == four
    # the kernel prices what a layer reads: a KV source and the layers reusing its records
    # alike (the operation prices per point take them as one point)
    point = (False, _inst(), np.array([8.0]), np.ones(1), np.array([800.0]))  # < top-k x 2
    assert (cal.dsv41_attention(kind("csa2_source_r2"), *point).ms[0]
            == cal.dsv41_attention(kind("csa2_reuse_r2"), *point).ms[0]
            != cal.dsv41_attention(kind("csa2_reuse_r1"), *point).ms[0])
    sharded = step_time(_inst(attn_tp=4), Batch.decode(1, 8, 65536), cal).parts
    whole = step_time(_inst(), Batch.decode(4, 8, 65536), cal).parts
    key = "attention.csa2_reuse_r2.decode.projections"
    assert sharded[key] < whole[key]
    h200 = load_hardware("h200")
    hopper = Instance(model=V41, hardware=h200, role="decode", ranks=4, expert_parallel=True,
                      weights="fp8", kv_cache="fp8", indexer_cache="fp8")
    assert {k.rsplit(".", 1)[1] for k in step_time(hopper, Batch.decode(4, 64, 131_072),
                                                   load_calibration(h200, "vllm")).provenance
            if k.startswith("attention.csa2_reuse_r2.")} == {"module"}


def test_mega_attention_is_vllms_measurement_where_its_conditions_hold():
    """vLLM timed the layer's mega attention on one GB300 (a 64-head model reading 128 window
    and 512 NVFP4 compressed entries a query; data/dsv41_mega_attn.csv): its figures come back
    exactly, linear between its query-token points and past the last, and other conditions
    are carried from them, flagged extrapolated."""
    cal = load_calibration(GB300, "vllm")
    long = np.array([131_072.0])

    def price(queries, layer="csa2_reuse_r2", **kw):
        got = cal.dsv41_attention(kind(layer), False, _inst(**kw), np.array([float(queries)]),
                                  np.ones(1), long)
        return float(got.ms[0]), got.source

    assert price(128) == (0.031, "measured")  # TP1 (64 live heads), s_q 128: 31 us
    assert price(256, attn_tp=4) == (0.059, "measured")  # TP4 (16 live heads): 59 us
    assert price(384) == (pytest.approx(0.0745), "interpolated")  # (53 + 96) / 2
    assert price(1024) == (pytest.approx(0.096 + 512 * 0.043 / 256), "extrapolated")
    # fp8 records: one query token costs the kernel's latency, a large batch reads more bytes
    assert price(1, kv_cache="fp8") == (0.029, "extrapolated")
    assert price(512, kv_cache="fp8")[0] > price(512)[0] == 0.096
    # a window-only layer reads 128 entries, not 640; another Blackwell system by V4's kernel
    assert price(128, "csa2_window")[0] < price(128)[0]
    b200 = load_hardware("b200")
    got = load_calibration(b200, "vllm").dsv41_attention(
        kind("csa2_reuse_r2"), False, _inst(hardware=b200), np.array([128.0]), np.ones(1), long)
    assert got.source == "extrapolated" and 0 < got.ms[0] != 0.031


def test_a_mega_attention_layers_projections_are_its_gemms_one_after_another():
    """The projections of a decode layer under mega attention: the merged input projection
    (q_a, kv_a and the index weights), q_b, the grouped output projection as one batched GEMM
    over o_groups x the tokens, o_b, and the indexer's query projection, each at the GEMM
    table's rate, summed with their provenance (one operation, `gemm_chain`, for the price
    cache)."""
    cal = load_calibration(GB300, "vllm")
    m, tokens = V41, np.array([8.0 * 6, 64.0 * 6])  # 8 and 64 requests a rank, 5 drafts each
    h, d, g = m.hidden, m.head_dim, m.o_groups
    gemms = [cal.gemm(tokens, m.q_lora_rank + d + m.index_n_heads, h, "fp8"),
             cal.gemm(tokens, m.num_attention_heads * d, m.q_lora_rank, "fp8"),
             cal.gemm(tokens * g, m.o_lora_rank, m.num_attention_heads * d // g, "fp8"),
             cal.gemm(tokens, h, g * m.o_lora_rank, "fp8"),
             cal.gemm(tokens, m.index_n_heads * m.index_head_dim, m.q_lora_rank, "fp8")]
    got = kind("csa2_source_r2").decode(cal, _inst(), tokens, np.full(2, 65536.0))
    want = sum(p.ms for p in gemms)
    assert got["projections"].ms.tolist() == want.tolist()
    assert got["projections"].table == gemms[0].table
    assert got["projections"].source == max((p.source for p in gemms),
                                            key=("measured", "interpolated", "extrapolated",
                                                 "roofline").index)


def test_a_v41_layer_priced_from_remembered_v4_points_is_the_fresh_price():
    """`dsv41_module` remembers the V4 module price it transfers per points: a price that finds
    it there is the price of a calibration that has never seen the point, bit for bit."""
    cal = load_calibration(GB300, "vllm")
    rng = np.random.default_rng(8)
    calls = []
    for _ in range(200):
        role = "prefill" if rng.random() < 0.5 else "decode"
        ranks = int(rng.choice([1, 2, 3]))
        b = rng.integers(1, 64, ranks).astype(float)
        n = rng.integers(1, 8192, ranks).astype(float) if role == "prefill" else np.ones(ranks)
        p = np.exp(rng.uniform(0, 13, ranks)).round()
        calls.append((kind(str(rng.choice(list(dict(V41.layer_kinds))))), role == "prefill",
                      _inst(role=role, ranks=int(rng.choice([2, 16]))), b, n, p))
    warm = [cal.dsv41_module(*c) for c in calls + calls]  # the second half finds every point
    for c, a, again in zip(calls, warm[:len(calls)], warm[len(calls):], strict=True):
        cal._v4_csas.clear()
        fresh = cal.dsv41_module(*c)
        for got in (a, again):
            assert got.ms.tobytes() == fresh.ms.tobytes()
            assert (got.source, got.table) == (fresh.source, fresh.table)
