"""Shared tenancy of a Qdrant server: the logical collections as tenants of shared physical collections.

Tenancy (``ServerOptions.tenancy``): with ``"collections"`` every logical collection (``memory-root-<agent>``...) is a
Qdrant collection of its own. With ``"shared"`` the logical collections are tenants of shared physical collections,
one per kind (``root``, ``dir``, ``extra``, ``sessions``) and embedding space (``shared_collection``: the name
carries a digest of the embedders' identity, so two models never mix): each point's payload carries its agent and
its logical collection, the logical collection's name is the tenant key (a keyword index with ``is_tenant``), HNSW
graphs are built per tenant (``payload_m``, global ``m=0``). ``TenantStore._where`` is the one place a logical name
becomes a physical collection plus the tenant condition; every primitive that reads or writes points goes through it,
so callers (the daemon, search, recall, migrate) name logical collections only and never see another tenant's points.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from typing import Any

import structlog

from indexer.errors import StoreUnavailable
from indexer.store.base import SCROLL_PAGE, Store
from indexer.store.claims import CLAIMS
from indexer.store.layout import REBUILD, SHARED, TENANT_KEY, ServerOptions, shared_collection
from indexer.store.retry import retried

log = structlog.get_logger("qmd_indexer.store")

class TenantStore(Store):
    """The store operations that differ with shared tenancy (``shared``), over a qdrant-client ``client`` and its
    ``models`` module (``_m``): ``_where`` and ``_scoped`` put every primitive that reads or writes points on the
    right physical collection and tenant; ``swap``, ``sweep``, ``drop`` and ``collections`` move, delete and list
    tenants instead of collections. With tenancy ``"collections"`` each is ``Store``'s own. ``ServerStore`` is the
    concrete store."""

    client: Any
    _m: Any
    options: ServerOptions
    shared: bool
    auto: bool  # tenancy "auto" not settled yet (``settle``)
    # logical collection -> another model's shared collection that holds its live points, until a rebuild into this
    # model's is swapped in (``_find_live``)
    _lives: dict[str, str]

    def _physical_config(self, name: str) -> dict[str, int] | None:
        """The dense vectors (name -> size) of physical collection ``name``, ``None`` when it does not exist."""
        raise NotImplementedError

    def settle(self, names: Collection[str]) -> None:
        """Settle tenancy ``"auto"`` (the default) for the collections ``names`` (the daemon's, at its first
        ``connect``): ``"collections"`` when the server already holds one of them as a Qdrant collection (or alias)
        of its own, a deployment from before shared tenancy, kept as it is until ``qmd-indexer migrate`` moves it;
        else ``"shared"`` (docs/operations.md, "Many agents", says why from measurements). One
        ``qdrant_tenancy_settled`` line. A set tenancy, or one settled before, is kept. Raises ``StoreUnavailable``
        when the server cannot be asked (the next ``connect`` asks again)."""
        if not self.auto:
            return
        with self._lock:
            self.auto = False
            try:
                held = sorted((set(self._names()) | set(self._read_aliases())) & set(names))
            except BaseException:
                self.auto = True
                raise
            self.shared = not held
        log.info("qdrant_tenancy_settled", tenancy="shared" if self.shared else "collections",
                 reason=f"the server holds {', '.join(held)} as Qdrant collections" if held else
                 "no collection of these agents on the server as a Qdrant collection of its own",
                 hint="`qmd-indexer migrate --from URL --tenancy shared` moves them into shared collections"
                 if held else None)

    @property
    def tenancy(self) -> str:
        """The layout: ``"collections"``, ``"shared"``, or ``"auto"`` until ``settle``."""
        return "auto" if self.auto else "shared" if self.shared else "collections"

    # the one place a logical collection becomes a physical one and a tenant condition
    def _where(self, name: str) -> tuple[str, Any | None]:
        """The physical collection that holds logical collection ``name`` and the condition that selects its points
        there: ``(name, None)`` with tenancy ``"collections"``; with ``"shared"``, ``shared_collection(name)`` and
        ``payload.collection == name`` (for ``<name>--rebuild-<n>``: the staging collection, ``== name``). Raises
        ``StoreUnavailable`` while tenancy ``"auto"`` is not settled (``settle``)."""
        if self.auto:
            raise StoreUnavailable("the store's tenancy is not settled yet (the daemon is connecting)")
        if not self.shared:
            return name, None
        logical, _, rebuild = name.partition(REBUILD)
        physical = self._lives.get(logical) if not rebuild else None
        return physical or shared_collection(name, self.options.space), self.dialect.match(TENANT_KEY, logical)

    def ensure_collection(self, name: str, dense: dict[str, int]) -> None:
        """See ``Store.ensure_collection``. With shared tenancy, a logical collection that has no points in this
        model's shared collection but has some in the shared collection of a former model (``former_spaces``: the
        state dir's record) keeps answering from there: a model change, whose rebuild fills this model's and
        ``swap`` moves it over."""
        if self.shared and REBUILD not in name:
            with self._lock:
                self._find_live(name)
        super().ensure_collection(name, dense)

    def _find_live(self, name: str) -> None:
        own = shared_collection(name, self.options.space)
        self._lives.pop(name, None)
        names = self._names()
        if own in names and self._count(name):
            return
        for physical in (shared_collection(name, space) for space in self.options.former_spaces):
            if physical in names and self._tenant_points(physical, name, delete=False):
                self._lives[name] = physical
                log.info("tenant_on_other_model", collection=name, physical=physical,
                         hint="searches answer from it until a rebuild into this model's collection is swapped in")
                return

    @retried()
    def _tenant_points(self, physical: str, name: str, delete: bool) -> int:
        """The number of points of tenant ``name`` in shared collection ``physical``; with ``delete``, deletes
        them (returns 0)."""
        flt = self._m.Filter(must=[self.dialect.match(TENANT_KEY, name)])
        if delete:
            self.guard(name)
            self.client.delete(physical, points_selector=self._m.FilterSelector(filter=flt), wait=True)
            return 0
        return int(self.client.count(physical, count_filter=flt, exact=True).count)

    def _scoped(self, name: str, flt: Any = None) -> tuple[str, Any]:
        """``_where(name)`` with the tenant condition joined to ``flt`` (a translated filter, or ``None``): the
        filter every read and write of ``name``'s points carries."""
        physical, tenant = self._where(name)
        if tenant is None:
            return physical, flt
        return physical, self._m.Filter(must=[tenant] if flt is None else [tenant, flt])

    def _target(self, name: str) -> str:
        # shared tenancy resolves names in ``_where``, per primitive; no aliases are involved
        return name if self.shared else super()._target(name)

    def rebuild_target(self, name: str) -> str:
        """See ``Store.rebuild_target``; with shared tenancy ``<name>--rebuild-1``, a tenant of the staging
        collection beside ``name``'s shared collection."""
        return f"{name}{REBUILD}1" if self.shared else super().rebuild_target(name)

    def swap(self, name: str, new: str) -> None:
        """See ``Store.swap``. With shared tenancy, ``name``'s points from the staging collection (``new``) are
        upserted over its live ones (same ids for unchanged chunks), its live points absent from them deleted, the
        staged ones removed, and its points in the shared collections of the models before (``former_spaces``)
        deleted; all under the store's lock, so this process's searches see the old set or the new."""
        if not self.shared:
            super().swap(name, new)
            return
        with self._lock:
            other_model = self._lives.pop(name, None)
            if self._dense_config(name) is None:  # a model change: the first tenant swapped into this model's
                self._create(name, self._dense_config(new) or {})
            staged: set[str] = set()
            offset: Any = None
            while True:
                points, offset = self._points_page(new, offset, SCROLL_PAGE)
                self._upsert(name, points)
                staged.update(p.id for p in points)
                if offset is None:
                    break
            stale = [pid for pid in self._ids(name) if pid not in staged]
            for start in range(0, len(stale), SCROLL_PAGE):
                self._delete_ids(name, stale[start:start + SCROLL_PAGE])
            self._drop(new)
            # the tenant's points of the models before: the one it answered from, and any a swap cut short left
            # behind (it had reached this model's collection, so it never answered from there again)
            names = self._names()
            for physical in {other_model, *(shared_collection(name, space) for space in self.options.former_spaces)}:
                if physical is not None and physical in names:
                    self._tenant_points(physical, name, delete=True)

    def sweep(self, name: str) -> list[str]:
        """See ``Store.sweep``; with shared tenancy, deletes ``name``'s points from the staging collection (a rebuild
        cut short) and returns ``[<name>--rebuild-1]`` when there were any."""
        if not self.shared:
            return super().sweep(name)
        with self._lock:
            staging = self.rebuild_target(name)
            if self._where(staging)[0] not in self._names() or not self._count(staging):
                return []
            self._drop(staging)
            return [staging]

    def drop(self, name: str) -> None:
        """See ``Store.drop``; with shared tenancy, deletes ``name``'s points only (an agent removed), leaving the
        shared collection and every other tenant's points."""
        if not self.shared:
            super().drop(name)
            return
        with self._lock:
            self._drop(name)

    def collections(self) -> dict[str, dict[str, int]]:
        """See ``Store.collections``; with shared tenancy, the logical collections (the tenant key's values) of
        every shared collection of this store's embedding space, each with its shared collection's dense vectors."""
        if not self.shared:
            return {name: dense for name, dense in super().collections().items() if name != CLAIMS}
        space = shared_collection("", self.options.space).rpartition("-")[2]
        with self._lock:
            out: dict[str, dict[str, int]] = {}
            for physical in self._names():
                if physical.startswith(SHARED) and physical.endswith(f"-{space}"):
                    config = self._physical_config(physical)
                    for tenant in self._facet(physical):
                        if config is not None:
                            out[tenant] = config
            return dict(sorted(out.items()))

    @retried()
    def _facet(self, physical: str) -> list[str]:
        hits = self.client.facet(physical, TENANT_KEY, limit=1_000_000, exact=True).hits
        return [str(h.value) for h in hits if h.count]

    def _ids(self, name: str) -> Iterator[str]:
        offset: Any = None
        while True:
            ids, offset = self._ids_page(name, offset)
            yield from ids
            if offset is None:
                return

    @retried()
    def _ids_page(self, name: str, offset: Any) -> tuple[list[str], Any]:
        physical, flt = self._scoped(name)
        records, offset = self.client.scroll(physical, scroll_filter=flt, limit=SCROLL_PAGE, offset=offset,
                                             with_payload=False, with_vectors=False)
        return [str(r.id) for r in records], offset

    def _has_id(self, ids: Sequence[str]) -> Any:
        """A filter on point ids ``ids``."""
        any_ids: list[Any] = list(ids)
        return self._m.Filter(must=[self._m.HasIdCondition(has_id=any_ids)])

    @retried(write=True)
    def _delete_ids(self, name: str, ids: list[str]) -> None:
        self.guard(name)
        physical, flt = self._scoped(name, self._has_id(ids))
        self.client.delete(physical, points_selector=self._m.FilterSelector(filter=flt), wait=True)
