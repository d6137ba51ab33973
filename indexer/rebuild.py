"""Safe rebuilds: one process per state dir, each collection's model identity, and rebuilding beside the live index.

- ``hold_state_lock(state_dir)``: ``Indexer.open`` takes ``<state_dir>/daemon.lock`` before anything else under the
  state dir is created or opened, so two daemons never build, sweep or swap the same store; it also keeps the state
  dir private (0700).
- Model identity: ``model_identity`` names what made the vectors and chunks (each embedder's identity, the chunking
  version). ``<state_dir>/collection-identity.json`` records it per collection (``record_identity``); at every
  ``Indexer.connect``, ``check_identity`` compares it with the configured one and, on a change, asks for a rebuild
  (``on_model_change = "rebuild"``) or refuses to start (``"refuse"``).
- ``rebuild(indexer)`` (run by the worker, ``indexer.worker``) fills a new collection beside each live one from the
  files on disk (vectors from the embedding cache, so only what is not cached is embedded), then ``Store.swap``s
  them in; searches answer from the old collections meanwhile. A crash mid-rebuild leaves the old ones serving, and
  ``Indexer.connect`` sweeps the leftovers at the next start. ``request_rebuild(indexer)`` (``POST /reindex``) asks
  the worker for one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from indexer import chunking
from indexer.errors import CollectionMismatch, ExtractError, FileSkipped, StateReadOnly, StoreLocked
from indexer.pipeline import Prepared
from indexer.safeio import lock_exclusive
from indexer.workspace import walk

if TYPE_CHECKING:
    from indexer.daemon import Indexer

log = structlog.get_logger("qmd_indexer.daemon")

IDENTITY_FILE = "collection-identity.json"  # under the state dir: collection name -> model_identity()
REBUILD_BATCH_FILES = 32  # files prepared before each write of a rebuild (as the worker's BATCH_FILES)

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


def record_identity(state_dir: Path, names: Iterable[str], identity: str) -> None:
    """Record ``identity`` for the collections ``names`` in ``<state_dir>/collection-identity.json`` (the others
    keep theirs); written beside and renamed over, so a crash leaves the old record or the new one."""
    path = state_dir / IDENTITY_FILE
    record = _read_identities(state_dir)
    record.update({name: identity for name in names})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(path)


def check_identity(indexer: Indexer) -> None:
    """Compare each collection's recorded identity with the configured one: on a change, ask for a rebuild (or
    raise ``CollectionMismatch`` with ``on_model_change = "refuse"``), naming both. Unrecorded ones are recorded."""
    state_dir = indexer.settings.state_dir
    record = _read_identities(state_dir)
    current = model_identity(indexer.registry.embedders)
    names = [c.name for c in indexer.collections]
    changed = {name: record[name] for name in names if name in record and record[name] != current}
    if changed and not indexer.rebuild_requested.is_set():
        indexed_with = sorted(set(changed.values()))
        if indexer.settings.on_model_change == "refuse":
            raise CollectionMismatch(
                f"collections {sorted(changed)} were built with {'; '.join(indexed_with)}, but the configuration "
                f"says {current}; rebuild them with `qmd-indexer index --once --reindex` (or `run --reindex`), "
                f"or set on_model_change = \"rebuild\"")
        log.warning("model_changed", collections=sorted(changed), indexed_with=indexed_with, configured=current,
                    action="rebuild")
        indexer.rebuild_requested.set()
    record_identity(state_dir, [name for name in names if name not in record], current)


# -- rebuilding ------------------------------------------------------------------------------------------------------
def request_rebuild(indexer: Indexer) -> None:
    """Ask the worker for a ``rebuild(indexer)`` (``POST /reindex``); returns at once."""
    indexer.rebuild_requested.set()
    indexer.settler.wake()


def rebuild(indexer: Indexer) -> bool:
    """Rebuild every collection beside the live one and swap the new ones in when all are complete (the worker
    calls it; searches meanwhile answer from the old collections). Vectors come from the embedding cache where
    it has them. Returns False, leaving the old collections serving and the new ones for ``connect()`` to sweep,
    when a stop was requested or the store failed; raises ``StoreUnavailable`` from the store's own calls."""
    indexer.rebuild_requested.clear()
    indexer.rebuilding = True
    pipeline, store = indexer.pipeline, indexer.store
    started, before = time.monotonic(), pipeline.stats.chunks_embedded
    try:
        dims = pipeline.dense_dims()
        into = {c.name: store.rebuild_target(c.name) for c in indexer.collections}
        log.info("rebuild_started", collections=into)
        for target in into.values():
            store.ensure_collection(target, dims)
        found, _ = walk(indexer.collections)  # skips are logged by the scan that follows
        batch: list[Prepared] = []
        for n, (collection, path) in enumerate(found, 1):
            try:
                result = pipeline.prepare(collection, path, None)
                if isinstance(result, Prepared):
                    batch.append(result)
            except (OSError, FileSkipped, ExtractError):
                pass  # gone, skipped or failing: the scan after the swap logs it as usual
            if len(batch) >= REBUILD_BATCH_FILES or n == len(found):
                if indexer.write(batch, into) or indexer.stopping.is_set():
                    log.warning("rebuild_abandoned", reason="stop requested or store unavailable",
                                hint="the old collections keep serving; the next start sweeps the new ones")
                    return False
                batch = []
        for collection in indexer.collections:
            store.swap(collection.name, into[collection.name])
        record_identity(indexer.settings.state_dir, list(into), model_identity(indexer.registry.embedders))
        indexer.connect()
        log.info("rebuild_finished", files=len(indexer.indexed), seconds=round(time.monotonic() - started, 2),
                 chunks_embedded=pipeline.stats.chunks_embedded - before)
        return True
    finally:
        indexer.rebuilding = False
