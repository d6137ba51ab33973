"""Decode image bytes with Pillow: confirm, measure, and convert to the RGB picture CLIP sees.

Pillow is imported inside the functions so that loading the plugin stays cheap. HEIF/HEIC decoding is enabled when
``pillow-heif`` is installed.
"""

from __future__ import annotations

import importlib.util
import io
import warnings
from dataclasses import dataclass
from typing import Any

#: largest picture decoded, in pixels (Pillow's own decompression-bomb limit is 89.5 MP)
DEFAULT_MAX_PIXELS = 64_000_000
#: longest side CLIP needs (its processor resizes to 224 px); bigger pictures are shrunk before embedding
EMBED_SIDE = 448
_heif_registered = False


class ImageDecodeError(ValueError):
    """The bytes are not a decodable image; the message says why."""


class ImageTooLarge(ImageDecodeError):
    """The picture has more pixels than ``[plugin.image] max_pixels``; the message names the setting."""


def _too_large(width: int, height: int, max_pixels: int) -> ImageTooLarge:
    return ImageTooLarge(f"{width}x{height} pixels ({width * height:,}) is over [plugin.image] max_pixels = "
                         f"{max_pixels}: raise it to index this picture")


def allow_pixels(max_pixels: int) -> None:
    """Raise Pillow's decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``, 89.5 MP by default, process-wide) to at
    least ``max_pixels``, so that ``max_pixels`` is the limit that applies: a picture under it opens, one over it is
    refused by ``inspect_image`` naming the setting. Never lowered (other extractors may allow more)."""
    Image = _image_module()
    if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < max_pixels:
        Image.MAX_IMAGE_PIXELS = max_pixels


def heif_available() -> bool:
    """Whether ``pillow-heif`` is installed (then ``.heic``/``.heif`` are read)."""
    return importlib.util.find_spec("pillow_heif") is not None


def _image_module() -> Any:
    global _heif_registered
    from PIL import Image

    if not _heif_registered and heif_available():
        import pillow_heif

        pillow_heif.register_heif_opener()
        _heif_registered = True
    return Image


@dataclass(frozen=True, slots=True)
class ImageFacts:
    """What a full decode tells: size in pixels, Pillow's format name, frame count and an embedded description."""

    width: int
    height: int
    format: str
    frames: int
    description: str


def _description(im: Any) -> str:
    for key in ("Description", "Title"):  # not "Comment": mostly the name of the software that saved the file
        value = im.info.get(key)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if isinstance(value, str) and value.strip():
            return " ".join(value.split())[:500]
    try:
        value = im.getexif().get(0x010E)  # EXIF ImageDescription
    except Exception:  # a broken EXIF block is no reason to refuse the picture
        value = None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return " ".join(value.split())[:500] if isinstance(value, str) else ""


def inspect_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageFacts:
    """Verify and fully decode ``data``; raises ``ImageDecodeError`` naming the problem (not an image, corrupt,
    truncated, over ``max_pixels``)."""
    Image = _image_module()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            try:
                with Image.open(io.BytesIO(data)) as im:
                    im.verify()  # structure and checksums (PNG CRCs)
            except (Image.DecompressionBombWarning, Image.DecompressionBombError):  # over Pillow's limit too
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                    limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None  # read the header alone
                    try:
                        with Image.open(io.BytesIO(data)) as im:
                            width, height = im.size
                    finally:
                        Image.MAX_IMAGE_PIXELS = limit
                raise _too_large(width, height, max_pixels) from None
            with Image.open(io.BytesIO(data)) as im:
                width, height = im.size
                if width * height > max_pixels:
                    raise _too_large(width, height, max_pixels)
                im.load()  # the pixels themselves: a truncated JPEG fails here
                return ImageFacts(width, height, str(im.format or "unknown"), int(getattr(im, "n_frames", 1)),
                                  _description(im))
    except ImageDecodeError:
        raise
    except Exception as exc:  # Pillow reports damage as OSError, SyntaxError, ValueError, EOFError, bomb errors...
        raise ImageDecodeError(f"{type(exc).__name__}: {exc}") from None


def to_rgb(data: bytes, side: int = EMBED_SIDE) -> Any:
    """``data`` as a PIL RGB image (first frame; transparency composited onto white), shrunk to at most ``side``
    pixels on its longer edge. Raises ``ImageDecodeError``."""
    Image = _image_module()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                im.draft("RGB", (side, side))  # JPEG: decode at a reduced scale, much faster
                im.seek(0)
                picture = _flatten(Image, im)
        picture.thumbnail((side, side))
        return picture
    except Exception as exc:
        raise ImageDecodeError(f"{type(exc).__name__}: {exc}") from None


def ocr_picture(data: bytes, max_pixels: int) -> tuple[Any, float]:
    """``data``'s first frame as a PIL RGB picture for OCR (transparency composited onto white), shrunk to at most
    ``max_pixels`` pixels, and the factor it was shrunk by (1.0: full size). Raises ``ImageDecodeError``."""
    Image = _image_module()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                width, height = im.size
                scale = min(1.0, (max_pixels / (width * height)) ** 0.5)
                if scale < 1.0:
                    im.draft("RGB", (int(width * scale), int(height * scale)))  # JPEG: decode at a reduced scale
                im.seek(0)
                picture = _flatten(Image, im)
        if scale < 1.0:
            picture = picture.resize((max(1, int(width * scale)), max(1, int(height * scale))), Image.LANCZOS)
        return picture, (picture.size[0] / width)
    except Exception as exc:
        raise ImageDecodeError(f"{type(exc).__name__}: {exc}") from None


def _flatten(Image: Any, im: Any) -> Any:
    """``im`` in RGB, transparency composited onto white (text drawn on a transparent layer stays readable)."""
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        picture = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        picture.alpha_composite(rgba)
        return picture.convert("RGB")
    return im.convert("RGB")
