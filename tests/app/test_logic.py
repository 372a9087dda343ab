"""The UI's plain functions: forms to specs, what a simulation shows, search tables, deploy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app import charts
from app.deploying import (
    LocalDeploy,
    command_rows,
    comparison_rows,
    head_urls,
    instance_status,
    live_rows,
    plan_source,
    read_plan_path,
    read_plan_text,
    render_for,
)
from app.inputs import (
    DEFAULT_ROLES,
    CustomTraffic,
    DeploymentKnobs,
    RoleKnobs,
    agentx_workload,
    build_deployment,
    custom_workload,
    example_knobs,
    knobs_of,
    preset_workload,
    save_trace,
    trace_workload,
)
from app.searching import (
    SearchForm,
    closest_rows,
    compare_files,
    compare_rows,
    front_points,
    has_points,
    progress_text,
    role_diff,
    search_config,
    slos_of,
    top_plans,
)
from app.whatif import (
    downsample,
    instances_by_role,
    linear_placement,
    metric_cards,
    role_series,
    run_whatif,
    sample,
    throughput_series,
)
from planner import defaults
from planner.objectives import SLO
from simulator.des import Timeline
from simulator.eplb import identity_placement
from simulator.resolve import resolve
from simulator.specs.errors import SpecError
from simulator.specs.loading import load_deployment
from simulator.specs.workload import Workload
from tests.app.fakes import FakeBackend, outcome_of, record

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "deepseek-v3-h200-pd.yaml"
TRACE = ROOT / "tests" / "data" / "mooncake_conversation_50.jsonl"
AGENTX = ROOT / "examples" / "traces" / "agentx-sample.jsonl"
SMALL = CustomTraffic(requests=200, concurrency=128, input_tokens=2000, output_tokens=200)


# --- forms -> specs ----------------------------------------------------------------------------


def test_default_knobs_are_the_example_deployment() -> None:
    assert build_deployment(DeploymentKnobs()) == load_deployment(EXAMPLE)


def test_aggregated_knobs_and_mtp() -> None:
    roles = {**DEFAULT_ROLES, "aggregated": RoleKnobs(instances=2, dep=16, redundant_experts=16,
                                                      mtp_tokens=2, mtp_acceptance=0.6)}
    d = build_deployment(DeploymentKnobs(layout="aggregated", gpu_budget=40, roles=roles))
    assert d.aggregated is not None and d.prefill is None and d.gpus == 40
    assert d.aggregated.speculative is not None and d.aggregated.speculative.tokens == 2
    assert d.gpus_used == 32


def test_bad_knobs_name_the_value() -> None:
    roles = {**DEFAULT_ROLES, "prefill": RoleKnobs(instances=4, dep=8, redundant_experts=1)}
    with pytest.raises(SpecError, match=r"dep=8 must divide routed\+redundant"):
        resolve(build_deployment(DeploymentKnobs(roles=roles)))
    with pytest.raises(SpecError, match="gpus=8"):
        build_deployment(DeploymentKnobs(gpu_budget=8))


def test_custom_traffic() -> None:
    w = custom_workload(CustomTraffic(arrival="poisson", rate=3.0, spread=0.5, requests=10))
    assert w.arrival.kind == "poisson" and w.requests == 10
    assert w.input_tokens.kind == "lognormal" and w.output_tokens.kind == "lognormal"
    assert custom_workload(SMALL).input_tokens.kind == "fixed"
    with pytest.raises(SpecError, match="concurrency=0 must be >= 1"):
        custom_workload(CustomTraffic(concurrency=0))


def test_presets_and_traces(tmp_path: Path) -> None:
    w = preset_workload("agentic", requests=50, seed=3)
    assert (w.requests, w.seed) == (50, 3) and w.sessions is not None
    with pytest.raises(SpecError, match="presets: agentic"):
        preset_workload("nope")
    path = save_trace("my trace.jsonl", TRACE.read_bytes(), tmp_path)
    assert path.name == "my_trace.jsonl"
    assert trace_workload(path, 20).arrival.kind == "trace"
    with pytest.raises(SpecError, match=r"\.jsonl"):
        save_trace("trace.txt", b"", tmp_path)
    bad = save_trace("bad.csv", b"timestamp,input_length\n0,5\n", tmp_path)
    with pytest.raises(SpecError, match="output_length"):
        trace_workload(bad, 10)


def test_agentx_traces(tmp_path: Path) -> None:
    path = save_trace("agentx.jsonl", AGENTX.read_bytes(), tmp_path, agentx=True)
    w = agentx_workload(path, concurrency=4, requests=30)
    assert w.arrival.kind == "sessions" and w.arrival.traces == str(path)
    with pytest.raises(SpecError, match=r"\.json"):
        save_trace("agentx.csv", b"", tmp_path, agentx=True)
    broken = save_trace("broken.jsonl", b"{nope\n", tmp_path, agentx=True)
    with pytest.raises(SpecError, match="not valid JSON"):
        agentx_workload(broken, 4, 30)


def test_examples_fill_the_form() -> None:
    knobs = example_knobs()
    assert {"deepseek-v3-h200-pd", "deepseek-v4-flash-gb300-pd"} <= set(knobs)
    v4 = knobs["deepseek-v4-flash-gb300-pd"]
    assert (v4.model, v4.hardware, v4.indexer_cache) == ("deepseek-v4-flash", "gb300", "fp4")
    assert v4.roles["decode"].mtp_tokens == 1
    for name, k in knobs.items():  # the form holds each example exactly
        assert build_deployment(k) == read_plan_path(ROOT / "examples" / f"{name}.yaml"
                                                     ).deployment, name
    with pytest.raises(SpecError, match="no knob"):
        knobs_of(load_deployment({"model": "deepseek-v3", "hardware": "h200",
                                  "aggregated": {"tp": 8}}))


# --- what-if -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def whatif() -> Any:
    return run_whatif(load_deployment(EXAMPLE), custom_workload(SMALL))


def test_whatif_refuses_turns_past_the_models_context() -> None:
    """As `rackplan simulate` does: AgentX's corpus on DeepSeek-V3's 160K context."""
    from simulator.specs.workload import SessionsArrival
    agentx = Workload(arrival=SessionsArrival(concurrency=8), requests=20)
    with pytest.raises(SpecError, match=r"session turns .* deepseek-v3's context of 163,840"):
        run_whatif(load_deployment(EXAMPLE), agentx)


def test_whatif_matches_the_simulation(whatif: Any) -> None:
    m = whatif.metrics
    assert m["completed"] == 200 and m["gpus"] == 72
    cards = {c.label: c.value for c in metric_cards(m)}
    assert cards["Throughput / GPU"] == f"{m['throughput_tok_s_gpu']:,.0f} tok/s"
    assert cards["TTFT p90"] == f"{m['ttft_ms']['p90']:,.0f} ms"
    assert cards["tok/s/user p50"] == f"{m['tok_s_user']['p50']:,.1f}"


def test_role_series_add_up_the_instances(whatif: Any) -> None:
    r = whatif.result
    series = role_series(r, points=50)
    assert list(series) == ["prefill", "decode"]
    assert series["prefill"].instances == 4 and series["decode"].instances == 1
    by_role = instances_by_role(r)
    assert by_role["prefill"] == ["prefill-0", "prefill-1", "prefill-2", "prefill-3"]
    grid = series["prefill"].time
    parts = [sample(r.timelines[n], grid) for n in by_role["prefill"]]
    assert np.array_equal(series["prefill"].batch, sum(p[1] for p in parts))
    assert np.allclose(series["prefill"].kv_use, sum(p[2] for p in parts) / 4)
    t = r.timelines["decode-0"]
    q, _, _ = sample(t, np.array([-1.0, t.time[0], t.time[-1] + 1]))
    assert list(q) == [0.0, t.queue[0], t.queue[-1]]


def test_cache_view_splits_the_input_tokens(whatif: Any) -> None:
    view, r = whatif.cache, whatif.result
    assert sum(view.tiers.values()) == r.cached_input_tokens + r.uncached_input_tokens
    assert view.hit_share == pytest.approx(whatif.metrics["cache_hit_share"])
    assert set(view.ttft_by_depth) == {"0"}  # no sessions: every turn is the first


def test_throughput_series_averages_to_the_reported_output(whatif: Any) -> None:
    t, v = throughput_series(whatif.result, bins=40)
    assert len(t) == len(v) == 40 and (v >= 0).all()
    width = whatif.result.duration_s / 40
    assert v.sum() * width / whatif.result.duration_s == pytest.approx(
        whatif.metrics["output_tok_s_gpu"], rel=1e-9)


def test_expert_load_is_the_simulators(whatif: Any) -> None:
    assert set(whatif.experts) == {"prefill", "decode"}
    for role, view in whatif.experts.items():
        assert view.before.shape == view.after.shape == (58, view.ranks)
        np.testing.assert_allclose(view.after.sum(axis=1), 1.0)
        assert view.imbalance_after == pytest.approx(
            whatif.result.instances[f"{role}-0"].expert_imbalance)
        assert view.imbalance_before > 3 * view.imbalance_after


def test_step_views_price_each_role(whatif: Any) -> None:
    assert set(whatif.steps) == {"prefill", "decode"}
    for view in whatif.steps.values():
        assert view.step.total_ms > 0
        assert sum(view.step.breakdown.values()) == pytest.approx(view.step.total_ms)


def test_linear_placement() -> None:
    none = linear_placement(3, 8, 0)
    ident = identity_placement(3, 8)
    np.testing.assert_array_equal(none.phy2log, ident.phy2log)
    p = linear_placement(2, 8, 4)
    assert p.slots == 12 and list(p.replicas[0]) == [2, 2, 2, 2, 1, 1, 1, 1]
    assert sorted(p.log2phy[0, 0]) == [0, 8]


def test_downsample_keeps_the_ends() -> None:
    n = 10_001
    t = Timeline(np.arange(n, dtype=float), np.zeros(n, np.int64), np.arange(n), np.zeros(n))
    d = downsample(t, 1000)
    assert len(d.time) <= 1001 and d.time[0] == 0 and d.time[-1] == n - 1
    assert downsample(t, n) is t


def test_charts(whatif: Any) -> None:
    r, m = whatif.result, whatif.metrics
    assert len(charts.timelines_figure(r).data) == 3 * len(r.timelines)
    assert len(charts.timelines_figure(r, ["decode-0"]).data) == 3
    assert len(charts.role_timelines_figure(role_series(r)).data) == 3 * 2
    assert len(charts.cache_figure(whatif.cache).data) == 3 + 2
    assert len(charts.latency_histograms(r, m).data) == 2
    assert len(charts.breakdown_figure(whatif.steps, m["step_breakdown"]).data) == 6
    fig = charts.expert_figure(whatif.experts["decode"], 0)
    assert [len(tr.y) for tr in fig.data] == [40, 40]
    t, v = throughput_series(r)
    assert len(charts.throughput_figure(t, v, 1.0).data) == 1


# --- search ------------------------------------------------------------------------------------


def _form(**kw: Any) -> SearchForm:
    return SearchForm(**{"model": "deepseek-v3", "hardware": "h200", "gpus": 32,
                         "workload": Workload(requests=10), **kw})


def test_search_form() -> None:
    slos = slos_of(_form(ttft_p90_ms=2000, tok_s_user_p90=20, extra_slos="ttft_p90_ms=900\n"))
    assert slos == (SLO("tok_s_user_p90", 20.0), SLO("ttft_p90_ms", 900.0))
    with pytest.raises(SpecError, match="unknown metric 'nope'"):
        slos_of(_form(extra_slos="nope=1"))
    with pytest.raises(SpecError, match="pick at least one layout"):
        search_config(_form(layouts=()))
    with pytest.raises(SpecError, match="--gpus=0"):
        search_config(_form(gpus=0))
    config = search_config(_form(layouts=("pd",), trials=5, study=" mine "))
    assert config.space.layouts == ("pd",) and config.study_name() == "mine"
    assert config.refine == defaults.REFINE  # as `rackplan search` refines
    assert search_config(_form(refine=0)).refine == 0
    with pytest.raises(SpecError, match="refinement rounds=-1 must be >= 0"):
        search_config(_form(refine=-1))
    assert progress_text(3, 12, "best 5 tok/s/GPU") == "trial 3 of 12 · best 5 tok/s/GPU"
    assert progress_text(20, 12, "b") == "12 trials and 8 more around the best plans · b"
    from simulator.specs.workload import SessionsArrival
    with pytest.raises(SpecError, match="session turns"):  # AgentX's turns past V3's context
        search_config(_form(workload=Workload(arrival=SessionsArrival(concurrency=8),
                                              requests=20)))


def test_front_table_and_diff() -> None:
    recs = [record(0, 100.0, 50.0, True, 8), record(1, 200.0, 20.0, True, 16),
            record(2, 150.0, 10.0, True, 24), record(3, 300.0, 5.0, False, 32),
            {**record(4, 200.0, 20.0, True, 16), "reused": 1},
            {"number": 5, "stage": "rejected", "reason": "too big"}]
    o = outcome_of(recs)
    points = {p["trial"]: p for p in front_points(o)}
    assert set(points) == {0, 1, 2, 3}
    assert [t for t, p in points.items() if p["front"]] == [0, 1]
    assert not points[3]["feasible"]
    rows = top_plans(o)
    assert [r["trial"] for r in rows] == [1, 2, 0, 3]
    assert [r["standing"] for r in rows] == ["chosen", "meets SLOs", "Pareto front",
                                             "misses SLOs"]
    assert list(rows[0])[-1] == "plan"  # the long text last: a narrow page cuts words
    diff = {r["knob"]: r for r in role_diff(recs[0], recs[1]) if r["role"] == "per role"}
    assert diff["dep"]["A · decode"] == "8" and diff["dep"]["B · decode"] == "16"
    assert diff["dep"]["differs"] and not diff["instances"]["differs"]
    cmp = {r[""]: r for r in compare_rows(recs[0], recs[1], o.config)}
    assert cmp["tok/s per GPU"]["A: trial 0"] == "100.0" and cmp["tok/s per GPU"]["differs"]
    assert not cmp["model"]["differs"]


def test_diff_of_a_pd_and_an_aggregated_plan_puts_the_roles_side_by_side() -> None:
    pd, agg = record(0, 100.0, 50.0, True, 8), record(1, 90.0, 40.0, True, 16, True)
    rows = role_diff(pd, agg)
    assert set(rows[0]) == {"role", "knob", "A · prefill", "A · decode", "B · aggregated",
                            "differs"}
    per = {r["knob"]: r for r in rows if r["role"] == "per role"}
    assert (per["dep"]["A · prefill"], per["dep"]["A · decode"],
            per["dep"]["B · aggregated"]) == ("8", "8", "16")
    assert per["max_num_seqs"]["B · aggregated"] == "64" and per["max_num_seqs"]["differs"]
    assert per["max_num_seqs"]["A · decode"] == "-"  # the knob not given, not another layout
    common = {r["knob"]: r for r in rows if r["role"] == "all"}
    assert not common["model"]["differs"]


def test_compare_files_is_rackplan_compare(tmp_path: Path) -> None:
    a, b = (ROOT / "examples" / f"tiny-moe-cpu-{x}.yaml" for x in ("agg", "pd"))
    rows = {r[""]: r for r in compare_files([("agg.yaml", a.read_bytes()),
                                             ("pd.yaml", b.read_bytes())], tmp_path)}
    assert rows["deployment"]["A: agg.yaml"].startswith("A 1x")
    assert rows["deployment"]["B: pd.yaml"].startswith("P ")
    assert rows["deployment"]["differs"] and not rows["model"]["differs"]
    with pytest.raises(SpecError, match=r"not a plan\.yaml"):
        compare_files([("a.yaml", a.read_bytes()), ("d.yaml", EXAMPLE.read_bytes())],
                      tmp_path)
    with pytest.raises(SpecError, match=r"two plan\.yaml files or more"):
        compare_files([("a.yaml", a.read_bytes())], tmp_path)


def test_an_infeasible_summary_names_the_closest_miss() -> None:
    slos = (SLO("tok_s_user_p90", 60.0),)
    o = outcome_of([record(0, 100.0, 50.0, False, 8), record(1, 200.0, 20.0, False, 16)],
                   slos)
    assert o.summary.best is None and o.summary.closest is not None
    assert o.summary.closest["number"] == 0
    assert closest_rows(o.summary) == [{"SLO": "tok_s_user_p90 >= 60", "closest plan": "50.0",
                                        "short by": "17%"}]
    assert not has_points(o.sweep) and not has_points({"curves": [{"points": [
        {"tok_s_user_p50": None, "throughput_tok_s_gpu": None}]}]})


# --- deploy ------------------------------------------------------------------------------------


def test_plan_sources(tmp_path: Path) -> None:
    s = read_plan_path(EXAMPLE)
    assert s.deployment == load_deployment(EXAMPLE) and s.workload == Workload()
    plan = {"deployment": s.plan["deployment"], "workload": {"requests": 7}}
    assert plan_source(plan, "x").workload == Workload(requests=7)
    with pytest.raises(SpecError, match="invalid YAML at line 1"):
        read_plan_text("a: [", "up.yaml")
    with pytest.raises(SpecError, match="unknown key 'decod'"):
        read_plan_text("model: deepseek-v3\nhardware: h200\ndecod: {}\n", "up.yaml")
    with pytest.raises(SpecError, match="is not a file"):
        read_plan_path(tmp_path / "none.yaml")


def test_render_for_targets() -> None:
    d = load_deployment(EXAMPLE)
    local = render_for(d, "local")
    assert len(local.processes) == 9  # 4 prefill hosts, DEP40 decode over 5 hosts of 8
    rows = command_rows(local)
    assert [r["ranks"] for r in rows] == [8] * 9
    assert [r["port"] for r in rows] == [8100, 8101, 8102, 8103, 8104, None, None, None, None]
    assert head_urls(local)["decode-0"] == "http://127.0.0.1:8104"
    assert all(u.startswith("http://127.0.0.1:") for u in head_urls(local).values())
    assert head_urls(render_for(d, "slurm"))["prefill-1"].startswith("http://host1:")
    with pytest.raises(SpecError, match="valid targets"):
        render_for(d, "mars")
    rows = instance_status(local, healthy=lambda url: url.endswith("8100"))
    assert [r["status"] for r in rows] == ["healthy"] + ["not answering"] * 4


def test_live_rows_are_the_supervisors_records(tmp_path: Path) -> None:
    """What `rackplan deploy --status RUN_DIR` reads; before the processes are recorded, each
    instance's /health instead."""
    import json

    local = render_for(load_deployment(EXAMPLE), "local")
    before = live_rows(tmp_path, local)
    assert [r["instance"] for r in before] == ["prefill-0", "prefill-1", "prefill-2",
                                               "prefill-3", "decode-0"]
    (tmp_path / "run.json").write_text(json.dumps({"run": "token-of-nothing"}))
    (tmp_path / "pids.json").write_text(json.dumps([
        {"instance": "decode-0", "pid": 2**22 + 1, "pgid": 2**22 + 1, "port": 8104},
        {"instance": "router", "pid": 2**22 + 2, "pgid": 2**22 + 2}]))
    assert live_rows(tmp_path, local) == [
        {"instance": "decode-0", "pid": 2**22 + 1, "port": 8104, "running": "no",
         "answering": "no"},
        {"instance": "router", "pid": 2**22 + 2, "port": None, "running": "no",
         "answering": "-"}]


@pytest.mark.parametrize("fail", [None, "decode-0 exited with code 1"])
def test_local_deploy_job(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                          fail: str | None) -> None:
    monkeypatch.setattr("app.deploying._backend_class", lambda target: FakeBackend)
    monkeypatch.setattr("executor.backends.local.gpus_here", lambda: 72)  # a 72-GPU machine
    monkeypatch.setattr(FakeBackend, "calls", [])
    monkeypatch.setattr(FakeBackend, "fail", fail)
    job = LocalDeploy(load_deployment(EXAMPLE), None, tmp_path / "run", 12.0)
    job.start()
    job.job.join(30)
    if fail is None:
        assert job.job.phase == "ready" and FakeBackend.calls == ["launch", "wait 12"]
        assert job.url == "http://127.0.0.1:8099"
        job.teardown()
        assert job.job.phase == "stopped" and FakeBackend.calls[-1] == "teardown"
    else:
        assert job.job.phase == "failed" and job.job.error == fail
        assert FakeBackend.calls == ["launch", "wait 12", "teardown"]


def test_comparison_rows() -> None:
    class Report:
        def to_dict(self) -> dict[str, Any]:
            return {"comparison": [{"metric": "ttft_ms.p50", "predicted": 100.0,
                                    "measured": 110.0, "rel_error": 0.1}]}

    assert comparison_rows(Report()) == [{"metric": "ttft_ms.p50", "predicted": 100.0,
                                          "measured": 110.0, "error %": 10.0}]
    assert comparison_rows({"something": 1}) is None


def test_local_deploy_of_a_gpu_plan_on_a_machine_without_them_starts_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("app.deploying._backend_class", lambda target: FakeBackend)
    monkeypatch.setattr("executor.backends.local.gpus_here", lambda: 0)
    monkeypatch.setattr(FakeBackend, "calls", [])
    job = LocalDeploy(load_deployment(EXAMPLE), None, tmp_path / "run", 12.0)
    job.start()
    job.job.join(30)
    assert job.job.phase == "failed" and "needs 72 h200 GPUs" in str(job.job.error)
    assert FakeBackend.calls == []


def test_local_rendering_is_the_one_rackplan_deploy_launches() -> None:
    from app.deploying import render_for
    from executor.backends.local import CPU_BIND_ENV
    from executor.cli import render_for as cli_render_for

    plan = Path(__file__).resolve().parents[2] / "examples" / "tiny-moe-cpu-pd.yaml"
    deployment = read_plan_path(plan).deployment
    ui = render_for(deployment, "local", "/m")
    assert ui == cli_render_for("local", deployment, "/m")
    assert all(CPU_BIND_ENV in p.env for p in ui.processes)  # each engine on its own cores
