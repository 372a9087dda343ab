"""A local deployment that watches itself, on the fake engine: ports checked before launch,
readiness answered by our own processes, the supervisor after ready (deaths, hangs, restarts),
the watchdog when the deploying process is SIGKILLed, `deploy --stop/--status`, and the same
orderly teardown for SIGINT, SIGTERM and SIGHUP. test_engine_faults.py does the faults that
matter most on the real CPU engine."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import executor.backends.local as local
from executor.backends.base import LaunchError
from executor.backends.local import LocalBackend, group_members
from tests.executor.local_helpers import (
    TINY_AGG,
    TINY_PD,
    assert_nothing_left,
    engine_venv,
    fake_vllm,
    local_rendering,
    plan_deployment,
)

ROOT = Path(__file__).resolve().parents[2]
MODEL = "/models/tiny-moe"
SETTLE_S = 60.0
"""Polling limit for something that should happen within seconds (a loaded CI machine)."""


def backend(tmp_path: Path, plan: Path = TINY_AGG, **kwargs: object) -> LocalBackend:
    return LocalBackend(local_rendering(plan_deployment(plan), MODEL), tmp_path / "run",
                        vllm=fake_vllm(tmp_path), term_grace_s=1.0, **kwargs)


def wait_until(check: Callable[[], object], what: str, seconds: float = SETTLE_S) -> None:
    end = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < end, f"{what} did not happen within {seconds:g} s"
        time.sleep(0.2)


def groups(run_dir: Path) -> list[int]:
    return [row["pgid"] for row in json.loads((run_dir / "pids.json").read_text())]


def none_left(run_dir: Path) -> bool:
    return not any(group_members(g) for g in groups(run_dir))


STARTED: list[subprocess.Popen[str]] = []
"""Programs a test started that may outlive a failed assertion."""


@pytest.fixture(autouse=True)
def nothing_outlives_a_test() -> Iterator[None]:
    """A program a failed test left running is SIGKILLed (its watchdog ends its deployment)."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def ready_agg(tmp_path: Path) -> Iterator[LocalBackend]:
    b = backend(tmp_path)
    try:
        b.launch()
        b.wait_ready(60)
        yield b
    finally:
        b.teardown()
    assert_nothing_left(b)


def test_a_port_taken_by_a_foreign_listener_is_refused_before_anything_starts(tmp_path):
    b = backend(tmp_path, TINY_PD)
    port = b.rendered.processes[1].port
    assert port is not None
    with socket.socket() as foreign:
        foreign.bind(("127.0.0.1", port))
        foreign.listen()
        with pytest.raises(LaunchError) as err:
            b.launch()
    assert str(err.value).startswith(f"port {port} (decode-0) is already in use by "
                                     f"pid {os.getpid()} (")
    assert "--base-port" in str(err.value)
    assert b.launched == [] and not (b.run_dir / "pids.json").exists()


def test_readiness_refuses_an_answer_from_a_process_it_did_not_start(tmp_path):
    """The port was free at launch, then another server took it before ours listened: its
    answers are not our instance's."""
    b = backend(tmp_path, env={"FAKE_VLLM_DELAY_S": "30"})
    port = b.rendered.processes[0].port
    b.launch()
    foreign = subprocess.Popen([str(fake_vllm(tmp_path)), "serve", MODEL, "--port", str(port)],
                               stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        with pytest.raises(LaunchError) as err:
            b.wait_ready(60)
    finally:
        os.killpg(foreign.pid, signal.SIGKILL)
        foreign.wait()
    assert str(err.value).startswith(f"port {port} of aggregated-0 was answered by pid "
                                     f"{foreign.pid} (")
    assert "not by the aggregated-0 this deployment started" in str(err.value)
    assert_nothing_left(b)


def test_an_instance_killed_after_ready_is_named_with_its_log(ready_agg):
    victim = ready_agg.launched[0]
    os.killpg(victim.pgid, signal.SIGKILL)
    with pytest.raises(LaunchError, match=r"^aggregated-0 exited \(signal 9\) after the "
                                          r"deployment was ready; last lines of .*"
                                          r"aggregated-0-h0.log:\n  \| fake vllm serving"):
        ready_agg.supervise(restarts=0, interval_s=0.1)


def test_a_dead_instance_is_restarted_until_the_limit_then_named(tmp_path):
    b = backend(tmp_path, TINY_PD)
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if line.endswith("is serving again"):  # it came back: kill it once more
            os.killpg(next(r for r in b.launched if r.instance == "decode-0").pgid,
                      signal.SIGKILL)

    try:
        b.launch()
        b.wait_ready(60)
        first = next(r for r in b.launched if r.instance == "decode-0")
        os.killpg(first.pgid, signal.SIGKILL)
        with pytest.raises(LaunchError, match=r"^decode-0 exited \(signal 9\) after the "
                                              r"deployment was ready \(after 1 restart\(s\)\)"):
            b.supervise(restarts=1, ready_timeout_s=60, say=say, interval_s=0.1)
        assert said == ["decode-0 exited (signal 9); restarting it (1 of 1)",
                        "decode-0 is serving again"]
        second = next(r for r in b.launched if r.instance == "decode-0")
        assert second.pid != first.pid and second.port == first.port
        rows = json.loads((b.run_dir / "pids.json").read_text())
        assert [r["instance"] for r in rows] == ["prefill-0", "decode-0", "proxy"]
        assert rows[1]["pid"] == second.pid
        log = (b.run_dir / "logs" / "decode-0-h0.log").read_text()
        assert log.count("fake vllm serving") == 2  # the restart appends to the same log
    finally:
        b.teardown()
    assert_nothing_left(b)


def test_an_instance_that_stops_answering_health_is_named(ready_agg, monkeypatch):
    monkeypatch.setattr(local, "HEALTH_TIMEOUT_S", 0.5)
    victim = ready_agg.launched[0]
    os.killpg(victim.pgid, signal.SIGSTOP)  # alive, but answers nothing
    with pytest.raises(LaunchError, match=rf"^aggregated-0 stopped answering /health on port "
                                          rf"{victim.port} \(3 checks in a row\) after the "
                                          rf"deployment was ready"):
        ready_agg.supervise(restarts=0, interval_s=0.1)


LAUNCHER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from executor.backends.local import LocalBackend
    from tests.executor.local_helpers import TINY_PD, local_rendering, plan_deployment
    b = LocalBackend(local_rendering(plan_deployment(TINY_PD), {model!r}), Path({run!r}),
                     vllm={vllm!r}, term_grace_s=1.0)
    b.launch()
    b.wait_ready(60)
    (Path({run!r}) / "kv").mkdir(exist_ok=True)  # as ExampleConnector's shared folder
    (Path({run!r}) / "kv" / "blocks.safetensors").write_text("kv")
    print("ready", flush=True)
    time.sleep(600)
""")


def launched_elsewhere(tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    """A program that launched the P/D deployment and serves it; returns once it is ready."""
    run = tmp_path / "run"
    script = LAUNCHER.format(root=str(ROOT), model=MODEL, run=str(run),
                             vllm=str(fake_vllm(tmp_path)))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)
    STARTED.append(proc)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    assert all(group_members(g) for g in groups(run))
    return proc, run


def test_a_sigkilled_deploying_process_leaves_nothing_behind(tmp_path):
    proc, run = launched_elsewhere(tmp_path)
    proc.kill()  # SIGKILL: no handler, no atexit
    proc.wait()
    wait_until(lambda: none_left(run), "the watchdog's teardown")
    wait_until(lambda: not (run / "kv").exists(), "the KV folder's removal")
    wait_until(lambda: "ended 3 process group(s)" in (run / "logs" / "watchdog.log").read_text(),
               "the watchdog's note")


def rackplan(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, **kwargs)  # type: ignore[call-overload]


def test_stop_and_status_find_what_a_dead_run_left(tmp_path):
    proc, run = launched_elsewhere(tmp_path)
    os.kill(json.loads((run / "run.json").read_text())["watchdog"], signal.SIGKILL)
    proc.kill()  # the deploying process and its watchdog both gone: the processes are left
    proc.wait()
    assert all(group_members(g) for g in groups(run))

    status = rackplan("deploy", "--status", str(run))
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["prefill-0", "decode-0", "proxy"]
    assert all(": running (pid " in line and ", answering on port " in line for line in lines)

    stop = rackplan("deploy", "--stop", str(run))
    assert stop.returncode == 0, stop.stderr
    assert "rackplan: ending decode-0 (process group" in stop.stderr
    assert "rackplan: removed the KV folder" in stop.stderr
    assert stop.stderr.rstrip().endswith(f"rackplan: stopped in {run}")
    assert none_left(run) and not (run / "kv").exists()

    after = rackplan("deploy", "--status", str(run))
    assert after.returncode == 1
    assert all(": not running (pid " in line for line in after.stdout.splitlines())
    again = rackplan("deploy", "--stop", str(run))
    assert again.returncode == 0 and f"nothing was running in {run}" in again.stderr


def test_stop_of_a_folder_that_is_no_run_is_one_line(tmp_path):
    r = rackplan("deploy", "--stop", str(tmp_path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == (f"rackplan: error: {tmp_path} holds no run.json: it is not the "
                                "run directory of a local deployment (rackplan deploy --target "
                                "local --out DIR)")


def deploy_cli(tmp_path: Path, *extra: str, ignore: tuple[int, ...] = ()
               ) -> tuple[subprocess.Popen[str], Path]:
    """`rackplan deploy` of the aggregated CPU plan on the fake engine; returns once it printed
    the router (ready)."""
    run = tmp_path / "run"
    base = local.free_base_port(1)

    def start() -> None:
        for sig in ignore:
            signal.signal(sig, signal.SIG_IGN)

    proc = subprocess.Popen(
        [sys.executable, "-m", "planner.cli", "deploy", str(TINY_AGG), "--target", "local",
         "--model-path", MODEL, "--out", str(run), "--base-port", str(base), "--timeout", "60",
         *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=start,
        env={**os.environ, local.ENGINE_VENV_VAR: str(engine_venv(tmp_path))})
    STARTED.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line == f"router: http://127.0.0.1:{base - 1}\n", proc.communicate()[1]
    return proc, run


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_every_stop_signal_gets_the_same_orderly_teardown(tmp_path, sig):
    proc, run = deploy_cli(tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert f"rackplan: {sig.name}: stopping; tearing the deployment down\n" in err
    assert err.endswith("rackplan: stopped\n") and "Traceback" not in err
    assert none_left(run)


def test_an_inherited_ignored_sigint_stays_ignored_and_is_said(tmp_path):
    proc, run = deploy_cli(tmp_path, ignore=(signal.SIGINT,))
    proc.send_signal(signal.SIGINT)
    time.sleep(2.0)  # room for a wrong teardown to begin
    assert proc.poll() is None and all(group_members(g) for g in groups(run))
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert err.startswith(f"serving; send SIGTERM to stop (status: rackplan deploy --status "
                          f"{run})\nrackplan: note: SIGINT is ignored by this process (as it "
                          f"was started); stop the deployment with SIGTERM or `rackplan deploy "
                          f"--stop {run}`\n")
    assert "rackplan: SIGTERM: stopping" in err and none_left(run)


def test_deploy_exits_1_naming_an_instance_that_died_after_ready(tmp_path):
    proc, run = deploy_cli(tmp_path)
    os.killpg(groups(run)[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "rackplan: error: aggregated-0 exited (signal 9) after the deployment was ready; " \
           "last lines of " in err
    assert "Traceback" not in err and none_left(run)


def test_deploy_restarts_an_instance_when_asked(tmp_path):
    proc, run = deploy_cli(tmp_path, "--restart", "1")
    first = groups(run)[0]
    os.killpg(first, signal.SIGKILL)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("rackplan: aggregated-0 is serving again"):
            break
    assert groups(run)[0] != first and group_members(groups(run)[0])
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=120)[1]
    assert proc.returncode == 0 and rest.endswith("rackplan: stopped\n") and none_left(run)
