"""A real infinity-emb server for the tests: an OpenAI-compatible ``/embeddings`` (and ``/rerank``) endpoint.

The process is ``tests/infinity/server.py``'s (no pytest there, so benchmarks start it too). Without the server's
virtualenv a test that asks for one skips and says how to get it (``make infinity``); under ``CI=true`` it fails
instead (``.ci/run`` installs it, so nothing may skip there). Starting a process puts these tests in the
``subprocess`` lane (``tests/conftest.py``).

    from infinity import infinity_server, minilm_path

    with infinity_server(minilm_path(), "all-MiniLM-L6-v2", tmp_path) as server:
        ...  # server.url; server.kill(); server.start() (same port)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from infinity.server import Infinity, free_port, minilm_path, missing  # noqa: F401  (re-exported for the tests)


def need_infinity() -> None:
    """Skip the calling test when the infinity-emb virtualenv is missing (fail under ``CI=true``)."""
    reason = missing()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must install the infinity-emb server: {reason}")
        pytest.skip(reason)


def infinity_server(model_dir: Path, name: str, log_dir: Path, args: list[str] | None = None) -> Infinity:
    """An infinity-emb server serving the local model folder ``model_dir`` as ``name`` on a free port: a context
    manager, ready when entered (embedding models at ``/embeddings``, cross-encoders at ``/rerank``), stopped on
    exit, also on failure. Inside, ``kill()`` and ``start()`` again (same port) work mid-test. Its log is
    ``log_dir/infinity-<name>.log``. Skips the test (fails under ``CI=true``) without ``make infinity``."""
    need_infinity()
    return Infinity(model_dir=Path(model_dir), name=name, log_path=Path(log_dir) / f"infinity-{name}.log",
                    args=list(args or []))


@pytest.fixture(scope="module")
def infinity_minilm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Infinity]:
    """One infinity-emb server serving the packaged all-MiniLM-L6-v2 as ``all-MiniLM-L6-v2``, shared by a test
    module (tests that kill or change the server start their own with ``infinity_server``)."""
    with infinity_server(minilm_path(), "all-MiniLM-L6-v2", tmp_path_factory.mktemp("infinity")) as server:
        yield server
