"""Time from a change behind a polled mount to searchable: p50/p95 over 20 changes (a benchmark, not a test).

A workspace is mounted with bindfs (FUSE) and indexed through the mount with ``watch = "auto"`` (so the root is
polled: a FUSE mount raises no inotify event for changes made in its backing folder). Each change appends a line with
a unique token to a note in the backing folder; the time from the write to the first keyword search (polled every
20 ms, in process) that returns it is recorded. ``--poll-interval`` sets ``poll_interval_s`` (default 2 s, the
product default); the debounce is the product default (1 s). Needs ``bindfs`` and FUSE; exits 2 saying why when
either is missing. Run: ``HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.polled_mount``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from indexer.config import Settings
from indexer.daemon import Indexer
from indexer.search import SearchParams
from indexer.worker import run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--poll-interval", type=float, default=2.0)
    args = parser.parse_args()
    if shutil.which("bindfs") is None:
        print("bindfs is not installed (apt-get install bindfs)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        backing, mount = Path(tmp) / "backing", Path(tmp) / "mnt"
        (backing / "memory").mkdir(parents=True)
        (backing / "MEMORY.md").write_text("# Memory\n\nStart.\n")
        note = backing / "memory" / "note.md"
        note.write_text("# Note\n\n")
        mount.mkdir()
        done = subprocess.run(["bindfs", str(backing), str(mount)], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"cannot mount with bindfs here: {done.stderr.strip()}", file=sys.stderr)
            return 2
        try:
            settings = Settings(state_dir=Path(tmp) / "state", poll_interval_s=args.poll_interval,
                                workspace=[{"agent": "main", "path": mount}])
            indexer = Indexer.open(settings)
            stop = threading.Event()
            worker = threading.Thread(target=run, args=(indexer, stop), daemon=True)
            worker.start()
            indexer.state.ready.wait(120)
            print("watch:", indexer.view.status()["watch"], indexer.view.status()["watch_polled"])
            searcher = indexer.view.searcher()
            times = []
            for n in range(args.changes):
                token = f"POLLTOKEN{n:03d}X"
                started = time.monotonic()
                with open(note, "a") as handle:
                    handle.write(f"{token} appended.\n")
                while not searcher.search(SearchParams(token, k=1, mode="keyword")):
                    if time.monotonic() - started > 60:
                        raise SystemExit(f"{token} not searchable after 60 s")
                    time.sleep(0.02)
                times.append(time.monotonic() - started)
            stop.set()
            indexer.settler.wake()
            worker.join(30)
            indexer.close()
        finally:
            subprocess.run(["fusermount", "-u", str(mount)], capture_output=True)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    print(f"change behind a polled mount -> searchable, {len(times)} changes, poll_interval_s={args.poll_interval}, "
          f"settle_s=1.0: p50 {statistics.median(times):.2f} s, p95 {p95:.2f} s, max {times[-1]:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
