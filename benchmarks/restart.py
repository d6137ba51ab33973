"""Where a restart's seconds go (``make restart``): a 40-note workspace indexed once, then restarted after SIGKILL
(``--kills``, default 10) and after SIGTERM on the same port with an idle client connected (``--terms``, default 3).
Each restart is timed from the process's start: the daemon's own ``startup_phase`` log lines (``imports``,
``store_opened``, ``http_listening``, ``model_loaded``, ``ready``: the first scan drained, queue empty; seconds
since the process started, ``indexer.state.Startup``), the model's ``model_loaded`` line (the sentence-transformers
load and the precision's own step: bf16 cast or int8 session), and, seen by a client polling from the start, the
first answered keyword search, the first answered hybrid search, the first hybrid search answered in full (without
``degraded``) and ``append_found``: a line with a new word appended to a note right after the process started, found
by a keyword search (its file indexed again: chunked and embedded, with the saved ONNX files while the model loads).
Prints p50, min and max of each over the SIGKILL restarts and over the SIGTERM ones, and writes
``<out>/restart-<time>.json``. Notes: 40 from ``../shared/data/vault`` when present (said on stderr), else
generated.

``--first-starts N`` adds N first starts, each on an empty state dir (no store, no exported models: the int8 and
query exports run behind the listening API, ``model_loading`` saying their progress), timed the same way.

``--before DIR`` (another checkout, e.g. ``git worktree add DIR <commit>``) runs that code too, each restart of it
right after the same restart of this tree's, each on its own state dir: on a shared machine both then meet the same
load, which separate runs minutes apart do not.

    python -m benchmarks.restart [--precision auto|fp32|bf16|int8] [--kills 10] [--terms 3] [--first-starts 0]
                                 [--out .restart] [--before DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import REPO, Daemon, free_port, load_notes, log, make_workspace, words

NOTES = 40
PHASES = ("imports", "store_opened", "http_listening", "keyword_answer", "hybrid_answer", "model_loaded",
          "hybrid_full", "ready")


def _probe(url: str, query: str, mode: str, out: dict[str, float], t0: float, stop: threading.Event,
           full: bool) -> None:
    """Poll ``POST /search`` from ``t0`` (wall clock): ``<mode>_answer`` is the first 200, and with ``full``
    ``hybrid_full`` the first 200 without ``degraded``."""
    first = f"{mode}_answer"
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            try:
                answer = client.post(url + "/search", json={"query": query, "mode": mode, "k": 3})
            except httpx.HTTPError:
                time.sleep(0.02)
                continue
            if answer.status_code == 200:
                now = time.time() - t0
                out.setdefault(first, now)
                if not full:
                    return
                if "degraded" not in answer.json():
                    out["hybrid_full"] = now
                    return
            time.sleep(0.02)


def _found(url: str, note: Path, ws: Path, out: dict[str, float], t0: float, stop: threading.Event) -> None:
    """Append a line with a new word to ``note`` now, then poll a keyword search for it: ``append_found`` is when
    a hit of that note shows it (seconds since ``t0``, wall clock)."""
    token = f"restartword{uuid.uuid4().hex[:10]}"
    rel = note.relative_to(ws).as_posix()
    with open(note, "a", encoding="utf-8") as handle:
        handle.write(f"\nSaved right after the restart: {token}.\n")
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            try:
                answer = client.post(url + "/search", json={"query": token, "mode": "keyword", "k": 3})
                if answer.status_code == 200 and any(
                        h.get("path") == rel and token in h.get("snippet", "") for h in answer.json()["hits"]):
                    out["append_found"] = time.time() - t0
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.02)


def restart(ws: Path, state: Path, log_path: Path, env: dict[str, str], query: str,
            port: int | None = None, repo: Path = REPO) -> tuple[Daemon, dict[str, Any]]:
    """Start a daemon of ``repo`` and time its start (see the module); returns it running, and the figures."""
    t0 = time.time()
    daemon = Daemon(ws, state, log_path, env=env, fp32=False, port=port, repo=repo)
    got: dict[str, Any] = {}
    stop = threading.Event()
    note = sorted((ws / "memory").rglob("*.md"))[0]
    probes = [threading.Thread(target=_probe, args=(daemon.url, query, "keyword", got, t0, stop, False)),
              threading.Thread(target=_probe, args=(daemon.url, query, "hybrid", got, t0, stop, True)),
              threading.Thread(target=_found, args=(daemon.url, note, ws, got, t0, stop))]
    for probe in probes:
        probe.start()
    try:
        daemon.wait_ready(120)
        daemon.wait_quiet(60, quiet_s=0.5)
        for probe in probes:
            probe.join(60)
        deadline = time.monotonic() + 120  # queries may answer in full before the model is in: wait for it too
        while time.monotonic() < deadline and not any(
                e.get("event") == "startup_phase" and e.get("phase") == "model_loaded" for e in daemon.events()):
            time.sleep(0.2)
    finally:
        stop.set()
    events = daemon.events()
    for event in events:
        if event.get("event") == "startup_phase":
            got.setdefault(event["phase"], event["s"])
        elif event.get("event") == "model_loaded":
            got.update(precision=event.get("precision"), model_load_s=event.get("load_s"),
                       precision_step_s=event.get("precision_s"))
    return daemon, got


def table(rows: list[dict[str, Any]], title: str) -> str:
    keys = [*PHASES, "model_load_s", "precision_step_s", "stop_s"]
    lines = [f"| {title} ({len(rows)} restarts) | p50 s | min | max |", "|---|---|---|---|"]
    for key in keys:
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        if values:
            lines.append(f"| {key} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
    return "\n".join(lines)


def trials(ws: Path, out: Path, env: dict[str, str], query: str, kills: int, terms: int,
           trees: dict[str, Path], first_starts: int = 0) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The first starts on empty state dirs, then index ``ws`` once per tree and the restarts, each tree in turn per
    start (see the module)."""
    import shutil

    got: dict[str, dict[str, list[dict[str, Any]]]] = {name: {"first": [], "sigkill": [], "sigterm": []}
                                                       for name in trees}
    for i in range(first_starts):
        for name, repo in trees.items():
            state = out / f"first-{name}"
            shutil.rmtree(state, ignore_errors=True)
            daemon, row = restart(ws, state, out / f"{name}-first-{i}.log", env, query, repo=repo)
            daemon.kill()
            got[name]["first"].append(row)
            log(f"{name} first start {i + 1}: " + json.dumps(row))
    for name, repo in trees.items():
        shutil.rmtree(out / f"state-{name}", ignore_errors=True)
        first = Daemon(ws, out / f"state-{name}", out / f"{name}-first.log", env=env, fp32=False, repo=repo)
        log(f"{name}: first index ready in {first.wait_ready(600):.1f} s")
        first.wait_quiet(60, quiet_s=0.5)
        first.kill()
    for i in range(kills):
        for name, repo in trees.items():
            daemon, row = restart(ws, out / f"state-{name}", out / f"{name}-kill-{i}.log", env, query, repo=repo)
            daemon.kill()
            got[name]["sigkill"].append(row)
            log(f"{name} SIGKILL restart {i + 1}: " + json.dumps(row))
    ports = {name: free_port() for name in trees}
    running = {name: restart(ws, out / f"state-{name}", out / f"{name}-term-0.log", env, query, ports[name],
                             repo)[0] for name, repo in trees.items()}
    for i in range(terms):
        for name, repo in trees.items():
            daemon = running[name]
            idle = httpx.Client(timeout=10)  # an idle keep-alive connection during the stop
            idle.get(daemon.url + "/health")
            stopping = time.monotonic()
            code = daemon.stop()
            stop_s = time.monotonic() - stopping
            idle.close()
            running[name], row = restart(ws, out / f"state-{name}", out / f"{name}-term-{i + 1}.log", env, query,
                                         ports[name], repo)
            row.update(stop_s=round(stop_s, 3), stop_code=code)
            got[name]["sigterm"].append(row)
            log(f"{name} SIGTERM restart {i + 1}: " + json.dumps(row))
    for daemon in running.values():
        daemon.stop()
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "int8"])
    parser.add_argument("--kills", type=int, default=10, help="restarts after SIGKILL")
    parser.add_argument("--terms", type=int, default=3, help="restarts after SIGTERM, same port, idle client")
    parser.add_argument("--first-starts", type=int, default=0, help="starts on an empty state dir (exports included)")
    parser.add_argument("--out", type=Path, default=Path(".restart"))
    parser.add_argument("--before", type=Path, help="another checkout to run in turn with this one")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    texts, source = load_notes(NOTES)
    log(f"notes: {NOTES} from {source}" + ("" if source != "generated" else " (../shared/data/vault is missing)"))
    ws = out / "ws"
    make_workspace(ws, texts)
    env = {} if args.precision == "auto" else {"QMD_INDEXER_PRECISION": args.precision}
    query = " ".join(words(texts[0])[:3]) or "memory"
    trees = {"this": REPO, **({"before": args.before.resolve()} if args.before else {})}
    load_before = os.getloadavg()
    got = trials(ws, out, env, query, args.kills, args.terms, trees, args.first_starts)
    load_after = os.getloadavg()
    ran = sorted({str(r.get("precision")) for runs in got.values() for rows in runs.values() for r in rows})
    report = {"at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "notes": source,
              "precision": args.precision, "ran": ran, "load_before": load_before, "load_after": load_after,
              "trees": {name: str(path) for name, path in trees.items()}, "runs": got}
    name = out / f"restart-{time.strftime('%Y%m%d-%H%M%S')}.json"
    name.write_text(json.dumps(report, indent=1))
    print(f"precision {args.precision} (ran {', '.join(ran)}); notes from {source}; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; seconds since the process started")
    for tree in trees:
        print(f"\n{tree} ({trees[tree]})")
        if got[tree]["first"]:
            print(table(got[tree]["first"], "first start, empty state dir"))
            print()
        print(table(got[tree]["sigkill"], "after SIGKILL"))
        print()
        print(table(got[tree]["sigterm"], "after SIGTERM, same port, idle client"))
    print(f"\n{name}")


if __name__ == "__main__":
    main()
