"""Audio signatures: which container the first bytes of a file announce. Pure bytes, no decoder."""

from __future__ import annotations

_HEIF_BRANDS = frozenset({b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1", b"avif"})


def audio_format(head: bytes) -> str | None:
    """``"WAV"``, ``"FLAC"``, ``"OGG"`` (Vorbis, Opus or FLAC inside), ``"MP3"``, ``"AAC"`` or ``"MP4"`` (m4a) when
    ``head`` (the first 12 or more bytes) starts with that signature, else ``None``."""
    if head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
        return "WAV"
    if head.startswith(b"fLaC"):
        return "FLAC"
    if head.startswith(b"OggS"):
        return "OGG"
    if head.startswith(b"ID3"):
        return "MP3"  # an ID3 tag; the frames after it are MPEG audio (or, rarely, ADTS AAC: the decoder tells)
    if head.startswith(b"ADIF"):
        return "AAC"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        return "AAC" if head[1] & 0x06 == 0 else "MP3"  # ADTS has layer bits 00; MPEG audio layers 1-3 do not
    if head[4:8] == b"ftyp" and head[8:12] not in _HEIF_BRANDS:
        return "MP4"
    return None
