"""A persistent embedding cache: (model id, content hash) -> vector, in SQLite under the state directory.

Unchanged text is never embedded twice, across restarts and renames: the key is the sha256 of the model id and the
chunk's text (or raw bytes for images), not of its path. Vectors are stored as float32 bytes.

The cache is disposable: everything in it can be recomputed. A file that is not a readable SQLite database (garbage,
truncated, damaged while running) is set aside as ``<name>.corrupt-<unix time>`` with one ``cache_reset`` log line
and a new one is started; a file deleted or replaced while running is noticed at the next read or write (its
device and inode changed) and reopened with one ``cache_reopened`` line, so writes never go to an unlinked file; a
cache that cannot be written (disk full, read-only) logs ``cache_write_failed`` once per outage and indexing goes
on uncached. None of these ever stops the daemon.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import structlog

log = structlog.get_logger("qmd_indexer.cache")


def cache_key(model_id: str, content: bytes) -> bytes:
    """sha256 of ``model_id``, a NUL, and ``content``: 32 bytes."""
    return hashlib.sha256(model_id.encode("utf-8") + b"\x00" + content).digest()


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
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        for suffix in ("", "-wal", "-shm"):
            source = self.path.with_name(self.path.name + suffix)
            try:
                source.replace(aside.with_name(aside.name + suffix))
            except FileNotFoundError:
                pass
        log.warning("cache_reset", path=str(self.path), set_aside=str(aside), error=f"{type(exc).__name__}: {exc}",
                    detail="the embedding cache is disposable; vectors are recomputed as needed")
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
