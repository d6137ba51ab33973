"""Many agents on one Qdrant server: a collection per agent's collection (``tenancy = "collections"``) against
shared collections with a tenant key (``"shared"``), side by side.

Per layout and agent count, on a fresh single node (the pinned binary of ``tests/qdrant/install.sh``, started by
``tests/qdrant/nodes.py``, storage under ``--out``): create every agent's two collections (``memory-root-<agent>``,
``memory-dir-<agent>``) and write ``--notes`` notes per agent (one into root, the rest into dir, one chunk each)
through ``ServerStore.replace_file``, as the daemon's first index does, except agent 0, which has ``--big`` times as
many notes (an uneven tenant); then ``--queries`` hybrid searches (dense top 10 + BM25) of random other agents'
``memory-dir``, each timed, and as many of agent 0's: once right after the last write (``busy_``: the server's
optimizer still merging segments and building graphs), then again once every collection is ``green``
(``optimize_s`` after the last write). Reported: create + first-index seconds, the server's RSS
(``/proc/<pid>/status`` ``VmRSS``) and storage size after, search p50/p99 ms (``big_``: agent 0's), a daemon's start
with one agent (a fresh client checks its two collections and reads their files' states), and a check that a search of
one agent only returned its own points.

Vectors are random unit vectors of 384 dimensions (all-MiniLM-L6-v2's size) and BM25 terms random ids: this measures
the store, not the embedder (embedding 20,000 notes costs the same in both layouts).

``python -m benchmarks.tenancy [--agents 100 1000] [--notes 20] [--big 100] [--queries 200] [--out DIR]``; prints one
JSON line per run and a table at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DIM = 384


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (``VmRSS``), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def disk_bytes(root: Path) -> int:
    """Bytes the files under ``root`` take on disk (allocated blocks: Qdrant preallocates sparse files)."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def note_point(rng: np.random.Generator, agent: str, name: str, n: int) -> Any:
    """Note ``n`` of ``agent`` in collection ``name``: one chunk, a random unit vector and 8 random BM25 term ids."""
    from indexer.points import Payload, Point, point_id

    path = f"/w/{agent}/memory/note{n}.md"
    vector = rng.normal(size=DIM).astype(np.float32)
    payload = Payload(agent=agent, collection=name, abs_path=path, path=f"memory/note{n}.md", file_hash="h",
                      chunk_index=0, chunk_count=1, size_bytes=100, mtime_ns=1, text=f"note {n} of {agent}")
    terms = sorted({int(t) for t in rng.integers(0, 5000, 8)})
    return Point(point_id(name, path, 0), {"text": vector / np.linalg.norm(vector)},
                 {"bm25": (terms, [1.0] * len(terms))}, payload)


def agent_notes(rng: np.random.Generator, a: int, notes: int, big: int) -> list[tuple[str, Any]]:
    """Agent ``a``'s notes as ``(collection, point)``: one in its ``memory-root``, the rest in its ``memory-dir``
    (``notes`` in all, ``big`` times as many for agent 0)."""
    agent = f"agent{a}"
    return [(name, note_point(rng, agent, name, n))
            for role, count in (("root", 1), ("dir", notes * (big if a == 0 else 1) - 1))
            for name in [f"memory-{role}-{agent}"] for n in range(count)]


def random_query(rng: np.random.Generator) -> Any:
    """A hybrid top-10 query: a random unit vector and 4 random BM25 term ids."""
    from indexer.points import Query

    vector = rng.normal(size=DIM).astype(np.float32)
    terms = sorted({int(t) for t in rng.integers(0, 5000, 4)})
    return Query(limit=10, dense={"text": vector / np.linalg.norm(vector)}, sparse=(terms, [1.0] * len(terms)))


def search_figures(store: Any, rng: np.random.Generator, agents: int, queries: int) -> tuple[dict[str, float], int]:
    """``queries`` timed searches of random other agents' ``memory-dir`` and as many of agent 0's: p50/p99 ms of
    each (``big_``: agent 0's), and the number of hits whose point belongs to another collection."""
    latencies: dict[bool, list[float]] = {False: [], True: []}
    leaks = 0
    for q in range(2 * queries):
        name = f"memory-dir-agent{0 if q % 2 else 1 + int(rng.integers(agents - 1))}"
        query = random_query(rng)
        t = time.perf_counter()
        lists = store.search(name, query)
        latencies[bool(q % 2)].append((time.perf_counter() - t) * 1000)
        leaks += sum(h.payload.collection != name for hits in lists.values() for h in hits)
    return {f"{prefix}_{p}_ms": round(float(np.percentile(latencies[big], q)), 2)
            for prefix, big in (("search", False), ("big", True)) for p, q in (("p50", 50), ("p99", 99))}, leaks


def optimized_s(client: Any, timeout_s: float = 1800) -> float:
    """Seconds until every collection of ``client``'s server is ``green`` (its optimizer done with what the first
    index wrote: segments merged, per-tenant graphs built), polled every 0.5 s; ``timeout_s`` at most."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        names = [c.name for c in client.get_collections().collections]
        if all(str(client.get_collection(n).status).lower().endswith("green") for n in names):
            break
        time.sleep(0.5)
    return round(time.monotonic() - started, 1)


def daemon_start_ms(url: str, options: Any) -> float:
    """A daemon's start with one agent: a fresh client, its two collections checked and their files read (ms)."""
    from indexer.store import ServerStore

    t = time.perf_counter()
    daemon = ServerStore(url, options=options)
    for role in ("root", "dir"):
        daemon.ensure_collection(f"memory-{role}-agent1", {"text": DIM})
        daemon.file_states(f"memory-{role}-agent1")
    startup_ms = (time.perf_counter() - t) * 1000
    daemon.close()
    return round(startup_ms, 1)


def run(layout: str, agents: int, notes: int, queries: int, out: Path, big: int = 100,
        seed: int = 0) -> dict[str, Any]:
    """One layout at one agent count on a fresh node; the figures as a dict (see the module docstring)."""
    sys.path.insert(0, str(REPO / "tests"))  # the Qdrant node starter the tests use (no pytest in it)
    from qdrant import nodes

    from indexer.store import ServerOptions, ServerStore

    rng = np.random.default_rng(seed)
    root = out / f"{layout}-{agents}"
    shutil.rmtree(root, ignore_errors=True)
    with nodes.running(nodes.make_node(root)) as node:
        options = ServerOptions(tenancy=layout, space="bench-model#1", timeout_s=60)
        store = ServerStore(node.url, options=options)
        started = time.monotonic()
        for a in range(agents):
            for role in ("root", "dir"):
                store.ensure_collection(f"memory-{role}-agent{a}", {"text": DIM})
            for name, point in agent_notes(rng, a, notes, big):
                store.replace_file(name, point.payload.abs_path, "h", [point])
        index_s = time.monotonic() - started
        busy, leaks = search_figures(store, rng, agents, queries)  # while the optimizer works on what was written
        optimize_s = optimized_s(store.client)
        latencies, settled_leaks = search_figures(store, rng, agents, queries)
        leaks += settled_leaks
        assert node.pid is not None
        figures = {"layout": layout, "agents": agents, "notes": notes, "points": (agents - 1 + big) * notes,
                   "physical_collections": len(store.client.get_collections().collections),
                   "create_index_s": round(index_s, 1), "optimize_s": optimize_s,
                   "rss_mib": round(rss_bytes(node.pid) / 2**20),
                   "disk_mib": round(disk_bytes(root / "storage") / 2**20), **latencies,
                   "busy_p50_ms": busy["search_p50_ms"], "busy_p99_ms": busy["search_p99_ms"],
                   "daemon_start_ms": daemon_start_ms(node.url, options), "foreign_hits": leaks}
        store.close()
    shutil.rmtree(root, ignore_errors=True)
    return figures


def print_table(rows: list[dict[str, Any]]) -> None:
    """``rows`` as a markdown table, their keys (the first row's) as the header."""
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--notes", type=int, default=20)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--big", type=int, default=100, help="agent 0 has this many times --notes")
    parser.add_argument("--layouts", nargs="+", default=["collections", "shared"])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="qmd-tenancy-"))
    rows = []
    for agents in args.agents:
        for layout in args.layouts:
            rows.append(run(layout, agents, args.notes, args.queries, out, args.big))
            print(json.dumps(rows[-1]), flush=True)
    print_table(rows)
    return 0 if all(row["foreign_hits"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
