"""Built-in markdown support, registered through the same entry-point groups as any third-party plugin:
``markdown`` in ``qmd_indexer.classifiers`` and in ``qmd_indexer.extractors`` (see ``pyproject.toml``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

from indexer.api import Chunk, ExtractContext, FileInfo
from indexer.chunking import OVERLAP_RATIO, TextChunk
from indexer.safeio import decode_text
from indexer.sections import chunk_markdown

log = structlog.get_logger("qmd_indexer.markdown")
SUFFIXES = frozenset({".md", ".markdown"})


class MarkdownClassifier:
    """``"markdown"`` for files named ``*.md`` / ``*.markdown``; content is checked by the extractor."""

    priority = 100
    config_keys = frozenset({"suffixes", "overlap_ratio"})  # [plugin.markdown], read by both objects

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.suffixes = frozenset(s.lower() for s in (config or {}).get("suffixes", SUFFIXES))

    def classify(self, path: Path, head: bytes) -> str | None:
        return "markdown" if path.suffix.lower() in self.suffixes else None


def _meta(chunk: TextChunk) -> dict[str, Any]:
    """The payload fields of a chunk beside its text: ``speakers`` of a conversation window, ``note_date``
    (``YYYY-MM-DD``) of a dated note's chunk."""
    meta: dict[str, Any] = {}
    if chunk.speakers:
        meta["speakers"] = list(chunk.speakers)
    if chunk.date:
        meta["note_date"] = chunk.date
    return meta


class MarkdownExtractor:
    """A markdown file to heading-section chunks sized to the embedder, each carrying its document's title, heading
    path and front matter tags as ``context``; the front matter itself is in no chunk (see
    ``indexer.sections.chunk_markdown``).

    Config ``[plugin.markdown]``: ``overlap_ratio``, the share of ``max_tokens`` consecutive windows of a long
    section may overlap by (``0 <= overlap_ratio < 1``, default ``OVERLAP_RATIO`` = 0.2). Raises ``ValueError`` for
    another value.
    """

    kinds = frozenset({"markdown"})
    config_keys = MarkdownClassifier.config_keys

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        self.overlap_ratio = float(self.config.get("overlap_ratio", OVERLAP_RATIO))
        if not 0 <= self.overlap_ratio < 1:
            raise ValueError(f"overlap_ratio must be at least 0 and below 1, got {self.overlap_ratio}")

    def extract(self, file: FileInfo, context: ExtractContext) -> Iterator[Chunk]:
        text, replaced = decode_text(file.read_bytes())
        if replaced:
            log.warning("file_decoded_lossy", path=str(file.path), reason="invalid_utf8", replaced_sequences=replaced)
        overlap = int(context.max_tokens * self.overlap_ratio)
        for chunk in chunk_markdown(text, context.token_offsets, context.max_tokens, file.rel_path,
                                    overlap_tokens=overlap):
            yield Chunk(text=chunk.text, start_line=chunk.start_line, end_line=chunk.end_line, kind="markdown",
                        context=chunk.context, meta=_meta(chunk))
