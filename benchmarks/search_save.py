"""Search latency and save-to-searchable of a running daemon, against another checkout in the same run.

A daemon (``benchmarks.harness.Daemon``, the product's own precision) on a copy of a workspace: by default one
agent of the conversation-memory set (``../shared/data/convmem/agents/conv-26``: dated conversation logs, what a
memory looks like) and its questions, else the shipped demo workspace and a fixed list of questions (said on
stderr). With ``--before DIR`` (a checkout of another commit, e.g. ``git worktree add DIR e1eca26``) a second daemon
runs that code on its own copy (its plugins' entry points from its own metadata: ``egg_info`` is run there when it
has none), and every measurement alternates between the two, so both meet the same load on a
shared machine. Measured, per daemon:

- search: ``POST /search`` (hybrid, k 6) of each question once through one keep-alive connection, after 3 warm-up
  searches; wall milliseconds p50/p95, and the daemon's CPU milliseconds per search (psutil), which a busy machine
  disturbs less than the wall clock; then the same for the questions of convmem that name a time (the period
  boost's path);
- save-to-searchable: a line with a new token appended to a note (write + close), then ``POST /search`` (keyword)
  every 20 ms until a hit of that note shows the token; seconds p50/p95, and the daemon's CPU seconds per save
  (the polling searches included).

Prints each figure, its ratio to ``--before``'s, and the load average at the start and the end; writes
``<out>/search-save-<time>.json``. ``--profile`` records each daemon with py-spy (``pip install py-spy``) while it is
measured, into ``<out>/<name>-search.txt`` / ``-save.txt`` (function, own and total samples).

    python -m benchmarks.search_save [--before DIR] [--edits 20] [--queries 100] [--out .search-save] [--profile]
                                      [--precision auto|fp32|bf16|int8]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import REPO, SHARED, Daemon, log

CONVMEM_AGENT = "conv-26"
DEMO = REPO / "deploy" / "demo-workspace"
DEMO_QUESTIONS = ("what is my cat's name?", "what happened yesterday?", "which coffee do I like?",
                  "what did we decide about the search service last week?", "deploy window", "flat white",
                  "when is the next review?", "what changed in November 2026?")


def workspace_and_questions(limit: int) -> tuple[Path, list[str], list[str]]:
    """The workspace to copy, up to ``limit`` questions of it, and up to ``limit`` questions that name a time
    (``indexer.dates.time_phrases``; of every convmem agent: the period boost runs whatever the workspace)."""
    from indexer.dates import time_phrases

    for data in SHARED:
        agent = data / "convmem" / "agents" / CONVMEM_AGENT
        if agent.is_dir():
            rows = [json.loads(line) for line in (data / "convmem" / "queries.jsonl").read_text().splitlines()]
            timed = [r["query"] for r in rows if time_phrases(r["query"])][:limit]
            return agent, [r["query"] for r in rows if r.get("agent") == CONVMEM_AGENT][:limit], timed
    log(f"convmem is missing (looked in {', '.join(map(str, SHARED))}): the demo workspace and fixed questions")
    fixed = [DEMO_QUESTIONS[n % len(DEMO_QUESTIONS)] for n in range(limit)]
    return DEMO, fixed, [q for q in fixed if time_phrases(q)]


def pct(values: list[float], q: float) -> float:
    return float(statistics.quantiles(values, n=100, method="inclusive")[q - 1]) if len(values) > 1 else values[0]


class Subject:
    """One daemon under measurement: its code (``repo``), workspace copy, HTTP connection and py-spy recorder."""

    def __init__(self, name: str, repo: Path, source: Path, out: Path, precision: str = "auto") -> None:
        self.name, self.repo, self.out = name, repo, out
        if repo != REPO and not list(repo.glob("*.egg-info")):
            # the daemon imports ``repo`` first (PYTHONPATH): its plugins' entry points must come from there too,
            # not from the metadata of the checkout the virtualenv was installed from
            subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "egg_info"], cwd=repo,
                           check=True, capture_output=True)
        self.ws = out / name / "ws"
        shutil.rmtree(out / name, ignore_errors=True)
        shutil.copytree(source, self.ws)
        self.daemon = Daemon(self.ws, out / name / "state", out / name / "daemon.log", agent="bench", fp32=False,
                             repo=repo, env={} if precision == "auto" else {"QMD_INDEXER_PRECISION": precision})
        self.http = httpx.Client(timeout=60)
        self.search_s: list[float] = []
        self.search_cpu_s = 0.0
        self.timed_s: list[float] = []
        self.timed_cpu_s = 0.0
        self.save_s: list[float] = []
        self.save_cpu_s = 0.0
        self.spy: subprocess.Popen[bytes] | None = None

    def search(self, query: str, mode: str = "hybrid", k: int = 6) -> list[dict[str, Any]]:
        answer = self.http.post(f"{self.daemon.url}/search", json={"query": query, "k": k, "mode": mode})
        answer.raise_for_status()
        return list(answer.json().get("hits", []))

    def profile(self, what: str | None) -> None:
        """Start py-spy on the daemon for ``what`` (a file name part), or stop the one running (None)."""
        if self.spy is not None:
            self.spy.send_signal(signal.SIGINT)
            self.spy.wait(60)
            self.spy = None
        if what:
            spy = py_spy() or "py-spy"
            dest = self.out / f"{self.name}-{what}.txt"
            self.spy = subprocess.Popen([spy, "record", "--pid", str(self.daemon.proc.pid), "--format", "raw",
                                        "--rate", "250", "--output", str(dest), "--nonblocking"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # py-spy attaches

    def save_once(self, n: int) -> float:
        notes = sorted((self.ws / "memory").rglob("*.md"))
        note = notes[(n * 7) % len(notes)]
        rel = note.relative_to(self.ws).as_posix()
        token = f"benchtoken{uuid.uuid4().hex[:12]}"
        with open(note, "a", encoding="utf-8") as handle:
            handle.write(f"\nNew fact {n}: {token} was saved.\n")
        written = time.perf_counter()
        while True:
            if any(h.get("path") == rel and token in h.get("snippet", "") for h in self.search(token, "keyword", 3)):
                return time.perf_counter() - written
            if time.perf_counter() - written > 60:
                raise TimeoutError(f"{self.name}: edit {n} of {rel} not searchable after 60 s")
            time.sleep(0.02)

    def close(self) -> None:
        self.profile(None)
        self.http.close()
        self.daemon.stop()


def summary(s: Subject) -> dict[str, Any]:
    return {"repo": str(s.repo),
            "search_ms": {"p50": round(1000 * pct(s.search_s, 50), 2), "p95": round(1000 * pct(s.search_s, 95), 2),
                          "cpu_per_search": round(1000 * s.search_cpu_s / len(s.search_s), 2),
                          "n": len(s.search_s)},
            "time_questions_ms": {"p50": round(1000 * pct(s.timed_s, 50), 2),
                                  "p95": round(1000 * pct(s.timed_s, 95), 2),
                                  "cpu_per_search": round(1000 * s.timed_cpu_s / max(1, len(s.timed_s)), 2),
                                  "n": len(s.timed_s)},
            "save_to_searchable_s": {"p50": round(pct(s.save_s, 50), 3), "p95": round(pct(s.save_s, 95), 3),
                                     "max": round(max(s.save_s), 3), "n": len(s.save_s),
                                     "cpu_per_save": round(s.save_cpu_s / len(s.save_s), 3)}}


def py_spy() -> str | None:
    """The py-spy beside this interpreter, else on ``PATH``; ``None`` when neither has one."""
    return shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="another checkout to measure beside this one")
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--out", type=Path, default=REPO / ".search-save")
    parser.add_argument("--profile", action="store_true", help="record each daemon with py-spy")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "int8"), default="auto",
                        help="the daemons' text embedding precision [%(default)s]")
    args = parser.parse_args()
    if args.profile and not py_spy():
        parser.error("--profile needs py-spy: pip install py-spy")
    source, questions, timed = workspace_and_questions(args.queries)
    load_start = os.getloadavg()
    log(f"workspace {source}, {len(questions)} questions, {len(timed)} that name a time; load average "
        f"{load_start[0]:.2f}")
    subjects = [Subject("after", REPO, source, args.out, args.precision)]
    if args.before:
        subjects.append(Subject("before", args.before.resolve(), source, args.out, args.precision))
    try:
        for s in subjects:
            log(f"{s.name}: ready after {s.daemon.wait_ready(900):.1f} s")
            s.daemon.wait_quiet(300)
            for q in questions[:3]:
                s.search(q + " warm")
        for s in subjects:
            s.profile("search" if args.profile else None)
        for query in questions:
            for s in subjects:
                cpu, started = s.daemon.cpu_s(), time.perf_counter()
                s.search(query)
                s.search_s.append(time.perf_counter() - started)
                s.search_cpu_s += s.daemon.cpu_s() - cpu
        for query in timed:
            for s in subjects:
                cpu, started = s.daemon.cpu_s(), time.perf_counter()
                s.search(query)
                s.timed_s.append(time.perf_counter() - started)
                s.timed_cpu_s += s.daemon.cpu_s() - cpu
        for s in subjects:
            s.profile("save" if args.profile else None)
        for n in range(args.edits):
            for s in subjects:
                cpu = s.daemon.cpu_s()
                s.save_s.append(s.save_once(n))
                s.save_cpu_s += s.daemon.cpu_s() - cpu
        for s in subjects:
            s.profile(None)
    finally:
        for s in subjects:
            s.close()
    load_end = os.getloadavg()
    result: dict[str, Any] = {"when": datetime.datetime.now().isoformat(timespec="seconds"),
                              "workspace": str(source), "load_average": [load_start, load_end],
                              **{s.name: summary(s) for s in subjects}}
    for s in subjects:
        r = result[s.name]
        log(f"{s.name:6}  search p50 {r['search_ms']['p50']:.1f} ms, p95 {r['search_ms']['p95']:.1f} ms, daemon CPU "
            f"{r['search_ms']['cpu_per_search']:.1f} ms/search; questions naming a time p50 "
            f"{r['time_questions_ms']['p50']:.1f} ms, CPU {r['time_questions_ms']['cpu_per_search']:.1f} ms/search; "
            f"save-to-searchable p50 "
            f"{r['save_to_searchable_s']['p50']:.3f} s, p95 {r['save_to_searchable_s']['p95']:.3f} s, daemon CPU "
            f"{r['save_to_searchable_s']['cpu_per_save']:.3f} s/save (polling searches included)")
    if args.before:
        a, b = result["after"], result["before"]
        result["ratios"] = {
            "search_p50": round(a["search_ms"]["p50"] / b["search_ms"]["p50"], 2),
            "search_cpu": round(a["search_ms"]["cpu_per_search"] / b["search_ms"]["cpu_per_search"], 2),
            "time_questions_p50": round(a["time_questions_ms"]["p50"] / b["time_questions_ms"]["p50"], 2),
            "time_questions_cpu": round(a["time_questions_ms"]["cpu_per_search"]
                                        / b["time_questions_ms"]["cpu_per_search"], 2),
            "save_p50": round(a["save_to_searchable_s"]["p50"] / b["save_to_searchable_s"]["p50"], 2),
            "save_p95": round(a["save_to_searchable_s"]["p95"] / b["save_to_searchable_s"]["p95"], 2),
            "save_cpu": round(a["save_to_searchable_s"]["cpu_per_save"] / b["save_to_searchable_s"]["cpu_per_save"], 2)}
        log(f"after / before: {result['ratios']}")
    log(f"load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end")
    args.out.mkdir(parents=True, exist_ok=True)
    dest = args.out / f"search-save-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"
    dest.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
