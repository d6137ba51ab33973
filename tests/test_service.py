"""``indexer.service``: what stands between a stop and the next start."""

from __future__ import annotations

import os
import socket

import pytest
from server_process import free_port

from indexer.service import Refused, check_port


def test_a_port_in_time_wait_does_not_refuse_a_restart() -> None:
    """The daemon closed a connection (the server side closes first, so its port sits in TIME_WAIT for ~60 s):
    the probe must bind as uvicorn does, with SO_REUSEADDR, or every restart waits a minute."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()  # active close by the server: TIME_WAIT on 127.0.0.1:port
    client.recv(1)
    client.close()
    listener.close()
    check_port("127.0.0.1", port)  # no Refused


def test_a_port_someone_listens_on_is_refused() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(Refused, match="already running"):
            check_port("127.0.0.1", taken.getsockname()[1])


def test_an_error_in_the_first_pass_does_not_kill_the_worker(workspace, make_indexer) -> None:
    """A bug raised while processing the first pass (injected: prepare raises once) is logged and the batch
    retried; the daemon still becomes ready and indexes every file."""
    from conftest import Running, wait_for

    indexer = make_indexer([{"agent": "main", "path": workspace}])
    real_prepare = indexer.pipeline.prepare
    raised = []

    def prepare_that_fails_once(*args, **kwargs):  # fault injection: a bug in the pipeline, once
        if not raised:
            raised.append(True)
            raise RuntimeError("injected bug")
        return real_prepare(*args, **kwargs)

    indexer.pipeline.prepare = prepare_that_fails_once  # type: ignore[method-assign]
    with Running(indexer):
        assert raised
        wait_for(lambda: len(indexer.state.indexed) == 4, timeout_s=30)


def test_a_second_daemon_on_an_empty_state_dir_touches_nothing(workspace, tmp_path, registry) -> None:
    """Two daemons started at once on an empty state dir: the winner holds daemon.lock and is creating its store
    (a shard directory without its metadata yet); the loser must stop before creating or deleting anything."""
    import subprocess
    import sys

    from conftest import make_settings

    from indexer.daemon import Indexer
    from indexer.errors import StoreLocked

    state = tmp_path / "state"
    winner_shard = state / "qdrant" / "memory-root-main"
    winner_shard.mkdir(parents=True)
    (winner_shard / "segment-being-written").write_text("the winner's file")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"), str(state / "daemon.lock")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreLocked, match="in use by another process"):
            Indexer.open(make_settings(tmp_path, [{"agent": "main", "path": workspace}]), registry=registry)
        assert (winner_shard / "segment-being-written").read_text() == "the winner's file"
        assert sorted(p.name for p in state.iterdir()) == ["daemon.lock", "qdrant"]
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only tmpfs needs root")
def test_a_read_only_state_dir_at_start_exits_1_with_one_line(workspace, tmp_path) -> None:
    import subprocess
    import sys

    state = tmp_path / "ro-state"
    state.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(state)]).returncode != 0:
        pytest.skip("cannot mount tmpfs here")
    try:
        done = subprocess.run([sys.executable, "-m", "indexer.cli", "run", "--workspace", str(workspace),
                               "--state-dir", str(state), "--port", str(free_port())], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1", "QMD_INDEXER_LOG_FORMAT": "json"})
    finally:
        subprocess.run(["umount", str(state)], check=True)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("qmd-indexer: ") and "read-only" in last, done.stderr
