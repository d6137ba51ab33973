"""Faults survived (``make faults``): a script, not a test. Each scenario runs the real daemon (``qmd-indexer run``
as a subprocess, Qdrant Edge, the real model at fp32) on a small workspace of real notes (see ``benchmarks.harness``),
does something bad to it, lets it converge, stops it with SIGTERM (exit 0 expected), and compares every point of its
store with a clean index of the same files made in this process: per point, the file, chunk index, content hash,
chunk text and dense vector. Counts: ``lost`` (a point of the clean index missing), ``stale`` (a point of another
version of a file, or of a file no longer there), ``duplicated`` (two points for one file chunk), ``wrong_vector``
(cosine to the clean vector under 0.999). A scenario passes when all four are 0 and the daemon never died.

Scenarios:

1. ``kill-first``: SIGKILL during a first index (after the k-th ``file_indexed`` line, k random, plus 0-50 ms; k = 0:
   0-4 s after ``store_opened``, while the model warms up and embeds), then a restart.
2. ``kill-burst``: on a ready daemon, a burst of 30 random appends, rewrites, renames, deletes and creations
   (0.02-0.2 s apart); SIGKILL at a random moment 0.3-6 s into it (the rest of the burst happens while it is down).
3. ``cache``: the embedding cache deleted, truncated to half, or overwritten with garbage before a start; deleted or
   truncated while running (then edits); the daemon must start, rebuild what it needs and lose nothing.
4. ``read-only``: the state dir made read-only under the running daemon (``mount --bind -o ro`` of the directory
   onto itself: root ignores permissions, so chmod would prove nothing), edits meanwhile, then write access back.
5. ``disk-full``: the state dir on a 16 MiB tmpfs (a first index needs more), then grown (``mount -o remount``);
   and a steady-state daemon whose tmpfs is filled to the last byte (``fallocate``) while edits arrive, then freed.
   Before the ``state_min_free_bytes`` check both killed the daemon with SIGBUS (exit 135) and no log line.

Mounts need root; without it scenarios 4 and 5 are reported as skipped. Output: a table per scenario, one verdict line
each, and ``.faults/results-<timestamp>.json``. ``--kill-trials N`` (default 20) splits N between 1 and 2.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    REPO,
    Burst,
    Daemon,
    Truth,
    compare,
    load_notes,
    log,
    make_workspace,
    sh,
    snapshot,
    wait_until,
)

COUNTS = ("lost", "duplicated", "stale", "wrong_vector")
NOTES = 24
MIB = 1024 * 1024
PROBE = "PROBE7731"  # a note's token searched for while the state dir is read-only or full


class Run:
    """One workspace and state dir carried through the scenarios; ``check`` compares them with the truth."""

    def __init__(self, out: Path, notes: int, seed: int) -> None:
        self.out = out
        self.texts, self.source = load_notes(notes * 3, seed)
        self.ws, self.state = out / "ws", out / "state"
        self.truth = Truth(out)
        self.n = 0
        self.rows: list[dict[str, Any]] = []
        self.fresh()

    def fresh(self) -> None:
        for path in (self.state,):
            if os.path.ismount(path):
                sh("umount", str(path))
        shutil.rmtree(self.state, ignore_errors=True)
        self.state.mkdir(parents=True)
        make_workspace(self.ws, self.texts[:NOTES])

    def daemon(self, tag: str) -> Daemon:
        self.n += 1
        return Daemon(self.ws, self.state, self.out / f"{self.n:03d}-{tag}.log")

    def burst(self, seed: int) -> Burst:
        return Burst(self.ws, self.texts, seed)

    def settle(self, daemon: Daemon) -> dict[str, Any]:
        """Ready, queue empty, a status read, SIGTERM; returns the status and the exit code."""
        ready_s = daemon.wait_ready()
        daemon.wait_quiet()
        status = daemon.get("/status")
        code = daemon.stop()
        return {"ready_s": round(ready_s, 1), "stop_rc": code, "chunks_embedded": status["chunks_embedded"],
                "health_after": "ok" if not status["store_degraded"] else "degraded"}

    def check(self, row: dict[str, Any]) -> dict[str, Any]:
        """Compare the (stopped) daemon's store with a clean index; add the counts to ``row`` and record it."""
        row.update(compare(snapshot(self.state / "qdrant"), self.truth.index(self.ws)))
        row["ok"] = all(row[c] == 0 for c in COUNTS) and row.get("stop_rc") == 0 and not row.get("died")
        self.rows.append(row)
        log("   " + "  ".join(f"{k}={v}" for k, v in row.items()))
        return row


# -- 1 + 2: SIGKILL -------------------------------------------------------------------------------------------------
def kill_first(run: Run, trial: int, rng: random.Random) -> None:
    run.fresh()
    files = NOTES + 1
    k = rng.randrange(0, files)
    daemon = run.daemon("first")
    wait_until(lambda: daemon.seen("store_opened"), 300, 0.02, "store_opened")
    if k == 0:
        delay = rng.uniform(0, 4)
        time.sleep(delay)
        moment = f"{delay:.2f}s after store_opened"
    else:
        wait_until(lambda: len(daemon.seen("file_indexed")) >= k or daemon.seen("daemon_ready"), 300, 0.005)
        delay = rng.uniform(0, 0.05)
        time.sleep(delay)
        moment = f"file {k} + {delay * 1000:.0f}ms"
    done = len(daemon.seen("file_indexed"))
    was_ready = bool(daemon.seen("daemon_ready"))
    daemon.kill()
    row = {"scenario": "kill-first", "trial": trial, "moment": moment, "indexed_at_kill": f"{done}/{files}",
           "ready_at_kill": was_ready}
    row.update(run.settle(run.daemon("restart")))
    run.check(row)


def kill_burst(run: Run, trial: int, rng: random.Random) -> None:
    daemon = run.daemon("burst")
    daemon.wait_ready()
    burst = run.burst(rng.randrange(10**9))
    ops: list[str] = []
    at = rng.uniform(0.3, 6.0)
    ops_at_kill: list[int] = []

    def edits() -> None:
        for _ in range(30):
            ops.append(burst.step())
            time.sleep(rng.uniform(0.02, 0.2))

    thread = threading.Thread(target=edits)
    thread.start()
    time.sleep(at)
    ops_at_kill.append(len(ops))
    indexed = len(daemon.seen("file_indexed")) + len(daemon.seen("file_removed"))
    daemon.kill()
    thread.join()
    row = {"scenario": "kill-burst", "trial": trial, "moment": f"{at:.2f}s into the burst",
           "ops_at_kill": f"{ops_at_kill[0]}/30", "writes_before_kill": indexed,
           "ops": ",".join(f"{op}:{ops.count(op)}" for op in sorted(set(ops)))}
    row.update(run.settle(run.daemon("restart")))
    run.check(row)


# -- 3: the embedding cache -----------------------------------------------------------------------------------------
def cache_files(state: Path) -> list[Path]:
    return [state / f"embeddings.sqlite3{suffix}" for suffix in ("", "-wal", "-shm")]


def damage(state: Path, how: str) -> str:
    cache = state / "embeddings.sqlite3"
    size = cache.stat().st_size if cache.exists() else 0
    if how == "delete":
        for path in cache_files(state):
            path.unlink(missing_ok=True)
        return f"deleted ({size} B)"
    if how == "truncate":
        os.truncate(cache, size // 2)
        return f"truncated {size} -> {size // 2} B"
    with open(cache, "r+b") as handle:  # garbage over the header and the first pages
        handle.write(random.Random(7).randbytes(min(size, 8192)))
    return f"first {min(size, 8192)} B garbage"


def cache_scenarios(run: Run, rng: random.Random) -> None:
    for how in ("delete", "truncate", "garbage"):  # before a start
        detail = damage(run.state, how)
        burst = run.burst(rng.randrange(10**9))
        for _ in range(5):
            burst.step()
        daemon = run.daemon(f"cache-{how}-before")
        row = {"scenario": "cache", "trial": f"{how} before start", "moment": detail}
        row.update(run.settle(daemon))
        row["events"] = ",".join(sorted({e["event"] for e in daemon.events() if e["event"].startswith("cache_")}))
        run.check(row)
    for how in ("delete", "truncate"):  # while running, then edits
        daemon = run.daemon(f"cache-{how}-running")
        daemon.wait_ready()
        detail = damage(run.state, how)
        burst = run.burst(rng.randrange(10**9))
        for _ in range(8):
            burst.step()
            time.sleep(0.3)
        time.sleep(2)
        row = {"scenario": "cache", "trial": f"{how} while running", "moment": detail}
        row.update(run.settle(daemon))
        row["events"] = ",".join(sorted({e["event"] for e in daemon.events() if e["event"].startswith("cache_")}))
        run.check(row)
        again = run.daemon(f"cache-{how}-restart")  # and a start on what it left
        row = {"scenario": "cache", "trial": f"restart after {how} while running", "moment": "-"}
        row.update(run.settle(again))
        row["events"] = ",".join(sorted({e["event"] for e in again.events() if e["event"].startswith("cache_")}))
        run.check(row)


# -- 4: read-only ---------------------------------------------------------------------------------------------------
def degraded_window(run: Run, daemon: Daemon, fault: Callable[[], str], heal: Callable[[], None], tag: str,
                    trial: str) -> None:
    """On a ready ``daemon``: ``fault()``, 8 edits, watch it for 10 s (alive, /health, an old note still found),
    ``heal()``, converge, stop, compare."""
    daemon.wait_ready()
    probe = run.ws / "memory" / "probe.md"
    before = {e["event"] for e in daemon.events()}
    detail = fault()
    burst = run.burst(random.Random(trial).randrange(10**9))
    for _ in range(8):
        burst.step()
        time.sleep(0.2)
    searches = errors = 0
    health: set[str] = set()
    died = False
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not daemon.alive():
            died = True
            break
        try:
            health.add(daemon.get("/health")["status"])
            answer = daemon.search(PROBE, k=1, mode="keyword")
            searches += 1
            if answer.status_code != 200 or [h["path"] for h in answer.json()["hits"]] != ["memory/probe.md"]:
                errors += 1
        except Exception:
            errors += 1
        time.sleep(0.5)
    new = sorted({e["event"] for e in daemon.events() if e.get("level") in ("error", "warning")} - before)
    heal()
    row: dict[str, Any] = {"scenario": tag, "trial": trial, "moment": detail, "died": died,
                           "rc": daemon.proc.returncode if died else None,
                           "searches_while": f"{searches - errors}/{searches} answered with the probe",
                           "health_while": ",".join(sorted(health)), "logged": ",".join(new) or "nothing"}
    if died:
        row["stop_rc"] = None
        row.update(run.settle(run.daemon(f"{tag}-after-death")))
    else:
        row.update(run.settle(daemon))
    run.check(row)
    probe.unlink(missing_ok=True)


def put_probe(run: Run) -> None:
    (run.ws / "memory" / "probe.md").write_text(f"# Probe\n\n{PROBE} indexed before the fault.\n")


def read_only(run: Run) -> None:
    put_probe(run)
    daemon = run.daemon("read-only")

    def fault() -> str:
        done = sh("mount", "--bind", "-o", "ro", str(run.state), str(run.state))
        if done.returncode:
            raise RuntimeError(f"mount --bind -o ro: {done.stderr.strip()}")
        probe = sh("touch", str(run.state / "write-probe"))
        return f"bind ro ({'writes refused' if probe.returncode else 'WRITES STILL ALLOWED'})"

    degraded_window(run, daemon, fault, lambda: (sh("umount", str(run.state)), None)[1], "read-only",
                    "ro bind mount while running")


# -- 5: disk full ---------------------------------------------------------------------------------------------------
def tmpfs(path: Path, size: str, remount: bool = False) -> None:
    opts = f"remount,size={size}" if remount else f"size={size}"
    done = sh("mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)) if not remount else sh(
        "mount", "-o", opts, str(path))
    if done.returncode:
        raise RuntimeError(f"mount tmpfs: {done.stderr.strip()}")


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def disk_full(run: Run) -> None:
    run.fresh()
    put_probe(run)
    tmpfs(run.state, "16m")
    daemon = run.daemon("full-first")
    died = False
    try:
        wait_until(lambda: not daemon.alive() or daemon.seen("state_dir_full"), 300, 0.2, "state_dir_full")
        wait_until(lambda: not daemon.alive() or daemon.seen("api_listening"), 60, 0.2, "api_listening")
        time.sleep(3)
        died = not daemon.alive()
        health = daemon.get("/health") if not died else {"status": "dead"}
    except Exception as exc:
        died, health = True, {"status": f"dead ({exc})"}
    logged = ",".join(sorted({e["event"] for e in daemon.events() if e.get("level") == "error"})) or "nothing"
    rc = daemon.proc.returncode if died else None
    tmpfs(run.state, "512m", remount=True)
    row: dict[str, Any] = {"scenario": "disk-full", "trial": "first index on a 16 MiB tmpfs", "moment": "start",
                           "died": died, "rc": rc, "health_while": f"{health}", "logged": logged}
    row.update(run.settle(daemon if not died else run.daemon("full-first-after-death")))
    run.check(row)

    filler = run.state / "filler"
    daemon = run.daemon("full-steady")

    def fill() -> str:
        with open(filler, "wb") as handle:
            os.posix_fallocate(handle.fileno(), 0, free_bytes(run.state))
            handle.write(b"\0" * 65536)  # fallocate leaves less than a page at most; this takes it
        return f"tmpfs filled ({free_bytes(run.state)} B free)"

    degraded_window(run, daemon, fill, lambda: filler.unlink(), "disk-full", "tmpfs filled while running")
    sh("umount", str(run.state))


# -- report ---------------------------------------------------------------------------------------------------------
def table(rows: list[dict[str, Any]]) -> str:
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    widths = {k: max(len(k), *(len(str(r.get(k, ""))) for r in rows)) for k in keys}
    lines = ["  ".join(k.ljust(widths[k]) for k in keys)]
    lines += ["  ".join(str(r.get(k, "")).ljust(widths[k]) for k in keys) for r in rows]
    return "\n".join(lines)


def verdict(name: str, rows: list[dict[str, Any]]) -> str:
    if not rows:
        return f"{name}: skipped"
    bad = [r for r in rows if not r["ok"]]
    sums = {c: sum(r[c] for r in rows) for c in COUNTS}
    state = "PASS" if not bad else f"FAIL ({len(bad)} trials)"
    codes = sorted({r.get("stop_rc") for r in rows}, key=str)
    return (f"{name}: {state}: {len(rows)} trials, " + ", ".join(f"{v} {k}" for k, v in sums.items())
            + f", died {sum(bool(r.get('died')) for r in rows)}, stop exit codes {codes}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kill-trials", type=int, default=20)
    parser.add_argument("--notes", type=int, default=NOTES)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--only", nargs="*", default=["kill", "cache", "read-only", "disk-full"])
    parser.add_argument("--out", type=Path, default=REPO / ".faults")
    args = parser.parse_args(argv)
    globals()["NOTES"] = args.notes
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    rng = random.Random(args.seed)
    started = time.monotonic()
    load = os.getloadavg()
    run = Run(args.out, args.notes, args.seed)
    log(f"notes from {run.source}; {args.notes} notes + MEMORY.md; load average {load}")
    root = os.geteuid() == 0
    first = args.kill_trials * 2 // 5
    steps: list[tuple[str, str, Callable[[], None]]] = [
        ("cache", "cache", lambda: cache_scenarios(run, rng)),
        ("read-only", "read-only", lambda: read_only(run) if root else None),
        ("disk-full", "disk-full", lambda: disk_full(run) if root else None),
        *[("kill", "kill-first", lambda t=t: kill_first(run, t, rng)) for t in range(1, first + 1)],
        *[("kill", "kill-burst", lambda t=t: kill_burst(run, t, rng))
          for t in range(1, args.kill_trials - first + 1)]]
    for group, scenario, step in steps:
        if group not in args.only:
            continue
        log(f"{scenario} ...")
        try:
            step()
        except Exception as exc:  # a scenario that could not run is a failed row, and the next one still runs
            log(f"   {scenario} failed to run: {type(exc).__name__}: {exc}")
            run.rows.append({"scenario": scenario, "trial": "error", "moment": f"{type(exc).__name__}: {exc}",
                             "ok": False, **dict.fromkeys(COUNTS, 0)})
        finally:
            if os.path.ismount(run.state):
                sh("umount", str(run.state))
    groups = {"kill-first": "SIGKILL during a first index", "kill-burst": "SIGKILL during bursts of edits",
              "cache": "embedding cache damaged", "read-only": "state dir read-only while running",
              "disk-full": "state dir full"}
    print(f"# qmd-indexer faults: notes from {run.source} ({args.notes} notes), seed {args.seed}, "
          f"load average at start {tuple(round(x, 2) for x in load)}, "
          f"end {tuple(round(x, 2) for x in os.getloadavg())}, "
          f"{(time.monotonic() - started) / 60:.1f} min")
    for key in groups:
        rows = [r for r in run.rows if r["scenario"] == key]
        if rows:
            print(f"\n## {groups[key]}\n{table(rows)}")
    print()
    for key, name in groups.items():
        rows = [r for r in run.rows if r["scenario"] == key]
        skipped = not rows and key in ("read-only", "disk-full") and not root
        print(f"{name}: skipped (mounts need root)" if skipped else verdict(name, rows))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"results-{stamp}.json").write_text(json.dumps(
        {"source": run.source, "notes": args.notes, "seed": args.seed, "rows": run.rows}, indent=1, default=str))
    return 0 if all(r["ok"] for r in run.rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
