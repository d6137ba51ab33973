"""The notes' reader: the root memory files, ``memory/`` and the extra paths, read by the plugins.

A note is classified by its first bytes (``Registry.classify``; the root memory files must be markdown), extracted
into chunks by its kind's extractor plugin, checked against the workspace's multimodal settings when it is media,
and redacted where the workspace's ``redact_secrets`` (else the global one) says so. ``get`` pages it as lines.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from indexer.api import Chunk, FileInfo
from indexer.errors import ExtractError, FileSkipped
from indexer.points import FileState, stat_identity
from indexer.redact import Redactor
from indexer.sources.base import (
    Prepared,
    ReadSetup,
    Unchanged,
    current,
    index_hash,
    open_file_beneath,
    open_memory,
    read_fingerprint,
    unchanged_by_stat,
    utf8_name,
)
from indexer.workspace import Collection, display_path, rel_path

if TYPE_CHECKING:
    from indexer.config import Settings
    from indexer.schema import Page
    from indexer.state import Indexed
    from indexer.store import Store


class NotesReader:
    """Reads notes (see the module); the ``indexer.sources.Reader`` of the sources named ``notes``."""

    classified = True
    sessions = False

    def redactor(self, settings: Settings | None, collection: Collection) -> Redactor:
        """The workspace's ``redact_secrets`` (else the global one) with the user's patterns."""
        return Redactor.from_settings(settings, collection.workspace)

    def expired(self, collection: Collection, st: os.stat_result) -> bool:
        """Never: notes have no retention."""
        return False

    def restore(self, store: Store, name: str, states: Mapping[str, FileState],
                held: Mapping[str, Indexed]) -> dict[str, FileState]:
        """``states`` as they are: a note keeps nothing beyond its points' file state."""
        return dict(states)

    def prepare(self, setup: ReadSetup, collection: Collection, path: Path, known: FileState | None,
                st: os.stat_result) -> Prepared | Unchanged:
        """Note ``path`` classified, extracted and redacted; ``Unchanged`` when its stat or its content hash says
        the store holds it. Raises ``FileSkipped`` (``unsupported_type``, ``modality_disabled``, ``too_large``,
        ``undecodable_name``, ``no_extractor``, ``no_embedder``...), ``ExtractError`` (the plugin's own error, or
        any exception it raised) and ``FileNotFoundError``."""
        redactor = setup.redactor
        if unchanged_by_stat(known, st, redactor.version):
            return Unchanged(path)
        registry, multimodal = setup.registry, collection.workspace.multimodal
        cap = max(setup.max_file_bytes, multimodal.max_file_bytes if multimodal.enabled else 0)
        st, head, content_hash = read_fingerprint(path, cap, collection)
        file_hash = index_hash(content_hash, redactor.version)
        kind = registry.classify(path, head)
        if kind is None:
            raise FileSkipped("unsupported_type", "no classifier claims it")
        if collection.role == "root" and kind != "markdown":
            raise FileSkipped("unsupported_type", "the root memory file must be markdown")
        if kind in registry.media_kinds:  # declared by the extractor plugins (``media = True``)
            if not multimodal.allows(kind):
                raise FileSkipped("modality_disabled", f"{kind} indexing is off for this workspace")
            if st.st_size > multimodal.max_file_bytes:
                raise FileSkipped("too_large", f"{st.st_size} bytes > multimodal limit {multimodal.max_file_bytes}")
        elif st.st_size > setup.max_file_bytes:
            raise FileSkipped("too_large", f"{st.st_size} bytes > limit {setup.max_file_bytes}")
        if known is not None and current(known, redactor.version) and known.file_hash == file_hash:
            return Unchanged(path, stat_identity(st))
        if not utf8_name(str(path)):  # memory, but its name cannot be stored: the ledger's detail says to rename it
            raise FileSkipped("undecodable_name")
        info = FileInfo(path, rel_path(collection.workspace, path), kind, st.st_size,
                        opener=lambda: open_file_beneath(collection, path))
        chunks = self._extract(setup, info)
        return Prepared(collection, path, info.rel_path, kind, file_hash, st.st_size, st.st_mtime_ns, chunks,
                        st.st_ctime_ns, st.st_ino, st.st_dev)

    @staticmethod
    def _extract(setup: ReadSetup, info: FileInfo) -> list[Chunk]:
        """The redacted chunks of ``info`` by its kind's extractor, those of a modality without a loaded embedder
        left out (an image's picture without CLIP, while the text read out of it is indexed). Raises
        ``FileSkipped`` (``no_extractor``; ``no_embedder`` for a file left with none) and ``ExtractError``."""
        registry = setup.registry
        extractor = registry.extractors.get(info.kind)
        if extractor is None:
            raise FileSkipped("no_extractor", f"no extractor plugin handles kind {info.kind!r}")
        try:
            chunks = list(extractor.extract(info, setup.context))
        except (ExtractError, FileSkipped, FileNotFoundError):
            raise
        except Exception as exc:  # a plugin's own bug must not stop the daemon; report it for this file
            raise ExtractError(f"{type(exc).__name__} in extractor for {info.kind!r}: {exc}") from exc
        kept = [chunk for chunk in chunks if chunk.modality in registry.embedders]
        if chunks and not kept:
            missing = sorted({chunk.modality for chunk in chunks})
            raise FileSkipped("no_embedder", f"no embedder of modality {', '.join(map(repr, missing))} is loaded")
        # secrets out before anything is embedded, cached, keyword-indexed, stored, shown or logged (indexer.redact)
        return setup.redactor.chunks(kept)

    def page(self, collection: Collection, path: Path, from_line: int, lines: int | None, max_chars: int,
             redactor: Redactor, sniff: object = None) -> Page:
        """``get``'s page of note ``path``: whole lines ``from``..``to``, redacted, at most ``lines`` of them in
        ``max_chars`` characters, or the first line cut to ``max_chars`` (``line_truncated``); see
        ``indexer.recall.read_memory``."""
        out, truncated, line_cut = page_lines(collection, path, from_line, lines, max_chars, redactor)
        result: Page = {
            "path": display_path(collection, path),
            "collection": collection.name,
            "from": from_line,
            "to": from_line + len(out) - 1,
            "text": "\n".join(out),
            "truncated": truncated,
            "next_from": from_line + len(out) if truncated and not line_cut else (from_line + 1 if line_cut else None),
        }
        if line_cut:
            result["line_truncated"] = True
        return result


def page_lines(collection: Collection, abs_path: Path, from_line: int, lines: int | None, max_chars: int,
               redactor: Redactor) -> tuple[list[str], bool, bool]:
    """A note's lines from ``from_line`` (1-based), redacted: at most ``lines`` whole lines within ``max_chars``
    characters joined with newlines, or the first line cut to ``max_chars``. Returns ``(lines, truncated,
    line_cut)``: ``truncated`` when a limit stopped the read, ``line_cut`` when it cut a line."""
    out: list[str] = []
    used = 0
    truncated = line_cut = False
    with open_memory(collection, abs_path, text=True) as handle:
        for line_no, raw in enumerate(redactor.lines(handle, from_line), 1):  # from line 1: a block may start before
            if line_no < from_line:
                continue
            line = raw.rstrip("\n")
            if (lines is not None and len(out) >= lines) or (out and used + 1 + len(line) > max_chars):
                truncated = True
                break
            if not out and len(line) > max_chars:
                out.append(line[:max_chars])
                truncated = line_cut = True
                break
            used += len(line) + (1 if out else 0)  # joined with "\n" between lines
            out.append(line)
    return out, truncated, line_cut
