"""The P/D proxy: one HTTP endpoint in front of the prefill and decode instances.

It speaks the protocol of vLLM's KV-transfer deployments. For each /v1/completions or
/v1/chat/completions request it
1. sends the request to a prefill instance with `max_tokens: 1`, `stream: false`, an
   `X-Request-Id` header and `kv_transfer_params: {do_remote_decode: true, ...}`;
2. copies the `kv_transfer_params` of the prefill's answer into the original request, sends that
   to a decode instance with the same request id, and streams the decode's answer back.
For an aggregated deployment it forwards each request to one instance.

Which instance of a role takes a request is the plan's router policy for that role, from the
table the simulator uses too (simulator/specs/routing.py; by default prefill and aggregated
`prefix_aware`, decode `least_requests`). For every request the proxy hands the role's `Router`
one `Candidate` per instance: its requests in flight, the prompt characters of the requests
there that have not had a first byte of answer yet (their prefill, or for a decode instance its
KV load and first step), and, for policies that use a prefix, how much of this prompt the
instance is predicted to hold (executor/prefix_index.py: the proxy's own record of what it sent
where). The prompt is the completion's `prompt`, or the chat's messages in order (role and
content). A request's session, for `session_affinity`, is the first of the headers
X-Session-ID, X-Correlation-ID, X-Dynamo-Session-ID, else the body's `user`; a request without
one is routed by the policy's cost.

Every answer carries `x-rackplan-prefill` and `x-rackplan-decode` headers naming the instances
that served it (`prefill-0`, `decode-1`, `aggregated-0`: the renderer's instance names),
`x-rackplan-policy` naming the policies that chose them (`prefill=prefix_aware,decode=...`),
and `x-request-id`. GET /v1/models is answered by the first decode (or aggregated) instance;
GET /health says 200 when every instance's /health does, else 503 naming those that do not.

Run as `python -m executor.proxy --config router.json`, where router.json is the renderer's
router: {"port": 8099, "prefill_urls": [...], "decode_urls": [...], "prefill_policy": ...,
"decode_policy": ...} or {"port": ..., "aggregated_urls": [...], "aggregated_policy": ...},
optionally with "host" (default 127.0.0.1); a policy not given is the role's default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import aiohttp
from aiohttp import web
from multidict import CIMultiDictProxy

from executor.prefix_index import CHUNK_CHARS, PrefixIndex, chunk_keys
from simulator.specs.routing import DEFAULT_ROUTER, POLICIES, Candidate, Router, RouterPolicy

ROUTES = ("/v1/completions", "/v1/chat/completions")
PREFILL_HEADER = "x-rackplan-prefill"
DECODE_HEADER = "x-rackplan-decode"
POLICY_HEADER = "x-rackplan-policy"
SESSION_HEADERS = ("X-Session-ID", "X-Correlation-ID", "X-Dynamo-Session-ID")
"""Headers that name a request's session, first present wins (AgentX stamps these)."""
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
    prefill_policy: RouterPolicy = DEFAULT_ROUTER["prefill"]
    """Router policy over the prefill instances (simulator/specs/routing.py)."""
    decode_policy: RouterPolicy = DEFAULT_ROUTER["decode"]
    """Router policy over the decode instances."""
    aggregated_policy: RouterPolicy = DEFAULT_ROUTER["aggregated"]
    """Router policy over the aggregated instances."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RouterConfig:
        """A config from the renderer's router dict; ConfigError naming the bad value."""
        known = {"port", "host", "prefill_urls", "decode_urls", "aggregated_urls",
                 *(f"{role}_policy" for role in DEFAULT_ROUTER)}
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
        return cls(port=port, host=host, prefill_urls=lists["prefill_urls"],
                   decode_urls=lists["decode_urls"], aggregated_urls=lists["aggregated_urls"],
                   prefill_policy=_policy(data, "prefill"),
                   decode_policy=_policy(data, "decode"),
                   aggregated_policy=_policy(data, "aggregated"))

    def policy(self, role: str) -> RouterPolicy:
        """The router policy of `role` (prefill, decode or aggregated)."""
        return {"prefill": self.prefill_policy, "decode": self.decode_policy,
                "aggregated": self.aggregated_policy}[role]

    @property
    def disaggregated(self) -> bool:
        """Whether requests go prefill then decode."""
        return bool(self.prefill_urls)


def _policy(data: Mapping[str, Any], role: str) -> RouterPolicy:
    """The `<role>_policy` of a router dict (the role's default when absent)."""
    key = f"{role}_policy"
    value = data.get(key, DEFAULT_ROUTER[role])
    if not isinstance(value, str) or value not in POLICIES:
        raise ConfigError(f"router {key}={value!r} is not a router policy; valid: "
                          f"{', '.join(POLICIES)}")
    return cast(RouterPolicy, value)


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


class Prompt:
    """What the proxy sees of a request's prompt: its text and that text's chunk keys."""

    def __init__(self, text: str) -> None:
        self.text = text

    @property
    def chars(self) -> int:
        """The prompt's size in the proxy's units (characters)."""
        return len(self.text)

    @cached_property
    def keys(self) -> list[int]:
        """Chained keys of its whole chunks (computed once, when a policy needs them)."""
        return chunk_keys(self.text)

    @classmethod
    def of(cls, path: str, body: Mapping[str, Any]) -> Prompt:
        """The prompt of a completion (`prompt`: text as is, token ids or a batch as compact
        JSON) or a chat (each message's role and content, in order, so that a later turn's
        text extends an earlier turn's)."""
        if path.endswith("/chat/completions"):
            messages = body.get("messages")
            if not isinstance(messages, list):
                return cls("")
            return cls("".join(_message_text(m) for m in messages))
        prompt = body.get("prompt", "")
        return cls(prompt if isinstance(prompt, str) else _compact(prompt))


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _message_text(message: Any) -> str:
    """A chat message as its role and content between control separators no text uses."""
    if not isinstance(message, dict):
        return "\x1e" + _compact(message)
    content = message.get("content")
    text = content if isinstance(content, str) else _compact(content)
    return f"\x1e{message.get('role', '')}\x1f{text}"


def session_of(headers: CIMultiDictProxy[str], body: Mapping[str, Any]) -> str | None:
    """The request's session: the first SESSION_HEADERS present, else the body's `user`."""
    for name in SESSION_HEADERS:
        if headers.get(name):
            return headers[name]
    user = body.get("user")
    return user if isinstance(user, str) and user else None


@dataclass
class Upstream:
    """One engine instance behind the proxy and its requests in flight."""

    name: str
    url: str
    outstanding: int = 0
    """Requests in flight here."""
    prefilling: int = 0
    """Prompt characters of the requests here that have had no byte of answer yet."""
    resident: int = 0
    """Prompt characters of all the requests in flight here: the KV they hold, as far as the
    proxy can see it (what `kv_router` counts)."""
    index: PrefixIndex | None = None
    """What this instance is predicted to hold (only for a policy that uses a prefix)."""


class Flight:
    """One request at an upstream, as a context manager: in its load until it ends, and in its
    queued prompt until `answered()` (its first byte back) or its end."""

    def __init__(self, up: Upstream, prompt: Prompt) -> None:
        self.up = up
        self.chars = prompt.chars
        self._queued = False

    def __enter__(self) -> Flight:
        self.up.outstanding += 1
        self.up.resident += self.chars
        self.up.prefilling += self.chars
        self._queued = True
        return self

    def answered(self) -> None:
        """The first byte of the answer arrived: the prompt is no longer queued there."""
        if self._queued:
            self.up.prefilling -= self.chars
            self._queued = False

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.answered()
        self.up.outstanding -= 1
        self.up.resident -= self.chars


class Pool:
    """The instances of one role and the router that picks among them."""

    def __init__(self, role: str, urls: tuple[str, ...], policy: RouterPolicy) -> None:
        self.role = role
        self.router = Router(policy)
        uses_prefix = self.router.policy.uses_prefix
        self.upstreams = [Upstream(f"{role}-{i}", u, index=PrefixIndex() if uses_prefix else None)
                          for i, u in enumerate(urls)]

    @property
    def policy(self) -> str:
        return self.router.policy.name

    def candidates(self, prompt: Prompt) -> list[Candidate]:
        """Each instance as the router sees it for this prompt, in the instances' order."""
        out = []
        for up in self.upstreams:
            cached = 0 if up.index is None else up.index.matched(prompt.keys) * CHUNK_CHARS
            out.append(Candidate(queued_tokens=up.prefilling, requests=up.outstanding,
                                 cached_tokens=cached, prompt_tokens=prompt.chars,
                                 active_tokens=up.resident))
        return out

    def pick(self, prompt: Prompt, session: str | None = None) -> Upstream:
        """The instance the policy chooses; it is then predicted to hold the prompt."""
        up = self.upstreams[self.router.pick(self.candidates(prompt), session)]
        if up.index is not None:
            up.index.add(prompt.keys)
        return up


class Proxy:
    """The proxy's state (a pool of instances per role, their loads and routers) and handlers."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.pools = {role: Pool(role, urls, config.policy(role)) for role, urls in (
            ("prefill", config.prefill_urls), ("decode", config.decode_urls),
            ("aggregated", config.aggregated_urls)) if urls}
        self.policy_tag = ",".join(f"{r}={p.policy}" for r, p in self.pools.items())
        """The x-rackplan-policy header of every answer."""
        self._session: aiohttp.ClientSession | None = None

    @property
    def upstreams(self) -> list[Upstream]:
        """Every instance, prefill first."""
        return [u for pool in self.pools.values() for u in pool.upstreams]

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
        prompt = Prompt.of(request.path, body)
        session = session_of(request.headers, body)
        if not self.config.disaggregated:
            up = self.pools["aggregated"].pick(prompt, session)
            tags = self._tags(rid, up, up)
            return await self._stream(request, up, prompt, body, headers, tags)

        prefill = self.pools["prefill"].pick(prompt, session)
        first = {**body, "max_tokens": 1, "stream": False,
                 "kv_transfer_params": dict(REMOTE_DECODE)}
        if "max_completion_tokens" in first:
            first["max_completion_tokens"] = 1
        first.pop("stream_options", None)
        try:
            with Flight(prefill, prompt):
                async with self.session.post(prefill.url + request.path, json=first,
                                             headers=headers) as resp:
                    text = await resp.text()
                    if resp.status != 200:
                        return web.Response(status=resp.status, text=text,
                                            content_type=resp.content_type,
                                            headers=self._tags(rid, prefill))
        except aiohttp.ClientError as exc:
            return _error(502, f"{prefill.name} at {prefill.url} failed: {_reason(exc)}")
        try:
            answer = json.loads(text)
        except ValueError:
            return _error(502, f"{prefill.name} answered with invalid JSON")
        second = dict(body)
        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if params:
            second["kv_transfer_params"] = params
        decode = self.pools["decode"].pick(prompt, session)
        return await self._stream(request, decode, prompt, second, headers,
                                  self._tags(rid, prefill, decode))

    def _tags(self, rid: str, prefill: Upstream, decode: Upstream | None = None
              ) -> dict[str, str]:
        """Headers of an answer: who served it, which policies chose them, the request id."""
        tags = {PREFILL_HEADER: prefill.name, POLICY_HEADER: self.policy_tag,
                "x-request-id": rid}
        if decode is not None:
            tags[DECODE_HEADER] = decode.name
        return tags

    async def _stream(self, request: web.Request, up: Upstream, prompt: Prompt,
                      body: dict[str, Any], headers: dict[str, str], tags: dict[str, str]
                      ) -> web.StreamResponse:
        """Send `body` to `up` and stream its answer back with the `tags` headers."""
        out: web.StreamResponse | None = None
        with Flight(up, prompt) as flight:
            try:
                async with self.session.post(up.url + request.path, json=body,
                                             headers=headers) as resp:
                    out = web.StreamResponse(status=resp.status, headers=tags)
                    out.content_type = resp.content_type
                    await out.prepare(request)
                    async for chunk in resp.content.iter_any():
                        flight.answered()
                        await out.write(chunk)
                    await out.write_eof()
                    return out
            except aiohttp.ClientError as exc:
                if out is None or not out.prepared:
                    return _error(502, f"{up.name} at {up.url} failed: {_reason(exc)}", tags)
                out.force_close()  # the status line is sent: cut the stream short
                return out

    async def handle_models(self, request: web.Request) -> web.Response:
        """GET /v1/models, answered by the first decode (or aggregated) instance."""
        up = self.pools["decode" if self.config.disaggregated else "aggregated"].upstreams[0]
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
    print(f"rackplan proxy on http://{config.host}:{port} -> {names} ({proxy.policy_tag})",
          flush=True)
    web.run_app(proxy.app(), host=config.host, port=port, print=None,
                handle_signals=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
