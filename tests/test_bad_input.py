"""Bad input: each case logs one clear line, the rest of the workspace is indexed in the same run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import write
from fastapi.testclient import TestClient
from structlog.testing import capture_logs

from indexer.server import create_app
from indexer.terminal import print_status
from indexer.worker import index_once


def _run(indexer):
    with capture_logs() as logs:
        status = index_once(indexer)
    return status, logs


def _events(logs, path_end: str) -> list[dict]:
    return [e for e in logs if str(e.get("path", "")).endswith(path_end)]


@pytest.fixture(name="bad_workspace")
def bad_workspace_fixture(workspace: Path) -> Path:
    mem = workspace / "memory"
    write(mem / "latin1.md", "# Caf\xe9\n\nNotes about the caf\xe9 near the office.\n".encode("latin-1"))
    write(mem / "nul.md", b"# binary\x00\x01\x02 not text")
    write(mem / "empty.md", "")
    write(mem / "longline.md", "# Long\n" + " ".join(f"token{i}" for i in range(9000))[:60_000] + "\n")
    with open(mem / "huge.md", "wb") as handle:  # 50 MB: over the 10 MiB default cap
        handle.truncate(50 * 1024 * 1024)
    os.mkfifo(mem / "x.md")
    (mem / "passwd.md").symlink_to("/etc/passwd")
    return workspace


def test_bad_files_are_logged_and_the_rest_indexed(bad_workspace: Path, make_indexer,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    indexer = make_indexer([{"agent": "main", "path": bad_workspace}])
    status, logs = _run(indexer)
    indexed = {Path(p).name for p in indexer.state.indexed}
    assert {"MEMORY.md", "incidents.md", "coffee.md", "travel.md", "latin1.md", "longline.md"} <= indexed
    assert not {"nul.md", "huge.md", "x.md", "passwd.md"} & indexed

    [lossy] = [e for e in _events(logs, "latin1.md") if e["event"] == "file_decoded_lossy"]
    assert lossy["reason"] == "invalid_utf8" and lossy["replaced_sequences"] == 2
    [nul] = [e for e in _events(logs, "nul.md") if e["event"] == "file_failed"]
    assert nul["reason"] == "extract_failed" and "NUL" in nul["detail"]
    [huge] = _events(logs, "huge.md")
    assert huge["reason"] == "too_large" and "52428800 bytes" in huge["detail"]
    [fifo] = _events(logs, "x.md")
    assert fifo["reason"] == "not_regular_file"
    [link] = _events(logs, "passwd.md")
    assert link["reason"] == "symlink"
    # the empty file is memory with no chunks: indexed, nothing embedded
    assert str(bad_workspace / "memory" / "empty.md") not in indexer.state.indexed or \
        indexer.state.indexed[str(bad_workspace / "memory" / "empty.md")].state.points == 0
    assert indexer.state.indexed[str(bad_workspace / "memory" / "longline.md")].state.points > 10
    assert status["files_failed"] == 1  # nul.md; skips are deliberate, not failures
    # but status says how many there are, by reason (they were in the log alone: "failed files: 0", nothing more)
    assert status["files_skipped"] == {"not_regular_file": 1, "symlink": 1, "too_large": 1}
    print_status(status)
    assert "skipped: 1 not_regular_file, 1 symlink, 1 too_large (on purpose" in capsys.readouterr().out

    # a rescan of the unchanged bad files stays quiet: one line per problem, not one per scan
    _, logs = _run(indexer)
    assert not [e for e in logs if e["event"] in ("file_failed", "file_skipped")]


@pytest.mark.skipif(sys.platform == "darwin", reason="APFS refuses names that are not UTF-8")
def test_a_file_name_that_is_not_utf8_fails_alone_and_converges_once_renamed(workspace: Path, make_indexer) -> None:
    """A memory file whose name is not valid UTF-8 (Python decodes it with lone surrogates, which no payload string
    or point id can carry) is one ``file_failed`` line; the rest of its batch is indexed, and renamed it is."""
    mem = workspace / "memory"
    bad = Path(os.fsdecode(bytes(mem) + b"/caf\xe9-deploys.md"))
    bad.write_bytes(b"# Deploys\n\nDeploy windows are Tuesday mornings.\n")
    write(mem / "fresh.md", "# Fresh\n\nA note written with it.\n")
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    status, logs = _run(indexer)
    assert str(mem / "fresh.md") in indexer.state.indexed and str(bad) not in indexer.state.indexed
    [failed] = [e for e in logs if e["event"] == "file_failed"]
    assert failed["reason"] == "undecodable_name" and failed["path"] == str(bad) and "rename" in failed["detail"]
    assert status["files_failed"] == 1
    # status names it with its undecodable bytes escaped (it was a 500 on HTTP and an error on MCP until renamed)
    http = TestClient(create_app(indexer.view), base_url="http://127.0.0.1:8743", raise_server_exceptions=False)
    answer = http.get("/status")
    assert answer.status_code == 200, answer.text
    [shown] = answer.json()["failed_files"]
    assert shown["path"] == str(mem) + "/caf\\xe9-deploys.md" and shown["reason"] == "undecodable_name"
    with capture_logs() as logs:  # an event for it (the watcher's path) is the same quiet failure, not a crash
        indexer.sync.process([bad, mem / "fresh.md"])
    assert not [e for e in logs if e["event"] == "file_failed"]  # logged once per file state
    good = mem / "cafe-deploys.md"
    bad.rename(good)
    status, _ = _run(indexer)
    assert str(good) in indexer.state.indexed and status["files_failed"] == 0


def test_file_fixed_later_converges(bad_workspace: Path, make_indexer) -> None:
    indexer = make_indexer([{"agent": "main", "path": bad_workspace}])
    _run(indexer)
    (bad_workspace / "memory" / "nul.md").write_text("# Fixed\n\nNow it is text about rotating logs.\n")
    (bad_workspace / "memory" / "huge.md").write_text("# Small now\n")
    _run(indexer)
    assert str(bad_workspace / "memory" / "nul.md") in indexer.state.indexed
    assert str(bad_workspace / "memory" / "huge.md") in indexer.state.indexed


def test_file_deleted_between_event_and_read(workspace: Path, make_indexer) -> None:
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    index_once(indexer)
    gone = workspace / "memory" / "travel.md"
    never = workspace / "memory" / "never-existed.md"
    indexer.settler.add(gone)
    indexer.settler.add(never)
    gone.unlink()
    with capture_logs() as logs:
        indexer.sync.process([gone, never])
    assert str(gone) not in indexer.state.indexed
    assert [e["event"] for e in logs] == ["file_removed"]


def test_symlinked_memory_directory_is_skipped(tmp_path: Path, make_indexer) -> None:
    ws = tmp_path / "ws2"
    write(tmp_path / "outside" / "secret.md", "# Secret\n\nnot part of the workspace\n")
    write(ws / "MEMORY.md", "# Memory\n\nroot\n")
    (ws / "memory").symlink_to(tmp_path / "outside")
    indexer = make_indexer([{"agent": "main", "path": ws}])
    status, logs = _run(indexer)
    assert {Path(p).name for p in indexer.state.indexed} == {"MEMORY.md"}
    [skip] = [e for e in logs if e.get("reason") == "symlink"]
    assert skip["path"] == str(ws / "memory")


def test_unreadable_file_is_reported_and_the_rest_indexed(tmp_path: Path) -> None:
    """Runs the real CLI; as root (who reads anything) without the capabilities that bypass file permissions."""
    as_root = os.geteuid() == 0
    base = Path(tempfile.mkdtemp(prefix="qmd-perm-"))
    try:
        os.chmod(base, 0o755)
        ws = base / "ws"
        write(ws / "memory" / "ok.md", "# Fine\n\nA readable note about coffee.\n")
        secret = write(ws / "memory" / "secret.md", "# Secret\n\nno read permission\n")
        for d in (ws, ws / "memory"):
            os.chmod(d, 0o755)
        os.chmod(ws / "memory" / "ok.md", 0o644)
        os.chmod(secret, 0o000)
        state = base / "state"
        state.mkdir()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HOME": str(base), "QMD_INDEXER_LOG_FORMAT": "json"}
        command = [sys.executable, "-m", "indexer.cli", "index", "--once", "--json", "--workspace", str(ws),
                   "--state-dir", str(state)]
        if as_root:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                pytest.skip("running as root and util-linux's setpriv is missing: cannot drop CAP_DAC_OVERRIDE")
            drop = "-dac_override,-dac_read_search"
            command = [setpriv, f"--inh-caps={drop}", f"--bounding-set={drop}", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
        assert result.returncode == 3, result.stderr  # finished, but a file failed
        failed = [line for line in result.stderr.splitlines() if '"file_failed"' in line]
        assert len(failed) == 1 and "secret.md" in failed[0] and "permission_denied" in failed[0]
        assert '"memory-dir-main": {' in result.stdout and '"files": 1' in result.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_files_failed_counts_files_failing_now(bad_workspace: Path, make_indexer) -> None:
    indexer = make_indexer([{"agent": "main", "path": bad_workspace}])
    assert index_once(indexer)["files_failed"] == 1
    nul = bad_workspace / "memory" / "nul.md"
    nul.write_bytes(b"\x00 broken again, differently")
    assert index_once(indexer)["files_failed"] == 1  # the same file failing twice is one failing file
    nul.write_text("# Fixed\n\ntext at last\n")
    assert index_once(indexer)["files_failed"] == 0
    nul.write_bytes(b"\x00")
    assert index_once(indexer)["files_failed"] == 1
    nul.unlink()
    assert index_once(indexer)["files_failed"] == 0
