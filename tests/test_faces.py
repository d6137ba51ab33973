"""One answer on every face: the HTTP API, the Python client, the MCP tools (over the client, as ``qmd-indexer mcp``
serves them, and in-process at ``/mcp``) and the command line say the same things about a search or a recall:
whether anything relevant was found, which files are not indexed yet, and how many files a listing holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import write
from mcp import Client as McpClient
from server_process import free_port
from test_mcp import Served

from indexer import schema
from indexer.client import Client
from indexer.mcp import build_server
from indexer.schema import RecallRequest, SearchRequest
from indexer.server import create_app
from indexer.worker import index_once

CLI = [sys.executable, "-m", "indexer.cli"]
NOTES = 9  # more files than a recall's default k (6)


@pytest.fixture(name="served")
def served_fixture(workspace: Path, make_indexer) -> Iterator[tuple[Served, Path]]:
    """The conftest workspace plus notes, indexed with relevance floors nothing reaches (no note holds "zebra"), then
    one more note written and queued (as the watcher queues a change) but not indexed: it is pending on every face."""
    for i in range(NOTES - 4):
        write(workspace / "memory" / f"note-{i}.md", f"# Note {i}\n\nPlain note number {i}.\n")
    indexer = make_indexer([{"agent": "main", "path": workspace}], port=free_port(), relevance_floor=0.99,
                           relevance_coverage=1.0)
    index_once(indexer)
    indexer.state.ready.set()
    late = workspace / "memory" / "late.md"
    write(late, "# Late\n\nWritten after the index.\n")
    indexer.settler.add(late)
    with Served(indexer) as served:
        yield served, workspace


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


async def _tool(mcp: McpClient, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await mcp.call_tool(name, arguments)
    assert not result.is_error, result.content
    return result.structured_content


def _mcp_answers(port: int, name: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool's answer from the stdio flavour (tools over the client) and from the daemon's own ``/mcp``."""

    async def main() -> list[dict[str, Any]]:
        with Client(port=port) as client:
            async with McpClient(build_server(client)) as over_client:
                first = await _tool(over_client, name, arguments)
        async with McpClient(f"http://127.0.0.1:{port}/mcp") as in_process:
            return [first, await _tool(in_process, name, arguments)]

    return anyio.run(main)


def test_every_face_says_nothing_relevant_and_what_is_pending(served: tuple[Served, Path]) -> None:
    daemon, _ = served
    port = daemon.port
    with Client(port=port) as client:
        http = client._call("POST", "/search", json={"query": "deploy windows zebra", "k": 2})
        assert http["relevant"] is False and http["pending"] == ["memory/late.md"] and http["hits"]
        assert http["relevance"]["level"] in ("low", "none") and "'zebra' not in the hit" in http["relevance"]["reason"]
        for face in _mcp_answers(port, "memory_search", {"query": "deploy windows zebra", "k": 2}):
            assert face == http
        answer = client.search_response("deploy windows zebra", k=2)
        assert answer == http
        assert client.search("deploy windows zebra", k=2) == http["hits"]  # the hits alone, as before
        recalled = client.recall_response("deploy windows zebra", k=2)
        assert recalled["relevant"] is False and recalled["pending"] == ["memory/late.md"]
        assert recalled["hits"] == http["hits"]
    for face in _mcp_answers(port, "memory_recall", {"query": "deploy windows zebra", "k": 2}):
        assert face == recalled

    as_json = _cli("search", "deploy windows zebra", "-k", "2", "--json", "--port", str(port))
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == http
    human = _cli("search", "deploy windows zebra", "-k", "2", "--port", str(port))
    assert human.returncode == 0 and "MEMORY.md" in human.stdout
    assert "nothing relevant" in human.stderr and "relevance_floor" in human.stderr
    assert http["relevance"]["reason"] in human.stderr  # the graded confidence's reason, beside the flag
    assert "1 file(s) changed and not yet indexed (memory/late.md)" in human.stderr
    recall_human = _cli("recall", "deploy windows zebra", "-k", "2", "--port", str(port))
    assert recall_human.returncode == 0 and "nothing relevant" in recall_human.stderr
    assert "memory/late.md" in recall_human.stderr


def test_a_hits_citation_opens_its_lines_on_every_face(served: tuple[Served, Path]) -> None:
    """``get`` takes a hit's ``citation`` (``path#La-Lb``) as its path and reads those lines; a ``from`` or ``lines``
    given beside it wins."""
    daemon, _ = served
    port = daemon.port
    with Client(port=port) as client:
        hit = client.search("deploy windows", k=1)[0]
        assert hit["end_line"] > hit["start_line"]
        lines = hit["end_line"] - hit["start_line"] + 1
        page = client._call("GET", "/get", params={"path": hit["path"], "from": hit["start_line"], "lines": lines})
        assert (page["from"], page["to"]) == (hit["start_line"], hit["end_line"]) and page["text"]
        assert client._call("GET", "/get", params={"path": hit["citation"]}) == page
        assert client.get(hit["citation"]) == page
        assert client.get(hit["citation"], from_line=1)["from"] == 1  # asked for: the citation's lines give way
        for face in _mcp_answers(port, "memory_get", {"path": hit["citation"]}):
            assert face == page
        cited = f"{hit['path']}#L3-L4"  # lines that do not start the file: the tools' default `from` must not win
        middle = client.get(cited)
        assert (middle["from"], middle["to"]) == (3, 4)
        for face in _mcp_answers(port, "memory_get", {"path": cited}):
            assert face == middle
    cli = _cli("get", hit["citation"], "--json", "--port", str(port))
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout) == page


def test_a_listing_says_how_many_files_there_are_and_pages(served: tuple[Served, Path]) -> None:
    daemon, _ = served
    port = daemon.port
    every = ["MEMORY.md", "memory/food/coffee.md", "memory/incidents.md",
             *[f"memory/note-{i}.md" for i in range(NOTES - 4)], "memory/travel.md"]
    with Client(port=port) as client:
        http = client._call("POST", "/recall", json={"query": "all", "k": 4, "offset": 4})
        assert [h["path"] for h in http["hits"]] == every[4:8] and http["next_offset"] == 8
        assert http["total"] == NOTES
        listed = client.recall_response("*")  # no k: every file, up to LIST_CAP
        assert [h["path"] for h in listed["hits"]] == every and len(every) > 6
        assert listed["total"] == NOTES and listed["next_offset"] is None and listed["relevant"] is None
        first = client.recall_response("*", k=4)
        assert [h["path"] for h in first["hits"]] == every[:4]
        assert first["total"] == NOTES and first["next_offset"] == 4
        rest = client.recall_response("*", k=4, offset=8)
        assert [h["path"] for h in rest["hits"]] == every[8:] and rest["next_offset"] is None
        assert client.recall("*") == listed["hits"]
    for face in _mcp_answers(port, "memory_recall", {"query": "*", "k": 4, "offset": 4}):
        assert face == http
    for face in _mcp_answers(port, "memory_recall", {}):
        assert [h["path"] for h in face["hits"]] == every and face["total"] == NOTES

    as_json = _cli("recall", "--json", "-k", "4", "--offset", "4", "--port", str(port))
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == http
    human = _cli("recall", "-k", "4", "--port", str(port))
    assert human.returncode == 0 and "memory/incidents.md" in human.stdout
    assert f"files 1-4 of {NOTES}; continue with --offset 4" in human.stderr
    assert "nothing relevant" not in human.stderr
    whole = _cli("recall", "--port", str(port))
    assert f"{NOTES} of {NOTES} memory files" in whole.stderr and "memory/travel.md" in whole.stdout


def test_a_listing_states_its_cap() -> None:
    assert getattr(schema, "LIST_CAP", None) == 1000
    k = RecallRequest.model_json_schema()["properties"]["k"]
    assert "1000" in k["description"] or "1,000" in k["description"]


def test_every_agent_description_states_the_scope_rule(make_indexer, workspace: Path) -> None:
    """With several agents and no default_agent an unscoped request is refused: the descriptions say so."""

    def says_the_rule(text: str) -> None:
        assert "default_agent" in text and "several agents" in text and "every agent" not in text, text

    says_the_rule(SearchRequest.model_json_schema()["properties"]["agent"]["description"])
    says_the_rule(RecallRequest.model_json_schema()["properties"]["agent"]["description"])
    spec = create_app(make_indexer([{"agent": "main", "path": workspace}]).view).openapi()
    described = []
    for operations in spec["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter["name"] == "agent":
                    described.append(parameter["description"])
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            if "$ref" in body:
                fields = spec["components"]["schemas"][body["$ref"].rsplit("/", 1)[-1]]["properties"]
                if "agent" in fields:
                    described.append(fields["agent"]["description"])
    assert len(described) == 5  # /search, /recall, /boot, /get, /append
    for text in described:
        says_the_rule(text)

    async def main() -> list[Any]:
        async with McpClient(build_server(Client(port=free_port()), append=True)) as mcp:
            return (await mcp.list_tools()).tools

    for tool in anyio.run(main):
        if "agent" in tool.input_schema["properties"]:
            says_the_rule(tool.input_schema["properties"]["agent"]["description"])
    for command in ("search", "recall", "boot", "get", "append"):
        help_text = " ".join(_cli(command, "--help").stdout.split())
        says_the_rule(help_text[help_text.index("--agent"):])


def test_boot_says_what_is_pending_for_the_agent_asked_about(tmp_path: Path, workspace: Path, make_indexer) -> None:
    """Two agents, ``default_agent`` set: ``/boot`` without an agent, and ``memory_boot`` on both MCP faces, list the
    default agent's pending file, never the other agent's (the unscoped request once listed every agent's, and the
    tool none)."""
    other = tmp_path / "other"
    write(other / "MEMORY.md", "# Other\n\nThe other agent's memory.\n")
    indexer = make_indexer([{"agent": "main", "path": workspace}, {"agent": "other", "path": other}],
                           port=free_port(), default_agent="main")
    index_once(indexer)
    indexer.state.ready.set()
    mine, theirs = workspace / "memory" / "late.md", other / "memory" / "theirs.md"
    for path in (mine, theirs):
        write(path, "# Late\n\nWritten after the index.\n")
        indexer.settler.add(path)
    with Served(indexer) as daemon, Client(port=daemon.port) as client:
        assert client._call("POST", "/boot", json={})["pending"] == ["memory/late.md"]
        assert client._call("POST", "/boot", json={"agent": "other"})["pending"] == ["memory/theirs.md"]
        assert client._call("POST", "/search", json={"query": "x"})["pending"] == ["memory/late.md"]
        for face in _mcp_answers(daemon.port, "memory_boot", {}):
            assert face["pending"] == ["memory/late.md"]
