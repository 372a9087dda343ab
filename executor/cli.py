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

    p = sub.add_parser(
        "bench", help="measure a running deployment and compare with the plan",
        description="Run `vllm bench serve` with the plan's workload against a deployment and "
                    "set its TTFT, TPOT, ITL and throughput beside the plan's prediction. Each "
                    "run's prompts are written first with the engine's tokenizer "
                    "(executor/prompts.py: the lengths vLLM's random dataset draws, no two "
                    "prompts alike, none like another run's), so that no prompt is served "
                    "from a prefix cache that the prediction does not count.")
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
    p.add_argument("--mode", default="serve", metavar="MODE",
                   help="serve (default: the deployment at --url, end to end), or one role "
                        "alone, deployed here for the bench: decode_only (DecodeBenchConnector "
                        "fills each request's KV; TPOT, ITL, output throughput) or "
                        "prefill_only (one output token; TTFT, input throughput)")
    p.add_argument("--context", type=int, metavar="TOKENS",
                   help="isolated modes: the prompt length, and in decode_only the KV each "
                        "request decodes after")
    p.add_argument("--concurrency", type=int, metavar="N",
                   help="isolated modes: users of the closed loop (default 1)")
    p.add_argument("--sweep", metavar="L1,L2,...",
                   help="bench at each load (users of a closed loop, or requests/s of an "
                        "open one), each beside the simulator's prediction at that load: "
                        "sweep.json, sweep.md and the two curves")
    p.add_argument("--plot", metavar="OUT.png",
                   help="with --sweep: draw the predicted and measured curves (.png/.svg/.pdf)")
    p.add_argument("--num-prompts", type=int, metavar="N",
                   help="prompts per benchmark run (default: the plan's requests; isolated "
                        "modes: 4 per user, at least 8)")
    p.add_argument("--repeats", type=int, metavar="N",
                   help="isolated modes and --sweep: run each load N times on the same "
                        "deployment (prompts of their own each) and compare the median of the "
                        "runs (default 1; at most 20)")
    p.add_argument("--base-port", type=int, metavar="PORT",
                   help="isolated modes: the first port of the role deployed here (default "
                        "8100)")
    p.add_argument("--model-path", metavar="PATH",
                   help="isolated modes: what vllm serves (default: as deploy chooses)")
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
        return _serve(backend, timeout_s, restarts, ignored)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve(backend: Backend, timeout_s: float, restarts: int, ignored: list[str]) -> int:
    ready = False
    try:
        backend.launch()  # each backend writes its files first
        backend.wait_ready(timeout_s)
        ready = True
        print(f"router: {backend.url or 'see ' + str(backend.run_dir)}", flush=True)
        if not backend.foreground:
            print(f"running on {backend.name}; files in {backend.run_dir}", file=sys.stderr)
            return 0
        how = "send SIGTERM" if "SIGINT" in ignored else "press Ctrl-C or send SIGTERM"
        print(f"serving; {how} to stop (status: rackplan deploy --status {backend.run_dir})",
              file=sys.stderr, flush=True)
        if "SIGINT" in ignored:  # a background job's: kept, and said
            print(f"rackplan: note: SIGINT is ignored by this process (as it was started); "
                  f"stop the deployment with SIGTERM or `rackplan deploy --stop "
                  f"{backend.run_dir}`", file=sys.stderr, flush=True)
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

    isolated = args.mode != "serve"
    if isolated or args.sweep:
        return _bench_points(args)
    for flag in ("context", "concurrency", "plot", "base_port", "model_path", "repeats"):
        if getattr(args, flag) is not None:
            raise SpecError(f"--{flag.replace('_', '-')} goes with --mode decode_only/"
                            "prefill_only or --sweep")
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
            report = run_bench(Path(args.plan), url, run_dir, repredict=repredict,
                               num_prompts=_prompts(args))
        except LaunchError as e:  # bench's BenchError among them
            print(f"rackplan: error: {e}", file=sys.stderr)
            return EXIT_LAUNCH_FAILED
    from executor.bench import prediction_source

    print(f"prediction: {prediction_source(Path(args.plan), args.calibration)}")
    print(report.table())
    for path in report.paths:
        print(f"report: {path}")
    return 0


def _prompts(args: argparse.Namespace) -> int | None:
    if args.num_prompts is not None and not 1 <= args.num_prompts <= MAX_PROMPTS:
        raise SpecError(f"--num-prompts {args.num_prompts} must be between 1 and {MAX_PROMPTS}")
    return int(args.num_prompts) if args.num_prompts is not None else None


MAX_PROMPTS = 1_000_000
"""Prompts one benchmark run may send: past it a run on one engine takes days."""


def _bench_points(args: argparse.Namespace) -> int:
    """bench --mode decode_only/prefill_only and/or --sweep."""
    from executor.backends.local import render_local
    from executor.sweep import MAX_REPEATS, bench_points, parse_loads, write_plot

    isolated = args.mode != "serve"
    if isolated:
        from executor.isolated import mode_for

        mode_for(args.mode)
        if args.url or args.from_file:
            raise SpecError(f"--mode {args.mode} deploys the role here; it takes no --url or "
                            "--from-file")
        if args.context is None or not 1 <= args.context <= MAX_CONTEXT:
            raise SpecError(f"--mode {args.mode} needs --context TOKENS between 1 and "
                            f"{MAX_CONTEXT}")
        if args.sweep and args.concurrency is not None:
            raise SpecError("give --concurrency N or --sweep L1,L2,..., not both")
    elif args.from_file:
        raise SpecError("--sweep runs benchmarks; it cannot go with --from-file")
    if args.concurrency is not None and not 1 <= args.concurrency <= 100_000:
        raise SpecError(f"--concurrency {args.concurrency} must be between 1 and 100000")
    if args.repeats is not None and not 1 <= args.repeats <= MAX_REPEATS:
        raise SpecError(f"--repeats {args.repeats} must be between 1 and {MAX_REPEATS}")
    loads = parse_loads(args.sweep) if args.sweep else (float(args.concurrency or 1),)
    plot = None
    if args.plot:
        from planner.chart import check_chart_path

        if not args.sweep:
            raise SpecError("--plot draws a --sweep's curves; give --sweep L1,L2,...")
        plot = check_chart_path(args.plot)
    deployment = _load(args.plan)
    run_dir = writable(args.out or Path("runs") / f"bench-{Path(args.plan).stem}", "--out",
                       folder=True)
    model = None
    if isolated:
        try:
            model = model_path(deployment, args.model_path, build=True)
        except LaunchError as e:
            print(f"rackplan: error: {e}", file=sys.stderr)
            return EXIT_LAUNCH_FAILED
    url = None if isolated else (
        args.url or f"http://127.0.0.1:{render_local(deployment).router['port']}")
    try:
        report = bench_points(args.plan, run_dir, loads, mode=args.mode, url=url,
                              context=args.context, num_prompts=_prompts(args), model=model,
                              base_port=args.base_port, repredict=args.calibration is not None,
                              repeats=args.repeats or 1)
    except LaunchError as e:
        print(f"rackplan: error: {e}", file=sys.stderr)
        return EXIT_LAUNCH_FAILED
    print(f"mode: {args.mode}; prediction: simulated now at each load")
    if len(report.points) == 1 and not args.sweep:
        print(report.points[0].table())
        paths = report.points[0].paths
    else:
        print(report.table())
        paths = report.paths
        if plot is not None:
            paths = (*paths, write_plot(report, plot))
    for path in paths:
        print(f"report: {path}")
    return 0


MAX_CONTEXT = 1 << 24
"""The longest --context asked of an isolated bench (16M tokens, past any model's window; the
engine refuses what its own window cannot hold)."""
