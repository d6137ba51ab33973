"""The plugin contract's load-time checks, derived from the Protocols of ``indexer.api``: what each entry-point
group's objects must have (``CONTRACT``), what they may declare and its default (``DEFAULTS``), and
``check_contract``, which ``indexer.plugins`` runs on every plugin it loads and ``indexer.testing`` on a plugin
author's. Nothing here imports torch: members are read with ``inspect.getattr_static``, so lazy properties (a
model's ``dim``) are not evaluated.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Protocol, get_type_hints

from indexer.api import (
    GROUPS,
    MODALITY_PATTERN,
    RESERVED_MODALITIES,
    TEXT,
    Classifier,
    Embedder,
    Extractor,
    Reranker,
    TextEmbedder,
    TranscriptFormat,
)
from indexer.errors import PluginError

CLASSIFIERS, EXTRACTORS, EMBEDDERS, RERANKERS, TRANSCRIPTS = GROUPS
#: group -> the Protocol of ``indexer.api`` its objects must satisfy (a ``"text"`` embedder: ``TextEmbedder``)
PROTOCOLS: dict[str, type] = {CLASSIFIERS: Classifier, EXTRACTORS: Extractor, EMBEDDERS: Embedder,
                              RERANKERS: Reranker, TRANSCRIPTS: TranscriptFormat}


def _members(protocol: type) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(required, optional)`` members of ``protocol``, each name -> its annotation (``None`` for a method).

    Required: methods and annotated attributes without a default; optional: annotated attributes with a default in
    the Protocol body (the value a plugin that omits them gets)."""
    hints = get_type_hints(protocol)
    required: dict[str, Any] = {}
    optional: dict[str, Any] = {}
    for name, hint in hints.items():
        (optional if hasattr(protocol, name) else required)[name] = hint
    for klass in protocol.__mro__:
        if klass is Protocol or klass is object or not getattr(klass, "_is_protocol", False):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and callable(value) and name not in hints:
                required.setdefault(name, None)
    return required, optional


#: group -> names an object of that group must have, derived from ``PROTOCOLS`` (a text embedder also needs
#: ``TEXT_EMBEDDER``)
CONTRACT: dict[str, tuple[str, ...]] = {group: tuple(_members(p)[0]) for group, p in PROTOCOLS.items()}
TEXT_EMBEDDER: tuple[str, ...] = tuple(n for n in _members(TextEmbedder)[0] if n not in CONTRACT[EMBEDDERS])
#: group -> optional declaration -> the default used when a plugin omits it
DEFAULTS: dict[str, dict[str, Any]] = {
    group: {name: getattr(p, name) for name in _members(p)[1]} for group, p in PROTOCOLS.items()
}


#: members that may be lazy properties loading a model: checked for presence at load, by value in indexer.testing
LAZY = frozenset({"dim", "max_tokens", "model_id", "identity", "loading", "load_error", "load_progress"})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_value(name: str, hint: Any, value: Any) -> None:
    """Checks the attribute kinds the Protocols use: ``int``, ``bool``, ``str``, ``frozenset[str]``,
    ``tuple[str, ...]`` (``int | None`` and other unions are checked by the group rules in ``check_contract``)."""
    origin = getattr(hint, "__origin__", None)
    if hint is int and not _is_int(value):
        raise PluginError(f"{name} must be an int, got {value!r}")
    if hint is bool and not isinstance(value, bool):
        raise PluginError(f"{name} must be a bool, got {value!r}")
    if hint is str and not isinstance(value, str):
        raise PluginError(f"{name} must be a str, got {value!r}")
    if origin in (frozenset, tuple) and not (
        isinstance(value, origin) and all(isinstance(v, str) and v for v in value)
    ):
        raise PluginError(f"{name} must be a {origin.__name__} of str, got {value!r}")


def declared(group: str, obj: Any, name: str) -> Any:
    """The value of optional declaration ``name`` of a plugin: its own, else the Protocol's default."""
    return getattr(obj, name, DEFAULTS[group][name])


def check_contract(group: str, obj: Any) -> None:
    """Raise ``PluginError`` naming the first member of the group's Protocol (``PROTOCOLS``) that ``obj`` lacks or
    has wrong: a missing member, a method that is not callable, an attribute of the wrong type; ``kinds`` must not
    be empty; an embedder's ``modality`` must match ``MODALITY_PATTERN`` and not be reserved; a ``"text"`` embedder
    must satisfy ``TextEmbedder`` (``token_offsets``, an int ``max_tokens``).

    Attributes are read with ``inspect.getattr_static`` first, so a missing member is reported without evaluating
    lazy properties; only the values checked by type are read (``dim`` of a lazy model is not)."""
    protocols = [PROTOCOLS[group]]
    if group == EMBEDDERS:
        try:
            inspect.getattr_static(obj, "modality")
        except AttributeError:
            raise PluginError(f"missing 'modality' required by {group}") from None
        modality = obj.modality
        if not isinstance(modality, str) or not re.fullmatch(MODALITY_PATTERN, modality):
            raise PluginError(f"modality must be a lowercase name matching {MODALITY_PATTERN}, got {modality!r}")
        if modality in RESERVED_MODALITIES:
            raise PluginError(f"modality {modality!r} is reserved (the keyword-search vector)")
        if modality == TEXT:
            protocols.append(TextEmbedder)
    for protocol in protocols:
        required, optional = _members(protocol)
        what = f"a {TEXT!r} embedder ({protocol.__name__})" if protocol is TextEmbedder else group
        for name, hint in required.items():
            try:
                inspect.getattr_static(obj, name)
            except AttributeError:
                raise PluginError(f"missing {name!r} required by {what}") from None
            if hint is None:
                if not callable(getattr(obj, name)):
                    raise PluginError(f"{name!r} must be callable")
            elif name not in LAZY:
                _check_value(name, hint, getattr(obj, name))
        for name, hint in optional.items():
            if name not in LAZY and hasattr(obj, name):
                _check_value(name, hint, getattr(obj, name))
    if group == EXTRACTORS and not obj.kinds:
        raise PluginError("kinds must be a non-empty frozenset of str")
