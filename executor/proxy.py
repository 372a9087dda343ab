"""The P/D proxy: one HTTP endpoint in front of the prefill and decode instances.

It speaks the protocol of vLLM's KV-transfer deployments. For each /v1/completions or
/v1/chat/completions request it
1. sends the request to a prefill instance with `max_tokens: 1`, `stream: false`, an
   `X-Request-Id` header and `kv_transfer_params: {do_remote_decode: true, ...}`;
2. copies the `kv_transfer_params` of the prefill's answer into the original request, sends that
   to a decode instance with the same request id, and streams the decode's answer back.
Prefill instances are picked by fewest outstanding requests, decode instances round-robin. For an
aggregated deployment it forwards each request to one instance (fewest outstanding).

Every answer carries `x-rackplan-prefill` and `x-rackplan-decode` headers naming the instances
that served it (`prefill-0`, `decode-1`, `aggregated-0`: the renderer's instance names), and
`x-request-id`. GET /v1/models is answered by the first decode (or aggregated) instance; GET
/health says 200 when every instance's /health does, else 503 naming those that do not.

Run as `python -m executor.proxy --config router.json`, where router.json is the renderer's
router: {"port": 8099, "prefill_urls": [...], "decode_urls": [...]} or {"port": ...,
"aggregated_urls": [...]}, optionally with "host" (default 127.0.0.1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROUTES = ("/v1/completions", "/v1/chat/completions")
PREFILL_HEADER = "x-rackplan-prefill"
DECODE_HEADER = "x-rackplan-decode"
REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}
"""kv_transfer_params of the prefill request: keep the KV for a remote decode."""
HEALTH_TIMEOUT_S = 5.0
FORWARDED_HEADERS = ("authorization",)
"""Client headers passed on to the instances (besides the request id)."""


class ConfigError(ValueError):
    """A router configuration that cannot run, in one sentence naming the bad value."""


@dataclass(frozen=True)
class RouterConfig:
    """Where the proxy listens and the instances behind it."""

    port: int
    """Port the proxy listens on."""
    prefill_urls: tuple[str, ...] = ()
    """Base URLs of the prefill instances (P/D)."""
    decode_urls: tuple[str, ...] = ()
    """Base URLs of the decode instances (P/D)."""
    aggregated_urls: tuple[str, ...] = ()
    """Base URLs of the instances that do both (no P/D)."""
    host: str = "127.0.0.1"
    """Address the proxy binds."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RouterConfig:
        """A config from the renderer's router dict; ConfigError naming the bad value."""
        known = {"port", "host", "prefill_urls", "decode_urls", "aggregated_urls"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown router key {unknown[0]!r}; valid keys: "
                              f"{', '.join(sorted(known))}")
        port = data.get("port")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ConfigError(f"router port={port!r} must be an integer in 0..65535")
        lists: dict[str, tuple[str, ...]] = {}
        for key in ("prefill_urls", "decode_urls", "aggregated_urls"):
            value = data.get(key, [])
            if not isinstance(value, list | tuple) or not all(
                    isinstance(u, str) and u.startswith(("http://", "https://")) for u in value):
                raise ConfigError(f"router {key}={value!r} must be a list of http(s) URLs")
            lists[key] = tuple(u.rstrip("/") for u in value)
        pd = bool(lists["prefill_urls"]) or bool(lists["decode_urls"])
        if pd and lists["aggregated_urls"]:
            raise ConfigError("router has both P/D and aggregated URLs; give prefill_urls and "
                              "decode_urls, or aggregated_urls alone")
        if pd and not (lists["prefill_urls"] and lists["decode_urls"]):
            missing = "decode_urls" if lists["prefill_urls"] else "prefill_urls"
            raise ConfigError(f"router {missing} is empty; P/D needs both prefill_urls and "
                              "decode_urls")
        if not pd and not lists["aggregated_urls"]:
            raise ConfigError("router has no instance URLs; give prefill_urls and decode_urls, "
                              "or aggregated_urls")
        host = data.get("host", "127.0.0.1")
        if not isinstance(host, str) or not host:
            raise ConfigError(f"router host={host!r} must be a non-empty string")
        return cls(port=port, host=host, **lists)

    @property
    def disaggregated(self) -> bool:
        """Whether requests go prefill then decode."""
        return bool(self.prefill_urls)


def load_config(path: str | Path) -> RouterConfig:
    """The router config in a JSON file; ConfigError if it cannot be read or is invalid."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: invalid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a JSON object")
    return RouterConfig.from_dict(data)


@dataclass
class Upstream:
    """One engine instance behind the proxy and its requests in flight."""

    name: str
    url: str
    outstanding: int = 0


class Proxy:
    """The proxy's state (instances, in-flight counts, round-robin position) and handlers."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.prefill = [Upstream(f"prefill-{i}", u) for i, u in enumerate(config.prefill_urls)]
        self.decode = [Upstream(f"decode-{i}", u) for i, u in enumerate(config.decode_urls)]
        self.aggregated = [Upstream(f"aggregated-{i}", u)
                           for i, u in enumerate(config.aggregated_urls)]
        self._next_decode = 0
        self._session: aiohttp.ClientSession | None = None

    @property
    def upstreams(self) -> list[Upstream]:
        """Every instance, prefill first."""
        return [*self.prefill, *self.decode, *self.aggregated]

    def app(self) -> web.Application:
        """The aiohttp application (its client session opens and closes with it)."""
        app = web.Application(client_max_size=64 * 2**20)
        for route in ROUTES:
            app.router.add_post(route, self.handle_generate)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/health", self.handle_health)
        app.cleanup_ctx.append(self._client)
        return app

    async def _client(self, app: web.Application) -> Any:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        self._session = aiohttp.ClientSession(timeout=timeout)
        yield
        await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the proxy's client session is not open; run it through app()")
        return self._session

    # --- picking instances -------------------------------------------------------------

    @staticmethod
    def least_outstanding(pool: list[Upstream]) -> Upstream:
        """The instance with the fewest requests in flight (the first on a tie)."""
        return min(pool, key=lambda u: u.outstanding)

    def next_decode(self) -> Upstream:
        """The next decode instance in round-robin order."""
        up = self.decode[self._next_decode % len(self.decode)]
        self._next_decode += 1
        return up

    # --- handlers ----------------------------------------------------------------------

    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/completions and /v1/chat/completions."""
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        headers = {"X-Request-Id": rid, **{
            h: request.headers[h] for h in FORWARDED_HEADERS if h in request.headers}}
        if not self.config.disaggregated:
            up = self.least_outstanding(self.aggregated)
            tags = {PREFILL_HEADER: up.name, DECODE_HEADER: up.name, "x-request-id": rid}
            return await self._stream(request, up, body, headers, tags)

        prefill = self.least_outstanding(self.prefill)
        first = {**body, "max_tokens": 1, "stream": False,
                 "kv_transfer_params": dict(REMOTE_DECODE)}
        if "max_completion_tokens" in first:
            first["max_completion_tokens"] = 1
        first.pop("stream_options", None)
        prefill.outstanding += 1
        try:
            async with self.session.post(prefill.url + request.path, json=first,
                                         headers=headers) as resp:
                text = await resp.text()
                if resp.status != 200:
                    return web.Response(status=resp.status, text=text,
                                        content_type=resp.content_type,
                                        headers={PREFILL_HEADER: prefill.name,
                                                 "x-request-id": rid})
        except aiohttp.ClientError as exc:
            return _error(502, f"{prefill.name} at {prefill.url} failed: {_reason(exc)}")
        finally:
            prefill.outstanding -= 1
        try:
            answer = json.loads(text)
        except ValueError:
            return _error(502, f"{prefill.name} answered with invalid JSON")
        second = dict(body)
        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if params:
            second["kv_transfer_params"] = params
        decode = self.next_decode()
        tags = {PREFILL_HEADER: prefill.name, DECODE_HEADER: decode.name, "x-request-id": rid}
        return await self._stream(request, decode, second, headers, tags)

    async def _stream(self, request: web.Request, up: Upstream, body: dict[str, Any],
                      headers: dict[str, str], tags: dict[str, str]) -> web.StreamResponse:
        """Send `body` to `up` and stream its answer back with the `tags` headers."""
        up.outstanding += 1
        out: web.StreamResponse | None = None
        try:
            async with self.session.post(up.url + request.path, json=body,
                                         headers=headers) as resp:
                out = web.StreamResponse(status=resp.status, headers=tags)
                out.content_type = resp.content_type
                await out.prepare(request)
                async for chunk in resp.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out
        except aiohttp.ClientError as exc:
            if out is None or not out.prepared:
                return _error(502, f"{up.name} at {up.url} failed: {_reason(exc)}", tags)
            out.force_close()  # the status line is sent: cut the stream short
            return out
        finally:
            up.outstanding -= 1

    async def handle_models(self, request: web.Request) -> web.Response:
        """GET /v1/models, answered by the first decode (or aggregated) instance."""
        up = (self.decode or self.aggregated)[0]
        try:
            async with self.session.get(up.url + "/v1/models") as resp:
                return web.Response(status=resp.status, body=await resp.read(),
                                    content_type=resp.content_type)
        except aiohttp.ClientError as exc:
            return _error(502, f"{up.name} at {up.url} failed: {_reason(exc)}")

    async def handle_health(self, request: web.Request) -> web.Response:
        """GET /health: 200 when every instance is healthy, else 503 naming the others."""
        async def healthy(up: Upstream) -> bool:
            try:
                async with self.session.get(
                        up.url + "/health",
                        timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)) as resp:
                    return resp.status == 200
            except (aiohttp.ClientError, TimeoutError):
                return False

        ups = self.upstreams
        states = await asyncio.gather(*(healthy(u) for u in ups))
        down = [u.name for u, ok in zip(ups, states, strict=True) if not ok]
        payload = {"status": "ok" if not down else "unhealthy", "unhealthy": down,
                   "instances": [u.name for u in ups]}
        return web.json_response(payload, status=503 if down else 200)


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status,
                             headers=headers)


def main(argv: list[str] | None = None) -> int:
    """Serve the proxy until interrupted."""
    ap = argparse.ArgumentParser(prog="python -m executor.proxy",
                                 description="P/D proxy in front of vLLM instances.")
    ap.add_argument("--config", required=True, help="router.json written by the renderer")
    ap.add_argument("--port", type=int, help="listen on this port instead of the config's")
    args = ap.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    port = config.port if args.port is None else args.port
    proxy = Proxy(config)
    names = ", ".join(f"{u.name}={u.url}" for u in proxy.upstreams)
    print(f"rackplan proxy on http://{config.host}:{port} -> {names}", flush=True)
    web.run_app(proxy.app(), host=config.host, port=port, print=None,
                handle_signals=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
