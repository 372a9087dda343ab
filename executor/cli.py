"""`rackplan deploy` and `rackplan bench`: a plan launched on a target, then measured.

`register(sub)` adds both subcommands to the rackplan parser (planner/cli.py calls it).

deploy renders the plan's deployment as typed launch records for the engine it names (an
engine rackplan does not deploy is refused by name), checks them against vLLM's rules (and, with
--check-flags, their command lines with vLLM's own parser), then hands them to a backend: with
--dry-run it prints what the backend says (`local`: each process's command line;
`kubernetes`/`slurm`: the files written); a target's own flags (kubernetes: --flavor, --name,
--routing, --gateway, --image, --router-image, --model-volume, --hf-token-secret, --namespace)
go to its backend, and a flag the target does not take is refused; without it the backend
launches, waits until every instance answers, prints the router's URL and — for a foreground
target (`local`) — serves until Ctrl-C, then tears down. Every target-specific step is the
backend's own (executor/backends/).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from executor.backends import BACKENDS, backend_class, get_backend
from executor.backends.base import Backend, LaunchError
from executor.engines import engine_for
from executor.records import Rendered
from simulator.specs.deployment import Deployment
from simulator.specs.errors import SpecError
from simulator.specs.paths import writable

DEFAULT_TIMEOUT_S = 1800.0
"""How long deploy waits for readiness: a large MoE model loads in tens of minutes."""
TINY_MOE = "tiny-moe"
"""The preset the CPU engine serves, built on the spot (executor/tinymodel.py)."""
EXIT_LAUNCH_FAILED = 1


def register(sub: Any) -> None:
    """Add `deploy` and `bench` to the rackplan subcommands (`sub` from add_subparsers)."""
    p = sub.add_parser("deploy", help="launch a plan's deployment with vLLM (or --dry-run)")
    p.add_argument("plan", nargs="?",
                   help="plan.yaml, or a deployment YAML (DESIGN.md format)")
    p.add_argument("--target", metavar="TARGET",
                   help=f"where it runs: {', '.join(BACKENDS)} (required with a plan)")
    p.add_argument("--dry-run", action="store_true",
                   help="start nothing: local prints every process's command line, kubernetes "
                        "and slurm write their files to --out")
    p.add_argument("--out", metavar="DIR",
                   help="run directory for files and logs (default runs/deploy-<plan name>)")
    p.add_argument("--model-path", metavar="PATH",
                   help="what vllm serves (default: the plan's model; for tiny-moe the model "
                        "built in .venv-engine/models/tiny-moe)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"seconds to wait until every instance answers (default "
                        f"{DEFAULT_TIMEOUT_S:.0f})")
    p.add_argument("--check-flags", action="store_true",
                   help="also parse every process's flags with vLLM's own parser (in "
                        ".venv-engine; skipped with a note when it is absent)")
    p.add_argument("--restart", type=int, default=0, metavar="N",
                   help="once ready, restart an instance that exits or stops answering "
                        "/health, up to N times in all (default 0: tear everything down and "
                        f"exit {EXIT_LAUNCH_FAILED}, naming it)")
    run = p.add_mutually_exclusive_group()
    run.add_argument("--stop", metavar="RUN_DIR",
                     help="local target: end what a deployment in RUN_DIR left running (its "
                          "deploying process, if alive, tears down itself), then exit")
    run.add_argument("--status", metavar="RUN_DIR",
                     help="local target: print each process of the deployment in RUN_DIR, "
                          "whether it runs and answers /health; exit 0 only if all do")
    local = p.add_argument_group("local target")
    local.add_argument("--base-port", type=int, metavar="PORT",
                       help="first instance's HTTP port; the next instances take the next "
                            "ports and the router PORT-1 (default 8100)")
    k8s = p.add_argument_group("kubernetes target")
    k8s.add_argument("--flavor", metavar="FLAVOR",
                     help="whose objects the deployment becomes: llm-d (default; a "
                          "LeaderWorkerSet per role), dynamo (a DynamoGraphDeployment) or "
                          "kserve (an LLMInferenceService)")
    k8s.add_argument("--name", metavar="NAME",
                     help="prefix of every object's name (default: the plan's file name)")
    k8s.add_argument("--routing", metavar="ROUTING",
                     help="llm-d flavor: router (default: our P/D router) or epp (llm-d's "
                          "InferencePool and endpoint picker)")
    k8s.add_argument("--image", metavar="IMAGE",
                     help="the engine pods' image (default: the flavor's, "
                          "vllm/vllm-openai:v0.32.0 for llm-d)")
    k8s.add_argument("--router-image", metavar="IMAGE",
                     help="our router's image, as `make router-image` builds and you push it "
                          "(default rackplan-router:0.1.0)")
    k8s.add_argument("--model-volume", metavar="pvc:CLAIM|host:/PATH",
                     help="the volume mounted at /models that holds the Hugging Face cache and "
                          "any model folder (default pvc:hf-cache)")
    k8s.add_argument("--hf-token-secret", metavar="SECRET",
                     help="the Secret whose HF_TOKEN key the pods read (default hf-token; "
                          "optional)")
    k8s.add_argument("--namespace", metavar="NS", help="namespace (default: kubectl's current)")
    k8s.add_argument("--gateway", metavar="GATEWAY",
                     help="with --routing epp: the Gateway the HTTPRoute to the InferencePool "
                          "hangs from (default inference-gateway)")
    p.set_defaults(func=cmd_deploy)

    p = sub.add_parser("bench", help="measure a running deployment and compare with the plan")
    p.add_argument("plan", help="plan.yaml (its workload and predicted metrics)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--url", help="the deployment's router (default: the local router, "
                                      "http://127.0.0.1:<router port>)")
    source.add_argument("--from-file", metavar="RESULT.json",
                        help="compare a result measured elsewhere (`vllm bench serve "
                             "--save-result` JSON, e.g. a bench Job's, or aiperf's "
                             "profile_export_aiperf.json) instead of running one")
    p.add_argument("--out", metavar="DIR",
                   help="where the report goes (default runs/bench-<plan name>)")
    p.add_argument("--calibration", metavar="DIR",
                   help="predict again with the tables `rackplan calibrate --out DIR` wrote "
                        "(and its serving_overhead.json), instead of the plan's own prediction")
    p.set_defaults(func=cmd_bench)


def _load(path: str) -> Deployment:
    from planner.plan import load_plan_or_deployment

    deployment, _ = load_plan_or_deployment(path)
    return deployment


def model_path(deployment: Deployment, given: str | None, build: bool) -> str:
    """What vllm serves: `given`, else the tiny-moe model built for the CPU engine (built now
    when `build`), else the plan's model."""
    if given:
        return given
    if deployment.model == TINY_MOE:
        from executor import tinymodel

        if not build:
            return str(tinymodel.CACHE)
        try:
            return str(tinymodel.ensure_tiny_model())
        except RuntimeError as e:  # no engine environment, or the build failed
            raise LaunchError(str(e).splitlines()[0]) from None
    return deployment.model


def render_for(target: str, deployment: Deployment, model: str, **options: Any) -> Rendered:
    """The rendering a target launches (local puts every host on this machine), with the
    target's render options (local: base_port)."""
    return backend_class(target).render_for(deployment, model, **options)


def check_flags(deployment: Deployment, rendered: Rendered, with_vllm: bool) -> None:
    """vLLM's rules over every rendered command line (SpecError naming each problem); with
    `with_vllm`, vLLM's own parser too (a note on stderr when it cannot run)."""
    from executor.rules import check_rendered
    from simulator.specs.model import load_model

    model = load_model(deployment.model)
    check_rendered(rendered, model.n_routed_experts if model.is_moe else None,
                   model.architecture, deployment.hardware)
    if not with_vllm:
        return
    from executor.vllm_args import check_with_vllm

    result = check_with_vllm((f"{p.instance} host {p.host}", p.to_argv())
                             for p in rendered.processes)
    if result.skipped:
        print(f"rackplan: note: {result.skipped}", file=sys.stderr)
    elif result.errors:
        raise SpecError(f"vLLM {result.vllm_version} refuses: "
                        + "; ".join(str(e) for e in result.errors))


def local_command_lines(backend: Backend) -> list[str]:
    """Each process as the local backend would start it: environment, then the command (what
    its --dry-run prints)."""
    return backend.dry_run_lines()


TARGET_FLAGS = ("flavor", "name", "routing", "image", "router_image", "model_volume",
                "hf_token_secret", "namespace", "gateway", "base_port")
"""Deploy flags a target takes when its class lists them in `deploy_options`."""


def target_options(target: type[Backend], args: argparse.Namespace) -> dict[str, str]:
    """The target's own flags that were given (the name defaults to the plan's file name);
    SpecError for a flag the target does not take."""
    takes = getattr(target, "deploy_options", ())
    given = {key: getattr(args, key) for key in TARGET_FLAGS if getattr(args, key) is not None}
    for key in given:
        if key not in takes:
            owners = [b for b in BACKENDS if key in getattr(backend_class(b), "deploy_options",
                                                            ())]
            raise SpecError(f"--{key.replace('_', '-')} is not an option of --target "
                            f"{target.name}; it is one of --target {' or '.join(owners)}")
    if "name" in takes and "name" not in given:
        given["name"] = Path(args.plan).stem
    return given


def cmd_deploy(args: argparse.Namespace) -> int:
    if args.stop or args.status:
        return _run_dir_command(args)
    if args.plan is None or args.target is None:
        raise SpecError("rackplan deploy needs a plan and --target TARGET (or --stop RUN_DIR / "
                        "--status RUN_DIR for a local deployment)")
    target = backend_class(args.target)
    if not args.timeout > 0 or args.timeout == float("inf"):
        raise SpecError(f"--timeout {args.timeout:g} must be a positive, finite number of "
                        "seconds")
    if not 0 <= args.restart <= MAX_RESTARTS:
        raise SpecError(f"--restart {args.restart} must be between 0 and {MAX_RESTARTS}")
    if args.base_port is not None and not 1025 <= args.base_port <= 65000:
        raise SpecError(f"--base-port {args.base_port} must be between 1025 and 65000 (the "
                        "router takes the port below it, the instances the ports above)")
    deployment = _load(args.plan)
    engine_for(deployment)  # an engine rackplan does not deploy is refused before anything
    run_dir = writable(args.out or Path("runs") / f"deploy-{Path(args.plan).stem}", "--out",
                       folder=True)
    try:
        if not args.dry_run:
            target.preflight(deployment)
        model = model_path(deployment, args.model_path, build=not args.dry_run)
    except LaunchError as e:
        print(f"rackplan: error: {e}", file=sys.stderr)
        return EXIT_LAUNCH_FAILED
    options = target_options(target, args)
    rendering = {k: v for k, v in options.items() if k in target.render_options}
    rendered = render_for(args.target, deployment, model, **rendering)
    check_flags(deployment, rendered, args.check_flags)
    backend = get_backend(args.target, rendered, run_dir,
                          **{k: v for k, v in options.items() if k not in rendering})
    if args.dry_run:
        for line in backend.dry_run_lines():
            print(line)
        return 0
    return _launch(backend, args.timeout, args.restart)


MAX_RESTARTS = 1000
"""The most restarts --restart may allow: past that a crash loop is a failure to report."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Signals that stop a deployment; each gets the same orderly teardown and message."""


class Stopped(BaseException):
    """A stop signal arrived (raised by deploy's handler, wherever the main thread is)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


class _StopHandler:
    """Raises Stopped for the first stop signal; later ones wait for the teardown it began."""

    def __init__(self) -> None:
        self.fired = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if not self.fired:
            self.fired = True
            raise Stopped(signum)


def _stop_handlers() -> tuple[dict[int, Any], list[str]]:
    """Deploy's handlers for STOP_SIGNALS (the previous ones, to restore), and the names of
    those this process inherited as ignored: they stay ignored (a background job's SIGINT,
    nohup's SIGHUP), and deploy says so."""
    previous: dict[int, Any] = {}
    ignored: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        return previous, ignored
    handler = _StopHandler()
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:
            ignored.append(sig.name)
        else:
            previous[sig] = signal.signal(sig, handler)
    return previous, ignored


def _launch(backend: Backend, timeout_s: float, restarts: int = 0) -> int:
    """Launch, wait, print the URL; a foreground target serves, watched, until a stop signal.
    Teardown on any failure and on the stop."""
    previous, ignored = _stop_handlers()
    try:
        for name in ignored:
            print(f"rackplan: note: {name} is ignored by this process (as it was started); "
                  f"stop the deployment with SIGTERM or `rackplan deploy --stop "
                  f"{backend.run_dir}`", file=sys.stderr)
        return _serve(backend, timeout_s, restarts)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve(backend: Backend, timeout_s: float, restarts: int) -> int:
    ready = False
    try:
        backend.launch()  # each backend writes its files first
        backend.wait_ready(timeout_s)
        ready = True
        print(f"router: {backend.url or 'see ' + str(backend.run_dir)}", flush=True)
        if not backend.foreground:
            print(f"running on {backend.name}; files in {backend.run_dir}", file=sys.stderr)
            return 0
        print(f"serving; press Ctrl-C or send SIGTERM to stop (status: rackplan deploy "
              f"--status {backend.run_dir})", file=sys.stderr, flush=True)
        backend.supervise(restarts, timeout_s, _say)
        raise LaunchError("the deployment's supervisor returned")  # it only ever raises
    except LaunchError as e:
        print(f"rackplan: error: {e}", file=sys.stderr, flush=True)
        backend.teardown()
        return EXIT_LAUNCH_FAILED
    except Stopped as stop:
        if not ready:
            print(f"rackplan: {stop.name} before the deployment was ready; tearing it down",
                  file=sys.stderr, flush=True)
            backend.teardown()
            return 128 + stop.signum
        print(f"rackplan: {stop.name}: stopping; tearing the deployment down", file=sys.stderr,
              flush=True)
        backend.teardown()
        print("rackplan: stopped", file=sys.stderr)
        return 0
    except BaseException:
        backend.teardown()
        raise


def _say(line: str) -> None:
    print(f"rackplan: {line}", file=sys.stderr, flush=True)


def _run_dir_command(args: argparse.Namespace) -> int:
    """deploy --stop RUN_DIR / --status RUN_DIR (a local deployment's run directory)."""
    from executor.backends.local import TERM_GRACE_S
    from executor.backends.runs import status_rows, stop_run

    if args.plan is not None or args.target not in (None, "local"):
        raise SpecError("--stop and --status take a local deployment's run directory and no "
                        "plan or other --target")
    try:
        if args.stop:
            ended = stop_run(Path(args.stop), TERM_GRACE_S, _say)
            print(f"rackplan: {'nothing was running' if not ended else 'stopped'} in "
                  f"{args.stop}", file=sys.stderr)
            return 0
        rows = status_rows(Path(args.status))
    except LaunchError as e:
        print(f"rackplan: error: {e}", file=sys.stderr)
        return EXIT_LAUNCH_FAILED
    for r in rows:
        state = "running" if r.running else "not running"
        health = {None: "", True: f", answering on port {r.port}",
                  False: f", not answering on port {r.port}"}[r.answering]
        print(f"{r.instance}: {state} (pid {r.pid}){health}")
    up = all(r.running and r.answering is not False for r in rows)
    return 0 if up else EXIT_LAUNCH_FAILED


def cmd_bench(args: argparse.Namespace) -> int:
    from executor.backends.local import render_local

    deployment = _load(args.plan)
    run_dir = writable(args.out or Path("runs") / f"bench-{Path(args.plan).stem}", "--out",
                       folder=True)
    repredict = args.calibration is not None
    if args.from_file:  # measured elsewhere: compare only, run nothing
        from executor.bench import compare_file

        report = compare_file(Path(args.plan), Path(args.from_file), run_dir,
                              repredict=repredict)
    else:
        url = args.url or f"http://127.0.0.1:{render_local(deployment).router['port']}"
        from executor.bench import run_bench

        try:
            report = run_bench(Path(args.plan), url, run_dir, repredict=repredict)
        except LaunchError as e:  # bench's BenchError among them
            print(f"rackplan: error: {e}", file=sys.stderr)
            return EXIT_LAUNCH_FAILED
    source = (f"simulated now with the tables in {args.calibration}" if args.calibration
              else "the plan's own")
    print(f"prediction: {source}")
    print(report.table())
    for path in report.paths:
        print(f"report: {path}")
    return 0
