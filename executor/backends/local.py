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
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar
from urllib.parse import urlsplit

from executor.backends.base import Backend, LaunchError, write_atomic
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
    processes, processes share cores round-robin."""
    procs = rendered.processes
    if len(procs) < 2 or not cores:
        return rendered
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


def free_base_port(count: int) -> int:
    """A base port such that base-1 .. base+count-1 are free now on 127.0.0.1 (the router sits
    at base-1), so that a local deployment does not collide with what already listens here."""
    for candidate in range(20000 + (os.getpid() * 37) % 20000, 60000, 53):
        if all(_port_free(p) for p in range(candidate - 1, candidate + count)):
            return candidate
    raise LaunchError(f"no {count + 1} consecutive free ports on this machine")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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
    counted with nvidia-smi). The cpu hardware runs on this machine's cores."""
    if deployment.hardware == "cpu":
        return
    need = deployment.gpus_used
    have = gpus_here() if gpus is None else gpus
    if need > have:
        raise LaunchError(f"the deployment needs {need} {deployment.hardware} GPUs on this "
                          f"machine and it has {have}; deploy it with --target kubernetes or "
                          "slurm, or locally a plan on hardware cpu")


@dataclass(frozen=True)
class Launched:
    """One started process: what it is, its ids and its log."""

    instance: str
    host: int
    pid: int
    pgid: int
    log: Path


class LocalBackend(Backend):
    """Subprocesses in their own process groups on this machine, and the P/D proxy."""

    name: ClassVar[str] = "local"
    foreground = True

    def __init__(self, rendered: Rendered, run_dir: Path, *, vllm: str | Path | None = None,
                 python: str | Path | None = None, env: Mapping[str, str] | None = None,
                 term_grace_s: float = TERM_GRACE_S) -> None:
        super().__init__(rendered, run_dir)
        self.vllm = Path(vllm) if vllm is not None else default_vllm()
        """The `vllm` executable every process runs."""
        self.python = str(python or sys.executable)
        """Interpreter that runs the proxy (it needs this project's packages)."""
        self.extra_env = dict(env or {})
        """Environment added to every process (after HF_HUB_OFFLINE=1, before the rendered)."""
        self.term_grace_s = term_grace_s
        self.launched: list[Launched] = []
        """Every process started, the proxy last; kept after teardown so callers can check."""
        self._popen: dict[int, subprocess.Popen[bytes]] = {}
        self._tearing_down = False
        self._previous: dict[int, Any] = {}

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

    @classmethod
    def render_for(cls, deployment: Deployment, model: str) -> Rendered:
        """Every host on this machine (render_local)."""
        return render_local(deployment, model)

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
            lines.append((env + " " if env else "") + shlex.join(self.argv(p)))
        return lines

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
            lines.append(f"{env} setsid {shlex.join(self.argv(p))} > {log} 2>&1 &")
        log = self.log_path(PROXY).relative_to(self.run_dir)
        lines.append(f"(cd {shlex.quote(str(ROOT))} && {shlex.join(self.proxy_argv())}) "
                     f"> {log} 2>&1 &")
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

    # --- launch ----------------------------------------------------------------------------

    def launch(self) -> None:
        """Start every process, then the proxy; on any failure end what started and raise."""
        if self.alive():
            raise LaunchError(f"the deployment in {self.run_dir} is already running; tear it "
                              "down before launching it again")
        self.render()
        self.launched = []
        if not self.vllm.exists():
            raise LaunchError(f"the engine executable {self.vllm} does not exist; run "
                              "`make engine` or pass vllm=")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._install_handlers()
        try:
            for p in self.rendered.processes:
                self._start(p.instance, p.host, self.argv(p), self.environment(p),
                            self.run_dir, self.log_path(p.instance, p.host))
            self._start(PROXY, None, self.proxy_argv(), self.environment(None), ROOT,
                        self.log_path(PROXY))
        except OSError as exc:
            self.teardown()
            raise LaunchError(f"cannot start a process of the deployment: {exc}") from None

    def _start(self, instance: str, host: int | None, argv: list[str], env: dict[str, str],
               cwd: Path, log: Path) -> None:
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **env}, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self._popen[proc.pid] = proc
        self.launched.append(Launched(instance, -1 if host is None else host, proc.pid,
                                      proc.pid, log))
        self._write_pids()

    def _write_pids(self) -> None:
        rows = [{"instance": r.instance, "host": r.host, "pid": r.pid, "pgid": r.pgid,
                 "log": str(r.log)} for r in self.launched]
        write_atomic(self.run_dir / "pids.json", json.dumps(rows, indent=2) + "\n")

    # --- readiness -------------------------------------------------------------------------

    def wait_ready(self, timeout_s: float) -> None:
        """Return once each instance and then the proxy answered a completion; else end
        everything and raise LaunchError naming the instance, with the tail of its log."""
        if not self.launched:
            raise LaunchError("nothing to wait for: launch() has not started the deployment")
        deadline = time.monotonic() + timeout_s
        try:
            heads = {p.instance: f"http://127.0.0.1:{p.port}"
                     for p in self.rendered.processes if p.port is not None}
            while heads:
                self._check_alive()
                for name, url in list(heads.items()):
                    if _completes(url, deadline) is not None:
                        del heads[name]
                if heads and time.monotonic() >= deadline:
                    name = next(iter(heads))
                    raise self._failure(name, f"{name} did not answer a completion within "
                                              f"{timeout_s:g} s")
                if heads:
                    time.sleep(1.0)
            while True:
                self._check_alive()
                answered = _completes(self.url, deadline)
                if answered is not None:
                    if answered.get("x-rackplan-decode"):
                        return
                    raise self._failure(PROXY, "the proxy answered without naming its decode "
                                               "instance")
                if time.monotonic() >= deadline:
                    raise self._failure(PROXY, f"the proxy did not answer a completion within "
                                               f"{timeout_s:g} s")
                time.sleep(0.5)
        except LaunchError:
            self.teardown()
            raise

    def _check_alive(self) -> None:
        for r in self.launched:
            code = self._popen[r.pid].poll()
            if code is not None:
                what = f"exit code {code}" if code >= 0 else f"signal {-code}"
                host = f" (host {r.host})" if r.host > 0 else ""
                raise self._failure(r.instance, f"{r.instance}{host} exited ({what}) before "
                                                "the deployment was ready", r.log)

    def _failure(self, instance: str, sentence: str, log: Path | None = None) -> LaunchError:
        if log is None:
            host = None if instance == PROXY else 0
            log = self.log_path(instance, host)
        tail = log_tail(log)
        body = "\n".join("  | " + line for line in tail) if tail else "  | (empty)"
        return LaunchError(f"{sentence}; last lines of {log}:\n{body}")

    # --- teardown --------------------------------------------------------------------------

    def teardown(self) -> None:
        """SIGTERM every process group, SIGKILL what is left after the grace period, reap;
        idempotent, safe after a failed launch and from a signal handler."""
        if self._tearing_down:
            return
        self._tearing_down = True
        try:
            groups = [r.pgid for r in self.launched]
            for pgid in groups:
                _signal_group(pgid, signal.SIGTERM)
            self._wait_groups(groups, self.term_grace_s)
            for pgid in groups:
                if group_members(pgid):
                    _signal_group(pgid, signal.SIGKILL)
            self._wait_groups(groups, 10.0)
        finally:
            self._popen = {pid: p for pid, p in self._popen.items() if p.poll() is None}
            self._restore_handlers()
            self._tearing_down = False

    def _wait_groups(self, groups: list[int], seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            for p in self._popen.values():
                p.poll()  # reap our own children so they do not linger as zombies
            if not any(group_members(g) for g in groups) or time.monotonic() >= end:
                return
            time.sleep(0.1)

    def alive(self) -> list[Launched]:
        """The started processes whose group still has a live member."""
        return [r for r in self.launched if group_members(r.pgid)]

    # --- exit and signals ------------------------------------------------------------------

    def _install_handlers(self) -> None:
        atexit.register(self.teardown)
        if self._previous or not _main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def _restore_handlers(self) -> None:
        atexit.unregister(self.teardown)
        if _main_thread():
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous.get(signum)
        self.teardown()
        if previous == signal.SIG_IGN:
            return
        if callable(previous):
            previous(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            raise SystemExit(128 + signum)


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else []


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


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
    or None if it cannot answer yet."""
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
    except (OSError, ValueError, KeyError, IndexError, TypeError, urllib.error.URLError):
        return None
    return None
