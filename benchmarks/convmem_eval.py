"""Retrieval quality on the convmem dev set (conversation memory) through the product's own indexing and search path.

Run from the repository root: ``python -m benchmarks.convmem_eval`` (``--help`` for options).

What it does, in one run:

1. Reads the dev set from ``--data`` (default ``../shared/data/convmem`` relative to the repository): ``agents/``
   (one workspace per agent: ``MEMORY.md`` and ``memory/YYYY-MM-DD.md``, one line per dialogue turn),
   ``queries.jsonl`` (354 questions, the evidence turns labelled) and ``score.py`` (the set's own scorer, imported so
   its metrics are used exactly). A missing folder or file is reported on stderr and the process exits with status 2.
2. Indexes the three agents as three ``[[workspace]]`` tables of one daemon (agent id = folder name) with the
   daemon's code (``Indexer.open`` + ``index_once``) into Qdrant Edge under ``<state>/state-<variant>/``; the
   embedding cache ``<state>/embeddings.sqlite3`` is shared between variants and runs.
3. Asks every question as the README says (``POST /search {"query", "agent", "k": 10}``), through
   ``Searcher.search`` (what ``POST /search`` answers: the hits' line ranges are their snippets'), in the default
   hybrid mode and in dense and keyword mode, and with ``--mmr`` lambdas.
4. Scores every run with ``score.py``: hit@5, recall@5, file nDCG@10 and span@5 per category (1 multi-hop,
   2 temporal, 3 open-domain, 4 single-hop) and overall; with ``--runs DIR`` it writes each run as a JSONL file
   ``score.py`` reads.
5. Prints the ``relevant`` flag's confusion counts: of the questions whose top hit overlaps an evidence turn, how
   many the answer flagged ``relevant: true``.
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
DEFAULT_DATA = REPO.parent / "shared" / "data" / "convmem"
DEFAULT_STATE = REPO / ".convmem"
K = 10  # hits asked per question, as the dev set's README says
CATEGORIES = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop", "ALL": "ALL"}


class DataMissing(Exception):
    """The dev set folder or one of its files is absent."""


@dataclass
class ConvSet:
    root: Path
    queries: list[dict[str, Any]]
    score: Any  # the dev set's score.py, imported
    agents: list[str]


def load_convset(data: Path) -> ConvSet:
    """Read the dev set. Raises ``DataMissing`` naming what is absent."""
    if not data.is_dir():
        raise DataMissing(f"dev set folder not found: {data}")
    for name in ("agents", "queries.jsonl", "score.py"):
        if not (data / name).exists():
            raise DataMissing(f"{data}: {name} not found")
    spec = importlib.util.spec_from_file_location("convmem_score", data / "score.py")
    score = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(score)
    queries = [json.loads(line) for line in (data / "queries.jsonl").read_text().splitlines() if line.strip()]
    agents = sorted(p.name for p in (data / "agents").iterdir() if p.is_dir())
    return ConvSet(data, queries, score, agents)


def run_product(conv: ConvSet, indexer: Any, mode: str,
                overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every question through ``Searcher.answer`` (what ``POST /search`` answers); returns (query id -> results,
    query id -> its ``relevant`` flag)."""
    from indexer.schema import SearchRequest

    searcher = indexer.view.searcher(**overrides)
    run, flags = {}, {}
    for q in conv.queries:
        hits, flag, *_ = searcher.answer(SearchRequest(query=q["query"], agent=q["agent"], k=K, mode=mode))
        run[q["id"]] = [{"path": h["path"], "start_line": h["start_line"], "end_line": h["end_line"],
                         "score": h["score"]} for h in hits]
        flags[q["id"]] = flag
    return run, flags


def top_right(q: dict[str, Any], results: Sequence[dict[str, Any]]) -> bool:
    """Whether the first result overlaps an evidence line of ``q``."""
    if not results:
        return False
    r = results[0]
    return any(e["path"] == r["path"] and r["start_line"] <= e["start_line"] <= r["end_line"]
               for e in q["relevant"])


def print_table(results: dict[str, dict[str, Any]], relevance: dict[str, tuple[int, int]]) -> None:
    print(f"{'run':<28}{'hit@5':>7}{'rec@5':>7}{'nDCG':>7}{'span':>6}  " + "  ".join(
        f"{CATEGORIES[c][:10]:>11}" for c in ("1", "2", "3", "4")) + "   relevant|top right")
    for label, out in results.items():
        o = out["ALL"]
        line = f"{label:<28}{o['hit@5']:>7.3f}{o['recall@5']:>7.3f}{o['ndcg@10']:>7.3f}{o['span@5']:>6.1f}  "
        line += "  ".join(f"{out[c]['hit@5']:>5.2f}/{out[c]['recall@5']:.2f}" for c in ("1", "2", "3", "4"))
        said, right = relevance.get(label, (0, 0))
        line += f"   {said}/{right}"
        print(line)
    print("per category: hit@5/recall@5. relevant|top right: questions whose top hit is an evidence turn that "
          "the answer flagged relevant")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.convmem_eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the convmem folder [%(default)s]")
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE, help="index and cache [%(default)s]")
    parser.add_argument("--variant", default="product", help="index name under --state (one per chunking)")
    parser.add_argument("--modes", default="hybrid,dense,keyword", help="search modes to run [%(default)s]")
    parser.add_argument("--mmr", type=float, action="append", default=[], metavar="LAMBDA",
                        help="also hybrid with MMR at this lambda (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a constant of indexer.chunking, indexer.sections or indexer.conversation for "
                             "this run (e.g. WINDOW_TURNS=5); give it its own --variant")
    parser.add_argument("--runs", type=Path, default=None, help="write each run here as score.py-readable JSONL")
    parser.add_argument("--model", choices=("default", "minilm", "e5"), default="default",
                        help="text embedder: the configured one, minilm or e5; give the run its own --variant")
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        conv = load_convset(args.data.resolve())
    except DataMissing as exc:
        print(f"convmem_eval: {exc}\nThe evaluation needs the convmem dev set (agents/, queries.jsonl, score.py) "
              f"at {DEFAULT_DATA} or --data DIR.", file=sys.stderr)
        return 2

    import structlog

    from benchmarks.eval import model_registry, open_indexed, set_constants
    from indexer import chunking, conversation, sections
    from indexer.config import Settings

    problem = set_constants(args.set, chunking, sections, conversation)
    if problem:
        print(f"convmem_eval: {problem}", file=sys.stderr)
        return 2
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    defaults = Settings(state_dir=args.state)
    registry = model_registry(defaults, args.model)
    log(f"convmem: {len(conv.queries)} questions over agents {', '.join(conv.agents)}")
    agents = {agent: conv.root / "agents" / agent for agent in conv.agents}
    indexer, facts = open_indexed(args.state.resolve(), agents, args.variant, "default", None, registry, log,
                                  "convmem|" + ",".join(args.set))
    runs: dict[str, dict[str, Any]] = {}
    relevance: dict[str, tuple[int, int]] = {}
    try:
        started = time.monotonic()
        labels = [(f"product {mode}", mode, {"mode": mode}) for mode in args.modes.split(",") if mode]
        labels += [(f"product hybrid mmr{lam:g}", "hybrid", {"mmr_lambda": lam}) for lam in args.mmr]
        for label, mode, overrides in labels:
            run, flags = run_product(conv, indexer, mode, overrides)
            runs[label] = run
            right = [q["id"] for q in conv.queries if top_right(q, run[q["id"]])]
            relevance[label] = (sum(1 for qid in right if flags[qid]), len(right))
        log(f"product searches: {time.monotonic() - started:.1f} s")
    finally:
        indexer.close()
    results = {label: conv.score.score(conv.queries, run) for label, run in runs.items()}
    embedder = registry.embedders["text"]
    print(f"\nconvmem: {len(conv.queries)} questions, {facts['files']} notes -> {facts['chunks']} chunks "
          f"(index {facts['seconds']} s); model {embedder.model_id}; k {K}"
          + (f"; chunking overrides {', '.join(args.set)}" if args.set else ""))
    print_table(results, relevance)
    if args.runs:
        args.runs.mkdir(parents=True, exist_ok=True)
        for label, run in runs.items():
            with open(args.runs / (label.replace(" ", "_") + ".jsonl"), "w", encoding="utf-8") as handle:
                handle.writelines(json.dumps({"id": qid, "results": r}) + "\n" for qid, r in run.items())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"index": facts, "k": K, "results": results,
                                         "relevant": {k: list(v) for k, v in relevance.items()}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
