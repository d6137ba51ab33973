"""Screenshots rendered with Pillow, for the OCR tests and benchmark: known text, drawn with a Debian font, on a plain
or noisy background, at full or low contrast, turned by a multiple of 90 degrees.

Fonts: ``fonts-dejavu-core`` (Latin) and ``fonts-wqy-microhei`` or ``fonts-noto-cjk`` (Chinese); ``font_path``
says which package to install when none is found.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

LATIN_FONTS = ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",)
CJK_FONTS = ("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc", "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
             "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")


def font_path(cjk: bool = False) -> Path:
    """The first installed font of ``CJK_FONTS`` (``cjk``) or ``LATIN_FONTS``; raises ``FileNotFoundError`` naming
    the Debian package to install."""
    for candidate in CJK_FONTS if cjk else LATIN_FONTS:
        if Path(candidate).is_file():
            return Path(candidate)
    package = "fonts-wqy-microhei (or fonts-noto-cjk)" if cjk else "fonts-dejavu-core"
    raise FileNotFoundError(f"no {'CJK' if cjk else 'DejaVu'} font installed; apt-get install {package}")


def render(lines: Sequence[str], *, cjk: bool = False, size: tuple[int, int] = (900, 420), font_px: int = 24,
           noise: float = 0.0, contrast: float = 1.0, angle: int = 0, seed: int = 0,
           origin: tuple[int, int] = (30, 30)) -> tuple[Any, list[tuple[int, int, int, int]]]:
    """A PIL RGB picture of ``lines`` (top to bottom, ``font_px`` pixels high) and each line's box ``(left, top,
    right, bottom)`` in its pixels.

    ``noise``: standard deviation (0-255 levels) of Gaussian noise over a light grey background with random pale
    blocks, like a busy desktop; ``contrast``: 1.0 draws near-black on light grey, 0.25 a grey a quarter as far from
    the background; ``angle``: 0, 90, 180 or 270, counter-clockwise (boxes are the unturned ones)."""
    rng = np.random.default_rng(seed)
    background = 232
    canvas = np.full((size[1], size[0], 3), background, np.float32)
    if noise:
        for _ in range(12):  # pale windows and panels behind the text
            x, y = int(rng.integers(0, size[0])), int(rng.integers(0, size[1]))
            canvas[y : y + int(rng.integers(20, 160)), x : x + int(rng.integers(40, 300))] = rng.integers(190, 250, 3)
        canvas += rng.normal(0.0, noise, canvas.shape)
    picture = Image.fromarray(np.clip(canvas, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(picture)
    font = ImageFont.truetype(str(font_path(cjk)), font_px)
    ink = round(background - (background - 20) * contrast)
    boxes = []
    x, y = origin
    for line in lines:
        draw.text((x, y), line, fill=(ink, ink, ink), font=font)
        left, top, right, bottom = draw.textbbox((x, y), line, font=font)
        boxes.append((int(left), int(top), int(right), int(bottom)))
        y += int(font_px * 1.6)
    if angle:
        picture = picture.rotate(angle, expand=True)
    return picture, boxes


def save(picture: Any, path: Path) -> Path:
    """``picture`` saved at ``path`` in the format its suffix names (JPEG at quality 90); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = {".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP", ".gif": "GIF"}.get(path.suffix.lower(), "PNG")
    picture.save(path, fmt, **({"quality": 90} if fmt in ("JPEG", "WEBP") else {}))
    return path


def ocr_missing(*languages: str, cjk: bool = False) -> str | None:
    """Why the OCR tests cannot run here (Tesseract, the data of ``languages``, or the fonts ``render`` needs, Latin
    and with ``cjk`` Chinese, are not installed: the reason names the Debian package), or ``None`` when they can."""
    from qmd_indexer_image import ocr

    why = ocr.engine_problem()
    if why is None:
        missing = [lang for lang in languages if lang not in ocr.installed_languages()]
        why = f"no Tesseract data for {missing}; apt-get install {ocr.debian_package(missing[0])}" if missing else None
    if why is None:
        try:
            font_path(cjk)
        except FileNotFoundError as exc:
            why = str(exc)
    return why

