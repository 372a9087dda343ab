"""benchmarks/fit_serving_overhead.py: the API overhead's line in the prompt length."""


import numpy as np
import pytest

from tests.benchmarks.scripts import load_script

fit = load_script("fit_serving_overhead")


def test_the_median_line_ignores_a_stray_measurement():
    x = np.array([0.9, 0.9, 0.9, 7.4, 7.4, 7.4, 7.4])
    y = 20.0 + 10.0 * x
    y[3] = 5000.0  # one run that stalled
    fixed, slope = fit.median_line(x, y)
    assert slope == pytest.approx(10.0) and fixed == pytest.approx(20.0)


def test_one_prompt_length_gives_a_flat_line():
    fixed, slope = fit.median_line(np.full(5, 0.9), np.array([1.0, 2.0, 3.0, 4.0, 50.0]))
    assert (fixed, slope) == (3.0, 0.0)


def test_a_row_replays_its_client_s_mean_prompt():
    assert fit.prompt_ktokens({"isl": 8192}) == pytest.approx((6553 + 8192) / 2 / 1e3)


def test_the_step_overhead_is_the_median_time_per_decoder_layer(monkeypatch):
    """Each row's unexplained TPOT (the default step overhead plus its residual) divided by its
    model's decoder layers; the engine's median, floored at 0, and the same per layer signature
    with enough rows; a model the specs cannot read is left out."""
    import pandas as pd

    rows = pd.DataFrame({
        "backend": ["vllm", "vllm", "vllm", "vllm", "sglang", "sglang"],
        "model_path": ["openai/gpt-oss-120b", "MiniMaxAI/MiniMax-M2.5", "MiniMaxAI/MiniMax-M2.5",
                       "no-such/model", "openai/gpt-oss-120b", "openai/gpt-oss-120b"]})
    residuals = np.array([-0.1, 1.48, 2.72, 9.0, -2.0, -3.0])  # ms, measured - simulated TPOT
    monkeypatch.setattr(fit, "_residuals", lambda r, o, m, w: residuals[:len(r)])
    monkeypatch.setattr(fit, "MIN_SIGNATURE_ROWS", 2)
    assert fit.model_layers("openai/gpt-oss-120b") == 36.0
    assert np.isnan(fit.model_layers("no-such/model"))
    assert fit.model_signature("openai/gpt-oss-120b") == "gqa+swa_gqa"
    assert fit.model_signature("MiniMaxAI/MiniMax-M2.5") == "gqa"
    got, by_layers = fit.per_layer_steps(rows, workers=1)
    minimax = [(1.0 + 1.48) / 62, (1.0 + 2.72) / 62]
    assert got["vllm"] == (pytest.approx(minimax[0]), 3)  # the median of three
    assert got["sglang"] == (0.0, 2)  # a negative median is floored
    # MiniMax's two rows make a signature of their own; gpt-oss's one row does not
    assert by_layers["vllm"] == {"gqa": (pytest.approx(sum(minimax) / 2), 2)}
    assert by_layers["sglang"] == {"gqa+swa_gqa": (0.0, 2)}


def test_the_api_offset_per_layer_signature_is_what_its_rows_leave_above_the_fixed_part(
        monkeypatch):
    """The engine's line first (fixed part and slope), the hardware's own fixed part where it
    has enough rows, then per layer signature with enough rows the median of what is left:
    either sign, not floored."""
    import pandas as pd

    rows = pd.DataFrame({
        "backend": ["trtllm"] * 6,
        "model_path": ["openai/gpt-oss-120b"] * 3 + ["deepseek-ai/DeepSeek-R1"] * 3,
        "system": ["b200_sxm"] * 6, "isl": [1024] * 6})
    residuals = np.array([30.0, 31.0, 32.0, 130.0, 131.0, 133.0])  # ms, measured - simulated
    monkeypatch.setattr(fit, "_residuals", lambda *a, **k: residuals)
    monkeypatch.setattr(fit, "MIN_SIGNATURE_API_ROWS", 3)
    got = fit.api_lines(rows, {}, workers=1, layered={})["trtllm"]
    assert got.per_ktoken_ms == 0.0 and got.fixed_ms == pytest.approx(81.0)  # the median
    assert got.by_layers == {"gqa+swa_gqa": (pytest.approx(-50.0), 3),
                             "mla": (pytest.approx(50.0), 3)}
    entries = fit.layer_entries({"mla": (0.02, 9)}, got.by_layers)
    assert entries["mla"] == {"step_overhead_per_layer_ms": 0.02, "rows": 9,
                              "api_offset_ms": 50.0, "api_rows": 3}
    assert entries["gqa+swa_gqa"] == {"api_offset_ms": -50.0, "api_rows": 3}


def test_the_step_overhead_per_request_is_the_slope_of_the_loaded_rows_residual(monkeypatch):
    """A loaded row's TPOT residual grows with the requests its busiest rank runs: the slope
    (Theil-Sen) is the engine's time per request a step, floored at 0; an intercept the
    fixed parts left is not taken for it."""
    import pandas as pd

    rows = pd.DataFrame({"backend": ["vllm"] * 5 + ["sglang"] * 3,
                         "concurrency": [16, 32, 64, 128, 256, 16, 64, 256]})
    running = rows.concurrency.astype(float)
    residuals = np.where(rows.backend == "vllm", 0.5 + 0.02 * running, 3.0 - 0.001 * running)
    residuals[2] = 90.0  # a stray measurement
    monkeypatch.setattr(fit, "_residuals", lambda *a, **k: residuals)
    monkeypatch.setattr(fit, "requests_per_rank", lambda row: float(row.concurrency))
    got = fit.per_request_steps(rows, {}, workers=1, layered={})
    assert got["vllm"] == (pytest.approx(0.02), 5)
    assert got["sglang"] == (0.0, 3)  # a falling line is floored


def test_a_dep_row_runs_its_users_over_its_dp_ranks():
    from simulator.validate import load_rows

    rows = load_rows()
    dep = rows[rows.id == "minimaxm2_5_b300_vllm_fp4_agg_1024x1024_c2048_cfg727"]
    tp = rows[rows.id == "minimaxm2_5_b200_vllm_fp8_agg_1024x1024_c64_cfg634"]
    # recorded as attention DP 4, run by its script as TP4 with expert parallelism
    tp_ep = rows[rows.id == ("2026_04_06_minimax_m2_5_b200_sxm_vllm_fp8_agg_1024x1024_c64_tp4_ep4_"
                             "1392")]
    assert fit.requests_per_rank(dep.iloc[0]) == 1024.0  # DEP2: 2,048 users on 2 ranks
    assert fit.requests_per_rank(tp.iloc[0]) == 64.0
    assert fit.requests_per_rank(tp_ep.iloc[0]) == 64.0


def test_the_pd_time_per_request_is_read_within_each_deployment(monkeypatch):
    """P/D rows: the slope between every two rows of one deployment at different loads, so
    that what differs between deployments (another model's or system's error) is not taken for
    a time per request; rows past FIT_MAX_LOADED_CONCURRENCY requests a rank are left out."""
    import pandas as pd

    layout = {c: "x" for c in fit.DEPLOYMENT_COLUMNS if c not in ("backend", "system")}
    rows = pd.DataFrame([{**layout, "backend": "vllm", "system": s, "concurrency": c}
                         for s, c in [("a", 8), ("a", 64), ("a", 4096), ("b", 32), ("b", 128)]]
                        + [{**layout, "backend": "sglang", "system": "a", "concurrency": c}
                           for c in (16, 48)])
    running = rows.concurrency.astype(float)
    # deployment a falls 0.01 ms a request from +2; b sits 6 ms higher and rises 0.002;
    # a line through all of them would read a positive slope off the step between a and b
    residuals = np.where(rows.system == "a", 2.0 - 0.01 * running, 8.0 + 0.002 * running)
    residuals[rows.backend == "sglang"] = [1.0, 1.8]
    residuals[2] = 500.0  # 4,096 requests a rank: past the loads the fit reads
    monkeypatch.setattr(fit, "_residuals", lambda some, *a, **k: residuals[some.index])
    monkeypatch.setattr(fit, "requests_per_rank", lambda row: float(row.concurrency))
    got = fit.per_request_within(rows, {}, workers=1, layered={})
    assert got["vllm"] == (pytest.approx(0.0), 2)  # median of -0.01 and +0.002 is < 0: floored
    assert got["sglang"] == (pytest.approx(0.025), 1)
    pooled = fit.per_request_steps(rows[rows.backend == "vllm"].drop(index=2),
                                   {}, workers=1, layered={})
    assert pooled["vllm"][0] > 0  # the line through both deployments


def test_the_pd_refit_reads_the_shipped_api_fit_as_the_full_fit_built_it():
    """`--pd` refits the handoff on the shipped aggregated fit: each engine's latencies, the
    fixed API part of a hardware preset that has its own, the API offset of a layer signature,
    and the P/D rows' own time per request in place of the aggregated one."""
    doc = {"engines": {"vllm": {
        "step_overhead_ms": 0.0, "step_overhead_per_layer_ms": 0.02,
        "step_overhead_per_seq_ms": 0.0279, "api_overhead_ms": 100.0, "api_per_ktoken_ms": 9.7,
        "layers": {"mla": {"step_overhead_per_layer_ms": 0.03, "rows": 9, "api_offset_ms": -20.0,
                           "api_rows": 11}},
        "hardware": {"gb200": {"api_overhead_ms": 140.0, "rows": 12}}}}}
    api, offsets = fit.shipped_api(doc)
    assert api["vllm"].api_overhead_ms == 100.0 and api["vllm"].api_per_ktoken_ms == 9.7
    assert api["vllm"].step_overhead_per_layer_ms == 0.02
    assert api["vllm", "gb200"].api_overhead_ms == 140.0
    assert api["vllm", "gb200"].api_per_ktoken_ms == 9.7
    assert offsets == {("vllm", "mla"): -20.0}
    pd_api = fit.with_pd_per_request(api, {"vllm": (0.0, 1)})
    assert pd_api["vllm"].step_overhead_per_seq_ms == 0.0
    assert pd_api["vllm", "gb200"].step_overhead_per_seq_ms == 0.0
    assert api["vllm"].step_overhead_per_seq_ms == 0.0279  # the aggregated fit is left as it was
