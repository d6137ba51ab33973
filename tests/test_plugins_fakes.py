"""Small plugin classes that the tests of ``indexer.plugins`` point fake entry points at (no tests here).

Each is a factory taking the plugin's config table, as the contract requires.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from indexer.api import Chunk, ExtractError, l2_normalise


class EarlyClassifier:
    priority = 10

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def classify(self, path: Path, head: bytes) -> str | None:
        return "fake" if path.suffix == ".fake" else None


class LateClassifier:
    priority = 500

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def classify(self, path: Path, head: bytes) -> str | None:
        return "late"


class RaisingClassifier:
    priority = 1

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def classify(self, path: Path, head: bytes) -> str | None:
        raise RuntimeError("classifier bug")


class FakeExtractor:
    kinds = frozenset({"fake"})

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def extract(self, file: Any, context: Any) -> Any:
        yield Chunk(text=file.read_bytes().decode(), kind="fake")


class RivalExtractor(FakeExtractor):
    """Claims the same kind as ``FakeExtractor``: needs a ``prefer`` choice."""


class PathReadingExtractor(FakeExtractor):
    """Breaks the read rule: reads ``file.path`` itself, so a symlink swapped in beneath the workspace would be
    followed (``wrap``: the ``OSError`` becomes an unchained ``ExtractError``, as a careless plugin writes it)."""

    wrap = False

    def extract(self, file: Any, context: Any) -> Any:
        try:
            text = file.path.read_text()
        except OSError as exc:
            if self.wrap:
                raise ExtractError(f"cannot read: {exc.strerror}") from None
            raise
        yield Chunk(text=text, kind="fake")


class WrappingPathReader(PathReadingExtractor):
    wrap = True


class NoKinds:
    """Breaks the extractor contract: no ``kinds``."""

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def extract(self, file: Any, context: Any) -> Any:
        return iter(())


class VideoExtractor:
    """A new media kind, declared by the plugin alone: ``media`` gates it, ``hit_fields`` reach search hits."""

    kinds = frozenset({"video"})
    media = True
    hit_fields = ("start_s", "end_s", "fps")

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def extract(self, file: Any, context: Any) -> Any:
        yield Chunk(text="a frame", kind="video", modality="video", data=b"frame", start_s=0.0, end_s=1.0,
                    meta={"fps": 25})


class BadHitFields(FakeExtractor):
    """Breaks the extractor contract: ``hit_fields`` must be a tuple of str."""

    hit_fields = "start_s"


class AudioModalityEmbedder:
    """An embedder of a modality the core never heard of: plugins declare modalities, so it loads."""

    model_id, modality, dim, max_tokens = "x", "audio", 4, None

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def embed(self, chunks: Any) -> np.ndarray:
        return np.zeros((len(chunks), 4), np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        return np.zeros(4, np.float32)


class ReservedModalityEmbedder(AudioModalityEmbedder):
    """Breaks the embedder contract: ``bm25`` names the keyword-search vector."""

    modality = "bm25"


class TextWithoutOffsets(AudioModalityEmbedder):
    """Breaks the text embedder contract: no ``token_offsets``, so chunks could not be sized to the model."""

    modality, max_tokens = "text", 8


class LazyImageEmbedder:
    """An image embedder whose ``dim`` would load a model: loading the plugin must not evaluate it."""

    model_id, modality, max_tokens = "lazy", "image", None
    loads = 0

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    @property
    def dim(self) -> int:
        type(self).loads += 1
        return 4

    def embed(self, chunks: Any) -> np.ndarray:
        return l2_normalise(np.ones((len(chunks), self.dim), np.float32))

    def embed_query(self, text: str) -> np.ndarray:
        return l2_normalise(np.ones(self.dim, np.float32))


class RivalImageEmbedder(LazyImageEmbedder):
    model_id = "rival"


def failing_factory(config: dict[str, Any]) -> Any:
    raise RuntimeError("licence key missing")


class ShortestFirstReranker:
    """A reranker with a rule a test can predict: shorter texts score higher (the config may set ``model``)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.model_id = str(config.get("model", "shortest-first"))

    def score(self, query: str, texts: Any) -> list[float]:
        return [-float(len(text)) for text in texts]


class ScorelessReranker:
    """Breaks the reranker contract: no ``score``."""

    model_id = "scoreless"

    def __init__(self, config: dict[str, Any]) -> None:
        pass


class WeightlessVideoExtractor(VideoExtractor):
    """A media extractor whose model is not on disk: its factory fails, as a fresh install's media plugins do."""

    def __init__(self, config: dict[str, Any]) -> None:
        raise LookupError('video model not found; set [plugin.video] model = "/path/to/model"')


class WeightlessImageEmbedder(LazyImageEmbedder):
    """An image embedder whose model is not on disk."""

    def __init__(self, config: dict[str, Any]) -> None:
        raise LookupError('image model not found; set [plugin.pictures] model = "/path/to/model"')


class LimitedVideoExtractor(VideoExtractor):
    """Loads, but runs without something it would use (like the image plugin without Tesseract): says so in
    ``notice``."""

    notice = "frame captions off: no caption model (install one)"
