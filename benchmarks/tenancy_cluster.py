"""Many agents on a real 3-node Qdrant cluster, one node SIGKILLed during the first index, and nothing lost.

``benchmarks/tenancy.py``'s workload (``--agents`` agents of ``--notes`` one-chunk notes, agent 0 with ``--big`` times
as many; random 384-float unit vectors and random BM25 term ids: the store, not the embedder) on a fresh cluster of
three ``qdrant`` processes (``tests/qdrant/nodes.py``: the pinned binary, loopback ports, storage under ``--out``).
The client talks gRPC to node 0; the collections are created with ``shard_number=3, replication_factor=2,
write_consistency_factor=2``; the layout is ``shared`` unless ``--layouts`` says otherwise.

1. Every file is written through ``ServerStore.replace_file`` from a queue, as the daemon's first index writes it
   (each agent's collections ensured at its first file); a file whose write raises ``StoreUnavailable`` (or fails
   otherwise) goes to the back of the queue, ready again in ``sync.RETRY_AFTER_S`` seconds, as the daemon's worker
   queues a failed batch again.
2. When ``--kill-at`` of the agents are written, node 1 gets SIGKILL (node 0, the client's, and node 2 survive; every
   shard keeps one live replica); after ``--down-s`` seconds it is restarted on the same storage and ports.
3. Converged: the queue is empty and every replica of every shard is ``Active`` on every node (``Cluster.
   wait_replicas_active``, no shard transfer left). ``kill_to_converged_s`` is measured from the kill.
4. Checked: per logical collection (tenant), through the client, its points against the ones written (``lost``,
   ``extra``, ``stale``: a payload, dense or sparse vector that differs) and its exact count (``miscounted``); through
   each node's own REST API (which reads its local replicas first) the exact count of every tenant
   (``node_miscounted``, all nodes together); per shard, the point counts of its replicas on the nodes that hold
   them (``replicas_differ``: shards whose replicas disagree, plus collections whose shards do not add up to what
   was written); one untimed search of every tenant plus the timed ones of ``tenancy.search_figures``
   (``foreign_hits``: a hit that is not one of the tenant's own points).

Reported as well: create + first-index seconds (until the queue was empty, the outage included), each node's RSS
and their sum, the nodes' storage, search p50/p99 (a small agent, ``big_``: agent 0), a daemon's start (fresh client,
two collections ensured, their files' states read); of the outage, the files written while node 1 was down, when it
was back (restarted and ready, from the kill), the failed writes (queued again) and the slowest successful one (the
store's own retries ride out a short outage), and the ERROR lines in the nodes' logs. Exits 0 only when nothing was
lost, extra, stale, miscounted or leaked and every replica agrees.

``python -m benchmarks.tenancy_cluster [--agents 1000] [--layouts shared] [--notes 20] [--big 100] [--kill-at 0.3]
[--down-s 5] [--no-kill] [--queries 200] [--out DIR]``; prints one JSON line per run and a table at the end. The
``collections`` layout at 1,000 agents (2,000 collections of 3 shards x 2 replicas) does not fit a small machine.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench.common import log
from benchmarks.harness import wait_until
from benchmarks.tenancy import (
    DIM,
    REPO,
    agent_notes,
    daemon_start_ms,
    disk_bytes,
    print_table,
    random_query,
    rss_bytes,
    search_figures,
)

SPACE = "bench-model#1"
CHECKS = ("lost", "extra", "stale", "miscounted", "node_miscounted", "replicas_differ", "foreign_hits")


class Writer:
    """The daemon's first index at the store level: ``files`` (``(agent index, collection, point)``) written one by
    one through ``replace_file`` from a queue; a failed write goes to the back, ready again in
    ``sync.RETRY_AFTER_S`` seconds. ``run`` until the queue is empty (or ``stop``)."""

    def __init__(self, store: Any, files: list[tuple[int, str, Any]]) -> None:
        self.store = store
        self.queue = collections.deque((0.0, a, name, point) for a, name, point in files)
        self.left = collections.Counter(a for a, _, _ in files)  # files not yet written, per agent
        self.agents_written = 0
        self.files_written = 0
        self.slowest_s = 0.0  # the longest successful write of a file (ensure + replace_file, the store's retries in)
        self.failed = collections.Counter[str]()  # failed writes by error type
        self.ensured: set[str] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        from indexer.sync import RETRY_AFTER_S

        while self.queue and not self.stop.is_set():
            ready_at, a, name, point = self.queue.popleft()
            if self.stop.wait(max(0.0, ready_at - time.monotonic())):
                return
            t = time.monotonic()
            try:
                if name not in self.ensured:
                    self.store.ensure_collection(name, {"text": DIM})
                    self.ensured.add(name)
                self.store.replace_file(name, point.payload.abs_path, point.payload.file_hash, [point])
                self.slowest_s = max(self.slowest_s, time.monotonic() - t)
            except Exception as exc:  # StoreUnavailable, or anything else: the daemon retries either later
                if sum(self.failed.values()) < 5:
                    log(f"write of {point.payload.abs_path} failed, queued again: {str(exc)[:300]}")
                self.failed[type(exc).__name__] += 1
                self.queue.append((time.monotonic() + RETRY_AFTER_S, a, name, point))
                continue
            self.files_written += 1
            self.left[a] -= 1
            self.agents_written += not self.left[a]


def index_with_kill(cluster: Any, writer: Writer, physical: list[str], kill_after: int | None, down_s: float,
                    timeout_s: float) -> dict[str, Any]:
    """``writer`` run on a thread until its queue is empty; with ``kill_after``, node 1 SIGKILLed once that many
    agents are written and restarted ``down_s`` seconds later; then every replica of ``physical`` waited for until
    ``Active``. The timings and the kill's figures."""
    thread = threading.Thread(target=writer.run, name="writer", daemon=True)
    started = time.monotonic()
    figures: dict[str, Any] = {}
    thread.start()
    try:
        if kill_after is not None:
            wait_until(lambda: writer.agents_written >= kill_after or not thread.is_alive(), timeout_s,
                       what=f"{kill_after} agents written")
            victim = cluster.nodes[1]
            victim.kill()
            killed_at = time.monotonic()
            figures["agents_at_kill"], at_kill = writer.agents_written, writer.files_written
            log(f"SIGKILL node 1 after {writer.agents_written} agents ({at_kill} files), "
                f"{killed_at - started:.1f} s in")
            time.sleep(down_s)
            figures["files_written_while_down"] = writer.files_written - at_kill
            victim.start()
            figures["node_back_s"] = round(time.monotonic() - killed_at, 1)  # restarted and ready, from the kill
            log(f"node 1 restarted and ready {figures['node_back_s']} s after the kill, "
                f"{figures['files_written_while_down']} files written while it was down")
        wait_until(lambda: not thread.is_alive(), timeout_s - (time.monotonic() - started), interval_s=0.5,
                   what="the queue empty")
        figures["create_index_s"] = round(time.monotonic() - started, 1)
        log(f"queue empty {figures['create_index_s']} s in; failed writes: {dict(writer.failed)}")
        for name in physical:
            cluster.wait_replicas_active(name, timeout_s=max(60.0, timeout_s - (time.monotonic() - started)))
        if kill_after is not None:
            figures["kill_to_converged_s"] = round(time.monotonic() - killed_at, 1)
    finally:
        writer.stop.set()
        thread.join(60)
    figures |= {"failed_writes": sum(writer.failed.values()), "slowest_write_s": round(writer.slowest_s, 1)}
    return figures


def same(found: Any, written: Any) -> bool:
    """Whether a point read back equals the one written: payload, sparse vector, dense vector (cosine > 0.9999)."""
    if found.payload.to_payload() != written.payload.to_payload() or found.sparse != written.sparse:
        return False
    v, w = found.dense.get("text"), written.dense["text"]
    return v is not None and float(np.dot(v, w) / (np.linalg.norm(v) * np.linalg.norm(w))) > 0.9999


def check_tenants(store: Any, expected: dict[str, dict[str, Any]], rng: np.random.Generator) -> dict[str, int]:
    """Through the client, per tenant: its points against ``expected`` (``lost``, ``extra``, ``stale``), its exact
    count (``miscounted``: tenants whose count differs), one search (``foreign_hits``: hits not its own)."""
    totals = dict.fromkeys(("lost", "extra", "stale", "miscounted", "foreign_hits"), 0)
    for name, written in expected.items():
        found = {p.id: p for p in store.scroll_points(name)}
        totals["lost"] += len(written.keys() - found.keys())
        totals["extra"] += len(found.keys() - written.keys())
        totals["stale"] += sum(not same(found[i], written[i]) for i in written.keys() & found.keys())
        totals["miscounted"] += store.count(name) != len(written)
        hits = store.search(name, random_query(rng))
        totals["foreign_hits"] += sum(h.id not in written for answer in hits.values() for h in answer)
    return totals


def node_counts(url: str, physical: dict[str, str], shared: bool) -> dict[str, int]:
    """Tenant -> exact count as the node at ``url`` answers (its local replicas first): a facet of the tenant key
    per shared collection, else a count per collection. ``physical``: tenant -> its Qdrant collection."""
    import httpx

    from indexer.store.layout import TENANT_KEY

    if not shared:
        return {name: httpx.post(f"{url}/collections/{coll}/points/count", json={"exact": True},
                                 timeout=60).json()["result"]["count"] for name, coll in physical.items()}
    counts: dict[str, int] = {}
    for coll in sorted(set(physical.values())):
        answer = httpx.post(f"{url}/collections/{coll}/facet", timeout=60,
                            json={"key": TENANT_KEY, "limit": 1_000_000, "exact": True}).json()["result"]
        counts.update({str(hit["value"]): int(hit["count"]) for hit in answer["hits"]})
    return counts


def check_nodes(cluster: Any, expected: dict[str, dict[str, Any]], physical: dict[str, str],
                shared: bool) -> dict[str, int]:
    """Through each node: tenants whose exact count differs from what was written (``node_miscounted``, all nodes
    together), and shards whose replicas' point counts differ or do not add up to what was written
    (``replicas_differ``)."""
    import httpx

    miscounted = 0
    for node in cluster.nodes:
        counts = node_counts(node.url, physical, shared)
        miscounted += sum(counts.get(name, 0) != len(points) for name, points in expected.items())
        miscounted += len(counts.keys() - expected.keys())
    differ = 0
    for coll in sorted(set(physical.values())):
        replicas: dict[int, list[int]] = collections.defaultdict(list)
        for node in cluster.nodes:
            info = httpx.get(f"{node.url}/collections/{coll}/cluster", timeout=60).json()["result"]
            for shard in info["local_shards"]:
                replicas[shard["shard_id"]].append(int(shard["points_count"]))
        differ += sum(len(set(counts)) != 1 for counts in replicas.values())
        written = sum(len(expected[name]) for name, c in physical.items() if c == coll)
        differ += sum(counts[0] for counts in replicas.values()) != written
    return {"node_miscounted": miscounted, "replicas_differ": differ}


def log_errors(cluster: Any) -> list[int]:
    """The number of ERROR lines in each node's log; the first three of each are logged."""
    counts = []
    for i, node in enumerate(cluster.nodes):
        lines = [line for line in (node.root / "qdrant.log").read_text(errors="replace").splitlines()
                 if " ERROR " in line]
        for line in lines[:3]:
            log(f"node {i}: {line[:400]}")
        counts.append(len(lines))
    return counts


def run(layout: str, agents: int, notes: int, queries: int, out: Path, big: int, kill_at: float | None,
        down_s: float, timeout_s: float, seed: int = 0) -> dict[str, Any]:
    """One layout at one agent count on a fresh 3-node cluster; the figures as a dict (see the module docstring)."""
    sys.path.insert(0, str(REPO / "tests"))  # the Qdrant node starter the tests use (no pytest in it)
    from qdrant import nodes

    from indexer.store import ServerOptions, ServerStore
    from indexer.store.layout import shared_collection

    # a node restarted with hundreds of shard replicas on a busy 2-core machine needs more than the tests' 30 s
    nodes.READY_TIMEOUT_S = max(nodes.READY_TIMEOUT_S, 300.0)
    rng = np.random.default_rng(seed)
    root = out / f"cluster-{layout}-{agents}"
    shutil.rmtree(root, ignore_errors=True)
    files = [(a, name, point) for a in range(agents) for name, point in agent_notes(rng, a, notes, big)]
    expected: dict[str, dict[str, Any]] = {}
    for _, name, point in files:
        expected.setdefault(name, {})[point.id] = point
    physical = {name: shared_collection(name, SPACE) if layout == "shared" else name for name in expected}
    with nodes.running(nodes.make_cluster(root)) as cluster:
        first = cluster.nodes[0]
        options = ServerOptions(tenancy=layout, space=SPACE, timeout_s=60, prefer_grpc=True,
                                grpc_port=first.grpc_port, **nodes.CLUSTER_COLLECTIONS)
        store = ServerStore(first.url, options=options)
        kill_after = None if kill_at is None else max(1, round(kill_at * agents))
        figures: dict[str, Any] = {"layout": layout, "agents": agents, "notes": notes, "points": len(files),
                                   "physical_collections": len(set(physical.values())), "killed": kill_at is not None}
        figures |= index_with_kill(cluster, writer=Writer(store, files), physical=sorted(set(physical.values())),
                                   kill_after=kill_after, down_s=down_s, timeout_s=timeout_s)
        latencies, leaks = search_figures(store, rng, agents, queries)
        startup_ms = daemon_start_ms(first.url, options)
        rss = [rss_bytes(node.pid) for node in cluster.nodes if node.pid is not None]
        figures |= {"rss_mib": round(sum(rss) / 2**20), "rss_mib_per_node": [round(r / 2**20) for r in rss],
                    "disk_mib": round(sum(disk_bytes(n.root / "storage") for n in cluster.nodes) / 2**20),
                    **latencies, "daemon_start_ms": startup_ms}
        figures |= check_tenants(store, expected, rng)
        figures["foreign_hits"] += leaks
        figures |= check_nodes(cluster, expected, physical, layout == "shared")
        figures["log_errors_per_node"] = log_errors(cluster)
        store.close()
    shutil.rmtree(root, ignore_errors=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tenancy_cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[1000])
    parser.add_argument("--layouts", nargs="+", default=["shared"], choices=["shared", "collections"])
    parser.add_argument("--notes", type=int, default=20)
    parser.add_argument("--big", type=int, default=100, help="agent 0 has this many times --notes")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--kill-at", type=float, default=0.3, help="fraction of agents written at the kill")
    parser.add_argument("--down-s", type=float, default=5.0, help="seconds node 1 stays down")
    parser.add_argument("--no-kill", action="store_true", help="no node killed")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="give up indexing or converging after this")
    parser.add_argument("--out", type=Path, default=None, help="work folder [a fresh temporary one]")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="qmd-tenancy-cluster-"))
    rows = []
    for agents in args.agents:
        for layout in args.layouts:
            rows.append(run(layout, agents, args.notes, args.queries, out, args.big,
                            None if args.no_kill else args.kill_at, args.down_s, args.timeout_s))
            print(json.dumps(rows[-1]), flush=True)
    print_table(rows)
    return 0 if all(row[check] == 0 for row in rows for check in CHECKS) else 1


if __name__ == "__main__":
    sys.exit(main())
