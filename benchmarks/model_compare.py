"""MiniLM against multilingual-e5-small in one run: encode throughput, first index of a vault slice, query p50, RSS.

Run from the repository root: ``python -m benchmarks.model_compare`` (``--help`` for options). Each model runs in a
child process of its own (``--one MODEL``), one after the other, so their resident sets do not mix; the parent
prints both rows and the e5/MiniLM ratio of each figure, with the load average before and after.

Per model, in its child:

1. The text embedder ``benchmarks.eval.model_registry`` gives (``minilm``: all-MiniLM-L6-v2 at the precision the
   settings say, ``QMD_INDEXER_PRECISION=int8`` forcing int8; ``e5``: the ``e5`` plugin).
2. The first index of the markdown files under ``--vault`` (default ``../shared/data/vault``), the first
   ``--max-files`` of them in path order, with the daemon's code (``Indexer.open`` + ``index_once``) into a fresh
   Qdrant Edge state under a temporary folder: seconds, files, chunks, and chunks per second (the encode
   throughput of indexing, chunking and upserts included).
3. ``--queries`` single queries (``Searcher.search``, hybrid, k 10) over that index: the median latency (ms).
4. The process's peak resident set (``ru_maxrss``, MiB): the model, the index and the searches, as a daemon holds
   them.

The vault (documentation of open-source projects, English) is missing on a fresh clone: the script then says so
and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VAULT = REPO.parent / "shared" / "data" / "vault"
QUERIES = ["how do I configure logging", "what does the cache invalidation do", "install on windows",
           "release notes for the last version", "how are errors reported", "authentication with a token",
           "run the tests locally", "performance tuning options", "what is the default timeout",
           "upgrade from the previous major version", "contributing guidelines", "command line flags"]


def one(model: str, vault: Path, max_files: int, queries: int) -> dict[str, float | int | str]:
    """Index the slice with ``model`` and search it; the figures of one child (see the module)."""
    import structlog

    from benchmarks.eval import model_registry
    from indexer.config import Settings, Workspace
    from indexer.daemon import Indexer
    from indexer.schema import SearchRequest
    from indexer.worker import index_once

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    files = sorted(vault.rglob("*.md"))[:max_files]
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        for n, path in enumerate(files):
            target = ws / "memory" / f"{n:04d}-{path.name}"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
        settings = Settings(state_dir=Path(tmp) / "state", workspace=(Workspace(agent="bench", path=ws),),
                            log_level="warning")
        registry = model_registry(settings, model)
        embedder = registry.embedders["text"]
        embedder.embed_query("warm-up")  # the model loaded before the clock starts, as a daemon's preload does
        indexer = Indexer.open(settings, registry=registry)
        try:
            started = time.monotonic()
            status = index_once(indexer)
            seconds = time.monotonic() - started
            chunks = sum(c["chunks"] for c in status["collections"].values())
            searcher = indexer.view.searcher()
            latencies = []
            for n in range(queries):
                started = time.perf_counter()
                searcher.search(SearchRequest(query=QUERIES[n % len(QUERIES)] + ("" if n < len(QUERIES) else f" {n}"),
                                              k=10))
                latencies.append((time.perf_counter() - started) * 1000)
        finally:
            indexer.close()
    return {"model": embedder.model_id, "files": len(files), "bytes": sum(p.stat().st_size for p in files),
            "chunks": chunks, "index_s": round(seconds, 1), "chunks_per_s": round(chunks / seconds, 2),
            "query_p50_ms": round(statistics.median(latencies), 1),
            "rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model_compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--vault", type=Path, default=DEFAULT_VAULT, help="markdown folder [%(default)s]")
    parser.add_argument("--max-files", type=int, default=40, help="first N files in path order [%(default)s]")
    parser.add_argument("--queries", type=int, default=30, help="single queries timed [%(default)s]")
    parser.add_argument("--models", default="minilm,e5", help="models, in this order [%(default)s]")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not args.vault.is_dir():
        print(f"model_compare: no vault at {args.vault} (--vault DIR)", file=sys.stderr)
        return 2
    if args.one:
        print(json.dumps(one(args.one, args.vault, args.max_files, args.queries)))
        return 0
    load_before = os.getloadavg()
    rows = {}
    for model in args.models.split(","):
        out = subprocess.run([sys.executable, "-m", "benchmarks.model_compare", "--one", model, "--vault",
                              str(args.vault), "--max-files", str(args.max_files), "--queries", str(args.queries)],
                             capture_output=True, text=True, check=True, cwd=REPO)
        rows[model] = json.loads(out.stdout.strip().splitlines()[-1])
    load_after = os.getloadavg()
    keys = ("chunks", "index_s", "chunks_per_s", "query_p50_ms", "rss_mib")
    print(f"{'model':<52}" + "".join(f"{k:>14}" for k in keys))
    for row in rows.values():
        print(f"{row['model']:<52}" + "".join(f"{row[k]:>14}" for k in keys))
    if "minilm" in rows and "e5" in rows:
        print(f"{'ratio e5 / minilm':<52}" + "".join(
            f"{rows['e5'][k] / rows['minilm'][k]:>14.2f}" if rows["minilm"][k] else f"{'-':>14}" for k in keys))
    first = next(iter(rows.values()))
    print(f"{first['files']} files, {first['bytes']} bytes of {args.vault}; load average before "
          f"{load_before[0]:.1f}, after {load_after[0]:.1f} on {os.cpu_count()} CPUs")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "load": [load_before, load_after]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
