"""What makes rebuilds safe: one process per state dir, and each collection's model identity.

- One process per state dir: ``Indexer.open`` takes ``<state_dir>/daemon.lock`` before anything else under the
  state dir is created or opened (``statedir.hold_state_lock``), so two daemons never build, sweep or swap the same
  store.
- Model identity: ``model_identity`` names what made the vectors and chunks (each embedder's identity, the chunking
  version). ``<state_dir>/collection-identity.json`` records it per collection (``statedir.record_identity``); at every
  ``Indexer.connect``, ``check_identity`` compares it with the configured one and, on a change, asks for a rebuild
  (``on_model_change = "rebuild"``) or refuses to start (``"refuse"``).
- Workspace identity: ``attest`` records which filesystem object each workspace path is
  (``<state_dir>/attestations.json``), so a restored backup or a re-created directory is re-hashed rather than
  trusted by size and mtime.

The rebuild itself is ``rebuild_beside`` (``Indexer.rebuild``): it fills a new collection beside each live one and
swaps them in; ``StatusView.request_rebuild`` (``POST /reindex``) asks the worker for one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from indexer import chunking
from indexer.config import Settings, Workspace
from indexer.contract import EMBEDDERS, declared
from indexer.errors import CollectionMismatch
from indexer.statedir import (
    read_identities,
    read_record,
    record_identity,
    recorded_identities,
    recorded_tenancy,
    write_record,
)
from indexer.store.layout import ServerOptions

log = structlog.get_logger("qmd_indexer.daemon")

# -- model identity --------------------------------------------------------------------------------------------------
def model_identity(embedders: Mapping[str, Any]) -> str:
    """What made the vectors and chunks (a str): each embedder's ``identity`` (model, precision, fingerprint of its
    files; ``model_id`` for one without), by modality, and ``chunking.CHUNKING_VERSION``."""
    models = ", ".join(f"{modality}={declared(EMBEDDERS, e, 'identity') or e.model_id}"
                       for modality, e in sorted(embedders.items()))
    return f"{models}; chunking={chunking.CHUNKING_VERSION}"


def daemon_options(settings: Settings, embedders: Mapping[str, Any]) -> ServerOptions:
    """The store options handed to a daemon's store (``ServerOptions.from_settings``, tenancy ``"auto"`` as the state
    dir recorded it for this server: ``statedir.recorded_tenancy``); with a server whose tenancy may be (or become)
    ``"shared"``, ``space`` is the embedders' identity (``model_identity``; a remote embedder's asks its server)
    and ``former_spaces`` the identities the state dir recorded before (a model change)."""
    options = ServerOptions.from_settings(settings, recorded_tenancy(settings.state_dir, settings.qdrant_url))
    if not settings.qdrant_url or options.tenancy == "collections":
        return options
    space = model_identity(embedders)
    return replace(options, space=space,
                   former_spaces=tuple(s for s in recorded_identities(settings.state_dir) if s != space))


def check_identity(settings: Settings, names: Sequence[str], embedders: Mapping[str, Any],
                   rebuild_requested: threading.Event) -> None:
    """Compare the recorded identity of each collection of ``names`` with ``embedders``' (``model_identity``): on a
    change, set ``rebuild_requested`` (or raise ``CollectionMismatch`` with ``on_model_change = "refuse"``), naming
    both. Unrecorded ones are recorded under ``settings.state_dir``."""
    state_dir = settings.state_dir
    record = read_identities(state_dir)
    current = model_identity(embedders)
    changed = {name: record[name] for name in names if name in record and record[name] != current}
    if changed and not rebuild_requested.is_set():
        indexed_with = sorted(set(changed.values()))
        if settings.on_model_change == "refuse":
            raise CollectionMismatch(
                f"collections {sorted(changed)} were built with {'; '.join(indexed_with)}, but the configuration "
                f"says {current}; rebuild them with `qmd-indexer index --once --reindex` (or `run --reindex`), "
                f"or set on_model_change = \"rebuild\"")
        log.warning("model_changed", collections=sorted(changed), indexed_with=indexed_with, configured=current,
                    action="rebuild")
        rebuild_requested.set()
    record_identity(state_dir, [name for name in names if name not in record], current)


# -- workspace identity ----------------------------------------------------------------------------------------------
def attest(workspaces: Sequence[Workspace], record: Path) -> list[Workspace]:
    """Record which filesystem object (device, inode) each workspace path is, in the JSON file ``record``
    (``{agent: {"path", "dev", "ino"}}``, replaced atomically); return the workspaces whose path now names another
    object than last time (a restored backup, a re-created directory), each logged as ``workspace_reattested``.
    A missing workspace is left out of the record (the scan reports it: ``workspace_missing``); an unreadable or
    damaged record counts as empty. Raises ``OSError`` when the record cannot be written."""
    previous = read_record(record)
    current: dict[str, dict[str, str | int]] = {}
    changed: list[Workspace] = []
    for ws in workspaces:
        try:
            st = os.stat(ws.path)
        except OSError:  # a scan reports it (``walk.path_problems``), once
            continue
        current[ws.agent] = {"path": str(ws.path), "dev": st.st_dev, "ino": st.st_ino}
        old = previous.get(ws.agent)
        if not (isinstance(old, dict) and old.get("path") == str(ws.path)):
            continue  # a new workspace, another path, or a damaged entry: this one is recorded afresh
        if (old.get("dev"), old.get("ino")) != (st.st_dev, st.st_ino):
            changed.append(ws)
            log.warning("workspace_reattested", agent=ws.agent, path=str(ws.path),
                        old_inode=old.get("ino"), new_inode=st.st_ino)
    if current != previous:
        write_record(record, current)
    return changed


# -- the rebuild -----------------------------------------------------------------------------------------------------
REBUILD_BATCH_FILES = 32  # files prepared before each write of a rebuild (as the worker's BATCH_FILES)


def rebuild_beside(indexer: Any, pace: Any = None) -> bool:
    """Rebuild every collection of ``indexer`` (an ``indexer.daemon.Indexer``) beside the live one and swap the new
    ones in when all are complete (searches meanwhile answer from the old collections). Vectors come from the
    embedding cache where it has them, so only what is not cached is embedded. Returns False, leaving the old
    collections serving and the new ones for ``connect()`` to sweep at the next start, when ``pace``'s stop (an
    ``indexer.sync.Pace``) was set or the store failed; raises ``StoreUnavailable`` from the store's own calls."""
    import time

    from indexer.walk import walk

    store, stats, collections = indexer.store, indexer.pipeline.stats, indexer.collections
    with indexer.state.rebuilding_now():
        started, before = time.monotonic(), stats.chunks_embedded
        dims = indexer.pipeline.dense_dims()
        into = {c.name: store.rebuild_target(c.name) for c in collections}
        log.info("rebuild_started", collections=into)
        for target in into.values():
            store.ensure_collection(target, dims)
        found, _ = walk(collections)  # skips are logged by the scan that follows
        if not indexer.sync.fill(found, into, REBUILD_BATCH_FILES, pace):
            log.warning("rebuild_abandoned", reason="stop requested or store unavailable",
                        hint="the old collections keep serving; the next start sweeps the new ones")
            return False
        for collection in collections:
            store.swap(collection.name, into[collection.name])
        record_identity(indexer.settings.state_dir, list(into), model_identity(indexer.registry.embedders))
        indexer.connect()
        log.info("rebuild_finished", files=len(indexer.state.indexed), seconds=round(time.monotonic() - started, 2),
                 chunks_embedded=stats.chunks_embedded - before)
        return True
