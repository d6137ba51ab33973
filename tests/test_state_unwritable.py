"""The state directory made unwritable under a running daemon (a read-only bind mount over it: root is not stopped
by file modes). It used to go unnoticed (no log line, ``/health`` ok) and a SIGTERM then exited 1 with a raw
traceback. Now it is one structured log line per outage, ``/health`` degraded with the reason, searches answered
from what is indexed, a clean stop (exit 0) even while unwritable, and indexing resumes once writable again."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import wait_for, write

REASON = "state dir not writable"


def _health(url: str) -> dict[str, Any]:
    try:
        return dict(httpx.get(f"{url}/health", timeout=5).json())
    except httpx.HTTPError:
        return {}


def _bind_read_only(path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only bind mount needs root and mount(8)")
    done = subprocess.run(["mount", "--bind", "-o", "ro", str(path), str(path)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot bind-mount read-only here: {done.stderr.strip()}")


def _mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point (``/proc/mounts``: ``os.path.ismount`` misses a bind mount of a directory
    over itself, which keeps its device)."""
    with open("/proc/mounts", encoding="utf-8") as mounts:
        return any(line.split()[1] == str(path) for line in mounts)


def _found(url: str, query: str, path: str) -> bool:
    hits = httpx.post(f"{url}/search", json={"query": query, "k": 1, "mode": "keyword"}, timeout=30).json()["hits"]
    return bool(hits) and hits[0]["path"] == path


def test_state_dir_read_only_while_running_is_logged_degraded_stops_cleanly_and_converges(workspace: Path,
                                                                                          tmp_path: Path) -> None:
    from test_cli import Daemon

    state = tmp_path / "state"
    daemon = Daemon(workspace, state, tmp_path / "daemon.log")
    url = f"http://127.0.0.1:{daemon.port}"
    try:
        wait_for(daemon.ready, timeout_s=180, interval_s=0.2)
        wait_for(lambda: _health(url).get("status") == "ok", timeout_s=120, interval_s=0.2)  # model loaded too

        _bind_read_only(state)
        write(workspace / "memory" / "later.md", "# Later\n\nROSTATE8812 written while the state was read-only.\n")
        wait_for(lambda: REASON in _health(url).get("reasons", []), timeout_s=60, interval_s=0.2)
        assert _health(url)["status"] == "degraded"
        assert _found(url, "ACME-4471", "memory/incidents.md")  # answers from what is indexed
        logged = [e for e in daemon.events() if e["event"] == "state_dir_read_only"]
        assert len(logged) == 1 and logged[0]["level"] == "error", daemon.log.read_text()[-3000:]

        subprocess.run(["umount", str(state)], check=True)
        wait_for(lambda: _found(url, "ROSTATE8812", "memory/later.md"), timeout_s=60, interval_s=0.5)
        wait_for(lambda: _health(url).get("status") == "ok", timeout_s=30, interval_s=0.2)
        assert [e["event"] for e in daemon.events()].count("state_dir_writable") == 1

        _bind_read_only(state)  # unwritable again, and stopped while so
        write(workspace / "memory" / "again.md", "# Again\n\nROSTATE9923 written during the second outage.\n")
        wait_for(lambda: REASON in _health(url).get("reasons", []), timeout_s=60, interval_s=0.2)
        assert daemon.terminate() == 0, daemon.log.read_text()[-3000:]
        text = daemon.log.read_text()
        assert "Traceback" not in text, text[-3000:]
        events = daemon.events()
        assert [e["event"] for e in events].count("state_dir_read_only") == 2
        assert events[-1]["event"] == "daemon_stopped"
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait()
        while _mounted(state) and subprocess.run(["umount", str(state)]).returncode == 0:
            pass
