"""What-if page: one deployment, one workload, one simulation, and its charts."""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from app import charts
from app.inputs import (
    DEFAULT_ROLES,
    LAYOUT_LABELS,
    DeploymentKnobs,
    RoleKnobs,
    build_deployment,
    example_knobs,
)
from app.whatif import (
    WhatIf,
    instances_by_role,
    metric_cards,
    role_series,
    run_whatif,
    throughput_series,
)
from app.widgets import cancelled, errors_shown, model_and_hardware, with_status, workload_input
from app.widgets import metric_cards as show_cards
from planner.plan import describe
from simulator.specs.loading import dump_deployment
from simulator.specs.workload import Workload

P = "wi"


def role_inputs(role: str) -> RoleKnobs:
    """The knobs of one role, in a column."""
    d = DEFAULT_ROLES[role]
    k = f"{P}_{role}"
    instances = st.number_input("Instances", 1, 4096, d.instances, key=f"{k}_instances")
    dep = st.number_input("DEP (ranks per instance)", 1, 1024, d.dep, key=f"{k}_dep")
    redundant = st.number_input("Redundant experts", 0, 4096, d.redundant_experts,
                                key=f"{k}_redundant",
                                help="EPLB slots per MoE layer; (experts + R) % DEP must be 0")
    seqs = st.number_input("max_num_seqs (per rank)", 1, 65536, d.max_num_seqs,
                           key=f"{k}_seqs")
    mnbt = st.number_input("max_num_batched_tokens (per rank)", 1, 1_048_576,
                           d.max_num_batched_tokens, key=f"{k}_mnbt")
    mtp, acceptance = 0, d.mtp_acceptance
    if role != "prefill":
        mtp = st.number_input("Draft tokens (MTP or DSpark; 0: off)", 0, 8, d.mtp_tokens,
                              key=f"{k}_mtp")
        acceptance = st.number_input("Draft acceptance", 0.0, 1.0, d.mtp_acceptance,
                                     key=f"{k}_acceptance")
    host = st.number_input("Host prefix-cache tier (GiB per GPU; 0: none)", 0.0, 4096.0,
                           d.host_cache_gb, key=f"{k}_host",
                           help="A second prefix-cache tier in host memory: blocks that left "
                                "HBM load over the host link instead of being computed")
    return RoleKnobs(instances=int(instances), dep=int(dep), redundant_experts=int(redundant),
                     max_num_seqs=int(seqs), max_num_batched_tokens=int(mnbt),
                     mtp_tokens=int(mtp), mtp_acceptance=float(acceptance),
                     host_cache_gb=float(host))


@st.cache_data(show_spinner=False)
def examples() -> dict[str, DeploymentKnobs]:
    """The example deployments the form can hold (read once per server)."""
    return example_knobs()


def _apply_example() -> None:
    """Select-box callback: put the chosen example's knobs into the form."""
    name = st.session_state.get(f"{P}_example")
    knobs = examples().get(str(name))
    if knobs is None:
        return
    state = st.session_state
    top: tuple[tuple[str, object], ...] = (("model", knobs.model), ("hardware", knobs.hardware),
                       ("engine", knobs.engine), ("weights", knobs.weights),
                       ("kv", knobs.kv_cache), ("indexer", knobs.indexer_cache),
                       ("budget", knobs.gpu_budget), ("layout", knobs.layout))
    for key, value in top:
        state[f"{P}_{key}"] = value
    for role, r in knobs.roles.items():
        k = f"{P}_{role}"
        knobs_of_role: tuple[tuple[str, object], ...] = (("instances", r.instances), ("dep", r.dep),
                           ("redundant", r.redundant_experts), ("seqs", r.max_num_seqs),
                           ("mnbt", r.max_num_batched_tokens), ("mtp", r.mtp_tokens),
                           ("acceptance", r.mtp_acceptance), ("host", r.host_cache_gb))
        for key, value in knobs_of_role:
            if role != "prefill" or key not in ("mtp", "acceptance"):
                state[f"{k}_{key}"] = value


def inputs() -> tuple[DeploymentKnobs, Callable[[], Workload]]:
    """The form, in the sidebar (results stay in view in the page after a run)."""
    if examples():
        st.selectbox("Start from an example deployment", list(examples()), index=None,
                     key=f"{P}_example", on_change=_apply_example,
                     placeholder="examples/ (DeepSeek-V3, V4-Flash...)",
                     help="Fills the model, hardware and deployment knobs below")
    with st.expander("Model and hardware", expanded=True):
        model, hardware = model_and_hardware(P)
        c1, c2 = st.columns(2)
        engine = c1.selectbox("Engine tables", ["vllm", "sglang", "trtllm"], key=f"{P}_engine")
        weights = c2.selectbox("Weights", ["fp8", "bf16", "fp4", "int4"], key=f"{P}_weights")
        c3, c4 = st.columns(2)
        kv = c3.selectbox("KV cache", ["fp8", "bf16", "fp4"], key=f"{P}_kv")
        indexer = c4.selectbox("Indexer cache", ["fp8", "fp4"], key=f"{P}_indexer",
                               help="Key cache of the sparse-attention indexer (DeepSeek-V3.2, "
                                    "V4)")
        budget = st.number_input("GPU budget (0: what the roles use)", 0, 100_000, 0,
                                 key=f"{P}_budget",
                                 help="Cluster size; throughput per GPU counts all of them")
    with st.expander("Workload", expanded=True):
        build_workload = workload_input(P)
    with st.expander("Deployment", expanded=True):
        layout = st.radio("Layout", list(LAYOUT_LABELS), format_func=LAYOUT_LABELS.__getitem__,
                          horizontal=True, key=f"{P}_layout")
        names = ("prefill", "decode") if layout == "pd" else ("aggregated",)
        roles = {}
        for tab, name in zip(st.tabs(list(names)), names, strict=True):
            with tab:
                roles[name] = role_inputs(name)
    knobs = DeploymentKnobs(model=model, hardware=hardware, engine=str(engine),
                            weights=str(weights), kv_cache=str(kv),
                            indexer_cache=str(indexer), gpu_budget=int(budget),
                            layout=layout, roles=roles)
    return knobs, build_workload


def simulate(knobs: DeploymentKnobs, build_workload: Callable[[], Workload]) -> None:
    with errors_shown():
        deployment = build_deployment(knobs)
        workload = build_workload()
        outcome = with_status(
            f"Simulating {workload.requests:,} requests on {deployment.gpus_used} GPUs",
            lambda advance: run_whatif(deployment, workload, progress=lambda share: advance(
                share, f"{share:.0%} of requests done")),
            lambda w: f"Simulated {w.result.completed:,} requests in {w.wall_s:.1f} s", key=P)
        if outcome is not None:
            st.session_state["whatif"] = outcome


def timelines(w: WhatIf) -> None:
    """Each role's instances together, then small multiples of the instances picked (by
    default the first of each role), so that many instances stay readable."""
    st.plotly_chart(charts.role_timelines_figure(role_series(w.result)), key="wi_tl_roles")
    by_role = instances_by_role(w.result)
    names = [n for group in by_role.values() for n in group]
    picked = st.multiselect("Instances to show one by one (at most 8)", names,
                            [group[0] for group in by_role.values()], max_selections=8,
                            key="wi_tl_pick")
    if picked:
        st.plotly_chart(charts.timelines_figure(w.result, picked), key="wi_tl")


def results(w: WhatIf) -> None:
    m = w.metrics
    st.subheader("Results")
    st.caption(f"{describe(dump_deployment(w.deployment))} · {m['completed']:,} requests in "
               f"{m['duration_s']:.1f} simulated s on {m['gpus']} GPUs · "
               f"simulated in {w.wall_s:.1f} s")
    show_cards(metric_cards(m))
    tabs = st.tabs(["Latency", "Throughput", "Timelines", "Prefix cache", "Step time",
                    "Experts", "JSON"])
    with tabs[0]:
        st.plotly_chart(charts.latency_histograms(w.result, m), key="wi_lat")
    with tabs[1]:
        t, v = throughput_series(w.result)
        st.plotly_chart(charts.throughput_figure(t, v, m["output_tok_s_gpu"]), key="wi_tput")
        st.caption("Output tokens per second per GPU, from each decode step's share of the "
                   "request-steps; its average over the run is the reported output per GPU.")
    with tabs[2]:
        timelines(w)
    with tabs[3]:
        cache = w.cache
        st.plotly_chart(charts.cache_figure(cache), key="wi_cache")
        st.caption(f"{cache.hit_share:.1%} of input tokens came from the prefix cache; the "
                   "host tier holds blocks that left HBM (a role's host prefix-cache knob). "
                   "Turn depth counts the turns before a request in its agent (0 without "
                   "sessions).")
    with tabs[4]:
        st.plotly_chart(charts.breakdown_figure(w.steps, m["step_breakdown"]), key="wi_step")
        for step in w.steps.values():
            st.caption(f"{step.role}: {step.step.total_ms:.2f} ms for {step.batch} "
                       f"(priced from {step.step.source} data)")
    with tabs[5]:
        if not w.experts:
            st.info("No expert-parallel role: the model is dense or no role splits experts.")
        for view in w.experts.values():
            layer = st.slider(f"{view.role}: MoE layer", 0, view.before.shape[0] - 1, 0,
                              key=f"wi_layer_{view.role}")
            st.plotly_chart(charts.expert_figure(view, int(layer)), key=f"wi_exp_{view.role}")
            st.caption(f"{view.role}: imbalance (max-mean)/mean over all MoE layers "
                       f"{view.imbalance_before:.3f} before EPLB, {view.imbalance_after:.3f} "
                       f"after, with {view.redundant} redundant experts on {view.ranks} ranks.")
    with tabs[6]:
        st.json(m)


st.title("What-if")
st.caption("Pick a model, hardware, traffic and a deployment in the sidebar; the discrete-event "
           "simulator predicts what it serves.")
with st.sidebar:
    run_clicked = st.button("Run simulation", type="primary", key=f"{P}_run",
                            icon=":material/play_arrow:", width="stretch")
    knobs, build_workload = inputs()
if run_clicked:
    simulate(knobs, build_workload)
if cancelled(P):
    st.info("Simulation cancelled; the results below are from the run before it.",
            icon=":material/info:")
if "whatif" in st.session_state:
    results(st.session_state["whatif"])
else:
    st.info("Set the model, traffic and deployment in the sidebar and press Run simulation.",
            icon=":material/info:")
