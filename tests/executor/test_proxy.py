"""executor/proxy: the P/D protocol against fake upstream instances (in-process aiohttp)."""

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

from executor.proxy import REMOTE_DECODE, ConfigError, Proxy, RouterConfig, load_config

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
        extra: dict[str, list[str]] | None = None) -> None:
    """Start fakes for `names` (prefill-i, decode-i, aggregated-i), a proxy in front, and run
    `scenario(client, fakes)`. `extra` adds URLs (e.g. a closed port) per role."""

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
        proxy = Proxy(RouterConfig.from_dict({"port": 0, **urls}))
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


def test_decode_is_round_robin():
    async def scenario(client: TestClient, fakes: dict[str, Fake]) -> None:
        order = []
        for _ in range(4):
            resp = await client.post("/v1/completions", json={"prompt": "p", "stream": True})
            await resp.read()
            order.append(resp.headers["x-rackplan-decode"])
        assert order == ["decode-0", "decode-1", "decode-0", "decode-1"]
        assert len(fakes["decode-0"].seen) == len(fakes["decode-1"].seen) == 2

    run(["prefill-0", "decode-0", "decode-1"], scenario)


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
