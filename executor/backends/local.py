"""The local backend: every process of a deployment as a subprocess on this machine.

Each `vllm serve` process runs in its own process group (vLLM's engine and worker processes can
outlive the API server for seconds, so the whole group is ended), in the run directory, with its
output in run_dir/logs/<instance>-h<host>.log and HF_HUB_OFFLINE=1. The P/D proxy
(`python -m executor.proxy`) runs in front of them. Readiness is a real completion answered by
every instance and then by the proxy, not /health alone (the CPU engine says 200 there before
it crashes on its first request). Teardown ends every group (SIGTERM, then SIGKILL), runs at
exit and on SIGINT/SIGTERM too, and may be called any number of times.

The engine comes from the engine environment: `vllm` in $RACKPLAN_ENGINE_VENV/bin, by default
.venv-engine/bin at the repository root (`make engine` builds it); pass `vllm=` to use another.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar
from urllib.parse import urlsplit

from executor.backends.base import Backend, LaunchError, write_atomic
from executor.backends.procs import (
    INSTANCE_VAR,
    RUN_VAR,
    belongs,
    command,
    group_members,
    holding,
    listening_sockets,
    port_free,
    port_holder,
    started,
)
from executor.backends.runs import PIDS_FILE, end_groups, health, remove_inside, write_run
from executor.records import LaunchRecord, Rendered
from executor.render import render
from simulator.specs.deployment import Deployment

ROOT = Path(__file__).resolve().parents[2]
ENGINE_VENV_VAR = "RACKPLAN_ENGINE_VENV"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
LOG_TAIL_LINES = 20
TERM_GRACE_S = 20.0
"""Seconds a process group has to exit after SIGTERM before it gets SIGKILL."""
PROBE_PROMPT = "rackplan readiness check: the planner searches deployments of prefill and decode"
PROXY = "proxy"
"""Instance name of the P/D proxy in logs, records and errors."""


def engine_venv() -> Path:
    """The engine environment: $RACKPLAN_ENGINE_VENV, else .venv-engine at the repo root."""
    return Path(os.environ.get(ENGINE_VENV_VAR) or ROOT / ".venv-engine")


def default_vllm() -> Path:
    """The engine environment's `vllm` executable."""
    return engine_venv() / "bin" / "vllm"


def render_local(deployment: Deployment, model_path: str | None = None, base_port: int = 8100,
                 rpc_base_port: int = 29550, **kwargs: Any) -> Rendered:
    """`render` with every host on this machine (127.0.0.1), as the local backend needs."""
    rendered = render(deployment, model_path, base_port, rpc_base_port, LOCAL_HOSTS[0],
                      **kwargs)
    if deployment.hardware != "cpu":
        return rendered
    return bind_cores(rendered, sorted(os.sched_getaffinity(0)))


CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
"""vLLM's CPU build: the cores a worker's OpenMP threads are pinned to ("0-3", "4")."""


def bind_cores(rendered: Rendered, cores: list[int]) -> Rendered:
    """Give each CPU engine process its own share of `cores`, so that instances on one machine
    do not each spread their threads over every core and fight for them. With fewer cores than
    processes, processes share cores round-robin. The launch pins the whole engine to that
    share (its API server, engine core and worker: `bound_cores`), not only the worker's
    threads: vLLM's worker busy-polls for its next step for a second after each one, so an
    engine whose API server and engine core float over the machine takes the other engine's
    core from it (measured here on 1 prefill + 1 decode on two cores, concurrency 4: output
    throughput 315 tokens/s with only the workers pinned, 474 with each engine pinned). One
    engine on several cores takes all but the first, which its proxy and a benchmark client
    take (`client_cores`): left to float beside vLLM's own binding of the worker, the API
    server fell behind the engine (tiny-moe aggregated on two cores, 16 users, 8 sequences:
    3.6 requests decoded per step and 65 % of the tokens streamed on their own; pinned, 8.0 and
    100 %)."""
    procs = rendered.processes
    if not procs or not cores or (len(procs) == 1 and len(cores) == 1):
        return rendered
    if len(procs) == 1:  # one engine: the first core stays for the proxy and the client
        cores = cores[1:]
    out = []
    for i, p in enumerate(procs):
        if len(cores) >= len(procs):
            share = len(cores) // len(procs)
            mine = cores[i * share:(i + 1) * share]
        else:
            mine = [cores[i % len(cores)]]
        spec = str(mine[0]) if len(mine) == 1 else f"{mine[0]}-{mine[-1]}"
        if mine != list(range(mine[0], mine[-1] + 1)):
            spec = ",".join(map(str, mine))
        out.append(replace(p, env={**p.env, CPU_BIND_ENV: spec}))
    return replace(rendered, processes=tuple(out))


def bound_cores(env: Mapping[str, str]) -> tuple[int, ...] | None:
    """The cores a process's CPU_BIND_ENV names ("0", "2-3", "0,2"); None when it has none."""
    spec = env.get(CPU_BIND_ENV, "").strip()
    if not spec or spec in ("auto", "all", "nobind"):
        return None
    out: list[int] = []
    for part in spec.replace("|", ",").split(","):
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return tuple(out)


def client_cores(rendered: Rendered) -> tuple[int, ...] | None:
    """Where the proxy and a benchmark client on this machine run beside a pinned CPU
    deployment: the cores no engine holds where there are any (beside one engine), else the
    first engine's (the prefill instance's in P/D, whose engine is idle most of the time),
    never the decode engine's; None when the engines are not pinned."""
    first = rendered.processes[0] if rendered.processes else None
    mine = None if first is None else bound_cores(first.env)
    if mine is None:
        return None
    held = {c for p in rendered.processes for c in bound_cores(p.env) or ()}
    free = tuple(c for c in sorted(os.sched_getaffinity(0)) if c not in held)
    return free or mine


def taskset(cores: tuple[int, ...] | None) -> list[str]:
    """The `taskset -c` prefix that pins a shell command to `cores` (none for None)."""
    return [] if not cores else ["taskset", "-c", ",".join(map(str, cores))]


def local_client_cores(deployment: Deployment, url: str) -> tuple[int, ...] | None:
    """`client_cores` of a CPU deployment the local backend runs here, for a benchmark client
    that talks to it at `url` on this machine; None for any other (nothing to stay off)."""
    if deployment.hardware != "cpu" or urlsplit(url).hostname not in LOCAL_HOSTS:
        return None
    return client_cores(render_local(deployment))


@contextlib.contextmanager
def pinned(cores: tuple[int, ...] | None) -> Iterator[None]:
    """Run the body (a process start: the child inherits it) on `cores` only; this thread's
    own affinity is restored after. Nothing changes for None or where the OS has no
    affinity."""
    if not cores or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def ephemeral_low() -> int:
    """The lowest port this system gives outgoing connections (Linux's ip_local_port_range;
    32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_base_port(count: int) -> int:
    """A base port such that base-1 .. base+count-1 are free now on 127.0.0.1 (the router sits
    at base-1), so that a local deployment does not collide with what already listens here;
    below the system's ephemeral ports where there is room: a readiness probe of a port there
    that no server holds yet can connect to itself and hold it, and the engine then fails to
    bind it (seen in make test). Where to start turns with the process id, so that parallel
    processes try different ports first."""
    candidates = list(range(20001, ephemeral_low() - count, 53)) or list(range(20001, 60000, 53))
    start = (os.getpid() * 37) % len(candidates)
    for candidate in candidates[start:] + candidates[:start]:
        if all(port_free(p, "127.0.0.1", reuse=False)
               for p in range(candidate - 1, candidate + count)):
            return candidate
    raise LaunchError(f"no {count + 1} consecutive free ports on this machine")


def gpus_here() -> int:
    """GPUs this machine has, as `nvidia-smi -L` lists them (0 without the tool)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


def check_fits_here(deployment: Deployment, gpus: int | None = None) -> None:
    """Refuse, before anything starts, a GPU deployment larger than this machine: the local
    backend puts every rank of every instance here. `gpus`: what this machine has (default:
    counted with nvidia-smi). The cpu hardware runs on this machine's cores, without a host KV
    tier: vLLM 0.32's CPU build refuses both its offloading connectors (OffloadingConnector's
    CPU spec: "only supported on CUDA-alike and XPU GPUs"; SimpleCPUOffloadConnector copies on
    CUDA streams), after a minute of start-up."""
    if deployment.hardware == "cpu":
        tiered = [(name, r.host_cache_gb) for name, r in deployment.roles.items()
                  if r.host_cache_gb > 0]
        if tiered:
            name, gib = tiered[0]
            raise LaunchError(f"the {name} role asks for a host KV tier (host_cache_gb "
                              f"{gib:g}), which vLLM's CPU build cannot run (its offloading "
                              "connectors need a CUDA or XPU GPU); set host_cache_gb: 0 to "
                              "deploy it here, or deploy it on GPUs")
        return
    need = deployment.gpus_used
    have = gpus_here() if gpus is None else gpus
    if need > have:
        raise LaunchError(f"the deployment needs {need} {deployment.hardware} GPUs on this "
                          f"machine and it has {have}; deploy it with --target kubernetes or "
                          "slurm, or locally a plan on hardware cpu")


HEALTH_INTERVAL_S = 5.0
"""Seconds between two rounds of the supervisor's checks once the deployment is ready."""
HEALTH_MISSES = 3
"""Health checks in a row an instance may miss before the supervisor calls it dead: a CPU
engine in the middle of a long prefill can be slow to answer one."""
HEALTH_TIMEOUT_S = 10.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Signals that stop a deployment: each gets the same orderly teardown."""
WATCHDOG_LOG = "watchdog.log"


@dataclass(frozen=True)
class Launched:
    """One started process: what it is, its ids, its port and its log."""

    instance: str
    host: int
    pid: int
    pgid: int
    log: Path
    port: int | None = None
    """The HTTP port it serves (an instance's head, the proxy); None for a headless host."""


@dataclass(frozen=True)
class _Command:
    """How to start one process of the deployment (the proxy's host is -1)."""

    instance: str
    host: int
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log: Path
    port: int | None
    cores: tuple[int, ...] | None = None
    """The cores the process and its children are pinned to (None: wherever the OS puts
    them)."""


class LocalBackend(Backend):
    """Subprocesses in their own process groups on this machine, and the P/D proxy."""

    name: ClassVar[str] = "local"
    foreground = True
    deploy_options: ClassVar[tuple[str, ...]] = ("base_port",)
    render_options: ClassVar[tuple[str, ...]] = ("base_port",)

    def __init__(self, rendered: Rendered, run_dir: Path, *, vllm: str | Path | None = None,
                 python: str | Path | None = None, env: Mapping[str, str] | None = None,
                 term_grace_s: float = TERM_GRACE_S) -> None:
        super().__init__(rendered, run_dir)
        self.vllm = Path(vllm) if vllm is not None else default_vllm()
        """The `vllm` executable every process runs."""
        self.python = str(python or sys.executable)
        """Interpreter that runs the proxy and the watchdog (they need this project)."""
        self.extra_env = dict(env or {})
        """Environment added to every process (after HF_HUB_OFFLINE=1, before the rendered)."""
        self.term_grace_s = term_grace_s
        self.launched: list[Launched] = []
        """Every process started, the proxy last; kept after teardown so callers can check."""
        self.run_token = ""
        """The token every process of the current launch carries in RACKPLAN_RUN."""
        self.ignored_signals: list[str] = []
        """Stop signals this process inherited as ignored (a background job's SIGINT, nohup's
        SIGHUP): they stay ignored, and the caller says so."""
        self._popen: dict[int, subprocess.Popen[bytes]] = {}
        self._tearing_down = False
        self._previous: dict[int, Any] = {}
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._watch_fd: int | None = None

    # --- files -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The proxy's base URL: what clients and `vllm bench serve` talk to."""
        return f"http://127.0.0.1:{self.rendered.router['port']}"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    def log_path(self, instance: str, host: int | None = None) -> Path:
        """Where a process writes its output (the proxy has no host index)."""
        return self.log_dir / (f"{instance}.log" if host is None else f"{instance}-h{host}.log")

    @property
    def kv_dir(self) -> Path | None:
        """The shared-storage KV folder the processes hand KV over through (ExampleConnector
        on CPU), resolved against the run directory they run in; None without one."""
        for p in self.rendered.processes:
            found = _storage_path(p.value("--kv-transfer-config"))
            if found:
                return Path(found) if Path(found).is_absolute() else self.run_dir / found
        return None

    @classmethod
    def render_for(cls, deployment: Deployment, model: str, base_port: int | None = None,
                   **options: Any) -> Rendered:
        """Every host on this machine (render_local), from `base_port` when given."""
        if base_port is None:
            return render_local(deployment, model)
        return render_local(deployment, model, base_port=int(base_port))

    @classmethod
    def preflight(cls, deployment: Deployment) -> None:
        """A GPU deployment larger than this machine is refused (check_fits_here)."""
        check_fits_here(deployment)

    def dry_run_lines(self) -> list[str]:
        """Each process as launch would start it: its environment, then its command; nothing
        is written."""
        lines = []
        for p in self.rendered.processes:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.environment(p).items()))
            lines.append((env + " " if env else "") + shlex.join(self.pinned_argv(p)))
        return lines

    def pinned_argv(self, process: LaunchRecord) -> list[str]:
        """`argv` behind `taskset -c CORES` where the process is pinned (the launch itself
        pins with sched_setaffinity), as commands.sh and --dry-run show it."""
        return [*taskset(bound_cores(process.env)), *self.argv(process)]

    def argv(self, process: LaunchRecord) -> list[str]:
        """The process's command with the engine environment's `vllm`, and a model folder
        given relative to here made absolute (the processes run in the run directory)."""
        launcher, model = process.launcher, process.model
        if launcher[:1] == ("vllm",):
            launcher = (str(self.vllm), *launcher[1:])
        if not Path(model).is_absolute() and Path(model).exists():
            model = str(Path(model).resolve())
        return list(replace(process, launcher=launcher, model=model).to_argv())

    def environment(self, process: LaunchRecord | None) -> dict[str, str]:
        """What a process adds to this process's environment."""
        env = {"HF_HUB_OFFLINE": "1", **self.extra_env}
        if process is not None:
            env.update(process.env)
        return env

    def proxy_argv(self) -> list[str]:
        """The proxy's command."""
        return [self.python, "-m", "executor.proxy", "--config",
                str((self.run_dir / "router.json").resolve())]

    def render(self) -> list[Path]:
        """Write commands.sh (one line per process, then the proxy) and router.json."""
        self._check_local()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        lines = ["#!/usr/bin/env bash",
                 "# rackplan local deployment: one line per process, the P/D proxy last.",
                 'cd "$(dirname "$0")"', "mkdir -p logs"]
        for p in self.rendered.processes:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.environment(p).items()))
            log = self.log_path(p.instance, p.host).relative_to(self.run_dir)
            lines.append(f"{env} setsid {shlex.join(self.pinned_argv(p))} > {log} 2>&1 &")
        log = self.log_path(PROXY).relative_to(self.run_dir)
        proxy = [*taskset(client_cores(self.rendered)), *self.proxy_argv()]
        lines.append(f"(cd {shlex.quote(str(ROOT))} && {shlex.join(proxy)}) > {log} 2>&1 &")
        lines.append("wait")
        commands = write_atomic(self.run_dir / "commands.sh", "\n".join(lines) + "\n", mode=0o755)
        router = write_atomic(self.run_dir / "router.json",
                              json.dumps(self.rendered.router, indent=2, sort_keys=True) + "\n")
        return [commands, router]

    def _check_local(self) -> None:
        keys = ("prefill_urls", "decode_urls", "aggregated_urls")
        hosts = {urlsplit(str(u)).hostname or "" for key in keys
                 for u in _as_list(self.rendered.router.get(key))}
        foreign = sorted(h for h in hosts if h not in LOCAL_HOSTS)
        if foreign:
            raise LaunchError(f"the local backend runs every process on this machine, but the "
                              f"deployment was rendered for host {foreign[0]!r}; render it with "
                              "executor.backends.local.render_local")

    def ports(self) -> dict[int, str]:
        """Every port the deployment will listen on, and what listens there: each instance's
        HTTP port, a data-parallel head's RPC port, the proxy's port."""
        out: dict[int, str] = {}
        for p in self.rendered.processes:
            if p.port is not None:
                out[p.port] = p.instance
            if p.dp is not None and p.dp.rpc_port is not None and not p.dp.headless:
                out[p.dp.rpc_port] = f"{p.instance}'s data-parallel RPC"
        out[self.router_port] = PROXY
        return out

    def _check_ports(self) -> None:
        for port, what in sorted(self.ports().items()):
            if not port_free(port):
                raise LaunchError(f"port {port} ({what}) is already in use by "
                                  f"{port_holder(port)}; stop that, or deploy on other ports "
                                  "(--base-port)")

    # --- launch ----------------------------------------------------------------------------

    def _commands(self) -> list[_Command]:
        """Every process to start, the proxy last."""
        out = [_Command(p.instance, p.host, self.argv(p), self.environment(p), self.run_dir,
                        self.log_path(p.instance, p.host), p.port, bound_cores(p.env))
               for p in self.rendered.processes]
        out.append(_Command(PROXY, -1, self.proxy_argv(), self.environment(None), ROOT,
                            self.log_path(PROXY), self.router_port,
                            client_cores(self.rendered)))
        return out

    def launch(self) -> None:
        """Check every port is free, start the watchdog, every process, then the proxy; on any
        failure end what started and raise."""
        if self.alive():
            raise LaunchError(f"the deployment in {self.run_dir} is already running; tear it "
                              "down before launching it again")
        self.render()
        self.launched = []
        if not self.vllm.exists():
            raise LaunchError(f"the engine executable {self.vllm} does not exist; run "
                              "`make engine` or pass vllm=")
        self._check_ports()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.run_token = secrets.token_hex(8)
        self._install_handlers()
        try:
            self._write_pids()
            self._start_watchdog()
            for c in self._commands():
                self._start(c)
        except OSError as exc:
            self.teardown()
            raise LaunchError(f"cannot start a process of the deployment: {exc}") from None

    def _start(self, c: _Command, append_log: bool = False) -> Launched:
        """Start one process in its own group; it takes its place in `launched` (its old
        place, for a restart) and pids.json is written at once."""
        with open(c.log, "ab" if append_log else "wb") as out, pinned(c.cores):
            proc = subprocess.Popen(
                c.argv, cwd=c.cwd, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, **c.env, RUN_VAR: self.run_token, INSTANCE_VAR: c.instance})
        self._popen[proc.pid] = proc
        started_one = Launched(c.instance, c.host, proc.pid, proc.pid, c.log, c.port)
        at = next((i for i, r in enumerate(self.launched)
                   if (r.instance, r.host) == (c.instance, c.host)), None)
        if at is None:
            self.launched.append(started_one)
        else:
            self.launched[at] = started_one
        self._write_pids()
        return started_one

    def _write_pids(self) -> None:
        rows = [{"instance": r.instance, "host": r.host, "pid": r.pid, "pgid": r.pgid,
                 "port": r.port, "log": str(r.log), "run": self.run_token}
                for r in self.launched]
        write_atomic(self.run_dir / PIDS_FILE, json.dumps(rows, indent=2) + "\n")

    def _start_watchdog(self) -> None:
        """The watchdog holds the read end of a pipe only this process writes: when this
        process dies, however, it ends what is left (executor/watchdog.py)."""
        read, write = os.pipe()
        try:
            with open(self.log_dir / WATCHDOG_LOG, "ab") as log:
                self._watchdog = subprocess.Popen(
                    [self.python, "-m", "executor.watchdog", str(self.run_dir.resolve()),
                     f"{self.term_grace_s:g}"],
                    cwd=ROOT, stdin=read, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True)
        except OSError:
            os.close(write)
            raise
        finally:
            os.close(read)
        self._watch_fd = write
        me = os.getpid()
        write_run(self.run_dir, self.run_token, me, started(me), self._watchdog.pid,
                  self.kv_dir)

    def _close_watchdog(self) -> None:
        if self._watch_fd is not None:
            os.close(self._watch_fd)
            self._watch_fd = None
        if self._watchdog is not None:
            try:
                self._watchdog.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait()
            self._watchdog = None

    # --- readiness -------------------------------------------------------------------------

    def wait_ready(self, timeout_s: float) -> None:
        """Return once each instance and then the proxy answered a completion, from the
        process this launch started on its port; else end everything and raise LaunchError
        naming the instance, with the tail of its log."""
        if not self.launched:
            raise LaunchError("nothing to wait for: launch() has not started the deployment")
        deadline = time.monotonic() + timeout_s
        try:
            heads = [p.instance for p in self.rendered.processes if p.port is not None]
            self._await(heads, deadline, timeout_s)
            self._await([PROXY], deadline, timeout_s)
        except LaunchError:
            self.teardown()
            raise

    def _await(self, names: list[str], deadline: float, timeout_s: float,
               phase: str = "before the deployment was ready") -> None:
        ports = {r.instance: r.port for r in self.launched if r.port is not None}
        waiting = [n for n in names if n in ports]
        while waiting:
            self._check_alive(phase)
            for name in list(waiting):
                port = ports[name]
                answered = _completes(f"http://127.0.0.1:{port}", deadline)
                if answered is None or not self._ours(name, port):
                    continue
                if name == PROXY and not answered.get("x-rackplan-decode"):
                    raise self._failure(PROXY, "the proxy answered without naming its decode "
                                               "instance")
                waiting.remove(name)
            if waiting and time.monotonic() >= deadline:
                raise self._failure(waiting[0], f"{waiting[0]} did not answer a completion "
                                                f"within {timeout_s:g} s")
            if waiting:
                time.sleep(0.5 if waiting == [PROXY] else 1.0)

    def _ours(self, instance: str, port: int) -> bool:
        """Whether the answer on `port` came from the process this launch started for
        `instance`: True, False when nothing listens there right now, LaunchError when
        another process does (an earlier deployment's leftover, say)."""
        sockets = listening_sockets(port)
        if sockets is None:  # no process table: the port was free at launch, trust it
            return True
        if not sockets:
            return False
        mine = [pid for r in self.launched if r.instance == instance
                for pid in group_members(r.pgid)]
        if any(belongs(pid, self.run_token, instance) for pid in holding(sockets, mine)):
            return True
        others = holding(sockets)
        if not others:  # it went away while we looked
            return False
        pid = min(others)
        raise self._failure(instance, f"port {port} of {instance} was answered by pid {pid} "
                                      f"({command(pid) or 'unknown'}), not by the {instance} "
                                      "this deployment started")

    def _check_alive(self, phase: str) -> None:
        for r in self.launched:
            code = self._popen[r.pid].poll()
            if code is not None:
                raise self._failure(r.instance, f"{r.instance}{_host(r)} exited "
                                                f"({_exit_text(code)}) {phase}", r.log)

    def _failure(self, instance: str, sentence: str, log: Path | None = None) -> LaunchError:
        if log is None:
            host = None if instance == PROXY else 0
            log = self.log_path(instance, host)
        tail = log_tail(log)
        body = "\n".join("  | " + line for line in tail) if tail else "  | (empty)"
        return LaunchError(f"{sentence}; last lines of {log}:\n{body}")

    # --- after ready -----------------------------------------------------------------------

    def supervise(self, restarts: int = 0, ready_timeout_s: float = 600.0,
                  say: Callable[[str], object] | None = None,
                  interval_s: float = HEALTH_INTERVAL_S) -> None:
        """Watch the ready deployment until the caller is stopped (a signal): every
        `interval_s` each process must still run and each instance and the proxy answer
        /health. One that exited, or missed HEALTH_MISSES checks in a row, is restarted (the
        whole instance, then waited for like at launch) while fewer than `restarts` restarts
        were made; else LaunchError names it with its log tail (the caller tears down)."""
        tell = say or _to_stderr
        made = 0
        misses: dict[str, int] = {}
        while True:
            problem = self._problem(misses)
            if problem is not None:
                instance, what, log = problem
                if made >= restarts:
                    again = f" (after {made} restart(s))" if made else ""
                    raise self._failure(instance, f"{instance} {what} after the deployment was "
                                                  f"ready{again}", log)
                made += 1
                tell(f"{instance} {what}; restarting it ({made} of {restarts})")
                self._restart(instance, ready_timeout_s)
                misses.clear()
                tell(f"{instance} is serving again")
                continue
            time.sleep(interval_s)

    def _problem(self, misses: dict[str, int]) -> tuple[str, str, Path] | None:
        """The first process that exited, or instance that stopped answering /health."""
        for r in self.launched:
            code = self._popen[r.pid].poll()
            if code is not None:
                where = f"host {r.host} " if r.host > 0 else ""
                return r.instance, f"{where}exited ({_exit_text(code)})", r.log
        for r in self.launched:
            if r.port is None:
                continue
            if health(r.port, HEALTH_TIMEOUT_S, any_status=r.instance == PROXY):
                misses.pop(r.instance, None)
                continue
            misses[r.instance] = misses.get(r.instance, 0) + 1
            if misses[r.instance] >= HEALTH_MISSES:
                return (r.instance, f"stopped answering /health on port {r.port} "
                                    f"({HEALTH_MISSES} checks in a row)", r.log)
        return None

    def _restart(self, instance: str, timeout_s: float) -> None:
        """End every process of `instance` and start them again on the same ports; return
        once it answers a completion (LaunchError if it does not within `timeout_s`)."""
        old = [r for r in self.launched if r.instance == instance]
        end_groups([r.pgid for r in old], self.term_grace_s, self._reap)
        for r in old:
            self._popen.pop(r.pid, None)
        for c in self._commands():
            if c.instance == instance:
                self._start(c, append_log=True)
        self._await([instance], time.monotonic() + timeout_s, timeout_s,
                    phase="while it was restarted")

    # --- teardown --------------------------------------------------------------------------

    def teardown(self) -> None:
        """SIGTERM every process group, SIGKILL what is left after the grace period, reap,
        remove the KV folder, let the watchdog go; idempotent, safe after a failed launch and
        from a signal handler."""
        if self._tearing_down:
            return
        self._tearing_down = True
        try:
            end_groups([r.pgid for r in self.launched], self.term_grace_s, self._reap)
            kv = self.kv_dir
            if self.launched and kv is not None:
                remove_inside(self.run_dir, kv)
            self._close_watchdog()
        finally:
            self._popen = {pid: p for pid, p in self._popen.items() if p.poll() is None}
            self._restore_handlers()
            self._tearing_down = False

    def _reap(self) -> None:
        for p in self._popen.values():
            p.poll()  # reap our own children so they do not linger as zombies

    def alive(self) -> list[Launched]:
        """The started processes whose group still has a live member."""
        return [r for r in self.launched if group_members(r.pgid)]

    # --- exit and signals ------------------------------------------------------------------

    def _install_handlers(self) -> None:
        atexit.register(self.teardown)
        if self._previous or not _main_thread():
            return
        self.ignored_signals = []
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) == signal.SIG_IGN:  # inherited: honoured, and said
                self.ignored_signals.append(sig.name)
                continue
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def _restore_handlers(self) -> None:
        atexit.unregister(self.teardown)
        if _main_thread():
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """A stop signal: the caller's handler if it had one, else KeyboardInterrupt for
        SIGINT and SystemExit(128 + signal) for the others; the teardown follows in the
        caller's cleanup or at exit. During a teardown, further signals wait for it."""
        if self._tearing_down:
            return
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            raise SystemExit(128 + signum)


def _exit_text(code: int) -> str:
    return f"exit code {code}" if code >= 0 else f"signal {-code}"


def _host(r: Launched) -> str:
    return f" (host {r.host})" if r.host > 0 else ""


def _to_stderr(line: str) -> None:
    print(f"rackplan: {line}", file=sys.stderr, flush=True)


def _storage_path(value: object) -> str | None:
    """The `shared_storage_path` anywhere in a --kv-transfer-config value (a MultiConnector
    nests its connectors' configs)."""
    if isinstance(value, Mapping):
        found = value.get("shared_storage_path")
        if isinstance(found, str) and found:
            return found
        values: list[object] = list(value.values())
    elif isinstance(value, list | tuple):
        values = list(value)
    else:
        return None
    return next((f for f in map(_storage_path, values) if f), None)


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else []


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last lines of a log file (empty if it is missing)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]


def _completes(url: str, deadline: float) -> dict[str, str] | None:
    """The answer headers of one short completion from `url` (its model named by /v1/models),
    or None if it cannot answer yet: also when what answers is not HTTP (a probe of a port no
    server holds yet can connect to itself and read its own request back)."""
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=min(5.0, left)) as resp:
            model = json.loads(resp.read())["data"][0]["id"]
        body = json.dumps({"model": model, "prompt": PROBE_PROMPT, "max_tokens": 2,
                           "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        left = deadline - time.monotonic()
        with urllib.request.urlopen(req, timeout=max(1.0, min(120.0, left))) as resp:
            answer = json.loads(resp.read())
            if resp.status == 200 and answer.get("choices"):
                return {k.lower(): v for k, v in resp.headers.items()}
    except (OSError, ValueError, KeyError, IndexError, TypeError, urllib.error.URLError,
            http.client.HTTPException):
        return None
    return None
