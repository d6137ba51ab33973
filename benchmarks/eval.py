"""Retrieval quality on BEIR SciFact through the product's own indexing and search path (``make eval``).

What it does, in one run:

1. Reads SciFact from ``--data`` (default ``../shared/data/scifact`` relative to the repository): ``corpus.jsonl.gz``
   (or ``corpus.jsonl``; 5,183 abstracts), ``queries.jsonl`` and ``qrels/<split>.tsv``. A missing folder or file is
   reported on stderr and the process exits with status 2.
2. Writes the corpus as a workspace: ``<state>/workspace/memory/<doc id>.md`` holding ``# <title>``, a blank line and
   the abstract. Files whose content is unchanged are not rewritten, so their ``mtime`` (and the index) stay valid.
3. Indexes it with the daemon's code (``Indexer.open`` + ``worker.index_once``) into Qdrant Edge under
   ``<state>/state-<variant>/``. The embedding cache ``<state>/embeddings.sqlite3`` is shared by every variant and
   kept between runs, so only the first run embeds (minutes on 2 cores); later runs re-chunk and re-upsert only
   when the code that shapes points (chunking, markdown, pipeline) or the variant changed.
4. Runs every query of the split through ``Searcher.retrieve`` (the ranking behind ``POST /search``) in modes
   ``dense``, ``keyword`` and ``hybrid`` (fusions ``rrf`` and ``dbsf``), and a plain BM25 baseline with the
   ``bm25s`` library on whole documents (title + abstract), computed in the same run.

Chunk hits map to documents by their file name; a document's rank is that of its best chunk (documents are
deduplicated, first occurrence wins, before cutting at 10 or 100). nDCG@10 is BEIR's (``pytrec_eval``/trec_eval
``ndcg_cut``): gain = the qrels grade, discount ``log2(rank + 1)``, ideal DCG from the query's qrels sorted by grade;
implemented here (``ndcg_at_k``). Recall@100 = relevant documents in the first 100 / relevant documents. Both are
averaged over the queries of the split that have qrels (300 for test, 809 for train).

Depths: nDCG@10 uses ``k = prefetch_limit`` chunks (so the fusion sees exactly what a product search sees);
recall@100 needs 100 distinct documents, so it asks for ``k = RECALL_CHUNKS`` chunks (each vector's list is cut to
that depth before fusion).

Reference points: BM25 0.665 nDCG@10 (BEIR paper, Thakur et al. 2021, table 2).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "scifact"
DEFAULT_STATE = REPO / ".eval"
RECALL_CHUNKS = 300  # chunks asked for when measuring recall@100 (~2.3 chunks per SciFact document)
# source files whose code decides what points the index holds; a change to any of them rebuilds the eval index
_POINT_SHAPING = ("indexer/chunking.py", "indexer/sections.py", "indexer/conversation.py", "indexer/frontmatter.py",
                  "indexer/builtin/markdown.py", "indexer/pipeline.py", "indexer/points.py", "indexer/store.py",
                  "indexer/store/*.py")


# -- metrics ------------------------------------------------------------------------------------------------------
def dedupe(ranked: Iterable[str]) -> list[str]:
    """``ranked`` with later repeats dropped (a document keeps the rank of its best chunk)."""
    return list(dict.fromkeys(ranked))


def ndcg_at_k(ranked: Sequence[str], gains: Mapping[str, int], k: int = 10) -> float:
    """nDCG@k as trec_eval's ``ndcg_cut`` (BEIR): sum of ``gain / log2(rank + 1)`` over the first ``k`` of
    ``ranked`` (rank 1-based; ``gains`` maps doc id -> qrels grade, absent = 0), divided by the same sum over the
    ideal ordering of ``gains``. 0.0 when no document has a positive grade."""
    dcg = sum(gains.get(doc, 0) / math.log2(rank + 2) for rank, doc in enumerate(ranked[:k]))
    ideal = sorted((g for g in gains.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(rank + 2) for rank, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_k(ranked: Sequence[str], gains: Mapping[str, int], k: int = 100) -> float:
    """Share of the documents with a positive grade that appear in the first ``k`` of ``ranked``."""
    relevant = {doc for doc, g in gains.items() if g > 0}
    return len(relevant & set(ranked[:k])) / len(relevant) if relevant else 0.0


@dataclass
class Scores:
    """Per-query metrics of one method; ``mean`` gives the averages."""

    ndcg: list[float] = field(default_factory=list)
    recall: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def add(self, top10: Sequence[str], top100: Sequence[str], gains: Mapping[str, int], seconds: float) -> None:
        self.ndcg.append(ndcg_at_k(top10, gains, 10))
        self.recall.append(recall_at_k(top100, gains, 100))
        self.seconds.append(seconds)

    def mean(self) -> dict[str, float]:
        n = max(1, len(self.ndcg))
        return {"ndcg@10": sum(self.ndcg) / n, "recall@100": sum(self.recall) / n,
                "ms_per_query": 1000 * sum(self.seconds) / n, "queries": len(self.ndcg)}


# -- data ---------------------------------------------------------------------------------------------------------
class DataMissing(Exception):
    """The SciFact folder or one of its files is absent."""


@dataclass
class SciFact:
    corpus: dict[str, tuple[str, str]]  # doc id -> (title, text)
    queries: dict[str, str]  # query id -> text, only those with qrels in the split
    qrels: dict[str, dict[str, int]]  # query id -> doc id -> grade


def load_scifact(data: Path, split: str = "test") -> SciFact:
    """Read a BEIR-format folder. Raises ``DataMissing`` naming what is absent."""
    if not data.is_dir():
        raise DataMissing(f"SciFact data folder not found: {data}")
    corpus_path = next((p for p in (data / "corpus.jsonl.gz", data / "corpus.jsonl") if p.exists()), None)
    qrels_path, queries_path = data / "qrels" / f"{split}.tsv", data / "queries.jsonl"
    for path, what in ((corpus_path, "corpus.jsonl[.gz]"), (queries_path, "queries.jsonl"), (qrels_path, "qrels")):
        if path is None or not path.exists():
            raise DataMissing(f"{data}: {what} not found" + (f" ({path})" if path else ""))
    opener = gzip.open if corpus_path.suffix == ".gz" else open
    corpus: dict[str, tuple[str, str]] = {}
    with opener(corpus_path, "rt", encoding="utf-8") as handle:
        for line in handle:
            doc = json.loads(line)
            corpus[str(doc["_id"])] = (doc.get("title") or "", doc.get("text") or "")
    qrels: dict[str, dict[str, int]] = {}
    with open(qrels_path, encoding="utf-8") as handle:
        for n, line in enumerate(handle):
            parts = line.rstrip("\n").split("\t")
            if n == 0 and not parts[-1].lstrip("-").isdigit():
                continue  # header
            qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    queries: dict[str, str] = {}
    with open(queries_path, encoding="utf-8") as handle:
        for line in handle:
            q = json.loads(line)
            if str(q["_id"]) in qrels:
                queries[str(q["_id"])] = q["text"]
    return SciFact(corpus, queries, {q: g for q, g in qrels.items() if q in queries})


def sample(data: SciFact, queries: int) -> SciFact:
    """A smoke-test subset: the first ``queries`` queries (in file order), their relevant documents and the first
    ``10 * queries`` other documents. Its figures are not comparable with the full run's."""
    chosen = dict(list(data.queries.items())[:queries])
    relevant = {doc for qid in chosen for doc in data.qrels[qid]}
    keep = relevant | set(list(data.corpus)[: 10 * queries])
    return SciFact({d: v for d, v in data.corpus.items() if d in keep}, chosen, {q: data.qrels[q] for q in chosen})


def note_text(title: str, text: str) -> str:
    """The markdown note a document becomes: its title as a heading, a blank line, the abstract."""
    return f"# {title.strip()}\n\n{text.strip()}\n" if title.strip() else f"{text.strip()}\n"


def write_workspace(corpus: Mapping[str, tuple[str, str]], workspace: Path) -> int:
    """Make ``workspace/memory/`` hold exactly one note per document; returns how many files were (re)written."""
    memory = workspace / "memory"
    memory.mkdir(parents=True, exist_ok=True)
    wanted = {f"{doc_id}.md": note_text(*doc) for doc_id, doc in corpus.items()}
    for stale in [p for p in memory.iterdir() if p.name not in wanted]:
        stale.unlink()
    written = 0
    for name, content in wanted.items():
        path = memory / name
        data = content.encode("utf-8")
        try:
            if path.read_bytes() == data:
                continue
        except FileNotFoundError:
            pass
        path.write_bytes(data)
        written += 1
    return written


def doc_of(payload: Any) -> str:
    """The SciFact doc id of a hit: its file name without ``.md``."""
    return Path(str(payload.get("path", ""))).stem


# -- the product path ---------------------------------------------------------------------------------------------
def code_fingerprint(extra: str = "") -> str:
    """12 hex digits over the point-shaping source files and ``extra`` (the variant)."""
    digest = hashlib.sha256(extra.encode())
    for pattern in _POINT_SHAPING:
        for path in sorted(REPO.glob(pattern)):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def bm25_variant(name: str) -> Any:
    """The product's ``bm25`` settings (``indexer.config.Bm25``) for a named tuning variant: ``default`` (the
    product's own), ``word`` (the Word tokenizer: Latin-script words only), ``nostem`` (Multilingual without
    stemming), ``avglen<N>`` (Multilingual with ``avg_len = N``)."""
    from indexer.config import Bm25

    if name == "default":
        return Bm25()
    if name == "word":
        return Bm25(tokenizer="word")
    if name == "nostem":
        return Bm25(stemmer=False)
    if name.startswith("avglen"):
        return Bm25(avg_len=float(name[6:]))
    raise ValueError(f"unknown BM25 variant {name!r}")


def with_overlap(registry: Any, overlap: float | None) -> Any:
    """``registry`` with its markdown extractor configured with ``overlap_ratio = overlap`` (``None``: as is); the
    other plugins (the loaded model) are shared."""
    if overlap is None:
        return registry
    from dataclasses import replace

    from indexer.builtin.markdown import MarkdownExtractor
    from indexer.contract import EXTRACTORS
    from indexer.plugins import Registry

    extractor = MarkdownExtractor({"overlap_ratio": overlap})
    return Registry([replace(r, obj=extractor) if (r.group, r.name, r.status) == (EXTRACTORS, "markdown", "loaded")
                     else r for r in registry.records])


def open_indexed(state: Path, workspace: Path | dict[str, Path], variant: str, bm25: str, overlap: float | None,
                 registry: Any, log: Any, extra: str = "",
                 sessions: dict[str, Path] | None = None) -> tuple[Any, dict[str, Any]]:
    """An opened ``Indexer`` over ``workspace`` (agent ``scifact``; or agent -> workspace, one ``[[workspace]]``
    each) whose index is complete; returns it and index facts (seconds, files, chunks embedded, cache hits, chunk
    count). ``sessions``: agent -> its session transcripts folder. The index is rebuilt when the point-shaping
    code, ``bm25``, ``overlap`` or ``extra`` changed since the variant's last run; the embedding cache
    ``state/embeddings.sqlite3`` is shared by every variant."""
    from indexer.chunking import OVERLAP_RATIO
    from indexer.config import Settings, Workspace
    from indexer.daemon import Indexer
    from indexer.worker import index_once

    state_dir = state / f"state-{variant}"
    state_dir.mkdir(parents=True, exist_ok=True)
    shared_cache = (state / "embeddings.sqlite3").resolve()
    link = state_dir / "embeddings.sqlite3"
    if not (link.is_symlink() and link.resolve() == shared_cache):
        link.unlink(missing_ok=True)
        link.symlink_to(shared_cache)
    stamp_path = state_dir / "code.stamp"
    stamp = code_fingerprint(f"{bm25}|{OVERLAP_RATIO if overlap is None else overlap}" + (f"|{extra}" if extra else ""))
    reindex = not stamp_path.exists() or stamp_path.read_text() != stamp
    agents = workspace if isinstance(workspace, dict) else {"scifact": workspace}
    sessions = sessions or {}
    settings = Settings(state_dir=state_dir, workspace=tuple(Workspace(agent=a, path=p, sessions=sessions.get(a))
                                                             for a, p in agents.items()),
                        log_level="warning", bm25=bm25_variant(bm25))
    indexer = Indexer.open(settings, registry=with_overlap(registry, overlap), reindex=reindex)
    stamp_path.unlink(missing_ok=True)
    log(f"indexing variant {variant!r} ({'rebuild' if reindex else 'incremental'}) ...")
    started = time.monotonic()
    status = index_once(indexer)
    seconds = time.monotonic() - started
    stamp_path.write_text(stamp)
    chunks = sum(c["chunks"] for c in status["collections"].values())
    facts = {"seconds": round(seconds, 1), "chunks": chunks, "chunks_embedded": status["chunks_embedded"],
             "cache_hits": status["cache_hits"], "files": sum(c["files"] for c in status["collections"].values())}
    log(f"  {facts['files']} files, {chunks} chunks, {facts['chunks_embedded']} embedded, "
        f"{facts['cache_hits']} from cache, {seconds:.1f} s")
    return indexer, facts


MODELS = ("default", "minilm", "e5")  # ``--model``: the configured one, all-MiniLM-L6-v2, multilingual-e5-small


def model_registry(defaults: Any, model: str = "default") -> Any:
    """The plugins of ``defaults`` (``Settings``) with the text embedder ``model`` chooses: ``"default"`` what the
    settings say, ``"minilm"`` the built-in sentence-transformers model (its precision from the settings:
    ``QMD_INDEXER_PRECISION=int8`` forces int8), ``"e5"`` the ``e5`` plugin (``prefer = { text = "e5" }``)."""
    from indexer.plugins import load_registry, plugin_configs

    prefer = dict(defaults.prefer)
    if model == "minilm":
        prefer.pop("text", None)
    elif model == "e5":
        prefer["text"] = "e5"
    registry = load_registry(defaults.plugins, plugin_configs(defaults), prefer)
    registry.check_text_choice(prefer)
    return registry


def set_constants(items: Sequence[str], *modules: Any) -> str | None:
    """Apply ``NAME=VALUE`` overrides to the first of ``modules`` that has ``NAME`` (a bool reads 1/true/yes, any
    other constant its own type); returns an error line naming one no module has, else ``None``."""
    for item in items:
        name, _, value = item.partition("=")
        module = next((m for m in modules if hasattr(m, name)), None)
        if module is None:
            return f"--set: {' and '.join(m.__name__ for m in modules)} have no {name!r}"
        current = getattr(module, name)
        setattr(module, name, value.lower() in ("1", "true", "yes") if isinstance(current, bool)
                else type(current)(value))
    return None


def run_product(indexer: Any, data: SciFact, methods: Sequence[tuple[str, str, str]], prefetch: int, rrf_k: int,
                log: Any, mmr_lambda: float | None = None) -> dict[str, Scores]:
    """``methods``: (label, mode, fusion). Every query through ``Searcher.retrieve`` (with MMR at ``mmr_lambda``
    when given); returns label -> Scores."""
    from indexer.search import SearchParams

    out: dict[str, Scores] = {}
    for label, mode, fusion in methods:
        searcher = indexer.view.searcher(mode=mode, fusion=fusion, rrf_k=rrf_k, prefetch_limit=prefetch,
                                    mmr_lambda=mmr_lambda)
        scores = Scores()
        for qid, text in data.queries.items():
            searcher.warm(text)  # the query's embedding is not part of the ranking under test
            started = time.perf_counter()
            top = dedupe(doc_of(h.payload) for h in searcher.retrieve(SearchParams(text, k=prefetch, mode=mode)))
            seconds = time.perf_counter() - started
            deep = dedupe(doc_of(h.payload) for h in searcher.retrieve(
                SearchParams(text, k=max(RECALL_CHUNKS, prefetch), mode=mode)))
            scores.add(top[:10], deep[:100], data.qrels[qid], seconds)
        out[label] = scores
        m = scores.mean()
        log(f"  {label:<28} nDCG@10 {m['ndcg@10']:.4f}  recall@100 {m['recall@100']:.4f}")
    return out


def run_collapsed(indexer: Any, data: SciFact, fusion: str, prefetch: int, rrf_k: int) -> Scores:
    """Experiment, not the product path: each vector's list collapsed to one hit per document (its best chunk),
    keyed by document, before fusion with the product's ``fuse_scores``: a document whose best dense chunk and best BM25
    chunk differ gets credit from both lists."""
    from indexer.ranking import fuse_scores
    from indexer.store import Filter, Hit, Query

    searcher = indexer.view.searcher()
    scores = Scores()
    for qid, text in data.queries.items():
        dense = dict(searcher.embed_query(text))
        terms = indexer.terms.query(text)
        results = []
        for depth in (prefetch, max(RECALL_CHUNKS, prefetch)):
            lists = []
            for collection in indexer.collections:
                query = Query(limit=depth, dense=dense, sparse=terms,
                              filter=Filter())
                for hits in indexer.store.search(collection.name, query).values():
                    best: dict[str, Hit] = {}  # keyed by document, so fusion adds a document's lists up
                    for h in sorted(hits, key=lambda h: -h.score):
                        best.setdefault(doc_of(h.payload), Hit(doc_of(h.payload), h.score, h.payload))
                    if best:
                        lists.append(list(best.values()))
            pairs = [[(h.id, h.score) for h in hits] for hits in lists]  # a hit's id is its document
            results.append(dedupe(doc for doc, _ in fuse_scores(pairs, fusion, rrf_k, depth)))
        scores.add(results[0][:10], results[1][:100], data.qrels[qid], 0.0)
    return scores


def run_bm25s(data: SciFact, stem: bool) -> Scores | None:
    """Plain BM25 (bm25s, Lucene variant, k1=1.5, b=0.75, English stopwords) over whole documents; ``stem`` adds
    the Snowball English stemmer (PyStemmer). ``None`` when a library is missing."""
    try:
        import bm25s
    except ImportError:
        return None
    stemmer = None
    if stem:
        try:
            import Stemmer
        except ImportError:
            return None
        stemmer = Stemmer.Stemmer("english")
    ids = list(data.corpus)
    texts = [f"{title} {text}" for title, text in data.corpus.values()]
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False),
                    show_progress=False)
    qids = list(data.queries)
    tokens = bm25s.tokenize([data.queries[q] for q in qids], stopwords="en", stemmer=stemmer, show_progress=False)
    started = time.perf_counter()
    docs, _ = retriever.retrieve(tokens, k=min(100, len(ids)), show_progress=False, n_threads=1)
    per_query = (time.perf_counter() - started) / max(1, len(qids))
    scores = Scores()
    for qid, row in zip(qids, docs):
        ranked = [ids[int(i)] for i in row]
        scores.add(ranked[:10], ranked[:100], data.qrels[qid], per_query)
    return scores


def evaluate(data: SciFact, state: Path, registry: Any, prefetch: int = 100, rrf_k: int = 60,
             bm25: str = "default", overlap: float | None = None, experiments: bool = False,
             mmr: Sequence[float] = (), log: Any = lambda message: None) -> dict[str, Any]:
    """Index ``data`` under ``state`` with ``registry``'s embedder and score every method.

    Returns ``{"variant", "index": {seconds, chunks, chunks_embedded, cache_hits, files}, "results": {label:
    {"ndcg@10", "recall@100", "ms_per_query", "queries"}}}``; labels: ``dense``, ``keyword (Qdrant BM25)``,
    ``hybrid rrf``, ``hybrid dbsf``, ``hybrid dbsf + mmr<lambda>`` for each of ``mmr``, ``bm25s`` and
    ``bm25s + stemmer`` (when PyStemmer is installed), and with ``experiments`` the doc-collapsed fusions."""
    from indexer.config import Settings

    fusion = Settings(state_dir=state).fusion
    variant = "-".join([bm25] + ([f"ovl{overlap:g}"] if overlap is not None else []))
    state.mkdir(parents=True, exist_ok=True)
    workspace = state / "workspace"
    log(f"SciFact: {len(data.corpus)} documents, {len(data.queries)} queries; "
        f"{write_workspace(data.corpus, workspace)} notes written to {workspace}")
    indexer, facts = open_indexed(state, workspace, variant, bm25, overlap, registry, log)
    try:
        methods = [("dense", "dense", fusion), ("keyword (Qdrant BM25)", "keyword", fusion),
                   ("hybrid rrf", "hybrid", "rrf"), ("hybrid dbsf", "hybrid", "dbsf")]
        log(f"searching (prefetch_limit {prefetch}, rrf_k {rrf_k}, default fusion {fusion}) ...")
        results = run_product(indexer, data, methods, prefetch, rrf_k, log)
        for lam in mmr:
            results.update(run_product(indexer, data, [(f"hybrid dbsf + mmr{lam:g}", "hybrid", "dbsf")], prefetch,
                                       rrf_k, log, mmr_lambda=lam))
        if experiments:
            for name in ("rrf", "dbsf"):
                results[f"[exp] collapsed {name}"] = run_collapsed(indexer, data, name, prefetch, rrf_k)
    finally:
        indexer.close()
    for label, stem in (("bm25s", False), ("bm25s + stemmer", True)):
        scores = run_bm25s(data, stem)
        if scores is not None:
            results[label] = scores
    return {"variant": variant, "index": facts, "results": {label: s.mean() for label, s in results.items()}}


# -- command line -------------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="BEIR SciFact folder [%(default)s]")
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE, help="workspace, index and cache [%(default)s]")
    parser.add_argument("--split", choices=("test", "train"), default="test",
                        help="qrels split: report on test, tune on train [%(default)s]")
    parser.add_argument("--prefetch-limit", type=int, default=None, help="per-vector depth (default: the product's)")
    parser.add_argument("--rrf-k", type=int, default=None, help="RRF constant (default: the product's)")
    parser.add_argument("--bm25", default="default", help="BM25 variant: default, word, nostem, avglen<N>")
    parser.add_argument("--overlap", type=float, default=None, help="chunk overlap ratio (default: the product's)")
    parser.add_argument("--experiments", action="store_true", help="also doc-collapsed fusion (not the product path)")
    parser.add_argument("--mmr", type=float, action="append", default=[], metavar="LAMBDA",
                        help="also hybrid dbsf with MMR at this lambda (repeatable)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--model", choices=MODELS, default="default",
                        help="text embedder: the configured one, minilm or e5 [%(default)s]")
    parser.add_argument("--sample", type=int, default=None, metavar="N",
                        help="smoke test: only N queries and a matching slice of the corpus (figures not comparable)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        data = load_scifact(args.data.resolve(), args.split)
    except DataMissing as exc:
        print(f"eval: {exc}\nThe evaluation needs BEIR SciFact (corpus.jsonl[.gz], queries.jsonl, qrels/) at "
              f"{DEFAULT_DATA} or --data DIR.", file=sys.stderr)
        return 2
    if args.sample:
        data = sample(data, args.sample)
        log(f"SAMPLE RUN (--sample {args.sample}): {len(data.queries)} queries, {len(data.corpus)} documents; "
            f"figures are not comparable with a full run")

    import structlog

    from indexer.config import Settings
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only during the run
    defaults = Settings(state_dir=args.state)
    prefetch = args.prefetch_limit or defaults.prefetch_limit
    rrf_k = args.rrf_k or defaults.rrf_k
    registry = model_registry(defaults, args.model)
    run = evaluate(data, args.state, registry, prefetch=prefetch, rrf_k=rrf_k, bm25=args.bm25, overlap=args.overlap,
                   experiments=args.experiments, mmr=args.mmr, log=log)
    facts, table, variant = run["index"], run["results"], run["variant"]
    embedder = registry.embedders["text"]
    print(f"\nSciFact {args.split}: {len(data.queries)} queries, {len(data.corpus)} documents -> {facts['chunks']} "
          f"chunks; model {embedder.model_id}; BM25 variant {args.bm25!r}; prefetch_limit {prefetch}; "
          f"rrf_k {rrf_k}; product default fusion {defaults.fusion}")
    print(f"{'method':<30} {'nDCG@10':>8} {'R@100':>8} {'ms/query':>9}")
    for label, m in table.items():
        mark = " <- default" if label == f"hybrid {defaults.fusion}" else ""
        print(f"{label:<30} {m['ndcg@10']:>8.4f} {m['recall@100']:>8.4f} {m['ms_per_query']:>9.1f}{mark}")
    print("nDCG@10: trec_eval ndcg_cut (gain = qrels grade, log2 discount), implemented in benchmarks/eval.py; "
          "documents ranked by their best chunk. bm25s: whole documents, English stopwords.")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"split": args.split, "variant": variant, "prefetch_limit": prefetch,
                                         "rrf_k": rrf_k, "index": facts, "results": table}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
