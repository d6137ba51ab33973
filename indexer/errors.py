"""The exception tree. Every error the indexer raises on purpose is a ``QmdError``::

    QmdError
    ├── ConfigError          invalid config file, environment or flags (the CLI exits 2 with one line)
    ├── PluginError          a plugin failed to load or breaks the contract (reported and skipped)
    ├── CollectionMismatch   an existing collection's vectors differ from the configured embedders (reindex)
    │   └── CollectionDamaged an embedded collection's files cannot be read (reindex replaces it)
    ├── StoreUnavailable     Qdrant cannot be reached or refused an operation (retried, then logged)
    │   └── StoreLocked      the embedded store is held by another process (a config mistake: not retried at start)
    ├── StateReadOnly        the state directory is read-only at start (the daemon exits 1 with one line)
    ├── FileSkipped          a file is not indexed for a stated reason (too large, not UTF-8 text, FIFO, ...)
    ├── ExtractError         an extractor could not read a file of its kind (corrupt image, bad codec, ...)
    ├── EmbedError           an embedder could not embed an input (the file is marked failed)
    │   ├── EmbedUnavailable the embedder cannot answer now (server down, 429, 5xx, timeout, model loading):
    │   │                    retried with backoff; the file is never marked failed nor loses its points
    │   └── BadVectors       the embedder answered vectors that cannot be stored (NaN, inf, zero, wrong size):
    │                        the file is marked failed (bad_vectors) and keeps its old points; nothing is cached
    ├── ReadRefused          a paged read asked for a path that is not a memory file of that workspace
    │   └── AppendRefused    an append is not allowed there (append off, not a markdown file under memory/)
    ├── EntryTooLarge        an append's entry is over append_max_bytes, or would take its file over its cap
    └── AppendUnavailable    the daemon cannot write the workspace (read-only file system, no permission): 503
"""

from __future__ import annotations

import difflib
from collections.abc import Collection

# exit statuses of the command line and of ``indexer.service.serve``: success; runtime failure (daemon or Qdrant
# unreachable, collection mismatch); usage or configuration error; ``index --once`` finished but some files failed
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3


class QmdError(Exception):
    """Base of every error raised on purpose by qmd-indexer."""


class ConfigError(QmdError):
    """Invalid configuration; the message names the key and the problem."""


class PluginError(QmdError):
    """A plugin could not be loaded or does not satisfy its contract."""


class CollectionMismatch(QmdError):
    """An existing collection was created for other vectors than the configured embedders produce."""


class CollectionDamaged(CollectionMismatch):
    """An embedded (Qdrant Edge) collection's files cannot be read: its record (``qmd-collection.json``) or the
    shard itself is damaged. A rebuild (``index --once --reindex``) replaces it, as it does a mismatched one."""


class StoreUnavailable(QmdError):
    """The Qdrant store could not be reached or refused an operation."""


class StateDirFull(StoreUnavailable):
    """A store write was refused: the state directory's file system has less free space than the configured
    margin (``state_min_free_bytes``). Retried like any unavailable store; the store logs ``state_dir_full``."""


class StoreLocked(StoreUnavailable):
    """The embedded store's write-ahead log is locked by another process."""


class StateReadOnly(QmdError):
    """The state directory (store, cache, lock) cannot be written: read-only file system or no permission."""


class FileSkipped(QmdError):
    """A file is deliberately not indexed; ``reason`` is a short snake_case word for logs."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class ExtractError(QmdError):
    """An extractor could not turn a file into chunks (corrupt or unsupported content)."""


class EmbedError(QmdError):
    """An embedder could not embed an input."""


class EmbedUnavailable(EmbedError):
    """The embedder cannot answer now: its server is down or unreachable, answered 429 or 5xx, timed out, or is
    still loading its model. Transient: indexing retries the files later with backoff and never marks them failed
    nor drops their points; a search answers from keyword search instead (``degraded``). ``retry_after_s``: how
    long the server asked to wait (``Retry-After``), ``None`` when it did not say."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BadVectors(EmbedError):
    """An embedder answered vectors that cannot be stored: not one per input, not the collection's size, not
    finite numbers (NaN, inf) or of zero norm. A permanent error for those inputs (``indexer.api.check_vectors``):
    the file is marked failed (``bad_vectors``, counted in ``status``, ``/metrics`` and ``/health``) and keeps the
    points it had; the vectors are never cached."""


class ReadRefused(QmdError):
    """A read asked for a path that is not a memory file of the workspace."""


class AppendRefused(ReadRefused):
    """The append is not allowed: the workspace has ``append`` off, or the path is not a markdown file under its
    ``memory/`` (outside, ``..``, a symlink, hidden, another agent's, not ``.md``, not a regular file). 403."""


class EntryTooLarge(QmdError):
    """The entry is over ``append_max_bytes``, or would take the file over its cap. 413."""


class AppendUnavailable(QmdError):
    """The workspace allows appends but the daemon cannot write there: its file system is read-only for the daemon
    (systemd's ``ProtectHome=read-only`` without ``ReadWritePaths=``, a read-only mount) or its user lacks write
    permission. The server's state, not the request's fault: 503, the message says why and what to change."""


def error_answer(exc: BaseException) -> tuple[int, str] | None:
    """``(HTTP status, message)`` for an error the daemon raises on purpose while answering, else ``None``:
    ``ReadRefused`` (``AppendRefused`` too) and ``PermissionError`` 403; ``KeyError`` (unknown agent or collection)
    and ``FileNotFoundError`` 404; ``EntryTooLarge`` 413; ``ValueError`` and other ``OSError`` 400;
    ``StoreUnavailable`` and ``AppendUnavailable`` 503."""
    if isinstance(exc, EntryTooLarge):
        return 413, str(exc)
    if isinstance(exc, ReadRefused):
        return 403, str(exc)
    if isinstance(exc, KeyError):
        return 404, str(exc.args[0] if exc.args else exc)
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return 404, f"no such file: {exc.filename or exc}"
    if isinstance(exc, PermissionError):
        return 403, "permission denied"
    if isinstance(exc, ValueError):
        return 400, str(exc)
    if isinstance(exc, (StoreUnavailable, AppendUnavailable)):
        return 503, str(exc)
    if isinstance(exc, OSError):  # a name too long, a directory given as a file...: the request's fault
        return 400, f"cannot read {exc.filename or 'the file'}: {exc.strerror or exc}"
    return None


def did_you_mean(name: str, known: Collection[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``known`` to a mistyped ``name`` (``difflib``, ratio >= 0.6),
    else ``""``: the tail of a refusal that names what to fix."""
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_agent(agent: str, known: Collection[str]) -> str:
    """The refusal of an agent no workspace has: ``unknown agent 'x' (did you mean 'y'?); the agents are a, b``."""
    agents = ", ".join(sorted(known)) or "none (no workspace is configured)"
    return f"unknown agent {agent!r}{did_you_mean(agent, known)}; the agents are {agents}"
