"""``indexer.service``: what stands between a stop and the next start."""

from __future__ import annotations

import socket

import pytest

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
        wait_for(lambda: len(indexer.indexed) == 4, timeout_s=30)
