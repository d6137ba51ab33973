"""The ``relevant`` flag on every public set, through the product's own indexing and search path: the relevant table.

Run from the repository root: ``python -m benchmarks.relevance_table`` (``--help`` for options).

For each set it indexes the notes with the daemon's code (``benchmarks.eval.open_indexed``: ``Indexer.open`` +
``index_once`` into Qdrant Edge; embeddings cached in ``<state>/embeddings.sqlite3``), asks every question through
``Searcher.answer`` (what ``POST /search`` answers) in the default hybrid mode, scoped to the question's agent, and
counts:

- ``unanswerable false``: of the questions the set marks unanswerable (``"relevant": []``), how many the answer
  flags ``relevant: false``;
- ``right true``: of the questions whose top hit overlaps a labelled range, how many it flags ``relevant: true``;
- the graded ``relevance.level`` counts of both groups.

Sets (folders under ``--data``, default ``../shared/data``; a missing one is said on stderr and skipped):

- ``devvault``: ``notes/`` as ``memory/`` of one workspace (52 answerable questions, 8 unanswerable);
- ``convmem``: ``agents/<agent>/`` as one workspace each (354 questions, all answerable);
- ``sessmem``: each session transcript ``agents/<agent>/sessions/<uuid>.jsonl`` written as a note
  ``memory/<uuid>.md`` line for line (line 1 ``# <session date>``, each text turn ``- <text>`` on its JSONL line,
  every other record a blank line), so a hit's lines are the transcript's JSONL lines; the product's own
  transcript source may index them differently;
- ``zhmem``: ``agents/<agent>/`` as one workspace each (60 questions in Chinese and English, 5 unanswerable);
- ``demo``: ``deploy/demo-workspace`` (shipped in the repository) with its example questions, each with the flag it
  should get.

``--per-query`` prints each unanswerable question and each right top hit flagged false, with the reason. Each set's
questions are asked twice and the second round timed (query embeddings and term lookups cached, as in a daemon's
use): ``ms/search`` is ``Searcher.answer`` whole, ``ms judging`` the part ``indexer.relevance.judge`` took (the
payloads it read and its document-frequency lookups included).

``--model e5`` judges with the ``e5`` plugin (its own ``--state``: the indexes differ); ``--floor COSINE`` (repeat)
adds one row per dense floor, over the same answers' evidence, to choose a model's ``relevance_floor``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
#: ``../shared/data`` beside the repository (or beside the folder that holds it: a git worktree)
DEFAULT_DATA = next((p / "shared" / "data" for p in (REPO.parent, REPO.parent.parent)
                     if (p / "shared" / "data").is_dir()), REPO.parent / "shared" / "data")
DEFAULT_STATE = REPO / ".relevance"
K = 10
#: the demo workspace's example questions: (query, as_of, the flag it should get)
DEMO_QUESTIONS = (("when can we deploy?", None, True), ("what is my cat's name?", None, False),
                  ("what happened yesterday?", "2026-11-28", True))


@dataclass
class Question:
    id: str
    query: str
    agent: str
    relevant: list[dict[str, Any]]  # labelled ranges, paths as the workspace has them; [] for unanswerable
    as_of: str | None = None
    expect: bool | None = None  # demo: the flag it should get
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Set:
    name: str
    agents: dict[str, Path]  # agent -> workspace
    questions: list[Question]


def _queries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def devvault(data: Path, state: Path) -> Set:
    from benchmarks.devvault_eval import write_workspace

    workspace = state / "devvault-workspace"
    write_workspace(data / "notes", workspace)
    questions = [Question(q["id"], q["query"], "devvault",
                          [dict(r, path="memory/" + r["path"].removeprefix("notes/")) for r in q["relevant"]])
                 for q in _queries(data / "queries.jsonl")]
    return Set("devvault", {"devvault": workspace}, questions)


def agents_set(name: str) -> Callable[[Path, Path], Set]:
    def load(data: Path, _state: Path) -> Set:
        agents = {p.name: p for p in sorted((data / "agents").iterdir()) if p.is_dir()}
        questions = [Question(q["id"], q["query"], q["agent"], q["relevant"],
                              extra={k: q[k] for k in ("lang", "type", "category") if k in q})
                     for q in _queries(data / "queries.jsonl")]
        return Set(name, agents, questions)
    return load


def transcript_note(lines: Sequence[str]) -> str:
    """A session transcript's JSONL ``lines`` as a note, line for line: ``# <date>`` for the session record,
    ``- <text>`` for a message's text blocks (joined), a blank line for anything else."""
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            out.append("")
            continue
        if record.get("type") == "session":
            out.append(f"# {str(record.get('timestamp', ''))[:10]}")
        elif record.get("type") == "message" and record["message"].get("role") in ("user", "assistant"):
            texts = [c.get("text", "") for c in record["message"].get("content", []) if c.get("type") == "text"]
            text = " ".join(t.replace("\n", " ") for t in texts).strip()
            out.append(f"- {text}" if text else "")
        else:
            out.append("")
    return "\n".join(out) + "\n"


def sessmem(data: Path, state: Path) -> Set:
    agents = {}
    for agent in sorted(p for p in (data / "agents").iterdir() if p.is_dir()):
        memory = state / "sessmem-workspaces" / agent.name / "memory"
        memory.mkdir(parents=True, exist_ok=True)
        for transcript in sorted((agent / "sessions").glob("*.jsonl")):
            note = memory / (transcript.stem + ".md")
            text = transcript_note(transcript.read_text(encoding="utf-8").splitlines())
            if not note.exists() or note.read_text(encoding="utf-8") != text:
                note.write_text(text, encoding="utf-8")
        agents[agent.name] = memory.parent
    questions = [Question(q["id"], q["query"], q["agent"],
                          [dict(r, path="memory/" + Path(r["path"]).stem + ".md") for r in q["relevant"]])
                 for q in _queries(data / "queries.jsonl")]
    return Set("sessmem", agents, questions)


def demo(_data: Path, _state: Path) -> Set:
    questions = [Question(f"demo{i}", query, "demo", [], as_of, expect)
                 for i, (query, as_of, expect) in enumerate(DEMO_QUESTIONS)]
    return Set("demo", {"demo": REPO / "deploy" / "demo-workspace"}, questions)


LOADERS: dict[str, Callable[[Path, Path], Set]] = {
    "devvault": devvault, "convmem": agents_set("convmem"), "sessmem": sessmem, "zhmem": agents_set("zhmem"),
    "demo": demo}


def top_right(q: Question, hits: Sequence[dict[str, Any]]) -> bool:
    """Whether the first hit overlaps a labelled range of ``q``."""
    if not hits:
        return False
    top = hits[0]
    return any(r["path"] == top["path"] and r["start_line"] <= top["end_line"] and r["end_line"] >= top["start_line"]
               for r in q.relevant)


def run_set(the_set: Set, state: Path, registry: Any, log: Callable[[str], None],
            per_query: bool, floors: Sequence[float | None] = (None,)) -> list[dict[str, Any]]:
    """The set's rows, one per dense floor of ``floors`` (``None``: the product's, ``relevance_floor``): counts, the
    level counts and the seconds its searches took."""
    from dataclasses import replace

    from benchmarks.eval import open_indexed
    from indexer.schema import SearchRequest

    indexer, facts = open_indexed(state, the_set.agents, the_set.name, "default", None, registry, log, the_set.name)
    out = []
    judged = [0.0]
    try:
        import indexer.search as search_module

        judge = getattr(search_module, "judge", None)
        if judge is not None:  # the relevance judgement's own cost (payloads it reads, term lookups included)
            def timed(*args: Any, **kwargs: Any) -> Any:
                began = time.perf_counter()
                try:
                    return judge(*args, **kwargs)
                finally:
                    judged[0] += time.perf_counter() - began

            search_module.judge = timed
        searcher = indexer.view.searcher()
        product_floor = searcher.settings.dense_floor
        for q in the_set.questions:  # once unmeasured: the query embeddings and term lookups cached, as in use
            searcher.answer(SearchRequest(query=q.query, agent=q.agent, k=K, as_of=q.as_of))
        for floor in floors:
            searcher.settings = replace(searcher.settings, dense_floor=product_floor if floor is None else floor)
            rows = []
            judged[0] = 0.0
            started = time.perf_counter()
            for q in the_set.questions:
                answer = searcher.answer(SearchRequest(query=q.query, agent=q.agent, k=K, as_of=q.as_of))
                rows.append((q, answer.hits, answer.relevant, getattr(answer, "relevance", None)))
            seconds = time.perf_counter() - started
            out.append(_row(the_set, facts, rows, seconds, judged[0], searcher.settings.dense_floor, log, per_query))
    finally:
        if judge is not None:
            search_module.judge = judge
        indexer.close()
    return out


def _row(the_set: Set, facts: dict[str, Any], rows: list[tuple[Any, ...]], seconds: float, judged: float,
         floor: float, log: Callable[[str], None], per_query: bool) -> dict[str, Any]:
    unanswerable = [r for r in rows if not r[0].relevant and r[0].expect is None]
    right = [r for r in rows if r[0].relevant and top_right(r[0], r[1])]
    expected = [r for r in rows if r[0].expect is not None]
    out = {"set": the_set.name, "floor": round(floor, 3), "questions": len(rows), "files": facts["files"],
           "chunks": facts["chunks"],
           "unanswerable": len(unanswerable), "unanswerable_false": sum(r[2] is False for r in unanswerable),
           "right": len(right), "right_true": sum(r[2] is True for r in right),
           "expected": len(expected), "expected_met": sum(r[2] is r[0].expect for r in expected),
           "search_ms": round(1000 * seconds / max(1, len(rows)), 2),
           "relevance_ms": round(1000 * judged / max(1, len(rows)), 2),
           "levels_unanswerable": _levels(unanswerable), "levels_right": _levels(right)}
    if per_query:
        for q, hits, flag, graded in rows:
            show = ((not q.relevant and q.expect is None) or q.expect is not None
                    or (q in [r[0] for r in right] and flag is not True))
            if show:
                top = f"{hits[0]['path']}#L{hits[0]['start_line']}" if hits else "-"
                kind = (f"expect={q.expect}" if q.expect is not None else "unanswerable" if not q.relevant
                        else "right")
                log(f"  {the_set.name} {q.id} {kind} "
                    f"relevant={flag} {graded} top={top} {q.query!r}")
    return out


def _levels(rows: Sequence[tuple[Any, ...]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        level = (row[3] or {}).get("level", "-")
        counts[level] = counts.get(level, 0) + 1
    return counts


def print_table(results: Sequence[dict[str, Any]]) -> None:
    print(f"{'set':<10}{'floor':>7}{'questions':>10}{'unanswerable false':>20}{'right top hits true':>22}"
          f"{'examples':>10}{'ms/search':>11}{'ms judging':>11}  levels (unanswerable | right)")
    for r in results:
        unanswerable = f"{r['unanswerable_false']}/{r['unanswerable']}" if r["unanswerable"] else "-"
        right = (f"{r['right_true']}/{r['right']} {100 * r['right_true'] / r['right']:.1f}%" if r["right"] else "-")
        examples = f"{r['expected_met']}/{r['expected']}" if r["expected"] else "-"
        print(f"{r['set']:<10}{r['floor']:>7}{r['questions']:>10}{unanswerable:>20}{right:>22}{examples:>10}{r['search_ms']:>11}"
              f"{r['relevance_ms']:>11}  "
              f"{r['levels_unanswerable']} | {r['levels_right']}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.relevance_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding the sets [%(default)s]")
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE, help="workspaces, indexes, cache [%(default)s]")
    parser.add_argument("--sets", default=",".join(LOADERS), help="sets to run [%(default)s]")
    parser.add_argument("--per-query", action="store_true", help="print unanswerable questions and missed right hits")
    parser.add_argument("--json", type=Path, default=None, help="also write the table here")
    parser.add_argument("--model", choices=("default", "minilm", "e5"), default="default",
                        help="text embedder (benchmarks.eval.model_registry; use one --state per model) [%(default)s]")
    parser.add_argument("--floor", type=float, action="append", default=[], metavar="COSINE",
                        help="dense floor to judge with instead of the model's (repeat: one row per floor)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    import structlog

    from benchmarks.eval import model_registry
    from indexer.config import Settings

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    state = args.state.resolve()
    state.mkdir(parents=True, exist_ok=True)
    defaults = Settings(state_dir=state)
    registry = model_registry(defaults, args.model)
    results = []
    for name in [n for n in args.sets.split(",") if n]:
        if name not in LOADERS:
            print(f"relevance_table: unknown set {name!r} (known: {', '.join(LOADERS)})", file=sys.stderr)
            return 2
        data = args.data / name
        if name != "demo" and not (data / "queries.jsonl").exists():
            log(f"relevance_table: {name} skipped: {data}/queries.jsonl not found (the public sets live in "
                f"{DEFAULT_DATA}; pass --data DIR)")
            continue
        results.extend(run_set(LOADERS[name](data, state), state, registry, log, args.per_query,
                               args.floor or (None,)))
    text = registry.embedders["text"]
    print(f"\nrelevant table; model {getattr(text, 'identity', '') or text.model_id}; k {K}; hybrid; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print_table(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
