"""A big conversation log indexed by a running daemon: how much it grows and how searches fare meanwhile.

A ~10 MB daily-log-style note (``- [HH:MM] Name: text``, about 40,000 turns, what ``indexer.conversation`` reads as a
log) is written into the ``memory/`` of a running ``qmd-indexer run`` (a subprocess, ``benchmarks.harness.Daemon``)
beside a few small notes. A thread samples the daemon's resident set (psutil, every 50 ms) and another asks
``POST /search`` over HTTP in a loop until the log's ``file_indexed`` line. Printed: the resident set before, at its
peak while the log is indexed and after (MiB, and the growth; of the growth at the peak, ``anon`` is the heap's,
``RssAnon``, and ``file`` the mapped files', ``RssFile``: the store's), the searches' p50/p95/max (ms), the seconds to
index, and the load average. The issue's goal: growth <= 300 MB and search p95 < 100 ms.

With ``--transcript`` the same turns are an OpenClaw session transcript instead (JSON Lines: a ``session`` record,
then one ``message`` record per turn, user and assistant alternating, ``indexer.builtin.transcripts``) of about the
same size, written into the ``sessions`` folder of the daemon's workspace (a config file's ``[[workspace]]`` table),
so the transcript path (``indexer.sources.transcripts``, read streamed) is measured too.

Turn texts come from ``../shared/data/convmem`` (real conversation turns), else are generated (said so). With
``--before DIR`` (another checkout, e.g. ``git archive`` of an older commit) the same run is made with it first, in
the same session, so the figures compare under the same load::

    python -m benchmarks.big_log [--mb 10] [--transcript] [--before /tmp/base] [--precision fp32]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO, SHARED, Daemon, log, make_workspace, wait_until

QUERIES = ["deploy window on Thursday", "flat white without sugar", "what did Melanie paint",
           "support group yesterday", "export job ran out of disk", "flights to Lisbon in March"]
NAMES = ("Caroline", "Melanie")


def turn_pool() -> tuple[list[str], str]:
    """Turn texts (what follows ``- Name: ``) from convmem's daily logs, and where they came from."""
    for base in SHARED:
        root = base / "convmem" / "agents"
        if root.is_dir():
            texts = [line.split(": ", 1)[1] for path in sorted(root.glob("*/memory/*.md"))
                     for line in path.read_text(encoding="utf-8").splitlines()
                     if line.startswith("- ") and ": " in line]
            if texts:
                return texts, str(root)
    rng = random.Random(0)
    words = "the a we went saw talked about painting kids work trip dog coffee launch plan week".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(8, 40))) for _ in range(5000)], "generated"


def big_log(size_bytes: int, pool: list[str], seed: int = 0) -> tuple[str, int]:
    """A daily log of about ``size_bytes`` bytes: ``# date``, a preamble and ``- [HH:MM] Name: text`` turns; and
    its number of turns."""
    rng = random.Random(seed)
    lines = ["# 2023-05-08", "", "Conversation between Caroline and Melanie.", ""]
    size, turns = 0, 0
    while size < size_bytes:
        minute = turns // 4
        line = f"- [{minute // 60 % 24:02d}:{minute % 60:02d}] {NAMES[turns % 2]}: {rng.choice(pool)}"
        lines.append(line)
        size += len(line.encode("utf-8")) + 1
        turns += 1
    return "\n".join(lines) + "\n", turns


SESSION = "7d0c6f1e-2b4a-5c3e-9f1d-8a6b4c2e0d13"


def big_transcript(size_bytes: int, pool: list[str], seed: int = 0) -> tuple[str, int]:
    """An OpenClaw session transcript of about ``size_bytes`` bytes: a ``session`` record, then ``message`` records
    of ``Name: text`` turns, user and assistant alternating, 15 s apart; and its number of turns."""
    rng = random.Random(seed)
    start = datetime.datetime(2023, 5, 8, 9, 0, tzinfo=datetime.UTC)

    def stamp(n: int) -> str:
        return (start + datetime.timedelta(seconds=15 * n)).strftime("%Y-%m-%dT%H:%M:%S.000Z")

    lines = [json.dumps({"type": "session", "version": 3, "id": SESSION, "timestamp": stamp(0), "cwd": "/home/a"})]
    size, turns = len(lines[0]) + 1, 0
    while size < size_bytes:
        role = "user" if turns % 2 == 0 else "assistant"
        line = json.dumps({"type": "message", "id": f"m{turns}", "timestamp": stamp(turns), "message": {
            "role": role, "content": [{"type": "text", "text": f"{NAMES[turns % 2]}: {rng.choice(pool)}"}]}})
        lines.append(line)
        size += len(line.encode("utf-8")) + 1
        turns += 1
    return "\n".join(lines) + "\n", turns


def measure(repo: Path, out: Path, text: str, env: dict[str, str], transcript: bool = False,
            max_s: float = 7200) -> dict[str, Any]:
    """One daemon from checkout ``repo``: the log (or, with ``transcript``, the session transcript) written once it
    is ready and idle; its figures, over at most ``max_s`` seconds of indexing (``chunks`` then says ``<n>+``: the
    chunks embedded by then)."""
    import psutil

    ws = out / "ws"
    make_workspace(ws, ["# Deploys\n\nDeploy window is Thursday morning.\n",
                        "# Coffee\n\nThe user drinks a flat white without sugar.\n",
                        "# Travel\n\nFlights to Lisbon are booked for March.\n"])
    config = None
    path = ws / "memory" / "2023-05-08.md"
    if transcript:  # OpenClaw's layout: agents/<id>/sessions beside the workspace
        sessions = out / "agents" / "main" / "sessions"
        sessions.mkdir(parents=True)
        config = out / "config.toml"
        config.write_text(f'[[workspace]]\nagent = "main"\npath = {json.dumps(str(ws))}\n'
                          f'sessions = {json.dumps(str(sessions))}\n')
        path = sessions / f"{SESSION}.jsonl"
    daemon = Daemon(ws, out / "state", out / "daemon.log", env=env, repo=repo, config=config)
    try:
        daemon.wait_ready(600)
        daemon.search("warm up")
        daemon.wait_quiet()
        process = psutil.Process(daemon.proc.pid)
        before = process.memory_info().rss
        parts_before = daemon.rss_parts()
        peak = [before]
        peak_parts = [parts_before]  # RssAnon (the heap) and RssFile (mapped files: the store's) at the peak
        latencies: list[float] = []
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.05):
                rss = process.memory_info().rss
                if rss > peak[0]:
                    peak[0], peak_parts[0] = rss, daemon.rss_parts()

        def ask() -> None:
            n = 0
            while not done.is_set():
                started = time.perf_counter()
                response = daemon.search(QUERIES[n % len(QUERIES)], k=5)
                latencies.append((time.perf_counter() - started) * 1000)
                response.raise_for_status()
                n += 1
                time.sleep(0.05)

        threads = [threading.Thread(target=sample, daemon=True), threading.Thread(target=ask, daemon=True)]
        for thread in threads:
            thread.start()
        log(f"{repo}: {before / 2**20:.0f} MiB before the {'transcript' if transcript else 'log'}; writing it")
        started = time.monotonic()
        path.write_text(text, encoding="utf-8")
        try:
            indexed = wait_until(lambda: [e for e in daemon.seen("file_indexed") if e.get("path") == str(path)],
                                 max_s, 0.5, "the log indexed")
        except TimeoutError:  # ``--max-s``: the figures of its first ``max_s`` seconds
            indexed = [{"chunks": f"{daemon.get('/status')['chunks_embedded']}+"}]
        seconds = time.monotonic() - started
        done.set()
        for thread in threads:
            thread.join(15)
        time.sleep(2)
        after = process.memory_info().rss
        ordered = sorted(latencies)
        split = {f"peak_{key.lower()}_growth_mib": peak_parts[0].get(key, 0) - parts_before.get(key, 0)
                 for key in ("RssAnon", "RssFile")}
        return {"repo": str(repo), **split, "before_mib": before / 2**20, "peak_mib": peak[0] / 2**20,
                "after_mib": after / 2**20, "growth_mib": (peak[0] - before) / 2**20, "index_s": seconds,
                "chunks": indexed[0].get("chunks"), "searches": len(ordered),
                "p50_ms": statistics.median(ordered), "p95_ms": ordered[int(0.95 * (len(ordered) - 1))],
                "max_ms": ordered[-1]}
    finally:
        daemon.stop()


def chunk_cost(text: str) -> dict[str, float]:
    """In this process, with whatever ``indexer`` is importable (``PYTHONPATH`` picks a checkout): the growth of the
    resident set's peak (MiB, ``ru_maxrss``) and the seconds while the log is cut into chunks by the model's own
    tokenizer (``transformers``' fast tokenizer, as the embedder's ``token_offsets``), with no model and no store:
    the part of the daemon's peak that reading a huge note costs before anything is embedded."""
    import resource

    from transformers import AutoTokenizer

    from indexer.builtin.text_model import resolve_model
    from indexer.sections import chunk_markdown

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("all-MiniLM-L6-v2")[1])

    def token_offsets(part: str) -> list[tuple[int, int]]:
        encoded = tokenizer(part, add_special_tokens=False, return_offsets_mapping=True,
                            return_attention_mask=False, truncation=False)
        return [tuple(pair) for pair in encoded["offset_mapping"]]

    token_offsets("warm up")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    chunks = chunk_markdown(text, token_offsets, 256, "memory/2023-05-08.md")
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"chunks": len(chunks), "growth_mib": peak - base, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=10.0, help="size of the log, MB")
    parser.add_argument("--transcript", action="store_true",
                        help="an OpenClaw session transcript in the sessions folder instead of a log in memory/")
    parser.add_argument("--precision", default="fp32", choices=["auto", "fp32", "bf16", "int8"])
    parser.add_argument("--before", type=Path, help="another checkout to measure first, in the same run")
    parser.add_argument("--this", action=argparse.BooleanOptionalAction, default=True,
                        help="measure this checkout (--no-this: only --before's)")
    parser.add_argument("--chunk-only", action="store_true",
                        help="only the chunking of the log, in this process (no daemon): its peak growth and time")
    parser.add_argument("--max-s", type=float, default=7200,
                        help="measure at most this many seconds of indexing (chunks then reads '<embedded>+')")
    parser.add_argument("--out", type=Path, default=Path(".big_log"))
    args = parser.parse_args()
    pool, source = turn_pool()
    text, turns = (big_transcript if args.transcript else big_log)(int(args.mb * 1_000_000), pool)
    what = "transcript" if args.transcript else "log"
    log(f"{what}: {len(text.encode()) / 1e6:.1f} MB, {turns} turns, texts from {source}"
        + (" (../shared/data/convmem is missing)" if source == "generated" else ""))
    if args.chunk_only and args.transcript:
        parser.error("--chunk-only measures the log's chunking only")
    if args.chunk_only:
        import indexer

        load = os.getloadavg()
        cost = chunk_cost(text)
        print(f"{Path(indexer.__file__).parent.parent}: {cost['chunks']} chunks, peak +{cost['growth_mib']:.0f} MiB, "
              f"{cost['seconds']:.1f} s; load average {load[0]:.2f}")
        return
    env = {"QMD_INDEXER_PRECISION": args.precision}
    trees = {**({"before": args.before.resolve()} if args.before else {}), **({"this": REPO} if args.this else {})}
    load = os.getloadavg()
    rows = {}
    for name, repo in trees.items():
        out = args.out.resolve() / name
        if out.exists():
            import shutil

            shutil.rmtree(out)
        out.mkdir(parents=True)
        rows[name] = measure(repo, out, text, env, args.transcript, args.max_s)
        log(f"{name}: {rows[name]}")
    print(f"\n{len(text.encode()) / 1e6:.1f} MB {what}, {turns} turns; precision {args.precision}; load average "
          f"{load[0]:.2f} before, {os.getloadavg()[0]:.2f} after; {os.cpu_count()} CPUs")
    print(f"{'tree':8} {'before MiB':>10} {'peak MiB':>9} {'after MiB':>9} {'growth':>7} {'anon':>5} {'file':>5} "
          f"{'index s':>8} {'chunks':>7} {'searches':>8} {'p50 ms':>7} {'p95 ms':>7} {'max ms':>7}")
    for name, r in rows.items():
        print(f"{name:8} {r['before_mib']:10.0f} {r['peak_mib']:9.0f} {r['after_mib']:9.0f} {r['growth_mib']:7.0f} "
              f"{r['peak_rssanon_growth_mib']:5d} {r['peak_rssfile_growth_mib']:5d} "
              f"{r['index_s']:8.1f} {r['chunks']!s:>7} {r['searches']:8d} {r['p50_ms']:7.1f} {r['p95_ms']:7.1f} "
              f"{r['max_ms']:7.1f}")
    if "before" in rows and "this" in rows:
        b, t = rows["before"], rows["this"]
        print(f"ratios this/before: growth {t['growth_mib'] / max(b['growth_mib'], 1):.2f}, "
              f"p95 {t['p95_ms'] / max(b['p95_ms'], 1e-3):.2f}, index time {t['index_s'] / b['index_s']:.2f}")


if __name__ == "__main__":
    main()
