"""Appends to an agent's memory (``indexer.append``) as agents and scripts meet them: a real daemon (real model, real
Qdrant Edge, the real watcher at the default debounce) served by uvicorn, asked through the Python client, the MCP
tool and the command line; real files in ``tmp_path``. An append is found by search within a second, 50 concurrent
appends land whole, and every refusal writes nothing."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import Running, wait_for, write
from mcp import Client as McpClient
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client
from server_process import free_port
from structlog.testing import capture_logs
from test_mcp import Served

from indexer.append import AppendRefused, EntryTooLarge, append_entry, daily_note
from indexer.client import Client, ClientError
from indexer.config import Settings, Workspace
from indexer.errors import ConfigError
from indexer.mcp import build_server
from indexer.safeio import UnsafePath, open_append
from indexer.schema import AppendRequest
from indexer.worker import index_once
from indexer.workspace import plan_collections

#: how long an append may take to be found: generous, so a loaded machine never fails the test (how soon it is
#: found, about 0.1 s, is the benchmarks' save-to-searchable: benchmarks/search_save.py)
SEARCH_DEADLINE_S = 60.0


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every path under ``root`` -> its bytes (files), ``"dir"`` or ``"-> target"`` (symlinks): what a refused call
    must leave as it was."""
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = f"-> {os.readlink(path)}"
        elif path.is_dir():
            out[rel] = "dir"
        elif "state" not in path.relative_to(root).parts[:1]:
            out[rel] = path.read_bytes()
    return out


@pytest.fixture(name="daemon")
def daemon_fixture(tmp_path: Path, workspace: Path, make_indexer) -> Iterator[tuple[Served, Path]]:
    """A running daemon (worker, watcher, HTTP) at the default debounce: agent ``main`` (the conftest workspace)
    takes appends, ``locked`` has them off, ``linked`` takes them but its ``memory/`` is a symlink."""
    locked, linked = tmp_path / "locked", tmp_path / "linked"
    write(locked / "memory" / "notes.md", "# Notes\n\nNothing to see.\n")
    write(tmp_path / "elsewhere" / "keep.md", "kept\n")
    linked.mkdir()
    (linked / "memory").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    indexer = make_indexer([{"agent": "main", "path": workspace, "append": True},
                            {"agent": "locked", "path": locked},
                            {"agent": "linked", "path": linked, "append": True}],
                           port=free_port(), default_agent="main", settle_s=1.0,  # the defaults' debounce
                           append_max_bytes=4096, append_max_file_bytes=64 * 1024)
    with Running(indexer), Served(indexer) as served:
        yield served, workspace


def _entry(client: Client, text: str, **fields: Any) -> dict[str, Any]:
    return dict(client.append(text, **fields))


def _found(client: Client, token: str, path: str) -> list[dict[str, Any]]:
    hits = client.search(token, mode="keyword", k=5)
    return [hit for hit in hits if hit["path"] == path and token in hit["snippet"]]


def test_an_append_is_searchable_once_the_watcher_sees_it(daemon: tuple[Served, Path]) -> None:
    served, workspace = daemon
    with Client(port=served.port) as client, capture_logs() as logs:
        text = "Decided: the ZEPHYR-881 rollout moves to Wednesday.\nOwner: Dana."
        answer = _entry(client, text)
        written = time.monotonic()
        today = daily_note(Workspace(agent="main", path=workspace))
        assert answer == {"agent": "main", "path": today, "from": 1, "to": 2, "citation": f"{today}#L1-L2",
                          "bytes": len(text) + 1}
        hits = wait_for(lambda: _found(client, "ZEPHYR-881", today), timeout_s=SEARCH_DEADLINE_S, interval_s=0.02)
        print(f"searchable after {time.monotonic() - written:.3f} s")
        assert hits[0]["citation"] == f"{today}#L1-L2"
        page = client.get(today, answer["from"], lines=answer["to"] - answer["from"] + 1)
        assert page["text"] == text

        second = _entry(client, "Also: ZEPHYR-882 waits for the audit.")
        assert (second["from"], second["to"]) == (4, 4)  # after a blank line
        assert (workspace / today).read_text() == text + "\n\nAlso: ZEPHYR-882 waits for the audit.\n"
    appended = [e for e in logs if e["event"] == "memory_appended"]
    assert [(e["path"], e["bytes"], e["lines"]) for e in appended] == [(today, len(text) + 1, 2), (today, 39, 1)]
    assert not [e for e in logs if any("ZEPHYR" in str(v) for v in e.values())]


def test_fifty_concurrent_appends_from_five_clients(daemon: tuple[Served, Path]) -> None:
    served, workspace = daemon
    path = "memory/journal/shared.md"  # created, with its folder, by the first append
    answers: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(5)

    def text(c: int, i: int) -> str:
        return f"Entry c{c}i{i}: token QX{c}Y{i}Z.\n" + f"filler {c}-{i} " * 40 + f"\nend of c{c}i{i}"

    def writer(c: int) -> None:
        try:
            with Client(port=served.port) as client:
                start.wait()
                for i in range(10):
                    answers[f"QX{c}Y{i}Z"] = _entry(client, text(c, i), path=path)
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(c,)) for c in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert len(answers) == 50
    lines = (workspace / path).read_text().split("\n")
    spans = sorted((a["from"], a["to"]) for a in answers.values())
    for (_, end), (begin, _) in zip(spans, spans[1:]):
        assert begin == end + 2  # disjoint, one blank line between neighbours
    assert spans[0][0] == 1 and spans[-1][1] == len(lines) - 1  # the file ends with the last entry's newline
    for token, answer in answers.items():
        c, i = token[2], token[4]
        assert "\n".join(lines[answer["from"] - 1:answer["to"]]) == text(int(c), int(i)), token  # whole, in place
        assert answer["citation"] == f"{path}#L{answer['from']}-L{answer['to']}"
    with Client(port=served.port) as client:
        # until the daemon says the file is indexed (no path pending), however long a loaded machine takes; each
        # search waits up to 10 s for it server-side; the bound only keeps a broken daemon from hanging the run
        for _ in range(30):
            if not client.search_response("QX0Y0Z", wait_s=10)["pending"]:
                break
        assert not client.pending, client.pending
        missing = [token for token in answers if not _found(client, token, path)]
    assert not missing
    print(f"50 appends: {len(spans)} disjoint ranges, {spans[0]}..{spans[-1]}, all searchable")


def test_refusals_write_nothing(daemon: tuple[Served, Path], tmp_path: Path) -> None:
    served, workspace = daemon
    (workspace / "memory" / "link.md").symlink_to(tmp_path / "target.md")
    write(tmp_path / "target.md", "target\n")
    (workspace / "memory" / "linkdir").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    write(workspace / "memory" / "big.md", "# Big\n" + "x" * 65_000 + "\n")
    before = _tree(tmp_path)
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"agent": "locked"}, 403, "append is off for agent 'locked'"),
        ({"agent": "ghost"}, 404, "unknown agent 'ghost'; the agents are linked, locked, main"),
        ({"agent": "mian"}, 404, "unknown agent 'mian' (did you mean 'main'?); the agents are"),
        ({"path": "../outside.md"}, 403, "outside"),
        ({"path": "memory/../../outside.md"}, 403, "outside"),
        ({"path": str(tmp_path / "outside.md")}, 403, "outside the workspace"),
        ({"agent": "linked"}, 403, "symlink"),  # its memory/ is a symlink
        ({"path": "memory/link.md"}, 403, "symlink"),
        ({"path": "memory/linkdir/new.md"}, 403, "symlink"),
        ({"path": "memory/notes.txt"}, 403, "not markdown"),
        ({"path": "MEMORY.md"}, 403, "not under memory/"),
        ({"path": "memory/.openclaw-repair/x.md"}, 403, "hidden"),
        ({"path": "memory/"}, 400, "must name a file"),
        ({"text": "x" * 5000}, 413, "the limit is 4096"),
        ({"path": "memory/big.md", "text": "y" * 1000}, 413, "append_max_file_bytes"),
        ({"text": "  \n\n "}, 400, "text is empty"),
        ({"text": "a\x00b"}, 400, "NUL"),
    ]
    seen = []
    with Client(port=served.port) as client, capture_logs() as logs:
        for fields, status, message in cases:
            arguments = {"text": "SECRET-ENTRY-TEXT must not land", **fields}
            with pytest.raises(ClientError) as refused:
                client.append(**arguments)
            seen.append((fields, refused.value.status_code, str(refused.value)))
            assert refused.value.status_code == status and message in str(refused.value), seen[-1]
        for body in ({"text": 5}, {"text": "x", "extra": 1}, {"text": ""}):  # the strict request model
            with pytest.raises(ClientError) as refused:
                client._call("POST", "/append", json=body)
            assert refused.value.status_code == 422
    for fields, status, message in seen:
        print(f"{status} {fields if 'text' not in fields else {**fields, 'text': '...'}}: {message}")
    assert _tree(tmp_path) == before
    assert not [e for e in logs if any("SECRET-ENTRY-TEXT" in str(v) for v in e.values())]
    assert {e["event"] for e in logs} >= {"append_refused"}


def test_the_mcp_tool_and_the_command_line(daemon: tuple[Served, Path]) -> None:
    served, workspace = daemon

    async def main() -> None:
        async with McpClient(f"http://127.0.0.1:{served.port}/mcp") as mcp:
            tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
            assert tools["memory_append"].annotations.read_only_hint is False
            assert set(tools["memory_append"].input_schema["properties"]) == {"text", "path", "agent"}
            result = await mcp.call_tool("memory_append", {"text": "From MCP: KESTREL-5.", "path": "memory/mcp.md"})
            assert not result.is_error and result.structured_content["citation"] == "memory/mcp.md#L1-L1"
            result = await mcp.call_tool("memory_append", {"text": "no", "path": "../x.md"})
            assert result.is_error and "outside" in result.content[0].text
        with Client(port=served.port) as client:  # the stdio flavour lists it only when told to
            async with McpClient(build_server(client)) as mcp:
                assert "memory_append" not in {tool.name for tool in (await mcp.list_tools()).tools}

    anyio.run(main)
    assert (workspace / "memory" / "mcp.md").read_text() == "From MCP: KESTREL-5.\n"

    cli = [sys.executable, "-m", "indexer.cli", "append", "--port", str(served.port)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(workspace / "none")}
    done = subprocess.run([*cli, "From the CLI: OSPREY-9.", "--path", "memory/cli.md"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert (done.returncode, done.stdout) == (0, "memory/cli.md#L1-L1\n"), done.stderr
    done = subprocess.run([*cli, "--path", "memory/cli.md"], input="Piped:\nHERON-3\n", capture_output=True,
                          text=True, timeout=60, env=env)
    assert (done.returncode, done.stdout) == (0, "memory/cli.md#L3-L4\n"), done.stderr
    done = subprocess.run([*cli, "nope", "--path", "memory/cli.txt"], capture_output=True, text=True, timeout=60,
                          env=env)
    assert done.returncode == 2 and "not markdown" in done.stderr and not (workspace / "memory" / "cli.txt").exists()
    assert (workspace / "memory" / "cli.md").read_text() == "From the CLI: OSPREY-9.\n\nPiped:\nHERON-3\n"


def _stdio_tools(port: int, *flags: str) -> tuple[dict[str, Any], Any]:
    """The tools ``qmd-indexer mcp --port PORT FLAGS`` lists (name -> input schema), no config file read, and the
    answer of one ``memory_append`` through it when it lists that tool."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": "/nonexistent"}
    env.pop("QMD_INDEXER_CONFIG", None)
    params = StdioServerParameters(command=sys.executable, env=env,
                                   args=["-m", "indexer.cli", "mcp", "--port", str(port), *flags])

    async def main() -> tuple[dict[str, Any], Any]:
        async with McpClient(stdio_client(params)) as mcp:
            tools = {tool.name: tool.input_schema for tool in (await mcp.list_tools()).tools}
            if "memory_append" not in tools:
                return tools, None
            result = await mcp.call_tool("memory_append", {"text": f"Via stdio {flags}: LAPWING-2.",
                                                           "path": "memory/stdio.md"})
            return tools, (result.is_error, result.structured_content or result.content[0].text)

    return anyio.run(main)


def test_the_stdio_server_lists_what_the_daemon_offers(daemon: tuple[Served, Path]) -> None:
    """Without a config file, ``qmd-indexer mcp`` asks the daemon which agents take appends (``/health``), and
    ``--agent`` scopes every tool to one agent, which the tools then no longer take as an argument."""
    served, workspace = daemon
    with Client(port=served.port) as client:
        assert client.health()["append"] == {"main": "on", "locked": "off", "linked": "on"}
    tools, appended = _stdio_tools(served.port)
    assert "memory_append" in tools and "agent" in tools["memory_append"]["properties"]
    assert appended == (False, {"agent": "main", "path": "memory/stdio.md", "from": 1, "to": 1,
                                "citation": "memory/stdio.md#L1-L1", "bytes": 25})
    tools, appended = _stdio_tools(served.port, "--agent", "locked")
    assert "memory_append" not in tools and appended is None
    assert not [name for name, schema in tools.items() if "agent" in schema.get("properties", {})]
    tools, appended = _stdio_tools(served.port, "--agent", "main")
    assert "agent" not in tools["memory_append"]["properties"] and "agent" not in tools["memory_search"]["properties"]
    assert appended is not None and appended[0] is False and appended[1]["citation"] == "memory/stdio.md#L3-L3"
    done = subprocess.run([sys.executable, "-m", "indexer.cli", "mcp", "--port", str(served.port), "--agent", "mian"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={**os.environ, "XDG_CONFIG_HOME": "/nonexistent"})
    assert done.returncode == 2 and "unknown agent 'mian'" in done.stderr and "did you mean 'main'" in done.stderr
    assert "locked" in done.stderr and "linked" in done.stderr, done.stderr


@pytest.fixture(name="read_only")
def read_only_fixture(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/ro``, a folder made read-only by a real read-only bind mount of itself (as systemd's
    ``ProtectHome=read-only`` mounts home directories for a unit); skipped where this process may not mount (not
    root, no mount namespace rights)."""
    folder = tmp_path / "ro"
    write(folder / "MEMORY.md", "# Memory\n\nThe GANNET-3 deploy window is Tuesday.\n")
    write(folder / "memory" / "notes.md", "# Notes\n")
    mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {mounted.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True, capture_output=True)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_read_only_workspace_says_why_appends_fail(read_only: Path, make_indexer) -> None:
    """A workspace with ``append = true`` on a read-only file system: ``/health`` says appends are unavailable and
    why, and an append is a 503 (the server's state, not the request's fault) naming ``ReadWritePaths=``."""
    indexer = make_indexer([{"agent": "ro", "path": read_only, "append": True}], port=free_port())
    index_once(indexer)
    indexer.state.ready.set()
    with Served(indexer), Client(port=indexer.settings.port) as client:
        assert client.health()["append"] == {"ro": "unavailable: read-only file system"}
        with pytest.raises(ClientError) as refused:
            client.append("Decided: GANNET-4.", path="memory/notes.md")
        assert refused.value.status_code == 503, refused.value
        assert "read-only file system" in str(refused.value) and "ReadWritePaths=" in str(refused.value)
        assert client.search("GANNET-3", mode="keyword")[0]["path"] == "MEMORY.md"  # reads go on
    assert (read_only / "memory" / "notes.md").read_text() == "# Notes\n"


def test_no_log_line_carries_the_text(daemon: tuple[Served, Path], caplog: pytest.LogCaptureFixture) -> None:
    served, _ = daemon
    caplog.set_level(logging.DEBUG)
    with capture_logs() as logs, Client(port=served.port) as client:
        client.append("PRIVATE-NOTE-7731 about the user's health", path="memory/private.md")
        wait_for(lambda: _found(client, "PRIVATE-NOTE-7731", "memory/private.md"))

        async def main() -> None:
            async with McpClient(f"http://127.0.0.1:{served.port}/mcp") as mcp:
                await mcp.call_tool("memory_append", {"text": "PRIVATE-NOTE-7731 again", "path": "memory/private.md"})

        anyio.run(main)
    assert [e["event"] for e in logs if e["event"] == "memory_appended"] == ["memory_appended"] * 2
    assert not [e for e in logs if any("PRIVATE-NOTE" in str(v) for v in e.values())]
    clients = ("mcp.client", "httpx", "httpcore", "urllib3")  # this test's own clients, not the daemon
    daemon_lines = [r.getMessage() for r in caplog.records if not r.name.startswith(clients)]
    assert daemon_lines and not [line for line in daemon_lines if "PRIVATE-NOTE" in line]


# -- the rules, without a daemon -----------------------------------------------------------------------------------
def _plan(tmp_path: Path, **workspace: Any) -> tuple[Any, Settings, Path]:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    settings = Settings(state_dir=tmp_path / "state", workspace=[{"agent": "a", "path": ws, "append": True,
                                                                  **workspace}])
    return plan_collections(settings.workspace), settings, ws


def test_a_file_without_a_final_newline_and_crlf_lines(tmp_path: Path) -> None:
    collections, settings, ws = _plan(tmp_path)
    write(ws / "memory" / "crlf.md", b"one\r\ntwo\rthree")  # three lines: \r\n, a lone \r, no final break
    answer = append_entry(collections, settings, AppendRequest(text="four\r\nfive", path="memory/crlf.md", agent="a"))
    assert (answer["from"], answer["to"], answer["bytes"]) == (5, 6, 12)
    assert (ws / "memory" / "crlf.md").read_bytes() == b"one\r\ntwo\rthree\n\nfour\nfive\n"


def test_the_daily_note_is_dated_in_the_agents_time_zone(tmp_path: Path) -> None:
    moment = datetime(2026, 12, 3, 11, 30, tzinfo=UTC)
    assert daily_note(Workspace(agent="a", path=tmp_path, timezone="Pacific/Kiritimati"), moment) == \
        "memory/2026-12-04.md"  # UTC+14
    assert daily_note(Workspace(agent="a", path=tmp_path, timezone="Pacific/Pago_Pago"), moment) == \
        "memory/2026-12-03.md"  # UTC-11
    collections, settings, ws = _plan(tmp_path, timezone="Pacific/Kiritimati")
    late = append_entry(collections, settings, AppendRequest(text="late", agent="a"), moment)
    assert late["path"] == "memory/2026-12-04.md"
    assert (ws / "memory" / "2026-12-04.md").read_text() == "late\n"  # memory/ made on the way
    with pytest.raises(ConfigError, match="unknown time zone 'Mars/Olympus'"):
        from indexer.config_load import load_settings

        config = write(tmp_path / "c.toml", f'[[workspace]]\nagent = "a"\npath = "{ws}"\ntimezone = "Mars/Olympus"\n')
        load_settings(config)


def test_off_by_default_and_other_refusals_in_process(tmp_path: Path) -> None:
    collections, settings, ws = _plan(tmp_path, append=False)
    with pytest.raises(AppendRefused, match="append is off"):
        append_entry(collections, settings, AppendRequest(text="x", agent="a"))
    assert not (ws / "memory").exists()
    collections, settings, ws = _plan(tmp_path)
    write(ws / "memory" / "hard.md", "x\n")
    os.link(ws / "memory" / "hard.md", tmp_path / "outside-link.md")
    with pytest.raises(AppendRefused, match="hard link"):
        append_entry(collections, settings, AppendRequest(text="y", path="memory/hard.md", agent="a"))
    os.mkfifo(ws / "memory" / "fifo.md")
    with pytest.raises(AppendRefused, match="not a regular file"):
        append_entry(collections, settings, AppendRequest(text="y", path="memory/fifo.md", agent="a"))
    with pytest.raises(EntryTooLarge):
        append_entry(collections, settings.model_copy(update={"append_max_file_bytes": 10}),
                     AppendRequest(text="y" * 20, path="memory/n.md", agent="a"))
    assert not (ws / "memory" / "n.md").exists()
    assert (ws / "memory" / "hard.md").read_text() == "x\n"


def test_the_open_itself_follows_no_symlink(tmp_path: Path) -> None:
    """The path checks come first, but the open is what holds when a symlink is swapped in after them: each
    component is opened with O_NOFOLLOW from the workspace's descriptor."""
    collections, settings, ws = _plan(tmp_path)
    write(tmp_path / "elsewhere" / "x.md", "x\n")
    (ws / "memory").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(UnsafePath, match="symlink"):
        open_append(ws, "memory/x.md")
    (ws / "memory").unlink()
    (ws / "memory").mkdir()
    (ws / "memory" / "x.md").symlink_to(tmp_path / "elsewhere" / "x.md")
    with pytest.raises(UnsafePath, match="symlink"):
        open_append(ws, "memory/x.md")
    (ws / "memory" / "gone.md").symlink_to(tmp_path / "elsewhere" / "new.md")  # dangling: O_CREAT must not follow
    with pytest.raises(UnsafePath, match="symlink"):
        open_append(ws, "memory/gone.md")
    assert not (tmp_path / "elsewhere" / "new.md").exists() and (tmp_path / "elsewhere" / "x.md").read_text() == "x\n"
    inside = AppendRequest(text="inside", path=str(ws / "memory" / "abs.md"), agent="a")  # absolute, inside
    answer = append_entry(collections, settings, inside)
    assert answer["path"] == "memory/abs.md"
