"""Files skipped or failing, each logged once per file state, and the ``files_failed`` count and the failing files
``status`` reports; and files held back while the embedder cannot answer (``Outage``: never failures).

A file is keyed by its absolute path and marked with its fingerprint (size, ``mtime_ns``, ``ctime_ns``), the reason
and whether it is a failure, so a rescan of an unchanged bad file stays quiet, and a changed one is told again.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import structlog

log = structlog.get_logger("qmd_indexer.daemon")

# reasons worth a warning (the user may want to act); the rest are routine and logged at info level
LOUD = frozenset({"symlink", "too_large", "split_root_memory", "not_regular_file", "permission_denied",
                  "unreadable", "no_extractor", "no_embedder", "silent", "no_speech", "unreadable_directory",
                  "undecodable_name"})
DETAILS = {
    "split_root_memory": "MEMORY.md and memory.md are distinct files; MEMORY.md is indexed. Run `qmd-indexer doctor`.",
    "symlink": "symlinks are never followed",
    "hidden": "hidden names are not memory",
    "unreadable_directory": "the daemon's user cannot list this directory, so its files are not indexed; fix its "
                            "permissions (chmod/chown)",
    "undecodable_name": "the file's path is not valid UTF-8, which the index cannot store; rename it (e.g. "
                        "`convmv -f latin1 -t utf8`)",
}
# reasons that are failures (the file is memory but could not be indexed), counted in files_failed
FAILURES = frozenset({"permission_denied", "unreadable", "unreadable_directory", "undecodable_name"})

Mark = tuple[int, int, int, str, bool]  # (size, mtime_ns, ctime_ns, reason, failed)


def _fingerprint(path: Path) -> tuple[int, int, int]:
    try:
        st = os.lstat(path)
        return st.st_size, st.st_mtime_ns, st.st_ctime_ns
    except OSError:
        return -1, -1, -1


class Outage:
    """Files held back because the embedder cannot answer now (``EmbedUnavailable``): not failures, their points
    stay. ``reason`` (``None`` while it answers) is what ``/health`` says; ``deferred`` counts batches put off since
    start (``status``); ``delay_s`` is the backoff before the next try (1 s, doubling to ``MAX_DELAY_S``, or the
    server's ``Retry-After`` when longer, up to ``MAX_RETRY_AFTER_S``). Written by the worker thread only."""

    MAX_DELAY_S = 30.0
    MAX_RETRY_AFTER_S = 300.0

    def __init__(self) -> None:
        self.reason: str | None = None
        self.since: float | None = None
        self.deferred = 0
        self.tries = 0  # consecutive batches put off in this outage
        self.waiting: set[str] = set()

    def hold(self, paths: Iterable[str], reason: str, retry_after_s: float | None) -> float:
        """Record that ``paths`` could not be embedded now for ``reason``; logs ``embedder_unavailable`` once per
        outage. Returns the seconds to wait before trying them again."""
        if self.reason is None:
            self.since = time.time()
            log.error("embedder_unavailable", reason=reason,
                      hint="files are retried with backoff; their points stay, searches answer from keyword search")
        self.reason = reason.splitlines()[0][:300] if reason else "unavailable"
        self.deferred += 1
        self.tries += 1
        self.waiting.update(paths)
        delay = min(self.MAX_DELAY_S, 2.0 ** (self.tries - 1))
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, self.MAX_RETRY_AFTER_S))
        return delay

    def release(self, path: str) -> None:
        """``path`` was embedded: it no longer waits; the first success ends the outage (logged)."""
        self.waiting.discard(path)
        if self.reason is not None:
            log.info("embedder_available", after_s=round(time.time() - (self.since or 0), 1),
                     deferred=self.deferred)
            self.reason, self.since, self.tries = None, None, 0


class Ledger:
    """The files skipped or failing in their current state (absolute path -> ``Mark``). Used by the worker thread
    only; ``files_failed`` may be read from any thread."""

    def __init__(self) -> None:
        self.marks: dict[str, Mark] = {}
        self.details: dict[str, str] = {}  # absolute path -> the detail its mark was logged with
        self.failures: Counter[str] = Counter()  # failures logged since start, by reason (``/metrics`` errors)
        self.outage = Outage()  # files held back while the embedder cannot answer

    def skip(self, path: Path, reason: str, detail: str = "", failed: bool = False) -> bool:
        """Record and log that ``path`` is skipped (or failed) for ``reason``; ``detail`` defaults to the reason's
        stock explanation. Returns ``False``, logging nothing, when the file was already marked so in this state."""
        key = str(path)
        mark = (*_fingerprint(path), reason, failed)
        if self.marks.get(key) == mark:
            return False
        self.marks[key] = mark
        detail = detail or DETAILS.get(reason, "")
        self.details[key] = detail
        if failed:
            self.failures[reason] += 1
            log.error("file_failed", path=key, reason=reason, detail=detail)
        elif reason in LOUD:
            log.warning("file_skipped", path=key, reason=reason, detail=detail)
        else:
            log.info("file_skipped", path=key, reason=reason, detail=detail)
        return True

    def clear(self, abs_path: str) -> None:
        """``abs_path`` is fine now (indexed, or about to be)."""
        self.marks.pop(abs_path, None)
        self.details.pop(abs_path, None)

    def keep_only(self, candidates: Iterable[str]) -> None:
        """After a scan: drop the marks of files that are gone or no longer candidates."""
        kept = set(candidates)
        for abs_path in [p for p in self.marks if p not in kept]:
            self.clear(abs_path)

    def forget_under(self, abs_path: str) -> None:
        """``abs_path`` was deleted: drop its mark and, for a directory, the marks of everything below it."""
        prefix = abs_path.rstrip("/") + "/"
        for key in [p for p in self.marks if p == abs_path or p.startswith(prefix)]:
            self.clear(key)

    @staticmethod
    def explain(reason: str) -> str:
        """The stock explanation of a skip ``reason`` (``""`` when none)."""
        return DETAILS.get(reason, "")

    @property
    def files_failed(self) -> int:
        """How many files fail in their current state (skips are not failures)."""
        return sum(1 for mark in list(self.marks.values()) if mark[4])

    def skipped(self) -> dict[str, int]:
        """How many files are skipped in their current state, by reason, for the reasons worth a warning (``LOUD``:
        a too large file, a symlink...; not a hidden name), sorted by reason. Any thread may call it."""
        counts = Counter(mark[3] for mark in list(self.marks.values()) if not mark[4] and mark[3] in LOUD)
        return dict(sorted(counts.items()))

    def failed(self, limit: int) -> list[dict[str, str]]:
        """The first ``limit`` files failing in their current state, by path: each ``{path, reason, detail}`` (the
        absolute path, a byte of a name that is not UTF-8 written ``\\xe9``; the reason and the detail it was logged
        with). Any thread may call it."""
        failing = sorted(path for path, mark in list(self.marks.items()) if mark[4])[:limit]
        return [{"path": shown_path(path), "reason": mark[3], "detail": self.details.get(path, "")}
                for path in failing if (mark := self.marks.get(path)) is not None]


def shown_path(path: str) -> str:
    """``path`` as text that JSON and UTF-8 can carry: each byte of a name that is not UTF-8 (which Python reads as a
    lone surrogate, ``os.fsdecode``) written as ``\\xNN``, as ``ls --quoting-style=escape`` and Python's
    ``backslashreplace`` write it; any other path unchanged."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
