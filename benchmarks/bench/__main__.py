"""``python -m benchmarks.bench``: the command line; runs the steps in order, prints the table, writes the JSON."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import benchmarks.bench
from benchmarks.bench import common
from benchmarks.bench.big import bench_big
from benchmarks.bench.common import (
    BIG_ANCHORS,
    BIG_CHUNKS_PER_FILE,
    BIG_HNSW_WAIT_S,
    BIG_POINTS,
    DEFAULT_OUT,
    DEFAULT_SCIFACT,
    DEFAULT_VAULT,
    NOOP_FILES,
    QUERIES,
    REPO,
    copy_vault,
    cpu_model,
    headings,
    log,
    real_vectors,
    settings_for,
)
from benchmarks.bench.daemon import bench_daemon
from benchmarks.bench.index import bench_index, bench_noop_many
from benchmarks.bench.table import print_table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench",
                                     description=(benchmarks.bench.__doc__ or "").split("\n\n")[0])
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
    common.BIG_ANCHORS, common.BIG_CHUNKS_PER_FILE = args.big_anchors, args.big_chunks_per_file
    common.BIG_HNSW_WAIT_S = args.big_hnsw_wait
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not args.vault.is_dir() or not any(args.vault.rglob("*.md")):
        print(f"bench: vault not found (or holds no markdown): {args.vault}\nThe benchmark indexes a copy of "
              f"../shared/data/vault (the project's shared data, beside the repository; or --vault DIR). "
              f"Nothing was measured.", file=sys.stderr)
        return 2
    big = not args.skip_big
    common.BIG_POINTS = args.big_points
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


if __name__ == "__main__":
    sys.exit(main())
