"""Search under load while notes are being saved (``make load``): a script, not a test.

The real daemon (``qmd-indexer run`` as a subprocess, Qdrant Edge, the real model at fp32) indexes a workspace of
real notes (``benchmarks.harness``: 60 from ``../shared/data/vault`` by default). Then, for ``--seconds`` (60):

- ``--clients`` (16) concurrent search clients (one asyncio task and one keep-alive connection each, httpx) send
  ``POST /search`` back to back, ``--mode`` (hybrid) with k=6, cycling through the notes' headings and first words;
- a writer appends a line with a unique token to a note every ``--every`` seconds (0.5), rotating over 8 notes (so
  each note is quiet between its saves for longer than the 1 s debounce), and for each save a prober polls a
  keyword search for its token every 50 ms until that note is returned: save-to-searchable.

Reported: requests, errors (an exception or a status other than 200), requests/s, latency p50/p95/p99/max (ms),
save-to-searchable p50/p95/max (s) and saves not searchable within 30 s, and the load average (the machine is
shared: absolute numbers drift with it). Written to ``.load/results-<timestamp>.json`` too. Aim: 0 errors and p95
under 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.harness import REPO, Daemon, load_notes, log, make_workspace

PROBE_TIMEOUT_S = 30.0
ROTATE = 8  # notes the writer cycles through


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else float("nan")


def queries_from(texts: list[str]) -> list[str]:
    """A heading or the first words of each note: what a user would ask about it."""
    out = []
    for text in texts:
        lines = [ln.strip("# ").strip() for ln in text.splitlines() if ln.strip()]
        out.append(" ".join((lines[0] if lines else "memory").split()[:8]))
    return out


async def client(url: str, queries: list[str], offset: int, mode: str, until: float,
                 latencies: list[float], errors: list[str]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        i = offset
        while time.monotonic() < until:
            query = queries[i % len(queries)]
            i += 1
            started = time.perf_counter()
            try:
                answer = await http.post("/search", json={"query": query, "k": 6, "mode": mode})
                if answer.status_code != 200:
                    errors.append(f"{answer.status_code}: {answer.text[:200]}")
                    continue
            except httpx.HTTPError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            latencies.append(time.perf_counter() - started)


def token_for(n: int) -> str:
    """A word found in no note, one per save, letters only: digits would be split off into a token of their own by
    the BM25 tokenizer, and the shared prefix would then match the note's earlier saves."""
    letters = ""
    while True:
        n, r = divmod(n, 26)
        letters += chr(ord("a") + r)
        if not n:
            break
    return f"zyloadsave{letters}q"


async def probe(http: httpx.AsyncClient, token: str, path: str, saved: float, out: list[float],
                missed: list[str]) -> None:
    while time.monotonic() - saved < PROBE_TIMEOUT_S:
        try:
            answer = await http.post("/search", json={"query": token, "k": 3, "mode": "keyword"})
            if answer.status_code == 200 and any(h["path"] == path for h in answer.json()["hits"]):
                out.append(time.monotonic() - saved)
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.05)
    missed.append(token)


async def writer(url: str, ws: Path, every_s: float, until: float, visible: list[float], missed: list[str]) -> int:
    notes = sorted((ws / "memory").glob("note-*.md"))[:ROTATE]
    probes = []
    n = 0
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        next_at = time.monotonic()
        while next_at < until:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            note = notes[n % len(notes)]
            token = token_for(n)
            with open(note, "a") as handle:
                handle.write(f"\nSaved under load: {token}.\n")
            probes.append(asyncio.create_task(probe(http, token, f"memory/{note.name}", time.monotonic(), visible,
                                                    missed)))
            n += 1
            next_at += every_s
        await asyncio.gather(*probes)
    return n


async def drive(url: str, ws: Path, queries: list[str], args: argparse.Namespace) -> dict[str, Any]:
    latencies: list[float] = []
    errors: list[str] = []
    visible: list[float] = []
    missed: list[str] = []
    started = time.monotonic()
    until = started + args.seconds
    clients = [client(url, queries, i * 7, args.mode, until, latencies, errors) for i in range(args.clients)]
    results = await asyncio.gather(writer(url, ws, args.every, until, visible, missed), *clients)
    elapsed = time.monotonic() - started
    ms = [x * 1000 for x in latencies]
    return {
        "clients": args.clients, "seconds": args.seconds, "mode": args.mode, "requests": len(latencies) + len(errors),
        "errors": len(errors), "error_samples": errors[:5], "requests_per_s": round(len(latencies) / args.seconds, 1),
        "latency_ms": {"p50": round(pct(ms, 50), 1), "p95": round(pct(ms, 95), 1), "p99": round(pct(ms, 99), 1),
                       "max": round(max(ms, default=float("nan")), 1)},
        "saves": results[0], "save_to_searchable_s": {"p50": round(pct(visible, 50), 2),
                                                       "p95": round(pct(visible, 95), 2),
                                                       "max": round(max(visible, default=float("nan")), 2)},
        "saves_not_searchable_in_30s": len(missed), "wall_s": round(elapsed, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=0.5, help="seconds between saves")
    parser.add_argument("--notes", type=int, default=60)
    parser.add_argument("--mode", choices=["hybrid", "dense", "keyword"], default="hybrid")
    parser.add_argument("--out", type=Path, default=REPO / ".load")
    args = parser.parse_args(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    texts, source = load_notes(args.notes)
    ws = args.out / "ws"
    make_workspace(ws, texts)
    daemon = Daemon(ws, args.out / "state", args.out / "daemon.log")
    try:
        ready_s = daemon.wait_ready()
        daemon.wait_quiet()
        log(f"ready in {ready_s:.1f} s on {args.notes} notes from {source}; {args.clients} clients for "
            f"{args.seconds:.0f} s ...")
        load_before = os.getloadavg()
        result = asyncio.run(drive(daemon.url, ws, queries_from(texts), args))
        load_after = os.getloadavg()
        status = daemon.get("/status")
        stop_rc = daemon.stop()
    finally:
        if daemon.alive():
            daemon.proc.kill()
    result.update({"source": source, "notes": args.notes, "ready_s": round(ready_s, 1), "stop_rc": stop_rc,
                   "files_indexed": sum(c["files"] for c in status["collections"].values()),
                   "load_average_before": [round(x, 2) for x in load_before],
                   "load_average_after": [round(x, 2) for x in load_after], "cpus": os.cpu_count()})
    lat, vis = result["latency_ms"], result["save_to_searchable_s"]
    print(f"# qmd-indexer load: {args.clients} clients x {args.seconds:.0f} s, {args.mode} k=6, a save every "
          f"{args.every} s; {args.notes} notes from {source}; {os.cpu_count()} CPUs, load average "
          f"{result['load_average_before']} before, {result['load_average_after']} after")
    print(f"requests {result['requests']}  errors {result['errors']}  {result['requests_per_s']} req/s")
    print(f"latency ms  p50 {lat['p50']}  p95 {lat['p95']}  p99 {lat['p99']}  max {lat['max']}")
    print(f"save-to-searchable s  p50 {vis['p50']}  p95 {vis['p95']}  max {vis['max']}  ({result['saves']} saves, "
          f"{result['saves_not_searchable_in_30s']} not searchable within {PROBE_TIMEOUT_S:.0f} s)")
    aim = result["errors"] == 0 and lat["p95"] < 100
    print(f"verdict: {'met' if aim else 'missed'} the aim (0 errors, p95 < 100 ms); daemon stop exit {stop_rc}")
    (args.out / f"results-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(result, indent=1))
    return 0 if result["errors"] == 0 and stop_rc == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
