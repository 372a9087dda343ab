"""The P/D CPU example on the real engine under 32 concurrent new prompts.

32 distinct prompts (each its own first words, lengths from a few tokens to several KV blocks,
more tokens together than one prefill step takes) go through the proxy at once. Every answer is
a 200 with text from the decode instance, the prefill hands the prompts' KV over (a folder per
prompt in ExampleConnector's shared folder, and the decode instance loads some), and every
instance is still alive afterwards. With chunked prefill on, the prefill split some prompts
across steps, ExampleConnector saved only their first chunk, and the decode instance died on a
shape mismatch loading one (executor/engines/vllm.py, CPU_PD_NO_CHUNKING).

Skipped only when the engine environment (.venv-engine, `make engine`) is missing.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import yaml

from executor.backends.local import LocalBackend, default_vllm
from executor.tinymodel import ensure_tiny_model
from tests.executor.local_helpers import TINY_PD, plan_deployment, serve
from tests.executor.test_engine_local import CPU_BLOCK_TOKENS, READY_TIMEOUT_S

pytestmark = pytest.mark.skipif(
    not default_vllm().exists(),
    reason=f"the engine environment is missing ({default_vllm()} not found); run `make engine`")

PROMPTS = 32
MAX_TOKENS = 4
WORDS = ("planner", "decode", "prefill", "expert", "router", "cache", "block", "token",
         "instance", "proxy", "engine", "kernel", "batch")
STEP_TOKENS = yaml.safe_load(TINY_PD.read_text())["deployment"]["prefill"][
    "max_num_batched_tokens"]
"""The prefill's token budget per step, which the prompts together exceed."""


def prompt(i: int) -> str:
    """The i-th prompt: its own first words (so no two share a cached block), 2 to ~200
    words."""
    words = [WORDS[(i * 5 + k) % len(WORDS)] for k in range((i * 37) % 190 + 2)]
    return f"request {i} of the batch asks: " + " ".join(words)


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    """Status, lower-cased headers and body of a POST (an error status is returned, not
    raised)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


@pytest.fixture(scope="module")
def pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalBackend, str]]:
    """The P/D example, up for this module, and the model it serves."""
    model = str(ensure_tiny_model())
    for backend in serve(plan_deployment(TINY_PD), model, tmp_path_factory.mktemp("pd32"),
                         READY_TIMEOUT_S):
        yield backend, model


def test_32_concurrent_new_prompts_are_all_answered_and_every_instance_survives(
        pd: tuple[LocalBackend, str]):
    backend, model = pd
    decode_url = str(backend.rendered.router["decode_urls"][0])  # type: ignore[index]
    prompts = [prompt(i) for i in range(PROMPTS)]
    counts = [int(json.loads(post(decode_url + "/tokenize", {"model": model, "prompt": p})[2])
                  ["count"]) for p in prompts]
    assert sum(counts) > STEP_TOKENS and max(counts) > 4 * CPU_BLOCK_TOKENS  # some would split
    kv = backend.run_dir / "kv"
    before = set(os.listdir(kv)) if kv.exists() else set()
    log = backend.log_path("decode-0", 0)
    injected = re.compile(r"Inject KV cache of \d+ tokens")
    loads_before = len(injected.findall(log.read_text()))

    def ask(p: str) -> tuple[int, dict[str, str], bytes]:
        return post(backend.url + "/v1/completions",
                    {"model": model, "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0,
                     "ignore_eos": True})

    with ThreadPoolExecutor(PROMPTS) as pool:
        answers = list(pool.map(ask, prompts))

    failed = [(i, status, raw[:200]) for i, (status, _, raw) in enumerate(answers)
              if status != 200]
    assert not failed, f"{len(failed)} of {PROMPTS} failed, first: {failed[0]}"
    for _, headers, raw in answers:
        body = json.loads(raw)
        assert headers["x-rackplan-decode"] == "decode-0"
        # four tokens of a random-weight model may decode to blanks: the count is the proof
        assert isinstance(body["choices"][0]["text"], str)
        assert body["usage"]["completion_tokens"] == MAX_TOKENS
    assert backend.alive() == backend.launched, "an instance died under the load"
    assert post(backend.url + "/v1/completions",  # and it still serves
                {"model": model, "prompt": "after the batch", "max_tokens": 1})[0] == 200

    # The handoff happened: a folder per prompt past one block, and the decode loaded KV.
    longer = sum(1 for n in counts if n > CPU_BLOCK_TOKENS + 1)
    assert len(set(os.listdir(kv)) - before) >= longer
    deadline = time.monotonic() + 10  # the engine's log lines may trail the answers
    while len(injected.findall(log.read_text())) == loads_before:
        assert time.monotonic() < deadline, "decode-0 never loaded KV from the prefill"
        time.sleep(0.2)
