"""What the settings choose among the installed plugins (``indexer.plugins`` applies it as it loads them): the
``plugins`` allow-list (the ``qmd-indexer`` distribution's own always load), the opt-in embedders (only with
``prefer``), the one reranker the ``reranker`` setting names, ``prefer`` between two plugins of one kind or
modality, and the keys of each ``[plugin.<name>]`` table. Every refusal is one ``ConfigError`` line naming the
setting and what is installed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib.metadata import EntryPoint
from typing import Any, Protocol

from indexer.contract import EMBEDDERS, EXTRACTORS, RERANKERS
from indexer.errors import ConfigError, did_you_mean

OWN_DISTRIBUTION = "qmd-indexer"
#: embedders shipped here that run only when ``prefer`` chooses them for their modality (an endpoint to configure)
OPT_IN_EMBEDDERS = frozenset({"openai", "e5"})


class Choice(Protocol):
    """What choosing reads and marks of a plugin's record (``indexer.plugins.PluginRecord``)."""

    group: str
    name: str
    status: str
    reason: str
    obj: Any


def skipped(ep: EntryPoint, dist: str, allow: set[str], prefer: Mapping[str, str],
             reranker: str) -> tuple[str, str] | None:
    """``(status, reason)`` of a plugin the settings leave out (``disabled`` or ``unused``); None to load it."""
    if allow and dist != OWN_DISTRIBUTION and ep.name not in allow:
        return "disabled", "not in the plugins allow-list"
    if ep.group == RERANKERS and ep.name != reranker:
        return "unused", f"reranker = {reranker!r}" if reranker else "rerank is off: reranker not set"
    if ep.group == EMBEDDERS and ep.name in OPT_IN_EMBEDDERS and ep.name not in prefer.values():
        return "unused", f"chosen only with prefer = {{ text = {ep.name!r} }}"
    return None


def check_keys(name: str, factory: Any, table: Mapping[str, Any]) -> None:
    """Raise ``ConfigError`` naming the key and the table when ``table`` (``[plugin.<name>]``) holds a key the
    plugin does not take: its factory's ``config_keys`` (a set of names; ``state_dir`` is always allowed). A plugin
    that declares none is not checked."""
    known = getattr(factory, "config_keys", None)
    if known is None:
        return
    unknown = sorted(set(table) - set(known) - {"state_dir"})
    if unknown:
        raise ConfigError(f"[plugin.{name}]: unknown key {unknown[0]!r}{did_you_mean(unknown[0], known)} (known: "
                          f"{', '.join(sorted(set(known) - {'state_dir', 'cache_dir'}))})")


def check_names(records: Sequence[Choice], allow: set[str], prefer: Mapping[str, str]) -> None:
    """Raise ``ConfigError`` for a name in the ``plugins`` allow-list or a ``prefer`` choice that no installed plugin
    has: left alone, a typo silently disables a plugin or lets another one run instead."""
    installed = {r.name for r in records}
    named = [("plugins", name) for name in sorted(allow)] + [(f"prefer.{key}", name) for key, name in prefer.items()]
    for setting, name in named:
        if name not in installed:
            raise ConfigError(f"{setting}: no installed plugin is named {name!r} (installed: "
                              f"{', '.join(sorted(installed)) or 'none'}; see `qmd-indexer plugins`)")


def resolve_conflicts(records: Sequence[Choice], prefer: dict[str, str]) -> None:
    for group in (EXTRACTORS, EMBEDDERS):
        claims: dict[str, list[Choice]] = {}
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
