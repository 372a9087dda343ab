"""Deploy page: a plan per target (and Kubernetes flavor) as what that target runs: the local
`vllm serve` processes with a launch, the supervisor's live status and a benchmark against the
prediction; the Kubernetes manifests or Slurm scripts themselves, highlighted, and as a zip."""

from __future__ import annotations

import time
from pathlib import Path

import streamlit as st

from app.deploying import (
    FLAVOR_NAMES,
    TARGETS,
    LocalDeploy,
    PlanSource,
    command_lines,
    command_rows,
    comparison_rows,
    dry_run,
    is_disaggregated,
    language,
    live_rows,
    read_plan_path,
    read_plan_text,
    render_files,
    render_for,
    start_bench,
    zip_files,
)
from app.widgets import ERROR_ICON, PEOPLE_ERRORS, errors_shown, message, session_dir
from executor.render import Rendered
from planner.plan import describe
from simulator.specs.loading import dump_deployment

P = "dp"
FROM_SEARCH, UPLOAD, PATH = "from the Search page", "upload a file", "a path on this machine"


def choose_source() -> PlanSource | None:
    kind = st.radio("Plan", [FROM_SEARCH, UPLOAD, PATH], horizontal=True, key=f"{P}_source",
                    help="A plan.yaml from `rackplan search`, or a deployment YAML")
    with errors_shown():
        if kind == FROM_SEARCH:
            plan: PlanSource | None = st.session_state.get("plan")
            if plan is None:
                st.info("No plan yet: run a search on the Search page, or upload a plan.")
            return plan
        if kind == UPLOAD:
            f = st.file_uploader("plan.yaml or deployment YAML", type=["yaml", "yml"],
                                 key=f"{P}_upload")
            return None if f is None else read_plan_text(
                f.getvalue().decode("utf-8", errors="replace"), f.name)
        path = st.text_input("Path of a plan.yaml or deployment YAML", "", key=f"{P}_path",
                             placeholder="examples/deepseek-v3-h200-pd.yaml")
        return read_plan_path(path) if path.strip() else None
    return None


def show_local(rendered: Rendered, disaggregated: bool) -> None:
    """The processes a local launch starts, as the local backend starts them."""
    st.markdown("**Processes on this machine**")
    st.dataframe(command_rows(rendered), hide_index=True, key=f"{P}_procs")
    st.code("\n\n".join(command_lines("local", rendered)), language="bash", wrap_lines=True)
    if disaggregated:
        with st.expander("P/D proxy (in front of the prefill and decode instances)"):
            st.json(rendered.router)


def show_files(target: str, flavor: str | None, rendered: Rendered) -> None:
    """The files the target's dry run writes, each highlighted, and all of them as a zip."""
    folder = session_dir() / "render" / f"{target}-{flavor or 'files'}"
    paths = render_files(target, rendered, folder, flavor)
    kind = f"{target} ({flavor})" if flavor else target
    top, button = st.columns([3, 1])
    top.markdown(f"**{len(paths)} files for {kind}** (`rackplan deploy --target {target}"
                 + (f" --flavor {flavor}" if flavor else "") + " --dry-run` writes the same)")
    button.download_button("Download the folder (.zip)", zip_files(paths, folder),
                           file_name=f"rackplan-{target}-{flavor or 'files'}.zip",
                           mime="application/zip", key=f"{P}_zip",
                           icon=":material/download:")
    for n, path in enumerate(paths):
        with st.expander(path.relative_to(folder).as_posix(), expanded=n == 0):
            st.code(path.read_text(encoding="utf-8", errors="replace"),
                    language=language(path), line_numbers=True)


def deploy(target: str, flavor: str | None, source: PlanSource, rendered: Rendered,
           model: str | None, run_dir: Path, timeout_s: float) -> None:
    with errors_shown():
        if target != "local":
            paths = dry_run(target, rendered, run_dir, flavor)
            st.session_state["dryrun"] = (target, [str(p) for p in paths])
            return
        running = st.session_state.get("deploy")
        if running is not None and running.job.phase not in ("failed", "stopped"):
            st.warning("A local deployment is already up; tear it down first.")
            return
        job = LocalDeploy(source.deployment, model, run_dir, timeout_s)
        job.start()
        st.session_state["deploy"] = job
        st.session_state.pop("bench", None)


def show_dry_run() -> None:
    target, paths = st.session_state["dryrun"]
    st.success(f"Wrote {len(paths)} {target} files (dry run: nothing was started) to "
               f"{Path(paths[0]).parent if paths else 'the run folder'}",
               icon=":material/check_circle:")


def _teardown() -> None:
    """Button callback (runs before the page is drawn again)."""
    dep: LocalDeploy | None = st.session_state.get("deploy")
    if dep is not None:
        try:
            dep.teardown()
        except PEOPLE_ERRORS as e:
            st.session_state["deploy_error"] = message(e)


def _bench() -> None:
    """Button callback: benchmark the running deployment in a worker thread."""
    dep: LocalDeploy | None = st.session_state.get("deploy")
    source: PlanSource | None = st.session_state.get("deploy_source")
    if dep is None or source is None:
        return
    try:
        st.session_state["bench"] = start_bench(source, dep.url, dep.run_dir)
    except PEOPLE_ERRORS as e:
        st.session_state["deploy_error"] = message(e)


def live_status() -> None:
    dep: LocalDeploy | None = st.session_state.get("deploy")
    if dep is None:
        return
    job = dep.job
    st.markdown(f"**Local deployment:** {job.phase}")
    for error in (job.error, st.session_state.pop("deploy_error", None)):
        if error:
            st.error(error, icon=ERROR_ICON)
    st.dataframe(live_rows(dep.run_dir, dep.rendered), hide_index=True, key=f"{P}_live")
    st.caption(f"From the supervisor's records in {dep.run_dir} (what `rackplan deploy "
               f"--status {dep.run_dir}` prints), every 2 s.")
    st.code("\n".join(job.log[-20:]) or "(no events yet)", language="text")
    c1, c2 = st.columns(2)
    c1.button("Tear down", key=f"{P}_teardown", on_click=_teardown,
              disabled=job.phase == "stopped")
    c2.button("Run benchmark", key=f"{P}_bench", on_click=_bench, disabled=job.phase != "ready")
    bench = st.session_state.get("bench")
    if bench is not None:
        st.markdown(f"**Benchmark:** {bench.phase}")
        if bench.error:
            st.error(bench.error, icon=ERROR_ICON)
        elif bench.result is not None:
            rows = comparison_rows(bench.result)
            if rows:
                st.dataframe(rows, hide_index=True)
            else:
                st.write(bench.result)


st.title("Deploy")
st.caption("Render a plan for a target: launch it here, or get the Kubernetes manifests (llm-d, "
           "Dynamo or KServe) or Slurm scripts.")
source = choose_source()
if source is not None:
    st.caption(f"{describe(dump_deployment(source.deployment))} · from {source.origin}")
    c1, c2, c3, c4 = st.columns(4)
    target = str(c1.selectbox("Target", TARGETS, key=f"{P}_target"))
    flavor = None
    if target == "kubernetes":
        flavor = str(c2.selectbox("Flavor", FLAVOR_NAMES, key=f"{P}_flavor",
                                  help="Whose objects the deployment becomes: llm-d "
                                       "(LeaderWorkerSet per role), dynamo "
                                       "(DynamoGraphDeployment), kserve (LLMInferenceService)"))
    model_path = c3.text_input("Model to serve (path or Hugging Face id; empty: the plan's)",
                               "", key=f"{P}_model")
    run_root = c4.text_input("Run folder", "runs", key=f"{P}_runs")
    timeout = 1800.0
    if target == "local":
        timeout = float(c2.number_input("Ready timeout (s)", 10, 7200, 1800, key=f"{P}_timeout"))
    rendered = None
    with errors_shown():
        rendered = render_for(source.deployment, target, model_path.strip() or None)
        if target == "local":
            show_local(rendered, is_disaggregated(source.deployment))
        else:
            show_files(target, flavor, rendered)
    if rendered is not None:
        label = "Deploy" if target == "local" else "Write the files to the run folder (dry run)"
        if st.button(label, type="primary", key=f"{P}_deploy"):
            st.session_state["deploy_source"] = source
            stamp = time.strftime("%Y%m%d-%H%M%S")
            deploy(target, flavor, source, rendered, model_path.strip() or None,
                   Path(run_root) / f"ui-{target}-{stamp}", timeout)
if "dryrun" in st.session_state:
    show_dry_run()
deployment = st.session_state.get("deploy")
every = 2.0 if deployment is not None and deployment.job.phase != "stopped" else None
st.fragment(live_status, run_every=every)()
