"""The ``image`` classifier and extractor (entry points in this distribution's ``pyproject.toml``).

Config ``[plugin.image]`` (read by both): ``max_pixels`` (default 64,000,000): larger pictures are refused with an
``ExtractError``. The byte-size cap is the workspace's ``multimodal.max_file_bytes``, applied by qmd-indexer before
extraction.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from indexer.api import Chunk, ExtractContext, ExtractError, FileInfo
from qmd_indexer_image.decode import DEFAULT_MAX_PIXELS, ImageDecodeError, heif_available, inspect_image
from qmd_indexer_image.sniff import image_format

SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp", ".gif"})
HEIF_SUFFIXES = frozenset({".heic", ".heif"})
KIND = "image"


def suffixes() -> frozenset[str]:
    """The file name endings claimed: HEIF ones only where a Pillow HEIF plugin is installed."""
    return SUFFIXES | HEIF_SUFFIXES if heif_available() else SUFFIXES


class ImageClassifier:
    """``"image"`` for files named like an image. The content is confirmed by the extractor, which reports a
    mislabelled or corrupt file by name instead of it vanishing silently."""

    priority = 100

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.suffixes = suffixes()

    def classify(self, path: Path, head: bytes) -> str | None:
        return KIND if path.suffix.lower() in self.suffixes else None


def caption(rel_path: str, width: int, height: int, fmt: str, description: str = "") -> str:
    """The chunk text of an image: words of its file name, the path, its size and format, and any description
    embedded in the file (shown as the snippet; its words are searchable by BM25)."""
    stem = Path(rel_path).stem
    words = " ".join(re.sub(r"[_\-.]+", " ", stem).split()) or stem
    text = f"{words} (image {rel_path}, {width}x{height} {fmt})"
    return f"{text}: {description}" if description else text


class ImageExtractor:
    """One image file to one ``Chunk(kind="image", modality="image")`` carrying the file's bytes.

    Raises ``ExtractError`` when the bytes are not an image of a known signature, are corrupt or truncated, or the
    picture is over ``max_pixels``.
    """

    kinds = frozenset({KIND})
    media = True  # indexed only where a workspace's multimodal settings allow "image"
    hit_fields = ("width", "height", "format")

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = dict(config or {})
        self.max_pixels = int(config.get("max_pixels", DEFAULT_MAX_PIXELS))
        if self.max_pixels < 1:
            raise ValueError(f"max_pixels must be positive, got {self.max_pixels}")

    def extract(self, file: FileInfo, context: ExtractContext) -> Iterator[Chunk]:
        data = file.read_bytes()
        signature = image_format(data[:32])
        if signature is None:
            raise ExtractError(f"not an image: the first bytes {data[:8]!r} match no PNG, JPEG, GIF, WebP or HEIF "
                               f"signature")
        if signature == "HEIF" and not heif_available():
            raise ExtractError("HEIF/HEIC image, but no Pillow HEIF plugin is installed (pip install pillow-heif)")
        try:
            facts = inspect_image(data, self.max_pixels)
        except ImageDecodeError as exc:
            raise ExtractError(f"corrupt or unreadable {signature} image: {exc}") from None
        meta: dict[str, Any] = {"width": facts.width, "height": facts.height, "format": facts.format}
        if facts.frames > 1:
            meta["frames"] = facts.frames
        yield Chunk(text=caption(file.rel_path, facts.width, facts.height, facts.format, facts.description),
                    kind=KIND, modality="image", data=data, meta=meta)
