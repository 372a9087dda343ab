"""The proxy's router policies against the real engine: two prefill instances and one decode
instance of tiny-moe (vLLM's CPU build) behind the proxy, prefix_aware on prefill.

A session's second turn (the first turn's prompt, its answer and a new message) goes to the
prefill instance that served the first turn, whose own prefix-cache hit counter (vLLM's
`vllm:prefix_cache_hits` in /metrics) rises by several whole blocks while the other prefill
instance sees nothing. A second proxy over the same instances with round_robin on prefill sends
another session's second turn to the other instance, which finds nothing cached.

Skipped only when the engine environment (.venv-engine, `make engine`) is missing. The three
engines start once for the module.
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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from executor.backends.local import ROOT, LocalBackend, default_vllm
from executor.tinymodel import ensure_tiny_model
from simulator.specs.loading import load_deployment
from tests.executor.local_helpers import TINY_PD, assert_nothing_left, serve
from tests.executor.test_engine_local import CPU_BLOCK_TOKENS, READY_TIMEOUT_S

pytestmark = pytest.mark.skipif(
    not default_vllm().exists(),
    reason=f"the engine environment is missing ({default_vllm()} not found); run `make engine`")

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
MIN_BLOCKS = 5
"""Whole KV blocks the first turn's prompt spans at least."""
FIRST_TURN = (
    "{name} asks: the planner searches deployments of a mixture of experts model over prefill "
    "and decode instances, prices every engine step with calibrated kernel tables, simulates "
    "the workload request by request, and keeps the plans that meet the latency targets at the "
    "lowest cost per token; then the executor renders each instance as a vllm serve command, "
    "launches them, and measures what the simulation predicted.")
"""A first turn of several blocks; `{name}` makes each session's first block its own."""


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None
         ) -> tuple[dict[str, str], bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200
        return {k.lower(): v for k, v in resp.headers.items()}, resp.read()


def tokens(url: str, model: str, prompt: str) -> int:
    _, raw = post(url + "/tokenize", {"model": model, "prompt": prompt})
    return int(json.loads(raw)["count"])


def fitted(url: str, model: str, prompt: str, least: int) -> str:
    """`prompt`, lengthened until it has more than `least` tokens and leaves the decode more
    than one token after its whole blocks (see test_engine_local.handoff_prompt)."""
    for _ in range(200):
        count = tokens(url, model, prompt)
        if count > least and count % CPU_BLOCK_TOKENS not in (0, 1):
            return prompt
        prompt += " again"
    raise AssertionError(f"no prompt length found (last had {count} tokens)")


def counters(url: str) -> tuple[float, float]:
    """(prefix-cache hits, queries) in tokens, as the instance's /metrics says."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    sums = {HITS: 0.0, QUERIES: 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in sums:
            sums[name] += float(line.rsplit(" ", 1)[1])
    return sums[HITS], sums[QUERIES]


def settled(urls: list[str], before: list[tuple[float, float]], target: int
            ) -> list[tuple[float, float]]:
    """Every instance's counters once `urls[target]`'s queries moved (they may trail the
    answer), each as (hits, queries) gained since `before`."""
    deadline = time.monotonic() + 10
    while True:
        now = [counters(u) for u in urls]
        if now[target][1] > before[target][1] or time.monotonic() > deadline:
            return [(h - h0, q - q0) for (h, q), (h0, q0) in zip(now, before, strict=True)]
        time.sleep(0.2)


def two_turns(proxy: str, decode: str, prefills: list[str], model: str, name: str
              ) -> tuple[int, int, tuple[float, float], tuple[float, float], int]:
    """One session of two turns through `proxy`: the prefill index of each turn, the second
    turn's (hits, queries) gained at the instance that took it and at the other, and the
    first turn's prompt length in tokens."""
    session = {"X-Session-ID": f"session-{name}"}
    first = fitted(decode, model, FIRST_TURN.format(name=name), MIN_BLOCKS * CPU_BLOCK_TOKENS)
    headers, raw = post(proxy + "/v1/completions",
                        {"model": model, "prompt": first, "max_tokens": 8, "temperature": 0},
                        headers=session)
    one = int(headers["x-rackplan-prefill"].rsplit("-", 1)[1])
    answer = json.loads(raw)["choices"][0]["text"]
    second = fitted(decode, model, first + answer + "\nuser: and how is the decode side sized?",
                    0)
    before = [counters(u) for u in prefills]
    headers, _ = post(proxy + "/v1/completions",
                      {"model": model, "prompt": second, "max_tokens": 4, "temperature": 0},
                      headers=session)
    two = int(headers["x-rackplan-prefill"].rsplit("-", 1)[1])
    gained = settled(prefills, before, two)
    return one, two, gained[two], gained[1 - two], tokens(decode, model, first)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def pd2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    """Two prefill instances (prefix_aware) and one decode instance, up for the module."""
    plan = yaml.safe_load(TINY_PD.read_text())["deployment"]
    plan["prefill"] = {**plan["prefill"], "instances": 2, "router": "prefix_aware"}
    yield from serve(load_deployment(plan), str(ensure_tiny_model()),
                     tmp_path_factory.mktemp("pd2"), READY_TIMEOUT_S)


@dataclass
class SecondProxy:
    """A proxy process started by the test, in its own process group."""

    url: str
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        """End its process group: SIGTERM, then SIGKILL after 10 s."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.fixture(scope="module")
def round_robin(pd2: LocalBackend) -> Iterator[SecondProxy]:
    """A second proxy over the same instances with round_robin on prefill."""
    config = {**pd2.rendered.router, "port": free_port(), "prefill_policy": "round_robin"}
    path = pd2.run_dir / "router-round-robin.json"
    path.write_text(json.dumps(config))
    with (pd2.log_dir / "proxy-round-robin.log").open("wb") as log:
        proxy = SecondProxy(f"http://127.0.0.1:{config['port']}", subprocess.Popen(
            [sys.executable, "-m", "executor.proxy", "--config", str(path)], cwd=ROOT,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(proxy.url + "/health", timeout=10) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert proxy.proc.poll() is None, "the round_robin proxy exited; see its log"
            assert time.monotonic() < deadline, "the round_robin proxy never became healthy"
            time.sleep(0.3)
        yield proxy
    finally:
        proxy.stop()


def urls(backend: LocalBackend, role: str) -> list[str]:
    value = backend.rendered.router[f"{role}_urls"]
    assert isinstance(value, list)
    return [str(u) for u in value]


def test_prefix_aware_sends_the_second_turn_to_the_instance_holding_the_first(
        pd2: LocalBackend):
    model = str(ensure_tiny_model())
    one, two, here, there, first = two_turns(pd2.url, urls(pd2, "decode")[0],
                                             urls(pd2, "prefill"), model, "alpha")
    assert two == one, f"turn 1 went to prefill-{one}, turn 2 to prefill-{two}"
    whole = (first - 1) // CPU_BLOCK_TOKENS * CPU_BLOCK_TOKENS
    assert here[0] >= whole - CPU_BLOCK_TOKENS, (  # the boundary block may retokenize
        f"prefill-{two} hit {here[0]:g} of {here[1]:g} queried tokens; the first turn had "
        f"{first} tokens")
    assert there == (0, 0), f"prefill-{1 - two} gained {there} (hits, queries)"


def test_round_robin_sends_the_second_turn_elsewhere_with_nothing_cached(
        pd2: LocalBackend, round_robin: SecondProxy):
    model = str(ensure_tiny_model())
    one, two, here, there, _ = two_turns(round_robin.url, urls(pd2, "decode")[0],
                                         urls(pd2, "prefill"), model, "beta")
    assert (one, two) == (0, 1)
    assert here[1] > 0 and here[0] == 0, f"prefill-1 hit {here[0]:g} of {here[1]:g} tokens"
    assert there == (0, 0)


def test_teardown_leaves_no_process(pd2: LocalBackend, round_robin: SecondProxy):
    round_robin.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(round_robin.proc.pid, 0)
    pd2.teardown()
    assert_nothing_left(pd2)
