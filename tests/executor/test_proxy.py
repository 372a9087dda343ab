"""executor/proxy: the P/D protocol against fake upstream instances (in-process aiohttp), and
its routing: the plan's policy per role (simulator/specs/routing.py) over each role's instances,
with the proxy's approximate prefix index and session keys."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict, CIMultiDictProxy

from executor.prefix_index import CHUNK_CHARS, PrefixIndex, chunk_keys
from executor.proxy import (
    REMOTE_DECODE,
    ConfigError,
    Flight,
    Pool,
    Prompt,
    Proxy,
    RouterConfig,
    load_config,
    session_of,
)
from simulator.specs.routing import DEFAULT_ROUTER, POLICIES

ROOT = Path(__file__).resolve().parents[2]


class Fake:
    """One fake engine instance: records what it got, answers like vLLM's OpenAI server."""

    def __init__(self, name: str, status: int = 200) -> None:
        self.name = name
        self.status = status
        self.seen: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.hold: asyncio.Event | None = None
        """Set: the answer waits for it (prefill) or streams its first chunk then waits (decode)."""
        self.server: TestServer | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/v1/chat/completions", self.generate)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        return app

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.seen.append((request.path, body, headers))
        if self.status != 200:
            return web.json_response({"error": {"message": "bad"}}, status=self.status)
        if not body.get("stream"):
            if self.hold is not None:
                await self.hold.wait()
            return web.json_response({
                "choices": [{"text": "x"}],
                "kv_transfer_params": {"remote_engine_id": self.name, "remote_block_ids": [1]}})
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(f"data: {json.dumps({'from': self.name, 'n': 0})}\n\n".encode())
        if self.hold is not None:
            await self.hold.wait()
        echo = {"from": self.name, "n": 1, "kv": body.get("kv_transfer_params")}
        await out.write(f"data: {json.dumps(echo)}\n\ndata: [DONE]\n\n".encode())
        await out.write_eof()
        return out

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": f"model-of-{self.name}"}]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Scenario = Callable[[TestClient, dict[str, Fake]], Awaitable[None]]


def run(names: list[str], scenario: Scenario, statuses: dict[str, int] | None = None,
        extra: dict[str, list[str]] | None = None, policies: dict[str, str] | None = None
        ) -> None:
    """Start fakes for `names` (prefill-i, decode-i, aggregated-i), a proxy in front, and run
    `scenario(client, fakes)`. `extra` adds URLs (e.g. a closed port) per role; `policies`
    sets router policies ({"decode_policy": "round_robin"})."""

    async def main() -> None:
        fakes = {n: Fake(n, (statuses or {}).get(n, 200)) for n in names}
        urls: dict[str, list[str]] = {}
        for n, f in fakes.items():
            f.server = TestServer(f.app(), host="127.0.0.1")
            await f.server.start_server()
            urls.setdefault(n.rsplit("-", 1)[0] + "_urls", []).append(
                str(f.server.make_url("")).rstrip("/"))
        for key, more in (extra or {}).items():
            urls.setdefault(key, []).extend(more)
        proxy = Proxy(RouterConfig.from_dict({"port": 0, **urls, **(policies or {})}))
        async with TestClient(TestServer(proxy.app(), host="127.0.0.1")) as client:
            try:
                await scenario(client, fakes)
            finally:
                for f in fakes.values():
                    if f.server is not None:
                        await f.server.close()

    asyncio.run(main())


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines()
            if line.startswith("data: {")]


def test_pd_request_prefills_with_one_token_then_decodes_with_the_prefill_params():
    async def scenario(client: TestClient, fakes: dict[str, Fake]) -> None:
        body = {"model": "m", "prompt": "hello", "max_tokens": 16, "stream": True,
                "stream_options": {"include_usage": True}}
        resp = await client.post("/v1/completions", json=body, headers={"X-Request-Id": "r-1"})
        assert resp.status == 200
        assert resp.headers["x-rackplan-prefill"] == "prefill-0"
        assert resp.headers["x-rackplan-decode"] == "decode-0"
        assert resp.headers["x-request-id"] == "r-1"
        assert resp.headers["x-rackplan-policy"] == "prefill=prefix_aware,decode=least_requests"
        got = events(await resp.text())
        assert [e["from"] for e in got] == ["decode-0", "decode-0"]
        assert got[1]["kv"] == {"remote_engine_id": "prefill-0", "remote_block_ids": [1]}

        ((path, first, h1),) = fakes["prefill-0"].seen
        assert path == "/v1/completions"
        assert first["max_tokens"] == 1 and first["stream"] is False
        assert first["kv_transfer_params"] == REMOTE_DECODE
        assert "stream_options" not in first and first["prompt"] == "hello"
        ((_, second, h2),) = fakes["decode-0"].seen
        assert second["max_tokens"] == 16 and second["stream"] is True
        assert second["stream_options"] == {"include_usage": True}
        assert h1["x-request-id"] == h2["x-request-id"] == "r-1"

    run(["prefill-0", "decode-0"], scenario)


def test_chat_route_caps_max_completion_tokens_on_prefill():
    async def scenario(client: TestClient, fakes: dict[str, Fake]) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "max_completion_tokens": 9, "stream": True}
        resp = await client.post("/v1/chat/completions", json=body)
        assert resp.status == 200
        await resp.read()
        ((path, first, h1),) = fakes["prefill-0"].seen
        assert path == "/v1/chat/completions" and first["max_completion_tokens"] == 1
        ((_, second, h2),) = fakes["decode-0"].seen
        assert second["max_completion_tokens"] == 9
        assert h1["x-request-id"] == h2["x-request-id"]  # one id made up for both legs

    run(["prefill-0", "decode-0"], scenario)


def test_decode_round_robin_when_the_plan_says_so_else_least_requests():
    async def scenario(client: TestClient, fakes: dict[str, Fake]) -> None:
        order = []
        for _ in range(4):
            resp = await client.post("/v1/completions", json={"prompt": "p", "stream": True})
            await resp.read()
            order.append(resp.headers["x-rackplan-decode"])
        assert order == ["decode-0", "decode-1", "decode-0", "decode-1"]
        assert len(fakes["decode-0"].seen) == len(fakes["decode-1"].seen) == 2

    run(["prefill-0", "decode-0", "decode-1"], scenario,
        policies={"decode_policy": "round_robin"})

    async def default(client: TestClient, fakes: dict[str, Fake]) -> None:
        for _ in range(3):  # one at a time: every decode instance idle, the tie to the first
            resp = await client.post("/v1/completions", json={"prompt": "p", "stream": True})
            await resp.read()
            assert resp.headers["x-rackplan-decode"] == "decode-0"

    run(["prefill-0", "decode-0", "decode-1"], default)


def test_prefill_goes_to_the_instance_with_fewest_outstanding_requests():
    async def scenario(client: TestClient, fakes: dict[str, Fake]) -> None:
        fakes["prefill-0"].hold = asyncio.Event()
        first = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "a"}))
        for _ in range(100):  # until prefill-0 holds the first request
            if fakes["prefill-0"].seen:
                break
            await asyncio.sleep(0.01)
        resp = await client.post("/v1/completions", json={"prompt": "b"})
        assert resp.headers["x-rackplan-prefill"] == "prefill-1"
        await resp.read()
        fakes["prefill-0"].hold.set()
        resp = await first
        assert resp.headers["x-rackplan-prefill"] == "prefill-0"
        await resp.read()
        # Both idle again: the tie goes to the first.
        resp = await client.post("/v1/completions", json={"prompt": "c"})
        assert resp.headers["x-rackplan-prefill"] == "prefill-0"

    run(["prefill-0", "prefill-1", "decode-0"], scenario)


def test_decode_answer_is_streamed_before_it_ends():
    async def scenario(client: TestClient, fakes: dict[str, Fake]) -> None:
        fakes["decode-0"].hold = asyncio.Event()
        resp = await client.post("/v1/completions", json={"prompt": "p", "stream": True})
        line = await asyncio.wait_for(resp.content.readline(), timeout=5)
        assert json.loads(line[6:]) == {"from": "decode-0", "n": 0}
        fakes["decode-0"].hold.set()
        rest = events((await resp.read()).decode())
        assert [e["n"] for e in rest] == [1]

    run(["prefill-0", "decode-0"], scenario)


def test_aggregated_forwards_the_request_unchanged():
    async def scenario(client: TestClient, fakes: dict[str, Fake]) -> None:
        body = {"model": "m", "prompt": "p", "max_tokens": 5, "stream": True}
        resp = await client.post("/v1/completions", json=body)
        assert resp.headers["x-rackplan-decode"] == "aggregated-0"
        assert resp.headers["x-rackplan-prefill"] == "aggregated-0"
        assert [e["from"] for e in events(await resp.text())] == ["aggregated-0"] * 2
        ((_, got, _),) = fakes["aggregated-0"].seen
        assert got == body

    run(["aggregated-0"], scenario)


def test_prefill_error_is_passed_back_and_decode_is_not_called():
    async def scenario(client: TestClient, fakes: dict[str, Fake]) -> None:
        resp = await client.post("/v1/completions", json={"prompt": "p"})
        assert resp.status == 400
        assert resp.headers["x-rackplan-prefill"] == "prefill-0"
        assert (await resp.json())["error"]["message"] == "bad"
        assert fakes["decode-0"].seen == []

    run(["prefill-0", "decode-0"], scenario, statuses={"prefill-0": 400})


def test_unreachable_decode_gives_502_naming_it():
    port = _closed_port()

    async def scenario(client: TestClient, fakes: dict[str, Fake]) -> None:
        resp = await client.post("/v1/completions", json={"prompt": "p"})
        assert resp.status == 502
        message = (await resp.json())["error"]["message"]
        assert message.startswith(f"decode-0 at http://127.0.0.1:{port} failed")

    run(["prefill-0"], scenario, extra={"decode_urls": [f"http://127.0.0.1:{port}"]})


def test_bad_request_body_is_400():
    async def scenario(client: TestClient, fakes: dict[str, Fake]) -> None:
        resp = await client.post("/v1/completions", data=b"{not json",
                                 headers={"Content-Type": "application/json"})
        assert resp.status == 400
        assert fakes["prefill-0"].seen == []

    run(["prefill-0", "decode-0"], scenario)


def test_health_names_the_unhealthy_instance_and_models_come_from_decode():
    port = _closed_port()

    async def scenario(client: TestClient, fakes: dict[str, Fake]) -> None:
        resp = await client.get("/health")
        assert resp.status == 503
        got = await resp.json()
        assert got["unhealthy"] == ["decode-1"]
        assert got["instances"] == ["prefill-0", "decode-0", "decode-1"]
        resp = await client.get("/v1/models")
        assert (await resp.json())["data"][0]["id"] == "model-of-decode-0"

    run(["prefill-0", "decode-0"], scenario, extra={"decode_urls": [f"http://127.0.0.1:{port}"]})


def test_health_is_200_when_all_answer():
    async def scenario(client: TestClient, fakes: dict[str, Fake]) -> None:
        resp = await client.get("/health")
        assert resp.status == 200 and (await resp.json())["unhealthy"] == []

    run(["prefill-0", "decode-0"], scenario)


@pytest.mark.parametrize(("data", "needle"), [
    ({"port": "x", "aggregated_urls": ["http://a:1"]}, "router port='x' must be an integer"),
    ({"port": 1, "prefill_urls": ["http://a:1"]}, "router decode_urls is empty"),
    ({"port": 1, "aggregated_urls": ["a:1"]}, "aggregated_urls=['a:1'] must be a list of"),
    ({"port": 1}, "router has no instance URLs"),
    ({"port": 1, "aggregated_urls": ["http://a:1"], "decode_urls": ["http://b:1"],
      "prefill_urls": ["http://c:1"]}, "both P/D and aggregated"),
    ({"port": 1, "aggregated_urls": ["http://a:1"], "colour": 1}, "unknown router key 'colour'"),
])
def test_config_errors_name_the_bad_value(data, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        RouterConfig.from_dict(data)


def test_load_config_reads_the_renderer_router(tmp_path):
    path = tmp_path / "router.json"
    path.write_text(json.dumps({"port": 8099, "prefill_urls": ["http://127.0.0.1:8100/"],
                                "decode_urls": ["http://127.0.0.1:8101"]}))
    config = load_config(path)
    assert config.prefill_urls == ("http://127.0.0.1:8100",) and config.disaggregated
    with pytest.raises(ConfigError, match=re.escape("no-such.json: cannot be read")):
        load_config(tmp_path / "no-such.json")


def test_cli_bad_config_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "router.json"
    path.write_text("[1, 2]")
    proc = subprocess.run([sys.executable, "-m", "executor.proxy", "--config", str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {path}: the top level must be a JSON object"


# --- routing -------------------------------------------------------------------------------

TURN_1 = "rackplan turn one: " + "the planner prices each deployment step by step. " * 12
"""A first turn several chunks long (CHUNK_CHARS each)."""
TURN_2 = TURN_1 + " an answer from the engine. user: and now the decode side?"
"""The second turn: the first turn's prompt, its answer and a new message."""
OTHER = "another session entirely: " + "the executor renders every vllm serve process. " * 13
"""A different prompt about as long as TURN_2."""


async def until_seen(fake: Fake, n: int) -> None:
    """Wait until `fake` has received `n` requests (it may be holding them)."""
    for _ in range(500):
        if len(fake.seen) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{fake.name} saw {len(fake.seen)} requests, expected {n}")


def pool(policy: str, loads: list[tuple[int, int]]) -> Pool:
    """A prefill pool of two instances with hand-made loads: (requests, queued chars) each."""
    out = Pool("prefill", ("http://a:1", "http://b:1"), policy)  # type: ignore[arg-type]
    for up, (requests, queued) in zip(out.upstreams, loads, strict=True):
        up.outstanding, up.prefilling = requests, queued
    return out


@pytest.mark.parametrize(("policy", "expected"), [
    ("least_requests", "prefill-1"),  # 1 request against 3
    ("least_tokens", "prefill-0"),  # 40 queued characters against 400
    ("prefix_aware", "prefill-1"),  # all of the prompt to compute at 0, little at 1
    ("kv_router", "prefill-1"),  # the same: neither holds a prompt in flight here
    ("session_affinity", "prefill-1"),  # no session yet: prefix_aware's cost
    ("round_robin", "prefill-0"),  # the first in turn
])
def test_each_policy_picks_as_the_table_says(policy: str, expected: str):
    p = pool(policy, [(3, 40), (1, 400)])
    prompt = Prompt(TURN_2)
    if p.upstreams[1].index is not None:
        p.upstreams[1].index.add(Prompt(TURN_1).keys)  # prefill-1 served the first turn
    assert p.pick(prompt).name == expected


def test_prefix_aware_weighs_the_cached_prefix_against_the_queue():
    prompt = Prompt(TURN_2)
    cached = len(TURN_1) // CHUNK_CHARS * CHUNK_CHARS
    # prefill-0: all of the prompt to compute; prefill-1: the uncached rest plus its queue.
    for queued, expected in ((cached - 1, "prefill-1"), (cached + 1, "prefill-0")):
        p = pool("prefix_aware", [(0, 0), (0, queued)])
        assert p.upstreams[1].index is not None
        p.upstreams[1].index.add(Prompt(TURN_1).keys)
        (c0, c1) = p.candidates(prompt)
        assert (c0.cached_tokens, c1.cached_tokens) == (0, cached)
        assert c1.prompt_tokens == len(TURN_2) and c1.queued_tokens == queued
        assert p.pick(prompt).name == expected


def test_kv_router_counts_the_prompts_in_flight_as_the_kv_they_hold():
    prompt = Prompt(TURN_2)
    cached = len(TURN_1) // CHUNK_CHARS * CHUNK_CHARS
    # prefill-1 holds the first turn, and `resident` characters of prompts in flight
    for resident, expected in ((cached - 1, "prefill-1"), (cached + 1, "prefill-0")):
        p = pool("kv_router", [(0, 0), (1, 0)])
        p.upstreams[1].resident = resident
        assert p.upstreams[1].index is not None
        p.upstreams[1].index.add(Prompt(TURN_1).keys)
        assert p.candidates(prompt)[1].active_tokens == resident
        assert p.pick(prompt).name == expected
    up = p.upstreams[0]
    with Flight(up, prompt) as flight:
        flight.answered()  # its first byte: no longer queued, its KV still held
        assert (up.prefilling, up.resident) == (0, len(TURN_2))
    assert up.resident == 0


def test_round_robin_alternates_whatever_the_load():
    p = pool("round_robin", [(0, 0), (9, 900)])
    assert [p.pick(Prompt("x")).name for _ in range(3)] == ["prefill-0", "prefill-1",
                                                            "prefill-0"]
    assert p.upstreams[0].index is None  # no prefix index for a policy that needs none


def test_prefix_aware_keeps_a_conversation_on_its_instance_and_spreads_the_rest():
    async def scenario(client: TestClient, fakes: dict[str, Fake]) -> None:
        resp = await client.post("/v1/completions", json={"prompt": TURN_1})
        assert resp.headers["x-rackplan-prefill"] == "prefill-0"  # both empty: the first
        await resp.read()
        fakes["prefill-0"].hold = asyncio.Event()  # prefill-0 now busy with a short prompt
        busy = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "hi"}))
        await until_seen(fakes["prefill-0"], 2)
        resp = await client.post("/v1/completions", json={"prompt": OTHER})
        assert resp.headers["x-rackplan-prefill"] == "prefill-1"  # the less loaded one
        await resp.read()
        turn_2 = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": TURN_2}))
        await until_seen(fakes["prefill-0"], 3)  # busy or not, it holds the first turn
        fakes["prefill-0"].hold.set()
        for task in (busy, turn_2):
            resp = await task
            assert resp.headers["x-rackplan-prefill"] == "prefill-0"
            await resp.read()
        assert [body["prompt"] for _, body, _ in fakes["prefill-0"].seen] == [
            TURN_1, "hi", TURN_2]

    run(["prefill-0", "prefill-1", "decode-0"], scenario)


def test_session_affinity_keeps_a_session_where_round_robin_alternates():
    async def turns(client: TestClient, fakes: dict[str, Fake]) -> list[str]:
        """A session's first turn while aggregated-0 is busy, then three idle turns."""
        fakes["aggregated-0"].hold = asyncio.Event()
        busy = asyncio.ensure_future(client.post("/v1/completions",
                                                 json={"prompt": "busy", "stream": True}))
        await until_seen(fakes["aggregated-0"], 1)
        where = []
        for n in range(4):
            resp = await client.post("/v1/completions", json={"prompt": f"turn {n}"},
                                     headers={"X-Session-ID": "s-1"})
            where.append(resp.headers["x-rackplan-prefill"])
            await resp.read()
            fakes["aggregated-0"].hold.set()
        await (await busy).read()
        return where

    async def affinity(client: TestClient, fakes: dict[str, Fake]) -> None:
        assert await turns(client, fakes) == ["aggregated-1"] * 4
        resp = await client.post("/v1/completions", json={"prompt": "no session"})
        assert resp.headers["x-rackplan-prefill"] == "aggregated-0"  # by cost: idle, first
        assert resp.headers["x-rackplan-policy"] == "aggregated=session_affinity"

    async def round_robin(client: TestClient, fakes: dict[str, Fake]) -> None:
        assert await turns(client, fakes) == ["aggregated-1", "aggregated-0",
                                              "aggregated-1", "aggregated-0"]

    names = ["aggregated-0", "aggregated-1"]
    run(names, affinity, policies={"aggregated_policy": "session_affinity"})
    run(names, round_robin, policies={"aggregated_policy": "round_robin"})


def test_session_comes_from_the_first_header_present_else_the_user_field():
    def headers(**items: str) -> CIMultiDictProxy[str]:
        return CIMultiDictProxy(CIMultiDict({k.replace("_", "-"): v for k, v in items.items()}))

    both = headers(x_correlation_id="c", x_dynamo_session_id="d")
    assert session_of(both, {"user": "u"}) == "c"
    assert session_of(headers(x_session_id="s", x_correlation_id="c"), {}) == "s"
    assert session_of(headers(x_dynamo_session_id="d"), {}) == "d"
    assert session_of(headers(), {"user": "u"}) == "u"
    assert session_of(headers(), {"user": 7}) is None and session_of(headers(), {}) is None


def test_a_later_chat_turn_extends_the_first_turns_prompt():
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    later = [*first, {"role": "assistant", "content": "hi"},
             {"role": "user", "content": [{"type": "text", "text": "more"}]}]
    a = Prompt.of("/v1/chat/completions", {"messages": first}).text
    b = Prompt.of("/v1/chat/completions", {"messages": later}).text
    assert b.startswith(a) and "be brief" in a and "assistant" in b and len(b) > len(a)
    assert Prompt.of("/v1/completions", {"prompt": [1, 2, 3]}).text == "[1,2,3]"
    assert Prompt.of("/v1/chat/completions", {"messages": "bad"}).text == ""


def test_chunk_keys_are_chained_and_cover_whole_chunks_only():
    a = "a" * CHUNK_CHARS
    keys = chunk_keys(a * 3 + "tail")
    assert len(keys) == 3 and len(set(keys)) == 3  # same text, different prefixes
    assert chunk_keys(a * 2) == keys[:2] and chunk_keys("b" + a * 3)[:1] != keys[:1]
    assert chunk_keys(a[:-1]) == []


def test_prefix_index_is_bounded_and_forgets_the_least_recent_tails_first():
    index = PrefixIndex(capacity=4)
    old, new = chunk_keys("o" * CHUNK_CHARS * 3), chunk_keys("n" * CHUNK_CHARS * 3)
    index.add(old)
    assert index.matched(old) == 3 and index.matched(new) == 0
    index.add(new)
    assert len(index) == 4
    assert index.matched(new) == 3 and index.matched(old) == 1  # old lost its tail first


def test_default_policies_are_the_tables():
    config = RouterConfig.from_dict({"port": 1, "prefill_urls": ["http://a:1"],
                                     "decode_urls": ["http://b:1"]})
    assert {r: config.policy(r) for r in DEFAULT_ROUTER} == DEFAULT_ROUTER
    config = RouterConfig.from_dict({"port": 1, "aggregated_urls": ["http://a:1"],
                                     "aggregated_policy": "least_tokens"})
    assert Proxy(config).policy_tag == "aggregated=least_tokens"


@pytest.mark.parametrize(("key", "value"), [
    ("prefill_policy", "fastest"), ("decode_policy", 3), ("aggregated_policy", None)])
def test_an_unknown_policy_is_refused_naming_the_valid_ones(key: str, value: Any):
    data = {"port": 1, "aggregated_urls": ["http://a:1"], key: value}
    with pytest.raises(ConfigError) as err:
        RouterConfig.from_dict(data)
    assert str(err.value) == (f"router {key}={value!r} is not a router policy; valid: "
                              f"{', '.join(POLICIES)}")
