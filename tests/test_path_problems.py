"""Paths the daemon cannot use are never silent: an unreadable directory under ``memory/``, a missing extra path,
an extra path overlapping ``memory/``. Each gets one structured log line, a ``status`` entry and a ``doctor``
finding; ``doctor`` also lists which roots are polled and why. Real files, the real model, Qdrant Edge."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import Running, wait_for, write
from structlog.testing import capture_logs

import indexer
from indexer.cli import main
from indexer.worker import index_once

ENV_PYTHONPATH = str(Path(indexer.__file__).parent.parent)  # this checkout's package, for the subprocesses

# root without the capabilities that let it ignore permission bits (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH): a
# directory of mode 000 is then unreadable to it, as to any user, while its own files stay readable
_NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]


def _without_dac_override(tmp_path: Path) -> list[str]:
    """The command prefix that runs a process unable to read a mode-000 directory, or skip saying why not."""
    if os.geteuid() != 0:
        return []  # an ordinary user obeys the mode bits already
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed: root cannot be made to obey mode 000 here")
    locked = tmp_path / "probe"
    locked.mkdir(mode=0)
    try:
        done = subprocess.run([*_NO_DAC, "ls", str(locked)], capture_output=True, text=True)
    finally:
        locked.chmod(0o755)
    if done.returncode == 0:
        pytest.skip("dropping CAP_DAC_OVERRIDE does not make mode 000 unreadable here")
    return _NO_DAC


def test_an_unreadable_directory_is_logged_reported_and_found_by_doctor(tmp_path: Path, workspace: Path) -> None:
    prefix = _without_dac_override(tmp_path)
    locked = workspace / "memory" / "locked"
    write(locked / "secret.md", "# Secret\n\nLOCKEDAAA1\n")
    locked.chmod(0)
    env = {**os.environ, "PYTHONPATH": ENV_PYTHONPATH, "HF_HUB_OFFLINE": "1"}
    cli = [*prefix, sys.executable, "-m", "indexer.cli"]
    try:
        done = subprocess.run([*cli, "index", "--once", "--workspace", str(workspace), "--state-dir",
                               str(tmp_path / "state"), "--json"], capture_output=True, text=True, env=env, timeout=300)
        doctor = subprocess.run([*cli, "doctor", "--workspace", str(workspace)], capture_output=True, text=True,
                                env=env, timeout=120)
    finally:
        locked.chmod(0o755)
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    told = [e for e in lines if e.get("path") == str(locked)]
    assert len(told) == 1 and told[0]["reason"] == "unreadable_directory", done.stderr
    status = json.loads(done.stdout)
    assert {"kind": "unreadable_directory", "agent": "main", "path": str(locked)} in [
        {k: p[k] for k in ("kind", "agent", "path")} for p in status["problems"]]
    assert done.returncode == 3 and status["files_failed"] == 1  # memory that could not be indexed: exit 3
    assert doctor.returncode == 1 and "unreadable directory" in doctor.stdout and str(locked) in doctor.stdout


def test_a_missing_and_an_overlapping_extra_path_are_reported_then_converge(workspace: Path, tmp_path: Path,
                                                                           make_indexer) -> None:
    missing, overlapping = workspace / "notes", workspace / "memory" / "food"
    ws = {"agent": "main", "path": workspace, "extra_paths": ["notes", "memory/food"]}
    with capture_logs() as logs:
        indexer = make_indexer([ws], rescan_interval_s=0.5)
        with Running(indexer):
            wait_for(lambda: indexer.view.status()["last_reconcile"] is not None)
            kinds = {p["kind"]: p for p in indexer.view.status()["problems"]}
            assert kinds["extra_path_missing"]["path"] == str(missing)
            assert kinds["extra_path_overlaps"]["path"] == str(overlapping)
            assert "memory-dir-main" in kinds["extra_path_overlaps"]["detail"]
            config = write(tmp_path / "config.toml", f'[[workspace]]\nagent = "main"\npath = "{workspace}"\n'
                           f'extra_paths = ["notes", "memory/food"]\n')
            doctor = CliRunner().invoke(main, ["doctor", "--config", str(config)])
            assert doctor.exit_code == 1
            assert f"extra path missing: {missing}" in doctor.output
            assert f"extra path overlaps memory/: {overlapping}" in doctor.output

            write(missing / "later.md", "# Later\n\nLATERAAA1 the extra path exists now.\n")
            wait_for(lambda: str(missing / "later.md") in indexer.state.indexed, timeout_s=15)
            wait_for(lambda: [p["kind"] for p in indexer.view.status()["problems"]] == ["extra_path_overlaps"])
    events = [e["event"] for e in logs]
    assert events.count("extra_path_missing") == 1 and events.count("extra_path_overlaps") == 1  # not per rescan
    assert events.count("extra_path_found") == 1


def test_doctor_lists_the_polled_roots_and_why(tmp_path: Path, workspace: Path) -> None:
    config = write(tmp_path / "config.toml", f'[[workspace]]\nagent = "main"\npath = "{workspace}"\nwatch = "poll"\n')
    doctor = CliRunner().invoke(main, ["doctor", "--config", str(config)])
    assert doctor.exit_code == 0, doctor.output
    assert f"main: polled: {workspace / 'memory'} (setting)" in doctor.output
    native = write(tmp_path / "native.toml", f'[[workspace]]\nagent = "main"\npath = "{workspace}"\n')
    assert ": polled:" not in CliRunner().invoke(main, ["doctor", "--config", str(native)]).output


def test_doctor_says_when_the_inotify_watch_limit_is_used_up(workspace: Path) -> None:
    """In a user namespace allowed no inotify watch at all (the machine's limit is untouched)."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    shell = "echo 0 > /proc/sys/user/max_inotify_watches && exec \"$@\""
    env = {**os.environ, "PYTHONPATH": ENV_PYTHONPATH}
    done = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", shell, "sh", sys.executable, "-m",
                           "indexer.cli", "doctor", "--workspace", str(workspace)], capture_output=True, text=True,
                          env=env, timeout=120)
    if "max_inotify_watches" in done.stderr or "unshare" in done.stderr:
        pytest.skip(f"cannot make a user namespace with its own inotify limit here: {done.stderr.strip()}")
    assert done.returncode == 1 and f"main: inotify watch limit reached: {workspace}" in done.stdout, done.stdout


def test_a_missing_workspace_keeps_its_index_is_reported_and_converges_once_back(workspace: Path, tmp_path: Path,
                                                                                 make_indexer) -> None:
    """A workspace folder that is not there (a disk not mounted yet, a folder moved away) is a problem ``status`` and
    ``doctor`` name, and its files keep their points: before, a scan removed every one of them (``file_removed``,
    exit 0), and they were all embedded again once the folder was back. The running daemon too: its periodic
    scans and the watcher's events for an edit made while the folder is away remove nothing; back, that edit and a
    new one are indexed."""
    away = tmp_path / "away"
    indexer = make_indexer([{"agent": "main", "path": workspace}], rescan_interval_s=0.3)
    status = index_once(indexer)
    files = set(indexer.state.indexed)
    assert len(files) == 4 and not status["problems"]
    workspace.rename(away)
    status = index_once(indexer)
    assert set(indexer.state.indexed) == files
    assert [(p["kind"], p["path"]) for p in status["problems"]] == [("workspace_missing", str(workspace))]
    config = write(tmp_path / "config.toml", f'[[workspace]]\nagent = "main"\npath = "{workspace}"\n')
    doctor = CliRunner().invoke(main, ["doctor", "--config", str(config)])
    assert doctor.exit_code == 1 and f"main: workspace missing: {workspace}" in doctor.output, doctor.output
    away.rename(workspace)
    with capture_logs() as logs:
        status = index_once(indexer)
    assert not status["problems"] and set(indexer.state.indexed) == files
    assert not [e for e in logs if e["event"] in ("file_removed", "file_indexed")]  # nothing lost, nothing redone
    assert [e["event"] for e in logs].count("workspace_found") == 1

    with Running(indexer):
        wait_for(lambda: indexer.view.status()["last_reconcile"] is not None)
        with capture_logs() as logs:
            workspace.rename(away)  # the next scans see the folder gone
            # the watches follow the folder, but name its files by their old paths, which are not there
            with open(away / "memory" / "incidents.md", "a", encoding="utf-8") as handle:
                handle.write("Edited while the folder was away.\n")
            wait_for(lambda: [p["kind"] for p in indexer.view.status()["problems"]] == ["workspace_missing"])
            seen = indexer.view.status()["last_reconcile"]
            wait_for(lambda: indexer.view.status()["last_reconcile"] > seen and len(indexer.settler) == 0)
            assert set(indexer.state.indexed) == files
            away.rename(workspace)
            wait_for(lambda: not indexer.view.status()["problems"])
            # the edit made while away converges (the reconcile finds it changed), and the watcher follows again
            note = write(workspace / "memory" / "travel.md", "# Travel\n\nBACKAGAIN7 the trains are booked.\n")
            points = lambda: indexer.store.scroll("memory-dir-main", ["abs_path", "text"])  # noqa: E731
            wait_for(lambda: any("BACKAGAIN7" in p.text for p in points() if p.abs_path == str(note)))
            wait_for(lambda: any("while the folder was away" in p.text for p in points()))
        events = [e["event"] for e in logs]
        assert "file_removed" not in events
        assert not [e for e in logs if e["event"] == "reconcile_drift" and e["gone"]]  # kept files are no drift
        assert events.count("workspace_missing") == 1 and events.count("workspace_found") == 1  # not per rescan
