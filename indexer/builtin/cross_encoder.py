"""The built-in reranker plugin ``cross-encoder``: sentence-transformers' ``CrossEncoder``, loaded lazily and offline
from ``model`` (a local directory; no cross-encoder weights ship in any package here, so it is off unless the
``reranker`` setting names it). The rerank stage that applies it is ``indexer.rerank``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from indexer.api import LazyModel
from indexer.builtin.http_rerank import rerank_floor

__all__ = ["CrossEncoderReranker"]


class CrossEncoderReranker:
    """The built-in reranker plugin ``cross-encoder``: a sentence-transformers ``CrossEncoder`` (one relevance logit
    per (query, text) pair) from ``config["model"]`` (a local model directory, ``~`` expanded, or a name already in
    the local Hugging Face cache), ``device`` (default ``cpu``), ``batch_size`` (default 32) and ``relevance_floor``
    (the score from which a hit answers the query: default 0.5, as ``predict`` gives a one-label model's sigmoid;
    ``"off"``: the scores order the hits only; ``indexer.builtin.http_rerank.rerank_floor``). Raises
    ``ValueError`` without a model; the model loads on the first ``score`` (offline unless ``HF_HUB_OFFLINE`` says
    otherwise), which raises ``OSError`` while it is not on disk and loads it once it is."""

    #: the keys ``[plugin.cross-encoder]`` may hold (``indexer.plugins`` refuses others, naming them)
    config_keys = frozenset({"model", "device", "batch_size", "relevance_floor", "state_dir"})

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = dict(config or {})
        if not config.get("model"):
            raise ValueError("the cross-encoder reranker needs `model` (a local model directory): set it in "
                             "[plugin.cross-encoder]")
        self.model_id = os.path.expanduser(str(config["model"]))
        self.device = str(config.get("device", "cpu"))
        self.batch_size = int(config.get("batch_size", 32))
        self.relevance_floor = rerank_floor(config, "[plugin.cross-encoder]")
        self._model: LazyModel[Any] = LazyModel(self._load)

    @property
    def model(self) -> Any:
        """The loaded ``CrossEncoder`` (loaded on first use; a failed load is tried again on the next)."""
        return self._model.get()

    def _load(self) -> Any:
        from indexer.model_loading import quiet_offline_hub

        quiet_offline_hub()
        from sentence_transformers import CrossEncoder

        return CrossEncoder(self.model_id, device=self.device)

    def score(self, query: str, texts: Sequence[str], timeout_s: float | None = None) -> list[float]:
        """One score per text (``predict``'s: a one-label model's sigmoid); ``timeout_s`` is not used (a running
        ``predict`` cannot be stopped: ``rerank``
        keeps the fused order when it took longer than the budget)."""
        scores = self.model.predict([(query, text) for text in texts], batch_size=self.batch_size,
                                    show_progress_bar=False, convert_to_numpy=True)
        return [float(s) for s in scores]
