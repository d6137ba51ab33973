"""The state directory holds the notes' text (Qdrant Edge segments and WAL, the embedding cache): it stays private
to the daemon's user at rest, 0700 directories and 0600 files, whatever the umask it was started with."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import structlog

from indexer.statedir import hold_state_lock


def _loose(root: Path) -> list[str]:
    """Entries under ``root`` (itself included) that group or others may read, write or enter."""
    found = [] if os.lstat(root).st_mode & 0o077 == 0 else [f"{oct(os.lstat(root).st_mode & 0o777)} {root}"]
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            mode = os.lstat(os.path.join(directory, name)).st_mode
            if not stat.S_ISLNK(mode) and mode & 0o077:
                found.append(f"{oct(mode & 0o777)} {os.path.join(directory, name)}")
    return found


def test_index_once_keeps_the_state_private_whatever_the_umask(workspace: Path, tmp_path: Path) -> None:
    """``index --once`` started with umask 022 (files 0644, directories 0755 by default) leaves every directory
    and file under the state dir without group or other bits: the store's segments and WAL, the cache, the lock."""
    state = tmp_path / "state"
    previous = os.umask(0o022)
    try:
        result = subprocess.run([sys.executable, "-m", "indexer.cli", "index", "--once", "--workspace",
                                 str(workspace), "--state-dir", str(state)], capture_output=True, text=True,
                                timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    finally:
        os.umask(previous)
    assert result.returncode == 0, result.stderr
    print(subprocess.run(["ls", "-laR", str(state)], capture_output=True, text=True).stdout)
    assert len(list(state.rglob("*"))) > 5  # the store and the cache are there
    assert _loose(state) == []


def test_a_loose_existing_state_dir_is_tightened_with_one_log_line(tmp_path: Path) -> None:
    """A state dir left 0755 with 0644 files (an older version, another umask) is made 0700/0600 when the daemon
    takes its lock, and one ``state_dir_tightened`` line says so; a private one logs nothing."""
    state = tmp_path / "state"
    (state / "qdrant" / "segments").mkdir(parents=True)
    (state / "cache.sqlite").write_text("x")
    (state / "qdrant" / "segments" / "wal").write_text("x")
    for path, mode in ((state, 0o755), (state / "qdrant", 0o755), (state / "qdrant" / "segments", 0o750),
                       (state / "cache.sqlite", 0o644), (state / "qdrant" / "segments" / "wal", 0o640)):
        path.chmod(mode)
    with structlog.testing.capture_logs() as logs:
        hold_state_lock(state)
    assert _loose(state) == []
    assert [entry["event"] for entry in logs] == ["state_dir_tightened"], logs
    assert logs[0]["entries"] == 5 and logs[0]["state_dir"] == str(state)
    fresh = tmp_path / "fresh" / "state"
    previous = os.umask(0o022)
    try:
        with structlog.testing.capture_logs() as logs:
            hold_state_lock(fresh)
    finally:
        os.umask(previous)
    assert _loose(fresh) == [] and logs == []
