"""Each page of the UI run headless with Streamlit's AppTest: what a user sees after acting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from app.deploying import read_plan_path
from app.inputs import CustomTraffic, custom_workload
from app.whatif import run_whatif
from simulator.specs.loading import load_deployment
from tests.app.fakes import FakeBackend, fake_bench, outcome_of, record

ROOT = Path(__file__).resolve().parents[2]
VIEWS = ROOT / "app" / "views"
EXAMPLE = ROOT / "examples" / "deepseek-v3-h200-pd.yaml"
AGENTX_TRACE = ROOT / "examples" / "traces" / "agentx-sample.jsonl"
TIMEOUT = 120


def page(name: str) -> AppTest:
    at = AppTest.from_file(str(VIEWS / f"{name}.py"), default_timeout=TIMEOUT)
    at.run()
    assert not at.exception
    return at


def no_problem(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def test_main_opens_on_what_if() -> None:
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=TIMEOUT)
    at.run()
    no_problem(at)
    assert at.title[0].value == "What-if"
    at.switch_page("views/search.py").run()
    no_problem(at)
    assert at.title[0].value == "Search"


def test_what_if_run_shows_metric_cards_and_charts() -> None:
    at = page("what_if")
    at.number_input(key="wi_wl_requests").set_value(200)
    at.number_input(key="wi_wl_output").set_value(200)
    at.button(key="wi_run").click().run()
    no_problem(at)
    cards = {m.label: m.value for m in at.metric}
    assert set(cards) >= {"Throughput / GPU", "TTFT p50", "TTFT p90", "TPOT p50", "TPOT p90",
                          "tok/s/user p50", "tok/s/user p90"}
    expected = run_whatif(load_deployment(EXAMPLE), custom_workload(
        CustomTraffic(requests=200, output_tokens=200))).metrics
    assert cards["Throughput / GPU"] == f"{expected['throughput_tok_s_gpu']:,.0f} tok/s"
    assert cards["TPOT p90"] == f"{expected['tpot_ms']['p90']:,.1f} ms"
    # latency, throughput, timelines per role and per instance, prefix cache, step time,
    # expert load of prefill and of decode
    assert len(at.get("plotly_chart")) == 8
    assert any("imbalance" in c.value for c in at.caption)
    assert at.multiselect(key="wi_tl_pick").value == ["prefill-0", "decode-0"]


def test_what_if_of_deepseek_v4_on_agentx_sessions() -> None:
    """An example deployment fills the form (V4-Flash on GB300, P/D); AgentX sessions show
    their prefix-cache hits and TTFT by turn depth."""
    at = page("what_if")
    at.selectbox(key="wi_example").set_value("deepseek-v4-flash-gb300-pd").run()
    assert at.selectbox(key="wi_model").value == "deepseek-v4-flash"
    assert at.selectbox(key="wi_indexer").value == "fp4"
    assert at.number_input(key="wi_decode_dep").value == 16
    at.radio(key="wi_wl_source").set_value("agentx").run()
    at.number_input(key="wi_wl_preset_requests").set_value(40)
    at.button(key="wi_run").click().run()
    no_problem(at)
    cards = {m.label: m.value for m in at.metric}
    assert float(cards["Prefix-cache hits"].removesuffix(" %")) > 50
    assert at.session_state["whatif"].cache.ttft_by_depth["0"]["p90"] is not None
    assert any(c.value.startswith("Turn depth") or "of input tokens came from the prefix "
               "cache" in c.value for c in at.caption)


def test_a_cancelled_run_says_so_and_keeps_the_page() -> None:
    """What the Cancel button's callback leaves for the next run of the page (the click itself
    interrupts the running script, which AppTest cannot do mid-run)."""
    at = page("what_if")
    at.session_state["wi_cancelled"] = True
    at.run()
    no_problem(at)
    assert at.info[0].value.startswith("Simulation cancelled")
    at.run()
    assert not any(i.value.startswith("Simulation cancelled") for i in at.info)


def test_what_if_replays_uploaded_agentx_traces() -> None:
    at = page("what_if")
    at.radio(key="wi_wl_source").set_value("upload a trace").run()
    at.radio(key="wi_wl_trace_format").set_value("AgentX session traces").run()
    at.file_uploader(key="wi_wl_trace").upload(
        "agentx.jsonl", AGENTX_TRACE.read_bytes(), "application/jsonl").run()
    at.number_input(key="wi_wl_trace_requests").set_value(24)
    at.number_input(key="wi_wl_trace_sessions").set_value(4)
    at.button(key="wi_run").click().run()
    no_problem(at)
    w = at.session_state["whatif"]
    assert w.workload.arrival.kind == "sessions" and w.workload.arrival.concurrency == 4
    assert w.result.completed == 24 and w.cache.hit_share > 0


def test_what_if_aggregated_layout() -> None:
    at = page("what_if")
    at.radio(key="wi_layout").set_value("aggregated").run()
    at.number_input(key="wi_aggregated_instances").set_value(2)
    at.number_input(key="wi_wl_requests").set_value(100)
    at.number_input(key="wi_wl_output").set_value(100)
    at.button(key="wi_run").click().run()
    no_problem(at)
    assert any("on 16 GPUs" in c.value for c in at.caption)
    assert {m.label for m in at.metric} >= {"Throughput / GPU", "TPOT p90"}


def test_what_if_bad_input_is_an_error_not_a_traceback() -> None:
    at = page("what_if")
    at.number_input(key="wi_prefill_redundant").set_value(1)
    at.number_input(key="wi_wl_requests").set_value(200)
    at.button(key="wi_run").click().run()
    assert not at.exception
    assert len(at.error) == 1
    assert "dep=8 must divide routed+redundant experts (256+1=257)" in at.error[0].value
    assert not at.metric


def test_what_if_trace_source_without_a_file_says_so() -> None:
    at = page("what_if")
    at.radio(key="wi_wl_source").set_value("upload a trace").run()
    at.button(key="wi_run").click().run()
    assert not at.exception
    assert "no trace uploaded" in at.error[0].value


def test_search_small_run_shows_front_and_table(tmp_path: Path) -> None:
    at = page("search")
    at.selectbox(key="se_model").set_value("deepseek-v3")
    at.selectbox(key="se_hardware").set_value("h200")
    at.number_input(key="se_gpus").set_value(32)
    at.radio(key="se_wl_source").set_value("custom traffic").run()
    at.selectbox(key="se_wl_arrival").set_value("poisson").run()
    at.number_input(key="se_wl_rate").set_value(5.0)
    at.number_input(key="se_wl_requests").set_value(200)
    at.number_input(key="se_wl_output").set_value(200)
    at.number_input(key="se_user").set_value(0.0)
    at.number_input(key="se_trials").set_value(12)
    at.text_input(key="se_storage").set_value(f"sqlite:///{tmp_path / 'ui.db'}")
    at.button(key="se_run").click().run()
    no_problem(at)
    assert at.success[0].value.startswith("Chosen plan (trial ")
    assert any(c.value.startswith("Why this plan: ") for c in at.caption)
    assert len(at.get("plotly_chart")) == 1
    reasons = at.dataframe[0].value
    assert set(reasons.columns) == {"stage", "reason", "trials"}
    table = at.dataframe[1].value
    assert len(table) >= 2 and table["standing"].iloc[0] == "chosen"
    assert list(table.columns)[-1] == "plan"
    diff = at.dataframe[2].value
    assert {"role", "knob", "differs"} <= set(diff.columns)
    compared = at.dataframe[3].value
    assert "tok/s per GPU" in list(compared[""])
    plan = at.session_state["plan"]
    assert plan.origin == "the Search page" and plan.plan["predicted"]["completed"] == 200
    searched = at.session_state["search"]
    assert searched.config.refine == 10  # the page refines as `rackplan search` does
    assert any(r.get("number", 0) >= 12 for r in searched.records)  # the refinement's trials


def small_search(tmp_path: Path, **fields: Any) -> AppTest:
    """The search page run on DeepSeek-V3 on 16 H200, 16 short requests, 4 trials, no
    tokens/s-per-user SLO; `fields` sets more inputs by key (numbers or text)."""
    at = page("search")
    at.selectbox(key="se_model").set_value("deepseek-v3")
    at.selectbox(key="se_hardware").set_value("h200")
    at.number_input(key="se_gpus").set_value(16)
    at.radio(key="se_wl_source").set_value("custom traffic").run()
    at.number_input(key="se_wl_requests").set_value(16)
    at.number_input(key="se_wl_output").set_value(16)
    at.number_input(key="se_user").set_value(0.0)
    at.number_input(key="se_trials").set_value(4)
    for key, value in fields.items():
        widget = at.text_input(key=key) if isinstance(value, str) else at.number_input(key=key)
        widget.set_value(value)
    at.text_input(key="se_storage").set_value(f"sqlite:///{tmp_path / 'ui.db'}")
    at.button(key="se_run").click().run()
    return at


def test_an_infeasible_search_shows_reasons_and_what_would_help(tmp_path: Path) -> None:
    at = small_search(tmp_path, se_ttft=0.001)  # no plan can meet it
    no_problem(at)
    warning = at.warning[0].value
    assert "No plan met the SLOs" in warning and "--loads auto" in warning
    assert "more GPUs than 16" in warning
    reasons = at.dataframe[0].value
    assert (reasons["trials"] > 0).all() and reasons["trials"].sum() == 4
    assert not at.get("plotly_chart")  # no empty Pareto chart
    closest = [m.value for m in at.markdown if m.value.startswith("**Closest miss")]
    assert closest, [m.value for m in at.markdown]
    if "(trial" in closest[0]:  # a trial was simulated: each SLO against it
        assert "ttft_p90_ms <= 0.001" in list(at.dataframe[1].value["SLO"])


def test_search_with_the_load_searched_draws_the_curves(tmp_path: Path) -> None:
    at = small_search(tmp_path, se_loads="2,8")
    no_problem(at)
    assert " at " in at.success[0].value  # the chosen plan names its load
    assert len(at.get("plotly_chart")) == 2  # the curves, and the front


def test_the_diff_of_a_pd_and_an_aggregated_plan() -> None:
    """A finished search put in the session (nothing simulated): plans A and B default to a
    P/D and an aggregated plan, whose knobs stand side by side by role."""
    at = AppTest.from_file(str(VIEWS / "search.py"), default_timeout=TIMEOUT)
    at.session_state["search"] = outcome_of([record(0, 100.0, 50.0, True, 8),
                                             record(1, 80.0, 40.0, True, 24),
                                             record(2, 90.0, 45.0, True, 16, True)])
    at.run()
    no_problem(at)
    assert at.selectbox(key="se_diff_b").value == 2  # the first plan of another layout
    diff = at.dataframe[2].value
    assert {"A · prefill", "A · decode", "B · aggregated"} <= set(diff.columns)
    dep = diff[(diff["role"] == "per role") & (diff["knob"] == "dep")].iloc[0]
    assert (dep["A · decode"], dep["B · aggregated"]) == ("8", "16")
    compared = at.dataframe[3].value
    assert list(compared.columns) == ["", "A: trial 0", "B: trial 2", "differs"]
    at.selectbox(key="se_diff_b").set_value(1).run()
    assert set(at.dataframe[2].value.columns) >= {"B · prefill", "B · decode"}


def test_compare_uploaded_plans_as_rackplan_compare() -> None:
    at = page("search")
    uploader = at.file_uploader(key="se_compare_files")
    for name in ("tiny-moe-cpu-agg.yaml", "tiny-moe-cpu-pd.yaml"):
        uploader.upload(name, (ROOT / "examples" / name).read_bytes(), "application/x-yaml")
    uploader.run()
    no_problem(at)
    table = at.dataframe[0].value
    assert list(table.columns) == ["", "A: tiny-moe-cpu-agg.yaml", "B: tiny-moe-cpu-pd.yaml",
                                   "differs"]
    assert table[table[""] == "deployment"]["differs"].iloc[0]


def test_search_bad_slo_is_an_error() -> None:
    at = page("search")
    at.text_area(key="se_extra").set_value("ttft_p90=3")
    at.button(key="se_run").click().run()
    assert not at.exception
    assert "unknown metric 'ttft_p90'" in at.error[0].value


AGGREGATED = ROOT / "examples" / "tiny-moe-cpu-agg.yaml"


def deploy_page(plan: Path = EXAMPLE) -> AppTest:
    at = page("deploy")
    at.radio(key="dp_source").set_value("a path on this machine").run()
    at.text_input(key="dp_path").set_value(str(plan)).run()
    return at


def test_deploy_shows_the_local_processes_and_the_proxy_of_a_pd_plan() -> None:
    at = page("deploy")
    assert "No plan yet" in at.info[0].value
    at = deploy_page()
    no_problem(at)
    commands = at.code[0].value
    assert commands.count("vllm serve deepseek-v3") == 9
    assert "--data-parallel-size 40" in commands and "kv_consumer" in commands
    rows = at.dataframe[0].value
    assert len(rows) == 9 and "host" not in rows.columns
    assert any(e.label.startswith("P/D proxy") for e in at.expander)


def test_an_aggregated_plan_has_no_proxy_panel() -> None:
    at = deploy_page(AGGREGATED)
    no_problem(at)
    assert "vllm serve" in at.code[0].value
    assert not any("P/D" in e.label or "proxy" in e.label for e in at.expander)
    assert not any("P/D" in m.value for m in at.markdown)


@pytest.mark.parametrize(("flavor", "kind"), [("llm-d", "LeaderWorkerSet"),
                                              ("dynamo", "DynamoGraphDeployment"),
                                              ("kserve", "LLMInferenceService")])
def test_deploy_shows_each_flavors_manifests(flavor: str, kind: str) -> None:
    at = deploy_page()
    at.selectbox(key="dp_target").set_value("kubernetes").run()
    at.selectbox(key="dp_flavor").set_value(flavor).run()
    no_problem(at)
    manifests = [c for c in at.code if c.language == "yaml"]
    assert manifests and f"kind: {kind}" in manifests[0].value
    assert not any("host0" in c.value for c in at.code)  # manifests, not command lines
    assert any(e.label == "kubernetes/kustomization.yaml" for e in at.expander)
    assert not at.dataframe  # no per-host process table for a cluster
    assert at.get("download_button")[0].proto.label == "Download the folder (.zip)"


def test_deploy_from_the_search_page_plan(tmp_path: Path) -> None:
    at = AppTest.from_file(str(VIEWS / "deploy.py"), default_timeout=TIMEOUT)
    at.session_state["plan"] = read_plan_path(EXAMPLE)
    at.run()
    no_problem(at)
    assert "vllm serve deepseek-v3" in at.code[0].value


@pytest.mark.parametrize("target", ["kubernetes", "slurm"])
def test_deploy_dry_run_writes_the_targets_files(tmp_path: Path, target: str) -> None:
    at = deploy_page()
    at.selectbox(key="dp_target").set_value(target)
    at.text_input(key="dp_runs").set_value(str(tmp_path)).run()
    no_problem(at)
    shown = [e.label for e in at.expander]
    at.button(key="dp_deploy").click().run()
    no_problem(at)
    written = sorted(p.relative_to(next(tmp_path.iterdir())).as_posix()
                     for p in tmp_path.rglob("*") if p.is_file())
    assert written == sorted(shown)  # the files the page shows are the ones written
    assert any(f"{target} files (dry run" in m.value for m in at.success)


def test_deploy_bad_path_is_an_error() -> None:
    at = page("deploy")
    at.radio(key="dp_source").set_value("a path on this machine").run()
    at.text_input(key="dp_path").set_value("no/such/plan.yaml").run()
    assert not at.exception
    assert "'no/such/plan.yaml' is not a file" in at.error[0].value


def test_deploy_local_launch_status_bench_and_teardown(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    """The Deploy button's whole local flow, with a backend and a benchmark that start
    nothing: launch in a worker thread, live status, benchmark report, teardown."""
    monkeypatch.setattr("app.deploying._backend_class", lambda target: FakeBackend)
    monkeypatch.setattr("app.deploying.bench_function", lambda: fake_bench)
    monkeypatch.setattr("app.deploying.probe", lambda url, timeout_s=1.0: url.endswith(":8100"))
    monkeypatch.setattr("executor.backends.local.gpus_here", lambda: 72)  # a 72-GPU machine
    monkeypatch.setattr(FakeBackend, "calls", [])
    at = page("deploy")
    at.radio(key="dp_source").set_value("a path on this machine").run()
    at.text_input(key="dp_path").set_value(str(EXAMPLE)).run()
    at.text_input(key="dp_runs").set_value(str(tmp_path))
    at.number_input(key="dp_timeout").set_value(60)
    at.button(key="dp_deploy").click().run()
    no_problem(at)
    job = at.session_state["deploy"]
    job.job.join(30)
    at.run()
    no_problem(at)
    assert FakeBackend.calls == ["launch", "wait 60"]
    assert "**Local deployment:** ready" in [m.value for m in at.markdown]
    status = at.dataframe[1].value
    assert list(status["status"]) == ["healthy"] + ["not answering"] * 4
    at.button(key="dp_bench").click().run()
    at.session_state["bench"].join(30)
    at.run()
    no_problem(at)
    report = at.dataframe[2].value
    assert list(report["metric"]) == ["ttft_ms.p50", "tpot_ms.p50"]
    assert list(report["error %"]) == [25.0, -5.0]
    at.button(key="dp_teardown").click().run()
    no_problem(at)
    assert FakeBackend.calls[-1] == "teardown"
    assert "**Local deployment:** stopped" in [m.value for m in at.markdown]
