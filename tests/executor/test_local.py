"""executor/backends/local: launch, readiness, failures and teardown, on a fake engine.

The fake (tests/executor/fake_vllm.py) answers like `vllm serve` and keeps a child process in
its group, so these tests check process groups, logs, LaunchError and "nothing left behind" in
seconds; test_engine_local.py does the same with the real CPU engine.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from executor.backends import get_backend
from executor.backends.base import LaunchError
from executor.backends.local import LocalBackend, group_members, log_tail
from executor.render import render
from tests.executor.local_helpers import (
    TINY_AGG,
    TINY_PD,
    assert_nothing_left,
    fake_vllm,
    local_rendering,
    plan_deployment,
    with_flag,
)

ROOT = Path(__file__).resolve().parents[2]
MODEL = "/models/tiny-moe"


def backend(tmp_path: Path, plan: Path = TINY_PD, **kwargs: object) -> LocalBackend:
    rendered = local_rendering(plan_deployment(plan), MODEL)
    return LocalBackend(rendered, tmp_path / "run", vllm=fake_vllm(tmp_path), **kwargs)


def post(url: str, body: dict[str, object]) -> tuple[dict[str, str], bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return {k.lower(): v for k, v in resp.headers.items()}, resp.read()


def test_get_backend_builds_the_local_backend(tmp_path):
    rendered = local_rendering(plan_deployment(TINY_AGG), MODEL)
    assert isinstance(get_backend("local", rendered, tmp_path), LocalBackend)


def test_render_writes_one_command_line_per_process_and_the_router(tmp_path):
    b = backend(tmp_path)
    commands, router = b.render()
    lines = commands.read_text().splitlines()
    procs = [line for line in lines if " serve " in line]
    assert len(procs) == 2 and os.access(commands, os.X_OK)
    for line, p in zip(procs, b.rendered.processes, strict=True):
        assert line.startswith("HF_HUB_OFFLINE=1 ") and " setsid " in line
        assert f"{fake_vllm(tmp_path)} serve {MODEL}" in line
        assert line.endswith(f"> logs/{p.instance}-h0.log 2>&1 &")
    assert any("-m executor.proxy --config" in line for line in lines)
    assert json.loads(router.read_text()) == b.rendered.router
    assert not (b.run_dir / "pids.json").exists()  # render starts nothing


def test_relative_model_folder_is_made_absolute(tmp_path, monkeypatch):
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    b = LocalBackend(local_rendering(plan_deployment(TINY_AGG), "models/tiny"), tmp_path / "run",
                     vllm=fake_vllm(tmp_path))
    (p,) = b.rendered.processes
    assert b.argv(p)[1:3] == ["serve", str(tmp_path / "models" / "tiny")]


def test_render_refuses_a_rendering_for_other_hosts(tmp_path):
    rendered = render(plan_deployment(TINY_PD), MODEL)  # host0, host1
    with pytest.raises(LaunchError, match=r"rendered for host 'host0'.*render_local"):
        LocalBackend(rendered, tmp_path).render()


def test_missing_engine_is_a_launch_error_naming_it(tmp_path):
    b = LocalBackend(local_rendering(plan_deployment(TINY_AGG), MODEL), tmp_path,
                     vllm=tmp_path / "no-vllm")
    missing = re.escape(f"engine executable {tmp_path / 'no-vllm'} does not exist")
    with pytest.raises(LaunchError, match=missing):
        b.launch()
    assert b.launched == []


def test_pd_deployment_serves_through_the_proxy_and_leaves_nothing(tmp_path):
    b = backend(tmp_path)
    try:
        b.launch()
        b.wait_ready(60)
        headers, body = post(b.url + "/v1/completions",
                             {"model": MODEL, "prompt": "p", "max_tokens": 4, "stream": True})
        assert headers["x-rackplan-decode"] == "decode-0"
        assert headers["x-rackplan-prefill"] == "prefill-0"
        assert b'"ok"' in body
        decode_log = (b.run_dir / "logs" / "decode-0-h0.log").read_text()
        prefill_port = b.rendered.processes[0].port
        assert f'kv={{"remote_port": {prefill_port}}}' in decode_log  # handed over
        assert "max_tokens=1 kv={\"do_remote_decode\": true" in (
            b.run_dir / "logs" / "prefill-0-h0.log").read_text()
        pids = json.loads((b.run_dir / "pids.json").read_text())
        assert [r["instance"] for r in pids] == ["prefill-0", "decode-0", "proxy"]
        assert all(group_members(r["pgid"]) for r in pids)
        assert all(len(group_members(r.pgid)) == 2 for r in b.launched[:2])  # server + engine
    finally:
        b.teardown()
    assert_nothing_left(b)
    b.teardown()  # idempotent
    assert_nothing_left(b)


def test_bad_flag_names_the_instance_quotes_its_log_and_ends_the_others(tmp_path):
    rendered = with_flag(local_rendering(plan_deployment(TINY_PD), MODEL), "decode-0",
                         "--no-such-flag")
    b = LocalBackend(rendered, tmp_path / "run", vllm=fake_vllm(tmp_path))
    b.launch()
    with pytest.raises(LaunchError) as err:
        b.wait_ready(60)
    message = str(err.value)
    assert message.startswith("decode-0 exited (exit code 2) before the deployment was ready")
    assert "decode-0-h0.log" in message
    assert "unrecognized arguments: --no-such-flag" in message
    assert_nothing_left(b)


def test_instance_killed_after_launch_is_named(tmp_path):
    b = backend(tmp_path, TINY_AGG, env={"FAKE_VLLM_DELAY_S": "30"})
    b.launch()
    victim = b.launched[0]
    time.sleep(0.5)
    os.killpg(victim.pgid, signal.SIGKILL)
    with pytest.raises(LaunchError, match=r"^aggregated-0 exited \(signal 9\)"):
        b.wait_ready(60)
    assert_nothing_left(b)


def test_timeout_names_the_slow_instance(tmp_path):
    b = backend(tmp_path, TINY_AGG, env={"FAKE_VLLM_DELAY_S": "60"})
    b.launch()
    with pytest.raises(LaunchError, match=r"aggregated-0 did not answer a completion within "
                                          r"2 s; last lines of .*aggregated-0-h0.log:\n  \| "
                                          r"fake vllm serving"):
        b.wait_ready(2)
    assert_nothing_left(b)


def test_teardown_kills_what_ignores_sigterm(tmp_path):
    b = backend(tmp_path, TINY_AGG, env={"FAKE_VLLM_STUBBORN": "1"}, term_grace_s=1.0)
    b.launch()
    b.wait_ready(60)
    b.teardown()  # a child that ignores SIGTERM gets SIGKILL after the 1 s grace
    assert_nothing_left(b)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 3), (signal.SIGTERM, 128 + 15)])
def test_signal_tears_everything_down(tmp_path, sig, code):
    """Ctrl-C (or SIGTERM) to a program that launched a deployment leaves no process behind."""
    run_dir = tmp_path / "run"
    script = textwrap.dedent(f"""
        import json, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from executor.backends.local import LocalBackend
        from tests.executor.local_helpers import TINY_AGG, local_rendering, plan_deployment
        b = LocalBackend(local_rendering(plan_deployment(TINY_AGG), {MODEL!r}),
                         {str(run_dir)!r}, vllm={str(fake_vllm(tmp_path))!r})
        b.launch()
        b.wait_ready(60)
        try:  # "ready" from inside: a signal sent once it is read lands in the try
            print("ready", flush=True)
            time.sleep(120)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(3)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    pgids = [r["pgid"] for r in json.loads((run_dir / "pids.json").read_text())]
    assert pgids and all(group_members(g) for g in pgids)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == code
    assert ("interrupted" in out) == (sig == signal.SIGINT)
    assert [g for g in pgids if group_members(g)] == []


def test_wait_before_launch_and_double_launch_are_refused(tmp_path):
    b = backend(tmp_path, TINY_AGG)
    with pytest.raises(LaunchError, match=r"launch\(\) has not started the deployment"):
        b.wait_ready(1)
    b.launch()
    try:
        with pytest.raises(LaunchError, match="is already running"):
            b.launch()
        assert len(b.launched) == 2  # the instance and the proxy, once
    finally:
        b.teardown()
    assert_nothing_left(b)


def test_log_tail_keeps_the_last_non_blank_lines(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n\n" for i in range(50)))
    assert log_tail(log) == [f"line {i}" for i in range(30, 50)]
    assert log_tail(tmp_path / "missing.log") == []


def test_free_base_port_leaves_the_router_port_and_every_instance_port_free():
    import socket

    from executor.backends.local import free_base_port

    base = free_base_port(3)
    for port in range(base - 1, base + 3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # would raise if taken


def test_an_answer_that_is_not_http_is_not_ready_yet():
    """A readiness probe of a port no server holds yet can connect to itself and read its own
    request back as the status line: the engine is not ready, the launch goes on waiting."""
    import socket
    import threading

    from executor.backends.local import _completes

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)

        def echo() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(conn.recv(4096))  # its own request back, not an HTTP answer

        threading.Thread(target=echo, daemon=True).start()
        port = server.getsockname()[1]
        assert _completes(f"http://127.0.0.1:{port}", time.monotonic() + 10) is None


def test_a_local_deployment_takes_ports_below_the_ephemeral_ones():
    from executor.backends.local import ephemeral_low, free_base_port, port_free

    base = free_base_port(3)
    assert base - 1 >= 20000 and base + 3 <= ephemeral_low()
    assert all(port_free(p, "127.0.0.1", reuse=False) for p in range(base - 1, base + 3))
