"""Faults injected into `rackplan deploy --target local` on the real engine (vLLM's CPU build
serving tiny-moe): a port taken by a foreign listener is refused before anything starts; an
instance killed after ready is restarted and serves again (--restart 1); SIGKILL of the deploy
process leaves no process behind once the watchdog's grace period is over.

Skipped only when the engine environment (.venv-engine, `make engine`) is missing. One
deployment serves the whole sequence, since a CPU engine takes a minute or more to start.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from executor.backends.local import TERM_GRACE_S, default_vllm, free_base_port, group_members
from tests.executor.local_helpers import TINY_AGG

pytestmark = pytest.mark.skipif(
    not default_vllm().exists(),
    reason=f"the engine environment is missing ({default_vllm()} not found); run `make engine`")

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 400
"""A CPU engine starting on a loaded two-core machine (see test_engine_local.py)."""


def deploy(run: Path, base: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "planner.cli", "deploy", str(TINY_AGG), "--target", "local",
         "--out", str(run), "--base-port", str(base), "--timeout", str(READY_TIMEOUT_S),
         *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def groups(run: Path) -> list[int]:
    return [row["pgid"] for row in json.loads((run / "pids.json").read_text())]


def answers(port: int) -> bool:
    body = json.dumps({"prompt": "the planner", "max_tokens": 2, "ignore_eos": True, "model": str(
        json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models",
                                          timeout=60).read())["data"][0]["id"])}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        answer = json.loads(resp.read())  # a random-weight model's tokens may decode to blanks
        return bool(resp.status == 200 and answer["usage"]["completion_tokens"] == 2)


def test_a_port_taken_by_a_foreign_listener_is_refused_before_launch(tmp_path):
    base = free_base_port(1)
    with socket.socket() as foreign:
        foreign.bind(("127.0.0.1", base))
        foreign.listen()
        proc = deploy(tmp_path / "run", base)
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith(f"rackplan: error: port {base} (aggregated-0) is already in use by "
                          f"pid {os.getpid()} (")
    assert err.endswith("; stop that, or deploy on other ports (--base-port)\n")
    assert not (tmp_path / "run" / "pids.json").exists()  # nothing was started


def test_a_killed_instance_is_restarted_and_a_sigkilled_deploy_leaves_nothing(tmp_path):
    run, base = tmp_path / "run", free_base_port(1)
    proc = deploy(run, base, "--restart", "1")
    assert proc.stdout is not None and proc.stderr is not None
    try:
        line = proc.stdout.readline()
        assert line == f"router: http://127.0.0.1:{base - 1}\n", proc.stderr.read()
        first = groups(run)[0]
        os.killpg(first, signal.SIGKILL)  # the engine dies after ready
        said = []
        for err_line in proc.stderr:
            said.append(err_line)
            if "is serving again" in err_line or "error" in err_line:
                break
        assert said[-2:] == ["rackplan: aggregated-0 exited (signal 9); restarting it "
                             "(1 of 1)\n", "rackplan: aggregated-0 is serving again\n"], said
        assert groups(run)[0] != first and answers(base - 1)  # through the router
    finally:
        proc.kill()  # SIGKILL: the deploy process cannot tear down; its watchdog does
        proc.wait()
    end = time.monotonic() + TERM_GRACE_S + 120
    while any(group_members(g) for g in groups(run)):
        assert time.monotonic() < end, "processes were left after the watchdog's grace period"
        time.sleep(0.5)
