"""The ``openai`` embedder against the in-process model, serving the same model: quality, indexing rate, search.

Run from the repository root: ``python -m benchmarks.endpoint`` (``make endpoint``; ``--help`` for options). It
starts an infinity-emb server (``tests/infinity/server.py``; ``make infinity`` installs it) serving the packaged
all-MiniLM-L6-v2 from its local path, and measures in one run:

1. **Quality**: the devvault dev set (``../shared/data/devvault``, through ``benchmarks.devvault_eval``'s
   machinery) and, with ``--scifact``, SciFact (``benchmarks.eval``), indexed and searched in-process (fp32: the
   server runs the same weights in fp32 torch) and through the endpoint (chunks sized by the model's own
   ``tokenizer.json``, so both make the same chunks). File nDCG@10 / line hit@5 (dev set) and nDCG@10 (SciFact)
   of the product's hybrid search; the target is equality within 0.005.
2. **Indexing rate**: the first index of ``../shared/data/vault`` through the endpoint (``index_once`` on a fresh
   state dir: read, chunk, embed, BM25, write to Qdrant Edge) against a raw client loop posting the same chunk
   texts to the same server with the same batch size and concurrency (httpx, nothing else). Chunks per second
   each, and the ratio (target >= 0.9).
3. **Search latency**: p50 and p95 of the dev set's questions through ``Searcher.search`` (query embedding
   included: the endpoint's over HTTP, or the model in this process), hybrid, on the dev set index of each.

A missing data folder is reported on stderr and that part is skipped, saying so. Results print as tables and, with
``--json``, are written as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
DEFAULT_STATE = REPO / ".endpoint"
MODEL = "all-MiniLM-L6-v2"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def registries(url: str, models: Path, batch_size: int, concurrency: int) -> dict[str, Any]:
    """``{"in-process": ..., "endpoint": ...}``: the installed plugins with the packaged model at fp32, and with the
    ``openai`` embedder at ``url`` (MiniLM's tokenizer, 254 word pieces per chunk, as in-process)."""
    from importlib.metadata import EntryPoint, entry_points

    from indexer.plugins import GROUPS, load_registry

    sys.path.insert(0, str(REPO / "tests"))
    from infinity.server import minilm_path

    local = load_registry(config={"sentence-transformers": {"model": MODEL, "precision": "fp32",
                                                            "cache_dir": str(models)}})
    eps = [ep for group in GROUPS for ep in entry_points(group=group) if ep.name != "openai"]
    eps.append(EntryPoint("openai", "indexer.builtin.openai_embed:OpenAIEmbedder", "qmd_indexer.embedders"))
    remote = load_registry(config={"openai": {"base_url": url, "model": MODEL, "batch_size": batch_size,
                                              "max_concurrency": concurrency,
                                              "tokenizer": str(minilm_path() / "tokenizer.json"), "max_tokens": 254}},
                           prefer={"text": "openai"}, eps=eps)
    return {"in-process": local, "endpoint": remote}


def devset_quality(regs: dict[str, Any], state: Path) -> dict[str, Any]:
    """Dev set metrics of hybrid (the product's default fusion) per registry, and the search p50/p95 (ms)."""
    from benchmarks.devvault_eval import DataMissing, K, dev_path, load_devset, score_run, write_workspace
    from benchmarks.eval import open_indexed
    from indexer.search import SearchParams

    try:
        dev = load_devset((SHARED / "devvault").resolve())
    except DataMissing as exc:
        log(f"endpoint: dev set skipped: {exc}")
        return {}
    workspace = state / "devvault" / "workspace"
    write_workspace(dev.root / "notes", workspace)
    out: dict[str, Any] = {}
    for label, registry in regs.items():
        indexer, facts = open_indexed(state / "devvault", workspace, label.replace(" ", "-"), "default", None,
                                      registry, log)
        try:
            searcher = indexer.view.searcher()
            run, latencies = {}, []
            for q in dev.queries:
                started = time.perf_counter()
                hits = searcher.search(SearchParams(q["query"], k=K))
                latencies.append((time.perf_counter() - started) * 1000)
                run[q["id"]] = [dict(h, path=dev_path(h["path"])) for h in hits]
            overall = score_run(dev, run)["overall"]
            latencies.sort()
            out[label] = {"ndcg@10": round(overall["ndcg@10"], 4), "hit@5": round(overall["hit@5"], 4),
                          "chunks": facts["chunks"], "index_s": facts["seconds"],
                          "search_p50_ms": round(statistics.median(latencies), 1),
                          "search_p95_ms": round(latencies[int(0.95 * (len(latencies) - 1))], 1)}
        finally:
            indexer.close()
        log(f"  dev set {label}: {out[label]}")
    return out


def scifact_quality(regs: dict[str, Any], state: Path) -> dict[str, Any]:
    """SciFact test nDCG@10 of hybrid per registry (``benchmarks.eval.evaluate``)."""
    from benchmarks.eval import DataMissing, evaluate, load_scifact

    try:
        data = load_scifact(SHARED / "scifact")
    except DataMissing as exc:
        log(f"endpoint: SciFact skipped: {exc}")
        return {}
    out: dict[str, Any] = {}
    for label, registry in regs.items():
        results = evaluate(data, state / f"scifact-{label.replace(' ', '-')}", registry, log=log)["results"]
        out[label] = {name: round(row["ndcg@10"], 4) for name, row in results.items() if name.startswith("hybrid")}
        log(f"  SciFact {label}: {out[label]}")
    return out


def vault_rate(registry: Any, url: str, state: Path, batch_size: int, concurrency: int) -> dict[str, Any]:
    """First index of the vault through the endpoint (fresh state) against a raw loop posting its chunks."""
    import httpx

    from indexer.api import ExtractContext, FileInfo
    from indexer.builtin.markdown import MarkdownExtractor
    from indexer.config import Settings, Workspace
    from indexer.daemon import Indexer
    from indexer.worker import index_once

    vault = SHARED / "vault"
    if not vault.is_dir():
        log(f"endpoint: vault rate skipped: {vault} not found")
        return {}
    embedder = registry.embedders["text"]
    context = ExtractContext(embedder.max_tokens, embedder.token_offsets)
    texts = []
    for path in sorted(p for p in vault.rglob("*.md") if p.is_file()):
        info = FileInfo(path, path.relative_to(vault).as_posix(), "markdown", path.stat().st_size)
        texts += [embedder.document_prefix + c.embed_text for c in MarkdownExtractor().extract(info, context)]
    texts = list(dict.fromkeys(texts))  # the product embeds a repeated chunk text once (its cache)

    def raw_loop() -> float:
        batches = [texts[i : i + batch_size] for i in range(0, len(texts), batch_size)]
        with httpx.Client() as client:
            def post(batch: list[str]) -> None:
                answer = client.post(f"{url}/embeddings", json={"model": MODEL, "input": batch}, timeout=120)
                answer.raise_for_status()
                assert len(answer.json()["data"]) == len(batch)

            started = time.monotonic()
            with ThreadPoolExecutor(concurrency) as pool:
                list(pool.map(post, batches))
            return time.monotonic() - started

    raw_s = raw_loop()
    log(f"  raw client loop: {len(texts)} chunks in {raw_s:.1f} s")
    fresh = Path(tempfile.mkdtemp(prefix="vault-", dir=state))
    workspace = fresh / "workspace"
    shutil.copytree(vault, workspace / "memory")
    settings = Settings(state_dir=fresh / "state", workspace=(Workspace(agent="vault", path=workspace),),
                        log_level="warning")
    indexer = Indexer.open(settings, registry=registry)
    try:
        started = time.monotonic()
        status = index_once(indexer)
        product_s = time.monotonic() - started
    finally:
        indexer.close()
        shutil.rmtree(fresh, ignore_errors=True)
    embedded = status["chunks_embedded"]
    log(f"  product first index: {embedded} chunks embedded in {product_s:.1f} s, {status['files_failed']} failed")
    raw_rate, product_rate = len(texts) / raw_s, embedded / product_s
    return {"files": sum(c["files"] for c in status["collections"].values()), "chunks": len(texts),
            "chunks_embedded": embedded, "files_failed": status["files_failed"],
            "raw_s": round(raw_s, 1), "product_s": round(product_s, 1),
            "raw_chunks_per_s": round(raw_rate, 1), "product_chunks_per_s": round(product_rate, 1),
            "ratio": round(product_rate / raw_rate, 3)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.endpoint", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE, help="indexes and caches [%(default)s]")
    parser.add_argument("--scifact", action="store_true", help="also SciFact (10,900 chunks each way: long)")
    parser.add_argument("--batch-size", type=int, default=32, help="inputs per request [%(default)s]")
    parser.add_argument("--concurrency", type=int, default=2, help="requests in flight [%(default)s]")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(REPO / "tests"))
    from infinity.server import Infinity, minilm_path, missing

    if missing():
        print(f"endpoint: {missing()}. Nothing was measured.", file=sys.stderr)
        return 2
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    state = args.state.resolve()
    state.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    with Infinity(model_dir=minilm_path(), name=MODEL, log_path=state / "infinity.log") as server:
        log(f"infinity-emb serving {MODEL} at {server.url}")
        regs = registries(server.url, state / "models", args.batch_size, args.concurrency)
        results["vault"] = vault_rate(regs["endpoint"], server.url, state, args.batch_size, args.concurrency)
        results["devset"] = devset_quality(regs, state)
        results["scifact"] = scifact_quality(regs, state) if args.scifact else "not run (--scifact)"
        regs["endpoint"].embedders["text"].close()
    dev = results["devset"]
    if dev:
        print("\ndev set (hybrid, k 20)     nDCG@10   hit@5   chunks   search p50 ms   p95 ms")
        for label, row in dev.items():
            print(f"  {label:<24}{row['ndcg@10']:>8.3f}{row['hit@5']:>8.3f}{row['chunks']:>9}"
                  f"{row['search_p50_ms']:>16.1f}{row['search_p95_ms']:>9.1f}")
        a, b = dev["in-process"], dev["endpoint"]
        print(f"  difference: nDCG@10 {b['ndcg@10'] - a['ndcg@10']:+.4f}, hit@5 {b['hit@5'] - a['hit@5']:+.4f}; "
              f"search p50 endpoint/in-process {b['search_p50_ms'] / a['search_p50_ms']:.2f}")
    if isinstance(results["scifact"], dict) and results["scifact"]:
        print("\nSciFact nDCG@10:", json.dumps(results["scifact"]))
    vault = results["vault"]
    if vault:
        print(f"\nvault first index: {vault['files']} files, {vault['chunks_embedded']} chunks embedded, "
              f"{vault['files_failed']} failed; product {vault['product_chunks_per_s']} chunks/s "
              f"({vault['product_s']} s), raw client loop {vault['raw_chunks_per_s']} chunks/s ({vault['raw_s']} s): "
              f"ratio {vault['ratio']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
