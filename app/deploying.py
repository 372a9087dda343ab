"""The deploy page's work: read a plan (or a bare deployment), render its `vllm serve`
processes, write a target's files (dry run), launch locally in a worker thread and watch it, and
benchmark the running deployment against the prediction.

Rendering and command lines are `rackplan deploy`'s own (executor.cli). Launch backends come from
`executor.backends` (`render`, `launch`, `wait_ready`, `teardown`) and
the benchmark from `executor.bench.run_bench`; both are imported only when used, and a missing
piece is reported as `Unavailable` with a sentence, not a traceback.
"""

from __future__ import annotations

import importlib
import io
import shutil
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from executor.backends import BACKENDS
from executor.backends.base import LaunchError
from executor.backends.local import LocalBackend
from executor.cli import local_command_lines, model_path
from executor.cli import render_for as deploy_rendering
from executor.flavors import DEFAULT_FLAVOR, FLAVORS
from executor.render import Rendered
from planner.plan import is_plan, write_plan
from simulator.specs.deployment import Deployment
from simulator.specs.errors import SpecError
from simulator.specs.loading import dump_deployment, dump_workload, load_deployment, load_workload
from simulator.specs.workload import Workload

TARGETS = tuple(BACKENDS)
FLAVOR_NAMES = (DEFAULT_FLAVOR, *(f for f in FLAVORS if f != DEFAULT_FLAVOR))
"""Kubernetes flavors (executor/flavors), the default first."""
LOCALHOST = "127.0.0.1"
APP_NAME = "rackplan"
"""Prefix of the objects and jobs a target's files name (`rackplan deploy --name`)."""


class Unavailable(RuntimeError):
    """A part of the executor this installation does not have (yet); the message says which."""


@dataclass(frozen=True)
class PlanSource:
    """A deployment to deploy, with the plan it came from (a bare deployment gets a minimal
    plan: the deployment and a workload)."""

    deployment: Deployment
    plan: dict[str, Any]
    origin: str
    """Where it came from, for the page: the search, a file name or a path."""

    @property
    def workload(self) -> Workload | None:
        data = self.plan.get("workload")
        return load_workload(data) if isinstance(data, dict) else None


def plan_source(data: Any, origin: str) -> PlanSource:
    """A PlanSource from parsed YAML: a plan.yaml (deployment under `deployment:`) or a
    deployment; SpecError naming what is wrong."""
    if is_plan(data):
        deployment = load_deployment(data["deployment"])
        plan = dict(data)
        if isinstance(plan.get("workload"), dict):
            load_workload(plan["workload"])
        return PlanSource(deployment, plan, origin)
    if not isinstance(data, dict):
        raise SpecError(f"{origin}: expected a plan.yaml or a deployment YAML mapping, not "
                        f"{type(data).__name__}")
    deployment = load_deployment(data)
    plan = {"deployment": dump_deployment(deployment), "workload": dump_workload(Workload())}
    return PlanSource(deployment, plan, origin)


def read_plan_text(text: str, origin: str) -> PlanSource:
    """A PlanSource from YAML text (an uploaded file)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise SpecError(f"{origin}: invalid YAML{at}") from None
    return plan_source(data, origin)


def read_plan_path(path: str | Path) -> PlanSource:
    """A PlanSource from a YAML file on this machine."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise SpecError(f"{str(path)!r} is not a file; give the path of a plan.yaml or a "
                        "deployment YAML")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{p}: cannot be read ({e})") from None
    return read_plan_text(text, str(path))


def served_model(deployment: Deployment, given: str | None, build: bool) -> str:
    """What vllm serves, as `rackplan deploy` decides it: the given path or id, else for
    tiny-moe the model built for the CPU engine (built now when `build`), else the plan's
    model."""
    return model_path(deployment, given or None, build)


def render_for(deployment: Deployment, target: str, model: str | None = None) -> Rendered:
    """The processes of `deployment` for `target`, exactly as `rackplan deploy` renders them: on
    one machine (local) every host is this one; elsewhere hosts keep their placeholder names
    (host0, host1, ...)."""
    if target not in TARGETS:
        raise SpecError(f"unknown target {target!r}; valid targets: {', '.join(TARGETS)}")
    return deploy_rendering(target, deployment, served_model(deployment, model, build=False))


def command_lines(target: str, rendered: Rendered) -> list[str]:
    """Each process as one shell line; for local, exactly as the local backend starts it (the
    engine environment's vllm and its environment)."""
    if target == "local":
        return local_command_lines(LocalBackend(rendered, Path(".")))
    return [p.command_line() for p in rendered.processes]


def command_rows(rendered: Rendered) -> list[dict[str, Any]]:
    """One table row per process of a local launch: its instance, role, API port (heads only)
    and the data-parallel ranks it runs (1 without data parallelism). Every process runs on
    this machine, so there is no host column."""
    return [{"instance": p.instance, "role": p.role, "port": p.port,
             "ranks": p.dp.local if p.dp is not None else 1} for p in rendered.processes]


def is_disaggregated(deployment: Deployment) -> bool:
    """Whether the deployment has prefill and decode roles (and so a P/D proxy)."""
    return deployment.prefill is not None and deployment.decode is not None


def target_options(target: str, flavor: str | None) -> dict[str, Any]:
    """The backend's keyword arguments for the page's choices (kubernetes: the flavor)."""
    if target == "kubernetes":
        return {"flavor": flavor or DEFAULT_FLAVOR, "name": APP_NAME}
    if target == "slurm":
        return {"app": APP_NAME}
    return {}


def render_files(target: str, rendered: Rendered, folder: Path,
                 flavor: str | None = None) -> list[Path]:
    """The files `rackplan deploy --target TARGET [--flavor F] --dry-run` writes (manifests,
    batch scripts), written under `folder` (emptied first); nothing is started."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    backend = backend_for(target, rendered, folder, **target_options(target, flavor))
    return [Path(p) for p in backend.render()]


def language(path: Path) -> str:
    """st.code's language of a rendered file."""
    return {".yaml": "yaml", ".yml": "yaml", ".json": "json", ".sh": "bash",
            ".sbatch": "bash"}.get(path.suffix, "bash")


def zip_files(paths: list[Path], root: Path) -> bytes:
    """The files as a zip archive, named relative to `root` (the folder of the download)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for p in paths:
            if p.is_file():
                z.write(p, str(Path(root.name) / p.relative_to(root)))
    return buf.getvalue()


def head_urls(rendered: Rendered) -> dict[str, str]:
    """Instance name -> the URL of its head process (the one that serves the API)."""
    out: dict[str, str] = {}
    for p in rendered.processes:
        if p.port is not None:
            host = (p.dp.address if p.dp is not None else None) or LOCALHOST
            out[p.instance] = f"http://{host}:{p.port}"
    return out


def router_url(rendered: Rendered) -> str:
    """The URL the P/D proxy listens on, on this machine."""
    return f"http://{LOCALHOST}:{rendered.router['port']}"


def _backend_class(target: str) -> Any:
    try:
        backends = importlib.import_module("executor.backends")
        table: Mapping[str, str] = backends.BACKENDS
        module, _, cls = table[target].partition(":")
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError, KeyError) as e:
        raise Unavailable(f"the {target} backend is not available in this installation "
                          f"({type(e).__name__}: {e})") from None


def backend_for(target: str, rendered: Rendered, run_dir: Path, **options: Any) -> Any:
    """The executor backend of `target` bound to `rendered` and `run_dir` (with the target's
    own options); Unavailable when this installation lacks it."""
    if target not in TARGETS:
        raise SpecError(f"unknown target {target!r}; valid targets: {', '.join(TARGETS)}")
    return _backend_class(target)(rendered, run_dir, **options)


def dry_run(target: str, rendered: Rendered, run_dir: Path,
            flavor: str | None = None) -> list[Path]:
    """Write the target's files (commands, manifests, batch scripts) and start nothing."""
    run_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = list(backend_for(target, rendered, run_dir,
                                         **target_options(target, flavor)).render())
    return paths


def probe(url: str, timeout_s: float = 1.0) -> bool:
    """Whether `url`/health answers 200 within the timeout."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def instance_status(rendered: Rendered, healthy: Callable[[str], bool] | None = None
                    ) -> list[dict[str, Any]]:
    """One row per instance: its role, URL and whether it answers /health (`healthy`, default
    `probe`)."""
    check = healthy or probe
    roles = {p.instance: p.role for p in rendered.processes}
    return [{"instance": name, "role": roles[name], "url": url,
             "status": "healthy" if check(url) else "not answering"}
            for name, url in head_urls(rendered).items()]


def live_rows(run_dir: Path, rendered: Rendered) -> list[dict[str, Any]]:
    """What the local deployment's supervisor recorded in `run_dir`, now: per process its
    instance, pid, port, whether it runs and answers /health (`executor.backends.runs`,
    what `rackplan deploy --status RUN_DIR` prints). Before the processes are recorded (or for
    a backend that records none), each instance's /health instead."""
    from executor.backends.runs import status_rows

    try:
        rows = status_rows(run_dir)
    except LaunchError:
        return instance_status(rendered)
    return [{"instance": r.instance, "pid": r.pid, "port": r.port,
             "running": "yes" if r.running else "no",
             "answering": {None: "-", True: "yes", False: "no"}[r.answering]} for r in rows]


FINAL = ("ready", "done", "failed", "stopped")
"""Phases a job's work may end in; any other becomes done when the work returns."""


class Job:
    """Work in a daemon thread whose phase and messages the page reads while it runs."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.phase = "pending"
        self.error: str | None = None
        self.log: list[str] = []
        self.result: Any = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def note(self, phase: str, message: str) -> None:
        with self._lock:
            self.phase = phase
            self.log.append(f"{time.strftime('%H:%M:%S')} {message}")

    def start(self, work: Callable[[Job], Any]) -> None:
        def body() -> None:
            try:
                self.result = work(self)
                if self.phase not in FINAL:
                    self.note("done", f"{self.name}: done")
            except Exception as e:  # shown on the page as one sentence
                self.error = str(e) or type(e).__name__
                self.note("failed", f"{self.name} failed: {self.error}")

        self._thread = threading.Thread(target=body, name=f"rackplan-ui-{self.name}",
                                        daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)


class LocalDeploy:
    """A local launch in a worker thread: resolve the model (building tiny-moe when needed),
    render, start every process, wait until each answers a completion. The page polls `job`
    for the phase and may tear everything down at any time."""

    def __init__(self, deployment: Deployment, model: str | None, run_dir: Path,
                 ready_timeout_s: float) -> None:
        self.deployment, self.model, self.run_dir = deployment, model, run_dir
        self.rendered = render_for(deployment, "local", model)
        """The processes (ports and URLs are known before the model is resolved)."""
        self.ready_timeout_s = ready_timeout_s
        self.backend: Any = None
        self.job = Job("deploy")
        self._stop = threading.Event()
        _backend_class("local")  # Unavailable now, on the page, rather than in the thread

    @property
    def url(self) -> str:
        """Where clients and the benchmark talk to the deployment (the P/D proxy)."""
        return str(getattr(self.backend, "url", None) or router_url(self.rendered))

    def start(self) -> None:
        def work(job: Job) -> None:
            from executor.backends.local import check_fits_here

            check_fits_here(self.deployment)
            job.note("preparing", "resolving the model to serve")
            model = served_model(self.deployment, self.model, build=True)
            self.rendered = render_for(self.deployment, "local", model)
            self.backend = backend_for("local", self.rendered, self.run_dir)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            try:
                job.note("launching", f"starting {len(self.rendered.processes)} process(es); "
                                      f"logs in {self.run_dir / 'logs'}")
                if self._stop.is_set():
                    return
                self.backend.launch()
                if self._stop.is_set():
                    self.backend.teardown()
                    return
                job.note("waiting", f"waiting up to {self.ready_timeout_s:.0f} s for every "
                                    "instance to answer a completion")
                self.backend.wait_ready(self.ready_timeout_s)
            except BaseException:
                self.backend.teardown()
                raise
            job.note("ready", f"every instance answered a completion; proxy at {self.url}")

        self.job.start(work)

    def teardown(self) -> None:
        """Stop everything the launch started (safe to call twice, and while it starts)."""
        self._stop.set()
        if self.backend is not None:
            self.backend.teardown()
        self.job.note("stopped", "torn down")


def bench_function() -> Callable[..., Any]:
    """`executor.bench.run_bench`, or Unavailable when this installation lacks it."""
    try:
        module = importlib.import_module("executor.bench")
        fn: Callable[..., Any] = module.run_bench
        return fn
    except (ImportError, AttributeError) as e:
        raise Unavailable(f"benchmarking is not available in this installation "
                          f"({type(e).__name__}: {e})") from None


def start_bench(source: PlanSource, url: str, run_dir: Path) -> Job:
    """Benchmark the deployment at `url` with the plan's workload, in a worker thread; the
    job's result is the predicted-vs-measured report (`executor.bench.run_bench`)."""
    bench = bench_function()
    job = Job("benchmark")

    def work(job: Job) -> Any:
        plan_path = write_plan(source.plan, run_dir / "plan.yaml")
        job.note("running", f"vllm bench serve against {url}")
        return bench(plan_path, url, run_dir)

    job.start(work)
    return job


def comparison_rows(report: Any) -> list[dict[str, Any]] | None:
    """Rows of predicted against measured figures of a benchmark report (its `to_dict()`
    holds a `comparison` list); None for anything else."""
    data = report.to_dict() if hasattr(report, "to_dict") else report
    rows = data.get("comparison") if isinstance(data, Mapping) else None
    if not isinstance(rows, list):
        return None
    out = []
    for r in rows:
        err = r.get("rel_error")
        out.append({"metric": r.get("metric"), "predicted": r.get("predicted"),
                    "measured": r.get("measured"),
                    "error %": None if err is None else round(100 * err, 1)})
    return out
