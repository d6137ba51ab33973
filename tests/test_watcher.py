"""The real watchdog observer: edits, editor saves, deletes, renames and new directories reach the index."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import Running, wait_for, write
from structlog.testing import capture_logs

from indexer.watcher import QUICK_SETTLE_S, Settler, settle_for


class FakeClock:
    """A hand-moved clock for the settle queue (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_settler_releases_a_path_once_quiet() -> None:
    clock = FakeClock()
    settler = Settler(1.0, clock)
    a, b = Path("/w/a.md"), Path("/w/b.md")
    settler.add(a)
    clock.now = 0.6
    settler.add(a)  # a second event restarts the quiet period
    settler.add(b, settle=False)  # scans need no debounce
    assert settler.take_ready(10) == [b]
    clock.now = 1.5
    assert settler.take_ready(10) == []
    clock.now = 1.6
    assert settler.take_ready(10) == [a]
    assert len(settler) == 0


def test_a_path_saved_every_half_second_is_released_after_the_maximum_wait() -> None:
    """Saves more often than settle_s must not hold a file back until they stop: after max_wait_s from its first
    unreleased event the path is released, and the next burst starts a new maximum wait."""
    clock = FakeClock()
    settler = Settler(1.0, clock, max_wait_s=5.0)
    a = Path("/w/a.md")
    released = []
    for step in range(40):  # a save every 0.5 s for 20 s
        clock.now = step * 0.5
        settler.add(a)
        released += [clock.now for _ in settler.take_ready(10)]
    assert released == [5.0, 10.5, 16.0], released
    assert len(settler) == 1  # the last save is still settling


def test_a_retry_waits_its_delay_in_the_queue_unless_an_event_comes_first() -> None:
    clock = FakeClock()
    settler = Settler(1.0, clock)
    a, b, c = Path("/w/a.md"), Path("/w/b.md"), Path("/w/c.md")
    settler.add(a, settle=False, delay=5.0)  # a write the store refused: back in the queue, ready in 5 s
    settler.add(b, settle=False, delay=5.0)
    settler.add(c)
    settler.add(c, settle=False, delay=5.0)  # an event already holds c: the retry does not postpone it
    clock.now = 1.0
    settler.add(b)  # b is saved meanwhile: its event settles first
    assert settler.take_ready(10) == [c] and len(settler) == 2
    clock.now = 2.0
    assert settler.take_ready(10) == [b]
    clock.now = 4.9
    assert settler.take_ready(10) == []
    clock.now = 5.0
    assert settler.take_ready(10) == [a] and len(settler) == 0


def _indexed_count(logs: list[dict], rel: str) -> int:
    return sum(1 for e in logs if e["event"] == "file_indexed" and e["path"].endswith("/" + rel))


def _searchable(indexer, path: Path, needle: str) -> bool:
    entry = indexer.state.indexed.get(str(path))
    if entry is None:
        return False
    texts = [p.text for p in indexer.store.scroll(entry.collection, ["abs_path", "text"])
             if p.abs_path == str(path)]
    return any(needle in t for t in texts)


def test_create_edit_delete_and_rename_are_followed(workspace: Path, make_indexer) -> None:
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    with Running(indexer):
        note = write(workspace / "memory" / "new.md", "# New\n\nThe staging cluster is called kestrel.\n")
        wait_for(lambda: _searchable(indexer, note, "kestrel"))
        note.write_text("# New\n\nThe staging cluster was renamed to osprey.\n")
        wait_for(lambda: _searchable(indexer, note, "osprey"))
        moved = workspace / "memory" / "renamed.md"
        note.rename(moved)
        wait_for(lambda: str(moved) in indexer.state.indexed and str(note) not in indexer.state.indexed)
        moved.unlink()
        wait_for(lambda: str(moved) not in indexer.state.indexed)


def test_atomic_save_reindexes_the_target_once(workspace: Path, make_indexer) -> None:
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    target = workspace / "memory" / "travel.md"
    with Running(indexer), capture_logs() as logs:
        # temp file renamed over the target (most editors, and atomic writers)
        tmp = write(workspace / "memory" / "travel.md.tmp.1234", "# Travel\n\nFlights moved to April.\n")
        os.replace(tmp, target)
        wait_for(lambda: _searchable(indexer, target, "April"))
        # backup + unlink + create (vim's default): target -> target~, new target, backup deleted
        backup = workspace / "memory" / "travel.md~"
        os.rename(target, backup)
        write(target, "# Travel\n\nFlights moved to May.\n")
        backup.unlink()
        wait_for(lambda: _searchable(indexer, target, "May"))
        wait_for(lambda: len(indexer.settler) == 0)
    assert _indexed_count(logs, "memory/travel.md") == 2  # once per save
    assert not [e for e in logs if e["event"] == "file_indexed" and ("~" in e["path"] or ".tmp" in e["path"])]
    assert _searchable(indexer, target, "May") and not _searchable(indexer, target, "April")


def test_directories_created_after_start_are_watched(tmp_path: Path, make_indexer) -> None:
    ws = tmp_path / "late"
    write(ws / "MEMORY.md", "# Memory\n\nroot\n")
    indexer = make_indexer([{"agent": "main", "path": ws}])
    with Running(indexer):
        first = write(ws / "memory" / "first.md", "# First\n\nmemory/ did not exist when the daemon started\n")
        wait_for(lambda: str(first) in indexer.state.indexed)
        deep = write(ws / "memory" / "a" / "b" / "deep.md", "# Deep\n\na directory made later, two levels down\n")
        wait_for(lambda: str(deep) in indexer.state.indexed)
        # a directory moved in from outside arrives as one event: its files must still be found
        outside = write(tmp_path / "staging" / "moved-in.md", "# Moved\n\nmoved in with its directory\n")
        os.rename(outside.parent, ws / "memory" / "staging")
        wait_for(lambda: str(ws / "memory" / "staging" / "moved-in.md") in indexer.state.indexed)
        os.rename(ws / "memory" / "a", tmp_path / "gone")
        wait_for(lambda: str(deep) not in indexer.state.indexed)


def test_memory_dir_deleted_and_made_again_is_watched_again(workspace: Path, make_indexer) -> None:
    import shutil

    indexer = make_indexer([{"agent": "main", "path": workspace}])
    with Running(indexer):
        shutil.rmtree(workspace / "memory")
        wait_for(lambda: not any("/memory/" in p for p in indexer.state.indexed))
        (workspace / "memory").mkdir()
        later = write(workspace / "memory" / "later.md", "# Later\n\nwritten into the new memory directory\n")
        wait_for(lambda: str(later) in indexer.state.indexed)
        again = write(workspace / "memory" / "again.md", "# Again\n\na second write, well after the mkdir\n")
        wait_for(lambda: str(again) in indexer.state.indexed)


def test_replaced_workspace_directory_is_watched_again(workspace: Path, make_indexer, tmp_path: Path,
                                                        monkeypatch) -> None:
    import shutil

    import indexer.worker as worker_module

    monkeypatch.setattr(worker_module, "REFRESH_S", 0.2)
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    with Running(indexer):
        shutil.copytree(workspace, tmp_path / "restored")
        workspace.rename(tmp_path / "old")
        (tmp_path / "restored").rename(workspace)  # a restored backup at the same path
        note = write(workspace / "memory" / "after-restore.md", "# After\n\nwritten after the restore\n")
        wait_for(lambda: str(note) in indexer.state.indexed)
        note.write_text("# After\n\nedited after the restore: pelican\n")
        wait_for(lambda: _searchable(indexer, note, "pelican"))


def test_saving_a_root_file_does_not_walk_the_workspace(workspace: Path, make_indexer) -> None:
    # a workspace may hold anything beside its memory (a code checkout, node_modules): never walk it on an event
    for i in range(50):
        write(workspace / "src" / f"module{i}.md", "# not memory: outside memory/\n")
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    with Running(indexer):
        seen: list[Path] = []
        original = indexer.sync.process

        def spy(paths, *rest):
            seen.extend(paths)
            return original(paths, *rest)

        indexer.sync.process = spy
        (workspace / "MEMORY.md").write_text("# Memory\n\nDeploys moved to Wednesday.\n")
        wait_for(lambda: _searchable(indexer, workspace / "MEMORY.md", "Wednesday"))
    assert not [p for p in seen if "src" in p.parts]


def test_a_closed_write_and_the_rename_ending_a_save_settle_quickly_other_events_wait() -> None:
    """Close-after-write (``IN_CLOSE_WRITE``) and a rename's target are complete files: they get the short quiet
    period; creates, modifies, deletes and a rename's source (a vim backup step) keep ``settle_s``."""
    assert settle_for("closed") == QUICK_SETTLE_S
    assert settle_for("moved", dest=True) == QUICK_SETTLE_S
    for kind in ("created", "modified", "deleted"):
        assert settle_for(kind) is None
    assert settle_for("moved") is None
    clock = FakeClock()
    settler = Settler(1.0, clock)
    a, b = Path("/w/a.md"), Path("/w/b.md")
    settler.add(a)  # created/modified: the long wait
    settler.add(b)
    settler.add(a, quiet_s=settle_for("closed"))  # then closed: the short one replaces it
    clock.now = QUICK_SETTLE_S
    assert settler.take_ready(10) == [a]
    clock.now = 0.9
    assert settler.take_ready(10) == []
    clock.now = 1.0
    assert settler.take_ready(10) == [b]


def test_the_watcher_queues_a_write_and_close_with_the_short_quiet_period(workspace: Path, make_indexer) -> None:
    """Through the real observer: a plain write+close of a note reaches the queue with ``QUICK_SETTLE_S`` last."""
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    seen: list[tuple[Path, float | None]] = []
    note = workspace / "memory" / "quick.md"
    with Running(indexer):
        queue = indexer.state.watcher.on_path
        indexer.state.watcher.on_path = lambda path, quiet_s=None: (seen.append((path, quiet_s)), queue(path, quiet_s))
        write(note, "# Quick\n\nThe release train leaves on Thursday.\n")
        wait_for(lambda: (note, QUICK_SETTLE_S) in seen)
        wait_for(lambda: _searchable(indexer, note, "Thursday"))
    assert [q for p, q in seen if p == note][-1] == QUICK_SETTLE_S
