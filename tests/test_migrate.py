"""``qmd-indexer migrate``: the embedded store copied into a real Qdrant server, then the daemon restarted on it."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_same_points
from qdrant.fixtures import Node, drop_all_collections
from structlog.testing import capture_logs

from indexer.migrate import migrate
from indexer.points import Payload, Point, point_id
from indexer.search import SearchParams
from indexer.store import EdgeStore, ServerStore
from indexer.worker import index_once


@pytest.fixture(name="server")
def server_fixture(qdrant_server: Node):
    yield qdrant_server
    drop_all_collections(qdrant_server.url)


def _file(collection: str, path: str, n: int, file_hash: str) -> list[Point]:
    rng = np.random.default_rng(zlib.crc32(f"{path}:{file_hash}".encode()))
    return [Point(point_id(collection, path, i), {"text": rng.standard_normal(8).astype(np.float32)},
                  {"bm25": ([i, 100 + i], [1.0, 0.25])},
                  Payload(abs_path=path, path=path.lstrip("/"), file_hash=file_hash, chunk_index=i, chunk_count=n,
                          text=f"{path} chunk {i}", extra={"width": i}))
            for i in range(n)]


def test_indexed_workspace_moves_to_a_server_and_the_daemon_embeds_nothing(workspace: Path, make_indexer,
                                                                          server: Node) -> None:
    edge_indexer = make_indexer([{"agent": "main", "path": workspace}])
    index_once(edge_indexer)
    names = [c.name for c in edge_indexer.collections]
    edge_indexer.store.close()  # the daemon stops
    source = EdgeStore(edge_indexer.settings.state_dir / "qdrant")
    target = ServerStore(server.url)
    results = migrate(source, target)
    assert {r.collection: (r.points, r.copied) for r in results} == {"memory-root-main": (1, 1),
                                                                    "memory-dir-main": (3, 3)}
    assert assert_same_points(target, source, names) == 4
    again = migrate(source, target)  # idempotent: nothing sent twice
    assert [(r.copied, r.skipped, r.files_removed) for r in again] == [(0, 3, 0), (0, 1, 0)]
    source.close()

    # the daemon restarted on the server: same state dir (embedding cache), same workspace
    on_server = make_indexer([{"agent": "main", "path": workspace}], store=target)
    with capture_logs() as logs:
        status = index_once(on_server)
    assert status["chunks_embedded"] == 0 and status["cache_hits"] == 0
    assert not [e for e in logs if e["event"] == "file_indexed"], "every file was already there, unchanged"
    [hit] = on_server.view.searcher().search(SearchParams("when can we deploy?", k=1))
    assert hit["path"] == "MEMORY.md"
    target.close()


def test_an_interrupted_migration_resumes_and_the_target_ends_equal(tmp_path: Path, server: Node) -> None:
    source = EdgeStore(tmp_path / "qdrant")
    source.ensure_collection("memory-dir-main", {"text": 8})
    for i in range(30):
        path = f"/w/memory/n{i}.md"
        source.replace_file("memory-dir-main", path, "h1", _file("memory-dir-main", path, 3, "h1"))
    target = ServerStore(server.url)

    class Stop(Exception):
        pass

    def stop_after_two_pages(collection: str, done: int) -> None:
        if done >= 20:
            raise Stop

    with pytest.raises(Stop):  # as a Ctrl-C or a lost connection half way
        migrate(source, target, page=10, progress=stop_after_two_pages)
    assert target.count("memory-dir-main") == 20  # two pages were written
    # meanwhile the source changed: a file was edited (fewer chunks), one deleted
    source.replace_file("memory-dir-main", "/w/memory/n0.md", "h2",
                        _file("memory-dir-main", "/w/memory/n0.md", 1, "h2"))
    source.delete_file("memory-dir-main", "/w/memory/n1.md")
    [done] = migrate(source, target, page=10)
    assert done.points == 85 and done.skipped <= 20 and done.copied == done.points - done.skipped >= 65
    assert assert_same_points(target, source, ["memory-dir-main"]) == 85
    # changes after a complete run: the older version of n2 and the deleted n3 are removed from the target
    source.replace_file("memory-dir-main", "/w/memory/n2.md", "h3",
                        _file("memory-dir-main", "/w/memory/n2.md", 1, "h3"))
    source.delete_file("memory-dir-main", "/w/memory/n3.md")
    [rerun] = migrate(source, target, page=10)
    assert (rerun.copied, rerun.files_removed) == (1, 2)
    assert assert_same_points(target, source, ["memory-dir-main"]) == 80
    source.close()
    target.close()


def _on_a_terminal(command: list[str], env: dict[str, str]) -> list[str]:
    """The lines ``command`` writes to a pseudo-terminal that is both its stdout and its stderr, in order."""
    import pty

    main, child = pty.openpty()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=child, stderr=child, env=env)
    os.close(child)
    out = bytearray()
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    assert process.wait(120) == 0, out.decode()
    return out.decode().replace("\r\n", "\n").strip().splitlines()


def test_migrate_command_refuses_while_a_daemon_holds_the_store_then_copies(tmp_path: Path, server: Node) -> None:
    state = tmp_path / "state"
    daemon = EdgeStore(state / "qdrant")  # a running daemon holds the embedded store
    daemon.ensure_collection("memory-root-main", {"text": 8})
    daemon.replace_file("memory-root-main", "/w/MEMORY.md", "h", _file("memory-root-main", "/w/MEMORY.md", 2, "h"))
    command = [sys.executable, "-m", "indexer.cli", "migrate", "--to", server.url, "--state-dir", str(state),
               "--tenancy", "collections"]
    env = {**os.environ, "QMD_INDEXER_LOG_FORMAT": "json", "QMD_INDEXER_CONFIG": str(tmp_path / "none.toml")}
    (tmp_path / "none.toml").write_text("")
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 1
    assert "in use by another process" in refused.stderr and "Stop the daemon" in refused.stderr
    probe = ServerStore(server.url)
    assert not probe.collections()  # nothing was created
    daemon.close()
    copied = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert copied.returncode == 0, copied.stderr
    assert "memory-root-main" in copied.stdout and "2 copied" in copied.stdout
    assert f"qmd-indexer run --qdrant-url {server.url}" in copied.stdout
    assert not [line for line in copied.stdout.splitlines() if line.startswith("{")], copied.stdout  # logs: stderr
    # again with qdrant_tenancy auto, which logs how it settled: on one terminal, the summary still comes last
    lines = _on_a_terminal(command[:-2], env)
    assert [line for line in lines if '"qdrant_tenancy_settled"' in line], lines
    assert "Nothing is embedded again" in "\n".join(lines[-3:]) and not lines[-1].startswith("{"), lines
    assert probe.count("memory-root-main") == 2
    probe.close()
