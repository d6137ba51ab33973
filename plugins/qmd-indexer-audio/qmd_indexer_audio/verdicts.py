"""Skip verdicts (``silent``, ``no_speech``) remembered by content, so an unchanged recording without speech is
never decoded or transcribed twice: not at the next rescan, not after a restart, not under another name.

The key is ``indexer.api.cache_key(rules, sha256 of the file's bytes)``, as an embedding is keyed by model and
content: ``rules`` names everything that could change the verdict (engine, model, language, levels, VAD and
thresholds), so changing any of them transcribes again. Only skips are stored; a file with speech becomes chunks,
which the store and the embedding cache already remember. The file is a ``KeyedCache`` (``indexer.api``), one
small record per verdict.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from indexer.api import KeyedCache, cache_key


def verdict_key(rules: str, data: bytes) -> bytes:
    """32 bytes for a file's content ``data`` under ``rules``."""
    return cache_key(rules, hashlib.sha256(data).digest())


class VerdictCache:
    """``get``/``put`` of ``(reason, detail)`` by ``verdict_key`` over a ``KeyedCache`` at ``path`` (``None``: in
    memory, for this process only), opened on first use (so loading the plugin touches no disk). Thread-safe. A file
    that cannot be read or written (an unwritable folder, a corrupt file: set aside and started again) never raises:
    the verdict is a miss and the file is transcribed instead. The table of the first layout (``verdict``) is
    dropped when the file opens."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._records = KeyedCache(path, "skip_verdicts", retired=("verdict",))

    def get(self, key: bytes) -> tuple[str, str] | None:
        """``(reason, detail)`` remembered for ``key``, or ``None`` (also for a record that does not parse)."""
        record = self._records.get(key)
        if record is None:
            return None
        try:
            reason, detail = json.loads(record)
        except (ValueError, TypeError):
            return None
        return str(reason), str(detail)

    def put(self, key: bytes, reason: str, detail: str) -> None:
        """Remember the skip ``reason`` (``"silent"``, ``"no_speech"``) and its ``detail`` line under ``key``."""
        self._records.put(key, json.dumps([reason, detail], ensure_ascii=False).encode("utf-8"))

    def close(self) -> None:
        self._records.close()
