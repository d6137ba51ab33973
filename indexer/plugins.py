"""Discover plugins through entry points and check them against the contract in ``indexer.api``.

Groups: ``qmd_indexer.classifiers``, ``qmd_indexer.extractors``, ``qmd_indexer.embedders``. Each entry point names a
factory called with the plugin's config table (``[plugin.<entry-point name>]`` in the config file, ``{}`` if absent).

- Plugins of the ``qmd-indexer`` distribution itself (markdown, the text embedder) always load. Others load when
  ``plugins`` (config key, or ``QMD_INDEXER_PLUGINS=a,b``) is empty or names them.
- A plugin that fails to import, raises in its factory or lacks a contract member is recorded as ``failed`` with
  the reason, logged once (``plugin_failed``) and skipped; the daemon runs on.
- Two extractors of one kind, or two embedders of one modality, need ``prefer = { <kind or modality> = "<name>" }``;
  without it loading stops with ``ConfigError`` naming both.

Nothing here imports torch: factories are cheap by contract, and members are checked with
``inspect.getattr_static`` so lazy properties (a model's ``dim``) are not evaluated.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

import structlog

from indexer.errors import ConfigError, PluginError

log = structlog.get_logger("qmd_indexer.plugins")

OWN_DISTRIBUTION = "qmd-indexer"

#: group -> members an object of that group must have (the Protocols of indexer.api)
CONTRACT: dict[str, tuple[str, ...]] = {
    "qmd_indexer.classifiers": ("priority", "classify"),
    "qmd_indexer.extractors": ("kinds", "extract"),
    "qmd_indexer.embedders": ("model_id", "modality", "dim", "max_tokens", "embed", "embed_query"),
}


@dataclass(slots=True)
class PluginRecord:
    """What ``qmd-indexer plugins`` shows for one entry point. ``status`` is ``loaded``, ``failed``, ``disabled``
    (not on the allow-list) or ``unused`` (lost a ``prefer`` choice)."""

    group: str
    name: str
    distribution: str
    version: str
    status: str
    reason: str = ""
    provides: tuple[str, ...] = ()
    obj: Any = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group, "name": self.name, "distribution": self.distribution, "version": self.version,
            "provides": list(self.provides), "status": self.status, "reason": self.reason,
        }


def check_contract(group: str, obj: Any) -> None:
    """Raise ``PluginError`` naming the first member of ``CONTRACT[group]`` that ``obj`` lacks or has wrong."""
    for member in CONTRACT[group]:
        try:
            inspect.getattr_static(obj, member)
        except AttributeError:
            raise PluginError(f"missing {member!r} required by {group}") from None
    if group == "qmd_indexer.classifiers" and not isinstance(obj.priority, int):
        raise PluginError("priority must be an int")
    if group == "qmd_indexer.extractors" and (not isinstance(obj.kinds, frozenset) or not obj.kinds):
        raise PluginError("kinds must be a non-empty frozenset of str")
    if group == "qmd_indexer.embedders" and obj.modality not in ("text", "image"):
        raise PluginError(f"modality must be 'text' or 'image', got {obj.modality!r}")
    for member in CONTRACT[group]:
        if member in ("classify", "extract", "embed", "embed_query") and not callable(getattr(obj, member)):
            raise PluginError(f"{member!r} must be callable")


def _provides(group: str, obj: Any) -> tuple[str, ...]:
    if group == "qmd_indexer.extractors":
        return tuple(sorted(obj.kinds))
    if group == "qmd_indexer.embedders":
        return (obj.modality,)
    return (f"priority {obj.priority}",)


class Registry:
    """The loaded plugins: classifiers in priority order, one extractor per kind, one embedder per modality."""

    def __init__(self, records: list[PluginRecord]) -> None:
        self.records = records
        loaded = [r for r in records if r.status == "loaded"]
        self.classifiers = sorted(
            (r.obj for r in loaded if r.group == "qmd_indexer.classifiers"), key=lambda c: c.priority
        )
        self.extractors: dict[str, Any] = {}
        self.embedders: dict[str, Any] = {}
        for r in loaded:
            if r.group == "qmd_indexer.extractors":
                for kind in r.obj.kinds:
                    self.extractors[kind] = r.obj
            elif r.group == "qmd_indexer.embedders":
                self.embedders[r.obj.modality] = r.obj

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


def _distribution(ep: EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "?", "?"
    return dist.metadata["Name"] or dist.name, dist.version


def load_registry(
    allow: Iterable[str] = (),
    config: Mapping[str, Mapping[str, Any]] | None = None,
    prefer: Mapping[str, str] | None = None,
    eps: Iterable[EntryPoint] | None = None,
) -> Registry:
    """Load every entry point of the three groups (or ``eps``, for tests) into a ``Registry``.

    Raises ``ConfigError`` when two loaded plugins provide one kind/modality and ``prefer`` does not choose.
    """
    allow = set(allow)
    config = config or {}
    prefer = dict(prefer or {})
    if eps is None:
        eps = [ep for group in CONTRACT for ep in entry_points(group=group)]
    records: list[PluginRecord] = []
    for ep in sorted(eps, key=lambda e: (e.group, e.name)):
        if ep.group not in CONTRACT:
            continue
        dist, version = _distribution(ep)
        record = PluginRecord(ep.group, ep.name, dist, version, "loaded")
        records.append(record)
        if allow and dist != OWN_DISTRIBUTION and ep.name not in allow:
            record.status, record.reason = "disabled", "not in the plugins allow-list"
            continue
        try:
            factory = ep.load()
            obj = factory(dict(config.get(ep.name, {})))
            check_contract(ep.group, obj)
            record.obj, record.provides = obj, _provides(ep.group, obj)
        except Exception as exc:  # any failure of third-party code: report and skip
            record.status, record.reason = "failed", f"{type(exc).__name__}: {exc}"
            log.warning("plugin_failed", group=ep.group, plugin=ep.name, distribution=dist, reason=record.reason)
    _resolve_conflicts(records, prefer)
    return Registry(records)


def _resolve_conflicts(records: list[PluginRecord], prefer: dict[str, str]) -> None:
    for group in ("qmd_indexer.extractors", "qmd_indexer.embedders"):
        claims: dict[str, list[PluginRecord]] = {}
        for r in records:
            if r.group == group and r.status == "loaded":
                for key in (r.obj.kinds if group.endswith("extractors") else (r.obj.modality,)):
                    claims.setdefault(key, []).append(r)
        for key, rivals in claims.items():
            if len(rivals) < 2:
                continue
            chosen = prefer.get(key)
            names = sorted(r.name for r in rivals)
            if chosen is None or chosen not in names:
                what = "kind" if group.endswith("extractors") else "modality"
                raise ConfigError(
                    f"prefer.{key}: plugins {', '.join(names)} all provide {what} {key!r}; "
                    f"choose one with prefer = {{ {key} = \"{names[0]}\" }}"
                )
            for r in rivals:
                if r.name != chosen:
                    r.status, r.reason = "unused", f"prefer.{key} = {chosen!r}"
                    r.obj = None
