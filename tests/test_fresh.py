"""The index never stays silently stale: change detection beyond size and mtime, paths that change type, one file
under two names. Real files, the real model, real Qdrant Edge and real watchdog observers."""

from __future__ import annotations

import os
import time
from pathlib import Path

from conftest import Running, wait_for, write

from indexer.search import SearchParams
from indexer.worker import index_once


def _keyword(indexer, text: str) -> list[str]:
    return [h["path"] for h in indexer.view.searcher().search(SearchParams(text, k=5, mode="keyword"))]


def _same_size_edit_with_mtime_put_back(path: Path, old: str, new: str) -> None:
    """``sed -i`` then ``touch -r ref``: same size, same mtime (to the nanosecond), new content."""
    before = os.stat(path)
    path.write_text(path.read_text().replace(old, new))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_same_size_edit_with_mtime_put_back_is_reindexed_by_index_once(workspace: Path, make_indexer) -> None:
    note = write(workspace / "memory" / "same.md", "# Same\n\ncode SAMEAAAA1\n")
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    index_once(indexer)
    assert _keyword(indexer, "SAMEAAAA1") == ["memory/same.md"]
    indexer.store.close()
    _same_size_edit_with_mtime_put_back(note, "SAMEAAAA1", "SAMEBBBB2")
    again = make_indexer([{"agent": "main", "path": workspace}])  # stat identity read back from the payload
    index_once(again)
    assert _keyword(again, "SAMEBBBB2") == ["memory/same.md"]
    assert _keyword(again, "SAMEAAAA1") == []


def test_same_size_edit_with_mtime_put_back_is_reindexed_by_the_daemon(workspace: Path, make_indexer) -> None:
    note = write(workspace / "memory" / "same.md", "# Same\n\ncode SAMEAAAA1\n")
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    with Running(indexer):
        assert _keyword(indexer, "SAMEAAAA1") == ["memory/same.md"]
        _same_size_edit_with_mtime_put_back(note, "SAMEAAAA1", "SAMEBBBB2")
        wait_for(lambda: _keyword(indexer, "SAMEBBBB2") == ["memory/same.md"])
        assert _keyword(indexer, "SAMEAAAA1") == []


def test_the_stat_identity_is_stored_in_the_payload(workspace: Path, make_indexer) -> None:
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    index_once(indexer)
    state = indexer.store.file_states("memory-dir-main")[str(workspace / "memory" / "travel.md")]
    st = os.stat(workspace / "memory" / "travel.md")
    assert (state.ctime_ns, state.inode, state.device) == (st.st_ctime_ns, st.st_ino, st.st_dev)


def _becomes(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "directory":
        path.mkdir()
    elif kind == "symlink":
        path.symlink_to(path.parent / "incidents.md")
    elif kind == "fifo":
        os.mkfifo(path)


def test_a_path_that_changes_type_leaves_no_ghost(workspace: Path, make_indexer) -> None:
    names = {kind: workspace / "memory" / f"{kind}.md" for kind in ("directory", "symlink", "fifo", "gone")}
    for kind, path in names.items():
        write(path, f"# {kind}\n\nGHOST{kind.upper()} was here.\n")
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    with Running(indexer):
        for kind in names:
            assert _keyword(indexer, f"GHOST{kind.upper()}") == [f"memory/{kind}.md"]
        for kind, path in names.items():
            write(path, f"# {kind}\n\nGHOST{kind.upper()} edited.\n")  # an event, then a change of type within
            _becomes(path, kind)  # the debounce
        for kind, path in names.items():
            wait_for(lambda k=kind: _keyword(indexer, f"GHOST{k.upper()}") == [], timeout_s=10)
            assert str(path) not in indexer.state.indexed, kind


def test_an_edit_through_either_hard_link_reindexes_the_file(workspace: Path, make_indexer) -> None:
    first = write(workspace / "memory" / "first.md", "# Linked\n\nLINKAAAA1 one file two names.\n")
    os.link(first, workspace / "memory" / "second.md")
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    with Running(indexer):
        assert _keyword(indexer, "LINKAAAA1") == ["memory/first.md"]  # indexed once, under the name met first
        for n, name in enumerate(("second.md", "first.md", "second.md")):
            with open(workspace / "memory" / name, "w") as handle:
                handle.write(f"# Linked\n\nLINK{n}BBB2 one file two names.\n")
            wait_for(lambda n=n: _keyword(indexer, f"LINK{n}BBB2") == ["memory/first.md"], timeout_s=10)
        assert _keyword(indexer, "LINKAAAA1") == []
        assert str(workspace / "memory" / "second.md") not in indexer.state.indexed


def test_an_edit_through_the_legacy_root_name_reindexes_memory_md(workspace: Path, make_indexer) -> None:
    os.link(workspace / "MEMORY.md", workspace / "memory.md")  # one file, both root names
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    with Running(indexer):
        assert _keyword(indexer, "Fridays") == ["MEMORY.md"]
        time.sleep(0.05)
        with open(workspace / "memory.md", "w") as handle:
            handle.write("# Memory\n\nROOTBBBB2 deploys any day now.\n")
        wait_for(lambda: _keyword(indexer, "ROOTBBBB2") == ["MEMORY.md"])


def test_answers_during_the_debounce_say_what_is_pending_and_search_can_wait(workspace: Path, make_indexer) -> None:
    from fastapi.testclient import TestClient

    from indexer.server import create_app

    # fresh.md stays open (no close-after-write, which would end its quiet period at once) and the quiet period
    # outlasts the answers below, so both paths are pending however slowly they come (on a loaded machine too)
    indexer = make_indexer([{"agent": "main", "path": workspace}], settle_s=10.0, settle_max_s=10.0)
    with Running(indexer), TestClient(create_app(indexer.view), base_url="http://127.0.0.1:8743") as http:
        assert http.post("/search", json={"query": "flat white"}).json()["pending"] == []
        fresh = open(workspace / "memory" / "fresh.md", "w", encoding="utf-8")  # noqa: SIM115 (closed below)
        fresh.write("# Fresh\n\nPENDINGAAA1 just written.\n")
        fresh.flush()
        (workspace / "memory" / "travel.md").unlink()
        wait_for(lambda: len(indexer.view.pending()) == 2, timeout_s=9)  # the watcher saw both (not only the first)
        answer = http.post("/search", json={"query": "PENDINGAAA1", "mode": "keyword"}).json()
        assert answer["pending"] == ["memory/fresh.md", "memory/travel.md"]
        assert http.post("/recall", json={"query": "*"}).json()["pending"] == answer["pending"]
        assert http.post("/boot", json={}).json()["pending"] == answer["pending"]
        assert http.post("/search", json={"query": "x", "agent": "other"}).status_code in (200, 404)
        fresh.close()

        def settled() -> dict | None:  # each search waits its most (10 s) for the deletion's quiet period to end
            answer = http.post("/search", json={"query": "PENDINGAAA1", "mode": "keyword", "wait_s": 10}).json()
            return answer if answer["pending"] == [] else None

        waited = wait_for(settled, timeout_s=60, interval_s=0)
        assert waited["pending"] == [] and [h["path"] for h in waited["hits"]] == ["memory/fresh.md"]
        assert http.post("/search", json={"query": "q", "wait_s": 11}).status_code == 422


def test_a_dead_watcher_is_restarted_once_then_reported_and_drift_is_counted(workspace: Path, make_indexer) -> None:
    from structlog.testing import capture_logs

    indexer = make_indexer([{"agent": "main", "path": workspace}], rescan_interval_s=4)
    with Running(indexer), capture_logs() as logs:
        status = indexer.view.status()
        assert set(status["watch"].values()) == {"native"} and str(workspace / "memory") in status["watch"]
        assert indexer.view.health() == "ok"
        indexer.state.watcher._observer.stop()  # the observer thread and its emitters die
        wait_for(lambda: indexer.state.watcher.restarts == 1, timeout_s=15)
        assert [e for e in logs if e["event"] == "watcher_died"] and indexer.state.watcher.alive()
        write(workspace / "memory" / "after.md", "# After\n\nRESTARTAAA1 seen by the new observer.\n")
        wait_for(lambda: _keyword(indexer, "RESTARTAAA1") == ["memory/after.md"], timeout_s=10)

        indexer.state.watcher._observer.stop()  # dies again: no second restart, reported
        wait_for(lambda: indexer.state.watcher.dead, timeout_s=15)
        assert set(indexer.view.status()["watch"].values()) == {"dead"} and indexer.view.health() == "degraded"
        write(workspace / "memory" / "missed.md", "# Missed\n\nMISSEDAAA1 no watcher saw this.\n")
        wait_for(lambda: indexer.view.status()["drift"]["not_indexed"] == 1, timeout_s=15)  # the reconcile found it
        assert indexer.view.status()["last_reconcile"] is not None
        wait_for(lambda: _keyword(indexer, "MISSEDAAA1") == ["memory/missed.md"], timeout_s=10)


def test_mountinfo_names_the_file_system_of_a_path(tmp_path: Path) -> None:
    from indexer.watchmode import filesystem_type, needs_polling

    info = write(tmp_path / "mountinfo", "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
                 "40 22 0:50 / /srv/share rw - nfs4 host:/export rw\n"
                 "41 22 0:51 / /mnt/my\\040box rw - fuse.sshfs me@box: rw\n")
    assert filesystem_type(Path("/srv/share/ws/memory"), str(info)) == "nfs4"
    assert filesystem_type(Path("/srv/shared"), str(info)) == "ext4"
    assert filesystem_type(Path("/mnt/my box/ws"), str(info)) == "fuse.sshfs"
    assert [needs_polling(t) for t in ("nfs4", "fuse.sshfs", "fuse", "9p", "virtiofs", "ext4", "tmpfs")] == [
        True, True, True, True, True, False, False]


def test_the_watch_setting_polls_a_root(tmp_path: Path, workspace: Path, make_indexer) -> None:
    indexer = make_indexer([{"agent": "main", "path": workspace, "watch": "poll"}], poll_interval_s=0.5)
    with Running(indexer):
        assert set(indexer.view.status()["watch"].values()) == {"poll"}
        assert set(indexer.view.status()["watch_polled"].values()) == {"setting"}
        write(workspace / "memory" / "polled.md", "# Polled\n\nPOLLAAAA1 found by polling.\n")
        wait_for(lambda: _keyword(indexer, "POLLAAAA1") == ["memory/polled.md"], timeout_s=10)


def _bindfs(backing: Path, mount: Path):
    import shutil
    import subprocess

    import pytest

    if shutil.which("bindfs") is None:
        pytest.skip("bindfs is not installed (apt-get install bindfs)")
    mount.mkdir(parents=True)
    done = subprocess.run(["bindfs", str(backing), str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount with bindfs here (FUSE not allowed?): {done.stderr.strip()}")


def test_changes_behind_a_fuse_mount_are_found_by_polling(tmp_path: Path, workspace: Path, make_indexer) -> None:
    import subprocess

    mount = tmp_path / "mnt"
    _bindfs(workspace, mount)
    try:
        indexer = make_indexer([{"agent": "main", "path": mount}], poll_interval_s=0.5)
        with Running(indexer):
            assert set(indexer.view.status()["watch"].values()) == {"poll"}
            assert all(r.startswith("fs:fuse") for r in indexer.view.status()["watch_polled"].values())
            write(workspace / "memory" / "behind.md", "# Behind\n\nBEHINDAAA1 written into the backing folder.\n")
            wait_for(lambda: _keyword(indexer, "BEHINDAAA1") == ["memory/behind.md"], timeout_s=10)
    finally:
        subprocess.run(["fusermount", "-u", str(mount)], capture_output=True)


def test_a_search_during_the_first_index_says_so_and_can_wait_for_it(workspace: Path, make_indexer) -> None:
    """Before the first index is built a search found nothing and said only "nothing relevant" (for about 17 s at
    a first start) and ``wait_s`` returned at once (nothing was pending before the scan): the answer says the index
    is being built (files done of total) on every face, and ``wait_s`` waits for it."""
    import threading

    from fastapi.testclient import TestClient

    from indexer.memory import LocalMemory
    from indexer.schema import SearchRequest
    from indexer.server import create_app
    from indexer.worker import drain

    indexer = make_indexer([{"agent": "main", "path": workspace}])
    memory = LocalMemory(indexer.view)
    early = memory.search(SearchRequest(query="flat white"))
    assert early["indexing"] == {"done": 0, "total": 0} and early["hits"] == []
    waited: dict = {}
    asker = threading.Thread(target=lambda: waited.update(memory.search(SearchRequest(query="flat white",
                                                                                      wait_s=10))))
    asker.start()  # asked before the first scan: nothing is pending yet, the index is not built
    indexer.settler.add_many(indexer.scan())  # the first scan, nothing indexed yet
    total = len(indexer.view.pending())
    with TestClient(create_app(indexer.view), base_url="http://127.0.0.1:8743") as http:
        assert http.post("/search", json={"query": "flat white"}).json()["indexing"] == {"done": 0, "total": total}
    drain(indexer)  # the first index, as the daemon's worker runs it, then ready
    indexer.state.ready.set()
    asker.join(15)
    assert "indexing" not in waited and waited["pending"] == [] and waited["hits"], waited
    assert "indexing" not in memory.search(SearchRequest(query="flat white"))
