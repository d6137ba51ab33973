"""One file through its source's reader, then embedding and point building. No I/O to the store.

``Pipeline.prepare(collection, path, known)`` refuses what is no regular file, then hands the file to its
collection's reader (``indexer.sources``: notes are classified and extracted, transcripts read whole or from their
tail) and returns what it gives: ``Unchanged`` (nothing to do) or ``Prepared`` (the file's chunks), or raises
``FileSkipped`` / ``ExtractError`` with the reason, or ``FileNotFoundError`` when the file is gone (the caller then
deletes its points). ``Pipeline.embed(prepared_files)`` embeds the chunks of many files in one batch per modality
(so small files still fill the model's batches), reusing cached vectors, and ``Pipeline.points`` builds the points.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from indexer import chunking, sources
from indexer.api import Chunk, ExtractContext, check_vectors
from indexer.bm25 import Bm25Terms
from indexer.cache import EmbeddingCache, cache_key
from indexer.config import Settings
from indexer.contract import EMBEDDERS, declared
from indexer.errors import FileSkipped, PluginError
from indexer.plugins import Registry
from indexer.points import SPARSE, FileState, Payload, Point, point_id
from indexer.redact import Redactor
from indexer.sources.base import Prepared, ReadSetup, Unchanged
from indexer.workspace import Collection

EMBED_SLICE = 256  # chunks per embedding call: long enough to keep the model's batches full, short enough to stop


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


@dataclass(slots=True)
class Stats:
    """Counters since start, shown by ``status``."""

    chunks_embedded: int = 0
    cache_hits: int = 0


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
        """The redactor of ``collection``'s chunks (its reader's policy, ``indexer.sources.redactor``)."""
        return sources.redactor(self._redact_settings, collection)

    @property
    def context(self) -> ExtractContext:
        if self._context is None:
            self._context = ExtractContext(self.text_embedder.max_tokens, self.text_embedder.token_offsets)
        return self._context

    def dense_dims(self) -> dict[str, int]:
        """Named vector -> size, for every loaded embedder (``{"text": 384}``, plus ``"image"`` with CLIP)."""
        return {modality: int(e.dim) for modality, e in self.registry.embedders.items()}

    # -- step 3-5: refuse what is no regular file, then the source's reader ---------------------------------------
    def prepare(self, collection: Collection, path: Path, known: FileState | None) -> Prepared | Unchanged:
        """``path`` of ``collection`` read by its source's reader (``indexer.sources.Reader.prepare``) against
        ``known`` (what the store holds of it). Raises ``FileNotFoundError`` (gone: the caller deletes its points),
        ``FileSkipped`` (``symlink``, ``not_regular_file`` and the reader's reasons) and ``ExtractError``."""
        st = os.lstat(path)  # FileNotFoundError: the caller deletes the file's points
        if stat.S_ISLNK(st.st_mode):
            raise FileSkipped("symlink", "symlinks are never followed")
        if not stat.S_ISREG(st.st_mode):
            raise FileSkipped("not_regular_file", "a FIFO, socket or device")
        setup = ReadSetup(self.registry, self.context, self.max_file_bytes, self.sessions_max_file_bytes,
                          self.redactor(collection))
        return sources.reader(collection).prepare(setup, collection, path, known, st)

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
            model = str(declared(EMBEDDERS, embedder, "identity") or embedder.model_id)
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
        tail = file.tail_state.record() if file.tail_state is not None else None  # chunk 0 carries it
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
                tail=tail if index == 0 else None, extra=dict(chunk.meta))
            point = point_id(file.collection.name, abs_path, index)
            out.append(Point(point, {chunk.modality: vector}, sparse, payload))
        return out
