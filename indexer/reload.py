"""``SIGHUP`` (``systemctl reload qmd-indexer``): read the config again and apply what can change while running.

The signal handler only calls ``Reloader.request`` (on a thread of its own, so it takes no lock in the handler):
that sends ``RELOADING=1`` and wakes the worker, which calls ``Reloader.apply`` between batches, then sends
``READY=1`` (sd_notify(3); systemd 253's ``Type=notify-reload`` protocol, also understood with ``Type=notify``).

- Live (``LIVE``): the workspaces, and ``default_agent`` that names one of them. A new workspace gets its
  collections (created, identity recorded), is watched and indexed; a removed one stops being watched and
  searched at once, and its collections are dropped (``Store.drop``: its Qdrant collections, or with shared tenancy
  its points alone; one ``collections_dropped`` line). The embedding cache keeps their vectors, so a workspace
  dropped by a typo comes back by fixing the file and reloading with nothing embedded again. A store that cannot be
  reached then leaves them (one ``store_unavailable`` line; a later reload or ``Store.drop`` removes them). A
  workspace whose path or extra paths changed is re-planned: files no longer under its roots lose their points at
  the scan that follows, as at a restart, and a collection it no longer has (an extra path removed) is dropped.
- Everything else (``port``, ``host``, ``state_dir``, ``model``, ``token``, the Qdrant and search settings...)
  is read once at start: a difference is logged once as ``config_reload_needs_restart`` naming the keys, and the
  running values are kept.
- Plugins: the installed distributions are read again (``importlib.metadata``), so a plugin installed while the
  daemon runs is loaded (``plugins_reloaded``), the running ones kept as they are (their models stay loaded), and a
  scan follows so the files of a kind it newly claims are indexed. A plugin set whose embedders differ (a new
  modality or model) changes the collections' vectors: it is not applied, one ``plugins_need_restart`` line says so.
  The ``plugins``, ``prefer``, ``reranker`` and ``[plugin.*]`` settings stay the running ones (they need a restart).
- A config that does not load (bad TOML, an unknown key, a bad value, an unknown media kind), plugins that do not
  (``prefer`` conflict) or a store that refuses the new collections: one ``config_reload_failed`` error line, the
  running config and plugins are kept whole.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from indexer.config import Settings
from indexer.errors import CollectionMismatch, ConfigError, StoreUnavailable
from indexer.plugins import Registry, load_registry, plugin_configs
from indexer.state import Plan
from indexer.statedir import record_identity
from indexer.walk import overlaps

if TYPE_CHECKING:
    from indexer.daemon import Indexer
    from indexer.systemd import Notifier

log = structlog.get_logger("qmd_indexer.daemon")

LIVE = ("workspace", "default_agent")  # settings applied without a restart


class Reloader:
    """Reloads ``indexer``'s settings from ``load`` (the same config file, environment and flags the daemon
    started with: ``load_settings`` raising ``ConfigError``); ``notifier`` gets ``RELOADING=1``."""

    def __init__(self, indexer: Indexer, load: Callable[[], Settings], notifier: Notifier | None = None) -> None:
        self.indexer, self.load, self.notifier = indexer, load, notifier
        self.requested = threading.Event()

    def request(self) -> None:
        """Ask for a reload (any thread): ``RELOADING=1`` now, the worker applies it next."""
        log.info("config_reload_requested")
        if self.notifier is not None:
            self.notifier.reloading()
        self.requested.set()
        self.indexer.settler.wake()

    def apply(self) -> bool:
        """Read the config and apply its live settings (the worker calls it). Returns True when the collections
        changed: the caller then watches the new set and scans it. Never raises for a bad config or store."""
        self.requested.clear()
        indexer = self.indexer
        old = indexer.settings
        try:
            new = self.load()
            registry = self._plugins(old)
            registry.check_multimodal({w.agent: w.multimodal.modalities for w in new.workspace
                                       if w.multimodal.enabled})
            if not new.workspace:
                raise ConfigError("no workspace configured")
        except ConfigError as exc:
            return self._failed(str(exc))
        plugins_changed = registry is not indexer.registry
        if plugins_changed:  # before the plan swap below: a searcher made for the new plan sees the new plugins
            indexer.pipeline.registry = registry  # their one holder: the indexer and the status view read it there
        restart = sorted(key for key in type(old).model_fields
                         if key not in LIVE and getattr(new, key) != getattr(old, key))
        if restart:
            log.warning("config_reload_needs_restart", settings=restart,
                        hint="these settings are read at start; restart the daemon to apply them")
        plan = Plan.of(old.model_copy(update={key: getattr(new, key) for key in LIVE}))
        before_agents = {w.agent: w for w in old.workspace}
        after_agents = {w.agent: w for w in plan.settings.workspace}
        before = indexer.collections
        changed = plan.collections != before
        if changed:
            try:  # creates the new collections, records their identity, reads what is indexed, then swaps the plan
                indexer.connect(plan)
            except (CollectionMismatch, StoreUnavailable) as exc:
                return self._failed(str(exc))
            for overlap in overlaps(plan.collections):
                log.warning("workspaces_overlap", detail=overlap)
            self._drop({c.name for c in before} - {c.name for c in plan.collections})
        else:
            indexer.state.swap_plan(plan)  # the same collections: readers see the old plan or the new one, whole
        log.info("config_reloaded", added=sorted(after_agents.keys() - before_agents.keys()),
                 removed=sorted(before_agents.keys() - after_agents.keys()),
                 changed=sorted(a for a in after_agents.keys() & before_agents.keys()
                                if after_agents[a] != before_agents[a]),
                 collections=[c.name for c in plan.collections], needs_restart=restart)
        if plugins_changed and not changed:  # (changed: the worker scans the new collections anyway)
            try:
                indexer.settler.add_many(indexer.scan("reload", reconcile=False))  # files of a newly claimed kind
            except StoreUnavailable as exc:
                log.error("store_unavailable", error=str(exc))
        return changed

    def _drop(self, names: set[str]) -> None:
        """Drop the collections ``names`` (no longer configured) from the store and the identity record."""
        if not names:
            return
        try:
            for name in sorted(names):
                self.indexer.store.drop(name)
        except StoreUnavailable as exc:
            log.error("store_unavailable", error=str(exc), action="kept the removed collections")
            return
        record_identity(self.indexer.settings.state_dir, names, None)
        log.info("collections_dropped", collections=sorted(names), reason="no longer configured")

    def _plugins(self, settings: Settings) -> Registry:
        """The installed plugins read again, with the running ``settings``' plugin options (``load_registry`` with
        ``keep``): a new ``Registry`` when the set of plugins or their status changed, else the running one (also
        when only the embedders would change: that needs a restart, logged once). Raises ``ConfigError``."""
        running = self.indexer.registry
        importlib.invalidate_caches()  # a distribution installed since start is seen, and importable
        registry = load_registry(settings.plugins, plugin_configs(settings), settings.prefer,
                                 reranker=settings.reranker, keep=running)
        before, after = _listing(running), _listing(registry)
        if before == after:
            return running
        added, removed = sorted(after - before), sorted(before - after)
        if registry.embedders != running.embedders:
            log.warning("plugins_need_restart", added=added, removed=removed,
                        hint="the embedders changed, and with them the collections' vectors: restart the daemon "
                             "to use them")
            return running
        log.info("plugins_reloaded", added=added, removed=removed)
        return registry

    def _failed(self, error: str) -> bool:
        self.indexer.metrics.error("config_reload_failed")
        log.error("config_reload_failed", error=error, action="kept the running config")
        return False


def _listing(registry: Registry) -> set[str]:
    """Each plugin of ``registry`` as ``group/name distribution version status`` (what ``plugins_reloaded`` names)."""
    return {f"{r.group.rsplit('.', 1)[-1]}/{r.name} {r.distribution} {r.version} {r.status}" for r in registry.records}
