"""Moving an index between stores and layouts without embedding anything again.

``migrate(source, target)`` copies every collection of ``source`` into ``target`` under the same name: from the
embedded store (Qdrant Edge under ``<state_dir>/qdrant``) to a Qdrant server, or on a server from one tenancy layout
to the other (``collections``: a Qdrant collection per logical collection; ``shared``: tenants of shared
collections). The store layer hides the layout, so the copy is the same in every case: each point with its id, dense
and sparse vectors and payload, read page by page (``Store.scroll_points``). It is idempotent and resumable: point
ids are deterministic (``indexer.points.point_id``), so copying a point again overwrites it with itself, and a point
the target already holds at the same content hash is not sent again, so a run stopped half way (Ctrl-C, a network
failure) continues where it stopped. Files the target holds that the source no longer has (or holds at another
content hash, from an earlier run) are removed from the target, so it ends equal to the source. Each collection is
then counted in the target: ``Migrated.verified`` says the counts agree, and only then may ``drop_sources`` delete
it from the source.

The embedded store can be opened by one process only: while a daemon runs on it, opening it raises
``StoreLocked``; stop the daemon first. ``open_stores`` builds both ends for ``qmd-indexer migrate``: a server source
is limited to the collections the state dir's daemon recorded (``collection-identity.json``), and the state dir's
lock is taken, so its daemon cannot write while they move. ``record_tenancy`` writes the layout a server ended in
(``<state_dir>/qdrant-tenancy.json``: after a move, or what tenancy ``"auto"`` settled on), which the next start keeps.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from indexer.points import Point
from indexer.statedir import (
    edge_store,
    hold_state_lock,
    read_record,
    recorded_collections,
    recorded_identity,
    recorded_tenancy,
    tenancy_file,
    write_record,
)
from indexer.store.base import SCROLL_PAGE, Store
from indexer.store.server import ServerStore


@dataclass(frozen=True, slots=True)
class Migrated:
    """One collection's migration: ``points`` in the source, ``copied`` sent this run, ``skipped`` already in the
    target at the same content hash, ``files_removed`` files whose stale points were deleted from the target,
    ``in_target`` the target's exact count afterwards."""

    collection: str
    points: int
    copied: int
    skipped: int
    files_removed: int
    in_target: int

    @property
    def verified(self) -> bool:
        """Whether the target holds as many points of the collection as the source."""
        return self.in_target == self.points


def migrate(source: Store, target: Store, page: int = SCROLL_PAGE,
            progress: Callable[[str, int], None] | None = None,
            names: Collection[str] | None = None) -> list[Migrated]:
    """Copy every collection of ``source`` (only those in ``names``, if given) into ``target`` (created there with
    the same vectors if missing); see the module docstring. ``page`` is the number of points read and upserted at a
    time; ``progress(collection, points_done)`` is called after each page. Raises ``StoreLocked`` when the embedded
    source is held by a daemon, ``StoreUnavailable`` when the target cannot be reached (run it again: it resumes),
    ``CollectionMismatch`` when a target collection has other vector sizes."""
    done = []
    for name, dense in source.collections().items():
        if names is not None and name not in names:
            continue
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
        done.append(Migrated(name, points, copied, points - copied, removed, target.count(name)))
    return done


def drop_sources(source: Store, results: list[Migrated]) -> list[str]:
    """Delete from ``source`` each collection of ``results`` whose copy was verified (``Store.drop``: a Qdrant
    collection, or a tenant's points of a shared one); returns the names dropped. One not verified is kept."""
    dropped = []
    for r in results:
        if r.verified:
            source.drop(r.collection)
            dropped.append(r.collection)
    return dropped


def open_stores(settings: Any, to_url: str, from_url: str = "", tenancy: str | None = None,
                from_tenancy: str | None = None, api_key: str = "") -> tuple[Store, ServerStore, list[str] | None]:
    """The ``(source, target, names)`` of a ``qmd-indexer migrate`` with ``settings`` (``indexer.config.Settings``):
    the embedded store under ``settings.state_dir`` (``from_url`` empty; ``names`` ``None``: all of it), or the server
    at ``from_url`` in layout ``from_tenancy`` (default: the other layout when it is the target server, else the
    configured one) with ``names`` the collections the state dir recorded; the target, the server at ``to_url`` in
    layout ``tenancy`` (default: the configured one; ``"shared"`` from a server when that is ``"auto"``). A layout
    ``"auto"`` is settled as the daemon settles it (``TenantStore.settle``). Shared collections are named by the
    model identity the state dir recorded. Raises ``ValueError`` for a state dir without what is asked (no embedded
    store, no recorded collections, several models), ``StoreLocked`` when its daemon runs, ``StoreUnavailable``."""
    from indexer.store import EdgeStore, ServerOptions

    state_dir: Path = settings.state_dir
    options = replace(ServerOptions.from_settings(settings, recorded_tenancy(state_dir, settings.qdrant_url)),
                      space=recorded_identity(state_dir))
    key = api_key or settings.qdrant_api_key
    recorded = recorded_collections(state_dir)
    if not from_url:
        if not edge_store(state_dir).is_dir():
            raise ValueError(f"no embedded store under {state_dir} (nothing to migrate); pass --state-dir")
        source: Store = EdgeStore(edge_store(state_dir))
        names = None
        tenancy = tenancy or settings.qdrant_tenancy
    else:
        if not recorded:
            raise ValueError(f"{state_dir} records no collections: pass the --state-dir of the daemon whose "
                             f"collections to move")
        names = recorded
        tenancy = tenancy or (settings.qdrant_tenancy if settings.qdrant_tenancy != "auto" else "shared")
        if from_tenancy is None:  # the other layout on the same server, else the one its daemon runs in
            from_tenancy = ({"collections": "shared", "shared": "collections"}[tenancy] if from_url == to_url
                            else recorded_tenancy(state_dir, from_url) or settings.qdrant_tenancy)
        if from_url == to_url and from_tenancy == tenancy:
            raise ValueError(f"--from and --to are the same server in the same layout ({tenancy}): nothing to move")
        hold_state_lock(state_dir)  # its daemon stopped, and it stays so while the points move
        source = ServerStore(from_url, key, replace(options, tenancy=from_tenancy))
        source.settle(recorded)
    target = ServerStore(to_url, key, replace(options, tenancy=tenancy))
    target.settle(recorded or list(source.collections()))
    if isinstance(source, ServerStore) and source.tenancy == target.tenancy and source.same_server(target):
        source.close()
        target.close()
        raise ValueError(f"{from_url} and {to_url} are the same server, and the layout is the same "
                         f"({target.tenancy}): nothing to move")
    return source, target, names


def record_tenancy(state_dir: Path, url: str, tenancy: str) -> None:
    """Record ``tenancy`` for the server at ``url`` in ``<state_dir>/qdrant-tenancy.json``
    (``statedir.tenancy_file``), so a later start keeps it (an agent added since, holding Qdrant collections of its
    own, does not flip the layout); written beside and renamed over, and only when it changed."""
    path = tenancy_file(state_dir)
    record = read_record(path)
    if record.get(url.rstrip("/")) == tenancy:
        return
    record[url.rstrip("/")] = tenancy
    write_record(path, record)
