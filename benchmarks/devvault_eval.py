"""Retrieval quality on the devvault dev set through the product's own indexing and search path.

Run from the repository root: ``python -m benchmarks.devvault_eval`` (``--help`` for options).

What it does, in one run:

1. Reads the dev set from ``--data`` (default ``../shared/data/devvault`` relative to the repository): ``notes/``
   (242 markdown notes), ``queries.jsonl`` (60 labelled questions, 8 of them unanswerable) and ``score.py`` (the
   set's own scorer, imported so its metrics are used exactly). A missing folder or file is reported on stderr and
   the process exits with status 2.
2. Copies the notes into a workspace, ``<state>/workspace/memory/<note path>`` (unchanged files are not rewritten,
   so their ``mtime`` and the index stay valid), and indexes it with the daemon's code (``Indexer.open`` +
   ``Indexer.index_once``, via the SciFact evaluation's ``open_indexed``) into Qdrant Edge under
   ``<state>/state-<variant>/``. The embedding cache ``<state>/embeddings.sqlite3`` is shared and kept between
   runs: a re-run whose chunk texts are unchanged embeds nothing.
3. Runs every question through ``Searcher.search`` (what ``POST /search`` answers, line ranges of the hits'
   snippets included) with ``k = --k`` hits, in modes ``dense``, ``keyword`` and ``hybrid`` (fusions ``dbsf`` and
   ``rrf``), and maps ``memory/X.md`` back to ``notes/X.md``.
4. Computes two plain baselines in the same run, over the notes cut at their headings (CommonMark headings, the
   product's ``heading_lines``; a section runs from its heading to the next one):

   - ``bm25s sections``: bm25s (Lucene variant, k1 = 1.5, b = 0.75, English stopwords, no stemming), top 20
     sections; the dev set README's reference baseline (0.771 / 0.827).
   - ``script``: each section with its file path prepended (``notes/X.md`` on the first line), embedded whole by
     the product's text model (the model truncates past its window) and BM25-encoded by Qdrant Edge's ``Bm25``
     (the product's configuration) into an Edge shard, searched per vector at the product's prefetch depth and
     fused with DBSF (and RRF) by ``indexer.ranking.fuse_scores``.
5. Scores every run with the dev set's ``score.py``: file nDCG@10, line hit@5, recall@10 over the 52 answerable
   questions, and the top-1 score of the 8 unanswerable ones next to the answerable median (unanswerable
   separation). With ``--runs DIR`` it also writes each run as a JSONL file ``score.py`` reads.

Figures in the issue were measured with ``k = 20`` for every method (bm25s's top 20 sections included).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "devvault"
DEFAULT_STATE = REPO / ".devvault"
K = 20  # hits asked per query, for every method
FLOOR_K = 6  # hits the relevance floor looks at: the product's default k


class DataMissing(Exception):
    """The dev set folder or one of its files is absent."""


@dataclass
class DevSet:
    root: Path
    queries: list[dict[str, Any]]
    score: Any  # the dev set's score.py, imported


def load_devset(data: Path) -> DevSet:
    """Read the dev set. Raises ``DataMissing`` naming what is absent."""
    if not data.is_dir():
        raise DataMissing(f"dev set folder not found: {data}")
    for name in ("notes", "queries.jsonl", "score.py"):
        if not (data / name).exists():
            raise DataMissing(f"{data}: {name} not found")
    spec = importlib.util.spec_from_file_location("devvault_score", data / "score.py")
    score = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(score)
    return DevSet(data, score.load_queries(str(data / "queries.jsonl")), score)


def write_workspace(notes: Path, workspace: Path) -> int:
    """Make ``workspace/memory/`` hold exactly the notes (same relative paths); returns how many were written."""
    memory = workspace / "memory"
    memory.mkdir(parents=True, exist_ok=True)
    wanted = {p.relative_to(notes).as_posix(): p for p in notes.rglob("*.md") if p.is_file()}
    for stale in [p for p in memory.rglob("*.md") if p.relative_to(memory).as_posix() not in wanted]:
        stale.unlink()
    written = 0
    for rel, source in wanted.items():
        target = memory / rel
        data = source.read_bytes()
        try:
            if target.read_bytes() == data:
                continue
        except FileNotFoundError:
            target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written += 1
    return written


def dev_path(rel: str) -> str:
    """Workspace path ``memory/X.md`` -> the dev set's ``notes/X.md``."""
    return "notes/" + rel.removeprefix("memory/")


# -- scoring ------------------------------------------------------------------------------------------------------
def score_run(dev: DevSet, run: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The dev set's metrics of ``run`` (query id -> results in rank order, with path/start_line/end_line/score).
    score.py ranks by score; a re-ranking stage (MMR) keeps the fused scores, so each score is first lowered to the
    running minimum (ties keep their order), which leaves the rank order and the top-1 score as the product gave."""
    ranked = {}
    for qid, results in run.items():
        floor, monotone = float("inf"), []
        for r in results:
            floor = min(floor, r["score"])
            monotone.append(dict(r, score=floor))
        ranked[qid] = dev.score.ranked_results(monotone)
    rows, by_type, overall = dev.score.evaluate(dev.queries, ranked)
    negatives = [r["top1"] for r in rows if r["type"] == "negative" and r["top1"] is not None]
    return {"overall": overall, "by_type": by_type, "rows": rows,
            "neg_top1_median": statistics.median(negatives) if negatives else None,
            "neg_top1_max": max(negatives) if negatives else None}


# -- baselines ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Section:
    path: str  # notes/X.md
    start_line: int
    end_line: int
    text: str


def heading_sections(notes: Path) -> list[Section]:
    """Every note cut at its CommonMark headings: a section runs from a heading (or line 1) to the line before the
    next heading; blank edges trimmed; blank sections dropped."""
    from indexer.chunking import heading_lines

    out = []
    for file in sorted(notes.rglob("*.md")):
        text = file.read_text(encoding="utf-8", errors="replace")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        cuts = sorted({0} | heading_lines(text))
        for i, start in enumerate(cuts):
            end = (cuts[i + 1] if i + 1 < len(cuts) else len(lines)) - 1
            while start <= end and not lines[start].strip():
                start += 1
            while end >= start and not lines[end].strip():
                end -= 1
            if start <= end:
                out.append(Section("notes/" + file.relative_to(notes).as_posix(), start + 1, end + 1,
                                   "\n".join(lines[start : end + 1])))
    return out


def run_bm25s(dev: DevSet, sections: Sequence[Section]) -> dict[str, list[dict[str, Any]]] | None:
    """bm25s over heading sections, top ``K``; ``None`` when bm25s is not installed."""
    try:
        import bm25s
    except ImportError:
        return None
    retriever = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
    retriever.index(bm25s.tokenize([s.text for s in sections], stopwords="en", show_progress=False),
                    show_progress=False)
    tokens = bm25s.tokenize([q["query"] for q in dev.queries], stopwords="en", show_progress=False)
    docs, scores = retriever.retrieve(tokens, k=K, show_progress=False, n_threads=1)
    run = {}
    for q, row, row_scores in zip(dev.queries, docs, scores):
        run[q["id"]] = [{"path": sections[int(i)].path, "start_line": sections[int(i)].start_line,
                         "end_line": sections[int(i)].end_line, "score": float(s)} for i, s in zip(row, row_scores)]
    return run


def run_script(dev: DevSet, sections: Sequence[Section], state: Path, embedder: Any, bm25: Any, cache: Any,
               prefetch: int, log: Callable[[str], None]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The section-chunk script: path + section text, dense (the product's model) and Qdrant Edge BM25 in one Edge
    shard, fused with ``indexer.ranking.fuse_scores``. Returns label -> run."""
    import numpy as np

    from indexer.cache import cache_key
    from indexer.points import SPARSE, Filter, Hit, Payload, Point, Query, point_id
    from indexer.ranking import fuse_scores
    from indexer.store import EdgeStore

    texts = [f"{s.path}\n{s.text}" for s in sections]
    keys = [cache_key(embedder.model_id, t.encode("utf-8")) for t in texts]
    cached = cache.get_many(list(dict.fromkeys(keys)), embedder.dim)
    missing = [i for i, key in enumerate(keys) if key not in cached]
    if missing:
        log(f"script baseline: embedding {len(missing)} sections ...")
        fresh = embedder.encode([texts[i] for i in missing])
        cache.put_many([(keys[i], v) for i, v in zip(missing, fresh)])
        cached.update({keys[i]: v for i, v in zip(missing, fresh)})
    root = state / "script-store"
    shutil.rmtree(root, ignore_errors=True)
    store = EdgeStore(root)
    name = "script"
    store.ensure_collection(name, {"text": int(embedder.dim)})
    points = []
    for i, (s, text) in enumerate(zip(sections, texts)):
        terms = bm25.document(text)
        sparse = {SPARSE: terms} if terms else {}
        points.append(Point(point_id(name, s.path, s.start_line), {"text": np.asarray(cached[keys[i]])}, sparse,
                            Payload(path=s.path, abs_path=s.path, start_line=s.start_line, end_line=s.end_line)))
    for start in range(0, len(points), 512):
        store.replace_file(name, "-", "-", points[start : start + 512])
    labels = {"script dense": "dense", "script BM25": "keyword", "script dbsf": "dbsf", "script rrf": "rrf"}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {label: {} for label in labels}
    for q in dev.queries:
        query = Query(limit=prefetch, dense={"text": embedder.embed_query(q["query"])}, sparse=bm25.query(q["query"]),
                      filter=Filter())
        lists = store.search(name, query)
        dense, sparse = lists.get("text", []), lists.get(SPARSE, [])
        for label, how in labels.items():
            if how == "dense":
                hits = dense
            elif how == "keyword":
                hits = sparse
            else:
                found = {h.id: h for h in dense + sparse}
                pairs = [[(h.id, h.score) for h in hits] for hits in (dense, sparse) if hits]
                hits = [Hit(pid, score, found[pid].payload) for pid, score in fuse_scores(pairs, how, 60, prefetch)]
            runs[label][q["id"]] = [{"path": h.payload.path, "start_line": h.payload.start_line,
                                     "end_line": h.payload.end_line, "score": h.score} for h in hits[:K]]
    store.close()
    return runs


# -- the product --------------------------------------------------------------------------------------------------
def run_product(dev: DevSet, indexer: Any, methods: Sequence[tuple[str, str, str]], prefetch: int,
                mmr_lambda: float | None = None,
                flags: dict[str, dict[str, bool | None]] | None = None) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """``methods``: (label, mode, fusion). Every question through ``Searcher.answer`` (what ``POST /search``
    answers); label -> run, and into ``flags`` label -> question id -> the answer's ``relevant``."""
    from indexer.search import SearchParams

    runs = {}
    for label, mode, fusion in methods:
        searcher = indexer.view.searcher(mode=mode, fusion=fusion, prefetch_limit=prefetch, mmr_lambda=mmr_lambda)
        run, said = {}, {}
        for q in dev.queries:
            hits, said[q["id"]], *_ = searcher.answer(SearchParams(q["query"], k=K, mode=mode))
            run[q["id"]] = [dict(h, path=dev_path(h["path"])) for h in hits]
        runs[label] = run
        if flags is not None:
            flags[label] = said
    return runs


def chunk_count(notes: Path, registry: Any) -> tuple[int, int]:
    """``(files, chunks)`` the markdown extractor makes of every ``*.md`` under ``notes`` (nothing embedded)."""
    from indexer.api import ExtractContext, FileInfo
    from indexer.builtin.markdown import MarkdownExtractor

    embedder = registry.embedders["text"]
    context = ExtractContext(embedder.max_tokens, embedder.token_offsets)
    extractor = MarkdownExtractor()
    files = sorted(p for p in notes.rglob("*.md") if p.is_file())
    chunks = 0
    for path in files:
        info = FileInfo(path, "memory/" + path.relative_to(notes).as_posix(), "markdown", path.stat().st_size)
        chunks += sum(1 for _ in extractor.extract(info, context))
    return len(files), chunks


def top_right(q: dict[str, Any], results: Sequence[dict[str, Any]]) -> bool:
    """Whether the first result overlaps a relevant line range of ``q``."""
    return bool(results) and any(r["path"] == results[0]["path"] and r["start_line"] <= results[0]["end_line"]
                                 and r["end_line"] >= results[0]["start_line"] for r in q["relevant"])


def floor_report(dev: DevSet, runs: dict[str, dict[str, list[dict[str, Any]]]],
                 flags: dict[str, dict[str, bool | None]], floor: float) -> dict[str, list[int]]:
    """"Nothing relevant" on the dev set: the best raw dense score among the first ``FLOOR_K`` hits of the
    unanswerable and the answerable questions, and the answers' own ``relevant`` flag (``indexer.relevance``,
    each of the first hits on its own evidence): how many unanswerable questions it calls not relevant, and how many
    questions whose top hit is right it calls relevant. Returns label -> ``[unanswerable said false,
    unanswerable, right said true, right]``."""
    counts: dict[str, list[int]] = {}
    print(f"\nnothing relevant: best dense cosine among the first {FLOOR_K} hits; relevance_floor {floor}")
    for label, run in runs.items():
        if label not in flags or label == "product keyword":
            continue
        best = {q["id"]: max([h["dense_score"] for h in run[q["id"]][:FLOOR_K] if h.get("dense_score") is not None],
                             default=None) for q in dev.queries}
        neg = sorted(best[q["id"]] for q in dev.queries if not q["relevant"] and best[q["id"]] is not None)
        ans = sorted(best[q["id"]] for q in dev.queries if q["relevant"] and best[q["id"]] is not None)
        caught = sum(flags[label][q["id"]] is False for q in dev.queries if not q["relevant"])
        right = [q["id"] for q in dev.queries if q["relevant"] and top_right(q, run[q["id"]])]
        said = sum(flags[label][qid] is True for qid in right)
        print(f"  {label:<22} unanswerable {' '.join(f'{x:.3f}' for x in neg)} | answerable min/p10/median "
              f"{ans[0]:.3f}/{ans[len(ans) // 10]:.3f}/{statistics.median(ans):.3f} | relevant=false: "
              f"{caught}/{len(neg)} unanswerable; relevant=true: {said}/{len(right)} whose top hit is right")
        counts[label] = [caught, len(neg), said, len(right)]
    return counts


# -- command line -------------------------------------------------------------------------------------------------
def print_table(results: dict[str, dict[str, Any]], types: Sequence[str]) -> None:
    head = f"{'method':<26}{'nDCG@10':>8}{'hit@5':>7}{'R@10':>7}{'span@5':>7}"
    head += "".join(f"{t[:8]:>9}" for t in types) + f"{'neg top1':>10}{'ans top1':>10}"
    print(head)
    print(" " * 55 + "".join(f"{'nDCG':>9}" for _ in types) + f"{'median':>10}{'median':>10}")
    for label, r in results.items():
        o = r["overall"]
        line = f"{label:<26}{o['ndcg@10']:>8.3f}{o['hit@5']:>7.3f}{o['recall@10']:>7.3f}{o['span@5']:>7.1f}"
        line += "".join(f"{r['by_type'][t]['ndcg@10']:>9.3f}" for t in types)
        neg = r["neg_top1_median"]
        line += f"{neg:>10.3f}" if neg is not None else f"{'-':>10}"
        line += f"{o['top1_median']:>10.3f}" if o["top1_median"] is not None else f"{'-':>10}"
        print(line)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.devvault_eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the devvault folder [%(default)s]")
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE, help="workspace, index and cache [%(default)s]")
    parser.add_argument("--variant", default="product", help="index name under --state (reuse one per chunking)")
    parser.add_argument("--prefetch-limit", type=int, default=None, help="per-vector depth (default: the product's)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a constant of indexer.chunking or indexer.sections for this run (e.g. "
                             "MERGE_TOKENS=64); give the run its own --variant")
    parser.add_argument("--bm25", default="default", help="BM25 variant as in benchmarks.eval: default, word, "
                        "nostem, avglen<N>; give the run its own --variant")
    parser.add_argument("--mmr", type=float, action="append", default=[], metavar="LAMBDA",
                        help="also hybrid dbsf with MMR at this lambda (repeatable)")
    parser.add_argument("--no-baselines", action="store_true", help="skip the bm25s and script baselines")
    parser.add_argument("--vault", type=Path, default=None,
                        help="also count the chunks the markdown extractor makes of the notes under this folder")
    parser.add_argument("--runs", type=Path, default=None, help="write each run here as score.py-readable JSONL")
    parser.add_argument("--per-query", action="store_true", help="print per-query nDCG@10 / hit@5 per method")
    parser.add_argument("--model", choices=("default", "minilm", "e5"), default="default",
                        help="text embedder: the configured one, minilm or e5; give the run its own --variant")
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        dev = load_devset(args.data.resolve())
    except DataMissing as exc:
        print(f"devvault_eval: {exc}\nThe evaluation needs the devvault dev set (notes/, queries.jsonl, score.py) "
              f"at {DEFAULT_DATA} or --data DIR.", file=sys.stderr)
        return 2

    import structlog

    from benchmarks.eval import model_registry, open_indexed, set_constants
    from indexer import chunking, sections
    from indexer.config import Settings

    problem = set_constants(args.set, chunking, sections)
    if problem:
        print(f"devvault_eval: {problem}", file=sys.stderr)
        return 2
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    defaults = Settings(state_dir=args.state)
    prefetch = args.prefetch_limit or defaults.prefetch_limit
    registry = model_registry(defaults, args.model)
    embedder = registry.embedders["text"]
    state = args.state.resolve()
    workspace = state / "workspace"
    notes = dev.root / "notes"
    log(f"devvault: {len(dev.queries)} queries; {write_workspace(notes, workspace)} notes written to {workspace}")

    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    flags: dict[str, dict[str, bool | None]] = {}
    indexer, facts = open_indexed(state, workspace, args.variant, args.bm25, None, registry, log)
    try:
        started = time.monotonic()
        methods = [("product dense", "dense", defaults.fusion), ("product keyword", "keyword", defaults.fusion),
                   ("product hybrid dbsf", "hybrid", "dbsf"), ("product hybrid rrf", "hybrid", "rrf")]
        runs.update(run_product(dev, indexer, methods, prefetch, flags=flags))
        for lam in args.mmr:
            runs.update(run_product(dev, indexer, [(f"product hybrid dbsf mmr{lam:g}", "hybrid", "dbsf")], prefetch,
                                    mmr_lambda=lam, flags=flags))
        log(f"product searches: {time.monotonic() - started:.1f} s")
        if not args.no_baselines:
            sections = heading_sections(notes)
            log(f"baselines over {len(sections)} heading sections ...")
            bm25s_run = run_bm25s(dev, sections)
            if bm25s_run is not None:
                runs["bm25s sections"] = bm25s_run
            runs.update(run_script(dev, sections, state, embedder, indexer.terms, indexer._cache, prefetch,
                                   log))
    finally:
        indexer.close()

    results = {label: score_run(dev, run) for label, run in runs.items()}
    types = [t for t in dev.score.TYPES if t != "negative"]
    print(f"\ndevvault: {len(dev.queries)} queries ({sum(1 for q in dev.queries if q['relevant'])} answerable), "
          f"{facts['files']} notes -> {facts['chunks']} chunks (index {facts['seconds']} s, "
          f"{facts['chunks_embedded']} embedded, {facts['cache_hits']} cached); model {embedder.model_id}; "
          f"k {K}; prefetch_limit {prefetch}; product default fusion {defaults.fusion}"
          + (f"; chunking overrides {', '.join(args.set)}" if args.set else ""))
    print_table(results, types)
    print("nDCG@10: file level, deduplicated by path; hit@5: line overlap of the first 5 hits; both from the dev "
          "set's score.py over the answerable questions. neg top1: median top-1 score of the unanswerable questions.")
    relevance_counts = floor_report(dev, runs, flags, defaults.relevance_floor)
    if args.per_query:
        labels = list(results)
        print("\nper query (nDCG@10 / hit@5):")
        print(f"{'id':<5}{'type':<9}" + "".join(f"{label[-14:]:>16}" for label in labels))
        for i, q in enumerate(dev.queries):
            cells = []
            for label in labels:
                row = results[label]["rows"][i]
                cells.append(f"{'-':>16}" if row["ndcg@10"] is None
                             else f"{row['ndcg@10']:>10.2f} / {row['hit@5']:.0f}")
            print(f"{q['id']:<5}{q['type']:<9}" + "".join(cells))
    if args.vault is not None:
        if not args.vault.is_dir():
            print(f"devvault_eval: --vault folder not found: {args.vault}", file=sys.stderr)
            return 2
        files, chunks = chunk_count(args.vault, registry)
        print(f"\nchunk count: {files} notes under {args.vault} -> {chunks} chunks")
    if args.runs:
        args.runs.mkdir(parents=True, exist_ok=True)
        for label, run in runs.items():
            with open(args.runs / (label.replace(" ", "_") + ".jsonl"), "w", encoding="utf-8") as handle:
                handle.writelines(json.dumps({"id": qid, "results": results_}) + "\n" for qid, results_ in run.items())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"index": facts, "prefetch_limit": prefetch, "k": K, "results": {
            label: {"overall": r["overall"], "by_type": r["by_type"], "neg_top1_median": r["neg_top1_median"]}
            for label, r in results.items()}, "relevant": relevance_counts}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
