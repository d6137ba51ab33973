"""A persistent embedding cache: (model id, content hash) -> vector, in SQLite under the state directory.

Unchanged text is never embedded twice, across restarts and renames: the key is the sha256 of the model id and the
chunk's text (or raw bytes for images), not of its path. Vectors are stored as float32 bytes.

The cache is disposable: everything in it can be recomputed. A file that is not a readable SQLite database (garbage,
truncated, damaged while running) is set aside as ``<name>.corrupt-<unix time>`` with one ``cache_reset`` log line
and a new one is started; a file deleted or replaced while running is noticed at the next read or write (its
device and inode changed) and reopened with one ``cache_reopened`` line, so writes never go to an unlinked file; a
cache that cannot be written (disk full, read-only) logs ``cache_write_failed`` once per outage and indexing goes
on uncached. None of these ever stops the daemon.

``KeyedCache`` is the same idea for plugins (re-exported by ``indexer.api``): a record of bytes a plugin worked out
from a file's content (the text read in a picture, a recording's skip verdict), kept under ``cache_key`` in a SQLite
file of the plugin's own, damage handled the same way.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
import structlog

log = structlog.get_logger("qmd_indexer.cache")


def cache_key(model_id: str, content: bytes) -> bytes:
    """sha256 of ``model_id``, a NUL, and ``content``: 32 bytes."""
    return hashlib.sha256(model_id.encode("utf-8") + b"\x00" + content).digest()


def set_aside(path: Path, exc: Exception, detail: str) -> Path:
    """Move the damaged SQLite file ``path`` (and its WAL and SHM files) to ``<name>.corrupt-<unix time>``, with one
    ``cache_reset`` log line naming ``exc`` and saying ``detail``; returns the new path. Files already gone are
    skipped; another ``OSError`` (a read-only folder) is raised."""
    aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    for suffix in ("", "-wal", "-shm"):
        source = path.with_name(path.name + suffix)
        try:
            source.replace(aside.with_name(aside.name + suffix))
        except FileNotFoundError:
            pass
    log.warning("cache_reset", path=str(path), set_aside=str(aside), error=f"{type(exc).__name__}: {exc}",
                detail=detail)
    return aside


class EmbeddingCache:
    """``get_many``/``put_many`` over a SQLite file (WAL mode); ``path=None`` keeps it in memory. Thread-safe."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._write_failing = False
        self._file: tuple[int, int] | None = None  # (device, inode) of the file the connection has open
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = self._connect()
        except sqlite3.DatabaseError as exc:
            self._db = self._reset(exc)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(str(self.path) if self.path else ":memory:", check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS embedding (key BLOB PRIMARY KEY, vector BLOB NOT NULL)")
            db.execute("SELECT key FROM embedding LIMIT 1").fetchall()
        except sqlite3.DatabaseError:
            db.close()
            raise
        self._file = self._identity()
        return db

    def _identity(self) -> tuple[int, int] | None:
        """(device, inode) of the file at ``path`` now; ``None`` in memory or when there is none."""
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _follow(self) -> None:
        """Reopen when the file at ``path`` is no longer the one the connection has open (deleted, or replaced by a
        restore), so reads and writes go to the file a restart would find. Called with the lock held."""
        if self.path is None:
            return
        now = self._identity()
        if now == self._file:
            return
        old, known = self._db, self._file
        try:
            self._db = self._connect()
        except sqlite3.DatabaseError as exc:
            try:
                self._db = self._reset(exc)
            except sqlite3.Error:  # cannot make a new file now (read-only state dir): keep the old, try again later
                self._db, self._file = old, known
                return
        log.warning("cache_reopened", path=str(self.path), reason="deleted" if now is None else "replaced",
                    detail="the embedding cache file changed under the daemon; vectors are recomputed as needed")
        try:
            old.close()
        except sqlite3.Error:
            pass

    def _reset(self, exc: Exception) -> sqlite3.Connection:
        """Set the damaged file (and its WAL/SHM) aside and start an empty cache."""
        if self.path is None:
            raise exc
        set_aside(self.path, exc, "the embedding cache is disposable; vectors are recomputed as needed")
        return self._connect()

    def _recover(self, exc: sqlite3.DatabaseError) -> None:
        """After an error on a live connection: a damaged file is reset; anything else is left to the caller."""
        if isinstance(exc, sqlite3.OperationalError):
            return  # full disk, read-only file, lock timeout: the file itself is fine
        try:
            self._db.close()
        except sqlite3.Error:
            pass
        self._db = self._reset(exc)

    def get_many(self, keys: Sequence[bytes], dim: int) -> dict[bytes, np.ndarray]:
        """The cached ``(dim,)`` float32 vectors among ``keys``; entries of another size, or not finite, or all zero
        (stored by an older version from a bad answer) are ignored, so they are embedded again and overwritten
        (one ``cache_entries_bad`` line per read that met any). A cache that cannot be read answers with what it
        found so far (the rest is embedded again)."""
        found: dict[bytes, np.ndarray] = {}
        bad = 0
        with self._lock:
            self._follow()
            try:
                for start in range(0, len(keys), 500):
                    batch = list(keys[start : start + 500])
                    marks = ",".join("?" * len(batch))
                    for key, blob in self._db.execute(f"SELECT key, vector FROM embedding WHERE key IN ({marks})",
                                                      batch):
                        vector = np.frombuffer(blob, dtype=np.float32)
                        if vector.shape == (dim,) and np.isfinite(vector).all() and vector.any():
                            found[bytes(key)] = vector
                        else:
                            bad += vector.shape == (dim,)
            except sqlite3.DatabaseError as exc:
                log.warning("cache_read_failed", path=str(self.path), error=f"{type(exc).__name__}: {exc}")
                self._recover(exc)
        if bad:
            log.warning("cache_entries_bad", path=str(self.path), entries=bad,
                        detail="NaN, inf or all-zero vectors in the cache are embedded again and replaced")
        return found

    def put_many(self, items: Sequence[tuple[bytes, np.ndarray]]) -> None:
        """Store ``(key, (dim,) vector)`` pairs; never raises for a cache that cannot be written (logged once)."""
        rows = [(key, np.asarray(vec, dtype=np.float32).tobytes()) for key, vec in items]
        with self._lock:
            self._follow()
            for attempt in (1, 2):
                try:
                    with self._db:
                        self._db.executemany("INSERT OR REPLACE INTO embedding (key, vector) VALUES (?, ?)", rows)
                except sqlite3.DatabaseError as exc:
                    if attempt == 1 and not isinstance(exc, sqlite3.OperationalError):
                        self._recover(exc)  # damaged: reset, then write into the new cache
                        continue
                    if not self._write_failing:
                        self._write_failing = True
                        log.error("cache_write_failed", path=str(self.path), error=f"{type(exc).__name__}: {exc}",
                                  detail="indexing goes on without caching until the cache can be written")
                    return
                if self._write_failing:
                    self._write_failing = False
                    log.info("cache_write_recovered", path=str(self.path))
                return

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM embedding").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


T = TypeVar("T")
#: what a ``KeyedCache``'s ``name`` and ``retired`` tables may be: SQLite table names, written into its statements
_TABLE = re.compile(r"[a-z][a-z0-9_]{0,62}")


class KeyedCache:
    """Records (``bytes``) under keys (``bytes``, usually ``cache_key(rules, digest of the content)``: 32 bytes) in
    the SQLite file ``path``, its folder made (``None``: in memory, for this process only). Opened on first use, so a
    plugin's factory touches no disk. Thread-safe. For a plugin to remember what it worked out from a file's content,
    so the same bytes are never worked on twice: not at a rescan, nor after a restart, nor under another name.

    - ``name``: the table the records are kept in, and the cache's name in log lines (``[a-z][a-z0-9_]*``).
    - ``retired``: tables an earlier layout of the same file kept; dropped when it opens, then the file is vacuumed
      and its write-ahead log emptied, so no page of what they held stays on disk. Replaced records are zeroed too
      (``secure_delete``).

    Disposable, never raising (but ``ValueError`` for a bad ``name`` or ``retired``): a file that is not a SQLite
    database, or is damaged, is set aside (``set_aside``: one ``cache_reset`` line) and an empty one started; any
    other error (an unwritable folder, a full disk) is logged once (``keyed_cache_failed``) and that ``get`` is a
    miss, that ``put`` remembers nothing. No size bound: a record should be small (a verdict, a page of text)."""

    def __init__(self, path: Path | None, name: str, retired: Sequence[str] = ()) -> None:
        bad = [t for t in (name, *retired) if not _TABLE.fullmatch(t)]
        if bad or name in retired:
            raise ValueError(f"KeyedCache table names must match {_TABLE.pattern} and differ: {name!r}, {retired!r}")
        self.path = path
        self.name = name
        self.retired = tuple(retired)
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._reported = False

    def get(self, key: bytes) -> bytes | None:
        """The record kept under ``key``, or ``None`` (also when the file cannot be read)."""
        row = self._run(lambda db: db.execute(f"SELECT record FROM {self.name} WHERE key = ?", (key,)).fetchone())
        return bytes(row[0]) if row else None

    def put(self, key: bytes, record: bytes) -> None:
        """Keep ``record`` under ``key``, replacing what was there; nothing is kept when the file cannot be written."""

        def write(db: sqlite3.Connection) -> None:
            with db:
                db.execute(f"INSERT OR REPLACE INTO {self.name} (key, record) VALUES (?, ?)", (key, bytes(record)))

        self._run(write)

    def close(self) -> None:
        """Close the file; the next ``get`` or ``put`` opens it again."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _run(self, work: Callable[[sqlite3.Connection], T]) -> T | None:
        """``work`` on the open connection, under the lock. A damaged file is set aside and ``work`` tried once more
        on a new one; any other error is logged once and answers ``None``."""
        with self._lock:
            for attempt in (1, 2):
                try:
                    return work(self._open())
                except sqlite3.Error as exc:
                    if attempt == 1 and self._damaged(exc):
                        continue
                    self._failed(exc)
                    return None
            return None

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            if self.path is not None:
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise sqlite3.OperationalError(f"cannot create {self.path.parent}: {exc}") from exc
            db = sqlite3.connect(str(self.path) if self.path else ":memory:", check_same_thread=False)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA secure_delete=ON")  # what a replaced or dropped row held is zeroed in its page
                self._retire(db)
                db.execute(f"CREATE TABLE IF NOT EXISTS {self.name} (key BLOB PRIMARY KEY, record BLOB NOT NULL)")
                db.execute(f"SELECT key FROM {self.name} LIMIT 1").fetchall()
            except sqlite3.Error:
                db.close()
                raise
            self._db = db
        return self._db

    def _retire(self, db: sqlite3.Connection) -> None:
        found = [t for t in self.retired
                 if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (t,)).fetchone()]
        if found:
            with db:
                for table in found:
                    db.execute(f"DROP TABLE {table}")
            db.execute("VACUUM")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _damaged(self, exc: sqlite3.Error) -> bool:
        """Whether ``exc`` says the file itself is damaged (SQLite's ``SQLITE_NOTADB``, ``SQLITE_CORRUPT``) and it was
        set aside, so a new one opens next. Full disks, read-only files and locks are not damage."""
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # the primary code of an extended one
        if self.path is None or code not in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
            return False
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
            self._db = None
        try:
            set_aside(self.path, exc, f"the {self.name} cache is disposable; its records are worked out again")
        except OSError:
            return False
        return True

    def _failed(self, exc: sqlite3.Error) -> None:
        if not self._reported:
            self._reported = True
            log.warning("keyed_cache_failed", cache=self.name, path=str(self.path),
                        error=f"{type(exc).__name__}: {exc}",
                        detail="treated as a miss: what it would have remembered is worked out again")
