"""Deadlines and answer caps of the remote plugins, timed: a script, not a test.

Against ``FakeModelServer`` (``tests/fake_model_server.py``, a FAKE loopback server: no real one can be told to
trickle or to send 150 MB), in this process, it times what a search and an index pass wait for:

- ``trickle-query``: a query embedding (``OpenAIEmbedder.embed_query``, what a hybrid search calls) from a server that
  sends its answer a byte every ``--trickle-s`` seconds, with ``query_timeout_s`` = ``--budget-s``;
- ``trickle-rerank``: ``HttpReranker.score`` with ``timeout_s`` = ``--budget-s`` (a search's ``rerank_budget_s``);
- ``trickle-index``: one indexing batch (``OpenAIEmbedder.embed``, ``timeout_s`` = ``--index-timeout-s``, one try);
- ``huge-rerank`` and ``huge-embed``: a well-formed answer padded to ``--huge-mb`` MB.

For each: the budget, p50 and max seconds over ``--runs`` calls, what the call raised, and this process's RSS (MB,
``/proc/self/status`` VmRSS) before and after (the fake servers run in child processes, so their memory is not
counted). Run it from the repository root::

    python -m benchmarks.remote_deadlines --runs 5

The same script run against an older tree (``PYTHONPATH=<that tree>``) gives the "before" figures.
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.connection
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def rss_mb() -> float:
    """This process's resident set size, MB (``VmRSS``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _serve(mode: str, trickle_s: float, huge_bytes: int, conn: multiprocessing.connection.Connection) -> None:
    """A child process: one ``FakeModelServer`` in ``mode``; sends its URL, serves until ``conn`` is closed."""
    sys.path.insert(0, str(REPO / "tests"))
    from fake_model_server import FakeModelServer

    with FakeModelServer(dim=16, mode=mode, trickle_s=trickle_s, huge_bytes=huge_bytes) as fake:
        conn.send(fake.url)
        try:
            conn.recv()
        except EOFError:
            pass


def server(mode: str, trickle_s: float, huge_bytes: int) -> tuple[str, Callable[[], None]]:
    """A ``FakeModelServer`` in ``mode`` in a child process: its URL, and how to stop it."""
    ours, theirs = multiprocessing.Pipe()
    child = multiprocessing.get_context("fork").Process(target=_serve, args=(mode, trickle_s, huge_bytes, theirs),
                                                        daemon=True)
    child.start()
    url = str(ours.recv())

    def stop() -> None:
        ours.send("stop")
        child.join(10)

    return url, stop


def timed(name: str, budget_s: float, runs: int, call: Callable[[], object]) -> dict[str, object]:
    """``call`` ``runs`` times: its seconds (p50, max), what it raised, the RSS before and after."""
    before = rss_mb()
    seconds, outcomes = [], set()
    for _ in range(runs):
        started = time.monotonic()
        try:
            call()
            outcomes.add("answered")
        except Exception as exc:  # what the caller sees is the point: report it
            outcomes.add(type(exc).__name__)
        seconds.append(time.monotonic() - started)
    return {"case": name, "budget_s": budget_s, "p50_s": statistics.median(seconds), "max_s": max(seconds),
            "outcome": "/".join(sorted(outcomes)), "rss_before_mb": before, "rss_after_mb": rss_mb()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=2.0)
    parser.add_argument("--index-timeout-s", type=float, default=5.0)
    parser.add_argument("--trickle-s", type=float, default=0.05, help="seconds between the bytes of a trickle")
    parser.add_argument("--huge-mb", type=int, default=150)
    args = parser.parse_args(argv)
    from indexer.api import Chunk
    from indexer.builtin.http_rerank import HttpReranker
    from indexer.builtin.openai_embed import OpenAIEmbedder

    texts = ["The user drinks a flat white.", "Flights to Lisbon in March.", "Deploys on Tuesday mornings."]
    rows = []
    for mode in ("trickle", "huge"):
        url, stop = server(mode, args.trickle_s, args.huge_mb << 20)
        embedder = OpenAIEmbedder({"base_url": url, "model": "fake", "retries": 1,
                                   "query_timeout_s": args.budget_s, "timeout_s": args.index_timeout_s})
        reranker = HttpReranker({"base_url": url, "timeout_s": 10})
        try:
            if mode == "trickle":
                rows.append(timed("trickle-query", args.budget_s, args.runs,
                                  lambda e=embedder: e.embed_query("flat white")))
            rerank = timed(f"{mode}-rerank", args.budget_s, args.runs,
                           lambda r=reranker: r.score("flat white", texts, timeout_s=args.budget_s))
            embed = timed(f"{mode}-index" if mode == "trickle" else f"{mode}-embed", args.index_timeout_s,
                          max(1, args.runs // 2) if mode == "trickle" else args.runs,
                          lambda e=embedder: e.embed([Chunk(t) for t in texts]))
            rows += [rerank, embed]
        finally:
            embedder.close()
            reranker.close()
            stop()
    print(f"{'case':<16}{'budget_s':>9}{'p50_s':>8}{'max_s':>8}  {'outcome':<34}{'RSS MB before':>14}{'after':>8}")
    for row in rows:
        print(f"{row['case']:<16}{row['budget_s']:>9.1f}{row['p50_s']:>8.2f}{row['max_s']:>8.2f}  "
              f"{row['outcome']:<34}{row['rss_before_mb']:>14.0f}{row['rss_after_mb']:>8.0f}")


if __name__ == "__main__":
    main()
