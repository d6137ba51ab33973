"""Who may talk to the HTTP API: an ASGI middleware in front of every route, and the bind rule.

Threat model: other local users, web pages open in the user's browser, and hosts on the LAN. The middleware refuses,
before a route runs and before a body is read:

- a ``Host`` header naming anything but the bound address, ``localhost``, ``127.0.0.1`` or ``[::1]`` with the
  bound port (403): a web page that rebinds its own DNS name to 127.0.0.1 sends its own name. On a non-loopback
  bind any IP-literal host with that port is also accepted (no DNS name can be rebound to an address literal);
- a browser ``Origin`` that is not a loopback origin nor the daemon's own (the allowed ``Host``, for the web page
  opened at a LAN address) (403): no other web page can drive the API, even with a simple cross-origin POST that
  needs no preflight;
- without ``Authorization: Bearer <token>`` when a token is configured (401; compared in constant time), except a
  ``GET`` of the ``public`` paths: the web page's static files, which hold no data (the page asks for the token and
  sends it with each API call);
- a body over ``MAX_BODY_BYTES`` (413), by ``Content-Length`` or as it streams in;
- a ``GET /mcp`` event stream beyond ``MAX_EVENT_STREAMS`` open at once (503 with ``Retry-After``): each is held
  open until the client leaves, and costs a descriptor and memory (2,000 of them cost +170 MB).

``check_bind`` is the start-up rule: a non-loopback bind without a token is refused (``ConfigError``), with one it
is allowed and warned about.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from indexer.errors import ConfigError

MAX_BODY_BYTES = 1024 * 1024  # request bodies (a search is a few hundred bytes)
MAX_EVENT_STREAMS = 32  # GET /mcp event streams open at once (the tools answer on POST; a client holds one stream)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]", "::1")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address or a host name without port) names this machine's loopback interface."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def check_bind(host: str, token: str) -> str | None:
    """The start-up rule for bind address ``host``: ``None`` for loopback; a warning to log for a non-loopback bind
    with a token. Raises ``ConfigError`` (one line) for a non-loopback bind without one."""
    if is_loopback(host):
        return None
    if not token:
        raise ConfigError(f"host {host!r} is not a loopback address: anyone on the network could read every agent's "
                          f"memory. Set a token (QMD_INDEXER_TOKEN or `token` in the config) or bind 127.0.0.1")
    return (f"the API listens on {host}, reachable from the network: every request needs the bearer token; "
            f"prefer 127.0.0.1 behind an SSH tunnel or a TLS proxy, since the token travels in clear HTTP")


def _split_host(value: str) -> tuple[str, str]:
    """``("name", "port")`` of a ``Host`` header value (``port`` is ``""`` when absent)."""
    if value.startswith("["):
        name, _, rest = value.partition("]")
        return name + "]", rest.removeprefix(":")
    name, _, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    return (name, port) if name else (value, "")


class Guard:
    """ASGI middleware applying the rules above to ``app`` for a daemon bound to ``host``:``port``."""

    def __init__(self, app: Callable[..., Awaitable[None]], host: str, port: int, token: str = "",
                 max_body_bytes: int = MAX_BODY_BYTES, max_streams: int | None = None,
                 public: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.port = str(port)
        self.bound = host.lower()
        self.open_bind = not is_loopback(host)
        self.names = {name.lower() for name in (*LOOPBACK_NAMES, host, f"[{host}]")}
        self.token = token.encode()
        self.max_body_bytes = max_body_bytes
        self.max_streams = MAX_EVENT_STREAMS if max_streams is None else max_streams
        self.streams = 0  # GET /mcp event streams open now (changed on the event loop only)
        self.public = public  # paths a GET may fetch without the token (static files, no data)

    def host_allowed(self, value: str) -> bool:
        name, port = _split_host(value.strip().lower())
        if port != self.port and not (port == "" and self.port == "80"):
            return False
        return name in self.names or (self.open_bind and _is_ip_literal(name))

    @staticmethod
    def origin_allowed(value: str) -> bool:
        try:
            origin = urlsplit(value)
            return origin.scheme in ("http", "https") and is_loopback(origin.hostname or "")
        except ValueError:
            return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # the API has no websocket routes
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if not self.host_allowed(headers.get("host", "")):
            await _reject(send, 403, "host not allowed: use http://127.0.0.1:<port> (DNS-rebinding protection)")
            return
        own = {f"{scheme}://{headers.get('host', '').strip().lower()}" for scheme in ("http", "https")}
        if "origin" in headers and not self.origin_allowed(headers["origin"]) and headers["origin"].lower() not in own:
            await _reject(send, 403, "cross-origin requests are refused: only loopback origins may call the API")
            return
        if self.token and not (scope.get("method") == "GET" and scope.get("path") in self.public):
            scheme, _, given = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), self.token):
                await _reject(send, 401, "missing or wrong bearer token", [(b"www-authenticate", b"Bearer")])
                return
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            await _reject(send, 413, f"request body over {self.max_body_bytes} bytes")
            return
        if scope.get("method") == "GET" and scope.get("path") == "/mcp":
            if self.streams >= self.max_streams:
                await _reject(send, 503, f"{self.streams} MCP event streams are open, the most this daemon keeps "
                              f"(MAX_EVENT_STREAMS); close one, or use POST /mcp", [(b"retry-after", b"5")])
                return
            self.streams += 1
            try:
                await self._capped(scope, receive, send)
            finally:
                self.streams -= 1
            return
        await self._capped(scope, receive, send)

    async def _capped(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app with a ``receive`` that stops a streamed (chunked) body at the cap: the client gets 413, the
        app a disconnect, and whatever the app answers after that is dropped."""
        seen = 0
        rejected = False
        cap = self.max_body_bytes

        async def capped_receive() -> MutableMapping[str, Any]:
            nonlocal seen, rejected
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > cap and not rejected:
                    rejected = True
                    await _reject(send, 413, f"request body over {cap} bytes")
            return {"type": "http.disconnect"} if rejected else message

        async def guarded_send(message: MutableMapping[str, Any]) -> None:
            if not rejected:
                await send(message)

        await self.app(scope, capped_receive, guarded_send)


async def _reject(send: Send, status: int, detail: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
