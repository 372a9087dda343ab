"""The local backend with the real engine: vLLM's CPU build serving the tiny-moe preset.

(a) 1 prefill + 1 decode: answers come back through the proxy from the decode instance, the
prefill's KV reaches the decode instance (ExampleConnector's shared folder gets the prompt's
blocks and the decode instance loads them), a short `vllm bench serve` is compared with the
plan, and teardown leaves no process. (b) the same for one aggregated instance. (c) an instance
that dies during launch gives a LaunchError naming it with its log tail, and nothing is left.

Skipped only when the engine environment (.venv-engine, `make engine`) is missing. The CPU
engine takes 25-85 s to become ready, so each deployment is started once per class.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from executor.backends.base import LaunchError
from executor.backends.local import LocalBackend, default_vllm, group_members
from executor.bench import run_bench
from executor.tinymodel import ensure_tiny_model
from tests.executor.local_helpers import (
    TINY_AGG,
    TINY_PD,
    assert_nothing_left,
    local_rendering,
    plan_deployment,
    serve,
    with_flag,
)

pytestmark = pytest.mark.skipif(
    not default_vllm().exists(),
    reason=f"the engine environment is missing ({default_vllm()} not found); run `make engine`")

READY_TIMEOUT_S = 400
"""Two CPU engines starting at once on two cores take 60-90 s; CI machines can be slower."""
FAILURE_GRACE_S = 5.0
"""SIGTERM grace in the failure tests: an engine still starting up ignores SIGTERM, so teardown
ends it with SIGKILL after this (the default 20 s only slows the test)."""
HANDOFF_PROMPT = (
    "rackplan plans prefill and decode instances for a mixture of experts model, renders the "
    "vllm serve command of each instance, launches them in their own process groups, waits "
    "until every instance answers a real completion, then measures the deployment with the "
    "benchmark and compares what it measured with what the simulation predicted.")
"""Long enough for whole KV blocks (32 tokens each on CPU) to be handed over."""
CPU_BLOCK_TOKENS = 32


def handoff_prompt(backend: LocalBackend, model: str) -> str:
    """HANDOFF_PROMPT, lengthened until its token count leaves the decode more than one token
    to compute after the whole blocks it loads. The tiny model's tokenizer is trained on the
    project's own docs, so the count moves with them; with exactly one token left, vLLM's CPU
    build runs that step without the attention metadata the KV connector loads into."""
    url = str(backend.rendered.router["decode_urls"][0])  # type: ignore[index]
    prompt = HANDOFF_PROMPT
    for _ in range(64):
        _, raw = post(url + "/tokenize", {"model": model, "prompt": prompt})
        count = int(json.loads(raw)["count"])
        if count > CPU_BLOCK_TOKENS and count % CPU_BLOCK_TOKENS not in (0, 1):
            return prompt
        prompt += " again"
    raise AssertionError(f"no handoff prompt length found (last had {count} tokens)")


@pytest.fixture(scope="module")
def tiny_model() -> str:
    return str(ensure_tiny_model())


def post(url: str, body: dict[str, Any], timeout_s: float = 120) -> tuple[dict[str, str], bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        assert resp.status == 200
        return {k.lower(): v for k, v in resp.headers.items()}, resp.read()


def deploy(plan: Path, model: str, run_dir: Path) -> Iterator[LocalBackend]:
    yield from serve(plan_deployment(plan), model, run_dir, READY_TIMEOUT_S)


def check_answers(backend: LocalBackend, model: str, decode: str) -> None:
    """Completions (plain and streamed) and a chat completion come back from `decode`."""
    headers, raw = post(backend.url + "/v1/completions",
                        {"model": model, "prompt": "the planner", "max_tokens": 8,
                         "temperature": 0, "ignore_eos": True})
    assert headers["x-rackplan-decode"] == decode
    answer = json.loads(raw)
    assert answer["usage"]["completion_tokens"] == 8  # its text may be blanks (random weights)
    assert isinstance(answer["choices"][0]["text"], str)

    headers, raw = post(backend.url + "/v1/completions",
                        {"model": model, "prompt": "the executor", "max_tokens": 6,
                         "stream": True, "ignore_eos": True})
    assert headers["x-rackplan-decode"] == decode
    assert headers["content-type"].startswith("text/event-stream")
    chunks = [line for line in raw.decode().splitlines() if line.startswith("data: {")]
    assert len(chunks) >= 2 and raw.decode().rstrip().endswith("data: [DONE]")

    headers, raw = post(backend.url + "/v1/chat/completions",
                        {"model": model, "max_tokens": 4, "ignore_eos": True,
                         "messages": [{"role": "user", "content": "hello"}]})
    assert headers["x-rackplan-decode"] == decode
    assert json.loads(raw)["usage"]["completion_tokens"] == 4


def check_bench(backend: LocalBackend, plan: Path) -> None:
    report = run_bench(plan, backend.url, backend.run_dir / "bench", num_prompts=8,
                       timeout_s=300)
    assert report.measured["completed"] == 8 and report.measured["failed"] == 0
    for metric in ("ttft_ms.p50", "ttft_ms.p99", "tpot_ms.p50", "itl_ms.p90",
                   "output_throughput_tok_s", "total_throughput_tok_s"):
        row = report.row(metric)
        assert row.measured is not None and row.measured > 0
        assert row.predicted is not None and row.rel_error is not None
    out = report.row("output_throughput_tok_s").measured or 0
    total = report.row("total_throughput_tok_s").measured or 0
    assert total == pytest.approx(out * (64 + 16) / 16, rel=0.01)  # in 64, out 16, ignore_eos
    saved = json.loads((backend.run_dir / "bench" / "report.json").read_text())
    assert len(saved["comparison"]) == len(report.rows)
    assert "| ttft_ms.p50 |" in (backend.run_dir / "bench" / "report.md").read_text()


def check_teardown(backend: LocalBackend) -> None:
    pgids = [r["pgid"] for r in json.loads((backend.run_dir / "pids.json").read_text())]
    assert pgids == [r.pgid for r in backend.launched]
    assert backend.alive() == backend.launched  # still serving until now
    # vLLM's engine core and workers share the API server's group: more than one member.
    assert all(len(group_members(r.pgid)) > 1 for r in backend.launched if r.instance != "proxy")
    backend.teardown()
    assert_nothing_left(backend)


@pytest.fixture(scope="class")
def pd(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    """The P/D deployment, up for the tests of one class."""
    yield from deploy(TINY_PD, tiny_model, tmp_path_factory.mktemp("pd"))


@pytest.fixture(scope="class")
def agg(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    """The aggregated deployment, up for the tests of one class."""
    yield from deploy(TINY_AGG, tiny_model, tmp_path_factory.mktemp("agg"))


class TestPrefillDecode:
    """1 prefill + 1 decode instance behind the proxy."""

    def test_answers_come_from_the_decode_instance(self, pd: LocalBackend, tiny_model: str):
        check_answers(pd, tiny_model, "decode-0")

    def test_prefill_kv_is_handed_to_the_decode_instance(self, pd: LocalBackend,
                                                         tiny_model: str):
        kv = pd.run_dir / "kv"
        log = pd.run_dir / "logs" / "decode-0-h0.log"
        before = set(os.listdir(kv)) if kv.exists() else set()
        injected = re.compile(r"Inject KV cache of (\d+) tokens")
        loads_before = len(injected.findall(log.read_text()))

        prompt = handoff_prompt(pd, tiny_model)
        headers, _ = post(pd.url + "/v1/completions",
                          {"model": tiny_model, "prompt": prompt, "max_tokens": 4})
        assert headers["x-rackplan-prefill"] == "prefill-0"

        new = set(os.listdir(kv)) - before
        assert len(new) == 1, f"the prefill stored {len(new)} prompts, expected 1"
        stored = sorted(p.name for p in (kv / new.pop()).iterdir())
        assert stored and all(name.endswith(".safetensors") for name in stored)
        deadline = time.monotonic() + 10  # the engine's log line may trail the answer
        while len(loads := injected.findall(log.read_text())) == loads_before:
            assert time.monotonic() < deadline, "decode-0 never loaded KV from the prefill"
            time.sleep(0.2)
        assert int(loads[-1]) >= CPU_BLOCK_TOKENS  # a whole block came from the prefill

    def test_bench_through_the_proxy(self, pd: LocalBackend):
        check_bench(pd, TINY_PD)

    def test_teardown_leaves_no_process(self, pd: LocalBackend):
        check_teardown(pd)


class TestAggregated:
    """One aggregated instance behind the proxy (which only forwards)."""

    def test_answers(self, agg: LocalBackend, tiny_model: str):
        check_answers(agg, tiny_model, "aggregated-0")
        assert not (agg.run_dir / "kv").exists()  # no connector without P/D

    def test_bench_through_the_proxy(self, agg: LocalBackend):
        check_bench(agg, TINY_AGG)

    def test_teardown_leaves_no_process(self, agg: LocalBackend):
        check_teardown(agg)


def test_bad_flag_is_named_with_its_log_and_the_prefill_is_ended(tiny_model, tmp_path):
    rendered = with_flag(local_rendering(plan_deployment(TINY_PD), tiny_model), "decode-0",
                         "--no-such-flag")
    backend = LocalBackend(rendered, tmp_path, term_grace_s=FAILURE_GRACE_S)
    backend.launch()
    with pytest.raises(LaunchError) as err:
        backend.wait_ready(READY_TIMEOUT_S)
    message = str(err.value)
    assert message.startswith("decode-0 exited (exit code 2) before the deployment was ready")
    assert "decode-0-h0.log" in message and "--no-such-flag" in message
    assert_nothing_left(backend)


def test_instance_killed_during_launch_is_named(tiny_model, tmp_path):
    backend = LocalBackend(local_rendering(plan_deployment(TINY_AGG), tiny_model), tmp_path,
                           term_grace_s=FAILURE_GRACE_S)
    backend.launch()
    victim = backend.launched[0]
    log = backend.log_path(victim.instance, 0)
    deadline = time.monotonic() + 120
    while not log.exists() or "vllm" not in log.read_text().lower():  # well into its start
        assert time.monotonic() < deadline, "the engine wrote nothing in 120 s"
        time.sleep(0.5)
    os.killpg(victim.pgid, signal.SIGKILL)
    with pytest.raises(LaunchError, match=r"^aggregated-0 exited \(signal 9\) before the "
                                          r"deployment was ready; last lines of .*\n  \| "):
        backend.wait_ready(READY_TIMEOUT_S)
    assert_nothing_left(backend)
