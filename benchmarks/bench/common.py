"""What every step of ``python -m benchmarks.bench`` shares: paths, the run's sizes (set from the command line by
``__main__``; steps read them as ``common.NAME`` when they run), and small helpers."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent.parent
DEFAULT_VAULT = REPO.parent / "shared" / "data" / "vault"
DEFAULT_SCIFACT = REPO.parent / "shared" / "data" / "scifact"
DEFAULT_OUT = REPO / ".bench"
BIG_POINTS = 100_000
BIG_CHUNKS_PER_FILE = 20
BIG_ANCHORS = 0  # 0: step 7's dense vectors from step 1's vault embeddings; k: from k real SciFact embeddings
BIG_HNSW_WAIT_S = 1800.0  # how long step 7 waits for the Edge daemon's HNSW build
NOOP_FILES = 10_000  # notes of step 2b (aim: a no-op rescan <= 2 s for 10,000 files)
NOOP_FILES_TARGET_S = 2.0
EDITS = 20
QUERIES = 100


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, linear interpolation (numpy's default)."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else float("nan")


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


def real_vectors(cache_path: Path) -> np.ndarray:
    """``(n, dim)`` float32: every vector in the embedding cache (the real embeddings of this run's chunks)."""
    import sqlite3

    db = sqlite3.connect(f"file:{cache_path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT vector FROM embedding")
        return np.stack([np.frombuffer(blob, dtype=np.float32) for (blob,) in rows])
    finally:
        db.close()


def release_state_lock(state_dir: Path) -> None:
    """Let a daemon subprocess open ``state_dir`` after this process did: ``Indexer.open`` locks a state dir for
    the life of the process (``indexer.rebuild._STATE_LOCKS``); a benchmark that hands it on releases it here."""
    from indexer import rebuild

    fd = rebuild._STATE_LOCKS.pop(state_dir.resolve(), None)
    if fd is not None:
        os.close(fd)


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


def headings(workspace: Path, limit: int) -> list[str]:
    """Distinct markdown heading texts of the workspace's notes, in path order: realistic short queries."""
    seen: dict[str, None] = {}
    for path in sorted(workspace.rglob("*.md")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            m = re.match(r"#{1,6}\s+(.{6,80})$", line.strip())
            if m:
                seen.setdefault(m.group(1).strip(), None)
    return list(seen)[:limit]


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
