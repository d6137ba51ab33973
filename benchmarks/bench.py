"""Benchmarks of indexing and search with the real daemon, model and Qdrant Edge (``make bench``).

A benchmark, not a test: it prints numbers and ratios against baselines measured in the same run (the machines are
shared and noisy, so absolute numbers drift; ratios much less). Input: the Obsidian vault at
``../shared/data/vault`` (relative to the repository; ``--vault DIR`` to override), copied as the ``memory/``
folder of a fresh workspace under ``.bench/``. A missing vault is reported on stderr and the exit status is 2.

Measured, in order:

1. **First index** (in this process, ``worker.index_once`` on an empty state and an empty embedding cache):
   chunks/s, and its ratio to the raw baseline: ``SentenceTransformer.encode`` (the same model object, same
   precision, same batch size) on exactly the texts the index embeds (each distinct chunk's ``embed_text``: its
   context line and text), in one call, timed before and after the index (the mean of the two is the baseline).
2. **No-op rescan**: ``index_once`` again in the same process, and once more after a restart (a new ``Indexer`` on
   the same state): seconds and embeddings (expected 0).
2b. **No-op rescan of 10,000 files** (Edge, ``bench_noop_many``; ``--skip-noop-many``): 10,000 one-sentence notes
   (real SciFact sentences under ``--scifact``), indexed once (the embedding cache of the first run is reused by
   later ones, kept under ``.bench/noop-many``), then step 2's two rescans; aim <= 2 s each, 0 embeddings.
2c. **Embedding precision** (``benchmarks.embed_precision.run``; ``--skip-precision``): chunks/s of int8 (ONNX
   Runtime) and bf16 (where the CPU has it) against torch fp32 in the same run, and each one's SciFact test
   nDCG@10 over the whole corpus (``--precision-docs N``: the first N abstracts only, a quicker run whose nDCG@10
   is then not SciFact's and is marked so); aim >= 2x and a loss <= 0.005.
3. **Save-to-searchable** (``qmd-indexer run`` as a subprocess on a free port, its own fresh state, so it does a
   full first index too): 20 edits, each appending a line with a unique token to a note; the time from the write
   to the first ``POST /search`` (keyword mode, polled every 20 ms) that returns that note. Includes the settle
   time (a file closed after writing settles at once: ``indexer.state.watcher.settle_for``).
4. **Search latency through the API**: 100 distinct queries (the vault's headings), hybrid mode, k=6.
5. **MCP stdio start to first answer**: ``qmd-indexer mcp`` spawned by the MCP SDK's stdio client against the
   daemon of step 3, timed from the spawn to the first answered ``memory_search`` (handshake included), 5 times;
   baseline in the same run: ``qmd-indexer search QUERY --json`` from spawn to exit (the lightest client process).
   Both run as ``python -m indexer.cli`` from this checkout.
6. **Peak RSS** of the daemon (``VmHWM`` from ``/proc/<pid>/status``; psutil's RSS sampled as a fallback).
7. **Hybrid search at 100,000 chunks** through the API (see ``build_big``: real SciFact sentences for text and BM25,
   dense vectors made from the real embeddings of step 1 with small perturbations). On Edge: first by exact scan
   (a daemon with ``edge_hnsw_min_points = 0``), then on a daemon with the default, which builds the HNSW index in a
   child process on a copy of the shard and swaps it in (``EdgeStore.build_index``): latency while it builds, the
   build's seconds, and latency after the swap. Each with the in-process split of a query's time (query embedding,
   each prefetch, fusion, the payloads of the k kept hits, snippets).

Backends (``--backend``, default ``both``): steps 1, 2 and 7 run on Qdrant Edge and on a real single-node Qdrant
server (the pinned binary of ``tests/qdrant/install.sh``, ``make qdrant``; started by ``tests/qdrant/nodes.py`` on free
loopback ports with its storage under ``.bench/qdrant-node``; the daemon talks to it over REST, the default). On the
server, step 7 waits until the server's own optimizer has built its HNSW index (the time is reported) and measures
then. Steps 3-6 run on Edge only. The table ends with the server's figures next to Edge's and their ratios.

Results are printed as a table and written to ``.bench/results-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
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
BIG_ANCHORS = 0  # 0: step 7's dense vectors from step 1's vault embeddings; k: from k real SciFact embeddings
BIG_HNSW_WAIT_S = 1800.0  # how long step 7 waits for the Edge daemon's HNSW build
NOOP_FILES = 10_000  # notes of step 2b (issue 14: no-op rescan <= 2 s for 10,000 files)
NOOP_FILES_TARGET_S = 2.0
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


def settings_for(workspace: Path, state_dir: Path, agent: str = "bench", qdrant_url: str = "") -> Any:
    """Settings of one workspace; ``qdrant_url`` empty: Qdrant Edge under ``state_dir``, else that server."""
    from indexer.config import Settings, Workspace

    return Settings(state_dir=state_dir, workspace=(Workspace(agent=agent, path=workspace),), log_level="warning",
                    qdrant_url=qdrant_url)


def server_env(url: str) -> dict[str, str]:
    """The environment that points a daemon subprocess at the server ``url`` (empty for Edge)."""
    return {"QMD_INDEXER_QDRANT_URL": url} if url else {}


# -- 1 + 2: first index and no-op rescans, in process --------------------------------------------------------------
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
    from indexer.workspace import walk

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


# -- 2b: no-op rescan of 10,000 files ------------------------------------------------------------------------------
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

    def __init__(self, workspace: Path, state_dir: Path, agent: str, log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        import psutil

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # ``python -m indexer`` from the checkout, so the code measured is this tree's (an installed
        # ``qmd-indexer`` script imports whatever checkout the virtualenv was installed from)
        cmd = [sys.executable, "-m", "indexer", "run", "--workspace", str(workspace), "--agent", agent,
               "--state-dir", str(state_dir), "--port", str(self.port)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "QMD_INDEXER_LOG_FORMAT": "json", **(env or {})}
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

    def search_until_ready(self, queries: Sequence[str], timeout_s: float = 1800) -> list[float]:
        """Seconds per hybrid search (k 6, through ``indexer.client.Client`` as ``search_latency``) answered while
        the daemon is up but not ready (its first index running), one query after another, until ``/health`` says
        ready."""
        from indexer.client import Client, ClientError

        out: list[float] = []
        deadline, n = time.perf_counter() + timeout_s, 0
        with Client(port=self.port, timeout_s=30) as client:
            while time.perf_counter() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"daemon exited with {self.proc.returncode}; see {self.log_file.name}")
                try:
                    if client.health().get("ready"):
                        return out
                    started = time.perf_counter()
                    client.search(queries[n % len(queries)], k=6, mode="hybrid")
                    out.append(time.perf_counter() - started)
                    n += 1
                except ClientError:  # not listening yet, or an error answer while it starts
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

    def rss_parts(self) -> dict[str, int]:
        """The resident set now, MiB: ``RssAnon`` (heap: the process's own memory) and ``RssFile`` (pages of
        memory-mapped files, e.g. Qdrant's on-disk vectors, that the kernel may drop) from ``/proc/<pid>/status``."""
        parts: dict[str, int] = {}
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                key = line.split(":")[0]
                if key in ("RssAnon", "RssFile", "VmRSS", "VmHWM"):
                    parts[key] = int(line.split()[1]) // 1024
        except OSError:
            pass
        return parts

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


def search_latency(port: int, queries: Sequence[str], mode: str = "hybrid", k: int = 6,
                   warm_up: list[float] | None = None) -> list[float]:
    """Seconds per search through the product's Python client (``indexer.client.Client``, one keep-alive
    connection to the daemon on ``port``), one per query, after 3 warm-up queries (their seconds appended to
    ``warm_up`` when given: the first searches of a daemon)."""
    from indexer.client import Client

    with Client(port=port, timeout_s=60) as client:
        for q in queries[:3]:
            started = time.perf_counter()
            client.search(q + " warm", k=k, mode=mode)
            if warm_up is not None:
                warm_up.append(time.perf_counter() - started)
        out = []
        for q in queries:
            started = time.perf_counter()
            client.search(q, k=k, mode=mode)
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
        during = daemon.search_until_ready(headings(workspace, QUERIES))
        ready_s = daemon.wait_ready(client)
        status = client.get(f"{daemon.url}/status").json()
        log(f"   ready after {ready_s:.1f} s (model load + first index of {status['chunks_embedded']} chunks); "
            f"API search meanwhile p50 {1000 * pct(during, 50):.1f} ms, p95 {1000 * pct(during, 95):.1f} ms "
            f"({len(during)} searches)")
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
        lat = search_latency(daemon.port, queries)
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
            "search_during_first_index_ms": {"p50": round(1000 * pct(during, 50), 1) if during else None,
                                             "p95": round(1000 * pct(during, 95), 1) if during else None,
                                             "n": len(during)},
            "mcp": mcp,
            "peak_rss_mib": round(rss / 2**20, 1), "peak_rss_sampled_mib": round(daemon.sampled_peak / 2**20, 1)}


# -- 7: 100,000 chunks ---------------------------------------------------------------------------------------------
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
    from indexer.pipeline import index_hash
    from indexer.points import Payload, Point, ancestor_dirs, point_id
    from indexer.store import open_store

    shutil.rmtree(workspace, ignore_errors=True)
    shutil.rmtree(state_dir, ignore_errors=True)
    (workspace / "memory").mkdir(parents=True)
    passages = scifact_passages(scifact, BIG_POINTS)
    embedder = registry.embedders["text"]
    anchored = None
    if BIG_ANCHORS:
        started = time.perf_counter()
        model = re.sub(r"[^A-Za-z0-9.-]+", "_", embedder.model_id)
        cache = workspace.parent / f"anchors-{model}-{BIG_POINTS}-{BIG_ANCHORS}.npz"
        anchored = anchored_vectors(passages, BIG_ANCHORS, embedder, cache)
        first = next(anchored)  # embeds the anchors (or reads them from the cache)
        log(f"   {BIG_ANCHORS} anchor passages embedded (or cached) in {time.perf_counter() - started:.1f} s")
    elif vectors is None:
        raise ValueError("build_big needs the vault's vectors when BIG_ANCHORS is 0")
    settings = settings_for(workspace, state_dir, agent="big", qdrant_url=qdrant_url)
    from indexer.store import ServerOptions
    from indexer.workspace import plan_collections

    collection = next(c for c in plan_collections(settings.workspace) if c.role == "dir")
    store = open_store(state_dir, qdrant_url, options=ServerOptions.from_settings(settings))
    store.drop(collection.name)  # a server keeps collections between runs
    store.ensure_collection(collection.name, {"text": int(embedder.dim)})
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
        # the hash the pipeline gives this content (chunking version included), so the daemon finds it current
        file_hash = index_hash(hashlib.sha256(content.encode("utf-8")).hexdigest())
        rel = f"memory/{path.name}"
        for i, text in enumerate(lines):
            n = f * BIG_CHUNKS_PER_FILE + i
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
            if (f + 1) * BIG_CHUNKS_PER_FILE % 100_000 == 0:
                log(f"   {(f + 1) * BIG_CHUNKS_PER_FILE} chunks stored ({time.perf_counter() - started:.0f} s)")
    if batch:
        store.upsert(collection.name, batch)
    count = store.count(collection.name)
    store.close()
    text = ("distinct windows of 2-6 consecutive SciFact abstract sentences" if BIG_POINTS <= 150_000 else
            "distinct windows of 2-6 consecutive SciFact abstract sentences, then of 24-128 consecutive words at "
            "every 4th word")
    dense = (f"{BIG_ANCHORS} real embeddings of anchor passages spread evenly, each other passage's vector the "
             f"mix of the anchors before and after it by position + N(0, 0.02) noise, L2-normalised"
             if BIG_ANCHORS else f"the {len(vectors) if vectors is not None else 0} real embeddings of this run's "
             f"vault chunks, cycled, + N(0, 0.02) noise per dimension, L2-normalised")
    return {"points": count, "build_s": round(time.perf_counter() - started, 1), "collection": collection.name,
            "store": {"on_disk_vectors": settings.qdrant_on_disk_vectors, "quantization": settings.qdrant_quantization},
            "how": f"{count} chunks in {count // BIG_CHUNKS_PER_FILE} notes; text = {text}, BM25 by the product's "
                   f"Bm25; dense = {dense}"}


def release_state_lock(state_dir: Path) -> None:
    """Let a daemon subprocess open ``state_dir`` after this process did: ``Indexer.open`` locks a state dir for
    the life of the process (``indexer.rebuild._STATE_LOCKS``); a benchmark that hands it on releases it here."""
    from indexer import rebuild

    fd = rebuild._STATE_LOCKS.pop(state_dir.resolve(), None)
    if fd is not None:
        os.close(fd)


def inprocess_split(state_dir: Path, workspace: Path, registry: Any, queries: Sequence[str],
                    qdrant_url: str = "") -> dict[str, Any]:
    """Per query, medians in ms in this process: embedding the query, each prefetch by ids and scores (as the
    searcher runs them) and with every candidate's payload (as the first version did), fusion, the payload read of
    the k kept hits, snippets, and the whole ``retrieve`` (query embedding cached)."""
    from indexer.daemon import Indexer
    from indexer.points import Filter, Hit, Query
    from indexer.search import SearchParams, fuse_scores, to_hit

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
    log(f"7. [{backend}] building {BIG_POINTS} chunks ...")
    built = build_big(workspace, state_dir, vectors, scifact, registry, qdrant_url)
    log(f"   {built['how']} ({built['build_s']} s)")
    result: dict[str, Any] = {"collection": built}

    def through_api(label: str, env: dict[str, str], hnsw: bool = False) -> dict[str, Any]:
        """API search latency on a fresh daemon; with ``hnsw`` (Edge), once while the daemon builds its HNSW index
        (``<label>_during_build``) and once after it swapped it in, with the build's figures."""
        daemon = Daemon(workspace, state_dir, "big", out / f"daemon-big-{backend}-{label}.log",
                        {**server_env(qdrant_url), **env})
        client = httpx.Client(timeout=60)
        extra: dict[str, Any] = {}
        try:
            ready_s = daemon.wait_ready(client)
            status = client.get(f"{daemon.url}/status").json()
            if hnsw:
                during = search_latency(daemon.port, other_queries or [f"{q} now" for q in queries])
                extra["during_build"] = {"p50_ms": round(1000 * pct(during, 50), 1),
                                         "p95_ms": round(1000 * pct(during, 95), 1),
                                         "state_after": dict(client.get(f"{daemon.url}/status").json()["hnsw"])}
                log(f"   {backend} while the daemon builds HNSW: API hybrid p50 {extra['during_build']['p50_ms']} ms, "
                    f"p95 {extra['during_build']['p95_ms']} ms; {extra['during_build']['state_after']}")
                waited, build = time.perf_counter(), {}
                while time.perf_counter() - waited < BIG_HNSW_WAIT_S:
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
            cpu, first = daemon.ps.cpu_times(), list[float]()
            lat = search_latency(daemon.port, queries, warm_up=first)
            cpu_after = daemon.ps.cpu_times()
            # the same queries again: their embeddings are cached now, so this is the search without the model
            # (less sensitive to other load on the machine, and what an index changes)
            cached = search_latency(daemon.port, queries)
            rss = daemon.rss_peak()
            rss_now = daemon.rss_parts()
        finally:
            client.close()
            daemon.stop()
        cpu_ms = 1000 * (cpu_after.user + cpu_after.system - cpu.user - cpu.system) / (len(queries) + 3)
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


# -- command line --------------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--vault", type=Path, default=DEFAULT_VAULT, help="markdown vault to index [%(default)s]")
    parser.add_argument("--scifact", type=Path, default=DEFAULT_SCIFACT, help="SciFact, for step 7 [%(default)s]")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="work folder and results [%(default)s]")
    parser.add_argument("--backend", choices=("both", "edge", "server"), default="both",
                        help="Qdrant Edge, a real Qdrant server (`make qdrant` installs it), or both [%(default)s]")
    parser.add_argument("--skip-big", action="store_true", help="skip step 7 (100,000 chunks)")
    parser.add_argument("--big-points", type=int, default=BIG_POINTS, help="chunks of step 7 [%(default)s]")
    parser.add_argument("--skip-daemon", action="store_true", help="skip steps 3-6 (edits, vault search, MCP, RSS)")
    parser.add_argument("--skip-noop-many", action="store_true", help="skip step 2b (no-op rescan of 10,000 files)")
    parser.add_argument("--skip-precision", action="store_true", help="skip step 2c (int8/bf16 vs fp32 embedding)")
    parser.add_argument("--precision-docs", type=int, default=None,
                        help="step 2c on the first N SciFact abstracts only (its nDCG@10 then not SciFact's) [all]")
    parser.add_argument("--only-big", action="store_true",
                        help="step 7 alone, its dense vectors from the embedding cache an earlier run left in --out "
                             "(none needed with --big-anchors)")
    parser.add_argument("--big-anchors", type=int, default=BIG_ANCHORS,
                        help="step 7's dense vectors from this many real embeddings of its own passages, the others "
                             "mixed from them (see benchmarks/bigset.py); 0: from step 1's vault embeddings "
                             "[%(default)s]")
    parser.add_argument("--big-chunks-per-file", type=int, default=BIG_CHUNKS_PER_FILE,
                        help="chunks (lines) per note of step 7 [%(default)s]")
    parser.add_argument("--big-hnsw-wait", type=float, default=BIG_HNSW_WAIT_S,
                        help="seconds step 7 waits for the Edge daemon's HNSW build [%(default)s]")
    parser.add_argument("--on-disk-vectors", action="store_true",
                        help="create every collection of the run with its dense vectors on disk "
                             "(qdrant_on_disk_vectors)")
    parser.add_argument("--quantization", choices=("none", "int8"), default="none",
                        help="scalar quantization of the dense vectors of every collection of the run "
                             "(qdrant_quantization) [%(default)s]")
    args = parser.parse_args(argv)
    if args.on_disk_vectors:  # read by every Settings of this process and by the daemons it starts
        os.environ["QMD_INDEXER_QDRANT_ON_DISK_VECTORS"] = "true"
    if args.quantization != "none":
        os.environ["QMD_INDEXER_QDRANT_QUANTIZATION"] = args.quantization
    globals().update(BIG_ANCHORS=args.big_anchors, BIG_CHUNKS_PER_FILE=args.big_chunks_per_file,
                     BIG_HNSW_WAIT_S=args.big_hnsw_wait)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not args.vault.is_dir() or not any(args.vault.rglob("*.md")):
        print(f"bench: vault not found (or holds no markdown): {args.vault}\nThe benchmark indexes a copy of "
              f"../shared/data/vault (the project's shared data, beside the repository; or --vault DIR). "
              f"Nothing was measured.", file=sys.stderr)
        return 2
    big = not args.skip_big
    globals()["BIG_POINTS"] = args.big_points
    noop_many = not args.skip_noop_many and not args.only_big and args.backend != "server"
    precision = not args.skip_precision and not args.only_big
    needs = [step for step, on in (("step 2b (10,000 notes)", noop_many), ("step 2c (embedding precision)",
                                   precision), ("step 7 (100,000 chunks)", big)) if on]
    if needs and not args.scifact.is_dir():
        print(f"bench: SciFact not found at {args.scifact}: {', '.join(needs)} read ../shared/data/scifact; pass "
              f"--scifact DIR, or skip them (--skip-noop-many, --skip-precision, --skip-big). Nothing was measured.",
              file=sys.stderr)
        return 2
    backends = ("edge", "server") if args.backend == "both" else (args.backend,)
    sys.path.insert(0, str(REPO / "tests"))  # the Qdrant node starter the tests use (no pytest in it)
    from qdrant import nodes

    if "server" in backends and nodes.missing():
        print(f"bench: {nodes.missing()}; or run with --backend edge. Nothing was measured.", file=sys.stderr)
        return 2
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    workspace = out / "vault" / "workspace"
    notes = copy_vault(args.vault.resolve(), workspace)
    log(f"vault {args.vault} copied to {workspace / 'memory'} ({notes} notes); backends: {', '.join(backends)}")
    results: dict[str, Any] = {"vault": str(args.vault), "notes": notes, "cpus": os.cpu_count(),
                               "cpu": cpu_model(), "backends": list(backends),
                               "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with contextlib.ExitStack() as stack:
        url = ""
        if "server" in backends:
            shutil.rmtree(out / "qdrant-node", ignore_errors=True)
            node = stack.enter_context(nodes.running(nodes.make_node(out / "qdrant-node")))
            url = node.url
            log(f"Qdrant server {nodes.BINARY} on {url} (storage {out / 'qdrant-node'})")
        registry, vectors = None, None
        cached = out / "vault" / "state-inprocess-edge" / "embeddings.sqlite3"
        if args.only_big:
            if not cached.exists() and not args.big_anchors:
                print(f"bench: --only-big needs {cached} from an earlier run", file=sys.stderr)
                return 2
            from indexer.plugins import load_registry, plugin_configs

            settings = settings_for(workspace, out / "vault" / "unused")
            registry = load_registry(settings.plugins, plugin_configs(settings), settings.prefer)
            vectors = real_vectors(cached) if cached.exists() else None
            backends_first: tuple[str, ...] = ()
        else:
            backends_first = backends
        for backend in backends_first:
            on = url if backend == "server" else ""
            log(f"1-2. [{backend}] first index and no-op rescans")
            part, registry, vectors = bench_index(workspace, out / "vault" / f"state-inprocess-{backend}", on,
                                                  registry)
            (results if backend == "edge" else results.setdefault("server", {})).update(part)
        if noop_many:
            log(f"2b. [edge] no-op rescan of {NOOP_FILES} files")
            results["noop_many"] = bench_noop_many(out, args.scifact.resolve(), registry)
            log(f"   step 2b took {results['noop_many']['step_s']} s")
        if precision:
            from benchmarks import embed_precision

            log("2c. embedding precision: rate against torch fp32, SciFact nDCG@10")
            started = time.perf_counter()
            results["precision"] = embed_precision.run(args.scifact.resolve(), docs=args.precision_docs)
            results["precision"]["step_s"] = round(time.perf_counter() - started, 1)
            log(f"   step 2c took {results['precision']['step_s']} s")
        if "edge" in backends and not args.skip_daemon and not args.only_big:
            copy_vault(args.vault.resolve(), workspace)  # the daemon indexes the pristine copy
            results["daemon"] = bench_daemon(workspace, out / "vault" / "state-daemon", out)
        if big:
            queries = headings(workspace, 2 * QUERIES)
            for backend in backends:
                on = url if backend == "server" else ""
                part = bench_big(out, vectors, args.scifact.resolve(), registry, queries[:QUERIES], on,
                                 queries[QUERIES:])
                (results if backend == "edge" else results.setdefault("server", {}))["big"] = part
    results["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    path = out / f"results-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=2))
    print_table(results)
    print(f"\nresults: {path}")
    return 0


def cpu_model() -> str:
    """The CPU's model name and whether it has AVX2 / AVX-512 / bf16 (from ``/proc/cpuinfo``)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = set((re.search(r"^flags\s*:\s*(.+)$", info, re.M) or re.match("(.*)", "")).group(1).split())
    has = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{model.group(1).strip() if model else 'unknown'} ({' '.join(has) or 'no avx2'})"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def print_table(r: dict[str, Any]) -> None:
    rows: list[tuple[str, str, str, str]] = []
    f, n, d = r.get("first_index"), r.get("noop_rescan"), r.get("daemon")
    b = r.get("big")
    points = ((b or r.get("server", {}).get("big") or {}).get("collection") or {}).get("points", BIG_POINTS)
    big = f"{points / 1e6:g}M" if points >= 1_000_000 else f"{points // 1000}k"
    if f and n:
        rows += [
            ("first index, chunks/s", f"{f['chunks_per_s']:.1f}", f"raw encode {f['raw_encode_chunks_per_s']:.1f}/s",
             f"wall ratio {f['ratio_to_raw']:.3f} (aim >= 0.95)"),
            ("  per CPU second", f"ratio {f['ratio_to_raw_cpu']:.3f}",
             f"CPU s: index {f['cpu_s']}, raw {f['raw_encode_cpu_s']}", f"load avg {f['load_average'][0]}"),
            ("  chunks / seconds", f"{f['chunks_embedded']} / {f['seconds']:.1f} s", f["model_id"],
             f"batch {f['batch_size']}"),
            ("no-op rescan (same process)", f"{n['same_process_s']:.3f} s", f"{n['same_process_embedded']} embedded",
             "aim 0, < 1 s"),
            ("no-op after restart", f"{n['restart_open_and_scan_s']:.3f} s", f"{n['restart_embedded']} embedded",
             "open + scan"),
        ]
    m = r.get("noop_many")
    if m:
        rows += [
            (f"no-op rescan, {m['files']} files", f"{m['same_process_s']:.3f} s", f"{m['same_process_embedded']} "
             f"embedded", f"aim <= {NOOP_FILES_TARGET_S:g} s, 0 embedded; same process"),
            ("  after restart", f"{m['restart_open_and_scan_s']:.3f} s", f"{m['restart_embedded']} embedded",
             f"open {m['restart_open_s']:.3f} s + scan {m['restart_scan_s']:.3f} s"),
            ("  first index (not the aim)", f"{m['first_index_s']} s", f"{m['first_index_embedded']} embedded",
             f"cache {'reused' if m['embedding_cache_reused'] else 'new'}; step {m['step_s']} s"),
        ]
    p = r.get("precision")
    if p:
        fp32 = p["precisions"]["fp32"]
        where = (f"first {p['docs']} abstracts: NOT SciFact's nDCG@10" if p["subset"] else
                 f"SciFact test, {p['queries']} queries, {p['docs']} abstracts")
        for name, x in p["precisions"].items():
            if name == "fp32":
                continue
            rows += [
                (f"embedding {name} vs torch fp32", f"x{x['x_fp32']:.2f}",
                 f"{x['best_per_s']:.1f} vs {fp32['best_per_s']:.1f} chunks/s",
                 f"aim >= 2x; best of {p['rounds']} rounds of {p['sample']} abstracts"),
                (f"  nDCG@10 {name} - fp32", f"{x['ndcg_vs_fp32']:+.4f}",
                 f"{x['ndcg_at_10']:.4f} vs {fp32['ndcg_at_10']:.4f}", f"aim loss <= 0.005; {where}"),
            ]
        rows.append(("  step 2c took", f"{p.get('step_s', '-')} s", "", "--precision-docs N: quicker, not SciFact's"))
        if len(p["precisions"]) == 1:
            rows.append(("embedding precision", "fp32 only", "int8 unavailable", "see the step's output"))
    if d:
        rows += [
            ("save-to-searchable", f"p50 {d['save_to_searchable_s']['p50']:.2f} s",
             f"p95 {d['save_to_searchable_s']['p95']:.2f} s", f"{d['save_to_searchable_s']['n']} edits; p95 aim 0.5 s"),
            ("API search (hybrid, k=6)", f"p50 {d['search_ms']['p50']:.1f} ms", f"p95 {d['search_ms']['p95']:.1f} ms",
             f"{d['search_ms']['chunks']} chunks; aim p50 < 30 ms"),
            ("  while the first index runs", f"p50 {(d.get('search_during_first_index_ms') or {}).get('p50')} ms",
             f"p95 {(d.get('search_during_first_index_ms') or {}).get('p95')} ms",
             f"{(d.get('search_during_first_index_ms') or {}).get('n')} searches before ready"),
            ("MCP stdio start to 1st search", f"{d['mcp']['mcp_first_answer_s']:.2f} s",
             f"CLI search {d['mcp']['cli_search_s']:.2f} s", f"ratio {d['mcp']['ratio_to_cli']:.2f} (median of "
             f"{d['mcp']['n']})"),
            ("daemon peak RSS", f"{d['peak_rss_mib']:.0f} MiB", f"sampled {d['peak_rss_sampled_mib']:.0f} MiB",
             "VmHWM, incl. first index"),
        ]
    if b:
        rows += [
            (f"{big} API hybrid, exact scan", f"p50 {b['exact']['p50_ms']:.1f} ms",
             f"p95 {b['exact']['p95_ms']:.1f} ms",
             f"{b['exact']['chunks']} chunks; aim p50 < 15 ms"),
            (f"{big} API hybrid, HNSW building", f"p50 {b['hnsw'].get('during_build', {}).get('p50_ms', '-')} ms",
             f"p95 {b['hnsw'].get('during_build', {}).get('p95_ms', '-')} ms", "child process builds, daemon serves"),
            (f"{big} HNSW build (child, swap)", f"{b['optimize_s'] or '-'} s",
             f"state {b['hnsw'].get('build', {}).get('state')}",
             f"indexed {b['hnsw'].get('build', {}).get('indexed')} of {b['hnsw'].get('build', {}).get('points')}"),
            (f"{big} API hybrid, HNSW", f"p50 {b['hnsw']['p50_ms']:.1f} ms", f"p95 {b['hnsw']['p95_ms']:.1f} ms",
             f"ratio to exact p50 {_ratio(b['hnsw']['p50_ms'], b['exact']['p50_ms'])}, p95 "
             f"{_ratio(b['hnsw']['p95_ms'], b['exact']['p95_ms'])}"),
        ]
        if "restarted" in b:
            x = b["restarted"]
            rows.append((f"{big} API hybrid, after a restart", f"p50 {x['p50_ms']:.1f} ms", f"p95 {x['p95_ms']:.1f} ms",
                         f"first 3 searches {x['first_searches_ms']} ms; ready incl. model {x['ready_s']} s; peak "
                         f"RSS {x['peak_rss_mib']} MiB"))
        for kind in ("exact", "hnsw"):
            x, restart = b[kind], b.get(f"{kind}_restart")
            rows.append((f"{big} {kind}: daemon peak RSS", f"{x['peak_rss_mib']} MiB",
                         f"at the end {x.get('rss_end_mib', {})}", f"store {b['collection'].get('store', {})}"))
            if restart:
                rows.append((f"{big} {kind}: restart to ready", f"{restart['ready_s']} s",
                             f"open+connect {restart['open_connect_s']} s, scan {restart['scan_s']} s",
                             f"model load excluded; API ready incl. model {x['ready_s']} s"))
            if "cached_embedding_p50_ms" in x:
                rows.append((f"  {kind}: query embedding cached", f"p50 {x['cached_embedding_p50_ms']:.1f} ms",
                             f"p95 {x['cached_embedding_p95_ms']:.1f} ms",
                             f"daemon CPU {x['daemon_cpu_ms_per_search']} ms a search (embedding included)"))
    for label, part in (("edge", b), ("server", r.get("server", {}).get("big"))):
        for kind in ("exact", "hnsw"):
            sp = (part or {}).get(f"{kind}_split")
            if sp:
                rows.append((f"{big} split {label} {kind} (ms)", f"embed {sp['embed_query_ms']}",
                             f"dense {sp['dense_search_ms']} bm25 {sp['bm25_search_ms']} fuse {sp['fuse_ms']}",
                             f"payloads(k) {sp['payloads_k_ms']} snippets {sp['snippets_ms']} retrieve "
                             f"{sp['retrieve_ms']}"))
    sv = r.get("server")
    if sv:
        sf, sb = sv.get("first_index"), sv.get("big")
        rows += [("", "", "", ""), ("SERVER vs EDGE (same run)", "server", "edge", "ratio server/edge")]
        if sf:
            rows.append(("first index, chunks/s", f"{sf['chunks_per_s']:.1f}",
                         f"{f['chunks_per_s']:.1f}" if f else "-",
                         _ratio(sf["chunks_per_s"], f["chunks_per_s"] if f else None)))
            rows.append(("  ratio to raw encode (wall)", f"{sf['ratio_to_raw']:.3f}",
                         f"{f['ratio_to_raw']:.3f}" if f else "-", ""))
            rows.append(("no-op rescan (same process)", f"{sv['noop_rescan']['same_process_s']:.3f} s",
                         f"{n['same_process_s']:.3f} s" if n else "-",
                         _ratio(sv["noop_rescan"]["same_process_s"], n["same_process_s"] if n else None)))
        if sb:
            sh = sb["hnsw"]
            for stat in ("p50_ms", "p95_ms"):
                for kind in ("exact", "hnsw"):
                    e = (b or {}).get(kind, {}).get(stat)
                    rows.append((f"{big} API hybrid {stat[:3]} vs edge {kind}", f"{sh[stat]:.1f} ms",
                                 f"{e:.1f} ms" if e else "-", _ratio(sh[stat], e)))
            for kind in ("exact", "hnsw"):
                e = (b or {}).get(kind, {})
                if "daemon_cpu_ms_per_search" in sh and "daemon_cpu_ms_per_search" in e:
                    rows.append((f"  embedding cached p50 vs edge {kind}", f"{sh['cached_embedding_p50_ms']:.1f} ms",
                                 f"{e['cached_embedding_p50_ms']:.1f} ms",
                                 _ratio(sh["cached_embedding_p50_ms"], e["cached_embedding_p50_ms"])))
                    rows.append((f"  daemon CPU a search vs edge {kind}", f"{sh['daemon_cpu_ms_per_search']:.1f} ms",
                                 f"{e['daemon_cpu_ms_per_search']:.1f} ms",
                                 _ratio(sh["daemon_cpu_ms_per_search"], e["daemon_cpu_ms_per_search"])))
            rows.append((f"{big} HNSW build", f"{sb['optimize_s']:.1f} s", f"{b['optimize_s'] or '-'} s" if b else "-",
                         "server: first upsert to green; edge: child process + swap"))
            rows.append((f"{big} daemon ready / peak RSS", f"{sh['ready_s']} s / {sh['peak_rss_mib']} MiB",
                         f"{b['hnsw']['ready_s']} s / {b['hnsw']['peak_rss_mib']} MiB" if b else "-",
                         "daemon only (server process not counted)"))
    print(f"\nCPU: {r.get('cpu')}; {r.get('cpus')} CPUs; load average at the end {r.get('load_average_end')}")
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


if __name__ == "__main__":
    sys.exit(main())
