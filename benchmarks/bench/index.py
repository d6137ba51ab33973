"""Steps 1, 2 and 2b of ``python -m benchmarks.bench``, in this process: the first index against raw ``encode``,
the no-op rescans, and the no-op rescan of 10,000 files."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench.common import NOOP_FILES, log, real_vectors, release_state_lock, settings_for


def bench_index(workspace: Path, state_dir: Path, qdrant_url: str = "",
                registry: Any = None) -> tuple[dict[str, Any], Any, np.ndarray]:
    """Steps 1 and 2 on Edge (``qdrant_url`` empty) or that server; returns (results, registry, the real chunk
    vectors of the index). ``registry``: the loaded plugins to reuse (loaded here when ``None``)."""
    from indexer.daemon import Indexer
    from indexer.plugins import load_registry, plugin_configs
    from indexer.worker import index_once

    shutil.rmtree(state_dir, ignore_errors=True)
    settings = settings_for(workspace, state_dir, qdrant_url=qdrant_url)
    if registry is None:
        registry = load_registry(settings.plugins, plugin_configs(settings), settings.prefer)
    embedder = registry.embedders["text"]
    model = embedder.model  # load now: model loading is not indexing
    model.encode(["warm-up"] * embedder.batch_size, batch_size=embedder.batch_size)

    def raw_encode(texts: list[str]) -> tuple[float, float]:
        """(wall seconds, process CPU seconds) of one ``encode`` of ``texts``."""
        started, cpu = time.perf_counter(), time.process_time()
        model.encode(texts, batch_size=embedder.batch_size, normalize_embeddings=True, convert_to_numpy=True,
                     show_progress_bar=False)
        return time.perf_counter() - started, time.process_time() - cpu

    # the chunk texts the pipeline will embed, from its own extractor (not timed)
    from indexer.walk import walk

    indexer = Indexer.open(settings, registry=registry)
    found, _ = walk(indexer.collections)
    texts: list[str] = []
    for collection, path in found:
        try:
            prepared = indexer.pipeline.prepare(collection, path, None)
        except Exception:
            continue
        # what the embedder sees: context line and text (``c.text`` alone is ~6% fewer tokens on the vault)
        texts.extend(c.embed_text for c in getattr(prepared, "chunks", []) if c.modality == "text")
    unique_texts = list(dict.fromkeys(texts))
    log(f"1. first index: {len(found)} files, {len(texts)} chunks ({len(unique_texts)} distinct texts) ...")
    (raw_before, raw_cpu_before) = raw_encode(unique_texts)
    started, cpu = time.perf_counter(), time.process_time()
    status = index_once(indexer)
    index_s, index_cpu = time.perf_counter() - started, time.process_time() - cpu
    (raw_after, raw_cpu_after) = raw_encode(unique_texts)
    embedded = status["chunks_embedded"]
    chunks = sum(c["chunks"] for c in status["collections"].values())
    raw_rate = len(unique_texts) / ((raw_before + raw_after) / 2)
    rate = embedded / index_s
    # CPU seconds of this process: much less sensitive than wall time to other work on a shared machine
    raw_cpu_rate = len(unique_texts) / ((raw_cpu_before + raw_cpu_after) / 2)
    cpu_rate = embedded / index_cpu
    first = {"files": sum(c["files"] for c in status["collections"].values()),
             "chunks": chunks, "chunks_embedded": embedded, "seconds": round(index_s, 2),
             "chunks_per_s": round(rate, 2), "raw_encode_chunks_per_s": round(raw_rate, 2),
             "raw_encode_s": [round(raw_before, 2), round(raw_after, 2)], "ratio_to_raw": round(rate / raw_rate, 3),
             "cpu_s": round(index_cpu, 2), "raw_encode_cpu_s": [round(raw_cpu_before, 2), round(raw_cpu_after, 2)],
             "ratio_to_raw_cpu": round(cpu_rate / raw_cpu_rate, 3),
             "load_average": [round(x, 2) for x in os.getloadavg()],
             "model_id": embedder.model_id, "batch_size": embedder.batch_size}
    log(f"   {embedded} chunks embedded in {index_s:.1f} s = {rate:.1f}/s; raw encode {raw_rate:.1f}/s "
        f"({raw_before:.1f} s, {raw_after:.1f} s); wall ratio {rate / raw_rate:.3f}; per CPU second: index "
        f"{cpu_rate:.2f}, raw {raw_cpu_rate:.2f} (CPU {raw_cpu_before:.1f} s, {raw_cpu_after:.1f} s), ratio "
        f"{cpu_rate / raw_cpu_rate:.3f}; load average {os.getloadavg()[0]:.1f}")

    log("2. no-op rescans ...")
    noop = noop_rescans(indexer, settings, registry)
    vectors = real_vectors(state_dir / "embeddings.sqlite3")
    return {"first_index": first, "noop_rescan": noop}, registry, vectors


def noop_rescans(indexer: Any, settings: Any, registry: Any) -> dict[str, Any]:
    """``index_once`` on an ``indexer`` whose index is current, then (closed) once more on a new ``Indexer`` of the
    same ``settings`` (a restart, model loaded: ``Indexer.open`` + the scan): seconds and chunks embedded
    (expected 0). Closes both."""
    from indexer.daemon import Indexer
    from indexer.worker import index_once

    before = indexer.pipeline.stats.chunks_embedded
    started = time.perf_counter()
    index_once(indexer)
    same_s = time.perf_counter() - started
    same_embedded = indexer.pipeline.stats.chunks_embedded - before
    indexer.close()
    started = time.perf_counter()
    again = Indexer.open(settings, registry=registry)
    opened = time.perf_counter()
    status = index_once(again)
    done = time.perf_counter()
    again.close()
    release_state_lock(settings.state_dir)
    noop = {"same_process_s": round(same_s, 3), "same_process_embedded": same_embedded,
            "restart_open_and_scan_s": round(done - started, 3), "restart_open_s": round(opened - started, 3),
            "restart_scan_s": round(done - opened, 3), "restart_embedded": status["chunks_embedded"]}
    log(f"   same process {same_s:.3f} s, {same_embedded} embedded; after restart (open + scan) {done - started:.3f} "
        f"s (open {opened - started:.3f} s), {status['chunks_embedded']} embedded")
    return noop



def bench_noop_many(out: Path, scifact: Path, registry: Any, files: int = NOOP_FILES) -> dict[str, Any]:
    """Step 2b on Edge: ``files`` short notes (one real SciFact sentence each, ``benchmarks.bigset.
    scifact_sentences``; 100 notes a folder) indexed once, then the no-op rescans of ``noop_rescans``. The
    embedding cache of the first run is kept in ``<out>/noop-many/embeddings-cache.sqlite3`` and copied into each
    later run's fresh state, so only the first run embeds the notes (the first index is not what this step
    measures)."""
    from benchmarks.bigset import scifact_sentences
    from indexer.daemon import Indexer
    from indexer.worker import index_once

    root = out / "noop-many"
    workspace, state_dir, kept = root / "workspace", root / "state", root / "embeddings-cache.sqlite3"
    shutil.rmtree(workspace, ignore_errors=True)
    shutil.rmtree(state_dir, ignore_errors=True)
    started = time.perf_counter()
    for n, sentence in enumerate(scifact_sentences(scifact, files)):
        folder = workspace / "memory" / f"d{n // 100:03d}"
        if n % 100 == 0:
            folder.mkdir(parents=True)
        (folder / f"note-{n:05d}.md").write_text(sentence + "\n", encoding="utf-8")
    state_dir.mkdir(parents=True)
    cached = kept.exists()
    if cached:
        shutil.copyfile(kept, state_dir / "embeddings.sqlite3")
    settings = settings_for(workspace, state_dir)
    indexer = Indexer.open(settings, registry=registry)
    t = time.perf_counter()
    status = index_once(indexer)
    first_s = time.perf_counter() - t
    log(f"   {files} notes indexed in {first_s:.1f} s ({status['chunks_embedded']} chunks embedded, embedding cache "
        f"{'reused' if cached else 'new'})")
    noop = noop_rescans(indexer, settings, registry)
    shutil.copyfile(state_dir / "embeddings.sqlite3", kept)
    return {"files": sum(c["files"] for c in status["collections"].values()),
            "chunks": sum(c["chunks"] for c in status["collections"].values()),
            "first_index_s": round(first_s, 1), "first_index_embedded": status["chunks_embedded"],
            "embedding_cache_reused": cached, "step_s": round(time.perf_counter() - started, 1), **noop}
