"""The embedding cache is disposable: damage to it is logged and repaired, never fatal, and never loses an index."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import structlog
from conftest import write

from indexer.cache import EmbeddingCache, cache_key
from indexer.worker import index_once


def _items(n: int, dim: int = 4) -> list[tuple[bytes, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [(cache_key("m", f"text {i}".encode()), rng.random(dim, dtype=np.float32)) for i in range(n)]


def test_a_garbage_cache_file_is_set_aside_and_replaced(tmp_path: Path) -> None:
    path = tmp_path / "embeddings.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    with structlog.testing.capture_logs() as logs:
        cache = EmbeddingCache(path)
    items = _items(3)
    cache.put_many(items)
    assert set(cache.get_many([k for k, _ in items], 4)) == {k for k, _ in items}
    cache.close()
    assert [e["event"] for e in logs] == ["cache_reset"]
    assert list(tmp_path.glob("embeddings.sqlite3.corrupt-*")), "the damaged file is kept for inspection"


@pytest.mark.parametrize("pages", ["cached", "uncached"])
@pytest.mark.parametrize("damage", ["overwrite", "truncate", "delete"])
def test_damage_while_running_never_raises_and_is_repaired_by_the_next_open(tmp_path: Path, damage: str,
                                                                            pages: str) -> None:
    """SQLite finds the damage while running when it reads the file again ("uncached": a one-page cache), else at
    the next open; either way the cache is reset exactly once and keeps working. (Under CI the "cached" case once
    found it while running too: a test that expected the reset at the next open failed.)"""
    path = tmp_path / "embeddings.sqlite3"
    with structlog.testing.capture_logs() as logs:
        cache = EmbeddingCache(path)
        if pages == "uncached":
            cache._db.execute("PRAGMA cache_size=1")
        items = _items(2000, dim=64)
        cache.put_many(items)
        cache._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        if damage == "overwrite":  # a stray write or a bad restore
            path.write_bytes(os.urandom(path.stat().st_size))
        elif damage == "truncate":
            os.truncate(path, 100)
        else:
            path.unlink()
        cache.get_many([k for k, _ in items], 64)  # whatever it finds, it must not raise
        cache.put_many(items[:5])
        assert set(cache.get_many([k for k, _ in items[:5]], 64)) == {k for k, _ in items[:5]}
        cache.close()
        reopened = EmbeddingCache(path)
        reopened.put_many(items[:5])
        assert set(reopened.get_many([k for k, _ in items[:5]], 64)) == {k for k, _ in items[:5]}
        reopened.close()
    resets = [e for e in logs if e["event"] == "cache_reset"]
    # a deleted cache is simply a new, empty one at the next open
    assert len(resets) == (0 if damage == "delete" else 1), logs


def test_a_cache_deleted_while_running_is_noticed_and_reopened(tmp_path: Path) -> None:
    """Deleted from under a running daemon (a clean-up script, ``rm -rf state/*``), the cache must not go on writing
    into the unlinked file (lost at the next start): the next write notices, logs one line and reopens a new file."""
    path = tmp_path / "embeddings.sqlite3"
    items = _items(10)
    with structlog.testing.capture_logs() as logs:
        cache = EmbeddingCache(path)
        cache.put_many(items[:5])
        for suffix in ("", "-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
        cache.put_many(items[5:])
        cache.put_many(items[5:])  # once noticed, not logged again
        cache.close()
    assert [e["event"] for e in logs] == ["cache_reopened"], logs
    assert path.exists(), "a new cache file is made where the old one was"
    reopened = EmbeddingCache(path)
    assert set(reopened.get_many([k for k, _ in items], 4)) == {k for k, _ in items[5:]}  # the writes after it
    reopened.close()


def test_a_daemon_starts_and_indexes_over_a_garbage_cache(tmp_path: Path, workspace: Path, make_indexer) -> None:
    write(tmp_path / "state" / "embeddings.sqlite3", b"\x00garbage" * 1000)
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    status = index_once(indexer)
    assert sum(c["files"] for c in status["collections"].values()) == 4
    assert status["files_failed"] == 0
