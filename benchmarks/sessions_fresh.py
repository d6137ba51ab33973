"""Freshness and cost of a live session transcript: how soon an appended message is found, and what it costs.

Run from the repository root: ``python -m benchmarks.sessions_fresh`` (``--help`` for options). Needs no data set:
it writes synthetic OpenClaw transcripts (a ``session`` header, then ``message`` records alternating user and
assistant, every 7th followed by a tool call and its result) under ``--state``.

For each size in ``--lines`` (default 1,000 and 50,000 JSONL lines):

1. indexes a workspace whose ``sessions`` folder holds one transcript of that many lines (the daemon's code:
   ``Indexer.open`` + ``index_once``; the embedding cache under ``--state`` is kept between runs). Its messages
   repeat with one timestamp, so most windows are alike and the embedding cache spares the initial index most of
   its embedding: what is measured is the appends, not the model's throughput;
2. **freshness**: runs the daemon's worker loop with its real watcher (``worker.run``), waits for its start scan
   (``daemon_ready``) and one warm-up search, appends ``--appends``
   messages one at a time, each holding a word no other line has, and times from the write to the first search
   (``Searcher.answer``, hybrid, the agent's collections) whose top hit shows it: p50 and p95 seconds;
3. **cost**: with the loop stopped, appends ``--appends`` more messages and times the CPU the worker thread spends
   bringing the index up to date for each (``Sync.process`` on the transcript, ``time.thread_time``).

Prints each append's seconds in order (the first one after a start shows whether the transcript's tail
survived the start), both sizes and the ratio of their CPU per appended message (flat: about 1), with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WORDS = ("garden", "ferry", "invoice", "violin", "harbor", "lantern", "pottery", "canyon", "museum", "recipe",
         "glacier", "bicycle", "festival", "library", "orchard", "telescope", "marathon", "workshop", "meadow")


def _record(n: int, start: float, role: str, text: str) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(start + 37 * n))
    return json.dumps({"type": "message", "id": f"m{n}", "timestamp": stamp,
                       "message": {"role": role, "content": [{"type": "text", "text": text}]}}) + "\n"


def write_transcript(path: Path, lines: int, start: float = 1_683_554_160.0) -> None:
    """An OpenClaw transcript of ``lines`` JSONL lines, written streamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        out.write(json.dumps({"type": "session", "version": 3, "id": path.stem, "timestamp": "2023-05-08T13:56:00Z"})
                  + "\n")
        n = 1
        while n < lines:
            role = "user" if n % 2 else "assistant"
            name = "Caroline" if role == "user" else "Melanie"
            said = " ".join(WORDS[(n * 7 + k * 3) % len(WORDS)] for k in range(12))
            # one timestamp and a repeating text: windows repeat, so the embedding cache holds them after the
            # first few hundred lines and the initial index is quick; the appended messages are all new
            out.write(_record(0, start, role, f"{name}: about the {said}."))
            n += 1
            if n % 7 == 0 and n < lines:
                out.write(json.dumps({"type": "message", "id": f"t{n}", "message": {
                    "role": "toolResult", "content": [{"type": "text", "text": "ok " * 40}]}}) + "\n")
                n += 1


def append(path: Path, n: int, word: str) -> None:
    with open(path, "a", encoding="utf-8") as out:
        out.write(_record(n, 1_700_000_000.0, "user", f"Caroline: remember the {word} we talked about."))


def measure(state: Path, lines: int, appends: int, log: Any) -> dict[str, Any]:
    from indexer.config import Settings
    from indexer.daemon import Indexer
    from indexer.schema import SearchRequest
    from indexer.worker import index_once, run

    root = state / f"lines-{lines}"
    ws, sessions = root / "ws", root / "sessions"
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "MEMORY.md").write_text("# Memory\n")
    path = sessions / "live.jsonl"
    write_transcript(path, lines)
    state_dir = root / "state"
    state_dir.mkdir(exist_ok=True)
    cache = state / "embeddings.sqlite3"
    link = state_dir / "embeddings.sqlite3"
    if not link.is_symlink():
        link.unlink(missing_ok=True)
        link.symlink_to(cache.resolve())
    settings = Settings(state_dir=state_dir, log_level="warning",
                        workspace=[{"agent": "main", "path": ws, "sessions": sessions}])
    indexer = Indexer.open(settings, reindex=True)
    started = time.monotonic()
    index_once(indexer)
    log(f"{lines} lines ({path.stat().st_size / 1e6:.1f} MB) indexed in {time.monotonic() - started:.1f} s")
    stop = threading.Event()
    worker = threading.Thread(target=run, args=(indexer, stop), daemon=True)
    indexer.state.ready.clear()  # set by index_once: wait for the loop's own start scan (daemon_ready) instead
    worker.start()
    indexer.state.ready.wait(600)
    searcher = indexer.view.searcher()
    searcher.answer(SearchRequest(query="warm up", agent="main", k=1))  # the query model loads once, not per append
    latencies = []
    n = lines + 1
    for i in range(appends):
        word = f"zebrafish{lines}q{i}x"
        append(path, n, word)
        n += 1
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            hits = searcher.answer(SearchRequest(query=word, agent="main", k=1, corpus="sessions")).hits
            if hits and word in hits[0]["snippet"]:
                break
            time.sleep(0.02)
        latencies.append(time.monotonic() - t0)
    stop.set()
    indexer.settler.wake()
    worker.join(60)
    cpu = []
    for i in range(appends):
        append(path, n, f"quokka{lines}q{i}x")
        n += 1
        t0 = time.thread_time()
        indexer.sync.process([path])
        cpu.append(time.thread_time() - t0)
    indexer.close()
    log(f"{lines} lines: seconds to searchable per append, in order: {[round(x, 3) for x in latencies]}")
    latencies.sort()
    return {"lines": lines, "bytes": path.stat().st_size,
            "fresh_p50_s": statistics.median(latencies),
            "fresh_p95_s": latencies[min(len(latencies) - 1, int(round(0.95 * (len(latencies) - 1))))],
            "cpu_per_append_s": statistics.mean(cpu)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sessions_fresh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", type=Path, default=REPO / ".sessions-fresh", help="work folder [%(default)s]")
    parser.add_argument("--lines", default="1000,50000", help="transcript sizes in JSONL lines [%(default)s]")
    parser.add_argument("--appends", type=int, default=20, help="appended messages per size and measure")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    args.state.mkdir(parents=True, exist_ok=True)
    rows = [measure(args.state.resolve(), int(n), args.appends, log) for n in args.lines.split(",")]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {args.appends} appends per size")
    print(f"{'lines':>8}{'MB':>7}{'fresh p50 s':>13}{'fresh p95 s':>13}{'CPU/append s':>14}")
    for r in rows:
        print(f"{r['lines']:>8}{r['bytes'] / 1e6:>7.1f}{r['fresh_p50_s']:>13.3f}{r['fresh_p95_s']:>13.3f}"
              f"{r['cpu_per_append_s']:>14.4f}")
    if len(rows) > 1:
        print(f"CPU per appended message, {rows[-1]['lines']} vs {rows[0]['lines']} lines: "
              f"{rows[-1]['cpu_per_append_s'] / rows[0]['cpu_per_append_s']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
