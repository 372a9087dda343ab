"""Search page: SLOs and a GPU budget in, the Pareto front and the top plans out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from app import charts
from app.deploying import plan_source
from app.searching import (
    CHOSEN_LABELS,
    SearchForm,
    SearchOutcome,
    closest_rows,
    compare_files,
    compare_rows,
    front_points,
    has_points,
    plan_yaml,
    progress_text,
    reason_rows,
    role_diff,
    run,
    search_config,
    top_plans,
)
from app.widgets import (
    cancelled,
    errors_shown,
    model_and_hardware,
    session_dir,
    with_status,
    workload_input,
)
from planner import defaults
from planner.load import load_text
from planner.plan import describe
from planner.space import LAYOUTS
from simulator.specs.workload import Workload

P = "se"


def inputs() -> Callable[[], SearchForm]:
    with st.expander("What to plan", expanded=True):
        model, hardware = model_and_hardware(P, defaults.MODEL, defaults.HARDWARE)
        gpus = st.number_input("GPU budget", 1, 100_000, defaults.GPUS, key=f"{P}_gpus",
                               help="A plan may use at most this many GPUs")
    with st.expander("Workload", expanded=True):
        build_workload = workload_input(P, default_requests=300,
                                        default_source=defaults.WORKLOAD)
    with st.expander("SLOs and search", expanded=True):
        c1, c2 = st.columns(2)
        slo = {s.metric: s.value for s in defaults.SLOS}
        ttft = c1.number_input("TTFT p90 at most (ms; 0: none)", 0.0, 1e7,
                               slo.get("ttft_p90_ms", 0.0), key=f"{P}_ttft")
        user = c2.number_input("tok/s/user p90 at least (0: none)", 0.0, 1e5,
                               slo.get("tok_s_user_p90", 0.0), key=f"{P}_user")
        objective = st.radio("Objective", ["slo", "pareto"], horizontal=True,
                             key=f"{P}_objective",
                             help="slo: most throughput per GPU within the SLOs; pareto: the "
                                  "front of throughput per GPU vs tokens/s per user")
        extra = st.text_area("More SLOs, one NAME=VALUE per line (e.g. tpot_p90_ms=50)", "",
                             key=f"{P}_extra", height=68)
        c4, c5, c6 = st.columns(3)
        trials = c4.number_input("Trials", 1, 10_000, 30, key=f"{P}_trials")
        refine = c5.number_input("Refinement rounds", 0, 1_000, defaults.REFINE,
                                 key=f"{P}_refine",
                                 help="after the trials, rounds of the best plan's one-knob "
                                      "neighbours, walked on where a move pays (as `rackplan "
                                      "search --refine`); 0: the trials alone")
        seed = c6.number_input("Sampler seed", 0, 2**31 - 1, 0, key=f"{P}_seed")
        layouts = st.multiselect("Layouts", list(LAYOUTS), list(LAYOUTS), key=f"{P}_layouts")
        loads = st.text_input("Search the load too (auto, or users / requests/s such as "
                              "8,16,64; empty: the workload's own)", "", key=f"{P}_loads")
    with st.expander("Storage"):
        storage = st.text_input("Optuna storage (the same search resumes)", defaults.STORAGE,
                                key=f"{P}_storage")
        study = st.text_input("Study name (empty: derived from the search)", "",
                              key=f"{P}_study")

    def form() -> SearchForm:
        workload: Workload = build_workload()
        return SearchForm(model=model, hardware=hardware, gpus=int(gpus), workload=workload,
                          ttft_p90_ms=float(ttft), tok_s_user_p90=float(user),
                          extra_slos=str(extra), objective=str(objective), trials=int(trials),
                          refine=int(refine), seed=int(seed), layouts=tuple(layouts),
                          storage=str(storage), study=str(study), loads=str(loads))

    return form


def search(form: Callable[[], SearchForm]) -> None:
    with errors_shown():
        config = search_config(form())
        outcome = with_status(
            f"Searching {config.trials} trials",
            lambda advance: run(config, progress=lambda done, total, best: advance(
                done / total, progress_text(done, total, best))),
            lambda o: (f"{o.summary.trials} trials, {o.summary.simulations} simulated, "
                       f"{o.summary.feasible} meet the SLOs ({o.wall_s:.1f} s)"), key=P)
        if outcome is not None:
            st.session_state["search"] = outcome
            if outcome.plan is not None:
                st.session_state["plan"] = plan_source(outcome.plan, "the Search page")


TABLE_COLUMNS = {
    "trial": st.column_config.NumberColumn(width="small"),
    "standing": st.column_config.TextColumn(width="medium"),
    "GPUs": st.column_config.NumberColumn(width="small"),
    "plan": st.column_config.TextColumn(width="large"),
}


def curves(o: SearchOutcome, chosen: int | None) -> None:
    """The load sweep's throughput-interactivity curves, when it has points."""
    sweep = o.sweep or {}
    if not has_points(sweep):
        return
    axis = sweep.get("user_axis")
    floor = next((x.value for x in o.config.slos if x.metric == axis), None)
    label = CHOSEN_LABELS.get(o.config.objective, "chosen") if chosen is not None else None
    st.plotly_chart(charts.curves_figure(sweep, floor, chosen=chosen, chosen_label=label),
                    key="se_curves")


def infeasible(o: SearchOutcome) -> None:
    """No plan met the SLOs: why (trials per reason), the closest miss, what would help."""
    s = o.summary
    near = s.closest
    st.warning("No plan met the SLOs. What would: " + "; ".join(o.advice),
               icon=":material/warning:")
    c1, c2 = st.columns(2)
    with c1:
        st.markdown("**Why no trial met them** (trials per reason)")
        st.dataframe(reason_rows(s), hide_index=True, key="se_reasons")
    with c2:
        if near is None:
            st.markdown("**Closest miss:** none; no trial reached a simulation.")
        else:
            st.markdown(f"**Closest miss** (trial {near['number']}): "
                        f"{describe(near['deployment'])}")
            st.dataframe(closest_rows(s), hide_index=True, key="se_closest")
    curves(o, None)


def compare(o: SearchOutcome, rows: list[dict[str, Any]]) -> None:
    """Two plans side by side: by role and knob, then as `rackplan compare` shows them."""
    trials = [r["trial"] for r in rows]
    by_trial = {r["number"]: r for r in o.records}
    layouts = {t: tuple(k for k in ("prefill", "decode", "aggregated")
                        if k in by_trial[t]["deployment"]) for t in trials}
    other = next((i for i, t in enumerate(trials) if layouts[t] != layouts[trials[0]]), 1)
    st.markdown("**Compare two plans**")
    c1, c2 = st.columns(2)
    a = c1.selectbox("Plan A (trial)", trials, index=0, key="se_diff_a")
    b = c2.selectbox("Plan B (trial)", trials, index=other, key="se_diff_b")
    st.dataframe(role_diff(by_trial[a], by_trial[b]), hide_index=True, key="se_diff")
    st.caption("As `rackplan compare A.yaml B.yaml` shows the two plans:")
    st.dataframe(compare_rows(by_trial[a], by_trial[b], o.config), hide_index=True,
                 key="se_compare")


def results(o: SearchOutcome) -> None:
    s = o.summary
    st.subheader("Results")
    slos = ", ".join(str(x) for x in o.config.slos) or "none"
    st.caption(f"study {o.study} in {o.storage} · {s.trials} trials: {s.rejected} rejected, "
               f"{s.screened_out} screened out, {s.simulations} simulated, {s.feasible} meet "
               f"the SLOs ({slos})" + ("" if o.ran else " · resumed: the study already held "
                                       "these trials"))
    chosen = s.best["number"] if s.best else None
    if s.best is None:
        infeasible(o)
    else:
        at = (f" at {load_text(o.config.workload, s.best['load'])}"
              if s.best.get("load") is not None else "")
        st.success(f"Chosen plan (trial {chosen}): {describe(s.best['deployment'])}{at}",
                   icon=":material/check_circle:")
        st.caption(f"Why this plan: {o.why}")
        curves(o, chosen)
        points = front_points(o)
        if any(p["feasible"] for p in points):
            st.plotly_chart(charts.pareto_figure(points, chosen, CHOSEN_LABELS.get(
                o.config.objective, "chosen")), key="se_front")
        with st.expander("Why the other trials did not become the plan"):
            st.dataframe(reason_rows(s), hide_index=True, key="se_reasons")
    rows = top_plans(o)
    if rows:
        st.markdown("**Top plans**" if s.best else "**Simulated plans** (none meets the SLOs)")
        st.dataframe(rows, hide_index=True, key="se_table", column_config=TABLE_COLUMNS)
    if len(rows) >= 2:
        compare(o, rows)
    if o.plan is not None:
        st.download_button("Download plan.yaml", plan_yaml(o.plan), file_name="plan.yaml",
                           mime="application/x-yaml", key="se_download",
                           icon=":material/download:")
        st.caption("The chosen plan is ready on the Deploy page.")


def compare_uploads() -> None:
    """`rackplan compare` over plan.yaml files the user uploads."""
    with st.expander("Compare plan files (rackplan compare)"):
        files = st.file_uploader("Two plan.yaml files or more", type=["yaml", "yml"],
                                 accept_multiple_files=True, key=f"{P}_compare_files")
        if len(files or []) >= 2:
            with errors_shown():
                st.dataframe(compare_files([(f.name, f.getvalue()) for f in files],
                                           session_dir() / "compare"),
                             hide_index=True, key=f"{P}_compare_table")


st.title("Search")
st.caption("Find the deployments with the most throughput per GPU that meet the SLOs within a "
           "GPU budget (the same search as `rackplan search`); set it up in the sidebar.")
with st.sidebar:
    run_clicked = st.button("Run search", type="primary", key=f"{P}_run",
                            icon=":material/play_arrow:", width="stretch")
    build_form = inputs()
if run_clicked:
    search(build_form)
if cancelled(P):
    st.info("Search cancelled; the trials it finished stay in the study, and running the same "
            "search again resumes it.", icon=":material/info:")
if "search" in st.session_state:
    results(st.session_state["search"])
else:
    st.info("Set the model, GPU budget, traffic and SLOs in the sidebar and press Run search.",
            icon=":material/info:")
compare_uploads()
