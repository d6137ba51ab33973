"""The request contract as published is the one enforced: what ``/openapi.json`` allows is accepted, what it does
not is refused with 422 (never coerced, never a 500), and every text argument is checked once, at the contract."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from indexer.server import create_app
from indexer.worker import index_once


@pytest.fixture(name="api")
def api_fixture(workspace: Path, make_indexer) -> TestClient:
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    index_once(indexer)
    return TestClient(create_app(indexer.view), base_url="http://127.0.0.1:8743", raise_server_exceptions=False)


@pytest.mark.parametrize(("route", "body"), [
    ("/search", {"query": "deploy", "top_k": 842.5}),       # a fraction where an integer is published
    ("/search", {"query": "deploy", "k": True}),            # a boolean for an integer
    ("/search", {"query": "deploy", "min_score": False}),   # a boolean for a number
    ("/search", {"query": "deploy", "colour": "blue"}),     # a field the schema does not have
    ("/boot", {"budget_chars": True}),
    ("/recall", {"query": "*", "offset": 1.5}),
    ("/search", {"query": "deploy", "until": ""}),          # a since/until in none of the published forms
    ("/search", {"query": "deploy", "since": "last week"}),
])
def test_values_the_schema_does_not_allow_are_refused_not_coerced(api: TestClient, route: str, body: dict) -> None:
    answer = api.post(route, json=body)
    assert answer.status_code == 422, (answer.status_code, answer.text)


@pytest.mark.parametrize(("route", "body"), [
    ("/search", {"query": "deploy", "top_k": 2.0}),  # JSON Schema's integer: a zero fraction is one
    ("/boot", {"budget_chars": 4156.0}),
    ("/search", {"query": "deploy", "since": "2026-11-01t09:30:00z"}),  # RFC 3339 allows lower-case t and z
    ("/search", {"query": "deploy", "until": "9999-12-31T23:59:59Z"}),  # past 64-bit nanoseconds: clamped
    ("/search", {"query": "deploy", "since": "0001-01-01"}),
])
def test_values_the_schema_allows_are_accepted(api: TestClient, route: str, body: dict) -> None:
    """What ``make fuzz`` found refused though the published schema allows it (schemathesis, positive data)."""
    answer = api.post(route, json=body)
    assert answer.status_code == 200, (answer.status_code, answer.text)


@pytest.mark.parametrize("field", ["path_prefix", "kind", "agent", "collection", "since", "until"])
def test_a_lone_surrogate_in_a_text_argument_is_a_422_not_a_500(api: TestClient, field: str) -> None:
    body = '{"query": "deploy", "' + field + '": "memory/\\ud800x"}'  # JSON may carry one; UTF-8 cannot
    answer = api.post("/search", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 422, (answer.status_code, answer.text)
    assert "surrogate" in answer.text


def test_a_lone_surrogate_in_the_query_is_searched_as_a_replacement(api: TestClient) -> None:
    answer = api.post("/search", content='{"query": "deploy \\ud800 windows"}',
                      headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text


def test_get_publishes_the_minimums_it_enforces(api: TestClient) -> None:
    params = {p["name"]: p["schema"] for p in api.get("/openapi.json").json()["paths"]["/get"]["get"]["parameters"]}
    assert params["from"].get("minimum") == 1 and params["max_chars"].get("minimum") == 1
    assert any(option.get("minimum") == 1 for option in params["lines"].get("anyOf", [params["lines"]]))
    assert api.get("/get", params={"path": "MEMORY.md", "lines": 0}).status_code == 422
    assert api.get("/get", params={"path": "MEMORY.md", "lines": 1}).status_code == 200


def test_a_citation_that_ends_before_it_starts_is_refused(api: TestClient) -> None:
    """``MEMORY.md#L5-L2`` read line 5 alone with a 200; a reversed range is a mistake worth a 422 naming the fix."""
    answer = api.get("/get", params={"path": "MEMORY.md#L3-L2"})
    assert answer.status_code == 422 and "MEMORY.md#L2-L3" in answer.text, answer.text
    page = api.get("/get", params={"path": "MEMORY.md#L2-L3"}).json()
    assert (page["from"], page["to"]) == (2, 3)
