"""How long ``qdrant_edge.EdgeShard.load`` takes on a large shard, and what its configuration changes.

Not a test and not part of ``make bench``: a probe of issue 14's restart-to-ready figure at 1,000,000 points, run
directly against ``qdrant_edge`` (no daemon, no model). Two sub-commands:

``build``: a shard of ``--points`` points with the product's collection config (``indexer.store.edge_config``: on-disk
vectors and int8 unless told otherwise, the keyword and integer payload indexes of ``EdgeStore``), each point a random
384-d unit vector (``numpy`` ``default_rng(0)``, Gaussian then L2-normalised), a BM25-like sparse vector (``--terms``
distinct term ids drawn from a Zipf(1.1) law over a 30,000-term vocabulary, weights 1 + Poisson(0.3): the shape of a
passage's term counts, not real text) and a small payload (the product's fields, ``--chunks-per-file`` points per file,
a 60-byte text). ``--optimize``: after the upserts, ``optimize()`` with the product's HNSW config (``hnsw``) or with m
= 0 (``plain``: the segments made non-appendable and quantized, no graph), as ``EdgeStore.build_index`` does in its
child process. Prints the build's seconds and the shard's segments and sizes.

``load``: each ``--variant`` loads the shard in a fresh child process ``--repeat`` times (page cache warm: the first
load of a series is a warm-up, not counted) and reports the median ``EdgeShard.load`` seconds, then in the last
child a ``count``, 50 dense (rescored when quantized; the first one's time apart: it reads what is cold) and 50
sparse queries (p50 ms) and the process's RSS. ``as-built`` loads the shard as it is; the other variants pass
memory tiers to ``EdgeShard.load(path, config)``, which (measured, qdrant-edge-py 0.9.0) changes nothing for the
segments already built: a tier is fixed when a segment is built, hence the build options ``--quant-memory``,
``--index-memory``, ``--hnsw-memory``.

Run from the repository root, e.g.::

    python -m benchmarks.edge_load build --dir .bench/edge-load/1m --points 1000000 --optimize hnsw
    python -m benchmarks.edge_load load --dir .bench/edge-load/1m --variant as-built
    # the tiers before: --quant-memory pinned --index-memory ram --hnsw-memory default

Delete ``--dir`` afterwards (1M points take ~3 GB).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

DIM = 384
VOCAB = 30_000
# load-time memory overrides: component -> "cold" | "cached" | "pinned" (None: keep what the shard has)
VARIANTS: dict[str, dict[str, str]] = {
    "as-built": {},
    "pinned": {"vectors": "cold", "quantized": "pinned"},
    "quant-cached": {"vectors": "cold", "quantized": "cached"},
    "all-cold": {"vectors": "cold", "quantized": "cold", "sparse": "cold", "hnsw": "cold", "id_tracker": "cold",
                 "payload": "cold"},
    "threads-1": {"threads": "1"},
}


def _memory(qe: Any, name: str | None) -> Any:
    return None if name is None else {"cold": qe.Memory.Cold, "cached": qe.Memory.Cached,
                                      "pinned": qe.Memory.Pinned}[name]


def load_config(qe: Any, record: dict[str, Any], over: dict[str, str]) -> Any:
    """The ``EdgeConfig`` a variant loads with (``None`` when it overrides nothing): the shard's vectors and
    quantization with the memory placements of ``over``."""
    if not over:
        return None
    quantization = None
    if record["quantization"] == "int8":
        quantization = qe.ScalarQuantizationConfig(type=qe.ScalarType.Int8,
                                                   memory=_memory(qe, over.get("quantized", "pinned")))
    hnsw = None
    if "hnsw" in over:
        hnsw = qe.HnswIndexConfig(m=record["hnsw_m"], ef_construct=100, full_scan_threshold=10_000,
                                  memory=_memory(qe, over["hnsw"]))
    return qe.EdgeConfig(
        vectors={"text": qe.EdgeVectorParams(size=DIM, distance=qe.Distance.Cosine,
                                             memory=_memory(qe, over.get("vectors")))},
        sparse_vectors={"bm25": qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf,
                                                          memory=_memory(qe, over.get("sparse")))},
        quantization_config=quantization, hnsw_config=hnsw,
        payload_memory=_memory(qe, over.get("payload")), id_tracker_memory=_memory(qe, over.get("id_tracker")),
        max_search_threads=int(over["threads"]) if "threads" in over else None)


def build(args: argparse.Namespace) -> dict[str, Any]:
    import qdrant_edge as qe

    from indexer.points import INTEGER_FIELDS, KEYWORD_FIELDS
    from indexer.store.edge_config import edge_config, field_index
    from indexer.store.edge_states import HASH_FIELD

    path = args.dir.resolve()
    if path.exists():
        raise SystemExit(f"{path} exists; remove it first")
    config = edge_config(qe, {"text": DIM}, on_disk_vectors=args.on_disk_vectors, quantization=args.quantization)
    if args.quant_memory != "product" and args.quantization == "int8":
        config = qe.EdgeConfig(vectors=config.vectors, sparse_vectors=config.sparse_vectors,
                               hnsw_config=config.hnsw_config, quantization_config=qe.ScalarQuantizationConfig(
                                   type=qe.ScalarType.Int8, memory=_memory(qe, args.quant_memory)))
    started = time.perf_counter()
    shard = qe.EdgeShard.create(str(path), config)
    if args.indexes:
        for key, integer in [(k, False) for k in (*KEYWORD_FIELDS, HASH_FIELD)] + [(k, True) for k in INTEGER_FIELDS]:
            if args.index_memory == "product":
                shard.update(field_index(qe, key, integer, args.on_disk_vectors))
            elif args.index_memory == "ram":  # Qdrant's default: loaded into RAM
                shard.update(qe.UpdateOperation.create_field_index(
                    key, qe.PayloadSchemaType.Integer if integer else qe.PayloadSchemaType.Keyword))
            else:
                memory = _memory(qe, args.index_memory)
                shard.update(qe.UpdateOperation.create_field_index(key, qe.IntegerIndexParams(
                    lookup=True, range=True, memory=memory) if integer else qe.KeywordIndexParams(memory=memory)))
    rng = np.random.default_rng(0)
    batch = 2000
    for start in range(0, args.points, batch):
        n = min(batch, args.points - start)
        dense = rng.standard_normal((n, DIM), dtype=np.float32)
        dense /= np.linalg.norm(dense, axis=1, keepdims=True)
        points = []
        for i in range(n):
            k = start + i
            f, c = divmod(k, args.chunks_per_file)
            terms = np.unique(np.minimum(rng.zipf(1.1, args.terms), VOCAB) - 1)
            weights = 1.0 + rng.poisson(0.3, len(terms))
            vector: dict[str, Any] = {"text": dense[i].tolist(),
                                      "bm25": qe.SparseVector(indices=terms.tolist(), values=weights.tolist())}
            rel = f"memory/d{f % 100:02d}/note-{f:06d}.md"
            payload = {"agent": "probe", "path": rel, "abs_path": f"/ws/{rel}", "dirs": ["memory", rel[:10]],
                       "file_hash": hashlib.sha256(rel.encode()).hexdigest(), "mtime_ns": 1_700_000_000_000 + f,
                       "size_bytes": 6000, "chunk_index": c, "chunk_count": args.chunks_per_file, "kind": "markdown",
                       "text": f"passage {k} of note {f}: a short line of text standing in for a chunk."}
            points.append(qe.Point(id=uuid.UUID(int=k + 1), vector=vector, payload=payload if args.payload else {}))
        shard.update(qe.UpdateOperation.upsert_points(points))
        if (start + n) % 100_000 == 0:
            print(f"  {start + n} points ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    upserted = time.perf_counter() - started
    shard.flush()
    shard.close()
    record = {"points": args.points, "quantization": args.quantization, "on_disk_vectors": args.on_disk_vectors,
              "quant_memory": args.quant_memory, "index_memory": args.index_memory,
              "hnsw_memory": None if args.hnsw_memory == "default" else args.hnsw_memory,
              "optimize": "none", "hnsw_m": 16, "indexes": args.indexes, "payload": args.payload,
              "upsert_s": round(upserted, 1), "optimize_s": 0.0}
    (path / "probe.json").write_text(json.dumps(record))
    if args.optimize != "none":
        return optimize(path, args.optimize)
    return {**record, **layout(path)}


def optimize(path: Path, how: str) -> dict[str, Any]:
    """``optimize()`` the shard at ``path`` in place with HNSW ``m`` 16 (``hnsw``) or 0 (``plain``: no graph)."""
    import qdrant_edge as qe

    from indexer.store.edge_config import edge_config

    record = json.loads((path / "probe.json").read_text())
    config = edge_config(qe, {"text": DIM}, on_disk_vectors=record["on_disk_vectors"],
                         quantization=record["quantization"])
    quantization = config.quantization_config
    if record["quantization"] == "int8" and record["quant_memory"] != "product":
        quantization = qe.ScalarQuantizationConfig(type=qe.ScalarType.Int8, memory=_memory(qe, record["quant_memory"]))
    graph = record["hnsw_memory"]
    memory = (config.hnsw_config.memory if config.hnsw_config else None) if graph == "product" else _memory(qe, graph)
    m = 16 if how == "hnsw" else 0
    shard = qe.EdgeShard.load(str(path), qe.EdgeConfig(
        vectors=config.vectors, sparse_vectors=config.sparse_vectors, quantization_config=quantization,
        hnsw_config=qe.HnswIndexConfig(m=m, ef_construct=100, full_scan_threshold=10_000, memory=memory)))
    t = time.perf_counter()
    shard.optimize()
    record.update(optimize=how, hnsw_m=m, optimize_s=round(time.perf_counter() - t, 1))
    shard.flush()
    shard.close()
    (path / "probe.json").write_text(json.dumps(record))
    return {**record, **layout(path)}


def layout(path: Path) -> dict[str, Any]:
    """Segments of the shard and the MiB of each kind of file in them."""
    segments = sorted(p for p in (path / "segments").iterdir() if p.is_dir()) if (path / "segments").is_dir() else []
    sizes: dict[str, float] = {}
    for seg in segments:
        for f in seg.rglob("*"):
            if f.is_file():
                top = f.relative_to(seg).parts[0]
                key = top.split("-")[0] if "-" in top else top
                sizes[key] = sizes.get(key, 0) + f.stat().st_size / 2**20
    wal = sum(f.stat().st_size for f in (path / "wal").rglob("*") if f.is_file()) / 2**20 \
        if (path / "wal").is_dir() else 0
    return {"segments": len(segments), "mib": {k: round(v) for k, v in sorted(sizes.items())}, "wal_mib": round(wal)}


_CHILD = r"""
import json, os, resource, sys, time, uuid
import numpy as np, qdrant_edge as qe
from benchmarks.edge_load import load_config, DIM
path, over, probe = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
record = json.load(open(os.path.join(path, "probe.json")))
config = load_config(qe, record, over)
t = time.perf_counter()
shard = qe.EdgeShard.load(path, config) if config is not None else qe.EdgeShard.load(path)
out = {"load_s": time.perf_counter() - t}
if probe:
    t = time.perf_counter()
    out["count"] = shard.count(qe.CountRequest(exact=True))
    out["count_s"] = time.perf_counter() - t
    rng = np.random.default_rng(1)
    params = qe.SearchParams(quantization=qe.QuantizationSearchParams(rescore=True)) \
        if record["quantization"] == "int8" else None
    dense, sparse = [], []
    for i in range(51):
        v = rng.standard_normal(DIM).astype(np.float32); v /= np.linalg.norm(v)
        t = time.perf_counter()
        shard.query(qe.QueryRequest(limit=40, query=qe.Query.Nearest(v.tolist(), using="text"), params=params,
                                    with_payload=False))
        dense.append(time.perf_counter() - t)
        terms = sorted({int(x) for x in rng.integers(0, 200, 4)})
        t = time.perf_counter()
        shard.query(qe.QueryRequest(limit=40, query=qe.Query.Nearest(qe.SparseVector(indices=terms,
                    values=[1.0] * len(terms)), using="bm25"), with_payload=False))
        sparse.append(time.perf_counter() - t)
    out["first_dense_ms"] = 1000 * dense[0]
    out["dense_p50_ms"] = 1000 * float(np.median(dense[1:]))
    out["sparse_p50_ms"] = 1000 * float(np.median(sparse[1:]))
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS", "RssAnon", "RssFile")):
            out[line.split(":")[0]] = int(line.split()[1]) // 1024
t = time.perf_counter()
shard.close()
out["close_s"] = time.perf_counter() - t
print(json.dumps(out))
"""


def load_once(path: Path, over: dict[str, str], probe: bool) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), json.dumps(over), "1" if probe else "0"],
                          capture_output=True, text=True, check=False, cwd=Path(__file__).resolve().parent.parent)
    if proc.returncode != 0:
        raise RuntimeError(f"load failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def load(args: argparse.Namespace) -> list[dict[str, Any]]:
    path = args.dir.resolve()
    kept = (path / "edge_config.json").read_text()
    rows = []
    for name in args.variant or ["as-built", "product"]:
        over = VARIANTS[name]
        load_once(path, over, probe=False)  # warm-up: the page cache, and the config written to disk
        times = [load_once(path, over, probe=False)["load_s"] for _ in range(args.repeat - 1)]
        last = load_once(path, over, probe=True)
        times.append(last["load_s"])
        row = {"variant": name, "load_s": round(statistics.median(times), 2),
               "load_all_s": [round(t, 2) for t in times], **{k: round(v, 2) if isinstance(v, float) else v
                                                               for k, v in last.items() if k != "load_s"},
               "load_average": round(os.getloadavg()[0], 2)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    (path / "edge_config.json").write_text(kept)  # a load with a config wrote its own there
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.edge_load", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--dir", type=Path, required=True)
    b.add_argument("--points", type=int, default=1_000_000)
    b.add_argument("--chunks-per-file", type=int, default=100)
    b.add_argument("--terms", type=int, default=30, help="term draws per point (distinct ones kept)")
    b.add_argument("--in-ram-vectors", dest="on_disk_vectors", action="store_false")
    b.add_argument("--quantization", choices=("none", "int8"), default="int8")
    b.add_argument("--quant-memory", choices=("product", "pinned", "cached", "cold"), default="product",
                   help="memory of the int8 copy (product: as indexer.store.edge_config sets it) [%(default)s]")
    b.add_argument("--index-memory", choices=("product", "ram", "cached", "cold"), default="product",
                   help="memory of the payload indexes (ram: Qdrant's default) [%(default)s]")
    b.add_argument("--hnsw-memory", choices=("product", "default", "cached", "cold"), default="product",
                   help="memory of the HNSW graph (default: Qdrant's) [%(default)s]")
    b.add_argument("--no-indexes", dest="indexes", action="store_false")
    b.add_argument("--no-payload", dest="payload", action="store_false")
    b.add_argument("--optimize", choices=("none", "plain", "hnsw"), default="none")
    op = sub.add_parser("optimize")
    op.add_argument("--dir", type=Path, required=True)
    op.add_argument("how", choices=("plain", "hnsw"))
    lo = sub.add_parser("load")
    lo.add_argument("--dir", type=Path, required=True)
    lo.add_argument("--variant", action="append", choices=sorted(VARIANTS))
    lo.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown")
    print(f"CPU {cpu}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    if args.command == "build":
        print(json.dumps(build(args)))
    elif args.command == "optimize":
        print(json.dumps(optimize(args.dir.resolve(), args.how)))
    else:
        load(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
