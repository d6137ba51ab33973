"""OpenClaw's own memory against qmd-indexer as OpenClaw's memory, through the same door: the same questions asked
with the same ``POST /tools/invoke`` ``memory_search`` (``maxResults`` = 5) of a real OpenClaw gateway.

Run from the repository root: ``python -m benchmarks.openclaw_compare`` (``--help`` for options). Needs ``make
openclaw`` (Node 24 and OpenClaw 2026.9.6) and, for the MiniLM engine, ``make infinity``; the dev sets from
``../shared/data``.

Sets (each question asked of its own OpenClaw agent):

- ``devvault``: 242 markdown notes as one agent's ``memory/`` (a hit's ``memory/X.md`` is the set's ``notes/X.md``);
  the 60 questions less the negative ones.
- ``convmem``: three agents, ``MEMORY.md`` and daily notes ``memory/YYYY-MM-DD.md``; 354 questions.
- ``sessmem``: three agents, a short ``MEMORY.md`` and OpenClaw session transcripts (JSONL); 354 questions. For
  the builtin engines they go where OpenClaw 2026.9 keeps an agent's legacy transcripts,
  ``<state>/agents/<id>/sessions/``, and ``openclaw doctor --fix`` imports them into its SQLite session store (the
  gateway refuses to start on a legacy ``sessions.json`` until then); memory-core indexes them with
  ``memory.search.experimental.sessionMemory`` and ``sources: ["memory", "sessions"]``. The daemon reads the JSONL
  files themselves (its ``[[workspace]]`` ``sessions``).

Engines:

- ``builtin-none``: OpenClaw's bundled memory-core, ``memory.search.provider: "none"`` (SQLite FTS only);
- ``builtin-minilm``: memory-core with all-MiniLM-L6-v2 through an OpenAI-compatible endpoint (infinity-emb serving
  the model packaged with qmd-indexer: the same model as the daemon's);
- ``qmd-indexer``: the plugin in ``plugins/openclaw`` owning the memory slot, a daemon with one ``[[workspace]]``
  per agent.

memory-core's index is built before the questions with ``openclaw memory index --force --agent ID`` (timed); the
daemon's is its first index (``ready``). Metrics per set and engine: ``hit@5`` (a top-5 hit overlaps an evidence
range) and ``recall@5`` (the share of evidence ranges a top-5 hit overlaps), the same definition for every set (on
convmem and sessmem, whose evidence are single lines, it is their ``score.py``'s), and the p50 of a search through
OpenClaw (the whole ``/tools/invoke``, client side); for qmd-indexer also the daemon's own ``POST /search`` p50 for
the same questions, so the gateway's and plugin's share of a search shows. ``--json PATH`` writes it all.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data"
K = 5
ENGINES = ("builtin-none", "builtin-minilm", "qmd-indexer")
SETS = ("devvault", "convmem", "sessmem")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Agent:
    id: str  # the OpenClaw agent id (and the daemon's)
    workspace: Path
    sessions: Path | None = None  # the set's transcript folder, copied into each OpenClaw's state


@dataclass
class DevSet:
    name: str
    agents: list[Agent]
    queries: list[dict[str, Any]]  # {"id", "agent", "query", "relevant": [{"path", "start_line", "end_line"}]}
    to_set_path: Callable[[str], str]  # a hit's path as the set's qrels name it


@dataclass
class Run:
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # question id -> hits (set paths)
    seconds: list[float] = field(default_factory=list)  # one search through OpenClaw each
    daemon_seconds: list[float] = field(default_factory=list)  # the daemon's own POST /search (qmd-indexer)
    errors: int = 0
    index_s: float = 0.0


def _queries(path: Path, agent: Callable[[dict[str, Any]], str]) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{**q, "agent": agent(q)} for q in rows if q.get("relevant")]  # devvault's negatives have none


def load_sets(data: Path, work: Path, names: list[str]) -> list[DevSet]:
    """Copy each set's files into workspaces under ``work`` (OpenClaw indexes ``memory/``), read its questions."""
    sets = []
    if "devvault" in names:
        ws = work / "devvault" / "ws"
        if not ws.exists():
            shutil.copytree(data / "devvault" / "notes", ws / "memory")
        sets.append(DevSet("devvault", [Agent("devvault", ws)],
                           _queries(data / "devvault" / "queries.jsonl", lambda q: "devvault"),
                           lambda p: "notes/" + p.removeprefix("memory/")))
    for name in ("convmem", "sessmem"):
        if name not in names:
            continue
        agents = []
        for folder in sorted(p for p in (data / name / "agents").iterdir() if p.is_dir()):
            ws = work / name / folder.name
            if not ws.exists():
                shutil.copytree(folder / "workspace" if name == "sessmem" else folder, ws)
            sessions = work / name / f"{folder.name}-sessions" if name == "sessmem" else None
            if sessions and not sessions.exists():
                shutil.copytree(folder / "sessions", sessions)
            agents.append(Agent(f"{name[:2]}-{folder.name}", ws, sessions))
        queries = _queries(data / name / "queries.jsonl", lambda q, p=name[:2]: f"{p}-{q['agent']}")
        sets.append(DevSet(name, agents, queries, (lambda p: p.rsplit("/", 1)[-1]) if name == "sessmem" else str))
    return sets


def score(devset: DevSet, run: Run) -> dict[str, float]:
    """hit@5 and recall@5 over the set's questions (see the module); sessmem compares file names."""
    same = (lambda a, b: a.rsplit("/", 1)[-1] == b.rsplit("/", 1)[-1]) if devset.name == "sessmem" else str.__eq__
    hits, recalls = [], []
    for q in devset.queries:
        top = run.rows.get(q["id"], [])[:K]
        covered = [any(same(h["path"], r["path"]) and h["start_line"] <= r["end_line"]
                       and r["start_line"] <= h["end_line"] for h in top) for r in q["relevant"]]
        hits.append(float(any(covered)))
        recalls.append(sum(covered) / len(covered))
    return {"hit@5": statistics.fmean(hits), "recall@5": statistics.fmean(recalls), "n": len(hits)}


def openclaw_config(engine: str, agents: list[Agent], embed_url: str | None) -> dict[str, Any]:
    """The ``openclaw.json`` of one engine for ``agents``."""
    search: dict[str, Any] = {"experimental": {"sessionMemory": True}, "sources": ["memory", "sessions"]}
    if engine == "builtin-none":
        search["provider"] = "none"
    elif engine == "builtin-minilm":
        search |= {"provider": "openai-compatible", "model": "all-MiniLM-L6-v2",
                   "remote": {"baseUrl": f"{embed_url}/", "apiKey": "unused"}}
    else:
        search = {"enabled": False}  # memory-core registers no memory_search of its own (docs/openclaw.md)
    return {"agents": {"ownership": "explicit", "defaults": {"systemAgent": {"agentId": agents[0].id}},
                       "entries": {a.id: {"workspace": str(a.workspace)} for a in agents}},
            "memory": {"search": search}}


def daemon_config(agents: list[Agent], path: Path) -> Path:
    lines = []
    for a in agents:
        lines += ["[[workspace]]", f"agent = {json.dumps(a.id)}", f"path = {json.dumps(str(a.workspace))}"]
        if a.sessions:
            lines.append(f"sessions = {json.dumps(str(a.sessions))}")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def ask(claw: Any, devset: DevSet, run: Run, daemon_url: str | None) -> None:
    """Every question of ``devset`` through the gateway's ``memory_search`` (and the daemon's own search)."""
    with httpx.Client(timeout=120) as http:
        for q in devset.queries:
            started = time.perf_counter()
            answer = claw.invoke("memory_search", {"query": q["query"], "maxResults": K}, agent=q["agent"],
                                 timeout_s=120)
            run.seconds.append(time.perf_counter() - started)
            if answer.get("unavailable"):
                run.errors += 1
                if run.errors <= 3:
                    log(f"  {q['id']}: unavailable: {answer.get('error')}")
            run.rows[q["id"]] = [{"path": devset.to_set_path(r["path"]), "start_line": r["startLine"],
                                  "end_line": r["endLine"], "score": r["score"]} for r in answer.get("results", [])]
            if daemon_url:
                started = time.perf_counter()
                reply = http.post(f"{daemon_url}/search", json={"query": q["query"], "agent": q["agent"], "k": K})
                run.daemon_seconds.append(time.perf_counter() - started)
                reply.raise_for_status()


def run_engine(engine: str, sets: list[DevSet], work: Path, embed_url: str | None) -> dict[str, Run]:
    """One OpenClaw (and for qmd-indexer, one daemon) for ``engine``, every set asked through it."""
    sys.path.insert(0, str(REPO / "tests"))
    from openclaw.gateway import OpenClaw  # tests/ on the path

    from benchmarks.harness import Daemon

    agents = [a for s in sets for a in s.agents]
    base = work / engine
    shutil.rmtree(base, ignore_errors=True)
    claw = OpenClaw(base / "claw")
    claw.write_config(openclaw_config(engine, agents, embed_url))
    if engine != "qmd-indexer" and any(a.sessions for a in agents):
        for a in agents:
            if a.sessions:
                shutil.copytree(a.sessions, claw.state / "agents" / a.id / "sessions")
        claw.cli("doctor", "--fix", "--yes", "--non-interactive", timeout_s=1800)  # into OpenClaw's SQLite store
    runs = {s.name: Run() for s in sets}
    daemon = None
    try:
        if engine == "qmd-indexer":
            claw.cli("plugins", "install", str(REPO / "plugins" / "openclaw"), "--force", "--accept-capabilities")
            config = daemon_config(agents, base / "qmd-indexer.toml")
            daemon = Daemon(agents[0].workspace, base / "qmd-state", base / "daemon.log", config=config, fp32=False)
            index_s = daemon.wait_ready(1800)
            cfg = claw.config()
            cfg["plugins"]["entries"]["qmd-indexer"]["config"] = {"url": daemon.url, "timeoutMs": 60000}
            claw.write_config(cfg)
        else:
            started = time.perf_counter()
            for a in agents:
                claw.cli("memory", "index", "--force", "--agent", a.id, timeout_s=3600)
            index_s = time.perf_counter() - started
        log(f"{engine}: indexed {len(agents)} agent(s) in {index_s:.0f} s")
        claw.start()
        for devset in sets:
            runs[devset.name].index_s = index_s
            ask(claw, devset, runs[devset.name], daemon.url if daemon else None)
            log(f"{engine} {devset.name}: {score(devset, runs[devset.name])}")
    finally:
        claw.stop()
        if daemon:
            daemon.stop()
    return runs


def p50_ms(seconds: list[float]) -> float | None:
    return statistics.median(seconds) * 1000 if seconds else None


def report(sets: list[DevSet], results: dict[str, dict[str, Run]]) -> list[dict[str, Any]]:
    rows = []
    print(f"{'set':9} {'engine':15} {'n':>4} {'hit@5':>6} {'rec@5':>6} {'p50 via OpenClaw':>17} {'p50 daemon':>11} "
          f"{'errors':>6} {'index s':>8}")
    for devset in sets:
        for engine, runs in results.items():
            run = runs[devset.name]
            metrics = score(devset, run)
            row = {"set": devset.name, "engine": engine, **metrics, "p50_openclaw_ms": p50_ms(run.seconds),
                   "p50_daemon_ms": p50_ms(run.daemon_seconds), "errors": run.errors, "index_s": run.index_s}
            rows.append(row)
            daemon = f"{row['p50_daemon_ms']:8.1f} ms" if row["p50_daemon_ms"] is not None else f"{'-':>11}"
            print(f"{devset.name:9} {engine:15} {metrics['n']:4d} {metrics['hit@5']:6.3f} {metrics['recall@5']:6.3f} "
                  f"{row['p50_openclaw_ms']:14.1f} ms {daemon} {run.errors:6d} {run.index_s:8.0f}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="the dev sets' folder [../shared/data]")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "qmd-indexer-openclaw-compare",
                        help="workspaces, OpenClaw homes, daemon state, logs [a folder under the system's temp dir]")
    parser.add_argument("--limit", type=int, help="ask only the first N questions of each set (a quick look)")
    parser.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    parser.add_argument("--json", type=Path, help="write the table as JSON here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))
    from openclaw.gateway import missing

    if reason := missing():
        log(f"openclaw_compare: {reason}")
        return 2
    sets = load_sets(args.data, args.work, args.sets.split(","))
    if args.limit:
        for devset in sets:
            devset.queries = devset.queries[:args.limit]
    results: dict[str, dict[str, Run]] = {}
    for engine in args.engines.split(","):
        if engine == "builtin-minilm":
            from infinity.server import Infinity, minilm_path

            with Infinity(minilm_path(), "all-MiniLM-L6-v2", args.work / "infinity.log") as server:
                results[engine] = run_engine(engine, sets, args.work, server.url)
        else:
            results[engine] = run_engine(engine, sets, args.work, None)
    rows = report(sets, results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
