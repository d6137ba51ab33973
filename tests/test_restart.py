"""A restart serves before its model has loaded: keyword searches answer at once; hybrid and dense ones answer in
full from the query model an earlier start saved (opened without torch), or, where there is none yet, from keyword
search flagged ``degraded`` ("keyword only: model loading"); ``/health`` names "model loading" until the model is in
(new chunks wait for it). The model's load is held on an event here, so the order is the test's, not the machine's
(how long each phase takes is ``make restart``'s)."""

from __future__ import annotations

import copy
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Running, make_settings, wait_for, write
from structlog.testing import capture_logs

import indexer.builtin.embedding
from indexer.builtin.embedding import SentenceTransformerEmbedder
from indexer.daemon import Indexer
from indexer.memory import LocalMemory
from indexer.model_loading import LazyModel, StillLoading
from indexer.plugins import Registry
from indexer.schema import BootRequest, SearchRequest
from indexer.service import warm_models
from indexer.worker import index_once


def _gated(registry: Registry, gate: threading.Event, cache_dir: Path, precision: str | None = None) -> Registry:
    """``registry`` with a text embedder whose model is not loaded yet, as at a restart: its load waits for
    ``gate``, then gives the session's real model (loaded once for every test). Its saved query model is looked for
    in ``cache_dir``. ``precision`` forces the embedder's (what the setting would), whatever this CPU's ``auto``
    picked: what the daemon decides before the load (``model_id``, the store's identity) follows that path."""
    loaded = registry.embedders["text"]
    model = loaded.model  # type: ignore[attr-defined]

    def load() -> Any:
        assert gate.wait(60), "the test never let the model load"
        return model

    embedder = copy.copy(loaded)
    embedder._model = LazyModel(load)  # type: ignore[attr-defined]
    embedder._query_encoder = embedder._documents = None  # type: ignore[attr-defined]
    embedder._documents_tried = False  # type: ignore[attr-defined]
    embedder.cache_dir = cache_dir  # type: ignore[attr-defined]
    embedder.precision = precision or loaded.precision  # type: ignore[attr-defined]
    embedder._identity = None  # type: ignore[attr-defined]
    gated = copy.copy(registry)
    gated.embedders = {**registry.embedders, "text": embedder}
    return gated


#: a start with no saved models, on each precision path (forced: an int8 CPU's first start waited for the export in
#: ``model_id``), and a restart with the query model the session's load saved
STARTS = [pytest.param(False, p, id=f"first-start-{p}") for p in ("int8", "fp32", "bf16")]
STARTS += [pytest.param(True, None, id="query-model-saved")]


@pytest.mark.parametrize(("saved", "precision"), STARTS)
def test_restart_answers_before_the_model_loads_then_hybrid_in_full(tmp_path: Path, registry: Registry,
                                                                    saved: bool, precision: str | None) -> None:
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# Memory\n\nThe deploy runbook lives in memory/deploy.md.\n")
    write(ws / "memory" / "deploy.md", "# Deploy\n\nRoll the canary first, then the fleet. Codeword: heliotrope.\n")
    write(ws / "memory" / "travel.md", "# Travel\n\nFlights to Lisbon on Friday; the hotel is near the river.\n")
    text = registry.embedders["text"]
    assert text.query_file is not None, "the session's model has a query model on this machine"  # type: ignore
    cache_dir = text.cache_dir if saved else tmp_path / "no-models"  # type: ignore[attr-defined]
    loaded = threading.Event()
    loaded.set()
    settings = make_settings(tmp_path, [{"agent": "main", "path": ws}])
    first = Indexer.open(settings, registry=_gated(registry, loaded, cache_dir, precision))  # the same precision
    index_once(first)
    first.close()

    gate = threading.Event()
    indexer = Indexer.open(settings, registry=_gated(registry, gate, cache_dir, precision))
    warming = threading.Thread(target=warm_models, args=(indexer,))
    try:
        with Running(indexer):  # ready: the reconcile found nothing to embed, so it needs no model
            warming.start()
            memory = LocalMemory(indexer.view)
            keyword = memory.search(SearchRequest(query="heliotrope canary", mode="keyword"))
            assert keyword["hits"][0]["path"] == "memory/deploy.md" and "degraded" not in keyword
            embedder: Any = indexer.registry.embedders["text"]

            def begun() -> bool:  # preload: the model's load began, then the saved query model opened (if there)
                return bool(embedder.loading and (embedder.query_file or not saved))

            deadline = time.monotonic() + 30
            while not begun() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert begun()
            early = {}
            for mode in ("hybrid", "dense"):
                early[mode] = memory.search(SearchRequest(query="heliotrope canary", mode=mode))
                assert early[mode]["hits"][0]["path"] == "memory/deploy.md"
                if saved:  # the query model answers in full, with the model's own vector (bf16's within 1e-3)
                    assert "degraded" not in early[mode] and early[mode]["hits"][0]["dense_score"] is not None
                    query = "heliotrope canary"
                    assert float(embedder.embed_query(query) @ text.encode([query])[0]) > 0.999
                else:
                    assert early[mode]["degraded"] == "keyword only: model loading"
                    assert early[mode]["hits"][0]["dense_score"] is None
                    assert early[mode]["hits"][0]["keyword_score"] > 0
            boot = memory.boot(BootRequest(budget_chars=2000, query="heliotrope canary"))
            assert boot["included"][0].startswith("memory/deploy.md")
            assert boot.get("degraded") == (None if saved else "keyword only: model loading")
            health = memory.health()
            assert health == {"status": "degraded", "ready": True, "reasons": ["model loading"],
                              "append": {"main": "off"}}
            assert "model_loaded" not in indexer.state.startup.phases

            gate.set()
            warming.join(60)
            assert "model_loaded" in indexer.state.startup.phases
            full = memory.search(SearchRequest(query="heliotrope canary", mode="hybrid"))
            assert "degraded" not in full
            assert full["hits"][0]["path"] == "memory/deploy.md" and full["hits"][0]["dense_score"] is not None
            assert memory.health() == {"status": "ok", "ready": True, "append": {"main": "off"}}
    finally:
        gate.set()
        warming.join(60) if warming.is_alive() else None
        indexer.close()


def test_lazy_model_start_loads_on_its_own_thread_and_get_without_wait_refuses_meanwhile() -> None:

    gate = threading.Event()
    lazy: LazyModel[str] = LazyModel(lambda: "model" if gate.wait(10) else "timed out")
    thread = lazy.start()
    assert thread is not None and lazy.loading
    with pytest.raises(StillLoading):
        lazy.get(wait=False)
    assert lazy.start() is None  # one load at a time
    gate.set()
    thread.join(10)
    assert lazy.get(wait=False) == "model" and not lazy.loading and lazy.start() is None


def test_a_failed_model_load_is_said_though_the_query_model_answers(tmp_path: Path, registry: Registry,
                                                                   make_indexer: Any, monkeypatch) -> None:
    """With a saved query model, queries answer whatever becomes of the model's load; a load that fails is still
    logged as ``embedder_failed`` (chunks cannot be embedded), never as ``model_loaded``."""
    text: Any = registry.embedders["text"]
    ws = tmp_path / "ws"
    write(ws / "memory" / "deploy.md", "# Deploy\n\nRoll the canary first, then the fleet. Codeword: heliotrope.\n")
    first = make_indexer([{"agent": "main", "path": ws}])
    index_once(first)
    settings = first.settings
    first.close()

    def no_torch(path: str, device: str) -> Any:
        raise ImportError("No module named 'torch'")

    monkeypatch.setattr(indexer.builtin.embedding, "load_sentence_transformer", no_torch)
    fresh = SentenceTransformerEmbedder({"precision": text.precision, "cache_dir": str(text.cache_dir)})
    failing = copy.copy(registry)
    failing.embedders = {**registry.embedders, "text": fresh}
    daemon = Indexer.open(settings, registry=failing)
    try:
        with capture_logs() as logs:
            warm_models(daemon)
        events = [e["event"] for e in logs]
        assert "embedder_failed" in events and "model_loaded" not in events, events
        assert "ImportError" in next(e["error"] for e in logs if e["event"] == "embedder_failed")
        answer = LocalMemory(daemon.view).search(SearchRequest(query="heliotrope canary", mode="hybrid"))
        assert "degraded" not in answer and answer["hits"][0]["path"] == "memory/deploy.md"
    finally:
        daemon.close()


@pytest.mark.parametrize("precision", ["int8", "fp32", "bf16"])
def test_a_note_saved_while_the_model_loads_is_indexed_without_it(tmp_path: Path, registry: Registry,
                                                                  precision: str) -> None:
    """Where an earlier load left the model's ONNX files (int8's ``model.onnx``, the fp32 trace for fp32 and bf16) a
    restart embeds chunks with them while the model itself still loads: a note saved then is indexed and found by a
    hybrid search with the model held back by the test the whole time; its vectors are the loaded model's (bf16:
    the fp32 vectors of the same model)."""
    from indexer.builtin.embedding import SentenceTransformerEmbedder
    from indexer.builtin.text_model import int8_available

    if not int8_available():
        pytest.skip("onnxruntime/onnx not installed: chunks wait for the model")
    models = tmp_path / "models"
    exported = SentenceTransformerEmbedder({"precision": precision, "cache_dir": str(models)})
    exported.embed_query("warm-up")  # the first load exports the ONNX files
    ws = tmp_path / "ws"
    write(ws / "memory" / "deploy.md", "# Deploy\n\nRoll the canary first, then the fleet.\n")
    settings = make_settings(tmp_path, [{"agent": "main", "path": ws}])
    loaded = threading.Event()
    loaded.set()
    with_model = copy.copy(registry)
    with_model.embedders = {**registry.embedders, "text": exported}
    first = Indexer.open(settings, registry=with_model)
    index_once(first)
    first.close()

    gate = threading.Event()
    restarted = copy.copy(exported)
    restarted._model = LazyModel(lambda: exported.model if gate.wait(60) else None)
    restarted._query_encoder = restarted._documents = None
    restarted._documents_tried = False
    again = copy.copy(registry)
    again.embedders = {**registry.embedders, "text": restarted}
    daemon = Indexer.open(settings, registry=again)
    warming = threading.Thread(target=warm_models, args=(daemon,))
    try:
        with Running(daemon):
            warming.start()
            wait_for(lambda: restarted.loading and restarted._documents is not None, timeout_s=30)
            note = write(ws / "memory" / "lisbon.md", "# Travel\n\nFlights to Lisbon on Friday. Codeword: ochre.\n")
            wait_for(lambda: str(note) in daemon.state.indexed, timeout_s=30)
            memory = LocalMemory(daemon.view)
            answer = memory.search(SearchRequest(query="flights to Lisbon", mode="hybrid"))
            assert "degraded" not in answer and answer["hits"][0]["path"] == "memory/lisbon.md"
            assert answer["hits"][0]["dense_score"] > 0.3
            assert restarted.loading and not restarted._model.loaded  # all of it without the model
            text = ["Flights to Lisbon on Friday.", "Roll the canary first, then the fleet. " * 40]
            early, offsets = restarted.encode(text), restarted.token_offsets(text[1])
            gate.set()
            warming.join(60)
            assert restarted._model.loaded  # from now on the model embeds
            assert restarted.token_offsets(text[1]) == offsets
            cosines = (early * restarted.encode(text)).sum(axis=1)
            assert cosines.min() > (0.999 if precision == "fp32" else 0.99), cosines
    finally:
        gate.set()
        warming.join(60) if warming.is_alive() else None
        daemon.close()
