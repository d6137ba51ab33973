"""The command line and the HTTP API as a user meets them: real daemon processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import wait_for, write
from server_process import free_port

from indexer.store import EdgeStore

CLI = [sys.executable, "-m", "indexer.cli"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "QMD_INDEXER_LOG_FORMAT": "json"}


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=ENV)


class Daemon:
    """``qmd-indexer run`` as a subprocess; stderr goes to a file."""

    def __init__(self, workspace: Path, state: Path, log: Path) -> None:
        self.port = free_port()
        self.log = log
        with open(log, "w") as stderr:
            self.proc = subprocess.Popen(
                [*CLI, "run", "--workspace", str(workspace), "--agent", "main", "--state-dir", str(state),
                 "--port", str(self.port)], stdout=subprocess.DEVNULL, stderr=stderr, env=ENV)

    def ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).json()["ready"]
        except httpx.HTTPError:
            assert self.proc.poll() is None, self.log.read_text()
            return False

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


def test_daemon_serves_search_and_status_and_stops_cleanly(workspace: Path, tmp_path: Path) -> None:
    daemon = Daemon(workspace, tmp_path / "state", tmp_path / "run.log")
    try:
        wait_for(daemon.ready, timeout_s=120, interval_s=0.2)
        result = _cli("search", "when are deploys allowed?", "--json", "-k", "2", "--port", str(daemon.port))
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)  # the API's SearchResponse
        assert set(answer) == {"hits", "relevant", "relevance", "pending"} and answer["relevant"] is True
        assert answer["relevance"]["level"] in ("high", "medium") and answer["relevance"]["reason"]
        hits = answer["hits"]
        assert hits[0]["path"] == "MEMORY.md"
        assert {"collection", "path", "start_line", "end_line", "score", "snippet"} <= set(hits[0])
        assert len(hits[0]["snippet"]) <= 700

        human = _cli("search", "ACME-4471", "--port", str(daemon.port))
        assert human.returncode == 0 and "memory/incidents.md:1-3" in human.stdout

        status = json.loads(_cli("status", "--json", "--port", str(daemon.port)).stdout)
        assert status["collections"]["memory-dir-main"]["files"] == 3
        assert status["collections"]["memory-dir-main"]["chunks"] == 3
        assert status["queue_depth"] == 0 and status["chunks_embedded"] == 4 and "cache_hits" in status

        write(workspace / "memory" / "fresh.md", "# Fresh\n\nWAITCCCC3 written just now.\n")
        waited = _cli("search", "WAITCCCC3", "--mode", "keyword", "--wait", "--json", "--port", str(daemon.port))
        assert [h["path"] for h in json.loads(waited.stdout)["hits"]] == ["memory/fresh.md"], waited.stderr
        assert "not yet indexed" not in waited.stderr
        (workspace / "memory" / "fresh.md").unlink()

        bad = _cli("search", "x", "--agent", "nobody", "--port", str(daemon.port))
        assert bad.returncode == 2 and "unknown agent" in bad.stderr
        past = _cli("get", "MEMORY.md", "--from", "999", "--port", str(daemon.port))  # past the end: said, exit 2
        assert past.returncode == 2 and past.stdout == "" and "MEMORY.md has no line 999" in past.stderr
        boot = _cli("boot", "--budget-chars", "200", "--port", str(daemon.port))  # what did not fit: one line
        assert boot.returncode == 0 and boot.stdout.strip()
        omitted = [line for line in boot.stderr.splitlines() if "omitted" in line]
        assert len(omitted) == 1 and "over --budget-chars 200" in omitted[0], boot.stderr

        # the MCP endpoint is served too (it needs the app's lifespan)
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "memory_search", "arguments": {"query": "ACME-4471", "k": 1}}}
        answer = httpx.post(f"http://127.0.0.1:{daemon.port}/mcp", json=call, timeout=30, headers={
            "accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-06-18"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["result"]["structuredContent"]["hits"][0]["path"] == "memory/incidents.md"
    finally:
        code = daemon.terminate()
    assert code == 0
    assert daemon.events()[-1]["event"] == "daemon_stopped"

    # a restart with nothing changed embeds nothing
    again = Daemon(workspace, tmp_path / "state", tmp_path / "run2.log")
    try:
        wait_for(again.ready, timeout_s=120, interval_s=0.2)
        status = json.loads(_cli("status", "--json", "--port", str(again.port)).stdout)
        assert status["chunks_embedded"] == 0  # fresh.md, deleted while it ran, is gone and nothing new
        assert status["collections"]["memory-dir-main"]["chunks"] == 3
    finally:
        assert again.terminate() == 0


def test_second_daemon_on_a_held_store_exits_1(workspace: Path, tmp_path: Path) -> None:
    first = Daemon(workspace, tmp_path / "state", tmp_path / "first.log")
    try:
        wait_for(first.ready, timeout_s=120, interval_s=0.2)
        second = _cli("run", "--workspace", str(workspace), "--state-dir", str(tmp_path / "state"), "--port",
                      str(free_port()))
        assert second.returncode == 1
        assert "in use by another process" in second.stderr.strip().splitlines()[-1]
        empty = _cli("search", "  ", "--port", str(first.port))
        assert empty.returncode == 2 and "QUERY is empty" in empty.stderr
        nan = _cli("search", "x", "--min-score", "nan", "--port", str(first.port))
        assert nan.returncode == 2 and "finite" in nan.stderr
    finally:
        assert first.terminate() == 0


def test_sigkill_during_first_index_converges_to_one_copy_of_each_chunk(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    for i in range(40):
        body = "\n".join(f"Note {i} line {j}: details about service {i * 7 + j} and its on-call rota."
                         for j in range(60))
        write(ws / "memory" / f"note-{i:02d}.md", f"# Note {i}\n\n{body}\n")
    state = tmp_path / "state"
    log = tmp_path / "index.log"
    with open(log, "w") as stderr:
        proc = subprocess.Popen([*CLI, "index", "--once", "--workspace", str(ws), "--state-dir", str(state)],
                                stdout=subprocess.DEVNULL, stderr=stderr, env=ENV)
    wait_for(lambda: log.read_text().count('"file_indexed"') >= 3 or proc.poll() is not None, timeout_s=180)
    assert proc.poll() is None, "the index finished before it could be killed; make the workspace bigger"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)

    result = _cli("index", "--once", "--json", "--workspace", str(ws), "--state-dir", str(state), timeout=600)
    assert result.returncode == 0, result.stderr
    store = EdgeStore(state / "qdrant")
    try:
        payloads = list(store.scroll("memory-dir-main", ["abs_path", "chunk_index", "chunk_count", "file_hash"]))
        states = store.file_states("memory-dir-main")
    finally:
        store.close()
    assert len(states) == 40 and all(s.complete for s in states.values())
    keys = [(p.abs_path, p.chunk_index) for p in payloads]
    assert len(keys) == len(set(keys)), "no duplicate chunks"
    assert len(payloads) == sum(s.points for s in states.values())
    assert all(p.chunk_index < p.chunk_count for p in payloads)


def test_collection_built_for_another_model_stops_with_a_reindex_hint(workspace: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    store = EdgeStore(state / "qdrant")
    store.ensure_collection("memory-root-main", {"text": 768})
    store.close()
    result = _cli("index", "--once", "--workspace", str(workspace), "--state-dir", str(state))
    assert result.returncode == 1
    assert "--reindex" in result.stderr.strip().splitlines()[-1]
    rebuilt = _cli("index", "--once", "--reindex", "--workspace", str(workspace), "--state-dir", str(state))
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "ready: True" in rebuilt.stdout and "listening on" not in rebuilt.stdout  # index --once serves nothing


@pytest.mark.parametrize(("name", "damage"), [("qmd-collection.json", "[]"), ("edge_config.json", "{")])
def test_a_damaged_embedded_collection_stops_with_a_reindex_hint_and_reindex_repairs_it(
        workspace: Path, tmp_path: Path, name: str, damage: str) -> None:
    """A collection record of the embedded store that cannot be read (ours, or Qdrant Edge's own) was a traceback at
    every start (``AttributeError``, ``JSONDecodeError``, Edge's ``Failed to deserialize``)."""
    state = tmp_path / "state"
    assert _cli("index", "--once", "--workspace", str(workspace), "--state-dir", str(state)).returncode == 0
    write(state / "qdrant" / "memory-root-main" / name, damage)
    result = _cli("index", "--once", "--workspace", str(workspace), "--state-dir", str(state))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "memory-root-main" in last and "--reindex" in last, last
    rebuilt = _cli("index", "--once", "--reindex", "--workspace", str(workspace), "--state-dir", str(state))
    assert rebuilt.returncode == 0, rebuilt.stderr
    again = _cli("index", "--once", "--json", "--workspace", str(workspace), "--state-dir", str(state))
    assert again.returncode == 0 and json.loads(again.stdout)["collections"]["memory-root-main"]["files"] == 1


def test_search_without_a_daemon_exits_1_with_a_hint() -> None:
    result = _cli("search", "anything", "--port", str(free_port()))
    assert result.returncode == 1
    assert "no qmd-indexer daemon answers" in result.stderr and "qmd-indexer run" in result.stderr


def test_the_client_replaces_a_closed_connection_and_reports_a_silent_port() -> None:
    """A kept-alive connection the server has closed (uvicorn drops idle ones after 5 s; a restarted daemon drops
    all) is replaced before the next request; a port that accepts and never answers is ``DaemonUnavailable`` once
    ``timeout_s`` has passed. The HTTP server is a stand-in from the standard library: what is tested is the
    client's transport."""
    import http.server
    import threading

    from indexer.client import Client, DaemonUnavailable

    class ClosesAfterEachAnswer(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # no "Connection: close": the client keeps the connection for reuse

        def do_GET(self) -> None:
            body = b'{"status": "ok", "ready": true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ClosesAfterEachAnswer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    silent = socket.socket()
    try:
        with Client(port=server.server_address[1]) as client:
            for _ in range(3):
                assert client.health() == {"status": "ok", "ready": True}
                time.sleep(0.05)
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        started = time.monotonic()
        with pytest.raises(DaemonUnavailable, match="ReadTimeoutError"):
            Client(port=silent.getsockname()[1], timeout_s=0.3).search("anything")
        assert time.monotonic() - started >= 0.3
    finally:
        server.shutdown()
        server.server_close()
        silent.close()


def test_a_bad_since_is_a_usage_error_before_the_daemon_is_asked() -> None:
    result = _cli("search", "anything", "--since", "last week", "--port", str(free_port()))
    assert result.returncode == 2 and "7d" in result.stderr and "daemon" not in result.stderr


def test_index_needs_once_and_workspace(tmp_path: Path) -> None:
    assert _cli("index", "--workspace", str(tmp_path)).returncode == 2
    result = subprocess.run([*CLI, "index", "--once"], capture_output=True, text=True, timeout=60,
                            env={**ENV, "XDG_CONFIG_HOME": str(tmp_path)})
    assert result.returncode == 2 and "no workspace configured" in result.stderr


@pytest.mark.parametrize("command", ["run", "index", "search", "status", "plugins", "get", "recall", "boot", "doctor",
                                     "mcp"])
def test_every_command_has_teaching_help(command: str) -> None:
    result = _cli(command, "--help")
    assert result.returncode == 0
    assert len(result.stdout.splitlines()) > 8
    if command not in ("status", "plugins"):
        assert "Example" in result.stdout


def test_the_client_side_never_imports_torch() -> None:
    code = ("import sys, indexer.cli, indexer.client, indexer.config, indexer.plugins, indexer.mcp;"
            "from click.testing import CliRunner; CliRunner().invoke(indexer.cli.main, ['plugins']);"
            "print(sorted(m for m in ('torch', 'sentence_transformers', 'qdrant_edge') if m in sys.modules))")
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=ENV)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    assert time.monotonic() - started < 30  # a sanity bound, not a benchmark


def test_python_dash_m_indexer_reports_the_one_version() -> None:
    from importlib.metadata import version

    import indexer

    done = subprocess.run([sys.executable, "-m", "indexer", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"qmd-indexer, version {version('qmd-indexer')}" == \
        f"qmd-indexer, version {indexer.__version__}"


def test_the_version_moves_with_the_changelog() -> None:
    """``pyproject.toml``'s version (what ``--version`` reports once installed) is the changelog's latest release, and
    the changelog keeps an Unreleased section above it (Keep a Changelog)."""
    import re
    import tomllib

    root = Path(__file__).resolve().parents[1]
    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    headings = re.findall(r"^## \[([^\]]+)\]", (root / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert headings[0] == "Unreleased" and headings[1] == declared, (headings[:2], declared)
    assert [tuple(map(int, v.split("."))) for v in headings[1:]] == sorted(
        (tuple(map(int, v.split("."))) for v in headings[1:]), reverse=True)


def test_status_names_the_failed_files_with_their_reasons(workspace: Path, make_indexer,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from indexer.terminal import print_status
    from indexer.worker import index_once

    for i in range(23):  # more than status lists: the rest are counted
        write(workspace / "memory" / f"bad{i:02}.md", b"# binary\x00 not text")
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    status = index_once(indexer)
    assert status["files_failed"] == 23
    failed = status["failed_files"]
    assert len(failed) == 20 and failed[0]["path"] == str(workspace / "memory" / "bad00.md")
    assert failed[0]["reason"] == "extract_failed" and "NUL" in failed[0]["detail"]
    capsys.readouterr()  # the log lines so far
    print_status(status)
    out = capsys.readouterr().out
    assert f"failed: {workspace / 'memory' / 'bad00.md'}: extract_failed (" in out
    assert "bad19.md" in out and "bad20.md" not in out
    assert "... and 3 more failed file(s)" in out


def test_index_once_with_an_embedding_server_that_never_answers_gives_up_in_one_line(workspace: Path,
                                                                                   tmp_path: Path) -> None:
    """A remote embedder's vector size comes from its first answer: ``index --once`` waits ``--wait-s`` for the
    server, then says so in one line and exits 1 (it was a raw traceback)."""
    config = tmp_path / "config.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\nprefer = {{ text = "openai" }}\n'
                      f'[[workspace]]\nagent = "main"\npath = "{workspace}"\n'
                      f'[plugin.openai]\nbase_url = "http://127.0.0.1:{free_port()}/v1"\nmodel = "minilm"\n')
    started = time.monotonic()
    done = _cli("index", "--once", "--config", str(config), "--wait-s", "3")
    assert done.returncode == 1, done.stderr
    assert 3 <= time.monotonic() - started < 60  # waited, then gave up
    said = [line for line in done.stderr.splitlines() if line.startswith("qmd-indexer:")]
    assert len(said) == 1 and "did not answer within 3 s" in said[0] and "Connection refused" in said[0]
    assert "Traceback" not in done.stderr


def test_a_second_state_dir_reuses_the_model_export_of_the_first(tmp_path: Path) -> None:
    """The text model's ONNX exports live in ``model_cache_dir`` (by default the user's cache, shared by every state
    dir): a new state dir, a second agent's daemon, finds them instead of exporting the model again (20-50 s)."""
    write(tmp_path / "ws" / "MEMORY.md", "# Memory\n\n- Deploys on Tuesdays.\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "QMD_INDEXER_PRECISION": "fp32", "QMD_INDEXER_LOG_FORMAT": "json"}

    def index(state: str) -> tuple[list[str], dict[str, Any]]:
        done = subprocess.run([sys.executable, "-m", "indexer.cli", "index", "--once", "--json", "--workspace",
                               str(tmp_path / "ws"), "--state-dir", str(tmp_path / state)],
                              capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr
        events = [json.loads(line).get("event", "") for line in done.stderr.splitlines() if line.startswith("{")]
        return events, json.loads(done.stdout)

    first, _ = index("state-a")
    second, _ = index("state-b")
    assert "query_model_exported" in first and "query_model_exported" not in second
    assert list((tmp_path / "cache" / "qmd-indexer" / "models").glob("*-onnx-fp32/query-v*.onnx"))
    assert not (tmp_path / "state-a" / "models").exists() and not (tmp_path / "state-b" / "models").exists()


def test_a_long_snippet_says_how_many_lines_it_leaves_out_and_how_to_read_them(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI prints 8 lines of a hit's snippet; it cut the rest silently, so a ninth line holding the answer
    looked absent."""
    from indexer.terminal import print_hits

    snippet = "\n".join(f"line {n}" for n in range(1, 11))
    print_hits([{"path": "MEMORY.md", "start_line": 1, "end_line": 10, "score": 0.5, "collection": "memory-root-main",
                 "kind": "markdown", "snippet": snippet, "citation": "MEMORY.md#L1-L10"}])
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == ["     line 8", "     … (2 more lines: qmd-indexer get 'MEMORY.md#L1-L10')"]
    print_hits([{"path": "MEMORY.md", "start_line": 1, "end_line": 8, "score": 0.5, "collection": "memory-root-main",
                 "kind": "markdown", "snippet": "\n".join(snippet.splitlines()[:8]), "citation": "MEMORY.md#L1-L8"}])
    assert "more lines" not in capsys.readouterr().out
