"""A persistent embedding cache: (model id, content hash) -> vector, in SQLite under the state directory.

Unchanged text is never embedded twice, across restarts and renames: the key is the sha256 of the model id and the
chunk's text (or raw bytes for images), not of its path. Vectors are stored as float32 bytes.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def cache_key(model_id: str, content: bytes) -> bytes:
    """sha256 of ``model_id``, a NUL, and ``content``: 32 bytes."""
    return hashlib.sha256(model_id.encode("utf-8") + b"\x00" + content).digest()


class EmbeddingCache:
    """``get_many``/``put_many`` over a SQLite file (WAL mode); ``path=None`` keeps it in memory. Thread-safe."""

    def __init__(self, path: Path | None) -> None:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path) if path else ":memory:", check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS embedding (key BLOB PRIMARY KEY, vector BLOB NOT NULL)")
        self._lock = threading.Lock()

    def get_many(self, keys: Sequence[bytes], dim: int) -> dict[bytes, np.ndarray]:
        """The cached ``(dim,)`` float32 vectors among ``keys``; entries of another size are ignored."""
        found: dict[bytes, np.ndarray] = {}
        with self._lock:
            for start in range(0, len(keys), 500):
                batch = list(keys[start : start + 500])
                marks = ",".join("?" * len(batch))
                for key, blob in self._db.execute(f"SELECT key, vector FROM embedding WHERE key IN ({marks})", batch):
                    vector = np.frombuffer(blob, dtype=np.float32)
                    if vector.shape == (dim,):
                        found[bytes(key)] = vector
        return found

    def put_many(self, items: Sequence[tuple[bytes, np.ndarray]]) -> None:
        with self._lock, self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO embedding (key, vector) VALUES (?, ?)",
                [(key, np.asarray(vec, dtype=np.float32).tobytes()) for key, vec in items],
            )

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM embedding").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
