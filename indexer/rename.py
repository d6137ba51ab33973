"""Where a plan's collections stand on the store before the daemon reads them (``placed``: layout settled, agents
claimed, names moved), and moving a store to its collection's current name once (``workspace.agent_slug`` changed
how agent ids that sanitising alters are named: ``Bob`` was ``memory-dir-bob``, now ``memory-dir-bob--<hash>``).

``move_renamed`` runs in ``Indexer.connect`` before anything is read or written: for each planned collection whose
``former`` name holds points and whose own name holds none, the points of this collection's agent under its root
(the former name may be shared with another agent whose id sanitised the same way: those stay where they are; a
former name another daemon claims, or one holding none of this agent's points, is not touched at all) are
copied, vectors and payloads as stored, with ids and tenant key rewritten for the new name (``points.point_id``),
into a collection beside the live one, which is then swapped in (``Store.rebuild_target``/``swap``, as a rebuild).
Nothing is embedded. The moved points are then deleted from the former name (dropped when none is left), the
model identity recorded for the former name carries over, and one ``collection_renamed`` line says how many points
moved (``chunks_embedded`` 0) and how many of another agent stayed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import structlog

from indexer.migrate import record_tenancy
from indexer.points import Point, point_id
from indexer.state import Plan
from indexer.statedir import owner_id, read_identities, record_identity
from indexer.store import Store
from indexer.store.claims import NotOwner, Owner, claim_agents
from indexer.workspace import Collection

log = structlog.get_logger("qmd_indexer.daemon")

BATCH = 256  # points copied per upsert


def placed(store: Store, plan: Plan, dims: dict[str, int]) -> Plan:
    """Where ``plan``'s collections stand on ``store`` before ``Indexer.connect`` reads them: a server's tenancy
    ``"auto"`` settled (on the names and the former names) and recorded; the agents claimed
    (``claims.claim_agents``), those another owner holds left out of the plan returned; stores under former names
    moved (``move_renamed``; ``dims`` the dense vectors a new collection gets). Raises ``StoreUnavailable``."""
    state_dir = plan.settings.state_dir
    if store.tenancy == "auto":
        store.settle([c.name for c in plan.collections] + [c.former for c in plan.collections if c.former])
        record_tenancy(state_dir, plan.settings.qdrant_url, str(store.tenancy))
    refused = claim_agents(store, lambda: Owner.here(owner_id(state_dir), state_dir),  # one owner per agent
                           plan.collections)
    if refused:
        plan = dataclasses.replace(plan, collections=tuple(c for c in plan.collections if c.agent not in refused))
    move_renamed(store, plan.collections, dims, state_dir)
    return plan


def move_renamed(store: Store, collections: Sequence[Collection], dims: dict[str, int], state_dir: Path) -> int:
    """Move the stores of ``collections`` still under their ``former`` names (see the module); ``dims``: the dense
    vectors (name -> size) a new collection is created with; ``state_dir``: whose identity record
    follows the move. Returns the number of points moved. Raises ``StoreUnavailable`` from the store (the next
    ``connect`` resumes: the former name keeps what was not moved yet)."""
    pending = [c for c in collections if c.former]
    if not pending:
        return 0
    held = store.collections()
    moved = 0
    for c in pending:
        if c.former not in held or (c.name in held and store.count(c.name)):
            continue
        try:
            store.guard(c.former)  # another daemon's live collection that happens to bear the name: never touched
        except NotOwner as exc:
            log.info("former_name_kept", collection=c.name, former=c.former, agent=c.agent, detail=str(exc))
            continue
        if not any(_mine(c, point) for point in store.scroll_points(c.former)):
            continue  # nothing of this agent's there: no staging collection, nothing dropped
        moved += _move(store, c, dims, state_dir)
    return moved


def _mine(c: Collection, point: Point) -> bool:
    """Whether ``point`` of ``c``'s former name belongs to ``c``: its agent, and a path under ``c``'s root."""
    root = str(c.workspace.path if c.role == "root" else c.root).rstrip("/")
    path = point.payload.abs_path
    return point.payload.agent == c.agent and (path == root or path.startswith(root + "/"))


def _move(store: Store, c: Collection, dims: dict[str, int], state_dir: Path) -> int:
    target = store.rebuild_target(c.name)
    store.ensure_collection(target, dims)
    moved: set[str] = set()
    batch: list[Point] = []
    left = 0
    for point in store.scroll_points(c.former):
        if not _mine(c, point):
            left += 1
            continue
        payload = dataclasses.replace(point.payload, collection=c.name)
        batch.append(Point(point_id(c.name, payload.abs_path, payload.chunk_index), point.dense, point.sparse,
                           payload))
        moved.add(payload.abs_path)
        if len(batch) >= BATCH:
            store.upsert(target, batch)
            batch = []
    store.upsert(target, batch)
    count = store.count(target)
    store.swap(c.name, target)
    if left:
        for path in sorted(moved):
            store.delete_file(c.former, path)
    else:
        store.drop(c.former)
    record = read_identities(state_dir)
    if c.former in record:
        record_identity(state_dir, [c.name], record[c.former])
        if not left:
            record_identity(state_dir, [c.former], None)
    log.info("collection_renamed", collection=c.name, former=c.former, agent=c.agent, points_moved=count,
             files=len(moved), chunks_embedded=0, points_left=left,
             detail="moved once to a name no other agent id can share; nothing re-embedded"
             + (f"; {left} points of another agent stay under {c.former}" if left else ""))
    return count
