"""Benchmarks of indexing and search with the real daemon, model and Qdrant Edge (``make bench``).

A benchmark, not a test: it prints numbers and ratios against baselines measured in the same run (the machines are
shared and noisy, so absolute numbers drift; ratios much less). Input: the Obsidian vault at
``../shared/data/vault`` (relative to the repository; ``--vault DIR`` to override), copied as the ``memory/``
folder of a fresh workspace under ``.bench/``. A missing vault is reported on stderr and the exit status is 2.

Measured, in order:

1. **First index** (in this process, ``worker.index_once`` on an empty state and an empty embedding cache):
   chunks/s, and its ratio to the raw baseline: ``SentenceTransformer.encode`` (the same model object, same
   precision, same batch size) on exactly the chunk texts the index holds, in one call, timed before and after the
   index (the mean of the two is the baseline).
2. **No-op rescan**: ``index_once`` again in the same process, and once more after a restart (a new ``Indexer`` on
   the same state): seconds and embeddings (expected 0).
3. **Save-to-searchable** (``qmd-indexer run`` as a subprocess on a free port, its own fresh state, so it does a
   full first index too): 20 edits, each appending a line with a unique token to a note; the time from the write
   to the first ``POST /search`` (keyword mode, polled every 20 ms) that returns that note. Includes the 1 s
   debounce.
4. **Search latency through the API**: 100 distinct queries (the vault's headings), hybrid mode, k=6.
5. **MCP stdio start to first answer**: ``qmd-indexer mcp`` spawned by the MCP SDK's stdio client against the
   daemon of step 3, timed from the spawn to the first answered ``memory_search`` (handshake included), 5 times;
   baseline in the same run: ``qmd-indexer search QUERY --json`` from spawn to exit (the lightest client process).
   Both run as ``python -m indexer.cli`` from this checkout.
6. **Peak RSS** of the daemon (``VmHWM`` from ``/proc/<pid>/status``; psutil's RSS sampled as a fallback).
7. **Hybrid search at 100,000 chunks** through the API (see ``build_big``: real SciFact sentences for text and BM25,
   dense vectors made from the real embeddings of step 1 with small perturbations), before and after
   ``EdgeShard.optimize()``, with the time ``optimize()`` takes (it holds the GIL) and the in-process split of a
   query's time between query embedding, the store and fusion.

Results are printed as a table and written to ``.bench/results-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VAULT = REPO.parent / "shared" / "data" / "vault"
DEFAULT_SCIFACT = REPO.parent / "shared" / "data" / "scifact"
DEFAULT_OUT = REPO / ".bench"
BIG_POINTS = 100_000
BIG_CHUNKS_PER_FILE = 20
EDITS = 20
QUERIES = 100


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, linear interpolation (numpy's default)."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else float("nan")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def copy_vault(vault: Path, workspace: Path) -> int:
    """A fresh ``workspace`` whose ``memory/`` is a copy of ``vault``; returns the number of markdown notes."""
    shutil.rmtree(workspace, ignore_errors=True)
    workspace.mkdir(parents=True)
    shutil.copytree(vault, workspace / "memory")
    return sum(1 for _ in (workspace / "memory").rglob("*.md"))


def settings_for(workspace: Path, state_dir: Path, agent: str = "bench") -> Any:
    from indexer.config import Settings, Workspace

    return Settings(state_dir=state_dir, workspace=(Workspace(agent=agent, path=workspace),), log_level="warning")


# -- 1 + 2: first index and no-op rescans, in process --------------------------------------------------------------
def bench_index(workspace: Path, state_dir: Path) -> tuple[dict[str, Any], Any, np.ndarray]:
    """Steps 1 and 2; returns (results, registry, the real chunk vectors of the index)."""
    from indexer.daemon import Indexer
    from indexer.plugins import load_registry, plugin_configs
    from indexer.worker import index_once

    shutil.rmtree(state_dir, ignore_errors=True)
    settings = settings_for(workspace, state_dir)
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
    from indexer.workspace import walk

    indexer = Indexer.open(settings, registry=registry)
    found, _ = walk(indexer.collections)
    texts: list[str] = []
    for collection, path in found:
        try:
            prepared = indexer.pipeline.prepare(collection, path, None)
        except Exception:
            continue
        texts.extend(c.text for c in getattr(prepared, "chunks", []) if c.modality == "text")
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
    before = indexer.pipeline.stats.chunks_embedded
    started = time.perf_counter()
    index_once(indexer)
    same_s = time.perf_counter() - started
    same_embedded = indexer.pipeline.stats.chunks_embedded - before
    indexer.close()
    vectors = real_vectors(state_dir / "embeddings.sqlite3")
    started = time.perf_counter()
    again = Indexer.open(settings, registry=registry)
    status = index_once(again)
    restart_s = time.perf_counter() - started
    again.close()
    noop = {"same_process_s": round(same_s, 3), "same_process_embedded": same_embedded,
            "restart_open_and_scan_s": round(restart_s, 3), "restart_embedded": status["chunks_embedded"]}
    log(f"   same process {same_s:.3f} s, {same_embedded} embedded; after restart (open + scan) {restart_s:.3f} s, "
        f"{status['chunks_embedded']} embedded")
    return {"first_index": first, "noop_rescan": noop}, registry, vectors


def real_vectors(cache_path: Path) -> np.ndarray:
    """``(n, dim)`` float32: every vector in the embedding cache (the real embeddings of this run's chunks)."""
    import sqlite3

    db = sqlite3.connect(f"file:{cache_path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT vector FROM embedding")
        return np.stack([np.frombuffer(blob, dtype=np.float32) for (blob,) in rows])
    finally:
        db.close()


# -- 3 + 4 + 5 + 6: the daemon as a subprocess -------------------------------------------------------------------------
class Daemon:
    """``qmd-indexer run`` in a subprocess on a free port; ``rss_peak()`` samples memory while it runs."""

    def __init__(self, workspace: Path, state_dir: Path, agent: str, log_path: Path) -> None:
        import psutil

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # ``python -m indexer`` from the checkout, so the code measured is this tree's (an installed
        # ``qmd-indexer`` script imports whatever checkout the virtualenv was installed from)
        cmd = [sys.executable, "-m", "indexer", "run", "--workspace", str(workspace), "--agent", agent,
               "--state-dir", str(state_dir), "--port", str(self.port)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "QMD_INDEXER_LOG_FORMAT": "json"}
        self.log_file = open(log_path, "wb")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self.log_file, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        self.ps = psutil.Process(self.proc.pid)
        self.sampled_peak = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.sampled_peak = max(self.sampled_peak, self.ps.memory_info().rss)
            except Exception:
                return

    def wait_ready(self, client: Any, timeout_s: float = 1800) -> float:
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}; see {self.log_file.name}")
            try:
                if client.get(f"{self.url}/health", timeout=2).json().get("ready"):
                    return time.perf_counter() - self.started
            except Exception:
                pass
            time.sleep(0.1)
        raise TimeoutError("daemon not ready in time")

    def rss_peak(self) -> int:
        """Peak resident set (bytes): the kernel's high-water mark, else the sampled maximum."""
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return self.sampled_peak

    def stop(self) -> None:
        self._stop.set()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()


def search_latency(client: Any, url: str, queries: Sequence[str], mode: str = "hybrid", k: int = 6) -> list[float]:
    """Seconds per ``POST /search`` (one client, keep-alive), one per query, after 3 warm-up queries."""
    for q in queries[:3]:
        client.post(f"{url}/search", json={"query": q + " warm", "k": k, "mode": mode}).raise_for_status()
    out = []
    for q in queries:
        started = time.perf_counter()
        client.post(f"{url}/search", json={"query": q, "k": k, "mode": mode}).raise_for_status()
        out.append(time.perf_counter() - started)
    return out


def mcp_first_answer(port: int, queries: Sequence[str], repeats: int = 5) -> dict[str, Any]:
    """Seconds from spawning ``qmd-indexer mcp`` (stdio, driven by the MCP SDK's client) to its first answered
    ``memory_search``, against the CLI baseline (``qmd-indexer search --json``, spawn to exit); medians."""
    import anyio
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    cli = [sys.executable, "-m", "indexer.cli"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "QMD_INDEXER_LOG_FORMAT": "json"}
    params = StdioServerParameters(command=cli[0], args=[*cli[1:], "mcp", "--port", str(port)], env=env, cwd=str(REPO))

    async def first_answer(query: str) -> float:
        started = time.perf_counter()
        with open(os.devnull, "w") as errlog:
            async with Client(stdio_client(params, errlog=errlog)) as client:
                result = await client.call_tool("memory_search", {"query": query, "k": 6})
                if result.is_error or not result.structured_content["hits"]:
                    raise RuntimeError(f"memory_search failed: {result.content}")
                return time.perf_counter() - started

    mcp_s, cli_s = [], []
    for n in range(repeats):
        mcp_s.append(anyio.run(first_answer, queries[n % len(queries)]))
        started = time.perf_counter()
        subprocess.run([*cli, "search", queries[n % len(queries)], "--json", "--port", str(port)], cwd=REPO, env=env,
                       check=True, capture_output=True, timeout=120)
        cli_s.append(time.perf_counter() - started)
    mcp_med, cli_med = statistics.median(mcp_s), statistics.median(cli_s)
    return {"mcp_first_answer_s": round(mcp_med, 2), "cli_search_s": round(cli_med, 2),
            "ratio_to_cli": round(mcp_med / cli_med, 2), "n": repeats}


def headings(workspace: Path, limit: int) -> list[str]:
    """Distinct markdown heading texts of the workspace's notes, in path order: realistic short queries."""
    seen: dict[str, None] = {}
    for path in sorted(workspace.rglob("*.md")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            m = re.match(r"#{1,6}\s+(.{6,80})$", line.strip())
            if m:
                seen.setdefault(m.group(1).strip(), None)
    return list(seen)[:limit]


def bench_daemon(workspace: Path, state_dir: Path, out: Path) -> dict[str, Any]:
    import httpx

    shutil.rmtree(state_dir, ignore_errors=True)
    log("3-5. daemon subprocess: first index, then edits and searches ...")
    daemon = Daemon(workspace, state_dir, "bench", out / "daemon.log")
    client = httpx.Client(timeout=30)
    try:
        ready_s = daemon.wait_ready(client)
        status = client.get(f"{daemon.url}/status").json()
        log(f"   ready after {ready_s:.1f} s (model load + first index of {status['chunks_embedded']} chunks)")
        notes = sorted((workspace / "memory").rglob("*.md"))
        latencies = []
        for n in range(EDITS):
            note = notes[(n * 7) % len(notes)]
            token = f"benchtoken{uuid.uuid4().hex[:12]}"
            rel = note.relative_to(workspace).as_posix()
            with open(note, "a", encoding="utf-8") as handle:
                handle.write(f"\nNew fact {n}: {token} was saved.\n")
            written = time.perf_counter()
            while True:
                hits = client.post(f"{daemon.url}/search",
                                   json={"query": token, "k": 3, "mode": "keyword"}).json().get("hits", [])
                if any(h.get("path") == rel and token in h.get("snippet", "") for h in hits):
                    latencies.append(time.perf_counter() - written)
                    break
                if time.perf_counter() - written > 60:
                    raise TimeoutError(f"edit {n} of {rel} not searchable after 60 s")
                time.sleep(0.02)
        log(f"   save-to-searchable p50 {pct(latencies, 50):.3f} s, p95 {pct(latencies, 95):.3f} s")
        queries = headings(workspace, QUERIES)
        lat = search_latency(client, daemon.url, queries)
        log(f"   search p50 {1000 * pct(lat, 50):.1f} ms, p95 {1000 * pct(lat, 95):.1f} ms ({len(lat)} queries)")
        mcp = mcp_first_answer(daemon.port, queries)
        log(f"   MCP stdio start to first memory_search {mcp['mcp_first_answer_s']:.2f} s "
            f"(CLI search {mcp['cli_search_s']:.2f} s, ratio {mcp['ratio_to_cli']:.2f})")
        rss = daemon.rss_peak()
        chunks = sum(c["chunks"] for c in client.get(f"{daemon.url}/status").json()["collections"].values())
    finally:
        client.close()
        daemon.stop()
    return {"daemon_ready_s": round(ready_s, 1),
            "save_to_searchable_s": {"p50": round(pct(latencies, 50), 3), "p95": round(pct(latencies, 95), 3),
                                     "max": round(max(latencies), 3), "n": len(latencies)},
            "search_ms": {"p50": round(1000 * pct(lat, 50), 1), "p95": round(1000 * pct(lat, 95), 1), "n": len(lat),
                          "chunks": chunks},
            "mcp": mcp,
            "peak_rss_mib": round(rss / 2**20, 1), "peak_rss_sampled_mib": round(daemon.sampled_peak / 2**20, 1)}


# -- 7: 100,000 chunks ---------------------------------------------------------------------------------------------
def scifact_passages(scifact: Path, n: int) -> list[str]:
    """``n`` distinct real passages: windows of 2-6 consecutive sentences of SciFact abstracts (every start, every
    width), in corpus order."""
    corpus_path = scifact / "corpus.jsonl.gz"
    opener = gzip.open if corpus_path.exists() else open
    corpus_path = corpus_path if corpus_path.exists() else scifact / "corpus.jsonl"
    passages: dict[str, None] = {}
    with opener(corpus_path, "rt", encoding="utf-8") as handle:
        for line in handle:
            doc = json.loads(line)
            sentences = [s for s in re.split(r"(?<=[.!?])\s+", doc["text"]) if s.strip()]
            for width in (2, 3, 4, 6):
                for start in range(0, max(1, len(sentences) - width + 1)):
                    passages.setdefault(" ".join(sentences[start : start + width]), None)
            if len(passages) >= n:
                break
    return list(passages)[:n]


def build_big(workspace: Path, state_dir: Path, vectors: np.ndarray, scifact: Path, registry: Any) -> dict[str, Any]:
    """A workspace of ``BIG_POINTS / BIG_CHUNKS_PER_FILE`` notes and its complete index, built without the model.

    Text: real SciFact passages (``scifact_passages``), one per line, ``BIG_CHUNKS_PER_FILE`` lines per note; each
    line is one chunk, its BM25 vector computed by the product's ``Bm25``. Dense: row ``i`` is the real embedding
    ``vectors[i % len(vectors)]`` (this run's vault chunks) plus Gaussian noise (sigma 0.02 per dimension, so
    cosine to its source ~0.9), L2-normalised. Payloads are the product's (path, hashes, stat, chunk counts), so
    the daemon sees every file as indexed and embeds nothing at start."""
    from indexer.bm25 import Bm25Terms
    from indexer.points import Payload, Point, ancestor_dirs, point_id
    from indexer.store import open_store

    shutil.rmtree(workspace, ignore_errors=True)
    shutil.rmtree(state_dir, ignore_errors=True)
    (workspace / "memory").mkdir(parents=True)
    passages = scifact_passages(scifact, BIG_POINTS)
    if len(passages) < BIG_POINTS:
        raise RuntimeError(f"only {len(passages)} distinct SciFact passages")
    settings = settings_for(workspace, state_dir, agent="big")
    from indexer.workspace import plan_collections

    collection = next(c for c in plan_collections(settings.workspace) if c.role == "dir")
    store = open_store(state_dir)
    store.ensure_collection(collection.name, {"text": vectors.shape[1]})
    bm25 = Bm25Terms(settings.bm25)  # the product's own BM25 terms
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    batch: list[Point] = []
    for f in range(BIG_POINTS // BIG_CHUNKS_PER_FILE):
        lines = passages[f * BIG_CHUNKS_PER_FILE : (f + 1) * BIG_CHUNKS_PER_FILE]
        path = workspace / "memory" / f"note-{f:05d}.md"
        content = "\n".join(lines) + "\n"
        path.write_text(content, encoding="utf-8")
        st = path.stat()
        file_hash = hashlib.sha256(content.encode("utf-8")).hexdigest()
        rel = f"memory/{path.name}"
        for i, text in enumerate(lines):
            n = f * BIG_CHUNKS_PER_FILE + i
            vec = vectors[n % len(vectors)] + rng.normal(0, 0.02, vectors.shape[1]).astype(np.float32)
            vec /= np.linalg.norm(vec)
            terms = bm25.document(text) or ([], [])
            payload = {"agent": "big", "collection": collection.name, "path": rel, "abs_path": str(path),
                       "dirs": ancestor_dirs(rel), "file_hash": file_hash, "size_bytes": st.st_size,
                       "mtime_ns": st.st_mtime_ns, "chunk_index": i, "chunk_count": len(lines),
                       "start_line": i + 1, "end_line": i + 1, "text": text, "kind": "markdown",
                       "modality": "text", "model_id": registry.embedders["text"].model_id}
            batch.append(Point(point_id(collection.name, str(path), i), {"text": vec},
                               {"bm25": terms}, Payload.from_payload(payload)))
        if len(batch) >= 2000:
            store.upsert(collection.name, batch)
            batch = []
    if batch:
        store.upsert(collection.name, batch)
    count = store.count(collection.name)
    store.close()
    return {"points": count, "build_s": round(time.perf_counter() - started, 1), "collection": collection.name,
            "how": f"{count} chunks in {count // BIG_CHUNKS_PER_FILE} notes; text = distinct windows of 2-6 "
                   f"consecutive SciFact abstract sentences, BM25 by the product's Bm25; dense = the "
                   f"{len(vectors)} real embeddings of this run's vault chunks, cycled, + N(0, 0.02) noise per "
                   f"dimension, L2-normalised"}


def inprocess_split(state_dir: Path, workspace: Path, registry: Any, queries: Sequence[str]) -> dict[str, Any]:
    """Per query, medians in ms in this process: embedding the query, each prefetch by ids and scores (as the
    searcher runs them) and with every candidate's payload (as the first version did), fusion, the payload read of
    the k kept hits, snippets, and the whole ``retrieve`` (query embedding cached)."""
    from indexer.daemon import Indexer
    from indexer.points import Filter, Hit, Query
    from indexer.search import SearchParams, fuse, to_hit

    indexer = Indexer.open(settings_for(workspace, state_dir, agent="big"), registry=registry)
    searcher = indexer.searcher()
    embed_ms, dense_ms, sparse_ms, fuse_ms, total_ms = [], [], [], [], []
    dense_payload_ms, sparse_payload_ms, payload_ms, snippet_ms = [], [], [], []
    name = indexer.collections[1].name
    for q in queries:
        t0 = time.perf_counter()
        dense = dict(searcher.embed_query(q))
        t1 = time.perf_counter()
        terms = indexer.terms.query(q)
        lists = indexer.store.search(name, Query(limit=searcher.prefetch_limit, dense=dense, filter=Filter()),
                                     with_payload=False)
        t2 = time.perf_counter()
        lists.update(indexer.store.search(name, Query(limit=searcher.prefetch_limit, sparse=terms),
                                          with_payload=False))
        t3 = time.perf_counter()
        fused = fuse(list(lists.values()), searcher.fusion, searcher.rrf_k, searcher.prefetch_limit)
        t4 = time.perf_counter()
        searcher.retrieve(SearchParams(q + " ", k=6))
        t5 = time.perf_counter()
        payloads = indexer.store.payloads(name, [h.id for h in fused[:6]])
        t6 = time.perf_counter()
        [to_hit(Hit(h.id, h.score, payloads[h.id]), q) for h in fused[:6] if h.id in payloads]
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
    med = lambda xs: round(1000 * statistics.median(xs), 2)  # noqa: E731
    return {"embed_query_ms": med(embed_ms), "dense_search_ms": med(dense_ms), "bm25_search_ms": med(sparse_ms),
            "dense_with_payloads_ms": med(dense_payload_ms), "bm25_with_payloads_ms": med(sparse_payload_ms),
            "payloads_k_ms": med(payload_ms), "snippets_ms": med(snippet_ms),
            "fuse_ms": med(fuse_ms), "retrieve_ms": med(total_ms)}


def optimize_shard(state_dir: Path, collection: str) -> float:
    """Seconds ``EdgeShard.optimize()`` takes on the shard (builds HNSW; holds the GIL)."""
    import qdrant_edge as qe

    shard = qe.EdgeShard.load(str(state_dir / "qdrant" / collection))
    started = time.perf_counter()
    shard.optimize()
    seconds = time.perf_counter() - started
    shard.flush()
    shard.close()
    return seconds


def bench_big(out: Path, vectors: np.ndarray, scifact: Path, registry: Any, queries: Sequence[str]) -> dict[str, Any]:
    import httpx

    workspace, state_dir = out / "big" / "workspace", out / "big" / "state"
    log(f"6. building {BIG_POINTS} chunks ...")
    built = build_big(workspace, state_dir, vectors, scifact, registry)
    log(f"   {built['how']} ({built['build_s']} s)")
    result: dict[str, Any] = {"collection": built}

    def through_api(label: str) -> dict[str, Any]:
        daemon = Daemon(workspace, state_dir, "big", out / f"daemon-big-{label}.log")
        client = httpx.Client(timeout=60)
        try:
            ready_s = daemon.wait_ready(client)
            status = client.get(f"{daemon.url}/status").json()
            lat = search_latency(client, daemon.url, queries)
            rss = daemon.rss_peak()
        finally:
            client.close()
            daemon.stop()
        r = {"p50_ms": round(1000 * pct(lat, 50), 1), "p95_ms": round(1000 * pct(lat, 95), 1),
             "ready_s": round(ready_s, 1), "embedded_at_start": status["chunks_embedded"],
             "chunks": sum(c["chunks"] for c in status["collections"].values()), "peak_rss_mib": round(rss / 2**20)}
        log(f"   {label}: API hybrid p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms; {r['chunks']} chunks, "
            f"{r['embedded_at_start']} embedded at start, ready in {r['ready_s']} s")
        return r

    result["exact"] = through_api("exact")
    result["exact_split"] = inprocess_split(state_dir, workspace, registry, queries[:50])
    log(f"   in-process split (exact): {result['exact_split']}")
    seconds = optimize_shard(state_dir, built["collection"])
    result["optimize_s"] = round(seconds, 1)
    log(f"   EdgeShard.optimize(): {seconds:.1f} s (holds the GIL)")
    result["hnsw"] = through_api("hnsw")
    result["hnsw_split"] = inprocess_split(state_dir, workspace, registry, queries[:50])
    log(f"   in-process split (hnsw): {result['hnsw_split']}")
    return result


# -- command line --------------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--vault", type=Path, default=DEFAULT_VAULT, help="markdown vault to index [%(default)s]")
    parser.add_argument("--scifact", type=Path, default=DEFAULT_SCIFACT, help="SciFact, for step 7 [%(default)s]")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="work folder and results [%(default)s]")
    parser.add_argument("--skip-big", action="store_true", help="skip step 7 (100,000 chunks)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not args.vault.is_dir() or not any(args.vault.rglob("*.md")):
        print(f"bench: vault not found (or holds no markdown): {args.vault}\nThe benchmark indexes a copy of "
              f"../shared/data/vault (or --vault DIR).", file=sys.stderr)
        return 2
    big = not args.skip_big
    if big and not args.scifact.is_dir():
        print(f"bench: SciFact not found at {args.scifact}: step 7 (100,000 chunks) needs it; pass --scifact DIR "
              f"or --skip-big.", file=sys.stderr)
        return 2
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    workspace = out / "vault" / "workspace"
    notes = copy_vault(args.vault.resolve(), workspace)
    log(f"vault {args.vault} copied to {workspace / 'memory'} ({notes} notes)")
    results: dict[str, Any] = {"vault": str(args.vault), "notes": notes, "cpus": os.cpu_count(),
                               "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    part, registry, vectors = bench_index(workspace, out / "vault" / "state-inprocess")
    results.update(part)
    copy_vault(args.vault.resolve(), workspace)  # the daemon indexes the pristine copy
    results["daemon"] = bench_daemon(workspace, out / "vault" / "state-daemon", out)
    if big:
        results["big"] = bench_big(out, vectors, args.scifact.resolve(), registry, headings(workspace, QUERIES))
    path = out / f"results-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=2))
    print_table(results)
    print(f"\nresults: {path}")
    return 0


def print_table(r: dict[str, Any]) -> None:
    f, n, d = r["first_index"], r["noop_rescan"], r["daemon"]
    rows = [
        ("first index, chunks/s", f"{f['chunks_per_s']:.1f}", f"raw encode {f['raw_encode_chunks_per_s']:.1f}/s",
         f"wall ratio {f['ratio_to_raw']:.3f} (aim >= 0.9)"),
        ("  per CPU second", f"ratio {f['ratio_to_raw_cpu']:.3f}",
         f"CPU s: index {f['cpu_s']}, raw {f['raw_encode_cpu_s']}", f"load avg {f['load_average'][0]}"),
        ("  chunks / seconds", f"{f['chunks_embedded']} / {f['seconds']:.1f} s", f["model_id"],
         f"batch {f['batch_size']}"),
        ("no-op rescan (same process)", f"{n['same_process_s']:.3f} s", f"{n['same_process_embedded']} embedded",
         "aim 0, < 1 s"),
        ("no-op after restart", f"{n['restart_open_and_scan_s']:.3f} s", f"{n['restart_embedded']} embedded",
         "open + scan"),
        ("save-to-searchable", f"p50 {d['save_to_searchable_s']['p50']:.2f} s",
         f"p95 {d['save_to_searchable_s']['p95']:.2f} s", f"{d['save_to_searchable_s']['n']} edits; aim p95 < 2 s"),
        ("API search (hybrid, k=6)", f"p50 {d['search_ms']['p50']:.1f} ms", f"p95 {d['search_ms']['p95']:.1f} ms",
         f"{d['search_ms']['chunks']} chunks; aim p50 < 30 ms"),
        ("MCP stdio start to 1st search", f"{d['mcp']['mcp_first_answer_s']:.2f} s",
         f"CLI search {d['mcp']['cli_search_s']:.2f} s", f"ratio {d['mcp']['ratio_to_cli']:.2f} (median of "
         f"{d['mcp']['n']})"),
        ("daemon peak RSS", f"{d['peak_rss_mib']:.0f} MiB", f"sampled {d['peak_rss_sampled_mib']:.0f} MiB",
         "VmHWM, incl. first index"),
    ]
    b = r.get("big")
    if b:
        rows += [
            ("100k API hybrid, exact scan", f"p50 {b['exact']['p50_ms']:.1f} ms", f"p95 {b['exact']['p95_ms']:.1f} ms",
             f"{b['exact']['chunks']} chunks; aim p50 < 30 ms"),
            ("100k optimize() (HNSW)", f"{b['optimize_s']:.1f} s", "holds the GIL", ""),
            ("100k API hybrid, HNSW", f"p50 {b['hnsw']['p50_ms']:.1f} ms", f"p95 {b['hnsw']['p95_ms']:.1f} ms", ""),
            ("100k split exact (ms)", f"embed {b['exact_split']['embed_query_ms']}",
             f"dense {b['exact_split']['dense_search_ms']} bm25 {b['exact_split']['bm25_search_ms']}",
             f"fuse {b['exact_split']['fuse_ms']} retrieve {b['exact_split']['retrieve_ms']}"),
            ("100k split HNSW (ms)", f"embed {b['hnsw_split']['embed_query_ms']}",
             f"dense {b['hnsw_split']['dense_search_ms']} bm25 {b['hnsw_split']['bm25_search_ms']}",
             f"fuse {b['hnsw_split']['fuse_ms']} retrieve {b['hnsw_split']['retrieve_ms']}"),
        ]
    print()
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


if __name__ == "__main__":
    sys.exit(main())
