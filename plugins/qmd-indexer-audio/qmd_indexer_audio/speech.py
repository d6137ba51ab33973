"""What counts as speech: voice-activity spans before transcription, and Whisper's rules for a segment after it.

Whisper hallucinates on noise: 30 s of low pink noise (peak -35 dBFS) comes back from tiny.en, for some noise
seeds, as segments reading ``" ."`` with ``no_speech_prob`` 0.95 but ``avg_logprob`` -0.6, which Whisper's own
silence rule (both must fail) lets through. So three guards, each configurable in ``[plugin.audio]``:

- ``vad`` (default on): Silero VAD (v6, the ONNX model inside the faster-whisper wheel, run by onnxruntime; nothing
  is downloaded) finds the stretches with a voice. None: the file is ``no_speech`` and no model runs. Otherwise only
  those stretches are transcribed (``clip_timestamps``, so times stay relative to the start of the file).
  ``vad_threshold`` is Silero's speech probability (default 0.5).
- Per segment, Whisper's thresholds: dropped when ``no_speech_prob > no_speech_threshold`` (0.6) while
  ``avg_logprob < logprob_threshold`` (-1.0), or when ``compression_ratio > compression_ratio_threshold`` (2.4, a
  repetition loop). The engines also decode with these values.
- A segment with no letter or digit (``"."``, ``". . ."``, ``"♪"``) is dropped.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

import numpy as np

from qmd_indexer_audio.decode import SAMPLE_RATE
from qmd_indexer_audio.engines import Segment, Thresholds


@dataclass(frozen=True, slots=True)
class SpeechRules:
    """The guards above, from the plugin's config table. Raises ``ValueError`` for an out-of-range value and
    ``ImportError`` when ``vad`` is on without faster-whisper (which ships the Silero model)."""

    vad: bool = True
    vad_threshold: float = 0.5
    thresholds: Thresholds = field(default_factory=Thresholds)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SpeechRules:
        default = Thresholds()
        thresholds = Thresholds(no_speech=float(config.get("no_speech_threshold", default.no_speech)),
                                logprob=float(config.get("logprob_threshold", default.logprob)),
                                compression_ratio=float(config.get("compression_ratio_threshold",
                                                                   default.compression_ratio)))
        rules = cls(bool(config.get("vad", True)), float(config.get("vad_threshold", 0.5)), thresholds)
        if not (0.0 < rules.vad_threshold < 1.0 and 0.0 <= thresholds.no_speech <= 1.0):
            raise ValueError("vad_threshold must be in (0, 1) and no_speech_threshold in [0, 1]")
        if rules.vad and importlib.util.find_spec("faster_whisper") is None:
            raise ImportError("vad = true needs the Silero VAD model that ships with faster-whisper: pip install "
                              "faster-whisper (or qmd-indexer-audio[faster-whisper]), or set vad = false")
        return rules

    @property
    def identity(self) -> str:
        """A string that changes whenever a verdict made under these rules could change (the VAD's package version
        included: a new release may ship a new Silero model)."""
        t = self.thresholds
        vad = f"{self.vad_threshold}@faster-whisper-{version('faster-whisper')}" if self.vad else "off"
        return f"vad={vad} no_speech={t.no_speech} logprob={t.logprob} compression={t.compression_ratio}"

    def speech_spans(self, samples: np.ndarray) -> list[tuple[float, float]]:
        """``(start_s, end_s)`` of each stretch of 16 kHz ``samples`` with a voice in it (padded by 0.4 s, joined
        across pauses under 2 s: Silero's defaults as faster-whisper uses them); ``[]`` when there is none."""
        from faster_whisper.vad import VadOptions, get_speech_timestamps

        spans = get_speech_timestamps(samples, VadOptions(threshold=self.vad_threshold), sampling_rate=SAMPLE_RATE)
        return [(span["start"] / SAMPLE_RATE, span["end"] / SAMPLE_RATE) for span in spans]

    def keep(self, segment: Segment) -> bool:
        """Whether ``segment`` is speech rather than a hallucination by the rules above."""
        if not any(ch.isalnum() for ch in segment.text):
            return False
        t = self.thresholds
        if segment.no_speech_prob > t.no_speech and segment.avg_logprob < t.logprob:
            return False
        return segment.compression_ratio <= t.compression_ratio
