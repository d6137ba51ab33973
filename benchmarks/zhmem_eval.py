"""Retrieval quality on the zhmem dev set (Chinese agent memory, questions in Chinese and English) through the
product's own indexing and search path.

Run from the repository root: ``python -m benchmarks.zhmem_eval --model e5`` (``--help`` for options).

What it does, in one run:

1. Reads the set from ``--data`` (default ``../shared/data/zhmem`` relative to the repository): ``agents/`` (one
   workspace per agent: ``MEMORY.md`` and ``memory/YYYY-MM-DD.md``), ``queries.jsonl`` (60 questions: 40 in Chinese,
   20 in English about notes written in Chinese, 5 unanswerable) and ``score.py`` (the set's own scorer, imported so
   its metrics are used exactly). A missing folder or file is reported on stderr and the process exits with status 2.
2. Indexes the three agents as three ``[[workspace]]`` tables of one daemon (agent id = folder name) with the text
   embedder ``--model`` chooses (``benchmarks.eval.model_registry``) into Qdrant Edge under
   ``<state>/state-<variant>-<model>/``.
3. Asks every question as the README says (``agent`` and ``k`` = 10) through ``Searcher.answer`` (what
   ``POST /search`` answers), in hybrid, dense and keyword mode, as of the set's last day (its relative dates,
   ``last week``, ``上周二``, are read against 2026-11-30).
4. Scores every run with ``score.py``: hit@5 and file nDCG@10 by language and by type over the 55 answerable
   questions; and the ``relevant`` flag of the 5 unanswerable ones (how many are flagged ``relevant: false``) next
   to the answerable ones flagged ``true``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "zhmem"
DEFAULT_STATE = REPO / ".zhmem"
K = 10  # hits asked per question, as the set's README says
AS_OF = "2026-11-30T12:00:00"  # the day after the notes' last day: relative dates in questions are read against it


class DataMissing(Exception):
    """The set's folder or one of its files is absent."""


@dataclass
class ZhSet:
    root: Path
    queries: list[dict[str, Any]]
    score: Any  # the set's score.py, imported
    agents: list[str]


def load_zhset(data: Path) -> ZhSet:
    """Read the set. Raises ``DataMissing`` naming what is absent."""
    if not data.is_dir():
        raise DataMissing(f"zhmem folder not found: {data}")
    for name in ("agents", "queries.jsonl", "score.py"):
        if not (data / name).exists():
            raise DataMissing(f"{data}: {name} not found")
    spec = importlib.util.spec_from_file_location("zhmem_score", data / "score.py")
    assert spec is not None and spec.loader is not None
    score = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(score)
    queries = score.load_queries(data / "queries.jsonl")
    agents = sorted(p.name for p in (data / "agents").iterdir() if p.is_dir())
    return ZhSet(data, queries, score, agents)


def run_product(zh: ZhSet, indexer: Any, mode: str, fusion: str | None = None,
                every_list_votes: bool = False) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """Every question through ``Searcher.answer`` (in ``fusion``, default the product's; with ``every_list_votes``
    the BM25 list votes whatever it matched, as before ``indexer.ranking.keyword_votes``); returns (query id ->
    ranked results, query id -> ``relevant``)."""
    from indexer import candidates

    searcher = indexer.view.searcher(mode=mode, **({"fusion": fusion} if fusion else {}))
    rule = candidates.keyword_votes
    if every_list_votes:
        candidates.keyword_votes = lambda *_: True  # type: ignore[assignment]
    try:
        return _ask(zh, searcher, mode)
    finally:
        candidates.keyword_votes = rule  # type: ignore[assignment]


def _ask(zh: ZhSet, searcher: Any, mode: str) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    from indexer.schema import SearchRequest

    run, flags = {}, {}
    for q in zh.queries:
        hits, flag, *_ = searcher.answer(SearchRequest(query=q["query"], agent=q["agent"], k=K, mode=mode,
                                                      as_of=AS_OF))
        results = [{"path": h["path"], "start_line": h["start_line"], "end_line": h["end_line"], "score": h["score"]}
                   for h in hits]
        run[q["id"]] = zh.score.ranked_results(results, q["agent"])
        flags[q["id"]] = flag
    return run, flags


def summary(zh: ZhSet, run: dict[str, list[dict[str, Any]]], flags: dict[str, Any]) -> dict[str, Any]:
    """The scorer's report plus the ``relevant`` flags: unanswerable questions flagged false, answerable true."""
    _, report = zh.score.evaluate(zh.queries, run)
    negatives = [q["id"] for q in zh.queries if not q["relevant"]]
    answerable = [q["id"] for q in zh.queries if q["relevant"]]
    report["negatives_flagged"] = [sum(1 for qid in negatives if flags[qid] is False), len(negatives)]
    report["answerable_flagged_relevant"] = [sum(1 for qid in answerable if flags[qid]), len(answerable)]
    return report


def print_table(results: dict[str, dict[str, Any]]) -> None:
    print(f"{'run':<22}{'zh hit@5':>9}{'en hit@5':>9}{'all hit@5':>10}{'zh nDCG':>8}{'en nDCG':>8}{'all nDCG':>9}"
          f"  {'kw':>5}{'sem':>5}{'time':>5}{'conv':>5}  unanswerable flagged | answerable relevant")
    for label, r in results.items():
        lang, types = r["by_lang"], r["by_type"]
        line = (f"{label:<22}{lang['zh']['hit@5']:>9.3f}{lang['en']['hit@5']:>9.3f}{r['overall']['hit@5']:>10.3f}"
                f"{lang['zh']['ndcg@10']:>8.3f}{lang['en']['ndcg@10']:>8.3f}{r['overall']['ndcg@10']:>9.3f}  ")
        line += "".join(f"{types[t]['hit@5']:>5.2f}" for t in ("keyword", "semantic", "temporal", "conversation"))
        neg, ans = r["negatives_flagged"], r["answerable_flagged_relevant"]
        print(f"{line}  {neg[0]}/{neg[1]} | {ans[0]}/{ans[1]}")
    print("hit@5 line level, nDCG@10 file level (score.py), over the answerable questions; by type: hit@5")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.zhmem_eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the zhmem folder [%(default)s]")
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE, help="index and cache [%(default)s]")
    parser.add_argument("--variant", default="product", help="index name under --state")
    parser.add_argument("--model", choices=("default", "minilm", "e5"), default="default",
                        help="text embedder: the configured one, minilm or e5 [%(default)s]")
    parser.add_argument("--modes", default="hybrid,dense,keyword", help="search modes to run [%(default)s]")
    parser.add_argument("--fusions", action="store_true",
                        help="also hybrid in rrf and dbsf, each with and without the keyword vote rule")
    parser.add_argument("--runs", type=Path, default=None, help="write each run here as score.py-readable JSONL")
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        zh = load_zhset(args.data.resolve())
    except DataMissing as exc:
        print(f"zhmem_eval: {exc}\nThe evaluation needs the zhmem set (agents/, queries.jsonl, score.py) at "
              f"{DEFAULT_DATA} or --data DIR.", file=sys.stderr)
        return 2

    import structlog

    from benchmarks.eval import model_registry, open_indexed
    from indexer.config import Settings

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    defaults = Settings(state_dir=args.state)
    registry = model_registry(defaults, args.model)
    log(f"zhmem: {len(zh.queries)} questions over agents {', '.join(zh.agents)}")
    agents = {agent: zh.root / "agents" / agent for agent in zh.agents}
    indexer, facts = open_indexed(args.state.resolve(), agents, f"{args.variant}-{args.model}", "default", None,
                                  registry, log, "zhmem")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    results: dict[str, dict[str, Any]] = {}
    try:
        started = time.monotonic()
        labels = [(f"product {mode}", mode, None, False) for mode in args.modes.split(",") if mode]
        if args.fusions:
            labels += [(f"hybrid {f}{', all vote' if every else ''}", "hybrid", f, every)
                       for f in ("rrf", "dbsf") for every in (False, True)]
        for label, mode, fusion, every in labels:
            run, flags = run_product(zh, indexer, mode, fusion, every)
            runs[label] = run
            results[label] = summary(zh, run, flags)
        log(f"product searches: {time.monotonic() - started:.1f} s")
    finally:
        indexer.close()
    embedder = registry.embedders["text"]
    print(f"\nzhmem: {len(zh.queries)} questions, {facts['files']} notes -> {facts['chunks']} chunks "
          f"(index {facts['seconds']} s); model {embedder.model_id}; k {K}; as of {AS_OF}")
    print_table(results)
    if args.runs:
        args.runs.mkdir(parents=True, exist_ok=True)
        for label, run in runs.items():
            with open(args.runs / (label.replace(" ", "_") + ".jsonl"), "w", encoding="utf-8") as handle:
                handle.writelines(json.dumps({"id": qid, "results": r}, ensure_ascii=False) + "\n"
                                  for qid, r in run.items())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"index": facts, "k": K, "model": embedder.model_id, "results": results},
                                        indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
