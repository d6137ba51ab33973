"""Skip verdicts (``silent``, ``no_speech``) remembered by content, so an unchanged recording without speech is
never decoded or transcribed twice: not at the next rescan, not after a restart, not under another name.

The key is ``indexer.cache.cache_key(rules, sha256 of the file's bytes)``, as an embedding is keyed by model and
content: ``rules`` names everything that could change the verdict (engine, model, language, levels, VAD and
thresholds), so changing any of them transcribes again. Only skips are stored; a file with speech becomes chunks,
which the store and the embedding cache already remember. SQLite in WAL mode, one small row per verdict.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from pathlib import Path

import structlog

from indexer.cache import cache_key

log = structlog.get_logger("qmd_indexer.audio")


def verdict_key(rules: str, data: bytes) -> bytes:
    """32 bytes for a file's content ``data`` under ``rules``."""
    return cache_key(rules, hashlib.sha256(data).digest())


class VerdictCache:
    """``get``/``put`` over a SQLite file (``None``: in memory, for this process only), opened on first use (so
    loading the plugin touches no disk). Thread-safe. A database error (unwritable folder, corrupt file) is logged
    once (``verdict_cache_failed``) and then treated as a miss: the file is transcribed instead."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._reported = False

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            try:
                if self.path is not None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise sqlite3.OperationalError(f"cannot create {self.path.parent}: {exc}") from exc
            db = sqlite3.connect(str(self.path) if self.path else ":memory:", check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS verdict (key BLOB PRIMARY KEY, reason TEXT NOT NULL, "
                       "detail TEXT NOT NULL)")
            self._db = db
        return self._db

    def _failed(self, exc: sqlite3.Error) -> None:
        if not self._reported:
            self._reported = True
            log.warning("verdict_cache_failed", path=str(self.path), error=str(exc))

    def get(self, key: bytes) -> tuple[str, str] | None:
        """``(reason, detail)`` remembered for ``key``, or ``None``."""
        try:
            with self._lock:
                row = self._open().execute("SELECT reason, detail FROM verdict WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            self._failed(exc)
            return None
        return (str(row[0]), str(row[1])) if row else None

    def put(self, key: bytes, reason: str, detail: str) -> None:
        try:
            with self._lock, self._open() as db:
                db.execute("INSERT OR REPLACE INTO verdict (key, reason, detail) VALUES (?, ?, ?)",
                                 (key, reason, detail))
        except sqlite3.Error as exc:
            self._failed(exc)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
