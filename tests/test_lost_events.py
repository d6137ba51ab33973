"""Events the kernel never delivers are recovered at once, and paths the daemon cannot use are reported.

- The inotify watch limit hit below a root (watchdog swallows the refusal for subdirectories): found, logged once,
  that root polled. Run in a user namespace whose ``max_inotify_watches`` is 40, so the machine's limit is untouched.
- A kernel event queue overflow (``IN_Q_OVERFLOW``): an immediate reconcile, reported by ``status``.
- An unreadable directory under ``memory/``, a missing extra path, an extra path overlapping ``memory/``: one log
  line each, a ``status`` entry and a ``doctor`` finding; ``doctor`` also lists the polled roots and why.

Real files, real watchdog observers, the real model and Qdrant Edge; the kernel limits are real too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import Running, wait_for, write
from structlog.testing import capture_logs

import indexer

ENV = {**os.environ, "PYTHONPATH": str(Path(indexer.__file__).parent.parent), "HF_HUB_OFFLINE": "1"}

# Watches a workspace with ``Watcher`` (no model: only the watcher is under test), makes ``after`` directories once
# it runs, writes a note into the deepest directory and reports what the watcher saw and said, as JSON.
_WATCH_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from structlog.testing import capture_logs
    from indexer.config import Workspace
    from indexer.watcher import Watcher
    from indexer.workspace import plan_collections

    ws, after = Path(sys.argv[1]), int(sys.argv[2])
    seen = set()
    with capture_logs() as logs:
        watcher = Watcher(plan_collections([Workspace(agent="main", path=ws)]), lambda p, q: seen.add(str(p)),
                          poll_interval_s=0.2)
        watcher.start()
        deepest = max((p for p in (ws / "memory").rglob("*") if p.is_dir()), key=lambda p: (len(p.parts), str(p)))
        for n in range(after):
            deepest = ws / "memory" / "late" / f"d{n}"
            deepest.mkdir(parents=True)
        time.sleep(0.5)
        note = deepest / "note.md"
        note.write_text("# Deep\\n\\nDEEPAAAA1\\n")
        deadline = time.monotonic() + 10
        while str(note) not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
        lost = watcher.take_lost()
        modes, reasons = watcher.modes(), dict(watcher.poll_reasons)
        watcher.stop()
    print(json.dumps({"seen": str(note) in seen, "modes": modes, "reasons": reasons, "lost": lost,
                      "events": [e["event"] for e in logs]}))
""")


def _in_user_namespace_with_watches(limit: int, args: list[str]) -> dict:
    """Run ``_WATCH_SCRIPT`` in a new user namespace (mapped to root) whose inotify watch limit is ``limit``."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    shell = f"echo {limit} > /proc/sys/user/max_inotify_watches && exec \"$@\""
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", shell, "sh", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a user namespace with its own inotify limit here: {probe.stderr.strip()}")
    done = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", shell, "sh", sys.executable, "-c",
                           _WATCH_SCRIPT, *args], capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("before", "after"), [(240, 0), (20, 60)], ids=["at_start", "while_running"])
def test_the_watch_limit_hit_below_the_root_polls_that_root(tmp_path: Path, before: int, after: int) -> None:
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# Memory\n")
    for n in range(before):  # 40 watches allowed: the root, memory/ and 38 of its directories
        (ws / "memory" / f"d{n // 20}" / f"e{n}").mkdir(parents=True)
    report = _in_user_namespace_with_watches(40, [str(ws), str(after)])
    memory = str(ws / "memory")
    assert report["seen"], report
    assert report["events"].count("watch_limit_reached") == 1, report["events"]
    assert report["modes"][memory] == "poll" and report["reasons"][memory] == "watch_limit_reached"
    assert report["modes"][str(ws)] == "native"
    if after:  # events were missed between the refused watch and the first poll: the root is reconciled
        assert report["lost"] == {memory: "watch_limit_reached"}


@contextmanager
def _inotify_queue_of(events: int) -> Iterator[None]:
    """``fs.inotify.max_queued_events`` lowered to ``events`` for inotify instances made meanwhile (the kernel reads
    it at ``inotify_init``), then put back. Machine-wide, so the window is kept to one observer's creation."""
    path = Path("/proc/sys/fs/inotify/max_queued_events")
    try:
        old = path.read_text()
        path.write_text(str(events))
    except OSError as exc:
        pytest.skip(f"cannot lower {path} here (not root, or /proc/sys read-only): {exc}")
    try:
        yield
    finally:
        path.write_text(old)


# writes 1,000 notes into the folder argv[1] as fast as it can
_BURST_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    for n in range(1000):
        text = f"# Burst {n}\\n\\nBURST{n:04d} written in a burst of a thousand.\\n"
        Path(sys.argv[1], f"burst-{n:04d}.md").write_text(text)
""")


def _keep_this_process_busy_while(proc: subprocess.Popen) -> None:
    """Hold this process's GIL in turns of 0.2 s until ``proc`` ends, as a daemon busy embedding would: watchdog's
    reader thread then reads the inotify queue only between turns, so a burst overflows it. (Without this, whether
    128 queued events overflow depends on how the machine schedules the reader: on an idle machine it kept up.)"""
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.2)
    try:
        while proc.poll() is None:
            end = time.perf_counter() + 0.2
            while time.perf_counter() < end:  # pure Python: never lets the GIL go by itself
                pass
    finally:
        sys.setswitchinterval(old)


def test_an_event_queue_overflow_reconciles_at_once(workspace: Path, make_indexer) -> None:
    indexer = make_indexer([{"agent": "main", "path": workspace}], rescan_interval_s=3600)
    running = Running(indexer)
    with _inotify_queue_of(128):
        running.thread.start()
        # the watcher object exists before it watches: wait until memory/ has its watch (its own inotify instance)
        memory = str(workspace / "memory")
        wait_for(lambda: indexer.state.watcher is not None and memory in indexer.state.watcher.modes(), timeout_s=30)
    try:
        assert indexer.state.ready.wait(60)
        with capture_logs() as logs:
            burst = subprocess.Popen([sys.executable, "-c", _BURST_SCRIPT, str(workspace / "memory")])
            _keep_this_process_busy_while(burst)
            assert burst.wait(60) == 0
            burst_prefix = str(workspace / "memory" / "burst-")  # list(): the worker adds to indexed meanwhile
            wait_for(lambda: sum(p.startswith(burst_prefix) for p in list(indexer.state.indexed)) == 1000,
                     timeout_s=240, interval_s=0.5)
        status = indexer.view.status()
        assert [e for e in logs if e["event"] == "watch_queue_overflow"]
        assert status["last_reconcile_reason"] == "queue_overflow" and status["last_reconcile"] is not None
        recovered = [e for e in logs if e["event"] == "reconcile_drift" and e["reason"] == "queue_overflow"]
        # how many the reconcile itself recovers depends on timing: watchdog rebuilds its watches on an overflow, and
        # files whose events it delivers meanwhile are pending, not drift; the count must match what was logged
        assert status["recovered_total"] == sum(e["not_indexed"] + e["gone"] + e["changed"] for e in recovered)
        assert status["recovered_total"] <= 1000
    finally:
        running.__exit__()


def test_the_start_scan_is_the_first_reconcile(workspace: Path, make_indexer) -> None:
    """``status`` says when the files were last compared with the index from the start on (``last_reconcile`` was
    null until the first periodic rescan, minutes later); what changed while the daemon was down is not drift."""
    write(workspace / "memory" / "while-down.md", "# Written while the daemon was down\n")
    indexer = make_indexer([{"agent": "main", "path": workspace}], rescan_interval_s=3600)
    before = time.time()
    with Running(indexer):
        status = indexer.view.status()
        assert status["last_reconcile"] is not None and status["last_reconcile"] >= before
        assert status["last_reconcile_reason"] == "start"
        assert status["drift"] == {"not_indexed": 0, "gone": 0, "changed": 0} and status["recovered_total"] == 0
        assert indexer.view.health() == "ok"


def test_a_touched_file_is_not_drift_for_later_reconciles(workspace: Path, make_indexer) -> None:
    """Same text under a new stat (``touch``, ``chmod``): re-hashed once, then trusted, so the reconciles that follow
    neither re-hash it nor count it as changed behind the watcher's back (``/health`` stays ``ok``)."""
    indexer = make_indexer([{"agent": "main", "path": workspace}], rescan_interval_s=0.5)
    note = workspace / "memory" / "travel.md"
    with Running(indexer):
        os.utime(note, ns=(1_000_000_000, 1_000_000_000))
        os.chmod(note, 0o600)
        st = os.stat(note)
        wait_for(lambda: indexer.state.indexed[str(note)].state.ctime_ns == st.st_ctime_ns, timeout_s=10)
        reconciled = indexer.view.status()["last_reconcile"]
        wait_for(lambda: (indexer.view.status()["last_reconcile"] or 0) > (reconciled or 0), timeout_s=10)
        assert indexer.view.status()["drift"] == {"not_indexed": 0, "gone": 0, "changed": 0}
        assert indexer.view.health() == "ok"
