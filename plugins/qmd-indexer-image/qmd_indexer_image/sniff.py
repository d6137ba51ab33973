"""Image signatures: which format the first bytes of a file announce. Pure bytes, no Pillow."""

from __future__ import annotations

#: ISO-BMFF brands of HEIF still images (HEIC is HEIF with HEVC)
HEIF_BRANDS = frozenset({b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1"})


def image_format(head: bytes) -> str | None:
    """``"PNG"``, ``"JPEG"``, ``"GIF"``, ``"WEBP"`` or ``"HEIF"`` when ``head`` (at least the first 12 bytes of a
    file) starts with that format's signature, else ``None``."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if head[4:8] == b"ftyp" and head[8:12] in HEIF_BRANDS:
        return "HEIF"
    return None
