"""What makes rebuilds safe: one process per state dir, and each collection's model identity.

- ``hold_state_lock(state_dir)``: ``Indexer.open`` takes ``<state_dir>/daemon.lock`` before anything else under the
  state dir is created or opened, so two daemons never build, sweep or swap the same store; it also keeps the state
  dir private (0700).
- Model identity: ``model_identity`` names what made the vectors and chunks (each embedder's identity, the chunking
  version). ``<state_dir>/collection-identity.json`` records it per collection (``record_identity``); at every
  ``Indexer.connect``, ``check_identity`` compares it with the configured one and, on a change, asks for a rebuild
  (``on_model_change = "rebuild"``) or refuses to start (``"refuse"``).
- Workspace identity: ``attest`` records which filesystem object each workspace path is
  (``<state_dir>/attestations.json``), so a restored backup or a re-created directory is re-hashed rather than
  trusted by size and mtime.

The rebuild itself is ``rebuild_beside`` (``Indexer.rebuild``): it fills a new collection beside each live one and
swaps them in; ``StatusView.request_rebuild`` (``POST /reindex``) asks the worker for one.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from indexer import chunking
from indexer.config import Settings, Workspace
from indexer.errors import CollectionMismatch, StateReadOnly, StoreLocked
from indexer.safeio import lock_exclusive

log = structlog.get_logger("qmd_indexer.daemon")

IDENTITY_FILE = "collection-identity.json"  # under the state dir: collection name -> model_identity()

_STATE_LOCKS: dict[Path, int] = {}  # state dir -> fd of its daemon.lock, held until this process exits


def hold_state_lock(state_dir: Path) -> None:
    """Take ``<state_dir>/daemon.lock`` (``fcntl.flock``, exclusive) for the rest of this process's life, before
    anything else under ``state_dir`` is created or opened: two daemons started at once on an empty state dir
    would otherwise both create the store and the loser delete the winner's new files. Taking it again in the
    same process is a no-op (tests open several indexers on one state dir).

    The state holds the notes' text, so it is kept private to this user: the directory is created 0700 and the
    lock file 0600, whatever the umask (``qmd-indexer run`` and ``index`` also set umask 077, which covers the files
    the store and the cache create); an existing state dir that group or others can read or enter is made
    0700/0600 throughout (directories/files, symlinks left alone), logged once as ``state_dir_tightened``.

    Raises ``StoreLocked`` when another process holds it, ``StateReadOnly`` when the lock file cannot be created
    because the state dir is read-only (or not writable by this user)."""
    import errno
    import os

    state_dir = state_dir.resolve()
    if state_dir in _STATE_LOCKS:
        return
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = lock_exclusive(state_dir / "daemon.lock", f"the state directory {state_dir}")
    except StoreLocked:
        raise
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise StateReadOnly(f"the state directory {state_dir} is read-only ({exc.strerror}); make it "
                                f"writable or choose another with --state-dir") from None
        raise
    _STATE_LOCKS[state_dir] = fd
    try:
        os.fchmod(fd, 0o600)
        if os.stat(state_dir).st_mode & 0o077:
            log.warning("state_dir_tightened", state_dir=str(state_dir), entries=_make_private(state_dir),
                        detail="group or others could read the state directory; now 0700 (directories) and 0600 "
                               "(files)")
    except OSError as exc:  # not ours to change (another owner): say so and go on, as before
        log.warning("state_dir_not_private", state_dir=str(state_dir), error=str(exc))


def _make_private(root: Path) -> int:
    """Remove group and other bits from ``root`` and everything under it (symlinks untouched); returns how many
    entries changed."""
    import os
    import stat

    changed = 0
    for path in [root, *root.rglob("*")]:
        mode = os.lstat(path).st_mode
        if not stat.S_ISLNK(mode) and mode & 0o077:
            os.chmod(path, stat.S_IMODE(mode) & 0o700)
            changed += 1
    return changed


# -- model identity --------------------------------------------------------------------------------------------------
def model_identity(embedders: Mapping[str, Any]) -> str:
    """What made the vectors and chunks (a str): each embedder's ``identity`` (model, precision, fingerprint of its
    files; ``model_id`` for one without), by modality, and ``chunking.CHUNKING_VERSION``."""
    models = ", ".join(f"{modality}={getattr(e, 'identity', e.model_id)}" for modality, e in sorted(embedders.items()))
    return f"{models}; chunking={chunking.CHUNKING_VERSION}"


def _read_identities(state_dir: Path) -> dict[str, str]:
    try:
        record: dict[str, str] = json.loads((state_dir / IDENTITY_FILE).read_text())
    except (FileNotFoundError, ValueError):
        record = {}
    return record


def recorded_collections(state_dir: Path) -> list[str]:
    """The collections whose model identity ``state_dir`` records (the daemon's collections), sorted."""
    return sorted(_read_identities(state_dir))


def recorded_identities(state_dir: Path) -> list[str]:
    """The model identities recorded for the collections under ``state_dir``, sorted, each once."""
    return sorted(set(_read_identities(state_dir).values()))


def recorded_identity(state_dir: Path) -> str:
    """The one model identity recorded for the collections under ``state_dir`` (``""`` when none is recorded): what
    names the shared collections their points belong in (``ServerOptions.space``). Raises ``ValueError`` when the
    collections were built with different ones (a rebuild cut short): rebuild before moving them."""
    identities = recorded_identities(state_dir)
    if len(identities) > 1:
        raise ValueError(f"the collections under {state_dir} were built with different models "
                         f"({'; '.join(identities)}); rebuild them first with `qmd-indexer index --once --reindex`")
    return identities[0] if identities else ""


def record_identity(state_dir: Path, names: Iterable[str], identity: str | None) -> None:
    """Record ``identity`` for the collections ``names`` in ``<state_dir>/collection-identity.json`` (the others
    keep theirs; ``None``: forget them, dropped collections); written beside and renamed over, so a crash leaves the
    old record or the new one."""
    path = state_dir / IDENTITY_FILE
    record = _read_identities(state_dir)
    for name in names:
        if identity is None:
            record.pop(name, None)
        else:
            record[name] = identity
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(path)


TENANCY_FILE = "qdrant-tenancy.json"  # under the state dir: Qdrant server URL -> the layout "auto" settled on there


def recorded_tenancy(state_dir: Path, url: str) -> str | None:
    """The layout (``"collections"`` or ``"shared"``) that tenancy ``"auto"`` settled on for the server at ``url``
    under ``state_dir`` (or that ``migrate`` moved it to), ``None`` when none is recorded."""
    try:
        record: dict[str, str] = json.loads((state_dir / TENANCY_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return record.get(url.rstrip("/"))


def record_tenancy(state_dir: Path, url: str, tenancy: str) -> None:
    """Record ``tenancy`` for the server at ``url`` in ``<state_dir>/qdrant-tenancy.json``, so a later start keeps
    it (an agent added since, holding Qdrant collections of its own, does not flip the layout); written beside and
    renamed over."""
    path = state_dir / TENANCY_FILE
    try:
        record: dict[str, str] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        record = {}
    if record.get(url.rstrip("/")) == tenancy:
        return
    record[url.rstrip("/")] = tenancy
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(path)


def check_identity(settings: Settings, names: Sequence[str], embedders: Mapping[str, Any],
                   rebuild_requested: threading.Event) -> None:
    """Compare the recorded identity of each collection of ``names`` with ``embedders``' (``model_identity``): on a
    change, set ``rebuild_requested`` (or raise ``CollectionMismatch`` with ``on_model_change = "refuse"``), naming
    both. Unrecorded ones are recorded under ``settings.state_dir``."""
    state_dir = settings.state_dir
    record = _read_identities(state_dir)
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
    A missing workspace is logged as ``workspace_missing`` and left out of the record; an unreadable record counts
    as empty. Raises ``OSError`` when the record cannot be written."""
    try:
        previous = json.loads(record.read_text())
    except (OSError, ValueError):
        previous = {}
    current: dict[str, dict[str, str | int]] = {}
    changed: list[Workspace] = []
    for ws in workspaces:
        try:
            st = os.stat(ws.path)
        except OSError:
            log.warning("workspace_missing", agent=ws.agent, path=str(ws.path))
            continue
        current[ws.agent] = {"path": str(ws.path), "dev": st.st_dev, "ino": st.st_ino}
        old = previous.get(ws.agent)
        if old and old["path"] == str(ws.path) and (old["dev"], old["ino"]) != (st.st_dev, st.st_ino):
            changed.append(ws)
            log.warning("workspace_reattested", agent=ws.agent, path=str(ws.path),
                        old_inode=old["ino"], new_inode=st.st_ino)
    if current != previous:
        tmp = record.with_suffix(".tmp")
        tmp.write_text(json.dumps(current, indent=1))
        tmp.replace(record)
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
