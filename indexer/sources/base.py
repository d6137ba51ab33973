"""What every source's reading shares: the result of reading one file (``Prepared``, or ``Unchanged``), what a
reader is handed (``ReadSetup``), the content hash a file's points carry, and opening a file safely.

Fingerprint: ``stat`` first (size, ``mtime_ns``, ``ctime_ns``, inode, device, compared with ``!=``); only when any
differs from what the store holds is the content read, and a sha256 of it decides: equal hash, no work. Files are
opened with ``O_NOFOLLOW | O_NONBLOCK`` beneath their collection's root (``indexer.safeio.open_beneath``) and checked
with ``fstat``, so a symlink or FIFO swapped in after the walk is refused, never followed or blocked on.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO

from indexer import bm25, chunking
from indexer.api import HEAD_BYTES, Chunk, ExtractContext
from indexer.errors import FileSkipped, ReadRefused
from indexer.points import FileState, stat_identity
from indexer.redact import Redactor
from indexer.safeio import UnsafePath, open_beneath
from indexer.workspace import Collection, anchor

if TYPE_CHECKING:
    from indexer.plugins import Registry
    from indexer.sources.tailing import Tail, TailRead

_READ_BLOCK = 1 << 20
DEFAULT_REDACTION = Redactor().version  # the default settings' (``redact_secrets`` on, no patterns of the user's)
_SKIP_DETAILS = {"symlink": "symlinks are never followed", "not_regular_file": "a FIFO, socket or device"}


@dataclass(frozen=True, slots=True)
class ReadSetup:
    """What a reader reads one file with, from the pipeline: the plugins (``registry``: classifiers, extractors,
    transcript formats, embedders), the text embedder's limits (``context``), the byte caps of a note
    (``max_file_bytes``; media have the workspace's multimodal cap) and of a transcript (``sessions_max_file_bytes``,
    read streamed) and the file's collection's ``redactor``."""

    registry: Registry
    context: ExtractContext
    max_file_bytes: int
    sessions_max_file_bytes: int
    redactor: Redactor


@dataclass(frozen=True, slots=True)
class Unchanged:
    """The store already holds this content (same stat, or same hash). ``identity``: when the hash said so, the
    stat identity (``stat_identity``, taken before reading) the content was checked at; the caller may trust it."""

    path: Path
    identity: tuple[int, int, int, int, int] | None = None


@dataclass(slots=True)
class Prepared:
    """A file read and chunked, ready to embed: what every source has (sizes in bytes, times in ns since the
    epoch), the embedding counters (``embedded``, ``cache_hits``) and, for a session transcript, ``tail``
    (``indexer.sources.tailing.TailRead``: where it is read up to, what was parsed, which chunks a tail read
    rewrites)."""

    collection: Collection
    path: Path
    rel_path: str
    kind: str
    file_hash: str
    size_bytes: int
    mtime_ns: int
    chunks: list[Chunk]
    ctime_ns: int = -1
    inode: int = -1
    device: int = -1
    embedded: int = 0
    cache_hits: int = 0
    tail: TailRead | None = None

    @property
    def indexes(self) -> list[int] | None:
        """The chunk index of each of ``chunks`` when they are a transcript's tail (``None``: 0, 1, 2...)."""
        return self.tail.indexes if self.tail is not None else None

    @property
    def chunk_count(self) -> int:
        """The file's chunks in all (its points once written)."""
        return len(self.chunks) if self.tail is None or self.tail.indexes is None else self.tail.total

    @property
    def tail_state(self) -> Tail | None:
        """A transcript's ``Tail`` after this read (its ``FileState.tail`` and chunk 0's payload ``tail``)."""
        return self.tail.state if self.tail is not None else None


def index_hash(content_hash: str, redaction: str = DEFAULT_REDACTION) -> str:
    """The ``file_hash`` a file's points carry: its content's sha256 hex, ``+chunking`` and
    ``indexer.chunking.CHUNKING_VERSION``, ``+terms`` and ``indexer.bm25.TERMS_VERSION``, ``+redact`` and the
    redaction applied (``indexer.redact.Redactor.version``: ``off``, or the pattern table's version). A store written
    by another chunking, keyword-terms or redaction version thus holds other hashes: every file is re-chunked once
    (the stat shortcut and the hash check both compare it; its vectors come from the embedding cache) and
    ``replace_file`` deletes the old version's points, so versions never mix in a collection."""
    return f"{content_hash}+chunking{chunking.CHUNKING_VERSION}+terms{bm25.TERMS_VERSION}+redact{redaction}"


def current(known: FileState | None, redaction: str = DEFAULT_REDACTION) -> bool:
    """Whether ``known`` was indexed whole, by this chunking version and ``redaction``."""
    return bool(known and known.complete and known.file_hash.endswith(index_hash("", redaction)))


def unchanged_by_stat(known: FileState | None, st: os.stat_result, redaction: str = DEFAULT_REDACTION) -> bool:
    """Whether a file indexed as ``known`` (whole, by this chunking version and ``redaction``, its collection's
    ``Redactor.version``) still has the ``lstat`` result ``st`` it was indexed at (``stat_identity``): it needs no
    reading."""
    return known is not None and current(known, redaction) and known.identity() == stat_identity(st)


def unsafe_skip(exc: UnsafePath) -> FileSkipped:
    """The skip a refused open (``indexer.safeio.UnsafePath``) means: ``not_regular_file`` (a FIFO, socket or
    device) or ``symlink`` (any link on the way), for every source alike."""
    reason = "not_regular_file" if exc.reason == "not_regular_file" else "symlink"
    return FileSkipped(reason, _SKIP_DETAILS[reason])


def utf8_name(path: str) -> bool:
    """Whether ``path`` is valid UTF-8 on disk. Python decodes a name that is not with lone surrogates (PEP 383),
    which neither a Qdrant payload string nor a point id (``points.point_id``, a UUID5 of the UTF-8 path) can
    carry."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_fingerprint(path: Path, max_bytes: int, collection: Collection | None = None
                     ) -> tuple[os.stat_result, bytes, str]:
    """``(stat, first HEAD_BYTES bytes, sha256 hex)`` of regular file ``path``, streamed in 1 MiB blocks. Given
    its ``collection``, the file is opened beneath the collection's root with no symlink followed at any component
    (``indexer.safeio.open_beneath``), so a directory swapped for a symlink after the walk is refused.

    Raises ``FileNotFoundError`` if gone, ``FileSkipped`` for symlinks (``symlink``), non-regular files
    (``not_regular_file``), files over ``max_bytes`` (``too_large``) and permission errors (``permission_denied``).
    """
    try:
        if collection is not None:
            base, rel, follow = anchor(collection, path)
            fd = open_beneath(base, rel, follow_root=follow)
        else:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except UnsafePath as exc:
        raise unsafe_skip(exc) from None
    except PermissionError:
        raise FileSkipped("permission_denied", "no read permission") from None
    except OSError as exc:
        if exc.errno == getattr(os, "ELOOP", 40):
            raise FileSkipped("symlink", "symlinks are never followed") from None
        if isinstance(exc, FileNotFoundError):
            raise
        raise FileSkipped("unreadable", exc.strerror or str(exc)) from None
    with os.fdopen(fd, "rb", buffering=0) as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise FileSkipped("not_regular_file", "a FIFO, socket or device")
        if st.st_size > max_bytes:
            raise FileSkipped("too_large", f"{st.st_size} bytes > limit {max_bytes}")
        digest = hashlib.sha256()
        head = b""
        while block := handle.read(_READ_BLOCK):
            if not head:
                head = block[:HEAD_BYTES]
            digest.update(block)
        return st, head, digest.hexdigest()


def open_file_beneath(collection: Collection, path: Path) -> BinaryIO:
    """``path`` of ``collection`` opened for binary reading beneath the collection's root, no symlink followed at
    any component (``FileInfo.open`` of the files the pipeline hands to extractors). Raises ``OSError``."""
    base, rel, follow = anchor(collection, path)
    return os.fdopen(open_beneath(base, rel, follow_root=follow), "rb")


def open_memory(collection: Collection, path: Path, text: bool = False) -> IO[Any]:
    """``path`` of ``collection`` opened for reading beneath its root with no symlink followed at any component
    (``indexer.safeio.open_beneath``): binary, or text (UTF-8, undecodable bytes replaced). Raises ``ReadRefused``
    for a symlink on the way, ``..`` or a non-regular file, and ``FileNotFoundError``/``PermissionError``."""
    base, rel, follow = anchor(collection, path)
    try:
        fd = open_beneath(base, rel, follow_root=follow)
    except UnsafePath as exc:
        raise ReadRefused(f"{rel}: refused ({exc.reason})") from None
    if text:
        return open(fd, encoding="utf-8", errors="replace", newline=None)
    return open(fd, "rb")
