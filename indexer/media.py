"""Media memory files (a picture under ``memory/``, indexed by a media plugin) as the API serves them: the text the
index holds for one (``media_page``: ``GET /get`` of a picture answers the text its extractor read, e.g. OCR, never
the bytes as text) and a picture's own bytes (``read_picture``: ``GET /media``, what the web page shows).

Both find the file as ``read_memory`` does (``recall.resolve_memory_path``: the indexing rules, the agent's own
workspace) and accept only what the plugins classify as a media kind; the bytes are read through
``indexer.sources.base.open_memory`` (``safeio``: beneath the workspace, no symlink at any component), at most the
workspace's ``multimodal.max_file_bytes``, and served only when their first bytes are a picture a browser shows
(``PICTURES``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from indexer.api import HEAD_BYTES
from indexer.errors import ReadRefused
from indexer.points import point_id
from indexer.recall import resolve_memory_path
from indexer.schema import Page
from indexer.sources.base import open_memory
from indexer.store import Store
from indexer.workspace import Collection

#: first bytes -> media type of the pictures ``GET /media`` serves (PNG, JPEG, GIF, WebP: what every browser shows)
PICTURES = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF87a", "image/gif"),
            (b"GIF89a", "image/gif"))


def find_media(collections: Sequence[Collection], path: str, agent: str | None,
               classify: Callable[[Path, bytes], str | None], media_kinds: frozenset[str]
               ) -> tuple[Collection, Path, str] | None:
    """``(collection, absolute path, kind)`` of ``path`` when it is a media memory file of ``agent``'s workspace
    (``classify``, the registry's, names one of ``media_kinds``, and the workspace's ``multimodal`` indexes that
    kind), ``None`` when it is a file of another kind or of a kind not indexed there.
    Raises what ``resolve_memory_path`` raises (``ReadRefused``, ``FileNotFoundError``, ``KeyError``)."""
    collection, candidate = resolve_memory_path(collections, path, agent)
    with open_memory(collection, candidate) as handle:
        kind = classify(candidate, handle.read(HEAD_BYTES))
    if kind not in media_kinds or not collection.workspace.multimodal.allows(kind):  # off here: not memory
        return None
    return collection, candidate, kind


def media_page(store: Store, collection: str, abs_path: Path, points: int, rel_path: str, kind: str,
               from_line: int, lines: int, max_chars: int) -> Page:
    """A page of the text the index holds for media file ``abs_path`` (``points`` chunks in ``collection``): its
    text chunks in chunk order (a picture's OCR lines; not its caption), as lines ``from_line``.. (at most ``lines``
    lines and ``max_chars`` characters, whole lines). ``kind`` says it is not a text file (``Page.kind``); the text
    is empty for a file not indexed yet or one whose extractor read none."""
    ids = [point_id(collection, str(abs_path), index) for index in range(points)]
    found = store.payloads(collection, ids) if ids else {}
    text = "\n".join(found[i].text for i in ids if i in found and found[i].modality == "text" and found[i].text)
    every = text.split("\n") if text else []
    shown: list[str] = []
    for line in every[from_line - 1:from_line - 1 + lines]:
        if shown and sum(len(s) + 1 for s in shown) + len(line) > max_chars:
            break
        shown.append(line[:max_chars])
    last = from_line + len(shown) - 1
    more = last < len(every)
    return {"path": rel_path, "collection": collection, "from": from_line, "to": last, "text": "\n".join(shown),
            "truncated": more, "next_from": last + 1 if more else None, "kind": kind}


def read_picture(collection: Collection, abs_path: Path) -> tuple[bytes, str]:
    """``(bytes, media type)`` of picture ``abs_path`` of ``collection``, read beneath its workspace. Raises
    ``ReadRefused`` when it is larger than ``multimodal.max_file_bytes`` or not a picture of ``PICTURES``."""
    cap = collection.workspace.multimodal.max_file_bytes
    with open_memory(collection, abs_path) as handle:
        data = handle.read(cap + 1)
    if len(data) > cap:
        raise ReadRefused(f"{abs_path.name}: larger than multimodal.max_file_bytes ({cap})")
    media_type = next((kind for magic, kind in PICTURES if data.startswith(magic)), None)
    if media_type is None and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        media_type = "image/webp"
    if media_type is None:
        raise ReadRefused(f"{abs_path.name}: not a picture the page can show (PNG, JPEG, GIF or WebP)")
    return data, media_type

