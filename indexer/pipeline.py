"""One file through fingerprint, classify, extract, embed and point building. No I/O to the store.

``Pipeline.prepare(collection, path, known)`` returns ``Unchanged`` (nothing to do), or ``Prepared`` (the file's
chunks), or raises ``FileSkipped`` / ``ExtractError`` with the reason, or ``FileNotFoundError`` when the file is gone
(the caller then deletes its points). ``Pipeline.to_points(prepared_files)`` embeds the chunks of many files in one
batch per modality (so small files still fill the model's batches), reusing cached vectors, and builds the points.

Fingerprint: ``stat`` first (size, ``mtime_ns``, ``ctime_ns``, inode, device, compared with ``!=``); only when any
differs from what the store holds is the content
read, and a sha256 of it decides: equal hash, no work. Files are opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked
with ``fstat``, so a symlink or FIFO swapped in after the walk is refused, never followed or blocked on.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import BinaryIO

import numpy as np

from indexer import bm25, chunking, transcripts
from indexer.api import HEAD_BYTES, Chunk, ExtractContext, FileInfo, check_vectors
from indexer.bm25 import Bm25Terms
from indexer.cache import EmbeddingCache, cache_key
from indexer.config import Settings
from indexer.errors import ExtractError, FileSkipped, PluginError
from indexer.plugins import Registry
from indexer.points import SPARSE, FileState, Payload, Point, point_id, stat_identity
from indexer.redact import Redactor
from indexer.safeio import UnsafePath, open_beneath
from indexer.tailing import Tail, read_tail, read_whole
from indexer.transcripts import Reading
from indexer.workspace import Collection, anchor, display_path, rel_path

EMBED_SLICE = 256  # chunks per embedding call: long enough to keep the model's batches full, short enough to stop
_READ_BLOCK = 1 << 20
DEFAULT_REDACTION = Redactor().version  # the default settings' (``redact_secrets`` on, no patterns of the user's)
_SKIP_DETAILS = {"symlink": "symlinks are never followed", "not_regular_file": "a FIFO, socket or device"}


def _unsafe_skip(exc: UnsafePath) -> FileSkipped:
    """The skip a refused open (``indexer.safeio.UnsafePath``) means: ``not_regular_file`` (a FIFO, socket or
    device) or ``symlink`` (any link on the way), for a note and a transcript alike."""
    reason = "not_regular_file" if exc.reason == "not_regular_file" else "symlink"
    return FileSkipped(reason, _SKIP_DETAILS[reason])


def index_hash(content_hash: str, redaction: str = DEFAULT_REDACTION) -> str:
    """The ``file_hash`` a file's points carry: its content's sha256 hex, ``+chunking`` and
    ``indexer.chunking.CHUNKING_VERSION``, ``+terms`` and ``indexer.bm25.TERMS_VERSION``, ``+redact`` and the
    redaction applied (``indexer.redact.Redactor.version``: ``off``, or the pattern table's version). A store written
    by another chunking, keyword-terms or redaction version thus holds other hashes: every file is re-chunked once
    (the stat shortcut and the hash check both compare it; its vectors come from the embedding cache) and
    ``replace_file`` deletes the old version's points, so versions never mix in a collection."""
    return f"{content_hash}+chunking{chunking.CHUNKING_VERSION}+terms{bm25.TERMS_VERSION}+redact{redaction}"


def _current(known: FileState | None, redaction: str = DEFAULT_REDACTION) -> bool:
    """Whether ``known`` was indexed whole, by this chunking version and ``redaction``."""
    return bool(known and known.complete and known.file_hash.endswith(index_hash("", redaction)))


def unchanged_by_stat(known: FileState | None, st: os.stat_result, redaction: str = DEFAULT_REDACTION) -> bool:
    """Whether a file indexed as ``known`` (whole, by this chunking version and ``redaction``, its collection's
    ``Redactor.version``) still has the ``lstat`` result ``st`` it was indexed at (``stat_identity``): it needs no
    reading."""
    return known is not None and _current(known, redaction) and known.identity() == stat_identity(st)


def expired(collection: Collection, st: os.stat_result) -> bool:
    """Whether a file of ``collection`` with ``lstat`` result ``st`` is a transcript last written more than its
    workspace's ``sessions_max_age_days`` ago (retention: its points are dropped)."""
    max_age = collection.workspace.sessions_max_age_days
    return collection.corpus == "sessions" and max_age is not None and st.st_mtime < time.time() - max_age * 86400


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (``None`` on another C library)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def trim_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim(0)``; nothing elsewhere). A forward
    pass frees its activations (tens of MiB) into malloc's per-thread arenas, which keep them: without this, a
    10 MB log grew the daemon by the activations of every pass of its embedding, and kept it after. Called after
    each full slice of ``EMBED_SLICE`` chunks (``Pipeline.embed``: a big file or a first index, never a note's
    save of a few chunks) and once a huge file is chunked; costs milliseconds."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class Interrupted(Exception):
    """Embedding stopped between slices because a shutdown was requested."""


@dataclass(frozen=True, slots=True)
class Unchanged:
    """The store already holds this content (same stat, or same hash). ``identity``: when the hash said so, the
    stat identity (``stat_identity``, taken before reading) the content was checked at; the caller may trust it."""

    path: Path
    identity: tuple[int, int, int, int, int] | None = None


@dataclass(slots=True)
class Prepared:
    """A file read and chunked, ready to embed."""

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
    # a transcript's tail (``indexer.tailing``): the chunk index of each of ``chunks`` (``None``: 0, 1, 2...; else
    # chunk 0 first, then the open window's index on), the file's chunks in all, and where it was read up to
    indexes: list[int] | None = None
    total: int = -1
    tail: Tail | None = None
    read_bytes: int = -1  # a transcript: bytes and JSONL lines parsed (its tail alone, or the whole file)
    read_lines: int = -1

    @property
    def chunk_count(self) -> int:
        """The file's chunks in all (its points once written)."""
        return len(self.chunks) if self.indexes is None else self.total


@dataclass(slots=True)
class Stats:
    """Counters since start, shown by ``status``."""

    chunks_embedded: int = 0
    cache_hits: int = 0


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
        raise _unsafe_skip(exc) from None
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


def _utf8(path: str) -> bool:
    """Whether ``path`` is valid UTF-8 on disk. Python decodes a name that is not with lone surrogates (PEP 383),
    which neither a Qdrant payload string nor a point id (``points.point_id``, a UUID5 of the UTF-8 path) can
    carry."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Pipeline:
    """Turns files into points with the loaded plugins. ``max_file_bytes`` caps text files; media use the
    workspace's multimodal cap. ``terms`` builds the BM25 vectors (``None``: the product's ``Bm25Terms()``).
    ``settings``: where ``redact_secrets`` and ``redact_patterns`` come from (``None``: their defaults); a
    workspace's own ``redact_secrets`` is read from each collection's workspace, so a reload applies it."""

    def __init__(self, registry: Registry, cache: EmbeddingCache, max_file_bytes: int,
                 terms: Bm25Terms | None = None, settings: Settings | None = None) -> None:
        self.registry = registry
        self.cache = cache
        self.max_file_bytes = max_file_bytes
        # a transcript is read streamed, so its cap is its own
        self.sessions_max_file_bytes = settings.sessions_max_file_bytes if settings is not None else 256 << 20
        self.stats = Stats()
        text = registry.text_embedder
        if text is None:
            raise PluginError("no embedder of modality 'text' is loaded; check `qmd-indexer plugins`")
        self.text_embedder = text
        self.terms = terms if terms is not None else Bm25Terms()
        self._context: ExtractContext | None = None
        self._redact_settings = settings

    def redactor(self, collection: Collection) -> Redactor:
        """The redactor of ``collection``'s chunks (``indexer.redact.Redactor.for_collection``)."""
        return Redactor.for_collection(self._redact_settings, collection)

    @property
    def context(self) -> ExtractContext:
        if self._context is None:
            self._context = ExtractContext(self.text_embedder.max_tokens, self.text_embedder.token_offsets)
        return self._context

    def dense_dims(self) -> dict[str, int]:
        """Named vector -> size, for every loaded embedder (``{"text": 384}``, plus ``"image"`` with CLIP)."""
        return {modality: int(e.dim) for modality, e in self.registry.embedders.items()}

    # -- step 3-5: fingerprint, classify, extract ----------------------------------------------------------------
    def prepare(self, collection: Collection, path: Path, known: FileState | None) -> Prepared | Unchanged:
        st = os.lstat(path)  # FileNotFoundError: the caller deletes the file's points
        if stat.S_ISLNK(st.st_mode):
            raise FileSkipped("symlink", "symlinks are never followed")
        if not stat.S_ISREG(st.st_mode):
            raise FileSkipped("not_regular_file", "a FIFO, socket or device")
        redactor = self.redactor(collection)
        if collection.corpus == "sessions":
            return self._prepare_transcript(collection, path, known, st, redactor)
        if unchanged_by_stat(known, st, redactor.version):
            return Unchanged(path)
        multimodal = collection.workspace.multimodal
        cap = max(self.max_file_bytes, multimodal.max_file_bytes if multimodal.enabled else 0)
        st, head, content_hash = read_fingerprint(path, cap, collection)
        file_hash = index_hash(content_hash, redactor.version)
        kind = self.registry.classify(path, head)
        if kind is None:
            raise FileSkipped("unsupported_type", "no classifier claims it")
        if collection.role == "root" and kind != "markdown":
            raise FileSkipped("unsupported_type", "the root memory file must be markdown")
        if kind in self.registry.media_kinds:  # declared by the extractor plugins (``media = True``)
            if not multimodal.allows(kind):
                raise FileSkipped("modality_disabled", f"{kind} indexing is off for this workspace")
            if st.st_size > multimodal.max_file_bytes:
                raise FileSkipped("too_large", f"{st.st_size} bytes > multimodal limit {multimodal.max_file_bytes}")
        elif st.st_size > self.max_file_bytes:
            raise FileSkipped("too_large", f"{st.st_size} bytes > limit {self.max_file_bytes}")
        if known is not None and _current(known, redactor.version) and known.file_hash == file_hash:
            return Unchanged(path, stat_identity(st))
        if not _utf8(str(path)):  # memory, but its name cannot be stored: the ledger's detail says to rename it
            raise FileSkipped("undecodable_name")
        extractor = self.registry.extractors.get(kind)
        if extractor is None:
            raise FileSkipped("no_extractor", f"no extractor plugin handles kind {kind!r}")
        info = FileInfo(path, rel_path(collection.workspace, path), kind, st.st_size,
                        opener=lambda: open_file_beneath(collection, path))
        try:
            chunks = list(extractor.extract(info, self.context))
        except (ExtractError, FileSkipped, FileNotFoundError):
            raise
        except Exception as exc:  # a plugin's own bug must not stop the daemon; report it for this file
            raise ExtractError(f"{type(exc).__name__} in extractor for {kind!r}: {exc}") from exc
        # a chunk of a modality without a loaded embedder is left out (an image's picture without CLIP, while the
        # text read out of it is indexed); a file left with none is skipped
        kept = [chunk for chunk in chunks if chunk.modality in self.registry.embedders]
        if chunks and not kept:
            missing = sorted({chunk.modality for chunk in chunks})
            raise FileSkipped("no_embedder", f"no embedder of modality {', '.join(map(repr, missing))} is loaded")
        # secrets out before anything is embedded, cached, keyword-indexed, stored, shown or logged (indexer.redact)
        chunks = redactor.chunks(kept)
        return Prepared(collection, path, info.rel_path, kind, file_hash, st.st_size, st.st_mtime_ns, chunks,
                        st.st_ctime_ns, st.st_ino, st.st_dev)

    def _prepare_transcript(self, collection: Collection, path: Path, known: FileState | None,
                            st: os.stat_result, redactor: Redactor) -> Prepared | Unchanged:
        """``prepare`` for a session transcript: too old for the workspace's ``sessions_max_age_days`` is a skip
        (``expired``: its points go), a file no transcript format sniffs is a skip (``not_a_transcript``), else
        its chunks (``indexer.transcripts.extract``)."""
        if expired(collection, st):
            max_age = collection.workspace.sessions_max_age_days
            raise FileSkipped("expired", f"last written more than sessions_max_age_days ({max_age:g}) ago")
        if unchanged_by_stat(known, st, redactor.version):
            return Unchanged(path)
        if not _utf8(str(path)):
            raise FileSkipped("undecodable_name")
        workspace = collection.workspace
        reading = Reading(roles=transcripts.ROLES + (("tool",) if workspace.sessions_tool_results else ()),
                          tool_chars=workspace.sessions_tool_result_chars, redact=redactor.redact, source=str(path))
        settings = (reading.roles, reading.tool_chars, redactor.version)
        tail = known.tail if known is not None and _current(known, redactor.version) else None
        if tail is not None:  # a file that grew: its tail alone (``indexer.tailing``)
            grown = self._read_transcript(collection, path, reading, settings, tail)
            if isinstance(grown, Prepared):
                grown.file_hash = known.file_hash if known is not None else grown.file_hash  # the points' version
                return grown
            reading = Reading(roles=reading.roles, tool_chars=reading.tool_chars, redact=redactor.redact,
                              source=str(path))
        st, head, content_hash = read_fingerprint(path, self.sessions_max_file_bytes, collection)
        file_hash = index_hash(content_hash, redactor.version)
        # a transcript's points keep the hash of its last whole read while tails are appended (``indexer.tailing``):
        # the same hash is the same content only at the same size (a file cut back to that read is re-chunked); one
        # indexed without its tail (points of an earlier version) is re-chunked once, so it has one
        if (known is not None and _current(known, redactor.version) and known.file_hash == file_hash
                and known.size_bytes == st.st_size and (known.tail is not None or not known.points)):
            return Unchanged(path, stat_identity(st))
        prepared = self._read_transcript(collection, path, reading, settings, None)
        assert prepared is not None
        prepared.file_hash = file_hash
        return prepared

    def _read_transcript(self, collection: Collection, path: Path, reading: Reading, settings: tuple[object, ...],
                         tail: Tail | None) -> Prepared | None:
        """Transcript ``path`` read whole (``tail`` ``None``) or from ``tail``'s open window on, as a ``Prepared``
        (``file_hash`` left for the caller); ``None`` when the tail cannot be trusted (``indexer.tailing``). Raises
        ``FileSkipped`` (``too_large``, ``not_a_transcript``) and ``ExtractError`` when it cannot be read."""
        try:
            with open_file_beneath(collection, path) as handle:
                st = os.fstat(handle.fileno())
                if st.st_size > self.sessions_max_file_bytes:
                    raise FileSkipped("too_large", f"{st.st_size} bytes > limit {self.sessions_max_file_bytes}")
                found = self.registry.transcript_format(handle.read(HEAD_BYTES))
                if found is None:
                    raise FileSkipped("not_a_transcript", "no transcript format plugin recognises its content")
                handle.seek(0)
                if tail is None:
                    chunks, new_tail = read_whole(handle, st, found[1], reading, self.context, path.stem, settings)
                    indexes, total = None, len(chunks)
                    read_bytes, read_lines = reading.end, reading.lines
                else:
                    grown = read_tail(handle, st, tail, found[1], reading, self.context, path.stem, settings)
                    if grown is None:
                        return None
                    chunks, new_tail = grown
                    read_bytes, read_lines = reading.end - tail.open_offset, reading.lines - tail.open_line + 1
                    indexes = list(range(tail.open_index, new_tail.chunk_count))
                    if tail.open_index:  # chunk 0 carries the file's state: rewritten with it, first
                        chunks, indexes = [new_tail.first, *chunks], [0, *indexes]
                    total = new_tail.chunk_count
        except UnsafePath as exc:
            raise _unsafe_skip(exc) from None
        except PermissionError:
            raise FileSkipped("permission_denied", "no read permission") from None
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise ExtractError(f"cannot read: {exc.strerror or exc}") from exc
        except (FileSkipped, ExtractError):
            raise
        except Exception as exc:  # a bug in reading one transcript fails that file, not the batch it came in
            raise ExtractError(f"{type(exc).__name__} reading the transcript: {exc}") from exc
        return Prepared(collection, path, display_path(collection, path), transcripts.KIND, "", st.st_size,
                        st.st_mtime_ns, chunks, st.st_ctime_ns, st.st_ino, st.st_dev, indexes=indexes, total=total,
                        tail=new_tail, read_bytes=read_bytes, read_lines=read_lines)

    # -- step 6-7: embed (cached, batched across files) and build points ----------------------------------------
    def _content(self, chunk: Chunk) -> bytes:
        return chunk.data if chunk.modality != "text" and chunk.data is not None else chunk.embed_text.encode("utf-8")

    def embed(self, prepared: Sequence[Prepared],
              should_stop: Callable[[], bool] | None = None) -> list[list[np.ndarray]]:
        """Per prepared file, one float32 vector per chunk, in chunk order, each of its modality's ``dim`` (a file may
        mix modalities: an image's picture and the text read out of it); cached vectors are reused, misses embedded
        per modality in slices of ``EMBED_SLICE`` chunks, each cached as soon as it is done (and the heap trimmed after
        a full slice, ``trim_heap``). Updates
        ``embedded``/``cache_hits`` of each file and ``stats`` as it goes (so progress shows in ``status``).

        Raises ``Interrupted`` between slices once ``should_stop()`` is true: a huge file never holds up a shutdown
        for long, and the slices already embedded are in the cache for the next run."""
        by_modality: dict[str, list[tuple[int, int]]] = {}
        for f, file in enumerate(prepared):
            for c, chunk in enumerate(file.chunks):
                by_modality.setdefault(chunk.modality, []).append((f, c))
        vectors: dict[tuple[int, int], np.ndarray] = {}  # (file, chunk) -> vector
        for modality, slots in by_modality.items():
            embedder = self.registry.embedders[modality]
            dim = int(embedder.dim)
            # keyed by the embedder's identity (model, precision, fingerprint of its files) where it declares one:
            # weights replaced in place must not be answered with the old model's vectors
            model = str(getattr(embedder, "identity", embedder.model_id))
            keys = [cache_key(model, self._content(prepared[f].chunks[c])) for f, c in slots]
            cached = self.cache.get_many(list(dict.fromkeys(keys)), dim)
            misses: dict[bytes, list[tuple[int, int]]] = {}
            for key, (f, c) in zip(keys, slots):
                if key in cached:
                    vectors[f, c] = cached[key]
                    prepared[f].cache_hits += 1
                else:
                    misses.setdefault(key, []).append((f, c))
            self.stats.cache_hits += len(slots) - sum(len(group) for group in misses.values())
            pending = list(misses.items())
            for start in range(0, len(pending), EMBED_SLICE):
                if should_stop is not None and should_stop():
                    raise Interrupted("stop requested")
                piece = pending[start : start + EMBED_SLICE]
                firsts = [prepared[group[0][0]].chunks[group[0][1]] for _, group in piece]
                # checked before anything is cached or stored: NaN, inf, zero or misshapen vectors raise BadVectors
                fresh = check_vectors(embedder.embed(firsts), len(firsts), dim, f"embedder {embedder.model_id}")
                self.cache.put_many([(key, vector) for (key, _), vector in zip(piece, fresh)])
                for vector, (_, group) in zip(fresh, piece):
                    for n, (f, c) in enumerate(group):
                        vectors[f, c] = vector
                        if n == 0:
                            prepared[f].embedded += 1
                        else:
                            prepared[f].cache_hits += 1
                self.stats.chunks_embedded += len(piece)
                self.stats.cache_hits += sum(len(group) - 1 for _, group in piece)
                if len(piece) == EMBED_SLICE:  # a big file's slice: a note's save (a few chunks) is not slowed
                    trim_heap()
        return [[vectors[f, c] for c in range(len(file.chunks))] for f, file in enumerate(prepared)]

    def points(self, file: Prepared, vectors: Sequence[np.ndarray], start: int = 0) -> list[Point]:
        """The Qdrant points of one embedded file: deterministic ids, payload with path, lines and hash. ``start``:
        ``vectors`` are those of ``file.chunks[start:]`` (a slice of a file written in slices)."""
        out = []
        abs_path = str(file.path)
        indexes = file.indexes if file.indexes is not None else range(len(file.chunks))
        for index, chunk, vector in zip(islice(indexes, start, None), islice(file.chunks, start, None), vectors):
            sparse: dict[str, tuple[list[int], list[float]]] = {}
            terms = self.terms.document(chunk.embed_text)
            if terms is not None:
                sparse[SPARSE] = terms
            payload = Payload(
                agent=file.collection.agent, collection=file.collection.name, path=file.rel_path, abs_path=abs_path,
                file_hash=file.file_hash, size_bytes=file.size_bytes, mtime_ns=file.mtime_ns, ctime_ns=file.ctime_ns,
                inode=file.inode, device=file.device, chunk_index=index,
                chunk_count=file.chunk_count, start_line=chunk.start_line, end_line=chunk.end_line, text=chunk.text,
                context=chunk.context, kind=chunk.kind, modality=chunk.modality,
                model_id=self.registry.embedders[chunk.modality].model_id, chunking_version=chunking.CHUNKING_VERSION,
                start_s=None if chunk.start_s is None else float(chunk.start_s),
                end_s=None if chunk.end_s is None else float(chunk.end_s),
                tail=file.tail.record() if index == 0 and file.tail is not None else None, extra=dict(chunk.meta))
            point = point_id(file.collection.name, abs_path, index)
            out.append(Point(point, {chunk.modality: vector}, sparse, payload))
        return out
