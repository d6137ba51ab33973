"""``KeyedCache``, the keyed cache plugins share (``indexer.api``): what it keeps comes back by key across a reopen,
damage to its file is set aside and never raised, an unwritable one is a miss, and tables of an earlier layout
leave no page behind. Real SQLite files in ``tmp_path``."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest
import structlog

from indexer.api import KeyedCache, cache_key


def test_a_record_comes_back_by_its_key_after_a_reopen_and_another_key_is_a_miss(tmp_path: Path) -> None:
    path = tmp_path / "state" / "plugin.sqlite3"  # its folder is made
    key, other = cache_key("rules v1", b"content"), cache_key("rules v2", b"content")
    cache = KeyedCache(path, "records")
    assert not path.exists(), "opened on first use: a plugin's factory touches no disk"
    assert cache.get(key) is None
    cache.put(key, b"\x00first")
    cache.put(key, b"\x00second")  # replaced
    assert cache.get(key) == b"\x00second" and cache.get(other) is None
    cache.close()
    reopened = KeyedCache(path, "records")
    assert reopened.get(key) == b"\x00second" and reopened.get(other) is None
    assert KeyedCache(path, "another").get(key) is None  # a table of its own
    reopened.close()


def test_in_memory_it_remembers_for_this_process_only(tmp_path: Path) -> None:
    cache = KeyedCache(None, "records")
    cache.put(b"k" * 32, b"v")
    assert cache.get(b"k" * 32) == b"v" and KeyedCache(None, "records").get(b"k" * 32) is None
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_file_is_a_miss_set_aside_once_and_the_cache_goes_on(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "plugin.sqlite3"
    key = cache_key("rules", b"content")
    if damage == "garbage":
        path.write_bytes(b"this is not a database" * 100)
    else:  # a real cache cut short, as a crash or a bad copy leaves it
        full = KeyedCache(path, "records")
        for i in range(500):
            full.put(cache_key("rules", str(i).encode()), os.urandom(64))
        full.close()
        os.truncate(path, 3000)
    with structlog.testing.capture_logs() as logs:
        cache = KeyedCache(path, "records")
        assert cache.get(key) is None  # never raises
        cache.put(key, b"kept")
        assert cache.get(key) == b"kept"
        cache.close()
    assert [(e["event"], e["log_level"]) for e in logs] == [("cache_reset", "warning")], logs
    assert len(list(tmp_path.glob("plugin.sqlite3.corrupt-*"))) == 1, "the damaged file is kept for inspection"
    assert KeyedCache(path, "records").get(key) == b"kept"


def test_a_file_damaged_while_open_is_set_aside_and_the_write_goes_to_a_new_one(tmp_path: Path) -> None:
    path = tmp_path / "plugin.sqlite3"
    cache = KeyedCache(path, "records")
    cache.put(b"a" * 32, b"first")
    cache.close()
    path.write_bytes(os.urandom(path.stat().st_size))  # a stray write or a bad restore
    with structlog.testing.capture_logs() as logs:
        cache = KeyedCache(path, "records")
        cache.put(b"b" * 32, b"second")
    assert cache.get(b"b" * 32) == b"second" and cache.get(b"a" * 32) is None
    assert [e["event"] for e in logs] == ["cache_reset"]


def test_a_folder_that_cannot_be_made_is_a_miss_logged_once(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("a file where the folder should be")  # unwritable even for root
    with structlog.testing.capture_logs() as logs:
        cache = KeyedCache(tmp_path / "state" / "plugin.sqlite3", "records")
        for _ in range(3):
            cache.put(b"k" * 32, b"v")
            assert cache.get(b"k" * 32) is None
    assert [(e["event"], e["cache"]) for e in logs] == [("keyed_cache_failed", "records")]
    assert "cannot create" in logs[0]["error"]


def held(folder: Path, secret: bytes) -> list[str]:
    """The names of the files in ``folder`` (a SQLite file, its WAL) holding ``secret``."""
    return [p.name for p in folder.iterdir() if p.is_file() and secret in p.read_bytes()]


def test_tables_of_an_earlier_layout_are_dropped_and_leave_no_page(tmp_path: Path) -> None:
    path = tmp_path / "plugin.sqlite3"
    old = sqlite3.connect(path)
    old.execute("PRAGMA journal_mode=WAL")
    old.execute("CREATE TABLE verdict (key BLOB PRIMARY KEY, reason TEXT NOT NULL, detail TEXT NOT NULL)")
    with old:
        old.execute("INSERT INTO verdict VALUES (?, ?, ?)", (b"k" * 32, "no_speech", "heliotrope-2718 said"))
    old.close()
    assert held(tmp_path, b"heliotrope-2718")
    cache = KeyedCache(path, "verdicts", retired=("verdict",))
    cache.put(b"k" * 32, b"v")
    cache.close()
    assert not held(tmp_path, b"heliotrope-2718")
    db = sqlite3.connect(path)
    assert [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["verdicts"]
    db.close()


def test_threads_share_one_cache(tmp_path: Path) -> None:
    cache = KeyedCache(tmp_path / "plugin.sqlite3", "records")

    def work(n: int) -> None:
        for i in range(50):
            key = cache_key("rules", f"{n}-{i}".encode())
            cache.put(key, str(i).encode())
            assert cache.get(key) == str(i).encode()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert cache.get(cache_key("rules", b"3-49")) == b"49"


def test_table_names_are_checked() -> None:
    with pytest.raises(ValueError, match="table names"):
        KeyedCache(None, "records; DROP TABLE x")
    with pytest.raises(ValueError, match="table names"):
        KeyedCache(None, "records", retired=("records",))
