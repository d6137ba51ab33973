"""Discover plugins through entry points and check them against the contract in ``indexer.api``.

Groups: ``qmd_indexer.classifiers``, ``qmd_indexer.extractors``, ``qmd_indexer.embedders``,
``qmd_indexer.rerankers``. Each entry point names a factory called with the plugin's config table
(``[plugin.<entry-point name>]`` in the config file, ``{}`` if absent).

- Plugins of the ``qmd-indexer`` distribution itself (markdown, the text embedder) always load. Others load when
  ``plugins`` (config key, or ``QMD_INDEXER_PLUGINS=a,b``) is empty or names them.
- A plugin that fails to import, raises in its factory or lacks a contract member is recorded as ``failed`` with
  the reason, logged once (``plugin_failed``) and skipped; the daemon runs on. A media plugin (an extractor whose
  class declares ``media = True``, or an embedder of a modality other than ``"text"``) failing is usual on a fresh
  install (no model weights yet) and matters only where a workspace enables its media kind: it is logged at debug
  level, and ``Registry.check_multimodal`` logs one ``media_plugin_unavailable`` line, with the reason, once a
  workspace's ``multimodal`` settings allow that kind.
- Two extractors of one kind, or two embedders of one modality, need ``prefer = { <kind or modality> = "<name>" }``;
  without it loading stops with ``ConfigError`` naming both.
- A name in ``plugins`` or ``prefer`` that no installed plugin has is a ``ConfigError`` naming the installed ones.
- Rerankers are chosen, not combined: only the one the ``reranker`` setting names is loaded (the others are listed
  ``unused``); a name no installed reranker has is a ``ConfigError``. None is loaded by default (rerank is off).

What the settings choose (the allow-list, ``prefer``, the reranker, each table's keys) is ``indexer.plugin_choice``.
Nothing here imports torch: factories are cheap by contract, and members are checked with
``inspect.getattr_static`` so lazy properties (a model's ``dim``) are not evaluated.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import structlog

from indexer.api import (
    GROUPS,
    TEXT,
    Classifier,
    Embedder,
    Extractor,
    Reranker,
    TextEmbedder,
    TranscriptFormat,
)
from indexer.contract import (
    CLASSIFIERS,
    CONTRACT,
    EMBEDDERS,
    EXTRACTORS,
    RERANKERS,
    TRANSCRIPTS,
    check_contract,
    declared,
)
from indexer.errors import ConfigError, PluginError, did_you_mean
from indexer.plugin_choice import check_keys, check_names, resolve_conflicts, skipped

if TYPE_CHECKING:
    from indexer.config import Settings

log = structlog.get_logger("qmd_indexer.plugins")

#: the payload fields a transcript window's hit carries: its session, the time of its first turn, its speakers
TRANSCRIPT_HIT_FIELDS = ("session_id", "session_time", "speakers")

@dataclass(slots=True)
class PluginRecord:
    """What ``qmd-indexer plugins`` shows for one entry point. ``status`` is ``loaded``, ``failed``, ``disabled``
    (not on the allow-list) or ``unused`` (lost a ``prefer`` choice, or a reranker the ``reranker`` setting does not
    name); ``reason`` says why, or for a loaded extractor its ``notice`` (what it runs without)."""

    group: str
    name: str
    distribution: str
    version: str
    status: str
    reason: str = ""
    provides: tuple[str, ...] = ()
    obj: Any = field(default=None, repr=False)
    media: tuple[str, ...] = ()  # a failed media plugin: the media kinds it would have served (``media_kinds``)
    configured: bool = False  # failed, and meant to run: named (reranker, prefer), configured, or not optional media

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group, "name": self.name, "distribution": self.distribution, "version": self.version,
            "provides": list(self.provides), "status": self.status, "reason": self.reason,
        }


def _provides(group: str, obj: Any) -> tuple[str, ...]:
    if group == EXTRACTORS:
        return tuple(sorted(obj.kinds))
    if group == EMBEDDERS:
        return (obj.modality,)
    if group == RERANKERS:
        return ("rerank",)
    if group == TRANSCRIPTS:
        return ("transcripts",)
    return (f"priority {obj.priority}",)


class Registry:
    """The loaded plugins: classifiers in priority order, one extractor per kind, one embedder per modality, the
    configured ``reranker`` (``None``: rerank is off, or the plugin failed to load), and what they declare:
    ``media_kinds`` (kinds gated by a workspace's ``multimodal`` settings), ``hit_fields`` (payload fields search
    hits carry) and ``modalities`` (the named dense vectors, one per embedder)."""

    def __init__(self, records: list[PluginRecord]) -> None:
        self.records = records
        loaded = [r for r in records if r.status == "loaded"]
        self.classifiers: list[Classifier] = sorted(
            (r.obj for r in loaded if r.group == CLASSIFIERS), key=lambda c: c.priority
        )
        self.extractors: dict[str, Extractor] = {}
        self.embedders: dict[str, Embedder] = {}
        self.reranker: Reranker | None = None
        self.reranker_name = ""  # the entry-point name of ``reranker``
        self.transcript_formats: list[tuple[str, TranscriptFormat]] = sorted(
            ((r.name, r.obj) for r in loaded if r.group == TRANSCRIPTS),
            key=lambda pair: (declared(TRANSCRIPTS, pair[1], "priority"), pair[0]))
        media: set[str] = set()
        fields: dict[str, None] = {}
        for r in loaded:
            if r.group == EXTRACTORS:
                for kind in r.obj.kinds:
                    self.extractors[kind] = r.obj
                if declared(EXTRACTORS, r.obj, "media"):
                    media |= set(r.obj.kinds)
                fields.update(dict.fromkeys(declared(EXTRACTORS, r.obj, "hit_fields")))
            elif r.group == EMBEDDERS:
                self.embedders[r.obj.modality] = r.obj
            elif r.group == RERANKERS:
                self.reranker, self.reranker_name = r.obj, r.name
        self.media_kinds: frozenset[str] = frozenset(media)
        if self.transcript_formats:  # what a transcript hit carries (indexer.sources.transcripts)
            fields.update(dict.fromkeys(TRANSCRIPT_HIT_FIELDS))
        self.hit_fields: tuple[str, ...] = tuple(fields)
        self.modalities: tuple[str, ...] = tuple(sorted(self.embedders))

    def check_text_choice(self, prefer: Mapping[str, str]) -> None:
        """Raise ``PluginError`` (one line) when the text embedder ``prefer.text`` chooses failed to load (e.g.
        ``e5`` without the ``multilingual`` extra): left alone, the built-in model would index every note instead,
        silently, and the index be rebuilt once more when the chosen one loads. The daemon calls it at open;
        ``qmd-indexer plugins`` lists the failure instead."""
        chosen = prefer.get(TEXT)
        for r in self.records:
            if r.group == EMBEDDERS and r.name == chosen and r.status == "failed":
                raise PluginError(f"prefer.text = {chosen!r}: the embedder failed to load: {r.reason}"[:300])

    @property
    def failures(self) -> list[str]:
        """One line per plugin that was meant to run and failed to load (the configured reranker, a ``prefer``
        choice, one with its own ``[plugin.<name>]`` settings, or any but an optional media plugin):
        ``"<name> plugin <name> failed to load: <reason>"``; ``status`` and ``/health`` report them."""
        return [f"{r.group.rsplit('.', 1)[-1][:-1]} plugin {r.name} failed to load: {r.reason}"[:300]
                for r in self.records if r.status == "failed" and r.configured]

    def configured_reranker(self, name: str) -> Reranker | None:
        """The loaded reranker when it is the one named ``name`` (the ``reranker`` setting), else ``None``: rerank
        is off, the plugin failed to load, or this registry was loaded for another ``reranker``."""
        return self.reranker if name and name == self.reranker_name else None

    @property
    def text_embedder(self) -> TextEmbedder | None:
        """The embedder of modality ``"text"`` (checked against ``TextEmbedder`` at load), or ``None``."""
        embedder = self.embedders.get(TEXT)
        return embedder if embedder is None else _as_text(embedder)

    def check_multimodal(self, media_kinds: Mapping[str, Iterable[str]]) -> None:
        """Raise ``ConfigError`` when a workspace's ``multimodal.modalities`` (``media_kinds``: agent -> names)
        names a kind no loaded plugin declares as media. A failed media plugin (``PluginRecord.media``) of a kind
        some workspace allows is logged once here (``media_plugin_unavailable``, with the reason: what to install
        or configure). When another extractor plugin failed to load, the kind may be its own: then one
        ``multimodal_kind_unknown`` warning is logged instead, and the daemon runs on."""
        wanted = {agent: set(names) for agent, names in media_kinds.items()}
        unavailable: set[str] = set()
        for record in self.records:
            if record.status == "loaded" and record.reason and record.group == EXTRACTORS:
                kinds = set(record.obj.kinds) if declared(EXTRACTORS, record.obj, "media") else set()
                limited = sorted(a for a, names in wanted.items() if "all" in names or names & kinds)
                if limited:  # the plugin's ``notice``: loaded, but running without something
                    log.warning("plugin_limited", plugin=record.name, distribution=record.distribution,
                                kinds=sorted(kinds), agents=limited, notice=record.reason)
            agents = sorted(a for a, names in wanted.items() if "all" in names or names & set(record.media))
            if record.status == "failed" and record.media and agents:
                unavailable |= set(record.media)
                log.warning("media_plugin_unavailable", plugin=record.name, distribution=record.distribution,
                            kinds=list(record.media), agents=agents, reason=record.reason,
                            hint="install or configure what the reason names, then restart or reload")
        for agent, names in media_kinds.items():
            unknown = sorted(set(names) - self.media_kinds - unavailable - {"all"})
            if not unknown:
                continue
            failed = sorted(r.name for r in self.records if r.group == EXTRACTORS and r.status == "failed")
            known = ", ".join(sorted(self.media_kinds)) or "none"
            if failed:
                log.warning("multimodal_kind_unknown", agent=agent, kinds=unknown, known=sorted(self.media_kinds),
                            failed_plugins=failed)
                continue
            raise ConfigError(f"workspace {agent!r}: multimodal.modalities: unknown media kind "
                              f"{unknown[0]!r}; the loaded plugins provide: {known} (see `qmd-indexer plugins`)")

    def transcript_format(self, head: bytes) -> tuple[str, TranscriptFormat] | None:
        """``(entry-point name, format)`` of the first transcript format (by ``priority``) whose ``sniff`` claims a
        file starting with ``head``; ``None`` when none does (the file is no transcript). A plugin that raises is
        taken as a no."""
        for name, fmt in self.transcript_formats:
            try:
                if fmt.sniff(head):
                    return name, fmt
            except Exception as exc:  # a plugin's bug must not stop the daemon
                log.warning("transcript_sniff_failed", plugin=name, error=f"{type(exc).__name__}: {exc}"[:300])
        return None

    def classify_text(self, path: Path, head: bytes) -> str | None:
        """``classify``, but ``None`` for a media kind: what ``read`` serves is text memory, never a media file."""
        kind = self.classify(path, head)
        return None if kind in self.media_kinds else kind

    def classify(self, path: Path, head: bytes) -> str | None:
        """The first non-``None`` answer of the classifiers in priority order; a classifier that raises defers."""
        for classifier in self.classifiers:
            try:
                kind = classifier.classify(path, head)
            except Exception as exc:  # a broken third-party classifier must not stop indexing
                log.warning("classifier_failed", classifier=type(classifier).__name__, path=str(path), error=str(exc))
                continue
            if kind:
                return kind
        return None


def _as_text(embedder: Embedder) -> TextEmbedder:
    # check_contract held it to TextEmbedder when it loaded (not isinstance: that would evaluate lazy properties)
    return cast(TextEmbedder, embedder)


def _distribution(ep: EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "?", "?"
    return dist.metadata["Name"] or dist.name, dist.version


def plugin_configs(settings: Settings) -> dict[str, dict[str, Any]]:
    """Each installed plugin's config table, plus ``state_dir`` (str: a folder the plugin may keep its own files in,
    such as the audio plugin's verdict cache) unless its table sets one; the text embedder also gets
    ``model``/``device``/``batch_size``/``precision`` from the top level and keeps exported models in
    ``model_cache_dir``, shared by every state dir. Raises ``ConfigError`` for a ``[plugin.<name>]`` table no
    installed plugin is named (a typo would leave the plugin it meant unconfigured), naming the closest installed
    one."""
    installed = {ep.name for group in GROUPS for ep in entry_points(group=group)}
    unknown = sorted(set(settings.plugin) - installed)
    if unknown:
        name = unknown[0]
        raise ConfigError(f"[plugin.{name}]: no installed plugin is named {name!r}{did_you_mean(name, installed)}; "
                          f"installed: {', '.join(sorted(installed))} (see `qmd-indexer plugins`)")
    configs = {name: {"state_dir": str(settings.state_dir), **settings.plugin.get(name, {})} for name in installed}
    base = {"model": settings.model, "device": settings.device, "batch_size": settings.batch_size,
            "precision": settings.precision, "cache_dir": str(settings.model_cache_dir)}
    configs["sentence-transformers"] = {**base, **configs.get("sentence-transformers", {})}
    return configs


def load_registry(
    allow: Iterable[str] = (),
    config: Mapping[str, Mapping[str, Any]] | None = None,
    prefer: Mapping[str, str] | None = None,
    eps: Iterable[EntryPoint] | None = None,
    reranker: str = "",
    keep: Registry | None = None,
) -> Registry:
    """Load every entry point of the four groups (or ``eps``, for tests) into a ``Registry``; of the rerankers only
    the one named ``reranker`` (the setting; empty: none, rerank is off). ``keep``: a running registry (a reload)
    whose loaded plugins are reused as they are when the same distribution and version still provides them, so
    their models are not loaded again; the others (new, or failed before) are loaded.

    Raises ``ConfigError`` when two loaded plugins provide one kind/modality and ``prefer`` does not choose, when
    ``reranker`` names no installed reranker, or when ``allow`` or ``prefer`` names no installed plugin.
    """
    allow = set(allow)
    config = config or {}
    prefer = dict(prefer or {})
    if eps is None:
        eps = [ep for group in CONTRACT for ep in entry_points(group=group)]
    running = {(r.group, r.name, r.distribution, r.version): r for r in (keep.records if keep else [])
               if r.status == "loaded" and r.obj is not None}
    records: list[PluginRecord] = []
    for ep in sorted(eps, key=lambda e: (e.group, e.name)):
        if ep.group not in CONTRACT:
            continue
        dist, version = _distribution(ep)
        record = PluginRecord(ep.group, ep.name, dist, version, "loaded")
        records.append(record)
        left_out = skipped(ep, dist, allow, prefer, reranker)
        if left_out is not None:
            record.status, record.reason = left_out
            if set(config.get(ep.name, {})) - {"state_dir"}:  # a table for it: a typo there shows now, not later
                check_keys(ep.name, _factory(ep), config[ep.name])
            continue
        same = running.get((ep.group, ep.name, dist, version))
        if same is not None:
            record.obj, record.provides, record.reason = same.obj, same.provides, same.reason
            continue
        _load(record, ep, config, prefer)
    if reranker and not any(r.group == RERANKERS and r.name == reranker for r in records):
        installed = ", ".join(sorted(r.name for r in records if r.group == RERANKERS)) or "none"
        raise ConfigError(f"reranker: no installed reranker is named {reranker!r} (installed: {installed}; "
                          f"see `qmd-indexer plugins`)")
    resolve_conflicts(records, prefer)
    check_names(records, allow, prefer)
    return Registry(records)


def _load(record: PluginRecord, ep: EntryPoint, config: Mapping[str, Mapping[str, Any]],
          prefer: Mapping[str, str]) -> None:
    """Load, configure and check the plugin of ``ep`` into ``record``; a failure of its code marks the record
    ``failed`` (with the media kinds it would have handled) and is logged. ``ConfigError`` (an unknown key) raises."""
    factory: Any = None
    try:
        factory = ep.load()
        check_keys(ep.name, factory, config.get(ep.name, {}))
        obj = factory(dict(config.get(ep.name, {})))
        check_contract(ep.group, obj)
        record.obj, record.provides = obj, _provides(ep.group, obj)
        if ep.group == EXTRACTORS:
            record.reason = declared(EXTRACTORS, obj, "notice")  # what it runs without, e.g. "OCR off: ..."
    except ConfigError:
        raise
    except Exception as exc:  # any failure of third-party code: report and skip
        record.status, record.reason = "failed", f"{type(exc).__name__}: {exc}"
        record.media = _media_kinds(ep.group, factory)
        record.configured = (not record.media or ep.group == RERANKERS or ep.name in prefer.values()
                             or bool(set(config.get(ep.name, {})) - {"state_dir"}))
        (log.debug if record.media else log.warning)(
            "plugin_failed", group=ep.group, plugin=ep.name, distribution=record.distribution,
            reason=record.reason, media=list(record.media))


def _factory(ep: EntryPoint) -> Any:
    """``ep``'s factory, imported (not called), or ``None`` when it does not import (its table is then not checked:
    the plugin is not used)."""
    try:
        return ep.load()
    except Exception:  # third-party code: a plugin left unused must not fail the daemon
        return None


def _media_kinds(group: str, factory: Any) -> tuple[str, ...]:
    """The media kinds a plugin whose factory failed would have served, read from its class without running it: an
    extractor declaring ``media = True``: its ``kinds``; an embedder of a modality other than ``"text"``: that
    modality (a media kind is named after the modality its chunks have). ``()`` when not media or not known (a
    factory function, or the import failed)."""
    try:
        if group == EXTRACTORS and inspect.getattr_static(factory, "media", False) is True:
            return tuple(sorted(str(k) for k in inspect.getattr_static(factory, "kinds")))
        if group == EMBEDDERS:
            modality = inspect.getattr_static(factory, "modality")
            if isinstance(modality, str) and modality != TEXT:
                return (modality,)
    except (AttributeError, TypeError):
        pass
    return ()


