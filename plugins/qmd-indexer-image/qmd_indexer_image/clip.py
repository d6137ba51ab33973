"""The ``clip`` embedder: images (and text queries) into one CLIP space, through sentence-transformers.

Config ``[plugin.clip]``:

- ``model``: a sentence-transformers CLIP model directory (``"/opt/models/clip-ViT-B-32"``, as saved by
  ``SentenceTransformer.save`` or downloaded from the hub), or a hub name (default ``"clip-ViT-B-32"``, read as
  ``sentence-transformers/clip-ViT-B-32``). A name must already be in the local Hugging Face cache unless
  ``HF_HUB_OFFLINE=0`` allows downloads; otherwise the plugin fails to load with that reason and the daemon runs on
  without images.
- ``device``: torch device, default ``"cpu"``. ``batch_size``: images per forward pass, default 16.

Vectors: ``(n, dim)`` float32, L2-normalised (``dim`` 512 for clip-ViT-B-32). ``embed_query`` uses CLIP's text
tower, truncated to its 77-token context. The model loads on the first ``embed``/``embed_query``/``dim``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexer.api import Chunk, EmbedError, LazyModel, l2_normalise, load_sentence_transformer
from qmd_indexer_image.decode import ImageDecodeError, to_rgb

DEFAULT_MODEL = "clip-ViT-B-32"
#: published output sizes, so a collection can be created before the model loads
KNOWN_DIMS = {
    "sentence-transformers/clip-ViT-B-32": 512,
    "sentence-transformers/clip-ViT-B-16": 512,
    "sentence-transformers/clip-ViT-L-14": 768,
}


def downloads_allowed() -> bool:
    """qmd-indexer runs offline unless ``HF_HUB_OFFLINE`` is explicitly ``0``/``false``."""
    return os.environ.get("HF_HUB_OFFLINE", "1").strip().lower() in ("0", "false", "no", "off")


def _in_hf_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "modules.json"), str)


def resolve_model(name: str) -> tuple[str, str]:
    """``(model_id, load_path)`` for a directory or hub name; cheap (no torch).

    Raises ``FileNotFoundError`` for a path that is not a sentence-transformers model directory, and
    ``LookupError`` for a hub name absent from the local cache while downloads are off.
    """
    path = Path(name).expanduser()
    looks_like_path = path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1
    if path.is_dir():
        if not (path / "modules.json").is_file():
            raise FileNotFoundError(f"{path} has no modules.json: not a sentence-transformers model directory "
                                    f"(save one with SentenceTransformer(...).save(path))")
        resolved = str(path.resolve())
        return resolved, resolved
    if looks_like_path or path.exists():
        raise FileNotFoundError(f"CLIP model directory {name!r} does not exist")
    repo_id = name if "/" in name else f"sentence-transformers/{name}"
    if not downloads_allowed() and not _in_hf_cache(repo_id):
        raise LookupError(f"CLIP model {repo_id!r} is not in the local Hugging Face cache and downloads are off "
                          f"(HF_HUB_OFFLINE); set [plugin.clip] model = \"/path/to/clip-model-dir\"")
    return repo_id, repo_id


class ClipEmbedder:
    """Image chunks (their ``data`` bytes) and text queries into one CLIP space, named vector ``"image"``."""

    modality = "image"
    max_tokens = None
    config_keys = frozenset({"model", "device", "batch_size", "state_dir"})  # [plugin.clip]

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = dict(config or {})
        self.model_name = str(config.get("model", DEFAULT_MODEL))
        self.device = str(config.get("device", "cpu"))
        self.batch_size = int(config.get("batch_size", 16))
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        self.model_id, self._load_path = resolve_model(self.model_name)
        self._dim: int | None = KNOWN_DIMS.get(self.model_id)
        self._model: LazyModel[Any] = LazyModel(self._load)

    @property
    def model(self) -> Any:
        """The loaded ``SentenceTransformer`` (loads on first access)."""
        return self._model.get()

    def _load(self) -> Any:
        model = load_sentence_transformer(self._load_path, self.device)
        self._dim = int(model.get_embedding_dimension())
        return model

    @property
    def dim(self) -> int:
        """Vector size (512 for clip-ViT-B-32); loads the model when not known in advance."""
        if self._dim is None:
            _ = self.model
        assert self._dim is not None
        return self._dim

    def _encode(self, inputs: list[Any]) -> np.ndarray:
        vectors = self.model.encode(inputs, batch_size=self.batch_size, convert_to_numpy=True,
                                    normalize_embeddings=True, show_progress_bar=False)
        return l2_normalise(np.asarray(vectors, dtype=np.float32))

    def embed(self, chunks: Sequence[Chunk]) -> np.ndarray:
        """``(len(chunks), dim)`` float32, L2-normalised. Raises ``EmbedError`` naming the chunk whose bytes are
        missing or do not decode."""
        if not chunks:
            return np.zeros((0, self.dim), dtype=np.float32)
        pictures = []
        for index, chunk in enumerate(chunks):
            if not chunk.data:
                raise EmbedError(f"image chunk {index} ({chunk.text[:60]!r}) has no data bytes")
            try:
                pictures.append(to_rgb(chunk.data))
            except ImageDecodeError as exc:
                raise EmbedError(f"image chunk {index} ({chunk.text[:60]!r}) does not decode: {exc}") from None
        return self._encode(pictures)

    def embed_query(self, text: str) -> np.ndarray:
        """``(dim,)`` float32, L2-normalised: ``text`` through CLIP's text tower."""
        return self._encode([text])[0]
