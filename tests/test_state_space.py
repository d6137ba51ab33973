"""A full state directory: Qdrant Edge writes through memory maps, so a write on a full file system used to kill the
daemon with SIGBUS (exit 135) and no log line. Writes are now refused below a free-space margin (``state_dir_full``,
logged once), the daemon reports itself degraded, searches answer from what is indexed, and indexing resumes once
space returns."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from conftest import wait_for, write
from structlog.testing import capture_logs

from indexer.errors import StateDirFull, StoreUnavailable
from indexer.store import EdgeStore

MIB = 1024 * 1024


def test_a_write_below_the_margin_is_refused_with_one_line_and_resumes(tmp_path: Path) -> None:
    store = EdgeStore(tmp_path / "qdrant")
    store.min_free_bytes = store.free_bytes() + 1024 * MIB  # the margin is never met on this file system
    try:
        with capture_logs() as logs:
            for _ in range(3):
                with pytest.raises(StateDirFull, match="bytes free") as refused:
                    store.ensure_collection("c", {"text": 3})
                assert isinstance(refused.value, StoreUnavailable)  # retried like any unavailable store
            assert store.degraded
            assert [e["event"] for e in logs] == ["state_dir_full"]
            assert logs[0]["log_level"] == "error" and logs[0]["margin_bytes"] == store.min_free_bytes
            assert not (tmp_path / "qdrant" / "c").exists()  # nothing created
            store.min_free_bytes = 0
            store.ensure_collection("c", {"text": 3})
            assert not store.degraded and store.count("c") == 0
            assert [e["event"] for e in logs] == ["state_dir_full", "state_dir_space_recovered"]
    finally:
        store.close()


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")


def _health(url: str) -> dict | None:
    try:
        return httpx.get(f"{url}/health", timeout=2).json()
    except httpx.HTTPError:
        return None  # not listening yet


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_full_tmpfs_state_dir_degrades_the_daemon_and_it_recovers(workspace: Path, tmp_path: Path) -> None:
    """16 MiB of tmpfs cannot hold the two new collections (~12 MiB each): the daemon used to die of SIGBUS while
    creating them. Then, in steady state, a filler file leaves less than the margin: a new note waits, old ones are
    still found; removing the filler lets it in."""
    from test_cli import Daemon

    state = tmp_path / "state"
    _mount_tmpfs(state, "16m")
    daemon = None
    try:
        daemon = Daemon(workspace, state, tmp_path / "daemon.log")
        url = f"http://127.0.0.1:{daemon.port}"
        wait_for(lambda: any(e["event"] == "state_dir_full" for e in daemon.events()), timeout_s=180)
        # reasons: store, model; append: each agent's (off here)
        wait_for(lambda: daemon.proc.poll() is not None or {**(_health(url) or {}), "reasons": None} == {
            "status": "degraded", "ready": False, "reasons": None, "append": {"main": "off"}}, timeout_s=60)
        assert daemon.proc.poll() is None, daemon.log.read_text()[-2000:]
        assert httpx.get(f"{url}/status", timeout=5).json()["store_degraded"] is True
        subprocess.run(["mount", "-o", "remount,size=256m", str(state)], check=True)
        wait_for(daemon.ready, timeout_s=120)  # then ok, once the model has loaded too (ready answers first)
        wait_for(lambda: httpx.get(f"{url}/health", timeout=2).json()["status"] == "ok", timeout_s=120)
        hits = httpx.post(f"{url}/search", json={"query": "ACME-4471", "k": 1}, timeout=30).json()["hits"]
        assert hits and hits[0]["path"] == "memory/incidents.md"

        filler = state / "filler"  # steady state: leave 32 MiB free, under the 64 MiB default margin
        with open(filler, "wb") as handle:
            os.posix_fallocate(handle.fileno(), 0, _free(state) - 32 * MIB)
        write(workspace / "memory" / "later.md", "# Later\n\nFULLDISK5512 written while the disk was full.\n")
        wait_for(lambda: sum(e["event"] == "state_dir_full" for e in daemon.events()) == 2, timeout_s=60)
        assert httpx.get(f"{url}/health", timeout=2).json()["status"] == "degraded"
        hits = httpx.post(f"{url}/search", json={"query": "ACME-4471", "k": 1}, timeout=30).json()["hits"]
        assert hits and hits[0]["path"] == "memory/incidents.md"  # answers from what is indexed
        filler.unlink()

        def found() -> bool:
            answer = httpx.post(f"{url}/search", json={"query": "FULLDISK5512", "k": 1, "mode": "keyword"},
                                timeout=30).json()
            return bool(answer["hits"]) and answer["hits"][0]["path"] == "memory/later.md"
        wait_for(found, timeout_s=60, interval_s=0.5)
        assert httpx.get(f"{url}/health", timeout=2).json()["status"] == "ok"
        events = [e["event"] for e in daemon.events()]
        assert events.count("state_dir_full") == 2 and events.count("state_dir_space_recovered") == 2
        assert "store_unavailable" not in events[events.index("state_dir_full", events.index("daemon_ready")):]
        assert daemon.terminate() == 0
    finally:
        if daemon is not None and daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait()
        subprocess.run(["umount", str(state)])
