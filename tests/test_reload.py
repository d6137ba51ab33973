"""SIGHUP reload (``indexer.reload``): ``qmd-indexer run --config`` in a subprocess (real model, real Edge store,
real watcher) under a systemd-compatible notify socket; the config file is edited and the daemon told to reread it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
from conftest import wait_for, write

from indexer.statedir import edge_store
from indexer.store import open_store


def _config(tmp_path: Path, port: int, workspaces: dict[str, Path], **extra: object) -> str:
    lines = [f'state_dir = "{tmp_path / "state"}"', f"port = {port}", "settle_s = 0.2",
             *(f"{key} = {json.dumps(value)}" for key, value in extra.items())]
    for agent, path in workspaces.items():
        lines += ["[[workspace]]", f'agent = "{agent}"', f'path = "{path}"']
    return "\n".join(lines) + "\n"


def _until(listener: socket.socket, prefix: str, seen: list[str]) -> str:
    """Receive notify datagrams (kept in ``seen``) until one starts with ``prefix``; returns it."""
    while True:
        message = listener.recv(4096).decode()
        seen.append(message)
        if message.startswith(prefix):
            return message


def _events(log: Path, name: str) -> list[dict]:
    return [e for e in (json.loads(line[line.index("{"):]) for line in log.read_text().splitlines() if "{" in line)
            if e.get("event") == name]


def test_sighup_applies_workspace_changes_and_keeps_the_old_config_when_broken(
        workspace: Path, tmp_path: Path, listener: socket.socket) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    notes = tmp_path / "notes"  # the workspace added later
    write(notes / "MEMORY.md", "# Notes\n\nThe greenhouse key hangs behind the blue watering can.\n")
    config = tmp_path / "config.toml"
    config.write_text(_config(tmp_path, port, {"main": workspace}))
    log = tmp_path / "run.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "QMD_INDEXER_LOG_FORMAT": "json",
           "NOTIFY_SOCKET": str(tmp_path / "notify.sock")}
    for key in ("WATCHDOG_USEC", "WATCHDOG_PID", "QMD_INDEXER_CONFIG"):
        env.pop(key, None)
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "indexer.cli", "run", "--config", str(config)],
                                stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    seen: list[str] = []
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def search(agent: str, query: str) -> httpx.Response:
        return api.post("/search", json={"query": query, "agent": agent, "k": 1})

    def collections() -> set[str]:
        return set(api.get("/status").json()["collections"])

    try:
        _until(listener, "READY=1", seen)
        assert collections() == {"memory-root-main", "memory-dir-main"}
        assert search("notes", "greenhouse key").status_code == 404  # not an agent yet

        # 1. a workspace added: its collections are made, its files indexed, and it is watched
        config.write_text(_config(tmp_path, port, {"main": workspace, "notes": notes}))
        proc.send_signal(signal.SIGHUP)
        reloading = _until(listener, "RELOADING=1", seen)
        assert "MONOTONIC_USEC=" in reloading
        _until(listener, "READY=1", seen)
        assert collections() == {"memory-root-main", "memory-dir-main", "memory-root-notes", "memory-dir-notes"}
        hit = wait_for(lambda: search("notes", "where is the greenhouse key").json()["hits"], timeout_s=60)[0]
        assert hit["path"] == "MEMORY.md" and "blue watering can" in hit["snippet"]
        write(notes / "memory" / "bees.md", "# Bees\n\nThe hive on the roof swarmed in late May.\n")
        hit = wait_for(lambda: [h for h in search("notes", "when did the hive swarm").json()["hits"]
                                if h["path"] == "memory/bees.md"], timeout_s=60)[0]
        [reloaded] = _events(log, "config_reloaded")
        assert reloaded["added"] == ["notes"] and reloaded["removed"] == [] and reloaded["needs_restart"] == []
        assert not _events(log, "reconcile_drift")  # a new workspace's files are not files the watcher missed

        # 2. a broken file: one error line, the running config kept whole, systemd told the reload is over
        config.write_text("port = [this is not toml\n")
        proc.send_signal(signal.SIGHUP)
        _until(listener, "RELOADING=1", seen)
        _until(listener, "READY=1", seen)
        [failed] = _events(log, "config_reload_failed")
        assert "invalid TOML" in failed["error"] and failed["level"] == "error"
        assert collections() == {"memory-root-main", "memory-dir-main", "memory-root-notes", "memory-dir-notes"}
        assert search("notes", "greenhouse key").json()["hits"]
        assert proc.poll() is None

        # 3. a workspace removed, and a setting that needs a restart: notes is no longer served, main still is
        other = tmp_path / "other-state"
        config.write_text(_config(tmp_path, port, {"main": workspace}).replace(
            f'state_dir = "{tmp_path / "state"}"', f'state_dir = "{other}"'))
        proc.send_signal(signal.SIGHUP)
        _until(listener, "RELOADING=1", seen)
        _until(listener, "READY=1", seen)
        assert collections() == {"memory-root-main", "memory-dir-main"}
        assert search("notes", "greenhouse key").status_code == 404
        assert search("main", "deploy windows").json()["hits"]
        [restart] = _events(log, "config_reload_needs_restart")
        assert restart["settings"] == ["state_dir"] and restart["level"] == "warning"
        assert not other.exists()  # the running state dir is kept

        proc.send_signal(signal.SIGTERM)
        _until(listener, "STOPPING=1", seen)
        assert proc.wait(60) == 0
    finally:
        api.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print("notify sequence:", seen)
    reload_pairs = [m.split("\n")[0] for m in seen if m.startswith(("RELOADING=1", "READY=1"))]
    assert reload_pairs == ["READY=1"] + ["RELOADING=1", "READY=1"] * 3, seen
    assert "Traceback" not in log.read_text()
    [dropped] = _events(log, "collections_dropped")
    assert dropped["collections"] == ["memory-dir-notes", "memory-root-notes"]
    # the daemon is gone: the removed workspace's collections went with it
    store = open_store(edge_store(tmp_path / "state"))
    try:
        assert set(store.collections()) == {"memory-root-main", "memory-dir-main"}
    finally:
        store.close()


def test_an_agent_added_by_a_reload_is_unknown_until_its_collections_exist_never_an_error(
        tmp_path: Path, workspace: Path, make_indexer) -> None:
    """A search for an agent that a reload is adding, while its collections are being made, answers 404 (not known
    yet), never a 500; once the reload is applied it answers from the new collections."""
    from fastapi.testclient import TestClient

    from indexer.config import Workspace
    from indexer.reload import Reloader
    from indexer.server import create_app

    beta = tmp_path / "beta"
    write(beta / "memory" / "honey.md", "# Honey\n\nBeta keeps bees; the honey harvest is in August.\n")
    indexer = make_indexer([{"agent": "alpha", "path": workspace}])
    settings = indexer.settings
    added = settings.model_copy(update={"workspace": (*settings.workspace, Workspace(agent="beta", path=beta))})
    api = TestClient(create_app(indexer.view), base_url="http://127.0.0.1:8743")
    during: list[int] = []
    ensure = indexer.store.ensure_collection

    def ensure_while_searched(name: str, dims: dict[str, int]) -> None:  # a search arrives mid-reload
        during.append(api.post("/search", json={"query": "honey harvest", "agent": "beta"}).status_code)
        ensure(name, dims)

    indexer.store.ensure_collection = ensure_while_searched  # type: ignore[method-assign]
    try:
        assert Reloader(indexer, lambda: added).apply()
    finally:
        indexer.store.ensure_collection = ensure  # type: ignore[method-assign]
    assert during and set(during) == {404}, during
    answer = api.post("/search", json={"query": "honey harvest", "agent": "beta"})
    assert answer.status_code == 200 and answer.json()["hits"] == []  # known, empty until the worker indexes it


def test_a_plugin_installed_while_running_is_picked_up_by_a_reload(
        tmp_path: Path, workspace: Path, make_indexer, monkeypatch) -> None:
    """A distribution installed after the daemon opened (a ``*.dist-info`` with its entry points, on the path): a
    reload loads it, its kind is claimed and the files of that kind already there are indexed."""
    from structlog.testing import capture_logs
    from test_plugins import fake_distribution

    from indexer.reload import Reloader
    from indexer.worker import drain, index_once

    notes = write(workspace / "memory" / "field.fake", "the heron nests by the north pond\n")
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    running = indexer.registry
    index_once(indexer)
    assert str(notes) not in indexer.state.indexed and "fake" not in indexer.registry.extractors  # unclaimed

    site = tmp_path / "site"
    fake_distribution(site, {"qmd_indexer.classifiers": {"fake-early": "qmd_fake_plugins:EarlyClassifier"},
                             "qmd_indexer.extractors": {"fake-ext": "qmd_fake_plugins:FakeExtractor"}})
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])  # what pip install does to a running process
    with capture_logs() as logs:
        assert not Reloader(indexer, lambda: indexer.settings).apply()  # the collections are the same
    [loaded] = [e for e in logs if e["event"] == "plugins_reloaded"]
    ours = [added for added in loaded["added"] if "qmd-fake-plugins" in added]  # others may be installed meanwhile
    assert ours == ["classifiers/fake-early qmd-fake-plugins 1.2.3 loaded",
                    "extractors/fake-ext qmd-fake-plugins 1.2.3 loaded"] and loaded["removed"] == []
    assert "fake" in indexer.registry.extractors and indexer.view.registry is indexer.registry
    assert indexer.pipeline.registry is indexer.registry
    assert indexer.registry.embedders == running.embedders  # the running models are kept, not loaded again
    assert notes in indexer.settler.paths()  # a scan was asked for: the newly claimed file is queued
    drain(indexer)
    assert str(notes) in indexer.state.indexed and indexer.state.indexed[str(notes)].state.points == 1

    # an embedder is added (an upgrade of the distribution): the collections' vectors would change, so a restart
    entry_points = site / "qmd_fake_plugins-1.2.3.dist-info" / "entry_points.txt"
    entry_points.write_text(entry_points.read_text()
                            + "[qmd_indexer.embedders]\nfake-vec = qmd_fake_plugins:AudioModalityEmbedder\n")
    loaded_before = indexer.registry
    with capture_logs() as logs:
        Reloader(indexer, lambda: indexer.settings).apply()
    assert indexer.registry is loaded_before and "audio" not in indexer.registry.embedders
    [restart] = [e for e in logs if e["event"] == "plugins_need_restart"]
    assert [added for added in restart["added"] if "qmd-fake-plugins" in added] == [
        "embedders/fake-vec qmd-fake-plugins 1.2.3 loaded"]
    assert restart["log_level"] == "warning"
