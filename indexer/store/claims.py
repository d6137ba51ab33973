"""One owner per logical collection on a shared Qdrant server: claims.

Several daemons (machines) may share one server. Names alone cannot keep them apart when two configure the same
agent id (or, before ``workspace.agent_slug``, ids that sanitise alike): each would prune the other's points as
"gone" and answer with the other's notes. So a daemon claims each logical collection it serves (the collection
name, which is the tenant key with shared tenancy) in one small collection of the server, ``qmd-claims``: one point
per logical collection (id ``uuid5`` of its name, no vectors) whose payload names the owner (``Owner``: the random
id recorded once in ``<state_dir>/owner-id``, with the host and the state dir for people to read), the exact agent
id and the workspace path. ``ClaimingStore`` (``ServerStore``'s base):

- ``claim`` at connect: an agent any of whose collections another owner holds is refused (the daemon leaves it out
  of its plan and says so in one ``agent_claimed_elsewhere`` line); the others are claimed (written through the
  shard's leader, ``medium`` ordering, waited for, then read back: of two daemons starting at once, the claim read
  back decides, and the other refuses at its next write);
- ``guard`` before every write (upsert, delete, drop, alias change) of a collection: another owner's claim raises
  ``NotOwner`` (a ``StoreUnavailable``: the write is retried later, never made), a claim gone (released) is written
  again;
- ``release`` (``qmd-indexer release --agent X``) deletes claims: the one way a claim ends (an owner whose state dir
  is gone is never guessed at).

The embedded store has one owner by construction (``daemon.lock``) and claims nothing.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog

from indexer.errors import StoreUnavailable
from indexer.store.base import REBUILD
from indexer.store.retry import retried

log = structlog.get_logger("qmd_indexer.daemon")

CLAIMS = "qmd-claims"  # the server's collection of claims (one point per claimed logical collection)
OWNER_FILE = "owner-id"  # under the state dir: this daemon's owner id (uuid4 hex), written once


class NotOwner(StoreUnavailable):
    """A write to a logical collection that another owner's claim holds (the write is not made)."""


@dataclass(frozen=True, slots=True)
class Owner:
    """Who claims: ``id`` (``<state_dir>/owner-id``, compared), ``host`` and ``state_dir`` (shown)."""

    id: str
    host: str
    state_dir: str

    @classmethod
    def of(cls, state_dir: Path) -> Owner:
        """The owner of ``state_dir``: its recorded id, made (uuid4, file 0600) when there is none yet."""
        path = state_dir / OWNER_FILE
        try:
            owner_id = path.read_text().strip()
        except FileNotFoundError:
            owner_id = ""
        if not owner_id:
            owner_id = uuid.uuid4().hex
            tmp = path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(owner_id + "\n")
            tmp.replace(path)
        return cls(owner_id, socket.gethostname(), str(state_dir.resolve()))


@dataclass(frozen=True, slots=True)
class Claim:
    """One claim: ``collection`` (logical name) held for ``agent`` (the exact id) with ``workspace`` by the owner
    ``owner`` (id) on ``host`` with ``state_dir``; ``claimed_at`` Unix seconds."""

    collection: str
    agent: str
    workspace: str
    owner: str
    host: str
    state_dir: str
    claimed_at: float

    def by(self) -> str:
        """The owner as people read it: ``host:state_dir (owner id)``."""
        return f"{self.host}:{self.state_dir} (owner {self.owner[:8]})"


def _claim_of(payload: Mapping[str, Any]) -> Claim:
    def text(key: str) -> str:
        return str(payload.get(key, ""))

    return Claim(text("collection"), text("agent"), text("workspace"), text("owner"), text("host"),
                 text("state_dir"), float(payload.get("claimed_at") or 0))


def claim_id(collection: str) -> str:
    """The point id of ``collection``'s claim: ``uuid5`` of its logical name."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"qmd-indexer-claim:{collection}"))


def logical(name: str) -> str:
    """The logical collection a physical or staging name (``<name>--rebuild-<n>``) belongs to."""
    return name.partition(REBUILD)[0]


class ClaimingStore:
    """The claims of a server store (mixed into ``ServerStore``): ``client`` is qdrant-client's, ``_m`` its models;
    ``owner`` is ``None`` (no claims: ``doctor``, ``migrate``, ``release``) until ``claim`` is called."""

    client: Any
    _m: Any
    options: Any
    owner: Owner | None = None
    _claimed: dict[str, Claim]

    @retried()
    def _claims_ready(self) -> None:
        if self.client.collection_exists(CLAIMS):
            return
        try:
            self.client.create_collection(CLAIMS, vectors_config={},
                                          replication_factor=self.options.replication_factor,
                                          write_consistency_factor=self.options.write_consistency_factor)
        except Exception:
            if not self.client.collection_exists(CLAIMS):  # else: made by another daemon meanwhile
                raise

    @retried()
    def read_claims(self, names: Iterable[str] | None = None) -> dict[str, Claim]:
        """The claims of ``names`` (every claim when ``None``) by logical collection, read from any live replica
        (a stricter read consistency fails while a replica is down, and so would every guarded write)."""
        if not self.client.collection_exists(CLAIMS):
            return {}
        if names is None:
            records, offset = [], None
            while True:
                page, offset = self.client.scroll(CLAIMS, limit=256, offset=offset, with_payload=True,
                                                  with_vectors=False)
                records += page
                if offset is None:
                    break
        else:
            ids = [claim_id(n) for n in names]
            records = self.client.retrieve(CLAIMS, ids, with_payload=True, with_vectors=False) if ids else []
        claims = [_claim_of(r.payload or {}) for r in records]
        return {c.collection: c for c in claims}

    @retried(write=True)
    def _write_claims(self, claims: Sequence[Claim]) -> None:
        if claims:
            self.client.upsert(CLAIMS, [self._m.PointStruct(id=claim_id(c.collection), vector={}, payload=asdict(c))
                                        for c in claims], wait=True, ordering=self._m.WriteOrdering.MEDIUM)

    @retried(write=True)
    def _delete_claims(self, ids: list[str]) -> None:
        if ids:
            self.client.delete(CLAIMS, points_selector=self._m.PointIdsList(points=list(ids)), wait=True,
                               ordering=self._m.WriteOrdering.MEDIUM)

    def claim(self, owner: Owner, wanted: Mapping[str, tuple[str, str]]) -> dict[str, Claim]:
        """Claim the logical collections ``wanted`` (name -> (agent id, workspace path)) for ``owner``, agent by
        agent: an agent any of whose collections another owner holds is not claimed. Returns the other owners'
        claims by agent (one each; empty when every agent is ours). Raises ``StoreUnavailable``."""
        self.owner = owner
        self._claims_ready()
        held = self.read_claims(wanted)
        refused = {agent: held[name] for name, (agent, _) in wanted.items()
                   if name in held and held[name].owner != owner.id}
        now = time.time()
        mine = [Claim(name, agent, ws, owner.id, owner.host, owner.state_dir,
                      held[name].claimed_at if name in held else now)
                for name, (agent, ws) in wanted.items() if agent not in refused]
        self._write_claims(mine)
        after = self.read_claims(c.collection for c in mine)  # two daemons at once: the last write is the claim
        lost = {c.agent: after[c.collection] for c in mine
                if c.collection in after and after[c.collection].owner != owner.id}
        refused.update(lost)
        self._claimed = {c.collection: c for c in mine if c.agent not in refused}
        self.release([c.collection for c in mine if c.agent in refused and c.agent not in lost], owner.id)
        return refused

    def guard(self, name: str) -> None:
        """Before a write to (physical or staging) ``name``: raise ``NotOwner`` when another owner claims its
        logical collection (whether or not this daemon serves it: its points are never deleted or overwritten);
        write this daemon's claim again when it was released meanwhile. A no-op before ``claim`` (no owner)."""
        if self.owner is None:
            return
        collection = logical(name)
        now = self.read_claims([collection]).get(collection)
        if now is not None and now.owner != self.owner.id:
            raise NotOwner(f"{collection} is claimed by {now.by()}; this daemon does not write it")
        mine = self._claimed.get(collection)
        if now is None and mine is not None:
            self._write_claims([mine])

    def release(self, names: Sequence[str], owner_id: str | None = None) -> list[Claim]:
        """Delete the claims of the logical collections ``names`` (only ``owner_id``'s, when given); returns the
        claims deleted."""
        held = [c for c in self.read_claims(names).values() if owner_id is None or c.owner == owner_id]
        self._delete_claims([claim_id(c.collection) for c in held])
        for c in held:
            self._claimed.pop(c.collection, None)
        return held


def claim_agents(store: Any, state_dir: Path, collections: Sequence[Any]) -> set[str]:
    """Claim ``collections`` (``workspace.Collection``s of one plan) on ``store`` for the owner of ``state_dir``;
    returns the agents another owner holds, each refused in one ``agent_claimed_elsewhere`` line that names the
    other owner and the ways out. Nothing for the embedded store. Raises ``StoreUnavailable``."""
    if store.tenancy is None or not collections:
        return set()
    wanted = {c.name: (c.agent, str(c.workspace.path)) for c in collections}
    refused = store.claim(Owner.of(state_dir), wanted)
    for agent, other in refused.items():
        log.error("agent_claimed_elsewhere", agent=agent,
                  collections=[c.name for c in collections if c.agent == agent], owner=other.by(),
                  owner_workspace=other.workspace,
                  claimed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(other.claimed_at)),
                  detail="another daemon serves this agent on this Qdrant server; this daemon does not serve it, "
                         "and deletes and overwrites none of its points",
                  hint=f"give this daemon its own `collection_prefix` (then both keep their indexes), or, once the "
                       f"other daemon is gone for good, run `qmd-indexer release --agent {agent}` (or move its "
                       f"index with `qmd-indexer migrate`) and restart this one")
    return set(refused)
