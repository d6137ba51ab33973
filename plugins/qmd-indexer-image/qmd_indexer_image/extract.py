"""The ``image`` classifier and extractor (entry points in this distribution's ``pyproject.toml``).

Config ``[plugin.image]`` (read by both): ``max_pixels`` (default 64,000,000): larger pictures are refused with an
``ExtractError`` naming the setting; it replaces Pillow's own decompression-bomb limit (89.5 MP) where it is
higher. The byte-size cap is the workspace's ``multimodal.max_file_bytes``, applied by qmd-indexer before
extraction. OCR (``qmd_indexer_image.ocr``), read by the extractor:

- ``ocr`` (default ``true``): read the text in pictures with Tesseract; without Tesseract installed it is off, and
  ``notice`` says so (``qmd-indexer plugins`` and ``status`` show it).
- ``ocr_languages`` (default ``["eng"]``): Tesseract language data, e.g. ``["eng", "chi_sim"]``; checked when the
  plugin loads: a language without data fails the plugin, naming the Debian package to install.
- ``ocr_min_confidence`` (default 60): words Tesseract is less sure of (0-100) are dropped.
- ``ocr_max_pixels`` (default 8,300,000): larger pictures are shrunk to this many pixels before OCR (not refused).
- ``ocr_timeout_s`` (default 60): Tesseract is killed after this many seconds; the picture keeps its image chunk.
- ``ocr_cache``: the SQLite file remembering OCR results by content, the text sealed with a key only the picture's
  bytes give (``ocr.OcrCache``); default ``<state_dir>/ocr-cache.sqlite3`` (in memory without a ``state_dir``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

from indexer.api import Chunk, ExtractContext, ExtractError, FileInfo, chunk_text
from qmd_indexer_image import ocr
from qmd_indexer_image.decode import (
    DEFAULT_MAX_PIXELS,
    ImageDecodeError,
    ImageFacts,
    ImageTooLarge,
    allow_pixels,
    heif_available,
    inspect_image,
    ocr_picture,
)
from qmd_indexer_image.sniff import image_format

SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp", ".gif"})
HEIF_SUFFIXES = frozenset({".heic", ".heif"})
KIND = "image"
#: the keys of ``[plugin.image]``, read by both objects (another key is a config error naming the closest)
CONFIG_KEYS = frozenset({"max_pixels", "ocr", "ocr_languages", "ocr_min_confidence", "ocr_max_pixels",
                         "ocr_timeout_s", "ocr_cache", "state_dir"})

log = structlog.get_logger("qmd_indexer.image")


def suffixes() -> frozenset[str]:
    """The file name endings claimed: HEIF ones only where a Pillow HEIF plugin is installed."""
    return SUFFIXES | HEIF_SUFFIXES if heif_available() else SUFFIXES


class ImageClassifier:
    """``"image"`` for files named like an image. The content is confirmed by the extractor, which reports a
    mislabelled or corrupt file by name instead of it vanishing silently."""

    priority = 100
    config_keys = CONFIG_KEYS

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.suffixes = suffixes()

    def classify(self, path: Path, head: bytes) -> str | None:
        return KIND if path.suffix.lower() in self.suffixes else None


def name_words(rel_path: str) -> str:
    """The words of a file's name: ``"IMG_0042.png"`` -> ``"IMG 0042"``."""
    stem = Path(rel_path).stem
    return " ".join(re.sub(r"[_\-.]+", " ", stem).split()) or stem


def caption(rel_path: str, width: int, height: int, fmt: str, description: str = "") -> str:
    """The chunk text of an image: words of its file name, the path, its size and format, and any description
    embedded in the file (shown as the snippet; its words are searchable by BM25)."""
    text = f"{name_words(rel_path)} (image {rel_path}, {width}x{height} {fmt})"
    return f"{text}: {description}" if description else text


class ImageExtractor:
    """One image file to one ``Chunk(kind="image", modality="image")`` carrying the file's bytes, then, with OCR on,
    its text: ``Chunk(kind="image", modality="text")`` chunks of the recognised lines in reading order (sized like a
    note's by the text embedder's tokens), ``start_line``/``end_line`` counting those lines, ``context`` the words
    of the file name, and ``meta = {"source": "ocr", "box": [left, top, right, bottom], "width", "height",
    "format"}``: ``box`` holds the chunk's lines in the picture's pixels. A picture without text makes no text chunk.

    Raises ``ExtractError`` when the bytes are not an image of a known signature, are corrupt or truncated, or the
    picture is over ``max_pixels``. OCR that fails or runs out of time on a picture is logged (``ocr_failed``, one
    line) and the picture keeps its image chunk; a picture too thin to hold a line (``ocr.MIN_SIDE``) is logged as
    ``ocr_skipped``; an animated one is read from its first frame (``ocr_first_frame``).
    """

    kinds = frozenset({KIND})
    media = True  # indexed only where a workspace's multimodal settings allow "image"
    hit_fields = ("width", "height", "format", "source", "box")
    config_keys = CONFIG_KEYS

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = dict(config or {})
        self.max_pixels = int(config.get("max_pixels", DEFAULT_MAX_PIXELS))
        if self.max_pixels < 1:
            raise ValueError(f"max_pixels must be positive, got {self.max_pixels}")
        allow_pixels(self.max_pixels)  # Pillow's own bomb limit (89.5 MP) must not refuse what max_pixels allows
        languages = config.get("ocr_languages", list(ocr.DEFAULT_LANGUAGES))
        if isinstance(languages, str) or not languages or not all(isinstance(x, str) and x for x in languages):
            raise ValueError(f"[plugin.image] ocr_languages must be a list of Tesseract language names such as "
                             f'["eng", "chi_sim"], got {languages!r}')
        self.languages: tuple[str, ...] = tuple(languages)
        self.min_confidence = float(config.get("ocr_min_confidence", ocr.DEFAULT_MIN_CONFIDENCE))
        self.ocr_max_pixels = int(config.get("ocr_max_pixels", ocr.DEFAULT_OCR_MAX_PIXELS))
        self.timeout_s = float(config.get("ocr_timeout_s", ocr.DEFAULT_TIMEOUT_S))
        if self.ocr_max_pixels < 1 or self.timeout_s <= 0:
            raise ValueError("ocr_max_pixels and ocr_timeout_s must be positive")
        #: what the plugin runs without, for ``qmd-indexer plugins`` and ``status`` (empty: nothing)
        self.notice = ""
        self.ocr = bool(config.get("ocr", True))
        problem = ocr.engine_problem() if self.ocr else None
        if problem:
            self.ocr, self.notice = False, problem
        self.osd = False
        if self.ocr:
            installed = ocr.installed_languages()  # `tesseract --list-langs`: some milliseconds
            ocr.check_languages(self.languages, installed)
            self.osd = "osd" in installed
        cache = config.get("ocr_cache") or (Path(config["state_dir"]) / "ocr-cache.sqlite3"
                                            if config.get("state_dir") else None)
        self.cache = ocr.OcrCache(Path(cache).expanduser() if cache else None)
        self.ocr_rules = (f"qmd-indexer-image ocr v{ocr.CACHE_VERSION} languages={'+'.join(self.languages)} "
                          f"min_confidence={self.min_confidence:g} max_pixels={self.ocr_max_pixels} osd={self.osd}")

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
        except ImageTooLarge as exc:
            raise ExtractError(f"{signature} image too large: {exc}") from None
        except ImageDecodeError as exc:
            raise ExtractError(f"corrupt or unreadable {signature} image: {exc}") from None
        meta: dict[str, Any] = {"width": facts.width, "height": facts.height, "format": facts.format}
        if facts.frames > 1:
            meta["frames"] = facts.frames
        yield Chunk(text=caption(file.rel_path, facts.width, facts.height, facts.format, facts.description),
                    kind=KIND, modality="image", data=data, meta=meta)
        if self.ocr:
            yield from self._text_chunks(file, data, facts, context)

    def read_text(self, data: bytes, facts: ImageFacts, rel_path: str = "") -> list[ocr.OcrLine]:
        """The lines of text in a picture (``data``, already confirmed by ``inspect_image`` into ``facts``), from
        the cache when these bytes were read before; ``[]`` for a picture without text or too thin to hold any
        (``ocr_skipped``, logged once: the verdict is remembered too).
        Raises ``ocr.OcrError``, which is not remembered: the same bytes are read again the next time they are
        extracted (the file changed, or the index is rebuilt)."""
        digest = ocr.OcrCache.digest(data)
        lines = self.cache.get(self.ocr_rules, digest)
        if lines is not None:
            return lines
        if min(facts.width, facts.height) < ocr.MIN_SIDE:
            log.info("ocr_skipped", path=rel_path, reason=f"{facts.width}x{facts.height} pixels: thinner than "
                                                          f"{ocr.MIN_SIDE} px, too thin to hold a line of text")
            self.cache.put(self.ocr_rules, digest, [])
            return []
        if facts.frames > 1:
            log.info("ocr_first_frame", path=rel_path, frames=facts.frames)
        try:
            picture, scale = ocr_picture(data, self.ocr_max_pixels)
        except ImageDecodeError as exc:
            raise ocr.OcrError(f"cannot decode for OCR: {exc}") from None
        lines = ocr.recognise(picture, self.languages, self.min_confidence, self.timeout_s, scale, self.osd)
        self.cache.put(self.ocr_rules, digest, lines)
        return lines

    def _text_chunks(self, file: FileInfo, data: bytes, facts: ImageFacts, context: ExtractContext) -> Iterator[Chunk]:
        try:
            lines = self.read_text(data, facts, file.rel_path)
        except ocr.OcrError as exc:
            log.warning("ocr_failed", path=file.rel_path, error=str(exc))
            return
        if not lines:
            return
        text, words = "\n".join(line.text for line in lines), name_words(file.rel_path)
        budget = max(1, context.max_tokens - len(context.token_offsets(words)) - 1)  # the name is embedded too
        for piece in chunk_text(text, context.token_offsets, budget):
            box = ocr.union([line.box for line in lines[piece.start_line - 1 : piece.end_line]])
            meta = {"source": "ocr", "box": box, "width": facts.width, "height": facts.height,
                    "format": facts.format}
            yield Chunk(text=piece.text, start_line=piece.start_line, end_line=piece.end_line, kind=KIND,
                        modality="text", meta=meta, context=words)
