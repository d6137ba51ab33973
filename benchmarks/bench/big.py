"""Step 7 of ``python -m benchmarks.bench``: hybrid search at 100,000 chunks through the API, on Edge (exact scan,
then the daemon's own HNSW build, then a restart) or on a Qdrant server, with the in-process split of a query's time
and a restart's time to ready."""

from __future__ import annotations

import gc
import hashlib
import os
import re
import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench import common
from benchmarks.bench.common import log, pct, release_state_lock, search_latency, server_env, settings_for
from benchmarks.harness import Daemon


def build_big(workspace: Path, state_dir: Path, vectors: np.ndarray | None, scifact: Path, registry: Any,
              qdrant_url: str = "") -> dict[str, Any]:
    """A workspace of ``BIG_POINTS / BIG_CHUNKS_PER_FILE`` notes and its complete index, built without the model
    (but for ``BIG_ANCHORS`` real embeddings).

    Text: real SciFact passages (``benchmarks.bigset.scifact_passages``), one per line, ``BIG_CHUNKS_PER_FILE``
    lines per note; each line is one chunk, its BM25 vector computed by the product's ``Bm25``. Dense, with
    ``BIG_ANCHORS`` = 0: row ``i`` is the real embedding ``vectors[i % len(vectors)]`` (this run's vault chunks)
    plus Gaussian noise (sigma 0.02 per dimension, so cosine to its source ~0.9), L2-normalised; with k > 0: mixes
    of k real embeddings of the passages themselves (``benchmarks.bigset.anchored_vectors``). Payloads are the
    product's (path, hashes, stat, chunk counts), so the daemon sees every file as indexed and embeds nothing at
    start."""
    from benchmarks.bigset import anchored_vectors, scifact_passages
    from indexer.bm25 import Bm25Terms
    from indexer.points import Payload, Point, ancestor_dirs, point_id
    from indexer.sources.base import index_hash
    from indexer.store import open_store

    shutil.rmtree(workspace, ignore_errors=True)
    shutil.rmtree(state_dir, ignore_errors=True)
    (workspace / "memory").mkdir(parents=True)
    passages = scifact_passages(scifact, common.BIG_POINTS)
    embedder = registry.embedders["text"]
    anchored = None
    if common.BIG_ANCHORS:
        started = time.perf_counter()
        model = re.sub(r"[^A-Za-z0-9.-]+", "_", embedder.model_id)
        cache = workspace.parent / f"anchors-{model}-{common.BIG_POINTS}-{common.BIG_ANCHORS}.npz"
        anchored = anchored_vectors(passages, common.BIG_ANCHORS, embedder, cache)
        first = next(anchored)  # embeds the anchors (or reads them from the cache)
        log(f"   {common.BIG_ANCHORS} anchor passages embedded (or cached) in {time.perf_counter() - started:.1f} s")
    elif vectors is None:
        raise ValueError("build_big needs the vault's vectors when BIG_ANCHORS is 0")
    settings = settings_for(workspace, state_dir, agent="big", qdrant_url=qdrant_url)
    from indexer.statedir import edge_store, recorded_tenancy
    from indexer.store import ServerOptions
    from indexer.workspace import plan_collections

    collection = next(c for c in plan_collections(settings.workspace) if c.role == "dir")
    options = ServerOptions.from_settings(settings, recorded_tenancy(state_dir, qdrant_url))
    store = open_store(edge_store(state_dir), qdrant_url, options=options)
    store.drop(collection.name)  # a server keeps collections between runs
    store.ensure_collection(collection.name, {"text": int(embedder.dim)})
    bm25 = Bm25Terms(settings.bm25)  # the product's own BM25 terms
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    batch: list[Point] = []
    for f in range(common.BIG_POINTS // common.BIG_CHUNKS_PER_FILE):
        lines = passages[f * common.BIG_CHUNKS_PER_FILE : (f + 1) * common.BIG_CHUNKS_PER_FILE]
        path = workspace / "memory" / f"note-{f:05d}.md"
        content = "\n".join(lines) + "\n"
        path.write_text(content, encoding="utf-8")
        st = path.stat()
        # the hash the pipeline gives this content (chunking version included), so the daemon finds it current
        file_hash = index_hash(hashlib.sha256(content.encode("utf-8")).hexdigest())
        rel = f"memory/{path.name}"
        for i, text in enumerate(lines):
            n = f * common.BIG_CHUNKS_PER_FILE + i
            if anchored is not None:
                vec = first if n == 0 else next(anchored)
            else:
                assert vectors is not None
                vec = vectors[n % len(vectors)] + rng.normal(0, 0.02, vectors.shape[1]).astype(np.float32)
                vec /= np.linalg.norm(vec)
            terms = bm25.document(text) or ([], [])
            payload = {"agent": "big", "collection": collection.name, "path": rel, "abs_path": str(path),
                       "dirs": ancestor_dirs(rel), "file_hash": file_hash, "size_bytes": st.st_size,
                       "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino,
                       "device": st.st_dev, "chunk_index": i, "chunk_count": len(lines),
                       "start_line": i + 1, "end_line": i + 1, "text": text, "kind": "markdown",
                       "modality": "text", "model_id": registry.embedders["text"].model_id}
            batch.append(Point(point_id(collection.name, str(path), i), {"text": vec},
                               {"bm25": terms}, Payload.from_payload(payload)))
        if len(batch) >= 2000:
            store.upsert(collection.name, batch)
            batch = []
            if (f + 1) * common.BIG_CHUNKS_PER_FILE % 100_000 == 0:
                log(f"   {(f + 1) * common.BIG_CHUNKS_PER_FILE} chunks stored ({time.perf_counter() - started:.0f} s)")
    if batch:
        store.upsert(collection.name, batch)
    count = store.count(collection.name)
    store.close()
    text = ("distinct windows of 2-6 consecutive SciFact abstract sentences" if common.BIG_POINTS <= 150_000 else
            "distinct windows of 2-6 consecutive SciFact abstract sentences, then of 24-128 consecutive words at "
            "every 4th word")
    anchors, real = common.BIG_ANCHORS, len(vectors) if vectors is not None else 0
    dense = (f"{anchors} real embeddings of anchor passages spread evenly, each other passage's vector the "
             f"mix of the anchors before and after it by position + N(0, 0.02) noise, L2-normalised"
             if anchors else f"the {real} real embeddings of this run's "
             f"vault chunks, cycled, + N(0, 0.02) noise per dimension, L2-normalised")
    return {"points": count, "build_s": round(time.perf_counter() - started, 1), "collection": collection.name,
            "store": {"on_disk_vectors": settings.qdrant_on_disk_vectors, "quantization": settings.qdrant_quantization},
            "how": f"{count} chunks in {count // common.BIG_CHUNKS_PER_FILE} notes; text = {text}, BM25 by the "
                   f"product's Bm25; dense = {dense}"}


def inprocess_split(state_dir: Path, workspace: Path, registry: Any, queries: Sequence[str],
                    qdrant_url: str = "") -> dict[str, Any]:
    """Per query, medians in ms in this process: embedding the query, each prefetch by ids and scores (as the
    searcher runs them) and with every candidate's payload (as the first version did), fusion, the payload read of
    the k kept hits, snippets, and the whole ``retrieve`` (query embedding cached)."""
    from indexer.daemon import Indexer
    from indexer.hits import to_hit
    from indexer.points import Filter, Hit, Query
    from indexer.ranking import fuse_scores
    from indexer.search import SearchParams

    indexer = Indexer.open(settings_for(workspace, state_dir, agent="big", qdrant_url=qdrant_url), registry=registry)
    searcher = indexer.view.searcher()
    embed_ms, dense_ms, sparse_ms, fuse_ms, total_ms = [], [], [], [], []
    dense_payload_ms, sparse_payload_ms, payload_ms, snippet_ms = [], [], [], []
    name = indexer.collections[1].name
    for q in queries:
        t0 = time.perf_counter()
        dense = dict(searcher.embed_query(q))
        t1 = time.perf_counter()
        terms = indexer.terms.query(q)
        lists = indexer.store.scores(name, Query(limit=searcher.prefetch_limit, dense=dense, filter=Filter()))
        t2 = time.perf_counter()
        lists.update(indexer.store.scores(name, Query(limit=searcher.prefetch_limit, sparse=terms)))
        t3 = time.perf_counter()
        fused = fuse_scores(list(lists.values()), searcher.fusion, searcher.rrf_k, searcher.prefetch_limit)
        t4 = time.perf_counter()
        searcher.retrieve(SearchParams(q + " ", k=6))
        t5 = time.perf_counter()
        kept = [(str(pid), score) for pid, score in fused[:6]]
        payloads = indexer.store.payloads(name, [pid for pid, _ in kept])
        t6 = time.perf_counter()
        [to_hit(Hit(pid, score, payloads[pid]), q) for pid, score in kept if pid in payloads]
        t7 = time.perf_counter()
        # the first version's prefetches: every candidate's payload read with it
        indexer.store.search(name, Query(limit=searcher.prefetch_limit, dense=dense))
        t8 = time.perf_counter()
        indexer.store.search(name, Query(limit=searcher.prefetch_limit, sparse=terms))
        t9 = time.perf_counter()
        embed_ms.append(t1 - t0), dense_ms.append(t2 - t1), sparse_ms.append(t3 - t2), fuse_ms.append(t4 - t3)
        total_ms.append(t5 - t4), payload_ms.append(t6 - t5), snippet_ms.append(t7 - t6)
        dense_payload_ms.append(t8 - t7), sparse_payload_ms.append(t9 - t8)
    indexer.close()
    release_state_lock(state_dir)
    med = lambda xs: round(1000 * statistics.median(xs), 2)  # noqa: E731
    return {"embed_query_ms": med(embed_ms), "dense_search_ms": med(dense_ms), "bm25_search_ms": med(sparse_ms),
            "dense_with_payloads_ms": med(dense_payload_ms), "bm25_with_payloads_ms": med(sparse_payload_ms),
            "payloads_k_ms": med(payload_ms), "snippets_ms": med(snippet_ms),
            "fuse_ms": med(fuse_ms), "retrieve_ms": med(total_ms)}


def restart_ready(state_dir: Path, workspace: Path, registry: Any, qdrant_url: str = "") -> dict[str, Any]:
    """A restart's time to ready with the model already loaded (``registry`` given: model load excluded), seconds:
    ``Indexer.open`` (store, cache, ``connect``: every collection checked and its file states read) and the first
    scan and drain (``index_once``: every file's stat compared with its indexed state; nothing to embed). This is
    the daemon's path to ``ready`` (``indexer.worker.run``) less the watcher start and the model warm-up."""
    from indexer.daemon import Indexer
    from indexer.worker import index_once

    gc.freeze()  # as ``indexer.service.serve`` does once the models are loaded
    started = time.perf_counter()
    indexer = Indexer.open(settings_for(workspace, state_dir, agent="big", qdrant_url=qdrant_url), registry=registry)
    opened = time.perf_counter()
    status = index_once(indexer)
    done = time.perf_counter()
    indexer.close()
    release_state_lock(state_dir)
    return {"open_connect_s": round(opened - started, 2), "scan_s": round(done - opened, 2),
            "ready_s": round(done - started, 2), "files": len(indexer.state.indexed),
            "embedded": status.get("chunks_embedded"), "load_average": round(os.getloadavg()[0], 2)}


def wait_server_indexed(url: str, collection: str, timeout_s: float = 900) -> float:
    """Seconds until the server's collection is ``green`` (its optimizer finished: HNSW built for every segment
    over the indexing threshold, Qdrant's default 10,000 KB). Raises ``TimeoutError``."""
    import httpx

    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        info = httpx.get(f"{url}/collections/{collection}", timeout=10).json()["result"]
        if info["status"] == "green":
            return time.perf_counter() - started
        time.sleep(0.5)
    raise TimeoutError(f"{collection} on {url} not green after {timeout_s} s")


def bench_big(out: Path, vectors: np.ndarray | None, scifact: Path, registry: Any, queries: Sequence[str],
              qdrant_url: str = "", other_queries: Sequence[str] = ()) -> dict[str, Any]:
    """Step 7 on Edge (``qdrant_url`` empty: exact scan, then the daemon's own HNSW build) or on that server (after
    its optimizer built HNSW). ``other_queries`` are searched while the daemon builds HNSW: distinct from
    ``queries``, so that the query embeddings cached then (the searcher keeps the last 256) do not speed up the
    measurement after the build."""
    import httpx

    backend = "server" if qdrant_url else "edge"
    workspace, state_dir = out / "big" / "workspace", out / "big" / f"state-{backend}"
    log(f"7. [{backend}] building {common.BIG_POINTS} chunks ...")
    built = build_big(workspace, state_dir, vectors, scifact, registry, qdrant_url)
    log(f"   {built['how']} ({built['build_s']} s)")
    result: dict[str, Any] = {"collection": built}

    def through_api(label: str, env: dict[str, str], hnsw: bool = False) -> dict[str, Any]:
        """API search latency on a fresh daemon; with ``hnsw`` (Edge), once while the daemon builds its HNSW index
        (``<label>_during_build``) and once after it swapped it in, with the build's figures."""
        daemon = Daemon(workspace, state_dir, out / f"daemon-big-{backend}-{label}.log",
                        {**server_env(qdrant_url), **env}, agent="big", fp32=False, sample_rss=True)
        client = httpx.Client(timeout=60)
        extra: dict[str, Any] = {}
        try:
            ready_s = daemon.wait_ready(1800)
            status = client.get(f"{daemon.url}/status").json()
            if hnsw:
                during = search_latency(daemon.port, other_queries or [f"{q} now" for q in queries])
                extra["during_build"] = {"p50_ms": round(1000 * pct(during, 50), 1),
                                         "p95_ms": round(1000 * pct(during, 95), 1),
                                         "state_after": dict(client.get(f"{daemon.url}/status").json()["hnsw"])}
                log(f"   {backend} while the daemon builds HNSW: API hybrid p50 {extra['during_build']['p50_ms']} ms, "
                    f"p95 {extra['during_build']['p95_ms']} ms; {extra['during_build']['state_after']}")
                waited, build = time.perf_counter(), {}
                while time.perf_counter() - waited < common.BIG_HNSW_WAIT_S:
                    try:
                        build = client.get(f"{daemon.url}/status").json()["hnsw"].get(built["collection"], {})
                    except httpx.TransportError:  # a kept-alive connection closed by the daemon as it is reused
                        time.sleep(1)  # (seen once, right after a 1M swap held the daemon's GIL for seconds)
                        continue
                    if build.get("state") not in (None, "building") or (
                            build.get("state") is None and time.perf_counter() - waited > 60):
                        break
                    time.sleep(1)
                extra["build"] = build
                log(f"   {backend} HNSW build: {build}")
            cpu, first = daemon.cpu_s(), list[float]()
            lat = search_latency(daemon.port, queries, warm_up=first)
            cpu_after = daemon.cpu_s()
            # the same queries again: their embeddings are cached now, so this is the search without the model
            # (less sensitive to other load on the machine, and what an index changes)
            cached = search_latency(daemon.port, queries)
            rss = daemon.rss_peak()
            rss_now = daemon.rss_parts()
        finally:
            client.close()
            daemon.stop()
        cpu_ms = 1000 * (cpu_after - cpu) / (len(queries) + 3)
        r = {"p50_ms": round(1000 * pct(lat, 50), 1), "p95_ms": round(1000 * pct(lat, 95), 1),
             "cached_embedding_p50_ms": round(1000 * pct(cached, 50), 1),
             "cached_embedding_p95_ms": round(1000 * pct(cached, 95), 1), "daemon_cpu_ms_per_search": round(cpu_ms, 1),
             "first_searches_ms": [round(1000 * x, 1) for x in first],
             "ready_s": round(ready_s, 1), "embedded_at_start": status["chunks_embedded"],
             "chunks": sum(c["chunks"] for c in status["collections"].values()), "peak_rss_mib": round(rss / 2**20),
             "rss_end_mib": rss_now, "load_average": round(os.getloadavg()[0], 2), **extra}
        log(f"   {backend} {label}: API hybrid p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms (query embedding cached: "
            f"p50 {r['cached_embedding_p50_ms']} ms, p95 {r['cached_embedding_p95_ms']} ms; daemon CPU "
            f"{r['daemon_cpu_ms_per_search']} ms a search); {r['chunks']} chunks, "
            f"{r['embedded_at_start']} embedded at start, ready in {r['ready_s']} s; peak RSS {r['peak_rss_mib']} "
            f"MiB (at the end: {rss_now}); load average {r['load_average']}")
        return r

    def split(label: str) -> dict[str, Any]:
        result[f"{label}_restart"] = restart_ready(state_dir, workspace, registry, qdrant_url)
        log(f"   restart to ready, model loaded ({backend} {label}): {result[f'{label}_restart']}")
        result[f"{label}_split"] = inprocess_split(state_dir, workspace, registry, queries[:50], qdrant_url)
        log(f"   in-process split ({backend} {label}): {result[f'{label}_split']}")
        return result

    if qdrant_url:
        seconds = wait_server_indexed(qdrant_url, built["collection"])
        result["optimize_s"] = round(built["build_s"] + seconds, 1)
        log(f"   server optimizer: green {seconds:.1f} s after the last upsert (HNSW built in its own threads)")
        result["hnsw"] = through_api("hnsw", {})
        return split("hnsw")
    # before: exact scan only (no HNSW build); after: the daemon builds HNSW in a child process and swaps it in
    result["exact"] = through_api("exact", {"QMD_INDEXER_EDGE_HNSW_MIN_POINTS": "0"})
    split("exact")
    result["hnsw"] = through_api("hnsw", {}, hnsw=True)
    result["optimize_s"] = result["hnsw"].get("build", {}).get("seconds")
    split("hnsw")
    # a restart on the built index: what Edge keeps cold is memory-mapped, not loaded by ``EdgeShard.load``, and
    # Qdrant dropped it from the page cache when the last daemon closed the shard; the daemon reads the search files
    # back in the background (``indexer.store.edge_warm``) while its first searches run
    result["restarted"] = through_api("restarted", {})
    return result
