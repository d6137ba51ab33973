"""The backend-neutral store: its public operations and its lock.

Each backend (``edge.py``, ``server.py``) implements the ``_``-prefixed primitives and hands a ``Dialect`` (the
model classes of its client library; ``indexer.store.dialect``, the one translation of filters and queries) to the
store, so a filter or query is written once.

``replace_file`` upserts a file's new points and deletes its points of any other content hash while holding the
store's lock, and every query takes that lock too, so a search never sees two versions of one file.

Rebuilds never touch the collection being searched: every public operation takes a collection's name and resolves
it to the physical collection behind it (an alias: Qdrant's own on a server, ``aliases.json`` for Edge; without one,
the collection of that name). A rebuild fills ``rebuild_target(name)`` (``<name>--rebuild-<n>``) beside it and
``swap(name, new)`` points the name at it in one step, then drops the old one; ``sweep(name)`` removes what an
interrupted rebuild or swap left behind.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

import structlog

from indexer.errors import CollectionMismatch
from indexer.points import NO_PAYLOAD, STATE_FIELDS, FileState, Filter, Hit, Payload, Point, Query
from indexer.store.dialect import Dialect, file_states
from indexer.store.layout import REBUILD, PerTenant

log = structlog.get_logger("qmd_indexer.store")

SCROLL_PAGE = 1024  # payloads per scroll request


class Store:
    """Backend-neutral base: subclasses implement the ``_``-prefixed primitives; this class holds the lock.

    ``degraded`` is true while writes to the store are failing (a server backend retrying or giving up)."""

    kind = "abstract"
    degraded = False

    def __init__(self, dialect: Dialect) -> None:
        self._lock = threading.RLock()
        self.dialect = dialect
        self._alias_map: dict[str, str] | None = None
        self._settings_reported: set[str] = set()  # collections whose settings difference was logged

    def _settings_differ(self, name: str, differ: dict[str, dict[str, Any]]) -> None:
        """Log ``collection_settings_differ`` for ``name`` once per store (the check runs at every open and
        reconcile): ``differ`` maps a setting to ``{"collection": as created, "configured": as configured}``."""
        if differ and name not in self._settings_reported:
            self._settings_reported.add(name)
            log.warning("collection_settings_differ", collection=name, differ=differ,
                        hint="settings apply when a collection is created; it is used as it is. To apply them, "
                             "rebuild it with `qmd-indexer index --once --reindex`")

    # names and rebuilds ----------------------------------------------------------------------------------------
    def _target(self, name: str) -> str:
        """The physical collection behind ``name`` (call with the lock held)."""
        if self._alias_map is None:
            self._alias_map = self._read_aliases()
        return self._alias_map.get(name, name)

    def rebuild_target(self, name: str) -> str:
        """A fresh physical name to rebuild ``name`` into: ``<name>--rebuild-<n>``, ``n`` above any in the store."""
        with self._lock:
            taken = [p[len(name) + len(REBUILD):] for p in self._names() if p.startswith(name + REBUILD)]
            taken.append(self._target(name)[len(name) + len(REBUILD):])
            return f"{name}{REBUILD}{1 + max((int(n) for n in taken if n.isdigit()), default=0)}"

    def swap(self, name: str, new: str) -> None:
        """Make ``name`` answer from physical collection ``new`` (complete, made by ``ensure_collection(new, ...)``)
        in one step, then drop the collection it answered from before. Searches see the old or the new one, whole."""
        with self._lock:
            old = self._target(name)
            self._set_alias(name, new, old)
            self._alias_map = None
            if old != new:
                self._drop(old)

    @property
    def tenancy(self) -> str | None:
        """A server's layout (``TenantStore.tenancy``); ``None`` for the embedded store."""
        return None

    def settle(self, names: Collection[str]) -> None:
        """Settle what depends on the collections ``names`` a daemon serves before its first read or write: a
        server's tenancy ``"auto"`` (``TenantStore.settle``); nothing for the embedded store."""

    # claims (``indexer.store.claims``): a server's; the embedded store has one owner by construction
    def claim(self, owner: Any, wanted: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
        """Claim the logical collections ``wanted`` (name -> (agent, workspace)) for ``owner`` (a
        ``claims.Owner``); returns other owners' claims by agent (``ClaimingStore.claim``). Nothing here."""
        return {}

    def read_claims(self, names: Iterable[str] | None = None) -> dict[str, Any]:
        """The claims of ``names`` (all when ``None``) by logical collection; none here."""
        return {}

    def release(self, names: Sequence[str], owner_id: str | None = None) -> list[Any]:
        """Delete the claims of ``names``; none here."""
        return []

    def guard(self, name: str) -> None:
        """Before a write to ``name``: raise ``claims.NotOwner`` when another owner claims it; nothing here."""

    def check_read(self, name: str) -> None:
        """Before a read of ``name``: raise ``claims.NotOwner`` when its agent was lost to another owner; nothing
        here."""

    def refused_agents(self) -> dict[str, Any]:
        """Agent -> the other owner's ``claims.Claim`` for each agent this daemon does not serve; none here."""
        return {}

    def verify(self) -> dict[str, Any]:
        """Check this daemon's claims; agent -> claim for each lost since (``ClaimingStore.verify``); none here."""
        return {}

    def sweep(self, name: str) -> list[str]:
        """Drop the physical collections of ``name`` that nothing points at (an interrupted rebuild's
        ``<name>--rebuild-<n>``, or the old collection of a swap cut short); returns their names."""
        with self._lock:
            live = self._target(name)
            stale = [p for p in self._names() if p != live and (p == name or p.startswith(name + REBUILD))]
            for physical in stale:
                self._drop(physical)
            return stale

    def ensure_collection(self, name: str, dense: dict[str, int]) -> None:
        """Create collection ``name`` with named vectors ``dense`` (name -> size) plus the BM25 sparse vector, or
        check an existing one. Raises ``CollectionMismatch`` if a vector's size differs; a missing named vector
        (a modality enabled later) is added."""
        with self._lock:
            physical = self._target(name)
            existing = self._dense_config(physical)
            if existing is None:
                self._create(physical, dense)
                return
            for vector, size in dense.items():
                if vector in existing and existing[vector] != size:
                    raise CollectionMismatch(
                        f"collection {name!r} holds {vector!r} vectors of size {existing[vector]}, but the configured "
                        f"embedder makes {size}; the model changed. Rebuild it with "
                        f"`qmd-indexer index --once --reindex` (or `run --reindex`)."
                    )
                if vector not in existing:
                    self._add_vector(physical, vector, size)

    def upsert(self, name: str, points: Sequence[Point]) -> None:
        """Insert or overwrite ``points`` (by id) in ``name``; for bulk loads. The daemon uses ``replace_file``."""
        with self._lock:
            if points:
                self._upsert(self._target(name), points)

    def replace_file(self, name: str, abs_path: str, file_hash: str, points: Sequence[Point]) -> None:
        """Make ``points`` the only points of ``abs_path`` in ``name``: upsert, then delete other hashes."""
        with self._lock:
            physical = self._target(name)
            if points:
                self._upsert(physical, points)
            self._delete(physical, Filter(abs_path=abs_path, except_hash=file_hash))

    def begin_file(self, name: str, abs_path: str) -> None:
        """Delete the chunk 0 of ``abs_path`` in ``name`` (the point that carries the file's state), before a file
        too big for one write is written in slices (``indexer.sync``): until its new chunk 0 comes last (with
        ``replace_file``), the file reads as incomplete (no chunk 0: ``file_states``), so a crash midway is
        re-indexed at the next start, and searches meanwhile see its other points."""
        with self._lock:
            self._delete(self._target(name), Filter(abs_path=abs_path, chunk_index=0))

    def trim_file(self, name: str, abs_path: str, keep: int, had: int) -> None:
        """Delete the points of ``abs_path`` in ``name`` of chunk indexes ``keep`` to ``had - 1`` (a transcript
        whose tail was written over and now ends sooner, ``indexer.sync``)."""
        with self._lock:
            physical = self._target(name)
            for index in range(max(keep, 0), had):
                self._delete(physical, Filter(abs_path=abs_path, chunk_index=index))

    def delete_file(self, name: str, abs_path: str) -> None:
        """Remove every point of ``abs_path`` from ``name``."""
        with self._lock:
            self._delete(self._target(name), Filter(abs_path=abs_path))

    def file_states(self, name: str) -> dict[str, FileState]:
        """``abs_path -> FileState`` for every file with points in ``name`` (one scroll over the payloads)."""
        with self._lock:
            return file_states(self._scroll(self._target(name), [*STATE_FIELDS, "chunk_index"]))

    def search(self, name: str, query: Query, with_payload: bool = True) -> dict[str, list[Hit]]:
        """Run ``query`` on ``name``: vector name (``"text"``, ``"image"``, ``"bm25"``) -> hits, best first.
        ``with_payload=False`` leaves every hit's payload empty (``Payload()``); fetch the few that are kept with
        ``payloads`` (reading a payload per candidate costs more than the vector search at 100k points)."""
        return {using: [Hit(str(pid), float(score), Payload.from_payload(payload) if payload else NO_PAYLOAD)
                        for pid, score, payload in answer]
                for using, answer in self._answers(name, query, with_payload).items()}

    def scores(self, name: str, query: Query) -> dict[str, list[tuple[Any, float]]]:
        """Run ``query`` on ``name`` without payloads: vector name -> ``(point id, score)`` pairs, best first. Ids are
        the backend's own (``uuid.UUID`` from Qdrant Edge, ``str`` from a server), ``str()`` of one is the ``Hit`` id.
        A search's candidates: 2 x 100 at the default prefetch depth, of which it keeps ``k``; a ``Hit`` with a
        string id for each (``search``) took about a third of a search's Python time at 100k points."""
        return {using: [(pid, score) for pid, score, _ in answer]
                for using, answer in self._answers(name, query, False).items()}

    def _answers(self, name: str, query: Query,
                 with_payload: bool) -> dict[str, list[tuple[Any, float, Mapping[str, Any] | None]]]:
        searches = self.dialect.searches(query)
        if not searches:
            return {}
        flt = self.dialect.filter(query.filter)
        self.check_read(name)
        with self._lock:
            return self._query(self._target(name), searches, flt, query, with_payload)

    def payloads(self, name: str, ids: Sequence[str]) -> dict[str, Payload]:
        """Point id -> payload for those of ``ids`` present in ``name`` (one request); absent ids are left out."""
        if not ids:
            return {}
        self.check_read(name)
        with self._lock:
            found = self._retrieve(self._target(name), list(ids))
            return {str(pid): Payload.from_payload(raw or {}) for pid, raw in found}

    def count(self, name: str) -> int:
        """Exact number of points in ``name``."""
        with self._lock:
            return self._count(self._target(name))

    def drop(self, name: str) -> None:
        """Delete collection ``name`` and all its points (and its alias, if it has one)."""
        with self._lock:
            physical = self._target(name)
            if physical != name:
                self._set_alias(name, None, physical)
                self._alias_map = None
            self._drop(physical)

    def scroll(self, name: str, fields: Sequence[str] | None = None) -> list[Payload]:
        """Every payload in ``name`` (only ``fields``, if given; the rest take ``Payload``'s defaults)."""
        with self._lock:
            return [Payload.from_payload(raw)
                    for raw in self._scroll(self._target(name), list(fields) if fields else None)]

    def collections(self) -> dict[str, dict[str, int]]:
        """Every collection in the store by the name it answers to (an alias, or its own name when none points at
        it; rebuilds in progress are left out): name -> its dense vectors (name -> size)."""
        with self._lock:
            physical = self._names()
            self._alias_map = self._read_aliases()
            names = {**{p: p for p in physical if REBUILD not in p}, **self._alias_map}
            configs = {name: self._dense_config(target) for name, target in sorted(names.items()) if target in physical}
            return {name: config for name, config in configs.items() if config is not None}

    # what ``qmd-indexer doctor`` reads of the physical layout (read only) ----------------------------------------
    def physical_names(self) -> list[str]:
        """Every physical collection in the store, sorted: rebuilds' staging collections and (on a server) shared
        collections included, aliases not."""
        with self._lock:
            return sorted(self._names())

    def aliases(self) -> dict[str, str]:
        """Alias -> the physical collection it points at."""
        with self._lock:
            return dict(self._read_aliases())

    def physical_count(self, physical: str, tenant: str | None = None) -> int:
        """Exact number of points in physical collection ``physical`` (no alias resolved), only those of tenant
        ``tenant`` (a logical collection, ``layout.TENANT_KEY``) when given; the embedded store has no tenants, so
        a tenant has 0 points there."""
        with self._lock:
            return self._count(physical) if tenant is None else 0

    def per_tenant(self, physical: str) -> PerTenant | None:
        """How shared collection ``physical`` is indexed per tenant (``PerTenant``); ``None`` where the store has no
        shared collections (the embedded store)."""
        return None

    def scroll_points(self, name: str, page: int = SCROLL_PAGE) -> Iterator[Point]:
        """Every point of ``name`` with its vectors and payload, read ``page`` points per request (the lock is
        held per page, not across the iteration)."""
        offset: Any = None
        while True:
            with self._lock:
                points, offset = self._points_page(self._target(name), offset, page)
            yield from points
            if offset is None:
                return

    def ensure_room(self, need_bytes: int) -> None:
        """Raise ``StateDirFull`` when a write of about ``need_bytes`` bytes would leave too little free space
        (Edge, see ``EdgeStore.ensure_room``); a no-op for a server."""

    def flush(self) -> None:
        """Persist what is buffered (Edge); a no-op for a server."""

    def close(self) -> None:
        """Release the backend (file locks, connections)."""

    # primitives ------------------------------------------------------------------------------------------------
    def _read_aliases(self) -> dict[str, str]:
        """Alias -> the physical collection it points at."""
        raise NotImplementedError

    def _set_alias(self, name: str, new: str | None, old: str) -> None:
        """Point alias ``name`` at ``new`` (``None``: remove it); ``old`` is what it resolved to before (``name``
        itself when it was a plain collection, which the backend may need to delete first)."""
        raise NotImplementedError

    def _dense_config(self, name: str) -> dict[str, int] | None:
        raise NotImplementedError

    def _create(self, name: str, dense: dict[str, int]) -> None:
        raise NotImplementedError

    def _add_vector(self, name: str, vector: str, size: int) -> None:
        raise NotImplementedError

    def _upsert(self, name: str, points: Sequence[Point]) -> None:
        raise NotImplementedError

    def _delete(self, name: str, flt: Filter) -> None:
        raise NotImplementedError

    def _scroll(self, name: str, fields: list[str] | None) -> Iterator[Mapping[str, Any]]:
        raise NotImplementedError

    def _names(self) -> list[str]:
        raise NotImplementedError

    def _points_page(self, name: str, offset: Any, limit: int) -> tuple[list[Point], Any]:
        """Up to ``limit`` points from ``offset`` (``None``: the start), and the next offset (``None``: done)."""
        raise NotImplementedError

    def _query(self, name: str, searches: dict[str, Any], flt: Any, query: Query,
               with_payload: bool) -> dict[str, list[tuple[Any, float, Mapping[str, Any] | None]]]:
        """Per vector name, ``(point id, score, payload or None)`` best first; ``flt`` is already translated."""
        raise NotImplementedError

    def _retrieve(self, name: str, ids: list[str]) -> list[tuple[Any, Mapping[str, Any] | None]]:
        """``(point id, payload)`` for each of ``ids`` that exists."""
        raise NotImplementedError

    def _count(self, name: str) -> int:
        raise NotImplementedError

    def _drop(self, name: str) -> None:
        raise NotImplementedError
