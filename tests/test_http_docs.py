"""The HTTP API's own pages work offline: no page the daemon serves loads assets from outside it (FastAPI's
Swagger UI and ReDoc pull theirs from a CDN, so they are not served), and the OpenAPI document stays."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from indexer.server import create_app


def test_no_page_loads_assets_from_outside_the_daemon(make_indexer, workspace: Path) -> None:
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    with TestClient(create_app(indexer.view), base_url="http://127.0.0.1:8743") as client:
        for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            answer = client.get(page)
            outside = [url for url in re.findall(r"https?://[^\s\"'<>]+", answer.text)
                       if not url.startswith("http://127.0.0.1:8743")]
            assert answer.status_code == 404 or not outside, (page, answer.status_code, outside)
        spec = client.get("/openapi.json")
        assert spec.status_code == 200
        assert "/search" in spec.json()["paths"]
