"""Build a Qdrant Edge shard's HNSW index in a child process: ``EdgeShard.optimize()`` holds the GIL for its whole
run (a minute or more at tens of thousands of points), which would freeze the watcher and the API if it ran in the
daemon. ``EdgeStore.build_index`` copies the shard, has ``optimize_copy`` build the copy's index here, then replays
the writes made meanwhile and swaps the copy in.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

# the child: lower its priority, load the copy, build its index, persist it (argv: the shard's folder, the niceness)
_OPTIMIZE = ("import os, sys, qdrant_edge as qe\nos.nice(int(sys.argv[2]))\n"
             "shard = qe.EdgeShard.load(sys.argv[1])\nshard.optimize()\nshard.flush()\nshard.close()\n")


def optimize_copy(shard_dir: Path, stop: threading.Event | None, nice: int, timeout_s: float) -> tuple[int, str]:
    """Run ``optimize()`` on the shard in ``shard_dir`` in a child process (``nice`` added to its niceness) until it
    ends, ``stop`` is set or ``timeout_s`` seconds pass (then it is killed: return code -9). Returns the child's
    return code and the last 2,000 characters of its output."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", _OPTIMIZE, str(shard_dir), str(nice)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        while proc.poll() is None and not (stop is not None and stop.is_set()):
            if time.monotonic() - started > timeout_s:
                break
            try:
                proc.wait(0.5)
            except subprocess.TimeoutExpired:
                pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = proc.stdout.read().decode(errors="replace")[-2000:] if proc.stdout else ""
    if proc.stdout:
        proc.stdout.close()
    return proc.returncode, output
