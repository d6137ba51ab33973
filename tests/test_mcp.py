"""The MCP tools and the typed HTTP contract, as an agent meets them: a real daemon (real model, real Qdrant Edge)
on a small workspace, served by uvicorn, asked through the official ``mcp`` SDK client in-process, over stdio
(the ``qmd-indexer mcp`` subprocess) and over streamable HTTP at ``/mcp``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import uvicorn
from conftest import wait_for, write
from fastapi.testclient import TestClient
from mcp import Client as McpClient
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client
from server_process import free_port

from indexer.client import Client
from indexer.mcp import build_server
from indexer.schema import SearchRequest
from indexer.server import create_app
from indexer.worker import index_once

ROOT = Path(__file__).resolve().parents[1]
TOOLS = {"memory_search", "memory_get", "memory_recall", "memory_boot", "memory_status"}
JSON_RPC_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json",
                    "mcp-protocol-version": "2025-06-18"}
LIST_TOOLS = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


class Served:
    """``create_app(indexer.view)`` served by uvicorn on a thread, as ``qmd-indexer run`` serves it (lifespan on)."""

    def __init__(self, indexer: Any) -> None:
        self.port = indexer.settings.port  # the guard accepts the Host of the port the settings name
        self.app = create_app(indexer.view)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_config=None,
                                                    access_log=False, lifespan="on", ws="none"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        wait_for(lambda: self.server.started, timeout_s=30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(name="daemon")
def daemon_fixture(workspace: Path, make_indexer) -> Iterator[Served]:
    """The conftest workspace indexed, plus a 30-line log note, served on a free port."""
    write(workspace / "memory" / "log.md", "".join(f"line {i}\n" for i in range(1, 31)))
    indexer = make_indexer([{"agent": "main", "path": workspace}], port=free_port())
    index_once(indexer)
    indexer.state.ready.set()
    with Served(indexer) as served:
        yield served


async def _ask(client: McpClient, tool: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
    """``(is_error, structured content)`` of a tool call, or ``(True, the error text)``."""
    result = await client.call_tool(tool, arguments)
    text = "".join(getattr(block, "text", "") for block in result.content)
    return result.is_error, (text if result.is_error else result.structured_content)


# -- the typed HTTP contract -------------------------------------------------------------------------------------
def test_openapi_types_every_answer(make_indexer, workspace: Path) -> None:
    spec = create_app(make_indexer([{"agent": "main", "path": workspace}]).view).openapi()
    schemas = spec["components"]["schemas"]
    declared_errors = {"/search": {"400", "404", "503"}, "/get": {"400", "403", "404"}, "/boot": {"400", "404", "503"},
                       "/recall": {"404", "503"}, "/append": {"400", "403", "404", "413", "503"}}
    seen = set()
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            seen.add(path)
            schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
            assert "$ref" in schema, f"{method} {path}: untyped 200 ({schema})"
            model = schemas[schema["$ref"].rsplit("/", 1)[-1]]
            assert model.get("type") == "object" and model.get("properties"), f"{method} {path}: a bare object"
            for code in declared_errors.get(path, ()):
                assert operation["responses"][code]["content"]["application/json"]["schema"]["$ref"].endswith(
                    "/ErrorDetail"), f"{method} {path}: {code} not declared"
    assert seen == {"/health", "/status", "/search", "/recall", "/boot", "/get", "/reindex", "/append"}
    assert {"path", "start_line", "end_line", "score", "snippet", "citation", "start_s", "width"} <= set(
        schemas["Hit"]["properties"]) and schemas["Hit"]["additionalProperties"] is True
    # every field of the one search request, and at least the names clients already send
    assert set(schemas["SearchRequest"]["properties"]) == set(SearchRequest.model_fields) >= {
        "query", "k", "agent", "collection", "mode", "path_prefix", "kind", "min_score", "since", "wait_s"}
    assert "pending" in schemas["SearchResponse"]["properties"] and "pending" in schemas["BootContext"]["properties"]
    assert "k" in schemas["RecallRequest"]["properties"] and "top_k" not in schemas["RecallRequest"]["properties"]
    assert {"from", "to", "text", "next_from"} <= set(schemas["Page"]["properties"])


def test_old_argument_names_are_still_accepted(daemon: Served) -> None:
    with Client(port=daemon.port) as client:
        listed = client.recall("*", top_k=2)  # the former keyword
        assert [h["path"] for h in listed] == ["MEMORY.md", "memory/food/coffee.md"]
        assert client.recall("*", k=2) == listed
        raw = client._call("POST", "/recall", json={"query": "*", "top_k": 1})["hits"]
        assert raw == listed[:1]
        hits = client._call("POST", "/search", json={"q": "ACME-4471", "limit": 1, "mode": "keyword"})["hits"]
        assert [h["path"] for h in hits] == ["memory/incidents.md"]


# -- the tools, in-process ---------------------------------------------------------------------------------------
def test_tools_answer_through_the_daemon(daemon: Served) -> None:
    """The stdio flavour (tools over ``indexer.client``) driven in-process by the SDK's client."""

    async def main() -> None:
        with Client(port=daemon.port) as client:
            async with McpClient(build_server(client)) as mcp:
                tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
                assert set(tools) == TOOLS
                search = tools["memory_search"]
                assert set(search.input_schema["properties"]) == set(SearchRequest.model_fields) - {"wait_s"} >= {
                    "query", "k", "mode", "agent", "collection", "path_prefix", "kind", "since", "min_score"}
                assert search.input_schema["required"] == ["query"]
                assert set(tools["memory_get"].input_schema["properties"]) == {"path", "from", "lines", "max_chars",
                                                                                "agent"}
                assert "budget_chars" in tools["memory_boot"].input_schema["properties"]
                for tool in tools.values():
                    assert tool.description and "Returns" in tool.description and tool.output_schema
                    assert tool.annotations and tool.annotations.read_only_hint

                error, found = await _ask(mcp, "memory_search", {"q": "ACME-4471", "limit": 2})  # aliases
                assert not error and found["hits"][0]["path"] == "memory/incidents.md"
                assert found["hits"][0]["citation"] == "memory/incidents.md#L1-L3"
                assert "ACME-4471" in found["hits"][0]["snippet"] and len(found["hits"]) == 2
                error, found = await _ask(mcp, "memory_search", {"query": "what coffee does the user drink?", "k": 1,
                                                                 "mode": "dense", "path_prefix": "memory/food",
                                                                 "since": "7d", "kind": "markdown", "min_score": 0.1})
                assert not error and [h["path"] for h in found["hits"]] == ["memory/food/coffee.md"]

                error, page = await _ask(mcp, "memory_get", {"path": "memory/log.md", "from": 10, "lines": 5})
                assert not error and page["text"] == "\n".join(f"line {i}" for i in range(10, 15))
                assert (page["from"], page["to"], page["truncated"], page["next_from"]) == (10, 14, True, 15)
                error, page = await _ask(mcp, "memory_get", {"path": "memory/log.md", "from_line": 29})
                assert not error and page["text"] == "line 29\nline 30" and page["next_from"] is None

                error, listed = await _ask(mcp, "memory_recall", {"query": "*", "top_k": 10})
                assert not error and [h["path"] for h in listed["hits"]] == [
                    "MEMORY.md", "memory/food/coffee.md", "memory/incidents.md", "memory/log.md", "memory/travel.md"]
                assert all(h["score"] is None for h in listed["hits"])
                error, recalled = await _ask(mcp, "memory_recall", {"q": "Lisbon flights", "k": 1})
                assert not error and recalled["hits"][0]["path"] == "memory/travel.md"

                error, boot = await _ask(mcp, "memory_boot", {"budget": 200})
                assert not error and boot["used_chars"] == len(boot["text"]) <= 200
                assert boot["included"][0] == "MEMORY.md#L1-L4" and boot["omitted"]

                error, status = await _ask(mcp, "memory_status", {})
                assert not error and status["ready"] is True and status["collections"]["memory-dir-main"]["files"] == 4

    anyio.run(main)


def test_tool_errors_reach_the_model(daemon: Served, tmp_path: Path) -> None:
    write(tmp_path / "secret.md", "the secret")

    async def main() -> None:
        with Client(port=daemon.port) as client:
            async with McpClient(build_server(client)) as mcp:
                error, text = await _ask(mcp, "memory_search", {"query": "x", "agent": "ghost"})
                assert error and "unknown agent 'ghost'" in text
                error, text = await _ask(mcp, "memory_get", {"path": "../secret.md"})
                assert error and "not a memory file" in text and "the secret" not in text
                error, text = await _ask(mcp, "memory_get", {"path": "memory/nope.md"})
                assert error and "no such file" in text
                error, text = await _ask(mcp, "memory_search", {"query": "x", "since": "last tuesday"})
                assert error and "7d" in text
                error, text = await _ask(mcp, "memory_search", {"query": "x", "k": 0})
                assert error and "k" in text and "greater than or equal to 1" in text
                error, text = await _ask(mcp, "memory_search", {"k": 3})
                assert error and "query" in text and "Field required" in text

    anyio.run(main)


def test_without_a_daemon_every_tool_says_how_to_start_one() -> None:
    port = free_port()

    async def main() -> None:
        with Client(port=port) as client:
            async with McpClient(build_server(client)) as mcp:
                for tool, arguments in [("memory_search", {"query": "x"}), ("memory_get", {"path": "MEMORY.md"}),
                                        ("memory_recall", {}), ("memory_boot", {}), ("memory_status", {})]:
                    error, text = await _ask(mcp, tool, arguments)
                    assert error and f"port {port}" in text and "qmd-indexer run" in text, (tool, text)
                    assert "Traceback" not in text

    anyio.run(main)


# -- over stdio: the `qmd-indexer mcp` subprocess -----------------------------------------------------------------
def test_stdio_server_answers_without_loading_the_model(daemon: Served, tmp_path: Path) -> None:
    import psutil

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "QMD_INDEXER_LOG_FORMAT": "json"}
    params = StdioServerParameters(command=sys.executable, env=env, cwd=str(ROOT),
                                   args=["-m", "indexer.cli", "mcp", "--port", str(daemon.port)])
    log = tmp_path / "mcp.log"

    async def main() -> list[str]:
        with open(log, "w") as errlog:
            async with McpClient(stdio_client(params, errlog=errlog)) as mcp:
                assert {tool.name for tool in (await mcp.list_tools()).tools} == TOOLS
                error, found = await _ask(mcp, "memory_search", {"query": "when are deploys allowed?", "k": 1})
                assert not error, found
                assert found["hits"][0]["path"] == "MEMORY.md" and found["hits"][0]["score"] > 0
                [child] = [p for p in psutil.Process().children(recursive=True) if "mcp" in p.cmdline()]
                return [m.path for m in child.memory_maps()]

    mapped = anyio.run(main)
    heavy = [path for path in mapped if any(name in path for name in ("torch", "numpy", "qdrant"))]
    assert not heavy, heavy
    assert not log.read_text().strip() or all(line.startswith("{") for line in log.read_text().splitlines())


# -- over streamable HTTP at /mcp --------------------------------------------------------------------------------
def test_http_endpoint_serves_the_same_tools_in_process(daemon: Served) -> None:
    async def main() -> None:
        async with McpClient(f"http://127.0.0.1:{daemon.port}/mcp") as mcp:
            assert {tool.name for tool in (await mcp.list_tools()).tools} == TOOLS
            error, found = await _ask(mcp, "memory_search", {"query": "ACME-4471", "k": 1, "mode": "keyword"})
            assert not error and found["hits"][0]["citation"] == "memory/incidents.md#L1-L3"
            error, page = await _ask(mcp, "memory_get", {"path": "MEMORY.md", "lines": 1})
            assert not error and page["text"] == "# Memory" and page["next_from"] == 2
            error, text = await _ask(mcp, "memory_get", {"path": "/etc/passwd"})
            assert error and "root:" not in text
            error, text = await _ask(mcp, "memory_recall", {"query": "x", "agent": "ghost"})
            assert error and "unknown agent 'ghost'" in text

    anyio.run(main)


def test_mcp_sits_behind_the_apps_middleware_and_host_check(make_indexer, workspace: Path) -> None:
    from starlette.responses import PlainTextResponse

    app = create_app(make_indexer([{"agent": "main", "path": workspace}]).view)
    seen: list[str] = []

    @app.middleware("http")
    async def refuse(request, call_next):  # stands in for any guard added to the app
        seen.append(request.url.path)
        if request.headers.get("x-refuse"):
            return PlainTextResponse("refused by the app's middleware", status_code=403)
        return await call_next(request)

    with TestClient(app, base_url="http://127.0.0.1:8743") as api:
        refused = api.post("/mcp", json=LIST_TOOLS, headers={**JSON_RPC_HEADERS, "x-refuse": "1"})
        assert refused.status_code == 403 and refused.text == "refused by the app's middleware"
        listed = api.post("/mcp", json=LIST_TOOLS, headers=JSON_RPC_HEADERS)
        assert listed.status_code == 200 and {t["name"] for t in listed.json()["result"]["tools"]} == TOOLS
        rebound = api.post("/mcp", json=LIST_TOOLS, headers={**JSON_RPC_HEADERS, "host": "evil.example"})
        assert rebound.status_code >= 400 and "tools" not in rebound.text
    assert seen == ["/mcp", "/mcp", "/mcp"]


def test_event_streams_are_capped_and_a_closed_one_frees_its_place(workspace: Path, make_indexer,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``GET /mcp`` event streams are held open until the client leaves; without a cap 2,000 of them cost 2,000
    descriptors and +170 MB. Beyond ``MAX_EVENT_STREAMS`` a new one is refused (503, Retry-After); closing a stream
    frees its place."""
    import socket

    from indexer import guard

    cap = 3
    monkeypatch.setattr(guard, "MAX_EVENT_STREAMS", cap)
    indexer = make_indexer([{"agent": "main", "path": workspace}], port=free_port())
    opened: list[socket.socket] = []

    def open_stream(port: int) -> bytes:
        conn = socket.create_connection(("127.0.0.1", port), timeout=10)
        opened.append(conn)
        conn.sendall(f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n".encode())
        return conn.recv(300)

    with Served(indexer) as served:
        try:
            heads = [open_stream(served.port) for _ in range(cap)]
            assert all(head.startswith(b"HTTP/1.1 200") for head in heads), heads
            head = open_stream(served.port)
            assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 5" in head.lower(), head
            opened[0].close()  # one stream leaves: its place is free again
            wait_for(lambda: open_stream(served.port).startswith(b"HTTP/1.1 200"), timeout_s=10)
        finally:
            for conn in opened:
                conn.close()



LONE_SURROGATE_CALL = ('{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "memory_search", '
                       '"arguments": {"query": "ACME-4471 \\ud800", "mode": "keyword", "k": 1}}}')


def _found_through_the_surrogate(answer: dict[str, Any]) -> None:
    assert answer["id"] == 7 and not answer["result"]["isError"], answer
    assert answer["result"]["structuredContent"]["hits"][0]["path"] == "memory/incidents.md"


def test_a_lone_surrogate_over_mcp_is_read_not_a_parse_error(daemon: Served) -> None:
    """JSON may carry an unpaired UTF-16 surrogate ("\\ud800"); the MCP SDK's parser refused the whole message
    (-32700, no id; over stdio the agent waited for an answer that never came). Over both transports it is now read
    as "?", as the HTTP API reads the query, and the call is answered."""
    import httpx

    over_http = httpx.post(f"http://127.0.0.1:{daemon.port}/mcp", content=LONE_SURROGATE_CALL,
                           headers=JSON_RPC_HEADERS, timeout=60)
    _found_through_the_surrogate(over_http.json())
    pair = LONE_SURROGATE_CALL.replace("\\ud800", "\\ud83d\\ude00")  # a valid pair (an emoji) is kept
    assert not httpx.post(f"http://127.0.0.1:{daemon.port}/mcp", content=pair, headers=JSON_RPC_HEADERS,
                          timeout=60).json()["result"]["isError"]

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "QMD_INDEXER_LOG_FORMAT": "json"}
    with subprocess.Popen([sys.executable, "-m", "indexer.cli", "mcp", "--port", str(daemon.port)], cwd=ROOT,
                          env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True) as stdio:
        hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}
        assert stdio.stdin and stdio.stdout
        stdio.stdin.write(json.dumps(hello) + "\n")
        stdio.stdin.write('{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        stdio.stdin.write(LONE_SURROGATE_CALL + "\n")
        stdio.stdin.flush()
        answers = [json.loads(stdio.stdout.readline()) for _ in range(2)]
        assert answers[0]["id"] == 1
        _found_through_the_surrogate(answers[1])
        stdio.kill()


def test_tools_refuse_unknown_arguments(daemon: Served) -> None:
    """A misspelt argument is a tool error naming it, as the HTTP API answers 422, never silently dropped (a
    ``max_char`` would read 12,000 characters instead of the few asked)."""

    async def main() -> None:
        async with McpClient(f"http://127.0.0.1:{daemon.port}/mcp") as in_process:
            with Client(port=daemon.port) as client:
                async with McpClient(build_server(client, append=True)) as over_client:
                    for mcp in (in_process, over_client):  # the daemon's /mcp has no memory_append (append off)
                        listed = {tool.name for tool in (await mcp.list_tools()).tools}
                        for tool, arguments in [("memory_search", {"query": "x", "top": 2}),
                                                ("memory_get", {"path": "MEMORY.md", "max_char": 5}),
                                                ("memory_recall", {"query": "*", "page": 2}),
                                                ("memory_boot", {"budget_char": 100}),
                                                ("memory_status", {"verbose": True}),
                                                ("memory_append", {"text": "x", "file": "memory/a.md"})]:
                            if tool not in listed:
                                continue
                            error, text = await _ask(mcp, tool, arguments)
                            unknown = next(iter(arguments.keys() - {"query", "path", "text"}))
                            assert error and unknown in text, (tool, text)
        with Client(port=daemon.port) as client:
            try:
                client._call("POST", "/boot", json={"budget_char": 100})
            except Exception as exc:
                assert getattr(exc, "status_code", 0) == 422 and "budget_char" in str(exc)
            else:
                raise AssertionError("/boot took an unknown field")

    anyio.run(main)


def test_mcp_built_after_the_api_listens_answers_503_until_then(workspace: Path, make_indexer) -> None:
    """The daemon's ``/mcp`` (``create_app(..., mcp_later=True)``): built on a worker thread once the app runs, a
    503 with ``Retry-After`` until then, then the same tools; the API answers meanwhile."""
    indexer = make_indexer([{"agent": "main", "path": workspace}], port=free_port())
    index_once(indexer)
    app = create_app(indexer.view, mcp_later=True)
    host = {"host": f"127.0.0.1:{indexer.settings.port}"}
    with TestClient(app, headers=host) as api:
        assert api.get("/health").status_code == 200
        answers = []

        def built() -> bool:
            answer = api.post("/mcp", json=LIST_TOOLS, headers=JSON_RPC_HEADERS)
            answers.append(answer)
            return answer.status_code != 503

        wait_for(built, timeout_s=60)
        refused = [a for a in answers if a.status_code == 503]
        assert all(a.headers["retry-after"] == "1" for a in refused)
        assert {tool["name"] for tool in answers[-1].json()["result"]["tools"]} == TOOLS
