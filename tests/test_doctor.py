"""Split root memory: detection, repair by archive + merge, repeated runs, cross-device moves."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import write

import indexer.doctor as doctor
from indexer.config import Workspace


def _split(tmp_path: Path, legacy: str = "# Old\n\nLegacy note about the VPN.\n") -> Workspace:
    write(tmp_path / "MEMORY.md", "# Memory\n\nCurrent facts.\n")
    write(tmp_path / "memory.md", legacy)
    return Workspace(agent="main", path=tmp_path)


def test_fix_archives_and_merges_without_losing_text(tmp_path: Path) -> None:
    ws = _split(tmp_path)
    repair = doctor.fix_split(ws, now=datetime(2026, 11, 30, 7, 5, 1, 250000, tzinfo=UTC))
    assert repair.archived_to == tmp_path / ".openclaw-repair/root-memory/2026-11-30T07-05-01-250000Z/memory.md"
    assert repair.archived_to.read_text() == "# Old\n\nLegacy note about the VPN.\n"
    assert not (tmp_path / "memory.md").exists()
    merged = (tmp_path / "MEMORY.md").read_text()
    assert merged.startswith("# Memory\n\nCurrent facts.\n")
    assert "## Merged from memory.md (archived at .openclaw-repair/root-memory/2026-11-30T07-05-01-250000Z/memory.md)" \
        in merged and merged.endswith("Legacy note about the VPN.\n")
    assert doctor.find_split(ws) is None and doctor.fix_split(ws) is None


def test_identical_legacy_text_is_archived_not_merged(tmp_path: Path) -> None:
    ws = _split(tmp_path, legacy="# Memory\n\nCurrent facts.\n")
    repair = doctor.fix_split(ws)
    assert repair is not None and not repair.merged
    assert (tmp_path / "MEMORY.md").read_text() == "# Memory\n\nCurrent facts.\n"


def test_repeated_repairs_never_overwrite_an_archive(tmp_path: Path) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    first = doctor.fix_split(_split(tmp_path, "one\n"), now=now)
    second = doctor.fix_split(_split(tmp_path, "two\n"), now=now)
    assert first.archived_to != second.archived_to
    assert first.archived_to.read_text() == "one\n" and second.archived_to.read_text() == "two\n"


def test_cross_device_move_copies_fsyncs_and_unlinks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a fake: an archive on another filesystem cannot be arranged inside tmp_path, so rename reports EXDEV
    def rename(src, dst):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(doctor.os, "rename", rename)
    ws = _split(tmp_path)
    repair = doctor.fix_split(ws)
    assert repair.archived_to.read_text() == "# Old\n\nLegacy note about the VPN.\n"
    assert not (tmp_path / "memory.md").exists()


def test_doctor_command_exit_codes(tmp_path: Path) -> None:
    _split(tmp_path)
    cli = [sys.executable, "-m", "indexer.cli", "doctor", "--workspace", str(tmp_path)]
    found = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert found.returncode == 1 and "split root memory" in found.stdout
    fixed = subprocess.run([*cli, "--fix"], capture_output=True, text=True, timeout=60)
    assert fixed.returncode == 0 and "repaired" in fixed.stdout
    assert subprocess.run(cli, capture_output=True, text=True, timeout=60).returncode == 0


def test_doctor_names_the_agent_the_running_daemon_serves_the_workspace_as(workspace: Path, make_indexer) -> None:
    """``doctor --workspace`` without ``--agent`` on a served workspace (``make demo`` serves its copy as ``demo``)
    names the daemon's agent, not the ``main`` it would otherwise assume."""
    from server_process import free_port
    from test_mcp import Served

    from indexer.worker import index_once

    indexer = make_indexer([{"agent": "demo", "path": workspace}], port=free_port())
    index_once(indexer)
    cli = [sys.executable, "-m", "indexer.cli", "doctor", "--workspace", str(workspace)]
    env = {**os.environ, "QMD_INDEXER_PORT": str(indexer.settings.port)}
    env.pop("QMD_INDEXER_CONFIG", None)
    with Served(indexer):
        served = subprocess.run(cli, capture_output=True, text=True, timeout=60, env=env)
    assert served.returncode == 0 and served.stdout.startswith(f"demo: ok ({workspace}"), served
    alone = subprocess.run(cli, capture_output=True, text=True, timeout=60, env=env)  # no daemon: the default
    assert alone.returncode == 0 and alone.stdout.startswith("main: ok"), alone


def test_doctor_suggests_the_multilingual_model_for_chinese_notes(tmp_path: Path) -> None:
    """Notes in Chinese with the English-only default model: doctor says how many and the one line that switches
    (information: the exit status stays 0); with ``prefer = { text = "e5" }`` it says nothing."""
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# 记忆\n\n用户喜欢喝不加糖的乌龙茶，早上不开会。\n")
    write(ws / "memory" / "2026-10-21.md", "# 2026-10-21\n\n- 小王：周五的发布要推迟吗？\n- 老李：要推迟。\n")
    write(ws / "memory" / "deploys.md", "# Deploys\n\nDeploy windows are Tuesday and Thursday mornings.\n")
    cli = [sys.executable, "-m", "indexer.cli", "doctor", "--workspace", str(ws)]
    run = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    line = next(x for x in run.stdout.splitlines() if "notes in Chinese, Japanese or Korean" in x)
    assert "2 of 3 notes" in line and "pip install 'qmd-indexer[multilingual]'" in line
    assert 'prefer = { text = "e5" }' in line
    config = write(tmp_path / "config.toml", f'[prefer]\ntext = "e5"\n\n[[workspace]]\npath = "{ws}"\n')
    run = subprocess.run([sys.executable, "-m", "indexer.cli", "doctor", "--config", str(config)],
                         capture_output=True, text=True, timeout=120)
    assert "notes in Chinese" not in run.stdout, run.stdout + run.stderr


def test_doctor_names_a_missing_sessions_folder_instead_of_crashing(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    config = tmp_path / "config.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[[workspace]]\nagent = "main"\npath = "{tmp_path / "ws"}"\n'
                      f'sessions = "{tmp_path / "sesions"}"\n')  # mistyped
    found = subprocess.run([sys.executable, "-m", "indexer.cli", "doctor", "--config", str(config)],
                           capture_output=True, text=True, timeout=60)
    assert "Traceback" not in found.stderr, found.stderr
    assert found.returncode == 1 and "sessions folder missing" in found.stdout and "sesions" in found.stdout
