"""Sources: what reading one file of a collection yields, per source.

A collection's ``indexer.workspace.Source`` (the table ``SOURCES``: which folder, which names, which corpus) names
its reader (``Source.reader``); ``READERS`` maps that name to the ``Reader``, and ``reader(collection)`` finds it.
Everything that reads a file asks the reader, never the source by name: the pipeline (``Reader.prepare``: a file
into chunks), the daemon's scan (``Reader.expired``, ``Reader.restore``: retention and what a restart reads back),
``get`` (``Reader.page``), the redaction policy (``Reader.redactor``) and ``status`` (``Reader.sessions``).

Two readers: notes (``indexer.sources.notes``: classified, extracted by the extractor plugins, redacted where the
workspace says so, paged as lines) and session transcripts (``indexer.sources.sessions``: retention, whole or tail
reads of the JSON Lines (``indexer.sources.transcripts``, ``indexer.sources.tailing``), always redacted, paged as
turns). A third source is one ``Reader`` registered here and one ``Source`` row naming it (``tests/test_sources.py``
adds a plain-text inbox).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from indexer.sources.notes import NotesReader
from indexer.sources.sessions import TranscriptReader

if TYPE_CHECKING:
    from indexer.api import TranscriptFormat
    from indexer.config import Settings
    from indexer.points import FileState
    from indexer.redact import Redactor
    from indexer.schema import Page
    from indexer.sources.base import Prepared, ReadSetup, Unchanged
    from indexer.state import Indexed
    from indexer.store import Store
    from indexer.workspace import Collection

#: the registry's transcript sniffing (``Registry.transcript_format``): a file's first bytes -> (name, format)
Sniff = Callable[[bytes], "tuple[str, TranscriptFormat] | None"]


class Reader(Protocol):
    """How one source's files are read. ``classified``: ``get`` asks the classifiers for a file's kind before
    reading it (a note; else the reader refuses what it cannot read itself). ``sessions``: its files are sessions,
    counted with their turns in ``status``."""

    classified: bool
    sessions: bool

    def redactor(self, settings: Settings | None, collection: Collection) -> Redactor:
        """The redactor of ``collection``'s text (``settings`` ``None``: the defaults)."""
        ...

    def expired(self, collection: Collection, st: os.stat_result) -> bool:
        """Whether a file with ``lstat`` result ``st`` is past its source's retention (its points are dropped)."""
        ...

    def prepare(self, setup: ReadSetup, collection: Collection, path: Path, known: FileState | None,
                st: os.stat_result) -> Prepared | Unchanged:
        """Regular file ``path`` (``st``: its ``lstat``) read into chunks, or ``Unchanged`` against ``known``
        (what the store holds of it). Raises ``FileSkipped``, ``ExtractError`` and ``FileNotFoundError``."""
        ...

    def restore(self, store: Store, name: str, states: Mapping[str, FileState],
                held: Mapping[str, Indexed]) -> dict[str, FileState]:
        """``states`` (abs path -> what collection ``name`` holds) with what the reader keeps in the store read
        back when the daemon connects; ``held``: what the daemon holds indexed now. Raises ``StoreUnavailable``."""
        ...

    def page(self, collection: Collection, path: Path, from_line: int, lines: int | None, max_chars: int,
             redactor: Redactor, sniff: Sniff | None) -> Page:
        """``get``'s page of ``path`` from line ``from_line`` (1-based): at most ``lines`` lines and ``max_chars``
        characters (see ``indexer.recall.read_memory``). Raises ``ReadRefused`` and ``OSError``."""
        ...


#: reader name (``Source.reader``) -> its reader
READERS: dict[str, Reader] = {"notes": NotesReader(), "transcripts": TranscriptReader()}


def reader(collection: Collection) -> Reader:
    """The reader of ``collection``'s source. Raises ``KeyError`` for a source whose reader is not registered."""
    return READERS[collection.source.reader]


def redactor(settings: Settings | None, collection: Collection) -> Redactor:
    """The redactor of ``collection``'s chunks and pages (its reader's policy, ``Reader.redactor``)."""
    return reader(collection).redactor(settings, collection)
