"""The indexed state of every file of an Edge collection without reading every point's payload.

``Store.file_states`` scrolls the payload of every point (one page of 1,024 at a time): at a million points that is
most of a restart. Here, from keyword
indexes and each file's chunk 0 instead (its id is ``point_id(collection, abs_path, 0)``; one ``retrieve`` per 1,024
files), in one of three ways:

- Keys (a clean shard whose chunk 0s carry ``file_state``, ``indexer.points.state_key``): the approximate facets of
  ``abs_path`` and ``file_state`` list the files with their point counts and their states; taken when each listed
  file has exactly one state, whose ``chunk_count`` equals its count, and the counts add up to the exact point
  count (the same check as the fast way below, with the state read off the keyword index instead of chunk 0's
  payload: Qdrant drops a cold shard's payload pages from the page cache when it closes it, so after a restart
  each chunk-0 read is a page fault).
- Fast (a clean shard): Qdrant's approximate facet of ``abs_path`` (per-value counts read off the keyword index,
  not checked point by point) lists the files and their points. The shard is taken as consistent when every
  listed file has a chunk 0 whose ``chunk_count`` equals its count and the exact point count equals the sum of
  the counts: every file is then complete. Why that suffices on Edge: a file is written by ``replace_file`` as one
  upsert of all its points (one write-ahead-log record, applied whole or not at all after a crash) and then one
  delete of its other versions, so a file is never short of points; a file too big for one write
  (``indexer.sync``) loses its chunk 0 first and gets its new one last, so while it is short of points it has no
  chunk 0 (not listed by the checks: the exact way). What a crash can leave is extra points (an old version's
  tail, points of a file without a chunk 0), which make a file's count or the total exceed what the chunk 0s
  say. Anything else takes the exact way. Each way's cost: docs/performance.md, "Qdrant Edge".
- Exact (otherwise): Qdrant's exact facet counts of ``abs_path`` (points per file) and of ``file_hash`` (points per
  content hash). A file is ``complete`` when its points number its chunk 0's ``chunk_count`` and the points of its
  hash add up: the points of all files whose chunk 0 has hash ``h`` equal the facet count of ``h`` (a file left with
  points of two versions breaks that sum, as the scroll's "one hash per file" check would; files of identical
  content share the sum, so such a file also marks its twins incomplete: they are re-indexed, no harm). A file
  without a chunk 0 is read by the scroll, filtered to it.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from indexer.points import STATE_FIELDS, STATE_KEY, FileState, Filter, Payload, parse_state_keys, point_id
from indexer.store.base import SCROLL_PAGE
from indexer.store.dialect import Dialect, file_states

HASH_FIELD = "file_hash"  # keyword-indexed on Edge collections, for the facet

log = structlog.get_logger("qmd_indexer.store")


def file_states_by_facets(shard: Any, qe: Any, dialect: Dialect, collection: str, points: int,
                          page: int = SCROLL_PAGE, fast: bool = True) -> dict[str, FileState]:
    """``abs_path -> FileState`` of the Edge ``shard`` (``qe``: the ``qdrant_edge`` module; ``dialect``: its
    filter translation) of logical collection ``collection``, which holds exactly ``points`` points (see the module
    docstring; ``fast=False``: the exact way only). Needs the keyword indexes of ``abs_path`` and ``file_hash``.
    Logs ``file_states_read`` with the way taken (``keys``, ``fast`` or ``exact``) and its seconds."""
    started = time.perf_counter()
    reader = _ShardReader(shard, qe, dialect, collection, points, page)
    found = reader.fast_states() if fast else None
    states, way = found if found is not None else (reader.exact_states(), "exact")
    log.info("file_states_read", collection=collection, files=len(states), points=points, way=way,
             seconds=round(time.perf_counter() - started, 3))
    return states


@dataclass(frozen=True)
class _ShardReader:
    """The reads of one Edge shard's file states, by each way of the module docstring."""

    shard: Any
    qe: Any
    dialect: Dialect
    collection: str
    points: int
    page: int

    def fast_states(self) -> tuple[dict[str, FileState], str] | None:
        """The states by the keys or the fast way and that way's name; None where the shard fails their check."""
        approximate = self.facet("abs_path", exact=False)
        if sum(approximate.values()) != self.points:  # points beyond whole files somewhere: the exact way
            return None

        def consistent(chunk_counts: dict[str, int]) -> bool:  # the check of the fast ways (module docstring)
            return len(chunk_counts) == len(approximate) and all(
                n == approximate.get(path) for path, n in chunk_counts.items())

        try:
            keyed = parse_state_keys([value for value, n in self.facet(STATE_KEY, exact=False).items() if n == 1])
        except ValueError:  # not written by us, or a file with two states: the other ways
            keyed = {}
        if consistent({path: s.points for path, s in keyed.items()}):
            return keyed, "keys"
        firsts = self.chunk_zeros(list(approximate))
        if consistent({path: first.chunk_count for path, first in firsts.items()}):
            return {path: _state(first, first.chunk_count, True) for path, first in firsts.items()}, "fast"
        return None

    def exact_states(self) -> dict[str, FileState]:
        """The states by the exact way: exact facet counts per file and per content hash."""
        counts, by_hash = self.facet("abs_path"), self.facet(HASH_FIELD)
        paths = list(counts)
        firsts = self.chunk_zeros(paths)
        states: dict[str, FileState] = {}
        for path in paths:
            if path not in firsts:  # no chunk 0 (an interrupted write): read its points
                states.update(file_states(self.scroll_file(path)))
        summed: Counter[str] = Counter()
        for path, first in firsts.items():
            summed[first.file_hash] += counts.get(path, 0)
        for path, first in firsts.items():
            n = counts.get(path, 0)
            states[path] = _state(first, n, n == first.chunk_count and summed[first.file_hash] == by_hash.get(
                first.file_hash, 0))
        return states

    def facet(self, key: str, exact: bool = True) -> dict[str, int]:
        """``value -> points`` of the keyword index ``key`` (``exact=False``: Qdrant's approximate counts)."""
        hits = self.shard.facet(self.qe.FacetRequest(key=key, limit=max(1, self.points), exact=exact)).hits
        return {str(hit.value): int(hit.count) for hit in hits if hit.count}

    def chunk_zeros(self, paths: list[str]) -> dict[str, Payload]:
        """``abs_path -> Payload`` of the chunk 0 of each of ``paths`` that has one (one retrieve per page)."""
        firsts: dict[str, Payload] = {}
        for start in range(0, len(paths), self.page):
            ids = [uuid.UUID(point_id(self.collection, path, 0)) for path in paths[start : start + self.page]]
            for record in self.shard.retrieve(ids, with_payload=list(STATE_FIELDS), with_vector=False):
                payload = Payload.from_payload(dict(record.payload or {}))
                firsts[payload.abs_path] = payload
        return firsts

    def scroll_file(self, abs_path: str) -> Iterator[Mapping[str, Any]]:
        """The state payload of every point of ``abs_path``, page by page."""
        flt, offset = self.dialect.filter(Filter(abs_path=abs_path)), None
        while True:
            records, offset = self.shard.scroll(self.qe.ScrollRequest(
                offset=offset, limit=self.page, filter=flt, with_payload=[*STATE_FIELDS, "chunk_index"],
                with_vector=False))
            yield from (dict(r.payload or {}) for r in records)
            if offset is None:
                return


def _state(first: Payload, n: int, complete: bool) -> FileState:
    return FileState(first.file_hash, first.size_bytes, first.mtime_ns, n, complete, first.ctime_ns,
                     first.inode, first.device)
