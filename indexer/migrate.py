"""Moving from the embedded store to a Qdrant server without embedding anything again.

``migrate(source, target)`` copies every collection of ``source`` (Qdrant Edge under ``<state_dir>/qdrant``) into
``target`` under the same name: each point with its id, dense and sparse vectors and payload, read page by page
(``Store.scroll_points``). It is idempotent and resumable: point ids are deterministic (``indexer.points.point_id``),
so copying a point again overwrites it with itself, and a point the target already holds at the same content hash is
not sent again, so a run stopped half way (Ctrl-C, a network failure) continues where it stopped. Files the target
holds that the source no longer has (or holds at another content hash, from an earlier run) are removed from the
target, so it ends equal to the source.

The embedded store can be opened by one process only: while a daemon runs on it, opening it raises
``StoreLocked``; stop the daemon first.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from indexer.points import Point
from indexer.store.base import SCROLL_PAGE, Store


@dataclass(frozen=True, slots=True)
class Migrated:
    """One collection's migration: ``points`` in the source, ``copied`` sent this run, ``skipped`` already in the
    target at the same content hash, ``files_removed`` files whose stale points were deleted from the target."""

    collection: str
    points: int
    copied: int
    skipped: int
    files_removed: int


def migrate(source: Store, target: Store, page: int = SCROLL_PAGE,
            progress: Callable[[str, int], None] | None = None) -> list[Migrated]:
    """Copy every collection of ``source`` into ``target`` (created there with the same vectors if missing); see
    the module docstring. ``page`` is the number of points read and upserted at a time; ``progress(collection,
    points_done)`` is called after each page. Raises ``StoreLocked`` when the embedded source is held by a daemon,
    ``StoreUnavailable`` when the target cannot be reached (run it again: it resumes), ``CollectionMismatch`` when
    a target collection has other vector sizes."""
    done = []
    for name, dense in source.collections().items():
        target.ensure_collection(name, dense)
        held = {(p.abs_path, p.chunk_index): p.file_hash
                for p in target.scroll(name, ["abs_path", "chunk_index", "file_hash"])}
        source_hashes: dict[str, set[str]] = defaultdict(set)
        batch: list[Point] = []
        points = copied = 0
        for point in source.scroll_points(name, page):
            p = point.payload
            points += 1
            source_hashes[p.abs_path].add(p.file_hash)
            if held.get((p.abs_path, p.chunk_index)) != p.file_hash:
                batch.append(point)
            if len(batch) >= page:
                target.upsert(name, batch)
                copied += len(batch)
                batch = []
            if progress and points % page == 0:
                progress(name, points)
        if batch:
            target.upsert(name, batch)
            copied += len(batch)
        removed = 0
        target_hashes: dict[str, set[str]] = defaultdict(set)
        for (abs_path, _), file_hash in held.items():
            target_hashes[abs_path].add(file_hash)
        for abs_path, hashes in target_hashes.items():
            wanted = source_hashes.get(abs_path)
            if not wanted:
                target.delete_file(name, abs_path)
                removed += 1
            elif len(wanted) == 1 and not hashes <= wanted:  # an older version copied by an earlier run
                target.replace_file(name, abs_path, next(iter(wanted)), [])
                removed += 1
        done.append(Migrated(name, points, copied, points - copied, removed))
    return done
