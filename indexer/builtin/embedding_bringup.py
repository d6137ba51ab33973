"""How the built-in embedder (``indexer.builtin.embedding``) comes up: the progress of its model's load
(``LoadProgress``), and the ONNX files an earlier load saved, opened with ONNX Runtime and ``tokenizers`` alone
(``open_query_encoder``, ``open_document_encoder``), so queries and chunks are answered while the model still loads.
Its log lines are the embedder's (``qmd_indexer.embedding``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import structlog

from indexer.builtin.onnx_runtime import OnnxDocumentEncoder, OnnxQueryEncoder, query_threads

log = structlog.get_logger("qmd_indexer.embedding")


class LoadProgress:
    """Says how far a model load is: ``embedder.load_progress = {"phase", "percent"}`` (``GET /status``'s
    ``models``) and one ``model_loading`` log line per step that runs. ``embedder``: anything with ``base_id`` and
    ``load_progress``; ``steps``: each step's name and weight (typical seconds); a step not in ``steps`` (an export
    the cache already holds) is skipped silently."""

    def __init__(self, embedder: Any, steps: dict[str, float]) -> None:
        self.embedder, self.steps, self.done = embedder, steps, 0.0
        self.current: str | None = None

    def __call__(self, phase: str) -> None:
        if phase not in self.steps or phase == self.current:
            return
        if self.current is not None:
            self.done += self.steps[self.current]
        self.current = phase
        percent = int(100 * self.done / sum(self.steps.values()))
        self.embedder.load_progress = {"phase": phase, "percent": percent}
        log.info("model_loading", model=self.embedder.base_id, phase=phase, percent=percent)


def open_query_encoder(path: Path) -> OnnxQueryEncoder | None:
    """The query model at ``path`` (``indexer.builtin.onnx_models.query_model_path``) opened for single queries, or
    ``None`` when it is not there yet. A file ONNX Runtime cannot read is logged (``query_model_unreadable``) and its
    quality record removed, so the next load exports it again; never raises."""
    started = time.monotonic()
    try:
        encoder = OnnxQueryEncoder.open(path, query_threads())
    except Exception as exc:  # e.g. a truncated file: without its record, the load exports it again
        log.warning("query_model_unreadable", path=str(path), error=f"{type(exc).__name__}: {exc}",
                    action="export again")
        try:
            path.with_suffix(".json").unlink(missing_ok=True)
        except OSError:  # a read-only cache: the load then uses the model's own modules
            pass
        return None
    if encoder is not None:
        log.info("query_model_opened", path=str(path), seconds=round(time.monotonic() - started, 3))
    return encoder


def open_document_encoder(chunks_file: Path, query_path: Path) -> OnnxDocumentEncoder | None:
    """The ONNX file chunks are embedded with (``chunks_file``), opened with the tokenizer and pooling saved
    beside the query model ``query_path``; ``None`` when a file is not there yet or the query model's record did not
    pass. A damaged file is logged (``document_model_unreadable``): the chunks then wait for the model's load, which
    exports it again; never raises."""
    try:
        documents = OnnxDocumentEncoder.open(chunks_file, query_path, query_threads())
    except Exception as exc:  # a damaged file: the chunks wait for the model's load, which exports it again
        log.warning("document_model_unreadable", path=str(chunks_file), error=f"{type(exc).__name__}: {exc}")
        return None
    if documents is not None:
        log.info("document_model_opened", path=str(chunks_file))
    return documents
