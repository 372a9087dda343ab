"""`rackplan validate`: measured rows rebuilt as deployments, predicted, scored."""

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from executor.backends.procs import alive
from planner.cli import main
from simulator.specs.errors import SpecError
from simulator.validate import (
    CAPPED,
    PD_AS_AGG,
    capped_run,
    case_from_row,
    in_flight,
    is_moe_model,
    kv_cache_dtype,
    load_rows,
    pd_as_agg,
    summarize,
    validate,
)


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    return load_rows()


def test_rows_carry_their_concurrency(rows):
    assert len(rows) == 5221
    assert rows.concurrency.notna().mean() > 0.99


def test_aggregated_dep_row_becomes_a_dep_deployment(rows):
    row = rows[(rows["mode"] == "agg") & (rows.attention_dp_size == 8)
               & (rows.model_path == "deepseek-ai/DeepSeek-R1")].iloc[0]
    case = case_from_row(row)
    agg = case.deployment.aggregated
    assert agg is not None and agg.dep == 8
    # one server: its own DP balancer spreads requests over the ranks, not a prefix router
    assert agg.router == "least_requests"
    assert case.workload.arrival.concurrency == int(row.concurrency)
    # InferenceX's client draws lengths uniformly from [int(0.8 L), L]
    assert (case.workload.input_tokens.low, case.workload.input_tokens.high) == (
        int(0.8 * row.isl), row.isl)
    assert (case.workload.output_tokens.low, case.workload.output_tokens.high) == (
        int(0.8 * row.osl), row.osl)


def test_an_aggregated_row_whose_users_are_a_multiple_of_its_batch_runs_that_many_workers(rows):
    """The file records an aggregated row's batch size per DP rank: concurrency is
    batch_size x attention_dp_size, or a whole multiple k of it, k workers sharing the users
    (Qwen3-32B-NVFP4 under Dynamo: 416 users, 13 a TP2 worker, 32 workers)."""
    row = rows[rows.id.str.contains("qwen3_32b_nvfp4_b200_sxm_trtllm_agg")].iloc[0]
    agg = case_from_row(row).deployment.aggregated
    assert agg is not None and (agg.instances, agg.tp, agg.max_num_seqs) == (32, 2, 13)
    dep = rows[(rows["mode"] == "agg") & (rows.attention_dp_size == 8)].iloc[0]
    assert dep.concurrency == dep.batch_size * 8  # the common case: one worker
    assert case_from_row(dep).deployment.aggregated.instances == 1
    plain = row.copy()
    plain["batch_size"] = float("nan")  # nothing says how the users were spread
    assert case_from_row(plain).deployment.aggregated.instances == 1


def test_sglang_rows_on_blackwell_take_the_recipes_recv_interval(rows):
    """InferenceX's aggregated SGLang recipes of DeepSeek-R1 and Qwen3.5 on B200 and B300 pass
    --scheduler-recv-interval 10 below 16 users and 30 from 16 on; GLM-5's, Hopper's and other
    engines' rows take every step."""
    def interval(backend: str, system: str, conc: int,
                 model: str = "deepseek-ai/DeepSeek-R1") -> int:
        row = rows[(rows.backend == backend) & (rows.system == system) & (rows["mode"] == "agg")
                   & (rows.concurrency == conc) & (rows.attention_dp_size <= 1)
                   & (rows.tp_size == 8) & (rows.model_path == model)].iloc[0]
        agg = case_from_row(row).deployment.aggregated
        assert agg is not None
        return agg.recv_interval

    assert interval("sglang", "b200_sxm", 8) == 10
    assert interval("sglang", "b200_sxm", 16) == 30
    assert interval("sglang", "h200_sxm", 16) == 1
    assert interval("trtllm", "b200_sxm", 16) == 1
    assert interval("sglang", "b200_sxm", 16, "zhipuai/GLM-5") == 1


def test_a_recipe_that_sets_its_memory_fraction_and_prefill_chunk_is_read_as_it_ran(rows):
    """InferenceX's DeepSeek-R1 fp8 SGLang recipe on B200 runs TP4 at --mem-fraction-static
    0.95 with a receive interval of 10 at every load and 8K prefill chunks (TP8 at 0.82 and 32K
    chunks); without it 32 users' 9K contexts do not fit beside its weights and the replay
    queues for a minute."""
    def role(tp: int, conc: int, model: str = "deepseek-ai/DeepSeek-R1",
             system: str = "b200_sxm", precision: str = "fp8"):
        row = rows[(rows.backend == "sglang") & (rows.system == system)
                   & (rows["mode"] == "agg") & (rows.precision == precision)
                   & (rows.tp_size == tp) & (rows.moe_ep_size == 1)
                   & (rows.concurrency == conc) & (rows.model_path == model)].iloc[0]
        agg = case_from_row(row).deployment.aggregated
        assert agg is not None
        return agg.gpu_memory_utilization, agg.recv_interval, agg.max_num_batched_tokens

    assert role(4, 32) == (0.95, 10, 8192)
    assert role(8, 32) == (0.82, 30, 32768)
    assert role(4, 256, "Qwen/Qwen3.5-397B-A17B") == (0.82, 30, 32768)
    # no recipe of B300's Qwen3.5 before its rows: the general rules
    assert role(4, 256, "Qwen/Qwen3.5-397B-A17B", "b300_sxm") == (0.9, 30, 8192)


def test_tensorrt_llm_recipes_keep_their_kv_share_and_gpt_oss_its_20k_tokens_a_step(rows):
    """TensorRT-LLM's recipes keep a share of the free memory for KV (DeepSeek-R1 0.8 on B200,
    0.75 on H200; gpt-oss 0.85) and gpt-oss's pass --max_num_tokens 20000 at every load."""
    def role(model: str, system: str):
        row = rows[(rows.backend == "trtllm") & (rows.system == system) & (rows["mode"] == "agg")
                   & (rows.attention_dp_size <= 1) & (rows.model_path == model)
                   & (rows.isl == 8192)].iloc[0]
        agg = case_from_row(row).deployment.aggregated
        assert agg is not None
        return agg.gpu_memory_utilization, agg.max_num_batched_tokens, row.concurrency

    fraction, tokens, users = role("deepseek-ai/DeepSeek-R1", "b200_sxm")
    assert fraction == 0.8 and tokens == max(8192, -(-(users + 8192 + 64) // 64) * 64)
    assert role("deepseek-ai/DeepSeek-R1", "h200_sxm")[0] == 0.75
    assert role("openai/gpt-oss-120b", "h200_sxm")[:2] == (0.85, 20000)


def test_disaggregated_row_has_both_roles(rows):
    row = rows[(rows["mode"] == "disagg") & (rows.prefill_num_workers > 1)
               & rows.model_path.str.contains("DeepSeek")].iloc[0]
    case = case_from_row(row)
    assert case.deployment.prefill is not None and case.deployment.decode is not None
    assert case.deployment.prefill.instances == int(row.prefill_num_workers)


def test_a_pd_rows_prefill_batches_every_client_prompt_its_token_budget_holds(rows):
    """P/D prefill workers run many prompts a step (vLLM's recipes --max-num-seqs 64-4096,
    SGLang's --max-running-requests 30000, TensorRT-LLM's max_batch_size 4-32): the token
    budget binds, not one prompt a step."""
    row = rows[(rows["mode"] == "disagg") & (rows.backend == "trtllm") & (rows.isl == 1024)
               & (rows.prefill_attention_dp_size == 4) & (rows.prefill_num_workers == 1)
               & (rows.concurrency >= 512)].iloc[0]
    prefill = case_from_row(row).deployment.prefill
    assert prefill is not None and prefill.dep == 4
    assert prefill.max_num_seqs == math.ceil(row.concurrency / 4)
    assert prefill.max_num_batched_tokens == 8192


def test_vllm_kimi_pd_rows_run_the_layout_their_recipes_set(rows):
    """The file records vLLM's Kimi-K2.5 GB200 P/D run as TP groups; InferenceX ran its
    prefill as DEP4 with 16,384 tokens a rank, the 1P1D decode as DEP16, the 1P4D decode as
    TEP4 (16 requests a worker at 8K/1K); TensorRT-LLM's context servers of 2025-12 took 4
    prompts and 4,608 tokens at 1K/1K."""
    kimi = rows[(rows.backend == "vllm") & (rows["mode"] == "disagg")
                & (rows.model_path == "moonshotai/Kimi-K2.5")]
    one = case_from_row(kimi[kimi.id.str.endswith("1024x1024_c512_cfg697")].iloc[0]).deployment
    assert one.prefill is not None and (one.prefill.dep, one.prefill.tp) == (4, None)
    assert one.prefill.max_num_batched_tokens == 16384
    assert one.decode is not None and (one.decode.dep, one.decode.max_num_seqs) == (16, 32)
    assert {one.prefill.all2all_backend, one.decode.all2all_backend} == {
        "flashinfer_nvlink_one_sided"}
    four = case_from_row(kimi[kimi.id.str.endswith("8192x1024_c128_cfg698")].iloc[0]).deployment
    assert four.prefill is not None and four.prefill.dep == 4
    assert four.decode is not None and four.decode.dep is None
    assert (four.decode.tp, four.decode.instances, four.decode.max_num_seqs) == (4, 4, 16)
    low = case_from_row(kimi[kimi.id.str.endswith("8192x1024_c16_cfg698")].iloc[0]).deployment
    assert low.decode is not None and low.decode.max_num_seqs == 4
    trt = rows[rows.id == "dsr1_gb200_trtllm_fp4_disagg_1024x1024_c564_cfg237"].iloc[0]
    ctx = case_from_row(trt).deployment.prefill
    assert ctx is not None and (ctx.max_num_seqs, ctx.max_num_batched_tokens) == (4, 4608)


def test_unmodelled_model_is_not_covered_with_a_reason(rows):
    row = rows[rows.model_path == "Qwen/Qwen3.5-397B-A17B"].iloc[0].copy()
    case_from_row(row)  # Qwen3.5's linear-attention layers are described
    row["model_path"] = "example/Unknown-1B"
    with pytest.raises(SpecError, match="example/Unknown-1B"):
        case_from_row(row)
    assert is_moe_model("Qwen/Qwen3.5-397B-A17B")
    assert not is_moe_model("meta-llama/Llama-3.1-70B")


def test_validate_a_sample_end_to_end_through_the_simulator(rows, tmp_path, capsys):
    out = tmp_path / "v.csv"
    assert main(["validate", "--backend", "vllm", "--system", "h200_sxm", "--sample", "6",
                 "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 6
    assert {"overall", "moe", "groups", "covered"} <= set(report)
    assert report["covered"] >= 1
    for key in ("tpot_mape", "ttft_mape"):
        assert math.isfinite(report["overall"][key]) and report["overall"][key] >= 0
    per_row = pd.read_csv(out)
    assert len(per_row) == 6 and per_row.covered.sum() == report["covered"]


def test_summary_scores_a_perfect_predictor_at_zero(rows):
    sample = rows[rows.backend == "vllm"].head(3)
    df = validate(sample, predictor=lambda d, w: {"ttft_ms": {"mean": None},
                                                  "tpot_ms": {"mean": None}})
    df["pred_ttft_ms"], df["pred_tpot_ms"] = df.ttft_ms, df.tpot_ms
    report = summarize(df)
    assert report["overall"] == {"tpot_mape": 0.0, "ttft_mape": 0.0}


def test_unknown_filter_value_is_one_clear_error(capsys):
    assert main(["validate", "--system", "h999"]) == 2
    err = capsys.readouterr().err
    assert "--system='h999'" in err and "h200_sxm" in err


def test_serving_overhead_is_fitted_per_engine_and_only_pd_pays_the_handoff():
    from simulator.calibration.serving import in_fit_half, serving_overhead

    agg, pd_ = serving_overhead("vllm", False), serving_overhead("vllm", True)
    assert agg.handoff_ms == 0.0 and pd_.handoff_ms > 0.0
    assert agg.api_overhead_ms == pd_.api_overhead_ms >= 0.0
    assert serving_overhead("tgi", True).api_overhead_ms == 0.0  # nothing fitted
    assert in_fit_half("row-a") == in_fit_half("row-a")


def test_report_scores_the_rows_left_out_of_fitting(rows):
    sample = rows[(rows.backend == "vllm") & (rows.concurrency <= 4)].head(4)
    df = validate(sample, predictor=lambda d, w: {"ttft_ms": {"mean": 1.0},
                                                  "tpot_ms": {"mean": 1.0}})
    report = summarize(df)
    assert report["held_out"]["all"]["rows"] == int((~df.fit_row).sum())


def test_pd_rows_without_worker_counts_are_counted_apart_from_the_describable(rows):
    """Issue 12's coverage is of describable rows: a P/D row with no worker counts has no
    known layout."""
    blind = rows[(rows["mode"] == "disagg") & rows.prefill_num_workers.isna()].head(2)
    known = rows[(rows.backend == "vllm") & (rows["mode"] == "agg")].head(2)
    df = validate(pd.concat([blind, known]),
                  predictor=lambda d, w: {"ttft_ms": {"mean": 1.0}, "tpot_ms": {"mean": 1.0}})
    assert (df.reason == "P/D worker counts not recorded").sum() == 2
    df["moe"] = True
    report = summarize(df)
    assert (report["moe"]["rows"], report["moe"]["covered"]) == (4, 2)
    assert (report["moe_describable"]["rows"], report["moe_describable"]["covered"]) == (2, 2)


def test_a_run_held_back_outside_its_deployment_is_counted_apart(rows):
    """gpt-oss-120b on H100 at 512 users (2025-12): ~100 requests in flight whatever the TP,
    by Little's law on the rows' own figures; the same model and layout at 64 users is
    predicted."""
    capped = rows[rows.apply(capped_run, axis=1)]
    assert len(capped) == 9 and set(capped.tp_size) == {2, 4, 8}
    held = in_flight(capped.concurrency, capped.osl, capped.silicon_ttft_ms,
                     capped.silicon_tpot_ms)
    assert held.between(80, 110).all()
    same = rows[(rows.model_path == "openai/gpt-oss-120b") & (rows.system == "h100_sxm")
                & (rows.backend == "vllm") & (rows.concurrency == 64)].head(1)
    df = validate(pd.concat([capped.head(2), same]),
                  predictor=lambda d, w: {"ttft_ms": {"mean": 1.0}, "tpot_ms": {"mean": 1.0}})
    assert (df.reason == CAPPED).sum() == 2 and df.covered.sum() == 1
    report = summarize(df)
    assert (report["moe"]["rows"], report["moe_describable"]["rows"]) == (3, 1)


def test_gb200_pd_runs_recorded_as_aggregated_are_counted_apart(rows):
    """InferenceX ran GB200 in 2025-11 only as multi-node P/D: those rows' tp_size (12-72) is
    the deployment's GPU count, so TP32 and TP64 are not predicted as aggregated TP groups."""
    runs = rows[rows.apply(pd_as_agg, axis=1)]
    assert len(runs) == 55 and set(runs["mode"]) == {"agg"} and runs.tp_size.min() >= 12
    tp32 = runs[runs.tp_size == 32].head(1)
    df = validate(tp32, predictor=lambda d, w: {"ttft_ms": {"mean": 1.0},
                                                "tpot_ms": {"mean": 1.0}})
    assert list(df.reason) == [PD_AS_AGG] and not df.covered.any()
    df["moe"] = True
    assert summarize(df)["moe_describable"]["rows"] == 0


def test_a_killed_validate_resumes_without_redoing_rows(rows, tmp_path):
    sample = rows[rows.backend == "vllm"].head(6)
    calls: list[str] = []

    class Killed(BaseException):
        pass

    def predictor(deployment, workload, die_after=None):
        calls.append(deployment.model)
        if die_after is not None and len(calls) > die_after:
            raise Killed
        return {"ttft_ms": {"mean": 1.0}, "tpot_ms": {"mean": 1.0}}

    journal = tmp_path / "v.csv.partial"
    with pytest.raises(Killed):
        validate(sample, lambda d, w: predictor(d, w, die_after=3), journal=journal)
    kept = pd.read_csv(journal)
    assert 1 <= len(kept) <= 3 + (6 - sum(kept.covered))  # finished rows, nothing half-written
    before = len(calls)
    df = validate(sample, predictor, journal=journal)
    assert len(df) == 6 and set(df.id) == set(sample.id)
    redone = len(calls) - before
    assert redone == int(df[~df.id.isin(kept.id)].covered.sum())  # only the unfinished rows
    assert df.set_index("id").loc[kept.id, "covered"].tolist() == kept.covered.tolist()


def test_a_sigkilled_validate_leaves_no_worker_behind(tmp_path):
    """Its worker processes die with it (they used to keep running, hundreds with --workers
    100000), and ^C is the parent's alone."""
    def children(pid: int) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            if entry.name.isdigit() and int(fields[1]) == pid and fields[0] not in "ZX":
                found.append(int(entry.name))
        return found

    proc = subprocess.Popen([sys.executable, "-m", "planner.cli", "validate", "--sample", "300",
                             "--workers", "2", "--out", str(tmp_path / "v.csv")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=Path(__file__).resolve().parents[2])
    end = time.monotonic() + 120
    while len(children(proc.pid)) < 2:  # the two workers (and the resource tracker)
        assert proc.poll() is None and time.monotonic() < end, "no workers started"
        time.sleep(0.2)
    workers = children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    end = time.monotonic() + 60
    while any(alive(pid, None) for pid in workers):
        assert time.monotonic() < end, f"workers {workers} outlived their parent"
        time.sleep(0.2)



def test_attention_dp_written_as_tp_times_ep_is_read_as_the_node_it_ran_on(rows):
    """TensorRT-LLM rows whose ids read tp8_ep8 record attention_dp_size 64 (= moe_tp 8 x
    moe_ep 8) on single 8-GPU nodes: the instance is DEP8, not 64 ranks of one request."""
    rid = "2026_04_06_deepseek_r1_h200_sxm_trtllm_fp8_agg_8192x1024_c64_tp8_ep8_941"
    row = rows[rows.id == rid].iloc[0]
    assert (row.attention_dp_size, row.moe_tp_size, row.moe_ep_size) == (64, 8, 8)
    agg = case_from_row(row).deployment.aggregated
    assert agg is not None and agg.dep == 8 and agg.max_num_seqs == 8



def _layout(rows: pd.DataFrame, rid: str) -> tuple[int | None, int | None, bool]:
    """(DEP size, TP, experts spread) of an aggregated row as validate deploys it."""
    agg = case_from_row(rows[rows.id == rid].iloc[0]).deployment.aggregated
    assert agg is not None
    return agg.dep, agg.tp, bool(agg.enable_expert_parallel)


def test_vllm_rows_recorded_as_attention_dp_run_the_parallelism_their_recipes_passed(rows):
    """vLLM rows recording tp_size = attention_dp_size = N and moe_ep_size N x N ran as their
    InferenceX scripts of the day passed them: Kimi-K2.5's `--tensor-parallel-size 4` alone
    (the same measurement is recorded again as tp4 with moe_ep_size 4), MiniMax-M2.5 fp8's
    TP with `--enable-expert-parallel`; DP attention only in the nvfp4 runs whose configuration
    set dp-attn (the same 8K/1K point at 512 users ran TP2 x EP2 on 2026-04-17, DEP2 on -21)."""
    kimi = rows[rows.id == "2026_04_06_kimi_k2_5_b200_sxm_vllm_fp4_agg_8192x1024_c4_tp4_ep4_1301"]
    assert tuple(kimi[["tp_size", "attention_dp_size", "moe_ep_size"]].iloc[0]) == (4, 4, 16)
    assert _layout(rows, kimi.id.iloc[0]) == (None, 4, False)
    twin = ("kimi_k2_5_gap_analysis_kimi_k2_5_gap_analysis_b200_sxm_vllm_fp4_agg_1024x1024_c4"
            "_tp4_ep4_3")
    assert _layout(rows, twin) == (None, 4, False)
    fp8 = "2026_04_06_minimax_m2_5_h100_sxm_vllm_fp8_agg_1024x1024_c4_tp4_ep4_1357"
    assert _layout(rows, fp8) == (None, 4, True)
    assert _layout(rows, "minimaxm2_5_b300_vllm_fp4_agg_8192x1024_c512_cfg726") == (None, 2, True)
    assert _layout(rows, "minimaxm2_5_b300_vllm_fp4_agg_8192x1024_c512_cfg727")[0] == 2


def test_rows_keep_the_kv_cache_dtype_their_recipes_ran(rows):
    """A recipe that leaves the KV cache to the engine on a checkpoint without KV quantization
    ran a bf16 cache (vLLM's gpt-oss on H100; MiniMax-M2.5 on B200 before its recipe set fp8
    with vLLM 0.19.0); quantized rows whose recipes set fp8 keep fp8, as do P/D rows."""
    def kv(**match: object) -> str:
        sel = rows
        for k, v in match.items():
            sel = sel[sel[k] == v]
        return case_from_row(sel.iloc[0]).deployment.precision.kv_cache

    assert kv(backend="vllm", model_path="openai/gpt-oss-120b", system="h100_sxm") == "bf16"
    minimax = {"backend": "vllm", "model_path": "MiniMaxAI/MiniMax-M2.5", "precision": "fp8",
               "system": "b200_sxm"}
    assert kv(**minimax, backend_version="0.17.0") == "bf16"
    assert kv(**minimax, backend_version="0.19.0") == "fp8"
    assert kv(backend="vllm", model_path="openai/gpt-oss-120b", system="b200_sxm") == "fp8"
    dsr1 = {"backend": "sglang", "model_path": "deepseek-ai/DeepSeek-R1", "precision": "fp8",
            "system": "h200_sxm"}
    assert kv(**dsr1, mode="agg") == "bf16"
    pd_row = rows[(rows.backend == "sglang") & (rows.model_path == dsr1["model_path"])
                  & (rows.system == "h200_sxm") & (rows["mode"] == "disagg")].iloc[0]
    assert kv_cache_dtype(pd_row, "fp8") == "fp8"  # its multi-node recipe is not read

def test_tensorrt_llm_rows_batch_a_whole_prompt_as_its_recipes_do(rows):
    row = rows[(rows.backend == "trtllm") & (rows["mode"] == "agg") & (rows.isl == 8192)
               & (rows.concurrency == 256)].iloc[0]
    agg = case_from_row(row).deployment.aggregated
    assert agg is not None and agg.max_num_batched_tokens == 8512  # 256 + 8192 + 64, by 64
    vllm = rows[(rows.backend == "vllm") & (rows["mode"] == "agg") & (rows.isl == 1024)
                & (rows.model_path != "MiniMaxAI/MiniMax-M2.5")].iloc[0]
    other = case_from_row(vllm).deployment.aggregated
    assert other is not None and other.max_num_batched_tokens == 8192


def test_minimax_vllm_rows_batch_twice_the_prompt_from_vllm_0_19_on(rows):
    """MiniMax-M2.5's vLLM B200 recipe passes --max-num-batched-tokens of 2 x ISL since its move
    to vLLM 0.19.0; the rows measured on 0.17.0 keep the default."""
    mm = rows[(rows.backend == "vllm") & (rows.model_path == "MiniMaxAI/MiniMax-M2.5")
              & (rows.system == "b200_sxm") & (rows["mode"] == "agg") & (rows.isl == 1024)]
    new = case_from_row(mm[mm.backend_version == "0.19.0"].iloc[0]).deployment.aggregated
    old = case_from_row(mm[mm.backend_version == "0.17.0"].iloc[0]).deployment.aggregated
    assert new is not None and new.max_num_batched_tokens == 2048
    assert old is not None and old.max_num_batched_tokens == 8192


def test_rows_of_mtp_runs_decode_speculatively_as_their_recipes_did(rows):
    """InferenceX ran TensorRT-LLM 1.2.0rc6.post3 only in its DeepSeek-R1 MTP configurations,
    and its 2026-01-14 sweep on 1.1.0rc2.post2 added them: those rows draft 3 tokens (1 with
    attention DP); the same image on other days, and every other version, draft none."""
    def drafts(rid: str) -> int:
        agg = case_from_row(rows[rows.id == rid].iloc[0]).deployment.aggregated
        assert agg is not None
        return 0 if agg.speculative is None else agg.speculative.tokens

    day = "2026_04_06_deepseek_r1_b200_sxm_trtllm_"
    assert drafts(day + "fp8_agg_1024x8192_c4_tp8_ep1_68") == 3  # 1.2.0rc6.post3
    assert drafts(day + "fp4_agg_1024x8192_c64_tp8_ep8_981") == 3
    assert drafts(day + "fp4_agg_1024x1024_c256_tp4_ep4_946") == 1  # attention DP
    assert drafts(day + "fp8_agg_1024x8192_c4_tp8_ep8_978") == 3  # 1.1.0rc2.post2, 2026-01-14
    assert drafts(day + "fp8_agg_8192x1024_c64_tp8_ep8_963") == 0  # the same, 2025-12-15
    assert drafts(day + "fp4_agg_8192x1024_c128_tp4_ep1_4") == 0  # version not recorded
    assert drafts("2026_03_25_deepseek_r1_b200_sxm_trtllm_fp8_agg_1024x1024_c64_tp8_0_ep1_0"
                  "_1198") == 0  # 1.2.0rc6.post2
    mtp = case_from_row(rows[rows.id == day + "fp8_agg_1024x8192_c4_tp8_ep1_68"].iloc[0])
    agg = mtp.deployment.aggregated
    assert agg is not None and agg.speculative is not None
    assert agg.speculative.method == "mtp" and 0 < agg.speculative.acceptance < 1
