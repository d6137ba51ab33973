"""What loading an Edge shard costs in memory: the search files of a cold shard brought into the page cache after it
loads, on a background thread (``Warmer``), and the room a load takes on tmpfs (``unallocated_bytes``).

On tmpfs, loading a shard maps its preallocated, sparse files (the vectors' 32 MiB chunk, 4 MiB payload index maps,
32 MiB payload and sparse-vector pages) and the read faults of those maps allocate tmpfs pages: a 16-note store grew
from 33 to 168 MB at its first restart. Other file systems map holes without allocating (1.2 MB both times on ext4).
``EdgeStore`` creates every collection on tmpfs in the cold tier, so a load maps its vectors without reading them:
that restart now grows the store 29 -> 101 MB (the rest is the payload indexes' maps, loaded in every tier), and
before a load ``unallocated_bytes`` says how much room it may take.

A shard created with ``qdrant_on_disk_vectors`` has its vectors, int8 copy, HNSW graph and payload indexes in
Qdrant's ``cold`` tier: ``EdgeShard.load`` maps them and reads nothing, so a restart at a million points loads in
well under a second. But Qdrant also drops those files from the page cache when a shard is closed (``posix_fadvise(
DONTNEED)``), so after every restart each new query read its pages from disk, several times slower than from the
page cache (docs/performance.md, "Qdrant Edge"). ``posix_fadvise(WILLNEED)`` is no substitute: the kernel reads
ahead only a few MiB of a file per call. So a thread reads the files through once (``pread``, the GIL released
while it reads), after the load and without holding up anything: the daemon is ready at once and fast a moment
later.

Which files: the ones every search reads, by Qdrant's segment layout (``segments/<id>/vector_index-<vector>/``: the
HNSW graph of a dense vector, the inverted index of the sparse one; ``vector_storage-<vector>/quantized.data``:
the int8 copy). The original vectors (``matrix.dat``) stay on disk, as configured; rescoring reads about as many
of them as a search's prefetch limit. Files Qdrant renames in a later version are simply not warmed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import structlog

log = structlog.get_logger("qmd_indexer.store")

SEARCH_FILES = ("segments/*/vector_storage-*/quantized.data", "segments/*/vector_index-*/*")
READ_BYTES = 4 * 1024 * 1024  # one pread; a stop request is seen between reads


def search_files(shard_dir: Path) -> list[Path]:
    """The files of the shard in ``shard_dir`` that searches read (see the module docstring), int8 copies first."""
    return [p for pattern in SEARCH_FILES for p in sorted(shard_dir.glob(pattern)) if p.is_file()]


def read_through(paths: Iterable[Path], stop: threading.Event) -> int:
    """Read each file once from start to end (into one reused buffer) so that its pages are in the page cache.
    Returns the bytes read; stops early when ``stop`` is set. A file that vanishes or cannot be read (a shard
    dropped meanwhile) is passed over."""
    buffer = bytearray(READ_BYTES)
    total = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            while not stop.is_set():
                n = os.readv(fd, [buffer])
                if n <= 0:
                    break
                total += n
        except OSError:
            pass
        finally:
            os.close(fd)
    return total


def unallocated_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` not yet backed by storage: apparent size minus allocated blocks
    (``st_size - st_blocks * 512``), summed; 0 for a missing folder."""
    total = 0
    for path in folder.rglob("*"):
        try:
            st = path.lstat()
        except OSError:
            continue
        if path.is_file():
            total += max(0, st.st_size - st.st_blocks * 512)
    return total


class Warmer:
    """Background threads that warm shards (``warm``), stopped and joined by ``close``."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def warm(self, name: str, shard_dir: Path) -> None:
        """Start reading the search files of shard ``name`` (in ``shard_dir``) in the background; one log line
        ``store_warmed`` (collection, files, bytes, seconds) when done."""
        self._threads = [t for t in self._threads if t.is_alive()]
        stop = self._stop

        def run() -> None:
            started = time.perf_counter()
            files = search_files(shard_dir)
            done = read_through(files, stop)
            log.info("store_warmed", collection=name, files=len(files), bytes=done,
                     seconds=round(time.perf_counter() - started, 3), stopped=stop.is_set())

        thread = threading.Thread(target=run, name=f"qmd-warm-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until every warming thread is done; ``False`` if one still runs after ``timeout_s`` seconds."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in list(self._threads):
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def close(self) -> None:
        """Stop the warming threads (within one read each) and join them."""
        self._stop.set()
        self.wait()
        self._threads.clear()
        self._stop = threading.Event()
