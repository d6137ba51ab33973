"""Embedding rate and retrieval quality of each text-embedding precision, in one run on this machine.

For fp32 (torch), bf16 (torch; only where the CPU has ``avx512_bf16`` or ``amx_bf16``) and int8 (ONNX Runtime, when
installed), with the product's embedder (``indexer.builtin.embedding.SentenceTransformerEmbedder``, all-MiniLM-L6-v2):

1. **Rate**, chunks/s over real text: the first ``--sample`` SciFact abstracts (``title + " " + abstract``, each cut
   by the model at 256 word pieces, like a chunk), batch 32, in ``--rounds`` rounds that take the precisions in
   turn, so a busy shared CPU weighs on all of them alike. A precision's rate is its best round; the ratio is that
   against fp32's best round in the same run (medians are printed as well).
2. **Quality**: BEIR SciFact test nDCG@10 of dense retrieval over the whole corpus (5,183 abstracts embedded with
   that precision; the 300 test queries one at a time with ``embed_query``, as the daemon embeds a search, so with
   int8 they run on the query model; exact cosine search with numpy; a document's gain from the qrels; trec_eval's
   nDCG@10). Every precision embeds the same texts. The median time of those queries is printed too.

int8 is exported from the packaged weights into a fresh temporary cache at the start (its export seconds and the
quality record are printed), so the run measures first use too. Prints the CPU model and flags, exits 2 when the
SciFact folder is missing. Run from the repository root: ``python -m benchmarks.embed_precision``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
# the shared data folder beside the checkout (or beside the folder of worktrees)
DATA_CANDIDATES = [REPO.parent / "shared" / "data" / "scifact", REPO.parent.parent / "shared" / "data" / "scifact"]
CPU_FLAG_PREFIXES = ("avx2", "avx512", "amx", "avx_vnni", "fma")


def default_data() -> Path:
    return next((p for p in DATA_CANDIDATES if p.is_dir()), DATA_CANDIDATES[0])


def load_scifact(data: Path) -> tuple[list[str], list[str], list[str], list[str], dict[str, dict[str, int]]]:
    """``(doc_ids, doc_texts, query_ids, query_texts, qrels)`` of the test split. Raises ``FileNotFoundError``."""
    for name in ("corpus.jsonl.gz", "queries.jsonl", "qrels/test.tsv"):
        if not (data / name).is_file():
            raise FileNotFoundError(f"SciFact {name} not found under {data}")
    doc_ids, doc_texts = [], []
    with gzip.open(data / "corpus.jsonl.gz", "rt", encoding="utf-8") as handle:
        for line in handle:
            doc = json.loads(line)
            doc_ids.append(str(doc["_id"]))
            doc_texts.append(f"{doc.get('title') or ''} {doc.get('text') or ''}".strip())
    qrels: dict[str, dict[str, int]] = {}
    with open(data / "qrels" / "test.tsv", encoding="utf-8") as handle:
        for n, line in enumerate(handle):
            parts = line.split()
            if n == 0 and not parts[-1].isdigit():
                continue  # header
            qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    query_ids, query_texts = [], []
    with open(data / "queries.jsonl", encoding="utf-8") as handle:
        for line in handle:
            query = json.loads(line)
            if str(query["_id"]) in qrels:
                query_ids.append(str(query["_id"]))
                query_texts.append(query["text"])
    return doc_ids, doc_texts, query_ids, query_texts, qrels


def ndcg_at_10(doc_vectors: np.ndarray, doc_ids: list[str], query_vectors: np.ndarray, query_ids: list[str],
               qrels: dict[str, dict[str, int]]) -> float:
    """Mean nDCG@10 (trec_eval's ``ndcg_cut_10``) of exact cosine search: ``(n, d)`` and ``(q, d)`` unit vectors."""
    scores = query_vectors @ doc_vectors.T
    top = np.argpartition(-scores, 10, axis=1)[:, :10]
    total = 0.0
    for row, qid in enumerate(query_ids):
        ranked = top[row][np.argsort(-scores[row, top[row]])]
        gains = qrels[qid]
        dcg = sum(gains.get(doc_ids[d], 0) / math.log2(rank + 2) for rank, d in enumerate(ranked))
        ideal = sorted((g for g in gains.values() if g > 0), reverse=True)[:10]
        idcg = sum(g / math.log2(rank + 2) for rank, g in enumerate(ideal))
        total += dcg / idcg if idcg else 0.0
    return total / len(query_ids)


def cpu_description() -> tuple[str, list[str]]:
    """The CPU model name and its vector/matrix flags from ``/proc/cpuinfo``."""
    from indexer.builtin.text_model import cpu_flags

    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    return model, sorted(f for f in cpu_flags() if f.startswith(CPU_FLAG_PREFIXES))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.embed_precision", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=default_data(), help="BEIR SciFact folder [%(default)s]")
    parser.add_argument("--sample", type=int, default=256, help="abstracts per rate round [%(default)s]")
    parser.add_argument("--rounds", type=int, default=3, help="rate rounds per precision [%(default)s]")
    parser.add_argument("--batch-size", type=int, default=32, help="chunks per forward pass [%(default)s]")
    parser.add_argument("--docs", type=int, default=None,
                        help="smoke run: only the first N abstracts (nDCG@10 then not SciFact's) [all]")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        run(args.data, args.sample, args.rounds, args.batch_size, args.docs)
    except FileNotFoundError as exc:
        print(f"SciFact data missing: {exc}. Put BEIR SciFact (corpus.jsonl.gz, queries.jsonl, qrels/test.tsv) "
              f"there or pass --data.", file=sys.stderr)
        return 2
    return 0


def run(data: Path, sample: int = 256, rounds: int = 3, batch_size: int = 32,
        docs: int | None = None) -> dict[str, Any]:
    """Measure every precision the CPU and the installed packages allow (see the module docstring) on SciFact at
    ``data`` and print the table; returns the figures (``measure``). ``docs``: only the first N abstracts (a smoke
    run: its nDCG@10 is not SciFact's). Raises ``FileNotFoundError`` when SciFact is missing."""
    doc_ids, doc_texts, query_ids, query_texts, qrels = load_scifact(data)
    if docs:
        doc_ids, doc_texts = doc_ids[:docs], doc_texts[:docs]

    import torch

    from indexer.builtin.text_model import BF16_FLAGS, cpu_flags, int8_available

    model_name, flags = cpu_description()
    print(f"CPU: {model_name}; {os.cpu_count()} logical CPUs; torch threads {torch.get_num_threads()}")
    print(f"CPU flags: {' '.join(flags) or '(none of avx2/avx512/amx/vnni)'}")
    precisions = ["fp32"]
    if BF16_FLAGS & cpu_flags():
        precisions.append("bf16")
    else:
        print("bf16: skipped, the CPU has neither avx512_bf16 nor amx_bf16")
    if int8_available():
        precisions.append("int8")
    else:
        print("int8: skipped, onnxruntime/onnx not installed (pip install -e .: they are dependencies)")

    cache = Path(tempfile.mkdtemp(prefix="embed-precision-"))
    try:
        result = measure(argparse.Namespace(sample=sample, rounds=rounds, batch_size=batch_size), precisions, cache,
                         doc_ids, doc_texts, query_ids, query_texts, qrels)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {"cpu": model_name, "cpu_flags": flags, "subset": bool(docs), **result}


def measure(args: argparse.Namespace, precisions: list[str], cache: Path, doc_ids: list[str], doc_texts: list[str],
            query_ids: list[str], query_texts: list[str], qrels: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Load each precision's embedder (int8 exported into ``cache``), then print rates and nDCG@10; returns
    ``{"precisions": {name: {best_per_s, median_per_s, x_fp32, corpus_per_s, query_p50_ms, ndcg_at_10,
    ndcg_vs_fp32}}, "sample",
    "rounds", "batch_size", "docs", "queries", "int8_export_s"}`` (rates in chunks/s)."""
    from indexer.builtin.embedding import SentenceTransformerEmbedder

    embedders = {}
    export_s = None
    for precision in precisions:
        embedder = SentenceTransformerEmbedder({"precision": precision, "batch_size": args.batch_size,
                                               "cache_dir": str(cache)})
        started = time.perf_counter()
        _ = embedder.model  # int8: exports and checks quality on this first use
        loaded = time.perf_counter() - started
        if embedder.precision != precision:
            print(f"{precision}: unavailable, the embedder fell back to {embedder.precision} (see the log line)")
            continue
        note = ""
        if precision == "int8":
            export_s = round(loaded, 1)
            quality = json.loads(next(cache.glob("*/quality.json")).read_text())
            note = (f"; export + quality check {loaded:.1f} s: mean cosine to fp32 {quality['mean_cosine']}, "
                    f"worst {quality['min_cosine']} over {quality['sentences']} probe sentences")
        print(f"{precision}: model_id {embedder.model_id}{note}")
        embedder.encode(doc_texts[: args.batch_size])  # warm-up
        embedders[precision] = embedder

    sample = doc_texts[: args.sample]
    rates: dict[str, list[float]] = {p: [] for p in embedders}
    for _ in range(args.rounds):
        for precision, embedder in embedders.items():
            started = time.perf_counter()
            embedder.encode(sample)
            rates[precision].append(len(sample) / (time.perf_counter() - started))

    results = {}
    for precision, embedder in embedders.items():
        started = time.perf_counter()
        docs = embedder.encode(doc_texts)
        corpus_s = time.perf_counter() - started
        vectors, query_s = [], []
        for text in query_texts:
            started = time.perf_counter()
            vectors.append(embedder.embed_query(text))
            query_s.append(time.perf_counter() - started)
        queries = np.stack(vectors)
        assert docs.shape == (len(doc_texts), embedder.dim) and docs.dtype == np.float32
        results[precision] = (ndcg_at_10(docs, doc_ids, queries, query_ids, qrels), len(doc_texts) / corpus_s,
                              1000 * statistics.median(query_s))

    base = max(rates["fp32"])
    print(f"\nrate: {len(sample)} SciFact abstracts per round, {args.rounds} rounds in turn, batch {args.batch_size}; "
          f"nDCG@10: SciFact test, {len(query_ids)} queries, {len(doc_texts)} abstracts, exact cosine")
    header = ("precision", "best/s", "median/s", "x fp32", "corpus/s", "query ms", "nDCG@10", "vs fp32")
    print(f"{header[0]:<10} " + " ".join(f"{h:>8}" for h in header[1:]))
    for precision in embedders:
        ndcg, corpus_rate, query_ms = results[precision]
        print(f"{precision:<10} {max(rates[precision]):>8.1f} {statistics.median(rates[precision]):>9.1f} "
              f"{max(rates[precision]) / base:>7.2f} {corpus_rate:>9.1f} {query_ms:>9.2f} {ndcg:>8.4f} "
              f"{ndcg - results['fp32'][0]:>+8.4f}")
    print("(x fp32: best round against fp32's best round in this run; corpus/s: the whole-corpus pass, run once "
          "per precision one after another; query ms: median of the test queries, one at a time)")
    figures = {precision: {"best_per_s": round(max(rates[precision]), 1),
                           "median_per_s": round(statistics.median(rates[precision]), 1),
                           "x_fp32": round(max(rates[precision]) / base, 2),
                           "corpus_per_s": round(results[precision][1], 1),
                           "query_p50_ms": round(results[precision][2], 2),
                           "ndcg_at_10": round(results[precision][0], 4),
                           "ndcg_vs_fp32": round(results[precision][0] - results["fp32"][0], 4)}
               for precision in embedders}
    return {"precisions": figures, "sample": len(sample), "rounds": args.rounds, "batch_size": args.batch_size,
            "docs": len(doc_texts), "queries": len(query_ids), "int8_export_s": export_s}


if __name__ == "__main__":
    sys.exit(main())
