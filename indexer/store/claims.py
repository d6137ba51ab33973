"""One owner per logical collection on a shared Qdrant server: claims.

Several daemons (machines) may share one server. Names alone cannot keep them apart when two configure the same
agent id (or, before ``workspace.agent_slug``, ids that sanitise alike): each would prune the other's points as
"gone" and answer with the other's notes. So a daemon claims each logical collection it serves (the collection
name, which is the tenant key with shared tenancy) in one small collection of the server, ``qmd-claims``: one point
per logical collection (id ``uuid5`` of its name, no vectors) whose payload names the owner (``Owner``: the random
id recorded once in ``<state_dir>/owner-id`` and handed in by the daemon (``indexer.statedir.owner_id``), with the
host and the state dir for people to read), the exact agent id and the workspace path. ``ClaimingStore``
(``ServerStore``'s base):

- ``claim`` at connect: an agent any of whose collections another owner holds is refused (the daemon leaves it out
  of its plan and says so in one ``agent_claimed_elsewhere`` line); the others are claimed, each collection by a
  *conditional* upsert (Qdrant's ``update_filter``, server 1.16+: the point is inserted when absent and updated only
  when its ``owner`` is already this one; written through the shard's leader, ``medium`` ordering, waited for) and
  read back. A point's writes are applied in one order on its shard, so of two daemons claiming at once exactly one
  writes the claim and both read the same owner back: a compare-and-set, not "the last write wins". An agent's
  collections are taken in plan order and the first one decides: the loser stops there and writes nothing more;
- ``verify`` (the daemon's loop, every few seconds, and any read of a claimed collection whose last check is older
  than ``CHECK_S``): a claim of this daemon's that now names another owner (released by hand and taken by another
  daemon, or the claims collection deleted and claimed afresh) is *lost*: the agent's other claims are released,
  every later read or write of its collections raises ``NotOwner``, and the daemon stops serving the agent
  (``agent_claim_lost``, health degraded). A claim gone is taken again by the same conditional write;
- ``guard`` before every write (upsert, delete, drop, alias change) of a collection: another owner's claim raises
  ``NotOwner`` (a ``StoreUnavailable``: the write is retried later, never made), a claim gone (released) is taken
  again conditionally;
- ``release`` (``qmd-indexer release --agent X``) deletes claims: the one way a claim ends (an owner whose state dir
  is gone is never guessed at). A daemon still running takes its claim straight back at its next check, so a
  release takes effect only once the owner is stopped.

The embedded store has one owner by construction (``daemon.lock``) and claims nothing.
"""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog

from indexer.errors import StoreUnavailable
from indexer.store.layout import REBUILD
from indexer.store.retry import retried

log = structlog.get_logger("qmd_indexer.daemon")

CHECK_S = 1.0  # seconds a verification of this daemon's claims counts for a read of a claimed collection
CLAIMS = "qmd-claims"  # the server's collection of claims (one point per claimed logical collection)


class NotOwner(StoreUnavailable):
    """A write to a logical collection that another owner's claim holds (the write is not made)."""


@dataclass(frozen=True, slots=True)
class Owner:
    """Who claims: ``id`` (``<state_dir>/owner-id``, compared), ``host`` and ``state_dir`` (shown)."""

    id: str
    host: str
    state_dir: str

    @classmethod
    def here(cls, owner_id: str, state_dir: Path) -> Owner:
        """The owner ``owner_id`` (the id its state dir records: ``statedir.owner_id``, read by the caller) of
        ``state_dir`` on this host."""
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

    def since(self) -> str:
        """``claimed_at`` as UTC ISO 8601 (``1970-01-01T00:00:00Z`` when it is out of range)."""
        try:
            return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.claimed_at))
        except (OverflowError, OSError, ValueError):
            return "1970-01-01T00:00:00Z"

    def by(self) -> str:
        """The owner as people read it: ``host:state_dir (owner id)``."""
        return f"{self.host}:{self.state_dir} (owner {self.owner[:8]})"


def _claim_of(payload: Mapping[str, Any]) -> Claim:
    def text(key: str) -> str:
        return str(payload.get(key, ""))

    try:  # a claim edited by hand may hold anything here: shown as the epoch rather than failing every reader
        claimed_at = float(payload.get("claimed_at") or 0)
    except (TypeError, ValueError):
        claimed_at = 0.0
    if claimed_at != claimed_at or claimed_at in (float("inf"), float("-inf")):  # NaN, infinities
        claimed_at = 0.0
    return Claim(text("collection"), text("agent"), text("workspace"), text("owner"), text("host"),
                 text("state_dir"), claimed_at)


def claim_id(collection: str) -> str:
    """The point id of ``collection``'s claim: ``uuid5`` of its logical name."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"qmd-indexer-claim:{collection}"))


def logical(name: str) -> str:
    """The logical collection a physical or staging name (``<name>--rebuild-<n>``) belongs to."""
    return name.partition(REBUILD)[0]


class ClaimingStore:
    """The claims of a server store (mixed into ``ServerStore``): ``client`` is qdrant-client's, ``_m`` its models;
    ``owner`` is ``None`` (no claims: ``doctor``, ``migrate``, ``release``) until ``claim`` is called. ``refused``:
    the agents another owner holds (refused at ``claim`` or lost since), agent -> that owner's claim."""

    client: Any
    _m: Any
    options: Any
    owner: Owner | None = None
    _claimed: dict[str, Claim]  # logical collection -> this daemon's claim of it
    _lost: dict[str, Claim]  # logical collection of a lost agent -> the claim that holds it now
    refused: dict[str, Claim]
    _checked: float = 0.0  # time.monotonic() of the last verification

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
    def _read_for_write(self, names: Iterable[str]) -> dict[str, Claim]:
        """``read_claims`` before a write: failing, it counts as a failing write (``degraded``), as the write would.
        (The class's ``read_claims``, not the instance's retrying one: one retry loop, this one.)"""
        return ClaimingStore.read_claims(self, names)

    @retried(write=True)
    def _write_claim(self, claim: Claim) -> None:
        """Write ``claim`` where its point is absent or already names its owner (a conditional upsert: a claim of
        another owner is left as it is, and the write still succeeds)."""
        ours = self._m.Filter(must=[self._m.FieldCondition(key="owner", match=self._m.MatchValue(value=claim.owner))])
        self.client.upsert(CLAIMS, [self._m.PointStruct(id=claim_id(claim.collection), vector={},
                                                        payload=asdict(claim))],
                           wait=True, ordering=self._m.WriteOrdering.MEDIUM, update_filter=ours)

    @retried(write=True)
    def _delete_claims(self, ids: list[str]) -> None:
        if ids:
            self.client.delete(CLAIMS, points_selector=self._m.PointIdsList(points=list(ids)), wait=True,
                               ordering=self._m.WriteOrdering.MEDIUM)

    def _take(self, claim: Claim) -> Claim | None:
        """Take ``claim`` (conditionally) and read it back: ``None`` when it is this owner's now, else the claim that
        holds it (another owner's)."""
        self._claims_ready()  # the claims collection may have been deleted by hand since
        for _ in range(3):  # read back absent: released between the write and the read; take it again
            self._write_claim(claim)
            back = self._read_for_write([claim.collection]).get(claim.collection)
            if back is not None:
                return None if back.owner == claim.owner else back
        raise StoreUnavailable(f"the claim of {claim.collection} was deleted as soon as it was written, three times")

    def claim(self, owner: Owner, wanted: Mapping[str, tuple[str, str]]) -> dict[str, Claim]:
        """Claim the logical collections ``wanted`` (name -> (agent id, workspace path), in plan order) for
        ``owner``, agent by agent: an agent any of whose collections another owner holds is not claimed, and of
        two daemons claiming one agent at once exactly one wins (see the module). Returns the other owners' claims
        by agent (one each; empty when every agent is ours). Raises ``StoreUnavailable``."""
        self.owner = owner
        self._claimed, self._lost, self.refused = {}, {}, {}
        self._claims_ready()
        held = self.read_claims(wanted)
        agents: dict[str, list[tuple[str, str]]] = {}
        for name, (agent, ws) in wanted.items():
            agents.setdefault(agent, []).append((name, ws))
        now = time.time()
        for agent, names in agents.items():
            other = next((held[n] for n, _ in names if n in held and held[n].owner != owner.id), None)
            taken: list[Claim] = []
            for name, ws in names if other is None else ():
                mine = Claim(name, agent, ws, owner.id, owner.host, owner.state_dir,
                             held[name].claimed_at if name in held else now)
                other = self._take(mine)
                if other is not None:  # lost the race: what was taken of this agent goes back
                    self._delete_claims([claim_id(c.collection) for c in taken])
                    break
                taken.append(mine)
            if other is not None:
                self.refused[agent] = other
            else:
                self._claimed.update((c.collection, c) for c in taken)
        self._checked = time.monotonic()
        return dict(self.refused)

    def verify(self) -> dict[str, Claim]:
        """Check that every claim of this daemon still names it (one read; a claim gone, released or its collection
        deleted, is taken again conditionally). An agent with a claim another owner holds now is *lost*: its other
        claims are released, its collections refused from then on (``check_read``, ``guard``), one
        ``agent_claim_lost`` line each. Returns the agents lost by this call. Raises ``StoreUnavailable``."""
        if self.owner is None or not self._claimed:
            return {}
        now = self._read_for_write(self._claimed)
        lost: dict[str, Claim] = {}
        for name, mine in list(self._claimed.items()):
            there = now.get(name)
            if there is None:
                log.warning("claim_taken_again", collection=name, agent=mine.agent,
                            detail="this daemon's claim was released or deleted while it serves the agent; a "
                                   "release takes effect once the daemon is stopped")
                there = self._take(mine) or mine
            if there.owner != self.owner.id and mine.agent not in lost:
                lost[mine.agent] = there
        for agent, other in lost.items():
            self._lose(agent, other)
        self._checked = time.monotonic()
        return lost

    def _lose(self, agent: str, other: Claim) -> None:
        names = [n for n, c in self._claimed.items() if c.agent == agent]
        kept = [n for n in names if n != other.collection]
        with contextlib.suppress(StoreUnavailable):  # ours still: let the other owner have them
            self.release(kept, self.owner.id if self.owner else None)
        for n in names:
            self._claimed.pop(n, None)
            self._lost[n] = other
        self.refused[agent] = other
        log.error("agent_claim_lost", agent=agent, collections=names, owner=other.by(),
                  detail="another daemon claimed this agent's collections while this one served them (a claim "
                         "released or deleted by hand); this daemon stopped serving the agent and writes none of "
                         "its points",
                  hint=f"stop one of the two daemons; to serve `{agent}` here again, stop the other, run "
                       f"`qmd-indexer release --agent {agent}` and restart this one")

    def refused_agents(self) -> dict[str, Claim]:
        """The agents this daemon does not serve because another owner holds them (``refused``)."""
        return dict(self.refused) if self.owner is not None else {}

    def check_read(self, name: str) -> None:
        """Before a read of (physical or staging) ``name``: verify this daemon's claims when the last check is older
        than ``CHECK_S``; raise ``NotOwner`` when ``name``'s agent is lost (its points may be another owner's)."""
        if self.owner is None:
            return
        if time.monotonic() - self._checked > CHECK_S:
            self.verify()
        collection = logical(name)
        if collection in self._lost:
            raise self._refusal(collection)

    def _refusal(self, collection: str) -> NotOwner:
        return NotOwner(f"{collection} is claimed by {self._lost[collection].by()}; this daemon stopped serving "
                        f"agent {self._lost[collection].agent!r} (`qmd-indexer doctor` says more)")

    def guard(self, name: str) -> None:
        """Before a write to (physical or staging) ``name``: raise ``NotOwner`` when another owner claims its
        logical collection (whether or not this daemon serves it: its points are never deleted or overwritten),
        or when its agent was lost; take this daemon's claim again (conditionally) when it was released
        meanwhile. A no-op before ``claim`` (no owner)."""
        if self.owner is None:
            return
        collection = logical(name)
        if collection in self._lost:
            raise self._refusal(collection)
        now = self._read_for_write([collection]).get(collection)
        mine = self._claimed.get(collection)
        if now is None and mine is not None:
            now = self._take(mine) or mine
        if now is not None and now.owner != self.owner.id:
            if mine is not None:
                self._lose(mine.agent, now)
            raise NotOwner(f"{collection} is claimed by {now.by()}; this daemon does not write it")

    def release(self, names: Sequence[str], owner_id: str | None = None) -> list[Claim]:
        """Delete the claims of the logical collections ``names`` (only ``owner_id``'s, when given); returns the
        claims deleted."""
        held = [c for c in self.read_claims(names).values() if owner_id is None or c.owner == owner_id]
        self._delete_claims([claim_id(c.collection) for c in held])
        for c in held:
            self._claimed.pop(c.collection, None)
        return held


def claim_agents(store: Any, owner: Callable[[], Owner], collections: Sequence[Any]) -> set[str]:
    """Claim ``collections`` (``workspace.Collection``s of one plan) on ``store`` for ``owner()`` (called only when
    there is something to claim, so a state dir whose store claims nothing records no owner id);
    returns the agents another owner holds, each refused in one ``agent_claimed_elsewhere`` line that names the
    other owner and the ways out. Nothing for the embedded store. Raises ``StoreUnavailable``."""
    if store.tenancy is None or not collections:
        return set()
    wanted = {c.name: (c.agent, str(c.workspace.path)) for c in collections}
    refused = store.claim(owner(), wanted)
    for agent, other in refused.items():
        log.error("agent_claimed_elsewhere", agent=agent,
                  collections=[c.name for c in collections if c.agent == agent], owner=other.by(),
                  owner_workspace=other.workspace,
                  claimed_at=other.since(),
                  detail="another daemon serves this agent on this Qdrant server; this daemon does not serve it, "
                         "and deletes and overwrites none of its points",
                  hint=f"give this daemon its own `collection_prefix` (then both keep their indexes), or, once the "
                       f"other daemon is gone for good, run `qmd-indexer release --agent {agent}` (or move its "
                       f"index with `qmd-indexer migrate`) and restart this one")
    return set(refused)
