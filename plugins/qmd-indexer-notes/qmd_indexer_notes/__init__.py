"""Plain-text and Org notes for qmd-indexer: a complete, small third-party plugin.

Registered in this distribution's ``pyproject.toml`` as ``notes`` in ``qmd_indexer.classifiers`` and in
``qmd_indexer.extractors``. Config table ``[plugin.notes]`` (both objects read it):

- ``suffixes``: file name endings claimed, default ``[".txt", ".org"]``; ``.org`` files are kind ``"org"``, every
  other claimed suffix kind ``"plaintext"``.

A file is claimed only when its name ends in a claimed suffix and its first bytes hold no NUL byte (binary files
named ``.txt`` are left alone). Text is decoded as UTF-8 (invalid bytes become U+FFFD) and chunked with the same
token-sized, line-ranged chunker as markdown, so hits cite ``path#Lstart-Lend``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from indexer.api import Chunk, ExtractContext, FileInfo, chunk_text, decode_text

__version__ = "0.1.0"
DEFAULT_SUFFIXES = (".txt", ".org")
KINDS = frozenset({"plaintext", "org"})
CONFIG_KEYS = frozenset({"suffixes"})  # what [plugin.notes] may hold: another key is refused, naming the closest


def _suffixes(config: dict[str, Any] | None) -> frozenset[str]:
    raw = (config or {}).get("suffixes", DEFAULT_SUFFIXES)
    if isinstance(raw, str) or not all(isinstance(s, str) and s.startswith(".") for s in raw):
        raise ValueError(f"suffixes must be a list of names like \".txt\", got {raw!r}")
    return frozenset(s.lower() for s in raw)


class NotesClassifier:
    """``"org"`` for ``*.org``, ``"plaintext"`` for the other claimed suffixes, when the head has no NUL byte."""

    priority = 100  # same as the built-in markdown classifier; the suffixes do not overlap
    config_keys = CONFIG_KEYS

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.suffixes = _suffixes(config)

    def classify(self, path: Path, head: bytes) -> str | None:
        suffix = path.suffix.lower()
        if suffix not in self.suffixes or b"\x00" in head:
            return None
        return "org" if suffix == ".org" else "plaintext"


class NotesExtractor:
    """A note to text chunks of at most ``context.max_tokens`` embedder tokens, with 1-based line ranges."""

    kinds = KINDS
    config_keys = CONFIG_KEYS

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        _suffixes(config)  # the same table as the classifier: reject a bad one here too

    def extract(self, file: FileInfo, context: ExtractContext) -> Iterator[Chunk]:
        """Yields ``Chunk(kind=file.kind, modality="text")``; raises ``ExtractError`` for unreadable or binary
        files."""
        text, _ = decode_text(file.read_bytes())  # ExtractError: unreadable, or NUL bytes (binary)
        for piece in chunk_text(text, context.token_offsets, context.max_tokens):
            yield Chunk(text=piece.text, start_line=piece.start_line, end_line=piece.end_line, kind=file.kind)
