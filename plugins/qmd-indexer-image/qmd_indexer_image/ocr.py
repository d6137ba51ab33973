"""Text read out of pictures with Tesseract (through pytesseract): lines in reading order, each with its pixel box.

Tesseract runs as its own process (pytesseract starts the ``tesseract`` command), killed after ``timeout_s``; the
picture handed to it is first shrunk to at most ``max_pixels`` (``decode.ocr_picture``), and boxes are scaled back
to the original picture's pixels. Page segmentation mode 1 (automatic, with orientation and script detection) reads
text turned by 90, 180 or 270 degrees in the same pass, boxes still in the unturned picture's coordinates.

Words Tesseract is less than ``min_confidence`` sure of (0-100) are dropped: on noise and photos it reports
fragments such as ``"Ke"`` or ``"3c"`` at 20-45, while rendered text scores 90 and over. ``plugins/bench_ocr.py``
measured the threshold on 50 rendered screenshots and 6 photos: word precision 0.969 at 0, 0.973 at 50-60, 0.975 at
70, 0.978 at 80; recall 0.960 at 0, 0.957 from 30 to 70, 0.955 at 80, 0.943 at 90. 60 keeps all of the recall
30-70 keep and most of the precision, with a margin below real screenshots' lower scores.

Results are remembered by content (``OcrCache``, over ``indexer.api.KeyedCache``), keyed like an embedding: by a
hash (sha512) of the picture's bytes and of everything that could change the text (languages, threshold, pixel cap,
Tesseract's version). The text is stored sealed with a key that only the picture's bytes give: a key read in a
screenshot, which answers show redacted (``indexer.redact``), is not kept readable under the state dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from indexer.api import KeyedCache, cache_key

DEFAULT_LANGUAGES = ("eng",)
#: words below this Tesseract confidence (0-100) are dropped (measured: see the module docstring)
DEFAULT_MIN_CONFIDENCE = 60
#: pictures over this many pixels are shrunk before OCR (a 4K screenshot is 8.3 MP)
DEFAULT_OCR_MAX_PIXELS = 8_300_000
DEFAULT_TIMEOUT_S = 60.0
#: a picture whose shorter side is under this many pixels holds no legible line (a 1x50000 strip): OCR is skipped
MIN_SIDE = 8
CACHE_VERSION = 2  # bump when what is stored, or how lines are built, changes (2: the text sealed)


class OcrError(RuntimeError):
    """Tesseract failed or ran out of time on one picture; the message says which."""


def debian_package(language: str) -> str:
    """The Debian package holding Tesseract's data for ``language`` (``"chi_sim"`` -> ``tesseract-ocr-chi-sim``)."""
    return "tesseract-ocr-" + language.lower().replace("_", "-")


def engine_problem() -> str | None:
    """Why OCR cannot run here (pytesseract or the ``tesseract`` command missing), in one line saying what to
    install; ``None`` when it can."""
    try:
        import pytesseract
    except ImportError:
        return "OCR off: pytesseract is not installed (pip install pytesseract)"
    command = pytesseract.pytesseract.tesseract_cmd
    if shutil.which(command) is None:
        return f"OCR off: Tesseract is not installed ({command!r} not found; apt-get install tesseract-ocr)"
    return None


def installed_languages() -> set[str]:
    """The language data Tesseract finds (``tesseract --list-langs``), e.g. ``{"eng", "chi_sim", "osd"}``."""
    import pytesseract

    return set(pytesseract.get_languages(config=""))


def check_languages(languages: Sequence[str], installed: set[str]) -> None:
    """Raise ``ValueError`` naming the Debian package of each of ``languages`` not in ``installed``."""
    missing = [lang for lang in languages if lang not in installed]
    if missing:
        packages = " ".join(debian_package(lang) for lang in missing)
        raise ValueError(f"[plugin.image] ocr_languages: no Tesseract data for {', '.join(missing)} (installed: "
                         f"{', '.join(sorted(installed - {'osd'})) or 'none'}); apt-get install {packages}")


@dataclass(frozen=True, slots=True)
class OcrLine:
    """One line of recognised text: ``text`` (its kept words in reading order), ``box`` ``(left, top, right,
    bottom)`` in the original picture's pixels, and ``confidence``: the mean of its words' (0-100)."""

    text: str
    box: tuple[int, int, int, int]
    confidence: float


def _wide(ch: str) -> bool:
    """Whether ``ch`` belongs to a script written without spaces between words (Han, kana, Hangul syllables)."""
    return unicodedata.east_asian_width(ch) in ("W", "F")


def join_words(words: Sequence[str]) -> str:
    """Words of one line as text: a space between words, none where both sides are CJK (Tesseract's ``chi_sim``
    returns ``硬件 商店``, written ``硬件商店``)."""
    out = ""
    for word in words:
        if out and not (_wide(out[-1]) and _wide(word[0])):
            out += " "
        out += word
    return out


def lines_from_data(data: dict[str, list[Any]], min_confidence: float, scale: float = 1.0) -> list[OcrLine]:
    """Lines out of pytesseract's ``image_to_data`` dictionary, in Tesseract's reading order (block, paragraph,
    line); words under ``min_confidence`` are dropped, and so is a line left empty. Boxes are divided by ``scale``
    (the factor the picture was shrunk by) and rounded to whole pixels."""
    order: list[tuple[int, int, int, int]] = []
    words: dict[tuple[int, int, int, int], list[tuple[str, float, int, int, int, int]]] = {}
    for i, raw in enumerate(data["text"]):
        word = str(raw).strip()
        confidence = float(data["conf"][i])
        if not word or confidence < min_confidence:
            continue
        key = (int(data["page_num"][i]), int(data["block_num"][i]), int(data["par_num"][i]), int(data["line_num"][i]))
        if key not in words:
            order.append(key)
            words[key] = []
        left, top = int(data["left"][i]), int(data["top"][i])
        words[key].append((word, confidence, left, top, left + int(data["width"][i]), top + int(data["height"][i])))
    lines = []
    for key in order:
        kept = words[key]
        box = (min(w[2] for w in kept), min(w[3] for w in kept), max(w[4] for w in kept), max(w[5] for w in kept))
        lines.append(OcrLine(join_words([w[0] for w in kept]), shrunk(box, scale),
                             round(sum(w[1] for w in kept) / len(kept), 1)))
    return lines


def shrunk(box: tuple[int, int, int, int], scale: float) -> tuple[int, int, int, int]:
    """``box`` divided by ``scale`` (the factor a picture was shrunk by), rounded to whole pixels."""
    return round(box[0] / scale), round(box[1] / scale), round(box[2] / scale), round(box[3] / scale)


def union(boxes: Sequence[tuple[int, int, int, int]]) -> list[int]:
    """The smallest ``[left, top, right, bottom]`` holding every box of ``boxes``."""
    return [min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes)]


#: Tesseract's binarisations, tried in turn until one yields text: Otsu's global threshold (its default), then
#: Sauvola's adaptive one, which reads low-contrast text over a noisy background where Otsu's finds none (and misses
#: some that Otsu's reads, so it is the fallback)
THRESHOLDINGS = ("", "-c thresholding_method=2")


def unturn(box: tuple[int, int, int, int], angle: int, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """``box`` found in a picture of ``size`` (width, height) turned ``angle`` (90 or 270) degrees counter-clockwise
    (``Image.rotate(angle, expand=True)``), in the unturned picture's pixels."""
    left, top, right, bottom = box
    width, height = size
    if angle == 90:  # (x, y) went to (y, width - x)
        return width - bottom, left, width - top, right
    return top, height - right, bottom, height - left  # 270: (x, y) went to (height - y, x)


def recognise(picture: Any, languages: Sequence[str], min_confidence: float, timeout_s: float, scale: float = 1.0,
              osd: bool = True) -> list[OcrLine]:
    """OCR of a PIL picture: its lines (``lines_from_data``), from the first of ``THRESHOLDINGS`` that keeps any.
    ``osd``: detect the page's orientation (mode 1; needs the ``osd`` data of ``tesseract-ocr-osd``), else mode 3.
    Orientation detection needs enough characters (two short lines of Chinese are too few): a picture taller than
    wide in which neither pass keeps a word is also read turned 90 and 270 degrees, and the turn that keeps more
    characters wins. Boxes are in the picture's own pixels, divided by ``scale``. Raises ``OcrError`` when
    Tesseract fails or all passes together run over ``timeout_s`` seconds (the process is killed)."""
    import pytesseract

    deadline = time.monotonic() + timeout_s

    def read(image: Any, thresholding: str) -> list[OcrLine]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise OcrError(f"Tesseract process timeout after {timeout_s:g} s")
        try:
            data = pytesseract.image_to_data(image, lang="+".join(languages),
                                             config=f"--psm {1 if osd else 3} {thresholding}".strip(),
                                             output_type=pytesseract.Output.DICT, timeout=left)
        except pytesseract.TesseractError as exc:
            raise OcrError(f"Tesseract failed: {exc.message or exc.status}") from None
        except pytesseract.TesseractNotFoundError as exc:  # uninstalled while the daemon runs
            raise OcrError(f"{exc}; apt-get install tesseract-ocr") from None
        except RuntimeError as exc:  # pytesseract's timeout: "Tesseract process timeout" (the process was killed)
            raise OcrError(f"{exc} after {timeout_s:g} s" if "timeout" in str(exc).lower() else str(exc)) from None
        return lines_from_data(data, min_confidence)

    lines: list[OcrLine] = []
    for thresholding in THRESHOLDINGS:
        lines = read(picture, thresholding)
        if lines:
            break
    if not lines and picture.height > picture.width:
        turns = [(angle, read(picture.rotate(angle, expand=True), THRESHOLDINGS[0])) for angle in (90, 270)]
        angle, lines = max(turns, key=lambda turn: sum(len(line.text) for line in turn[1]))
        lines = [OcrLine(line.text, unturn(line.box, angle, picture.size), line.confidence) for line in lines]
    return [OcrLine(line.text, shrunk(line.box, scale), line.confidence) for line in lines]


class OcrCache:
    """Lines remembered for a picture's bytes under ``rules`` (what could change its text) in a ``KeyedCache``
    (``indexer.api``) at ``path`` (``None``: in memory, for this process), opened on first use so that loading the
    plugin touches no disk. Thread-safe. A file that cannot be read or written never raises (a corrupt one is set
    aside and started again): the picture is read again.

    A picture is known by its ``digest`` (the sha512 of its bytes, never stored). A record is kept under ``key``
    (made of the digest's first half): a random 12-byte nonce and the lines as JSON sealed with AES-256-GCM (the
    ``cryptography`` package) under ``seal_key`` (made of its second half): the text, secrets a screenshot may show
    included, cannot be read back without the picture itself, while whoever has the picture has its text anyway.
    The tables of earlier layouts (``ocr``: version 1, the text in clear; ``ocr_sealed``) are dropped when the file
    opens, and the file vacuumed and its write-ahead log emptied so that no page of them stays."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._records = KeyedCache(path, "ocr_lines", retired=("ocr", "ocr_sealed"))

    @staticmethod
    def digest(data: bytes) -> bytes:
        """The sha512 of a picture's bytes ``data`` (64 bytes), what ``get`` and ``put`` take: one pass over them.
        Not the sha256 the index keeps of a file, so nothing stored gives it."""
        return hashlib.sha512(data).digest()

    @staticmethod
    def key(rules: str, digest: bytes) -> bytes:
        """32 bytes naming the picture of ``digest`` under ``rules``: from the digest's first half alone, so its text
        cannot be unsealed from it."""
        return cache_key(rules, digest[:32])

    @staticmethod
    def seal_key(rules: str, digest: bytes) -> bytes:
        """32 bytes that seal the text of the picture of ``digest`` under ``rules``, from the digest's second half
        (which ``key`` does not hold); never stored."""
        return hashlib.sha256(b"qmd-indexer-image ocr seal\0" + rules.encode("utf-8") + b"\0" + digest[32:]).digest()

    def get(self, rules: str, digest: bytes) -> list[OcrLine] | None:
        """The lines remembered for the picture of ``digest`` (``OcrCache.digest``) under ``rules`` (``[]``: a
        picture without text), or ``None`` (also for a record that does not unseal: it is read again and replaced)."""
        record = self._records.get(self.key(rules, digest))
        if record is None:
            return None
        try:
            plain = _aead(self.seal_key(rules, digest)).decrypt(record[:_NONCE], record[_NONCE:], None)
            lines = json.loads(plain.decode("utf-8"))
            return [OcrLine(text, (b[0], b[1], b[2], b[3]), conf) for text, b, conf in lines]
        except (ValueError, TypeError, IndexError, InvalidTag):
            return None

    def put(self, rules: str, digest: bytes, lines: Sequence[OcrLine]) -> None:
        """Remember ``lines`` for the picture of ``digest`` (``OcrCache.digest``) under ``rules``, sealed."""
        blob = json.dumps([[line.text, list(line.box), line.confidence] for line in lines], ensure_ascii=False)
        nonce = os.urandom(_NONCE)  # a key seals one picture's text, so a nonce's reuse is out of reach anyway
        sealed = _aead(self.seal_key(rules, digest)).encrypt(nonce, blob.encode("utf-8"), None)
        self._records.put(self.key(rules, digest), nonce + sealed)


#: GCM's nonce: 96 bits, stored before the sealed text
_NONCE = 12


def _aead(key: bytes) -> AESGCM:
    """AES-256-GCM (NIST SP 800-38D) under the 32-byte ``key``: authenticated, so a row that does not unseal (another
    picture's, or damaged) raises ``InvalidTag`` instead of reading as garbage."""
    return AESGCM(key)
