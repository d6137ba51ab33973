"""Steps 3-6 of ``python -m benchmarks.bench``: the daemon as a subprocess (``benchmarks.harness.Daemon``) on a
fresh state: API searches while its first index runs, save-to-searchable, search latency through the API, MCP stdio
start to first answer, peak RSS."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench.common import EDITS, QUERIES, REPO, headings, log, pct, search_latency
from benchmarks.harness import Daemon


def search_until_ready(daemon: Daemon, queries: Sequence[str], timeout_s: float = 1800) -> list[float]:
    """Seconds per hybrid search (k 6, through ``indexer.client.Client`` as ``search_latency``) answered while
    ``daemon`` is up but not ready (its first index running), one query after another, until ``/health`` says
    ready."""
    from indexer.client import Client, ClientError

    out: list[float] = []
    deadline, n = time.perf_counter() + timeout_s, 0
    with Client(port=daemon.port, timeout_s=30) as client:
        while time.perf_counter() < deadline:
            if not daemon.alive():
                raise RuntimeError(f"daemon exited with {daemon.proc.returncode}; see {daemon.log_path}")
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


def bench_daemon(workspace: Path, state_dir: Path, out: Path) -> dict[str, Any]:
    import httpx

    shutil.rmtree(state_dir, ignore_errors=True)
    log("3-5. daemon subprocess: first index, then edits and searches ...")
    daemon = Daemon(workspace, state_dir, out / "daemon.log", agent="bench", fp32=False, sample_rss=True)
    client = httpx.Client(timeout=30)
    try:
        during = search_until_ready(daemon, headings(workspace, QUERIES))
        ready_s = daemon.wait_ready(1800)
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
