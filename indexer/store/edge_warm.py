"""What loading an Edge shard costs in memory: the search files of a cold shard brought into the page cache after it
loads, on a background thread (``Warmer``), and the room a load takes on tmpfs (``load_room_bytes``), as a write
does (``CREATE_BYTES``, ``DELETE_BYTES``, ``points_bytes``).

On tmpfs a read fault on a hole of a mapped file allocates a page (on ext4 it maps a zero page and allocates
nothing), so what a restart adds to the store is what ``EdgeShard.load`` reads through its maps
(``madvise(MADV_POPULATE_READ)``, seen with strace on qdrant-edge-py 0.9.0): the payload indexes of the appendable
segment, in every memory tier. Qdrant holds those in RAM and loads them from preallocated Gridstore files
(qdrant/qdrant ``lib/segment/src/index/field_index/index_selector.rs``: an appendable segment always uses
``IndexSelector::Gridstore``; ``map_index/mutable_map_index/lifecycle.rs``: ``open_gridstore`` opens it with
``Populate::Blocking``): ``page_0.dat`` (4 MiB per keyword index, 2 MiB per integer lookup or range index) and
``tracker.dat`` (1 MiB), mostly holes in a small store (``POPULATED_AT_LOAD``). No setting of qdrant-edge-py 0.9.0
avoids that: about 33 MiB per collection, once (a second restart adds nothing; a new page as the store grows,
at the next restart), known before the load. In Edge's default tier the dense vectors' 32 MiB chunk is read
through too (``POPULATED_UNLESS_COLD``), so ``EdgeStore`` creates every collection on tmpfs in the cold tier,
and without the integer lookup map it never uses. The payload storage, sparse vectors and write-ahead log
(32 MiB files) stay sparse. ``benchmarks/tmpfs_restart.py``, 16 notes (two collections), MiB allocated at the
first start -> the first restart: 30.8 -> 166.6 with the vectors cached (+64.0 vectors, +71.9 payload indexes),
28.8 -> 100.7 cold, 28.5 -> 94.6 cold without the lookup map (docs/performance.md, "Qdrant Edge").
``load_room_bytes`` is that growth, checked before a load; replaying the write-ahead log after a crash writes a
few MiB more (5 MiB after 10,000 unflushed points), within the ``state_min_free_bytes`` margin.

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
import stat
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import structlog

from indexer.points import Point

log = structlog.get_logger("qmd_indexer.store")

SEARCH_FILES = ("segments/*/vector_storage-*/quantized.data", "segments/*/vector_index-*/*")
READ_BYTES = 4 * 1024 * 1024  # one pread; a stop request is seen between reads
# Free space a write needs beyond the margin, from what writes touched on tmpfs (docs/performance.md, "Qdrant
# Edge"); deletes append small write-ahead log records.
CREATE_BYTES = 16 * 1024 * 1024
POINT_FACTOR = 3
DELETE_BYTES = 1024 * 1024


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


# What ``EdgeShard.load`` reads through in a shard's folder (see the module docstring): always, and unless the dense
# vectors are in the cold tier
POPULATED_AT_LOAD = ("segments/*/payload_index/*/page_*.dat", "segments/*/payload_index/*/tracker.dat")
POPULATED_UNLESS_COLD = ("segments/*/vector_storage-*/vectors/*",)


def unallocated_bytes(paths: Iterable[Path]) -> int:
    """Bytes of the files ``paths`` not yet backed by storage: apparent size minus allocated blocks (``st_size -
    st_blocks * 512``), summed; a missing file counts 0."""
    total = 0
    for path in paths:
        try:
            st = path.lstat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            total += max(0, st.st_size - st.st_blocks * 512)
    return total


def load_room_bytes(shard_dir: Path, vectors_cold: bool) -> int:
    """Bytes that loading the shard in ``shard_dir`` allocates on tmpfs: the holes of the files it reads through
    (``POPULATED_AT_LOAD``, and ``POPULATED_UNLESS_COLD`` when ``vectors_cold`` is false); 0 for a missing folder."""
    patterns = POPULATED_AT_LOAD + (() if vectors_cold else POPULATED_UNLESS_COLD)
    return unallocated_bytes(p for pattern in patterns for p in shard_dir.glob(pattern))



def points_bytes(points: Sequence[Point]) -> int:
    """About how many bytes writing ``points`` touches (``POINT_FACTOR`` x vectors, sparse terms and text)."""
    raw = sum(4 * sum(v.size for v in p.dense.values()) + 8 * sum(len(i) for i, _ in p.sparse.values())
              + len(p.payload.text.encode()) + 512 for p in points)
    return POINT_FACTOR * raw


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
