"""A node SIGKILLed in the middle of a first index of the shared vault, on a real 3-node Qdrant cluster.

A scenario, too slow for the test suite (the vault's first index embeds ~2,000 chunks and some images): it prints
the end state and exits 0 when the index equals the files, 1 when not, 2 when its input or the binary is missing.

1. Three ``qdrant`` processes (the pinned binary of ``tests/qdrant/install.sh``, started by ``tests/qdrant/nodes.py``
   on free loopback ports, storage under ``--out``) form a cluster; the daemon's collections are created with
   ``shard_number=3, replication_factor=2, write_consistency_factor=2`` and written over gRPC.
2. The daemon (``worker.run`` on a thread, the real model and plugins) starts its first index of a copy of
   ``../shared/data/vault``. When ``--kill-at`` of the files are indexed, node 1 gets SIGKILL; writes then fail
   (HTTP 500 / gRPC errors from the survivors, partly applied), the daemon reports itself degraded and queues them
   again. After ``--down-s`` seconds the node is restarted on the same storage and ports.
3. The daemon runs until it has converged (ready, queue empty, not degraded, for 5 s), then stops; every replica of
   every collection must be ``Active``.
4. A clean index of the same files is built on Qdrant Edge in a fresh state dir, embedded from a copy of the
   daemon's embedding cache (same vectors, nothing embedded again). Per collection, the cluster's points are compared
   with it: point ids (lost / extra), per file the set of ids and payloads (stale: a point whose file hash or text
   differs), duplicates (two points for one file and chunk index), vectors (cosine > 0.9999), and each node's exact
   count of each collection (a replica left behind).

``python -m benchmarks.cluster_kill [--vault DIR] [--out DIR] [--kill-at 0.3] [--down-s 5]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench.common import DEFAULT_OUT, DEFAULT_VAULT, REPO, copy_vault, log
from benchmarks.harness import wait_until

CLUSTER_COLLECTIONS = {"qdrant_shard_number": 3, "qdrant_replication_factor": 2,
                       "qdrant_write_consistency_factor": 2}


def converged(indexer: Any, stable_s: float = 5.0, timeout_s: float = 600) -> float:
    """Seconds until the daemon has been ready, idle and not degraded for ``stable_s`` in a row."""
    started = time.monotonic()
    calm_since: float | None = None
    while time.monotonic() - started < timeout_s:
        s = indexer.view.status()
        calm = s["ready"] and s["queue_depth"] == 0 and not s["store_degraded"]
        if not calm:
            calm_since = None
        elif calm_since is None:
            calm_since = time.monotonic()
        elif time.monotonic() - calm_since >= stable_s:
            return calm_since - started
        time.sleep(0.2)
    raise TimeoutError(f"daemon did not converge within {timeout_s} s: {indexer.view.status()}")


def points_of(store: Any, name: str) -> dict[str, Any]:
    return {p.id: p for p in store.scroll_points(name)}


def compare(cluster: dict[str, Any], clean: dict[str, Any]) -> dict[str, Any]:
    """The differences between the cluster's points and the clean index's, for one collection."""
    lost, extra = sorted(clean.keys() - cluster.keys()), sorted(cluster.keys() - clean.keys())
    stale, vectors_differ = [], []
    for pid in clean.keys() & cluster.keys():
        a, b = cluster[pid], clean[pid]
        if a.payload.to_payload() != b.payload.to_payload():
            stale.append(pid)
        for k, v in b.dense.items():
            w = a.dense.get(k)
            if w is None or float(np.dot(v, w) / (np.linalg.norm(v) * np.linalg.norm(w))) < 0.9999:
                vectors_differ.append(pid)
    per_file = Counter((p.payload.abs_path, p.payload.chunk_index) for p in cluster.values())
    files_cluster: dict[str, set[str]] = {}
    files_clean: dict[str, set[str]] = {}
    for pts, into in ((cluster, files_cluster), (clean, files_clean)):
        for pid, p in pts.items():
            into.setdefault(p.payload.abs_path, set()).add(pid)
    files_differ = sorted(f for f in files_cluster.keys() | files_clean.keys()
                          if files_cluster.get(f) != files_clean.get(f))
    return {"points_cluster": len(cluster), "points_clean": len(clean), "files_cluster": len(files_cluster),
            "files_clean": len(files_clean), "lost": len(lost), "extra": len(extra), "stale": len(stale),
            "duplicated": sum(1 for n in per_file.values() if n > 1), "vectors_differ": len(vectors_differ),
            "files_whose_point_set_differs": files_differ[:10] + (["..."] if len(files_differ) > 10 else [])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster_kill", description=__doc__.split("\n\n")[0])
    parser.add_argument("--vault", type=Path, default=DEFAULT_VAULT, help="vault to index [%(default)s]")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "cluster-kill", help="work folder [%(default)s]")
    parser.add_argument("--kill-at", type=float, default=0.3, help="fraction of files indexed at the kill")
    parser.add_argument("--down-s", type=float, default=5.0, help="seconds the node stays down")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not args.vault.is_dir() or not any(args.vault.rglob("*.md")):
        print(f"cluster_kill: vault not found (or holds no markdown): {args.vault}; it is ../shared/data/vault "
              f"beside the repository (or --vault DIR). Nothing was run.", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO / "tests"))
    from qdrant import nodes

    if nodes.missing():
        print(f"cluster_kill: {nodes.missing()}. Nothing was run.", file=sys.stderr)
        return 2
    import httpx
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    from indexer.config import Settings, Workspace
    from indexer.daemon import Indexer
    from indexer.walk import walk
    from indexer.worker import index_once, run

    out = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    workspace = out / "workspace"
    notes = copy_vault(args.vault.resolve(), workspace)
    report: dict[str, Any] = {"vault": str(args.vault), "notes": notes, **{k[7:]: v for k, v in
                                                                          CLUSTER_COLLECTIONS.items()}}
    with nodes.running(nodes.make_cluster(out / "cluster")) as cluster:
        assert isinstance(cluster, nodes.Cluster)
        first = cluster.nodes[0]
        settings = Settings(state_dir=out / "state", workspace=(Workspace(agent="vault", path=workspace),),
                            log_level="warning", qdrant_url=first.url, qdrant_prefer_grpc=True,
                            qdrant_grpc_port=first.grpc_port, **CLUSTER_COLLECTIONS)
        indexer = Indexer.open(settings)
        total = len(walk(indexer.collections)[0])
        victim = cluster.nodes[1]
        stop = threading.Event()
        thread = threading.Thread(target=run, args=(indexer, stop), daemon=True, name="daemon")
        started = time.monotonic()
        thread.start()
        try:
            wait_until(lambda: len(indexer.state.indexed) >= args.kill_at * total, 900,
                       what="files indexed before the kill")
            victim.kill()
            killed_at = time.monotonic()
            at_kill = len(indexer.state.indexed)
            log(f"SIGKILL node 1 (pid gone) after {at_kill} of {total} files, {killed_at - started:.1f} s in")
            wait_until(lambda: indexer.view.status()["store_degraded"], 120, what="daemon reports degraded")
            degraded_s = time.monotonic() - killed_at
            log(f"daemon degraded {degraded_s:.1f} s after the kill")
            time.sleep(max(0.0, args.down_s - (time.monotonic() - killed_at)))
            while_down = len(indexer.state.indexed) - at_kill
            victim.start()
            log(f"node 1 restarted {time.monotonic() - killed_at:.1f} s after the kill; {while_down} files indexed "
                f"while it was down")
            converged(indexer)
            converged_s = time.monotonic() - killed_at
        finally:
            stop.set()
            indexer.settler.wake()
            thread.join(60)
            if indexer.state.watcher is not None:
                indexer.state.watcher.stop()
        log(f"daemon converged {converged_s:.1f} s after the kill: {indexer.view.status()['collections']}")
        names = [c.name for c in indexer.collections]
        for name in names:
            cluster.wait_replicas_active(name)
        report.update({"files_found": total, "files_indexed": len(indexer.state.indexed),
                       "files_at_kill": at_kill, "files_indexed_while_down": while_down,
                       "degraded_after_kill_s": round(degraded_s, 1), "converged_after_kill_s": round(converged_s, 1),
                       "first_index_s": round(time.monotonic() - started, 1)})
        # the clean index: Edge, fresh state, the daemon's embedding cache (same vectors; nothing embedded)
        clean_state = out / "clean"
        clean_state.mkdir()
        with sqlite3.connect(out / "state" / "embeddings.sqlite3") as src, \
                sqlite3.connect(clean_state / "embeddings.sqlite3") as dst:
            src.backup(dst)
        reference = Indexer.open(Settings(state_dir=clean_state, workspace=settings.workspace, log_level="warning"),
                                 registry=indexer.registry)
        clean_status = index_once(reference)
        report["clean_index_embedded"] = clean_status["chunks_embedded"]
        report["collections"] = {}
        for name in names:
            found = compare(points_of(indexer.store, name), points_of(reference.store, name))
            counts = {}
            for node in cluster.nodes:
                answer = httpx.post(f"{node.url}/collections/{name}/points/count", json={"exact": True}, timeout=30)
                counts[f"node{cluster.nodes.index(node)}"] = answer.json()["result"]["count"]
            found["count_per_node"] = counts
            report["collections"][name] = found
        reference.close()
        indexer.store.close()
    ok = all(c["lost"] == c["extra"] == c["stale"] == c["duplicated"] == c["vectors_differ"] == 0
             and not c["files_whose_point_set_differs"] and set(c["count_per_node"].values()) == {c["points_clean"]}
             for c in report["collections"].values())
    report["index_equals_files"] = ok
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print(f"\nend state: {'the index equals the files' if ok else 'THE INDEX DIFFERS FROM THE FILES'} "
          f"(report: {out / 'report.json'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
