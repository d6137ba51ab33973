"""The session transcripts' reader: a workspace's ``sessions`` folder, read by the transcript format plugins.

A transcript last written more than the workspace's ``sessions_max_age_days`` ago is past its retention (skipped
``expired``: its points go); a file no format sniffs is no transcript (``not_a_transcript``). One that grew is read
from its tail (``indexer.sources.tailing``) when the indexed prefix can be trusted, else whole, streamed
(``indexer.sources.transcripts``); its messages are always redacted, whatever the workspace's ``redact_secrets``.
The ``Tail`` is read back from chunk 0 when the daemon connects (``restore``), and ``get`` pages it as turns.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING

from indexer.api import HEAD_BYTES, Chunk, TranscriptFormat
from indexer.errors import ExtractError, FileSkipped, ReadRefused
from indexer.points import FileState, stat_identity
from indexer.redact import Redactor
from indexer.safeio import UnsafePath
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
    unsafe_skip,
    utf8_name,
)
from indexer.sources.tailing import Tail, TailRead, read_tail, read_whole, restore_tails
from indexer.sources.transcripts import KIND, ROLES, Reading, render_page
from indexer.workspace import Collection, display_path

if TYPE_CHECKING:
    from collections.abc import Callable

    from indexer.config import Settings
    from indexer.schema import Page
    from indexer.state import Indexed
    from indexer.store import Store

#: what a transcript's windows are read under (``Tail.settings``): the roles indexed, the tool result cut
#: (characters) and the redaction's version
Settings3 = tuple[tuple[str, ...], int, str]


class TranscriptReader:
    """Reads session transcripts (see the module); the ``indexer.sources.Reader`` of the sources named
    ``transcripts``."""

    classified = False
    sessions = True

    def redactor(self, settings: Settings | None, collection: Collection) -> Redactor:
        """Always on, with the user's patterns: a chat holds what people paste."""
        return Redactor.from_settings(settings, collection.workspace, always=True)

    def expired(self, collection: Collection, st: os.stat_result) -> bool:
        """Whether the transcript was last written (``st.st_mtime``) more than its workspace's
        ``sessions_max_age_days`` ago."""
        max_age = collection.workspace.sessions_max_age_days
        return max_age is not None and st.st_mtime < time.time() - max_age * 86400

    def restore(self, store: Store, name: str, states: Mapping[str, FileState],
                held: Mapping[str, Indexed]) -> dict[str, FileState]:
        """``states`` with the ``Tail`` each transcript's chunk 0 records (``indexer.sources.tailing.restore_tails``),
        so that a restart reads only what was appended since."""
        return restore_tails(store, name, states, held)

    def prepare(self, setup: ReadSetup, collection: Collection, path: Path, known: FileState | None,
                st: os.stat_result) -> Prepared | Unchanged:
        """Transcript ``path`` read from its tail or whole into windows of turns; ``Unchanged`` when its stat, or
        its hash at the same size, says the store holds it. Raises ``FileSkipped`` (``expired``,
        ``undecodable_name``, ``too_large``, ``not_a_transcript``...), ``ExtractError`` and ``FileNotFoundError``."""
        redactor = setup.redactor
        if self.expired(collection, st):
            max_age = collection.workspace.sessions_max_age_days
            raise FileSkipped("expired", f"last written more than sessions_max_age_days ({max_age:g}) ago")
        if unchanged_by_stat(known, st, redactor.version):
            return Unchanged(path)
        if not utf8_name(str(path)):
            raise FileSkipped("undecodable_name")
        workspace = collection.workspace
        roles = ROLES + (("tool",) if workspace.sessions_tool_results else ())
        settings: Settings3 = (roles, workspace.sessions_tool_result_chars, redactor.version)
        tail = known.tail if known is not None and current(known, redactor.version) else None
        if tail is not None:  # a file that grew: its tail alone (``indexer.sources.tailing``)
            grown = _read(setup, collection, path, settings, tail)
            if isinstance(grown, Prepared):
                grown.file_hash = known.file_hash if known is not None else grown.file_hash  # the points' version
                return grown
        st, head, content_hash = read_fingerprint(path, setup.sessions_max_file_bytes, collection)
        file_hash = index_hash(content_hash, redactor.version)
        # a transcript's points keep the hash of its last whole read while tails are appended (``tailing``): the
        # same hash is the same content only at the same size (a file cut back to that read is re-chunked); one
        # indexed without its tail (points of an earlier version) is re-chunked once, so it has one
        if (known is not None and current(known, redactor.version) and known.file_hash == file_hash
                and known.size_bytes == st.st_size and (known.tail is not None or not known.points)):
            return Unchanged(path, stat_identity(st))
        prepared = _read(setup, collection, path, settings, None)
        assert prepared is not None
        prepared.file_hash = file_hash
        return prepared

    def page(self, collection: Collection, path: Path, from_line: int, lines: int | None, max_chars: int,
             redactor: Redactor, sniff: Callable[[bytes], tuple[str, TranscriptFormat] | None] | None) -> Page:
        """``get``'s page of transcript ``path``: its turns from JSONL line ``from_line`` on, each whole on one line
        (``indexer.sources.transcripts.render_page``), redacted as when indexed; ``from``, ``to``, ``lines`` and
        ``next_from`` count JSONL lines. Raises ``ReadRefused`` when no format (``sniff``) claims it."""
        with open_memory(collection, path) as handle:
            found = sniff(handle.read(HEAD_BYTES)) if sniff is not None else None
            if found is None:
                raise ReadRefused(f"{path.name}: not a session transcript any format plugin reads")
            handle.seek(0)
            shown, last, truncated = render_page(handle, found[1], from_line, lines, max_chars,
                                                 collection.workspace.sessions_tool_results, redactor.redact)
        return {"path": display_path(collection, path), "collection": collection.name,
                "from": from_line, "to": last, "text": "\n".join(shown), "truncated": truncated,
                "next_from": last + 1 if truncated else None}


def _read(setup: ReadSetup, collection: Collection, path: Path, settings: Settings3,
          tail: Tail | None) -> Prepared | None:
    """Transcript ``path`` read whole (``tail`` ``None``) or from ``tail``'s open window on, as a ``Prepared``
    (``file_hash`` left for the caller); ``None`` when the tail cannot be trusted (``indexer.sources.tailing``).
    Raises ``FileSkipped`` (``too_large``, ``not_a_transcript``) and ``ExtractError`` when it cannot be read."""
    try:
        with open_file_beneath(collection, path) as handle:
            st = os.fstat(handle.fileno())
            if st.st_size > setup.sessions_max_file_bytes:
                raise FileSkipped("too_large", f"{st.st_size} bytes > limit {setup.sessions_max_file_bytes}")
            found = setup.registry.transcript_format(handle.read(HEAD_BYTES))
            if found is None:
                raise FileSkipped("not_a_transcript", "no transcript format plugin recognises its content")
            handle.seek(0)
            read = _chunks(setup, handle, st, found[1], path, settings, tail)
    except UnsafePath as exc:
        raise unsafe_skip(exc) from None
    except PermissionError:
        raise FileSkipped("permission_denied", "no read permission") from None
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ExtractError(f"cannot read: {exc.strerror or exc}") from exc
    except (FileSkipped, ExtractError):
        raise
    except Exception as exc:  # a bug in reading one transcript fails that file, not the batch it came in
        raise ExtractError(f"{type(exc).__name__} reading the transcript: {exc}") from exc
    if read is None:
        return None
    chunks, tail_read = read
    return Prepared(collection, path, display_path(collection, path), KIND, "", st.st_size,
                    st.st_mtime_ns, chunks, st.st_ctime_ns, st.st_ino, st.st_dev, tail=tail_read)


def _chunks(setup: ReadSetup, handle: IO[bytes], st: os.stat_result, fmt: TranscriptFormat, path: Path,
            settings: Settings3, tail: Tail | None) -> tuple[list[Chunk], TailRead] | None:
    """The chunks of the transcript open in ``handle`` (at its start; ``st`` its ``fstat``) and what the read adds
    to its ``Prepared``: read whole (``tail`` ``None``) or from ``tail``'s open window on (``None`` when the tail
    cannot be trusted). ``settings``: ``(roles, tool result cut, redaction version)``."""
    roles, tool_chars, _ = settings
    reading = Reading(roles=roles, tool_chars=tool_chars, redact=setup.redactor.redact, source=str(path))
    if tail is None:
        chunks, new_tail = read_whole(handle, st, fmt, reading, setup.context, path.stem, settings)
        return chunks, TailRead(new_tail, reading.end, reading.lines)
    grown = read_tail(handle, st, tail, fmt, reading, setup.context, path.stem, settings)
    if grown is None:
        return None
    chunks, new_tail = grown
    indexes = list(range(tail.open_index, new_tail.chunk_count))
    if tail.open_index:  # chunk 0 carries the file's state: rewritten with it, first
        chunks, indexes = [new_tail.first, *chunks], [0, *indexes]
    return chunks, TailRead(new_tail, reading.end - tail.open_offset, reading.lines - tail.open_line + 1, indexes,
                            new_tail.chunk_count)
