"""A note's front matter, as Jekyll, Hugo and Obsidian write it: where it ends, its title and its tags.

Chunking (``indexer.chunking``) keeps the block out of every chunk's text and feeds its title and tags into the
chunks' context. YAML is read with PyYAML's safe loader, TOML with the standard library.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass

import yaml

#: front matter as Jekyll, Hugo and Obsidian write it: ``---`` YAML closed by ``---`` or ``...``, or ``+++`` TOML
_FRONT_MATTER = re.compile(
    r"\A(?P<fence>---|\+\+\+)[ \t]*\r?\n(?P<body>.*?\r?\n)?(?P<close>---|\.\.\.|\+\+\+)[ \t]*(?:\r?\n|\Z)", re.DOTALL)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's safe loader where PyYAML was built with it
_YAML_KEY = re.compile(r"\A\s*(?:#.*\n\s*)*[\w-]+\s*:")
_TAG_SPLIT = re.compile(r"[,\s]+")


@dataclass(frozen=True, slots=True)
class FrontMatter:
    """A note's front matter: ``lines`` it spans from the top (0 when there is none), its ``title`` (None when it
    names none), ``tags`` (``tags`` or ``tag``: a list or a comma/space separated string, ``#`` dropped) and
    ``date`` (what its ``date`` key holds: YAML and TOML read a bare date as a ``datetime.date``)."""

    lines: int = 0
    title: str | None = None
    tags: tuple[str, ...] = ()
    date: object = None  # its ``date`` as parsed (a ``datetime.date``/``datetime``, or a string), None when absent


def front_matter(text: str) -> FrontMatter:
    """The front matter block at the very start of ``text`` (``\\n`` line ends): ``---`` YAML (closed by ``---``
    or ``...``) or ``+++`` TOML (closed by ``+++``). A block counts when it parses to a mapping (or is empty), or,
    YAML that does not parse, when it opens with a ``key:`` line (an editor still shows it as properties); a
    ``---`` thematic break over a paragraph is no front matter. Its lines are never read as headings or text."""
    match = _FRONT_MATTER.match(text)
    if not match or (match["fence"] == "+++") != (match["close"] == "+++"):
        return FrontMatter()
    body = match["body"] or ""
    lines = text.count("\n", 0, match.end()) + (0 if match.group(0).endswith("\n") else 1)
    try:
        data = tomllib.loads(body) if match["fence"] == "+++" else yaml.load(body, Loader=_YAML_LOADER)
    except (tomllib.TOMLDecodeError, yaml.YAMLError, RecursionError):
        return FrontMatter(lines) if match["fence"] == "---" and _YAML_KEY.match(body) else FrontMatter()
    if data is None:
        return FrontMatter(lines)
    if not isinstance(data, dict):
        return FrontMatter()
    raw_title = data.get("title")
    title = " ".join(str(raw_title).split()) if isinstance(raw_title, str | int | float) else ""
    raw = data.get("tags", data.get("tag"))
    items = _TAG_SPLIT.split(raw) if isinstance(raw, str) else raw if isinstance(raw, list) else []
    tags = (str(t).strip().lstrip("#") for t in items if isinstance(t, str | int | float))
    return FrontMatter(lines, title or None, tuple(dict.fromkeys(t for t in tags if t)), data.get("date"))


def front_matter_lines(text: str) -> int:
    """How many lines the front matter block (``front_matter``) at the top of ``text`` spans; 0 when none."""
    return front_matter(text).lines
