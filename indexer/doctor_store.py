"""What ``qmd-indexer doctor`` checks of the Qdrant server a config names (``qdrant_url``): where the points of this
config's logical collections live, in which layout (``qdrant_tenancy``), and what on the server the daemon would not
use as it is. The one entry is ``store_findings``; it only reads, through the ``Store`` interface (lists collections
and aliases, counts points, reads how shared collections are indexed) and never writes, so ``doctor --fix`` leaves the
store as it is.

Per logical collection (named as the daemon names them: ``state.Plan``, with ``collection_prefix``), each Qdrant
collection that holds its points is one ``Holding``: its own collection (or what its alias points at), a tenant of
a shared ``qmd-shared-<kind>-<digest>`` collection (``store.tenancy``), a rebuild's staging collection, or a tenant of
another model's shared collection (a model the state dir recorded: ``former``; one it did not: ``other``).

Staging collections (``<name>--rebuild-<n>``, ``qmd-shared-...--rebuild``) are reported as information, not as a
problem: a rebuild running right now holds points there too, which doctor cannot tell from one cut short, and the
daemon deletes what a cut-short rebuild left at its next start (``Store.sweep``), so nothing waits on the user.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from indexer.config import Settings
from indexer.doctor import Finding
from indexer.statedir import owner_id, recorded_identities, recorded_tenancy
from indexer.store.base import Store
from indexer.store.layout import PAYLOAD_M, REBUILD, SHARED, STAGING, TENANT_KEY, PerTenant, shared_collection
from indexer.workspace import Collection

Where = Literal["own", "tenant", "staging", "former", "other"]
MIGRATE = "qmd-indexer migrate --from {url} --tenancy {tenancy}"  # moves a server's points between the layouts
SHARED_WHERE = ("tenant", "former", "other")  # a ``Holding`` in a shared collection, not staging


@dataclass(frozen=True, slots=True)
class Holding:
    """``points`` (exact count, >= 0) of one logical collection in Qdrant collection ``physical``; ``where`` says
    which: ``own`` (a Qdrant collection of its own, or the one its alias points at), ``tenant`` (a tenant of the
    configured model's shared collection), ``staging`` (a rebuild's, either layout), ``former`` (a tenant of the
    shared collection of a model the state dir recorded) or ``other`` (of a model it did not record)."""

    physical: str
    points: int
    where: Where


@dataclass(frozen=True, slots=True)
class Spaces:
    """The embedding spaces that name shared collections: ``current`` the configured model's identity (``None``:
    not known, or not needed with tenancy ``collections``; every shared collection then counts as ``tenant``),
    ``former`` the other identities the state dir recorded."""

    current: str | None
    former: tuple[str, ...] = ()


def shown(url: str) -> str:
    """``url`` without a user or password (a password may sit in ``qdrant_url``; doctor's output is not secret)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    return urlunsplit(parts._replace(netloc=host + (f":{parts.port}" if parts.port else "")))


def configured_identity(settings: Settings) -> str:
    """The model identity (``rebuild.model_identity``, a str) of the embedders ``settings`` configure, computed as
    the daemon does at start: it names this model's shared collections. Loads the plugins, not their models (a
    remote embedder may ask its server for the vector size once). Raises ``ConfigError``, ``PluginError``, or what
    an embedder's ``identity`` raises (``EmbedUnavailable`` for a remote one that cannot be asked)."""
    from indexer.plugins import load_registry, plugin_configs
    from indexer.rebuild import model_identity

    registry = load_registry(settings.plugins, plugin_configs(settings), settings.prefer)
    return model_identity(registry.embedders)


def store_findings(settings: Settings) -> list[Finding]:
    """What doctor reports of the server at ``settings.qdrant_url`` for the collections of ``settings``'
    workspaces: the layout in use and each logical collection's points (information); points in the layout not
    configured, shared collections of this model made without per-tenant indexing, and a model unknown (problems);
    rebuild leftovers and tenants of another model (information). An unreachable server, or one that refuses
    (HTTP 401...), is one problem finding and nothing else. Never raises for the server; never writes to it."""
    from indexer.state import Plan
    from indexer.store import ServerOptions, ServerStore
    from indexer.store.retry import refused

    out: list[Finding] = []
    collections = Plan.of(settings).collections
    options = ServerOptions.from_settings(settings, recorded_tenancy(settings.state_dir, settings.qdrant_url))
    store = ServerStore(settings.qdrant_url, settings.qdrant_api_key, options)
    try:  # "auto" not settled yet: read as the daemon reads it at its first connect
        store.settle([c.name for c in collections] + [c.former for c in collections if c.former])
    except refused() as exc:  # unreachable, or refusing (HTTP 401...)
        store.close()
        return [Finding("", "qdrant_unreachable", shown(settings.qdrant_url), str(exc).splitlines()[0])]
    settings = settings.model_copy(update={"qdrant_tenancy": store.tenancy})
    spaces = Spaces(None)
    if settings.qdrant_tenancy == "shared":
        try:
            current = configured_identity(settings)
        except Exception as exc:  # any plugin's failure: doctor reports it in one line
            out.append(Finding("", "model_unknown", "", f"{type(exc).__name__}: {exc}; this model's shared "
                               "collections cannot be named, so they are not checked"))
        else:
            spaces = Spaces(current, tuple(s for s in recorded_identities(settings.state_dir) if s != current))
    try:
        out += _checks(store, settings, collections, spaces)
        out += claim_findings(store, settings, collections)
    except refused() as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return [Finding("", "qdrant_unreachable", shown(settings.qdrant_url), reason)]
    finally:
        store.close()
    return out


def claim_findings(store: Store, settings: Settings, collections: Sequence[Collection]) -> list[Finding]:
    """The claims of ``collections`` on ``store`` (``indexer.store.claims``): this config's own (information),
    another daemon's (a problem: the daemon refuses that agent), and points of a collection whose path lies outside
    the workspace its claim (or, unclaimed, this config) names (another owner's files in the index: a problem
    under a claim, information without one).
    Reads only; raises what the store raises."""
    mine = owner_id(settings.state_dir, create=False)  # "": no daemon of this state dir has claimed anything yet
    claims = store.read_claims([c.name for c in collections])
    held = store.collections()
    out: list[Finding] = []
    for c in collections:
        claim = claims.get(c.name)
        if claim is not None and claim.owner == mine:
            out.append(Finding(c.agent, "claim", c.name, f"held by this daemon ({claim.by()}, workspace "
                               f"{claim.workspace})", problem=False))
        elif claim is not None and not mine and claim.workspace == str(c.workspace.path):
            # doctor run without the daemon's state dir: a daemon of this very workspace holds it, most likely the
            # one this config describes; no notes of another workspace can be served through it
            out.append(Finding(c.agent, "claim", c.name, f"held by a daemon of this workspace ({claim.by()}); pass "
                               f"its --state-dir (or config) to tell whether it is this one", problem=False))
        elif claim is not None:
            out.append(Finding(c.agent, "claimed_elsewhere", c.name, f"held by {claim.by()} for workspace "
                               f"{claim.workspace}: this daemon refuses the agent; set another collection_prefix, or "
                               f"once that daemon is gone for good run `qmd-indexer release --agent {c.agent}`"))
        if c.name not in held:
            continue
        root = str(c.root if c.role == "extra" else claim.workspace if claim else c.workspace.path).rstrip("/")
        foreign = sorted(p for p in store.file_states(c.name) if p != root and not p.startswith(root + "/"))
        if foreign:  # a problem under a claim; unclaimed, it may as well be a workspace that moved
            out.append(Finding(c.agent, "foreign_paths", c.name, f"{len(foreign)} files outside {root}, e.g. "
                               f"{foreign[0]}: " + ("another owner's notes in this index; the owner's next scan "
                               "removes them" if claim else "not claimed by any daemon yet: another daemon's notes, "
                               "or a workspace that moved; the next daemon to claim it removes them"),
                               problem=claim is not None))
    return out


def _checks(store: Store, settings: Settings, collections: Sequence[Collection], spaces: Spaces) -> list[Finding]:
    """Every finding but the unreachable server's, from one read of the server ``store``."""
    names = store.physical_names()
    aliases = store.aliases()
    shared = settings.qdrant_tenancy == "shared"
    out = [_layout(settings, spaces)]
    for c in collections:
        held = _holdings(store, c.name, names, aliases, spaces)
        out += _placed(c, held, shared, spaces, shown(settings.qdrant_url))
    if spaces.current is not None:
        for physical in names:
            if physical.startswith(SHARED) and physical.removesuffix(STAGING).endswith(f"-{_digest(spaces.current)}"):
                out += _tenant_indexing(physical, store.per_tenant(physical))
    return out


def _digest(space: str) -> str:
    """The 12 hex digits that name the shared collections of embedding space ``space``."""
    return shared_collection("", space).rpartition("-")[2]


def _layout(settings: Settings, spaces: Spaces) -> Finding:
    """The layout in use, as information."""
    if settings.qdrant_tenancy != "shared":
        detail = 'tenancy "collections": one Qdrant collection per logical collection'
    elif spaces.current is None:
        detail = 'tenancy "shared": tenants of qmd-shared-<kind>-<model digest> collections; the model is unknown'
    else:
        detail = (f'tenancy "shared": tenants of {SHARED}<kind>-{_digest(spaces.current)}, the shared collections '
                  f"of model {spaces.current}")
    return Finding("", "qdrant_layout", shown(settings.qdrant_url), detail, problem=False)


def _holdings(store: Store, name: str, names: list[str], aliases: dict[str, str], spaces: Spaces) -> list[Holding]:
    """Where logical collection ``name`` has points among the Qdrant collections ``names`` (``aliases``: alias ->
    collection): its own collection (listed even when empty), its rebuilds', and each shared collection of its kind
    (``qmd-shared-<kind>-``, any model) where it is a tenant with points."""
    out: list[Holding] = []
    own = aliases.get(name, name)
    if own in names:
        out.append(Holding(own, store.physical_count(own), "own"))
    for physical in names:  # what ``Store.sweep`` deletes at the daemon's next start
        if physical != own and (physical == name or physical.startswith(name + REBUILD)):
            out.append(Holding(physical, store.physical_count(physical), "staging"))
    kind = shared_collection(name, "").rpartition("-")[0] + "-"
    for physical in names:
        if physical.startswith(kind):
            points = store.physical_count(physical, tenant=name)
            if points:
                out.append(Holding(physical, points, _shared_where(physical, name, spaces)))
    return out


def _shared_where(physical: str, name: str, spaces: Spaces) -> Where:
    """Which shared collection ``physical`` is for logical collection ``name`` (see ``Holding``)."""
    if physical.endswith(STAGING):
        return "staging"
    if spaces.current is None or physical == shared_collection(name, spaces.current):
        return "tenant"
    return "former" if any(physical == shared_collection(name, s) for s in spaces.former) else "other"


def _placed(c: Collection, held: list[Holding], shared: bool, spaces: Spaces, url: str) -> list[Finding]:
    """The findings of one logical collection ``c`` from where its points are (``held``): where the daemon reads
    it from, then its points anywhere else."""
    live: Where = "tenant" if shared else "own"
    in_use = [h for h in held if h.where == live]  # its own collection even when empty; a tenant has points
    out = [Finding(c.agent, "stored", c.name, _described(h), problem=False) for h in in_use]
    if not in_use:
        if not shared:
            absent = f"no Qdrant collection {c.name}"
        elif spaces.current is None:
            absent = "no tenant of that name in a shared collection"
        else:
            absent = f"no tenant of that name in {shared_collection(c.name, spaces.current)}"
        out.append(Finding(c.agent, "stored", c.name, f"0 points: {absent}", problem=False))
    out += _other_layout(c, held, shared, url)
    for h in held:
        if h.where == "staging" and h.points:
            swept = h.physical.startswith(SHARED) == shared  # ``Store.sweep`` of the configured layout
            why = ("a rebuild cut short, or running now; the daemon deletes them at its next start" if swept else
                   "a rebuild of the layout not configured, cut short; unused here, delete it once you are satisfied")
            out.append(Finding(c.agent, "rebuild_staging", c.name, f"{_described(h)}: {why}", problem=False))
    if shared:
        out += [_other_model(c, h, spaces, bool(in_use)) for h in held if h.where in ("former", "other")]
    return out


def _other_layout(c: Collection, held: list[Holding], shared: bool, url: str) -> list[Finding]:
    """``c``'s points in the layout not configured (its own Qdrant collection with tenancy ``shared``, shared
    collections with ``collections``): a problem when the configured layout holds none of them (the daemon would
    index everything again beside them), naming the migration; information otherwise."""
    tenancy = "shared" if shared else "collections"

    def configured(h: Holding) -> bool:
        return h.where in SHARED_WHERE if shared else h.where == "own"

    kept = any(h.points for h in held if configured(h))
    out: list[Finding] = []
    for h in held:
        if h.points and h.where != "staging" and not configured(h):
            if kept:
                detail = f'{_described(h)}, unused with tenancy "{tenancy}"; delete it once you are satisfied'
            else:
                detail = (f'{_described(h)} and none in the configured layout (tenancy "{tenancy}"): the daemon '
                          f"would index everything again; move them with `{MIGRATE.format(url=url, tenancy=tenancy)}`")
            out.append(Finding(c.agent, "other_layout", c.name, detail, problem=not kept))
    return out


def _described(h: Holding) -> str:
    """``<n> points in Qdrant collection <name>`` or ``<n> points, tenant of <shared collection>`` (``1 point``)."""
    points = f"{h.points} point{'' if h.points == 1 else 's'}"
    if h.physical.startswith(SHARED):
        return f"{points}, tenant of {h.physical}"
    return f"{points} in Qdrant collection {h.physical}"


def _other_model(c: Collection, h: Holding, spaces: Spaces, swapped: bool) -> Finding:
    """Information on ``c``'s points in another model's shared collection (``h``: ``former`` or ``other``);
    ``swapped``: the configured model's shared collection holds points of ``c`` (the daemon reads those then)."""
    if h.where == "other":
        return Finding(c.agent, "other_model", c.name, f"{_described(h)}, the shared collection of a model this "
                       "state dir did not record (another daemon with the same collection names? see "
                       "collection_prefix); this daemon never reads them", problem=False)
    model = next(s for s in spaces.former if shared_collection(c.name, s) == h.physical)
    if swapped:  # a swap cut short between writing this model's points and deleting the former's
        why = "left over from a model change already swapped in; the daemon no longer reads them"
    else:
        why = (f"a model change not yet swapped in; searches answer from there until the rebuild into "
               f"{shared_collection(c.name, spaces.current or '')} is swapped in, then these are deleted")
    return Finding(c.agent, "former_model", c.name, f"{_described(h)}, the shared collection of model {model} "
                   f"(recorded in the state dir): {why}", problem=False)


def _tenant_indexing(physical: str, indexed: PerTenant | None) -> list[Finding]:
    """A problem when shared collection ``physical`` (indexed as ``indexed``; ``None``: a store without shared
    collections, nothing to check) lacks the ``is_tenant`` keyword index on the tenant key or builds one HNSW graph
    across tenants (``m != 0`` or ``payload_m`` unset): the daemon creates it with both, so someone made it by hand."""
    if indexed is None:
        return []
    wrong: list[str] = []
    if not indexed.tenant_index:
        wrong.append(f'no is_tenant keyword index on "{TENANT_KEY}" (create it: PUT /collections/{physical}/index '
                     f'{{"field_name": "{TENANT_KEY}", "field_schema": {{"type": "keyword", "is_tenant": true}}}})')
    if indexed.m != 0 or indexed.payload_m is None:
        wrong.append(f"HNSW m={indexed.m}, payload_m={indexed.payload_m}: not one graph per tenant (set it: PATCH "
                     f'/collections/{physical} {{"hnsw_config": {{"m": 0, "payload_m": {PAYLOAD_M}}}}})')
    if not wrong:
        return []
    return [Finding("", "shared_not_per_tenant", physical, "; ".join(wrong) + "; the daemon creates its shared "
                    "collections with both, so this one was made by hand")]
