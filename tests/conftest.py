"""Shared fixtures: one real embedding model per test session, and helpers that build real workspaces.

Nothing here reads ../shared: every file a test needs is written into ``tmp_path``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from indexer.config import Settings  # noqa: E402
from indexer.daemon import Indexer  # noqa: E402
from indexer.plugins import Registry, load_registry  # noqa: E402


@pytest.fixture(scope="session", name="registry")
def registry_fixture(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    """The installed plugins with the real default model (all-MiniLM-L6-v2 from its wheel), loaded once at the
    precision ``auto`` picks for this CPU (an int8 export goes to a temporary folder)."""
    models = tmp_path_factory.mktemp("models")
    registry = load_registry(config={"sentence-transformers": {"model": "all-MiniLM-L6-v2", "cache_dir": str(models)}})
    registry.embedders["text"].embed_query("warm-up")
    return registry


def write(path: Path, text: str | bytes) -> Path:
    """Create ``path`` (and its parents) with ``text``; returns it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def make_settings(tmp_path: Path, workspaces: list[dict[str, Any]], **overrides: Any) -> Settings:
    """Settings for ``workspaces`` with state under ``tmp_path/state`` and a short debounce."""
    values: dict[str, Any] = {"state_dir": tmp_path / "state", "settle_s": 0.2, "workspace": workspaces}
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(name="workspace")
def workspace_fixture(tmp_path: Path) -> Path:
    """A small agent workspace: a root memory file and three notes under memory/."""
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# Memory\n\nDeploy windows are Tuesday and Thursday mornings.\nNo deploys on Fridays.\n")
    write(ws / "memory" / "incidents.md", "# Incidents\n\nACME-4471: the export job ran out of disk on batch-02.\n")
    write(ws / "memory" / "food" / "coffee.md", "# Coffee\n\nThe user drinks a flat white without sugar.\n")
    write(ws / "memory" / "travel.md", "# Travel\n\nFlights to Lisbon are booked for March; window seat please.\n")
    return ws


@pytest.fixture(name="make_indexer")
def make_indexer_fixture(tmp_path: Path, registry: Registry) -> Iterator[Callable[..., Indexer]]:
    """Factory of opened ``Indexer``s over real Qdrant Edge (default) sharing the session's model; closed after."""
    made: list[Indexer] = []

    def make(workspaces: list[dict[str, Any]], store: Any = None, **overrides: Any) -> Indexer:
        indexer = Indexer(make_settings(tmp_path, workspaces, **overrides), registry=registry, store=store)
        indexer.open()
        made.append(indexer)
        return indexer

    yield make
    for indexer in made:
        if indexer.watcher:
            indexer.watcher.stop()
        if indexer.store and indexer.store.kind == "edge":
            try:
                indexer.store.close()
            except Exception:
                pass


class Running:
    """An ``Indexer.run`` loop on a thread, stopped on exit."""

    def __init__(self, indexer: Indexer) -> None:
        self.indexer = indexer
        self.stop = threading.Event()
        self.thread = threading.Thread(target=indexer.run, args=(self.stop,), daemon=True)

    def __enter__(self) -> Indexer:
        self.thread.start()
        assert self.indexer.ready.wait(60), "daemon did not finish its first index"
        return self.indexer

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.indexer.settler.wake()
        self.thread.join(30)


def wait_for(condition: Callable[[], Any], timeout_s: float = 20.0, interval_s: float = 0.05) -> Any:
    """Poll ``condition`` until truthy (returns its value) or fail after ``timeout_s`` seconds."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s} s")
