"""Retrieval quality on the sessmem dev set (session transcripts) through the product's own indexing and search path.

Run from the repository root: ``python -m benchmarks.sessmem_eval`` (``--help`` for options).

What it does, in one run:

1. Reads the dev set from ``--data`` (default ``../shared/data/sessmem`` relative to the repository): ``agents/``
   (per agent a ``workspace/`` with a short ``MEMORY.md`` and a ``sessions/`` folder of OpenClaw transcripts, with
   thinking, tool calls and tool results as noise, and the folder's ``sessions.json`` index), ``queries.jsonl`` (354
   questions, the evidence turns labelled by JSONL line) and ``score.py`` (the set's own scorer, imported so its
   metrics are used exactly). A missing folder or file is reported on stderr and the process exits with status 2.
2. Indexes the three agents as three ``[[workspace]]`` tables of one daemon (agent id = folder name, ``sessions``
   = the agent's ``sessions/``) with the daemon's code (``Indexer.open`` + ``index_once``) into Qdrant Edge under
   ``<state>/state-<variant>/``; the embedding cache ``<state>/embeddings.sqlite3`` is shared between variants.
3. Asks every question as the README says (``POST /search {"query", "agent", "k": 10}``), through
   ``Searcher.search`` (what ``POST /search`` answers: the hits' line ranges are their snippets'), in the default
   hybrid mode and in dense and keyword mode, and with ``--mmr`` lambdas; the README's plain script (BM25 + MiniLM,
   DBSF: hit@5 0.771, recall@5 0.704) is printed beside them by category.
4. Scores every run with ``score.py``: hit@5, recall@5, file nDCG@10 and span@5 per category (1 multi-hop,
   2 temporal, 3 open-domain, 4 single-hop) and overall; with ``--runs DIR`` it writes each run as a JSONL file
   ``score.py`` reads.
5. Prints the ``relevant`` flag's confusion counts: of the questions whose top hit overlaps an evidence turn, how
   many the answer flagged ``relevant: true``.

``--notes own|rotated`` puts daily-log notes beside the transcripts, as a real agent has both: each agent's
workspace gets the ``memory/`` notes of ``../convmem`` (the same LoCoMo conversations written as daily logs): its own
conversation's (``own``: notes that answer too, scored as misses since the labels name transcript lines) or the next
agent's (``rotated``: the same kind of notes about other people, distractors). ``--corpus all`` then asks notes and
transcripts together; ``--corpus sessions`` the transcripts alone (what ``all`` must stay within 0.02 of).

``--set WINDOW_TURNS=4`` (a constant of ``indexer.sources.transcripts``, ``indexer.chunking``,
``indexer.sections`` or ``indexer.conversation``) tunes the windows for one run; give it its own ``--variant``.
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
DEFAULT_DATA = REPO.parent / "shared" / "data" / "sessmem"
DEFAULT_STATE = REPO / ".sessmem"
K = 10  # hits asked per question, as the dev set's README says
CATEGORIES = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop", "ALL": "ALL"}
#: the README's plain script, BM25 + MiniLM with DBSF (hit@5, recall@5) by category and overall
SCRIPT = {"1": (0.671, 0.375), "2": (0.736, 0.728), "3": (0.389, 0.333), "4": (0.869, 0.866), "ALL": (0.771, 0.704)}


class DataMissing(Exception):
    """The dev set folder or one of its files is absent."""


@dataclass
class SessSet:
    root: Path
    queries: list[dict[str, Any]]
    score: Any  # the dev set's score.py, imported
    agents: list[str]


def load_sessset(data: Path) -> SessSet:
    """Read the dev set. Raises ``DataMissing`` naming what is absent."""
    if not data.is_dir():
        raise DataMissing(f"dev set folder not found: {data}")
    for name in ("agents", "queries.jsonl", "score.py"):
        if not (data / name).exists():
            raise DataMissing(f"{data}: {name} not found")
    spec = importlib.util.spec_from_file_location("sessmem_score", data / "score.py")
    score = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(score)
    queries = [json.loads(line) for line in (data / "queries.jsonl").read_text().splitlines() if line.strip()]
    agents = sorted(p.name for p in (data / "agents").iterdir() if p.is_dir())
    return SessSet(data, queries, score, agents)


def with_notes(agents: dict[str, Path], convmem: Path, into: Path, rotated: bool) -> dict[str, Path]:
    """Each agent's workspace copied under ``into`` with the ``memory/`` notes of ``convmem``'s agent of the same name
    (``rotated``: of the next agent, in name order) beside its ``MEMORY.md``. Raises ``DataMissing``."""
    import shutil

    names = sorted(agents)
    out = {}
    for i, agent in enumerate(names):
        source = convmem / "agents" / (names[(i + 1) % len(names)] if rotated else agent) / "memory"
        if not source.is_dir():
            raise DataMissing(f"notes not found: {source} (--notes needs ../convmem beside the sessmem set)")
        workspace = into / agent
        if not workspace.is_dir():
            shutil.copytree(agents[agent], workspace)
            shutil.copytree(source, workspace / "memory")
        out[agent] = workspace
    return out


def run_product(conv: SessSet, indexer: Any, mode: str, overrides: dict[str, Any],
                corpus: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every question through ``Searcher.answer`` (what ``POST /search`` answers); returns (query id -> results,
    query id -> its ``relevant`` flag)."""
    from indexer.schema import SearchRequest

    searcher = indexer.view.searcher(**overrides)
    run, flags = {}, {}
    for q in conv.queries:
        hits, flag, *_ = searcher.answer(SearchRequest(query=q["query"], agent=q["agent"], k=K, mode=mode,
                                                                 corpus=corpus))
        run[q["id"]] = [{"path": h["path"], "start_line": h["start_line"], "end_line": h["end_line"],
                         "score": h["score"]} for h in hits]
        flags[q["id"]] = flag
    return run, flags


def top_right(q: dict[str, Any], results: Sequence[dict[str, Any]]) -> bool:
    """Whether the first result overlaps an evidence line of ``q``."""
    if not results:
        return False
    r = results[0]  # paths match on the file name, as score.py matches them
    return any(Path(e["path"]).name == Path(r["path"]).name and r["start_line"] <= e["start_line"] <= r["end_line"]
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
    script = "  ".join(f"{SCRIPT[c][0]:>5.2f}/{SCRIPT[c][1]:.2f}" for c in ("1", "2", "3", "4"))
    overall = f"{SCRIPT['ALL'][0]:>7.3f}{SCRIPT['ALL'][1]:>7.3f}"
    print(f"{'README script (BM25+MiniLM)':<28}{overall}{'':>13}  {script}")
    print("per category: hit@5/recall@5. relevant|top right: questions whose top hit is an evidence turn that "
          "the answer flagged relevant")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sessmem_eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the sessmem folder [%(default)s]")
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE, help="index and cache [%(default)s]")
    parser.add_argument("--variant", default="product", help="index name under --state (one per chunking)")
    parser.add_argument("--modes", default="hybrid,dense,keyword", help="search modes to run [%(default)s]")
    parser.add_argument("--mmr", type=float, action="append", default=[], metavar="LAMBDA",
                        help="also hybrid with MMR at this lambda (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a constant of indexer.sources.transcripts, indexer.chunking, indexer.sections "
                             "or indexer.conversation for this run (e.g. WINDOW_TURNS=5); give it its own --variant")
    parser.add_argument("--notes", choices=("none", "own", "rotated"), default="none",
                        help="daily-log notes beside the transcripts, from ../convmem (see above) [%(default)s]")
    parser.add_argument("--corpus", action="append", choices=("sessions", "all", "memory"), default=[],
                        help="ask this corpus (repeatable; default: the configured one)")
    parser.add_argument("--runs", type=Path, default=None, help="write each run here as score.py-readable JSONL")
    parser.add_argument("--model", choices=("default", "minilm", "e5"), default="default",
                        help="text embedder: the configured one, minilm or e5; give the run its own --variant")
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        conv = load_sessset(args.data.resolve())
    except DataMissing as exc:
        print(f"sessmem_eval: {exc}\nThe evaluation needs the sessmem dev set (agents/, queries.jsonl, score.py) "
              f"at {DEFAULT_DATA} or --data DIR.", file=sys.stderr)
        return 2

    import structlog

    from benchmarks.eval import model_registry, open_indexed, set_constants
    from indexer import chunking, conversation, sections
    from indexer.config import Settings
    from indexer.sources import transcripts

    problem = set_constants(args.set, transcripts, chunking, sections, conversation)
    if problem:
        print(f"sessmem_eval: {problem}", file=sys.stderr)
        return 2
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    defaults = Settings(state_dir=args.state)
    registry = model_registry(defaults, args.model)
    log(f"sessmem: {len(conv.queries)} questions over agents {', '.join(conv.agents)}")
    agents = {agent: conv.root / "agents" / agent / "workspace" for agent in conv.agents}
    if args.notes != "none":
        try:
            agents = with_notes(agents, conv.root.parent / "convmem", args.state.resolve() / f"notes-{args.notes}",
                                rotated=args.notes == "rotated")
        except DataMissing as exc:
            print(f"sessmem_eval: {exc}", file=sys.stderr)
            return 2
    sessions = {agent: conv.root / "agents" / agent / "sessions" for agent in conv.agents}
    indexer, facts = open_indexed(args.state.resolve(), agents, args.variant, "default", None, registry, log,
                                  "sessmem|" + ",".join(args.set) + f"|notes={args.notes}",
                                  sessions=sessions)
    runs: dict[str, dict[str, Any]] = {}
    relevance: dict[str, tuple[int, int]] = {}
    try:
        started = time.monotonic()
        corpora: list[str | None] = list(args.corpus) or [None]
        labels = [(f"product {mode}" + (f" {c}" if c else ""), mode, {"mode": mode}, c)
                  for mode in args.modes.split(",") if mode for c in corpora]
        labels += [(f"product hybrid mmr{lam:g}", "hybrid", {"mmr_lambda": lam}, None) for lam in args.mmr]
        for label, mode, overrides, corpus in labels:
            run, flags = run_product(conv, indexer, mode, overrides, corpus)
            runs[label] = run
            right = [q["id"] for q in conv.queries if top_right(q, run[q["id"]])]
            relevance[label] = (sum(1 for qid in right if flags[qid]), len(right))
        log(f"product searches: {time.monotonic() - started:.1f} s")
    finally:
        indexer.close()
    results = {label: conv.score.score(conv.queries, run) for label, run in runs.items()}
    embedder = registry.embedders["text"]
    print(f"\nsessmem: {len(conv.queries)} questions, {facts['files']} files -> {facts['chunks']} chunks "
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
