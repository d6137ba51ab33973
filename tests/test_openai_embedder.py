"""The ``openai`` embedder against a real OpenAI-compatible server: infinity-emb serving the packaged
all-MiniLM-L6-v2 from its local path (``tests/infinity``; ``make infinity``), on real Qdrant Edge and real files.

Scenarios, each once: index and search through the endpoint match the in-process model; the server killed in the
middle of a first index and started again (0 files lost or failed, 0 points dropped, converges); 413 for big
batches and inputs, 429 with Retry-After (infinity cannot be told to answer those: a fault-injecting proxy, a
tiny real HTTP server in front of the real one, answers them); the remote model changed (rebuild).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import make_settings, wait_for, write
from infinity import Infinity, infinity_server, minilm_path

from indexer.api import Chunk
from indexer.builtin.openai_embed import OpenAIEmbedder
from indexer.calibration import measure
from indexer.daemon import Indexer
from indexer.errors import EmbedUnavailable
from indexer.plugins import GROUPS, Registry, load_registry
from indexer.schema import SearchRequest
from indexer.worker import index_once, run

MODEL = "all-MiniLM-L6-v2"
OPENAI_EP = EntryPoint("openai", "indexer.builtin.openai_embed:OpenAIEmbedder", "qmd_indexer.embedders")


def endpoint_registry(url: str, model: str = MODEL, **config: Any) -> Registry:
    """The installed plugins with the ``openai`` embedder chosen for text, pointed at ``url``: chunks sized by
    MiniLM's own ``tokenizer.json`` (254 word pieces, as in-process), so both make the same chunks."""
    eps = [ep for group in GROUPS for ep in entry_points(group=group) if ep.name != "openai"] + [OPENAI_EP]
    table = {"base_url": url, "model": model, "tokenizer": str(minilm_path() / "tokenizer.json"), "max_tokens": 254,
             **config}
    return load_registry(config={"openai": table}, prefer={"text": "openai"}, eps=eps)


def notes(root: Path, files: int, paragraphs: int = 1) -> Path:
    """A workspace of ``files`` distinct notes of ``paragraphs`` paragraphs each, plus MEMORY.md."""
    topics = ["deploy windows", "coffee order", "flight to Lisbon", "disk full on batch-02", "dentist visit",
              "tax return", "garden watering", "piano lesson", "bike repair", "book club"]
    write(root / "MEMORY.md", "# Memory\n\nThe user prefers short answers.\n")
    for n in range(files):
        topic = topics[n % len(topics)]
        body = "\n\n".join(f"## Part {p}\n\nNote {n} about the {topic}: detail {p} says the {topic} item {n}-{p} "
                           f"matters because of reason {p * 7 + n} and the follow-up on day {p + 1}. " * 3
                           for p in range(paragraphs))
        write(root / "memory" / f"note-{n:03d}.md", f"# {topic.title()} {n}\n\n{body}\n")
    return root


def open_indexer(tmp_path: Path, ws: Path, registry: Registry, name: str = "state") -> Indexer:
    settings = make_settings(tmp_path, [{"path": str(ws), "agent": "a"}], state_dir=tmp_path / name)
    return Indexer.open(settings, registry=registry)


def close(indexer: Indexer) -> None:
    if indexer.state.watcher:
        indexer.state.watcher.stop()
    indexer.store.close()
    text = indexer.registry.embedders["text"]
    if isinstance(text, OpenAIEmbedder):
        text.close()


def total_points(indexer: Indexer) -> int:
    return sum(indexer.store.count(c.name) for c in indexer.collections)


def test_endpoint_index_and_search_match_in_process(infinity_minilm: Infinity, tmp_path: Path) -> None:
    """Index and search through the endpoint give what the in-process model gives at the server's own arithmetic
    (fp32, whatever precision the session runs: int8's rounding may swap two near-equal notes): the same chunks,
    vectors within cosine 0.99, the same top hits; ``status`` shows the remote identity (host, model, size,
    sizing)."""
    registry = load_registry(config={"sentence-transformers": {"model": "all-MiniLM-L6-v2", "precision": "fp32",
                                                               "cache_dir": str(tmp_path / "models")}})
    ws = notes(tmp_path / "ws", 12)
    remote = open_indexer(tmp_path, ws, endpoint_registry(infinity_minilm.url), "remote")
    local = open_indexer(tmp_path, ws, registry, "local")
    try:
        assert index_once(remote)["files_failed"] == 0
        index_once(local)
        assert sorted(remote.state.indexed) == sorted(local.state.indexed)
        assert {k: e.state.points for k, e in remote.state.indexed.items()} == \
               {k: e.state.points for k, e in local.state.indexed.items()}
        identity = remote.view.status()["models"]["text"]["identity"]
        assert identity.startswith(f"openai:127.0.0.1:{infinity_minilm.port}|dim=384|model={MODEL}|tokenizer=")
        chunks = [Chunk(f"The user drinks a flat white, note {n}.") for n in range(5)]
        cosines = (remote.registry.embedders["text"].embed(chunks) * registry.embedders["text"].embed(chunks)).sum(1)
        assert cosines.min() > 0.99, cosines
        for query in ["coffee order", "flight to Lisbon", "disk full on batch-02", "when can we deploy"]:
            request = SearchRequest(query=query, k=3)
            got = [h["path"] for h in remote.view.searcher().search(request)]
            want = [h["path"] for h in local.view.searcher().search(request)]
            assert got[0] == want[0] and set(got) == set(want), (query, got, want)
        # an endpoint declares no relevance floor: the probe measures it, as for the same model in process
        floor = remote.view.searcher().floor.get()
        assert floor.source == "probe" and abs(floor.floor - measure(registry.embedders["text"]).floor) <= 0.01
        assert remote.view.status()["embedding"]["relevance_floor"].startswith(f"{floor.floor:.2f} (probe: right")
    finally:
        close(remote)
        close(local)


def test_server_killed_mid_first_index_loses_nothing(tmp_path: Path) -> None:
    """The embedding server SIGKILLed in the middle of a first index and started again: while it is down, no file
    fails, no point is dropped, ``/health`` is degraded with the reason and a hybrid search answers from keyword
    search (``degraded``); once it is back the index converges to every file."""
    ws = notes(tmp_path / "ws", 60, paragraphs=4)
    with infinity_server(minilm_path(), MODEL, tmp_path) as server:
        indexer = open_indexer(tmp_path, ws, endpoint_registry(server.url, batch_size=8, max_concurrency=1,
                                                               retries=1))
        stop = threading.Event()
        worker = threading.Thread(target=run, args=(indexer, stop), daemon=True)
        state, view = indexer.state, indexer.view
        try:
            worker.start()
            wait_for(lambda: len(state.indexed) >= 3, timeout_s=240, interval_s=0.02)
            server.kill()
            before = {k: e.state.points for k, e in state.indexed.items()}
            assert len(before) < 61, "the first index finished before the kill: nothing was tested"
            points_before = total_points(indexer)
            wait_for(lambda: state.ledger.outage.reason is not None, timeout_s=60)
            health = indexer.view.health_reasons()
            assert view.health() == "degraded" and any(r.startswith("embedder unavailable") for r in health)
            notes_: list[str] = []
            hits = view.searcher().search(SearchRequest(query="coffee order", k=3), notes_)
            assert hits and notes_ and notes_[0].startswith("keyword only: ")
            # a few retries while it is down, as the daemon counts them
            status = wait_for(lambda: (s := view.status())["embedder_unavailable"]["deferred"] >= 2 and s,
                              timeout_s=60)
            assert status["files_failed"] == 0
            assert status["search_fallback"]["keyword_only"] == 1
            assert total_points(indexer) >= points_before  # nothing dropped while down
            assert all(state.indexed[k].state.points == n for k, n in before.items())
            server.start()  # the same port
            wait_for(lambda: len(state.indexed) == 61 and not view.pending(), timeout_s=400, interval_s=0.2)
            status = view.status()
            assert status["files_failed"] == 0 and status["embedder_unavailable"]["reason"] is None
            assert view.health() == "ok"
            assert total_points(indexer) == sum(e.state.points for e in state.indexed.values())
            assert view.searcher().search(SearchRequest(query="coffee order", k=1))[0]["path"].startswith("memory/")
        finally:
            stop.set()
            indexer.settler.wake()
            worker.join(60)
            close(indexer)


class FaultProxy:
    """A fault-injecting proxy: a tiny real HTTP server in front of a real embedding server that answers
    ``413 batch too large`` to requests of more than ``max_inputs`` inputs, ``413 input too long`` to any input
    over ``max_chars`` characters, and ``429`` with ``Retry-After: <retry_after>`` to the first ``throttle``
    requests; everything else is forwarded. ``log`` records each request: (time, inputs, longest input, status)."""

    def __init__(self, upstream: str, max_inputs: int = 10**6, max_chars: int = 10**9, throttle: int = 0,
                 retry_after: str = "1") -> None:
        self.upstream, self.max_inputs, self.max_chars = upstream, max_inputs, max_chars
        self.throttle, self.retry_after = throttle, retry_after
        self.log: list[tuple[float, int, int, int]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                inputs = json.loads(body)["input"]
                longest = max(len(i) for i in inputs)
                if len(inputs) > proxy.max_inputs:
                    status, answer, headers = 413, b'{"error": "batch too large"}', {}
                elif longest > proxy.max_chars:
                    status, answer, headers = 413, b'{"error": "input too long"}', {}
                elif proxy.throttle > 0:
                    proxy.throttle -= 1
                    status, answer, headers = 429, b'{"error": "rate limited"}', {"Retry-After": proxy.retry_after}
                else:
                    reply = httpx.post(proxy.upstream + self.path, content=body,
                                       headers={"Content-Type": "application/json"}, timeout=60)
                    status, answer, headers = reply.status_code, reply.content, {}
                proxy.log.append((time.monotonic(), len(inputs), longest, status))
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture(name="fault_proxy")
def fault_proxy_fixture(infinity_minilm: Infinity) -> Iterator[Callable[..., FaultProxy]]:
    made: list[FaultProxy] = []

    def make(**faults: Any) -> FaultProxy:
        proxy = FaultProxy(infinity_minilm.url, **faults).__enter__()
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.__exit__()


def test_413_halves_batches_and_splits_long_inputs_429_honours_retry_after(
        infinity_minilm: Infinity, fault_proxy: Callable[..., FaultProxy], tmp_path: Path) -> None:
    """A server answering 413 above 8 inputs: the batch of 32 is halved to 8 (and stays so), the vectors are the
    direct ones; an input over its length limit is split and embedded in halves, never sent whole again; 429 with
    ``Retry-After: 1`` is waited out (>= 1 s) and retried; a whole first index through such a server fails no
    file. A server that keeps answering 429 gives ``EmbedUnavailable`` carrying its Retry-After."""
    made: list[OpenAIEmbedder] = []

    def embedder_at(url: str, **config: Any) -> OpenAIEmbedder:
        made.append(OpenAIEmbedder({"base_url": url, "model": MODEL, **config}))
        return made[-1]

    try:
        _check_faults(infinity_minilm, fault_proxy, tmp_path, embedder_at)
    finally:
        for embedder in made:
            embedder.close()


def _check_faults(infinity_minilm: Infinity, fault_proxy: Callable[..., FaultProxy], tmp_path: Path,
                  embedder_at: Callable[..., OpenAIEmbedder]) -> None:
    direct = embedder_at(infinity_minilm.url)
    texts = [Chunk(f"Note {n}: the flat white order, item {n}.") for n in range(40)]
    want = direct.embed(texts)

    big = fault_proxy(max_inputs=8)
    embedder = embedder_at(big.url, batch_size=32, max_concurrency=2)
    np.testing.assert_allclose(embedder.embed(texts), want, atol=1e-5)
    assert embedder._batch == 8 and embedder.stats["halved"] >= 1
    assert [n for _, n, _, s in big.log if s == 200] and all(n <= 8 for _, n, _, s in big.log if s == 200)

    long_text = " ".join(f"word{n}" for n in range(160))  # ~1100 characters
    short = fault_proxy(max_chars=600)
    embedder = embedder_at(short.url)
    vector = embedder.embed([Chunk(long_text)])[0]
    assert embedder.stats["split"] >= 1 and all(c <= 600 for _, _, c, s in short.log if s == 200)
    assert float(vector @ direct.embed([Chunk(long_text)])[0]) > 0.9

    throttled = fault_proxy(throttle=2, retry_after="1")
    embedder = embedder_at(throttled.url, retries=3)
    np.testing.assert_allclose(embedder.embed(texts[:3]), want[:3], atol=1e-5)
    times = [t for t, _, _, _ in throttled.log]
    assert [s for *_, s in throttled.log] == [429, 429, 200] and min(np.diff(times)) >= 0.95

    stuck = fault_proxy(throttle=10**6, retry_after="120")
    with pytest.raises(EmbedUnavailable) as raised:
        embedder_at(stuck.url).embed(texts[:1])
    assert raised.value.retry_after_s == 120 and len(stuck.log) == 1  # more than max_retry_after_s: not waited here

    ws = notes(tmp_path / "ws", 10, paragraphs=3)
    flaky = fault_proxy(max_inputs=4, throttle=1, retry_after="1")
    indexer = open_indexer(tmp_path, ws, endpoint_registry(flaky.url, batch_size=32))
    try:
        status = index_once(indexer)
        assert status["files_failed"] == 0 and len(indexer.state.indexed) == 11
        assert {s for *_, s in flaky.log} == {200, 413, 429}
    finally:
        close(indexer)


def test_index_once_waits_out_an_outage_then_says_what_is_left(fault_proxy: Callable[..., FaultProxy],
                                                                 tmp_path: Path) -> None:
    """``index --once`` with an embedding server that answers 429 for a while: the held files (queued, not failed)
    are tried again with the outage's backoff until ``wait_s``; without waiting they are left queued, and said so
    (the command then exits 3, ``tests/test_cli.py``)."""
    ws = notes(tmp_path / "ws", 4, paragraphs=2)
    for wait_s, left in ((0.0, 5), (60.0, 0)):
        proxy = fault_proxy()
        indexer = open_indexer(tmp_path, ws, endpoint_registry(proxy.url, retries=0), name=f"state-{wait_s:g}")
        try:
            proxy.throttle = 3  # connected (the vector size is known): now every batch is refused three times
            started = time.monotonic()
            status = index_once(indexer, wait_s=wait_s)
            assert status["files_failed"] == 0 and status["queue_depth"] == left
            assert len(indexer.state.indexed) == 5 - left
            if left == 0:  # three refusals, backed off (1 s, 2 s, 4 s at most), then indexed
                statuses = [s for *_, s in proxy.log]
                assert statuses.count(429) == 3 and statuses[-1] == 200 and time.monotonic() - started < 30
        finally:
            close(indexer)


def build_tiny_embedding_model(root: Path) -> Path:
    """A real sentence-transformers model folder of 32 dimensions with random weights (one small BERT layer,
    MiniLM's vocabulary and tokenizer, mean pooling), written as MiniLM's own folder is laid out (``modules.json``,
    ``1_Pooling``), so any sentence-transformers version loads it. Returns the folder."""
    import shutil

    from transformers import BertConfig, BertModel

    out = root / "tiny-embed"
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=256)).save_pretrained(out)
    source = minilm_path()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
                 "sentence_bert_config.json", "modules.json"):
        shutil.copy(source / name, out / name)
    (out / "1_Pooling").mkdir()
    pooling = json.loads((source / "1_Pooling" / "config.json").read_text())
    (out / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "word_embedding_dimension": 32}))
    return out


def test_remote_model_changed_rebuilds(infinity_minilm: Infinity, tmp_path: Path) -> None:
    """An index built through the endpoint with MiniLM (384), then the configuration names another model the
    server serves (a tiny 32-dimension one): the identity differs, so the collections are rebuilt beside the live
    ones and swapped; the index then holds 32-dimension vectors of every file and searches answer."""
    ws = notes(tmp_path / "ws", 5)
    first = open_indexer(tmp_path, ws, endpoint_registry(infinity_minilm.url))
    try:
        index_once(first)
        files = len(first.state.indexed)
    finally:
        close(first)
    tiny = build_tiny_embedding_model(tmp_path / "models")
    with infinity_server(tiny, "tiny-embed", tmp_path) as server:
        second = open_indexer(tmp_path, ws, endpoint_registry(server.url, model="tiny-embed"))
        try:
            assert second.state.rebuild_requested.is_set()
            status = index_once(second)
            assert status["files_failed"] == 0 and len(second.state.indexed) == files
            assert "|dim=32|model=tiny-embed|" in status["models"]["text"]["identity"]
            name = second.collections[0].name
            point = next(second.store.scroll_points(name))
            assert point.dense["text"].shape == (32,)
            assert second.view.searcher().search(SearchRequest(query="coffee order", k=1))
        finally:
            close(second)
