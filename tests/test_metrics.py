"""``GET /metrics`` (``indexer.metrics``): a running daemon (real model, real Edge store, real watcher) scraped
through the app, as Prometheus scrapes it."""

from __future__ import annotations

from pathlib import Path

from conftest import Running, wait_for, write
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from indexer.server import create_app

BASE = "http://127.0.0.1:8743"  # the Host a local client sends (the Guard checks it)
TOKEN = "metrics-test-token-0123456789"
NAMES = {
    "qmd_indexer_files", "qmd_indexer_chunks", "qmd_indexer_embeddings_computed", "qmd_indexer_embedding_cache_hits",
    "qmd_indexer_queue_depth", "qmd_indexer_pending_files", "qmd_indexer_files_failed",
    "qmd_indexer_index_lag_seconds", "qmd_indexer_errors", "qmd_indexer_search_seconds",
    "qmd_indexer_store_write_seconds", "qmd_indexer_watch_state", "qmd_indexer_last_reconcile_timestamp_seconds",
    "qmd_indexer_ready", "qmd_indexer_info", "process_cpu_seconds",
}


def scrape(api: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Sample (name, sorted labels) -> value of one scrape, parsed by prometheus-client's own parser."""
    answer = api.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = list(text_string_to_metric_families(answer.text))
    assert NAMES <= {f.name for f in families}, NAMES - {f.name for f in families}
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_move_with_indexing_and_searching(workspace: Path, make_indexer) -> None:
    indexer = make_indexer([{"agent": "main", "path": workspace}], token=TOKEN)
    with Running(indexer), TestClient(create_app(indexer.view), base_url=BASE) as api:
        before = scrape(api)
        assert value(before, "qmd_indexer_ready") == 1
        assert value(before, "qmd_indexer_files", collection="memory-dir-main", agent="main") == 3
        assert value(before, "qmd_indexer_files", collection="memory-root-main", agent="main") == 1
        assert value(before, "qmd_indexer_chunks", collection="memory-dir-main", agent="main") >= 3
        assert value(before, "qmd_indexer_store_write_seconds_count") == 4  # one write per file of the first pass
        embedded = value(before, "qmd_indexer_embeddings_computed_total")
        assert embedded >= 4
        assert value(before, "qmd_indexer_watch_state", root=str(workspace / "memory"),
                     qmd_indexer_watch_state="native") == 1

        write(workspace / "memory" / "pets.md", "# Pets\n\nThe office cat is called Miso and hates Mondays.\n")
        after = wait_for(lambda: (lambda s: s if value(s, "qmd_indexer_index_lag_seconds_count") >= 1 else None)(
            scrape(api)), timeout_s=30)  # observed once the batch that indexed it is done
        assert value(after, "qmd_indexer_embeddings_computed_total") > embedded
        assert value(after, "qmd_indexer_store_write_seconds_count") == 5
        assert 0 < value(after, "qmd_indexer_index_lag_seconds_sum") < 30
        assert value(after, "qmd_indexer_queue_depth") == 0 and value(after, "qmd_indexer_pending_files") == 0

        found = api.post("/search", json={"query": "what is the cat called", "mode": "dense"},
                         headers={"Authorization": f"Bearer {TOKEN}"})
        assert found.status_code == 200 and found.json()["hits"][0]["path"] == "memory/pets.md"
        refused = api.post("/search", json={"query": "cat", "mode": "nonsense"},
                           headers={"Authorization": f"Bearer {TOKEN}"})
        assert refused.status_code == 422  # the schema refuses it; LocalMemory (MCP) would say 400
        searched = scrape(api)
        assert value(searched, "qmd_indexer_search_seconds_count", mode="dense") == 1
        assert not any(name == "qmd_indexer_search_seconds_count" and dict(labels).get("mode") == "nonsense"
                       for name, labels in searched)  # a refused mode never becomes a label


def test_metrics_need_the_token_and_a_local_host(workspace: Path, make_indexer) -> None:
    indexer = make_indexer([{"agent": "main", "path": workspace}], token=TOKEN)
    api = TestClient(create_app(indexer.view), base_url=BASE)
    assert api.get("/metrics").status_code == 401
    assert api.get("/metrics", headers={"Authorization": "Bearer wrong-token-0123456789"}).status_code == 401
    assert api.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}", "Host": "evil.example:8743"}
                   ).status_code == 403
    assert api.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert "/metrics" not in create_app(indexer.view).openapi()["paths"]  # the JSON contract only


def test_openmetrics_when_asked_and_errors_by_kind(workspace: Path, make_indexer) -> None:
    """A scraper asking for OpenMetrics gets it; a file that fails counts under its reason."""
    write(workspace / "memory" / "nul.md", b"# Binary\n\x00\x01\x02\n")
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    with Running(indexer), TestClient(create_app(indexer.view), base_url=BASE) as api:
        answer = api.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert answer.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
        assert answer.text.endswith("# EOF\n")
        assert 'qmd_indexer_errors_total{kind="extract_failed"} 1.0' in answer.text
        assert "qmd_indexer_files_failed 1.0" in answer.text


def test_several_daemons_in_one_process_keep_their_own_metrics(workspace: Path, tmp_path: Path,
                                                                make_indexer) -> None:
    """Each daemon's registry is its own: a second one neither clashes nor reports the first one's numbers."""
    other = tmp_path / "other"
    write(other / "MEMORY.md", "# Other\n\nNothing here.\n")
    first = make_indexer([{"agent": "main", "path": workspace}])
    second = make_indexer([{"agent": "other", "path": other}], state_dir=tmp_path / "state2")
    first.metrics.error("store_unavailable")
    assert 'qmd_indexer_errors_total{kind="store_unavailable"} 1.0' in first.metrics.exposition()[0].decode()
    body = second.metrics.exposition()[0].decode()
    assert 'kind="store_unavailable"' not in body
    assert 'collection="memory-root-other"' in body and "memory-root-main" not in body
