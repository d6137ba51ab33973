"""One query's embedding: the query model (``OnnxQueryEncoder``, what ``embed_query`` runs) against the model's own
modules (what it ran before at fp32 and bf16), in one run on this machine.

The product's embedder (all-MiniLM-L6-v2) at ``--precision`` (default ``auto``) with its query model exported into a
fresh temporary cache; then the SciFact test queries (``../shared/data/scifact/queries.jsonl``; a fixed set of
generated questions when it is missing, said on stderr) one at a time, each through both paths in turn, so a busy
shared CPU weighs on both alike. Prints p50 and p95 per path in milliseconds, their ratio, and the cosine between the
two vectors of each query (min and mean).

    python -m benchmarks.query_latency [--precision auto|fp32|bf16|int8] [--queries 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
QUERIES = REPO.parent / "shared" / "data" / "scifact" / "queries.jsonl"


def queries(limit: int) -> list[str]:
    """Up to ``limit`` SciFact queries, or generated questions when the data folder is missing."""
    if QUERIES.exists():
        texts = [json.loads(line)["text"] for line in QUERIES.read_text(encoding="utf-8").splitlines() if line]
        return texts[:limit]
    print(f"{QUERIES} is missing: timing generated questions instead", file=sys.stderr)
    topics = ["deploy windows", "the export job", "flat white", "Lisbon flights", "TLS certificates", "vitamin D"]
    return [f"what did the user say about {topics[i % len(topics)]} ({i})?" for i in range(limit)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "int8"])
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()

    import torch

    from indexer.builtin.embedding import SentenceTransformerEmbedder

    with tempfile.TemporaryDirectory() as cache:
        embedder = SentenceTransformerEmbedder({"precision": args.precision, "cache_dir": cache})
        embedder.embed_query("warm-up")  # loads the model and exports its query model
        encoder, model = embedder._query_encoder, embedder.model
        if encoder is None:
            print("no query model for this model or machine: nothing to compare", file=sys.stderr)
            return 2
        preprocess = getattr(model, "preprocess", None) or model.tokenize

        def modules(text: str) -> np.ndarray:
            with torch.inference_mode():
                vector = model(preprocess([text]))["sentence_embedding"][0]
            return vector.float().numpy()

        times: dict[str, list[float]] = {"query model": [], "model's modules": []}
        cosines = []
        for text in queries(args.queries):
            vectors = []
            for name, run in (("query model", encoder), ("model's modules", modules)):
                started = time.perf_counter()
                vectors.append(run(text))
                times[name].append(time.perf_counter() - started)
            a, b = (v / np.linalg.norm(v) for v in vectors)
            cosines.append(float(a @ b))
    print(f"precision {embedder.precision}, query file {embedder.query_file}, {len(cosines)} queries")
    p50 = {}
    for name, values in times.items():
        p50[name] = statistics.median(values) * 1000
        p95 = statistics.quantiles(values, n=20)[-1] * 1000
        print(f"  {name:16} p50 {p50[name]:6.2f} ms   p95 {p95:6.2f} ms")
    ratio = p50["query model"] / p50["model's modules"]
    print(f"  ratio query model / model's modules (p50): {ratio:.2f}")
    print(f"  cosine between the two: min {min(cosines):.5f}, mean {statistics.fmean(cosines):.5f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
