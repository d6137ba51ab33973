"""Every file under the state dir (``settings.state_dir``), in one place: its name, what it holds, its format, who
writes it and who reads it, and the small helpers that read and write the records.

One function per entry, each taking the state dir and returning the path (``NAMES`` lists them all, and
``tests/test_statedir.py`` fails when a daemon leaves anything under the state dir that is not named here):

- ``lock_file``: ``daemon.lock``, the one-daemon-per-state-dir lock (``hold_state_lock``, which also keeps the
  state dir private);
- ``edge_store``: ``qdrant/``, the embedded store (Qdrant Edge; its insides are ``indexer.store.edge``'s);
- ``embedding_cache``: ``embeddings.sqlite3``, the embedding cache (``indexer.cache``);
- ``attestations``: ``attestations.json``, which directory each workspace path is (``rebuild.attest``);
- ``identity_file``: ``collection-identity.json``, the model identity of each collection (helpers below);
- ``tenancy_file``: ``qdrant-tenancy.json``, the layout of each Qdrant server (``migrate.record_tenancy``);
- ``owner_file``: ``owner-id``, this daemon's owner id in server claims (``owner_id``);
- ``openai_dims``: ``openai-embedder.json``, the built-in OpenAI-compatible embedder's vector sizes;
- ``calibration_file``: ``relevance-calibration.json``, the relevance floor measured for each model identity.

Plugins get the state dir as their ``state_dir`` config key and may keep files of their own in it
(``PLUGIN_FILES``: those of the plugins shipped in ``plugins/``). Records are written beside (``<name>.tmp``) and
renamed over, so a crash leaves the old record or the new one; an unreadable record reads as empty.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import structlog

from indexer.errors import StateReadOnly, StoreLocked
from indexer.safeio import lock_exclusive

log = structlog.get_logger("qmd_indexer.daemon")


def lock_file(state_dir: Path) -> Path:
    """``daemon.lock``: empty, 0600; an exclusive ``flock`` on it while a daemon (or ``migrate``) uses the state dir.
    Written and held by ``hold_state_lock`` (``Indexer.open``, ``migrate.open_stores``); read by nobody."""
    return state_dir / "daemon.lock"


def edge_store(state_dir: Path) -> Path:
    """``qdrant/``: the embedded store, one Qdrant Edge shard per collection (with ``.lock``, ``aliases.json`` and
    each shard's folder; see ``indexer.store.edge``). Written by ``EdgeStore`` (opened by ``Indexer.open`` through
    ``store.open_store``), read by ``migrate.open_stores`` (moving it to a server)."""
    return state_dir / "qdrant"


def embedding_cache(state_dir: Path) -> Path:
    """``embeddings.sqlite3``: SQLite (WAL mode: with ``-wal`` and ``-shm`` beside it), (model id, content hash) ->
    float32 vector; a damaged one is set aside as ``embeddings.sqlite3.corrupt-<unix time>``. Written and read by
    ``indexer.cache.EmbeddingCache`` (opened by ``Indexer.open``); disposable."""
    return state_dir / "embeddings.sqlite3"


def attestations(state_dir: Path) -> Path:
    """``attestations.json``: JSON ``{agent: {"path", "dev", "ino"}}``, which filesystem object each workspace path
    was. Written and read by ``rebuild.attest`` (``Indexer._attest``, at every connect)."""
    return state_dir / "attestations.json"


def identity_file(state_dir: Path) -> Path:
    """``collection-identity.json``: JSON ``{collection: model identity}`` (``rebuild.model_identity``). Written by
    ``record_identity`` (``rebuild.check_identity`` and ``rebuild_beside``, ``rename``, ``reload``); read by
    ``read_identities`` and the ``recorded_*`` helpers below (the daemon's options, ``migrate``, ``doctor``)."""
    return state_dir / "collection-identity.json"


def tenancy_file(state_dir: Path) -> Path:
    """``qdrant-tenancy.json``: JSON ``{server URL: "collections" | "shared"}``, the layout tenancy ``"auto"``
    settled on for each server (or that ``migrate`` moved it to). Written by ``migrate.record_tenancy`` (``rename``
    at connect, the ``migrate`` command); read by ``recorded_tenancy`` (the options of every server store)."""
    return state_dir / "qdrant-tenancy.json"


def owner_file(state_dir: Path) -> Path:
    """``owner-id``: one line, a uuid4 hex, 0600; who this daemon is in a server's claims (``store.claims``).
    Written once by ``owner_id`` (``rename.placed``, at the first claim); read by ``owner_id`` and ``doctor``."""
    return state_dir / "owner-id"


def openai_dims(state_dir: Path) -> Path:
    """``openai-embedder.json``: JSON ``{sizing key: vector size}``, the size the OpenAI-compatible server last
    answered, so a restart needs no request. Written and read by ``indexer.builtin.openai_embed`` (only when that
    embedder is configured)."""
    return state_dir / "openai-embedder.json"


def calibration_file(state_dir: Path) -> Path:
    """``relevance-calibration.json``: JSON ``{model identity: {"floor", "right", "unanswerable", "probe",
    "measured"}}``, the relevance floor the packaged probe measured for a model that declares none. Written by
    ``indexer.calibration.store`` and read by ``read_stored`` (a searcher's ``Floor``, ``status``)."""
    return state_dir / "relevance-calibration.json"


#: every entry a daemon (and its built-ins) may create directly under the state dir
NAMES = tuple(f(Path()).name for f in (lock_file, edge_store, embedding_cache, attestations, identity_file,
                                       tenancy_file, owner_file, openai_dims, calibration_file))
#: files the plugins shipped in ``plugins/`` keep under the state dir they are given: the image plugin's OCR cache
#: and the audio plugin's verdict cache (SQLite, theirs alone)
PLUGIN_FILES = ("ocr-cache.sqlite3", "audio-verdicts.sqlite3")


def named(entry: str) -> bool:
    """Whether ``entry`` (a name directly under the state dir) is one this module names: one of ``NAMES`` or
    ``PLUGIN_FILES``, a record's ``.tmp`` being written, a SQLite file's ``-wal``/``-shm``, or a damaged cache set
    aside (``.corrupt-<unix time>``)."""
    base = entry.split(".corrupt-")[0]
    for suffix in ("-wal", "-shm"):
        base = base.removesuffix(suffix)
    stems = {Path(name).stem for name in NAMES}
    return base in NAMES or base in PLUGIN_FILES or (base.endswith(".tmp") and base[:-4] in stems)


# -- the lock ---------------------------------------------------------------------------------------------------------
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
    state_dir = state_dir.resolve()
    if state_dir in _STATE_LOCKS:
        return
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = lock_exclusive(lock_file(state_dir), f"the state directory {state_dir}")
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
    changed = 0
    for path in [root, *root.rglob("*")]:
        mode = os.lstat(path).st_mode
        if not stat.S_ISLNK(mode) and mode & 0o077:
            os.chmod(path, stat.S_IMODE(mode) & 0o700)
            changed += 1
    return changed


# -- JSON records -----------------------------------------------------------------------------------------------------
def read_record(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` (a record above); ``{}`` when it is missing, or damaged: unreadable (a folder in
    its place, no permission), not JSON, or JSON that is not an object. Damage is logged once per path
    (``state_record_ignored``), and the next ``write_record`` writes over a damaged file."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        return _ignored(path, f"{type(exc).__name__}: {exc}")
    return record if isinstance(record, dict) else _ignored(path, f"a JSON {type(record).__name__}, not an object")


_IGNORED: set[Path] = set()  # damaged records already logged


def _ignored(path: Path, why: str) -> dict[str, Any]:
    if path not in _IGNORED:
        _IGNORED.add(path)
        log.warning("state_record_ignored", path=str(path), reason=why[:200])
    return {}


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path`` as JSON: beside it (``.tmp``) and renamed over it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(path)


def read_identities(state_dir: Path) -> dict[str, str]:
    """The identity record of ``state_dir``: collection name -> model identity (``{}`` when none)."""
    return read_record(identity_file(state_dir))


def recorded_collections(state_dir: Path) -> list[str]:
    """The collections whose model identity ``state_dir`` records (the daemon's collections), sorted."""
    return sorted(read_identities(state_dir))


def recorded_identities(state_dir: Path) -> list[str]:
    """The model identities recorded for the collections under ``state_dir``, sorted, each once."""
    return sorted(set(read_identities(state_dir).values()))


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
    record = read_identities(state_dir)
    for name in names:
        if identity is None:
            record.pop(name, None)
        else:
            record[name] = identity
    write_record(identity_file(state_dir), record)


def recorded_tenancy(state_dir: Path, url: str) -> str | None:
    """The layout (``"collections"`` or ``"shared"``) that tenancy ``"auto"`` settled on for the server at ``url``
    under ``state_dir`` (or that ``migrate`` moved it to), ``None`` when none is recorded (or ``url`` is empty)."""
    return read_record(tenancy_file(state_dir)).get(url.rstrip("/")) if url else None


def owner_id(state_dir: Path, create: bool = True) -> str:
    """This state dir's owner id (``owner-id``), made (uuid4 hex, file 0600) when there is none yet and ``create``;
    ``""`` when there is none and not ``create``, or it cannot be read."""
    path = owner_file(state_dir)
    try:
        recorded = path.read_text().strip()
    except FileNotFoundError:
        recorded = ""
    except OSError:
        if create:
            raise
        recorded = ""
    if recorded or not create:
        return recorded
    recorded = uuid.uuid4().hex
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(recorded + "\n")
    tmp.replace(path)
    return recorded
