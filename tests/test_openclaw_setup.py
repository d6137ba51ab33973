"""What OpenClaw treats as memory, indexed as such, and ``qmd-indexer init --openclaw`` (no OpenClaw needed: these run
in the fast lane; tests/test_openclaw.py runs the plugin in a real OpenClaw gateway).

OpenClaw 2026.9 indexes ``MEMORY.md``, a root ``USER.md`` (its user model, evergreen like ``MEMORY.md``) and
``memory/*.md``, daily notes among them as ``memory/YYYY-MM-DD.md`` or slugged ``memory/YYYY-MM-DD-<slug>.md``.
"""

from __future__ import annotations

import datetime
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import write

from indexer.config import Workspace
from indexer.config_load import load_settings
from indexer.dates import note_date
from indexer.memory import LocalMemory
from indexer.openclaw import OpenClawConfigError, agents_of, init, read_json5
from indexer.points import Hit, Payload
from indexer.ranking import decay
from indexer.schema import SearchRequest
from indexer.walk import root_files
from indexer.worker import index_once


def test_user_md_is_root_memory_and_a_slugged_daily_note_is_dated_by_its_prefix(make_indexer, tmp_path) -> None:
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# Memory\n\nDeploy windows are Tuesday and Thursday mornings.\n")
    write(ws / "USER.md", "# User\n\n- Prefers a flat white without sugar.\n- Writes new tools in TypeScript.\n")
    write(ws / "memory" / "2026-11-27-deploy-retro.md", "# Deploy retro\n\nThe billing deploy moved to Tuesday.\n")
    files, _ = root_files(Workspace(agent="main", path=ws))
    assert sorted(f.name for f in files) == ["MEMORY.md", "USER.md"]
    indexer = make_indexer([{"agent": "main", "path": ws}])
    index_once(indexer)
    collections = indexer.view.status()["collections"]
    assert collections["memory-root-main"]["files"] == 2 and collections["memory-dir-main"]["files"] == 1
    memory = LocalMemory(indexer.view)
    top = memory.search(SearchRequest(query="how does the user take their coffee?", k=3))["hits"][0]
    assert (top["path"], top["collection"], top["citation"]) == ("USER.md", "memory-root-main", "USER.md#L1-L4")
    retro = [p for p in indexer.store.scroll("memory-dir-main") if p.abs_path.endswith("deploy-retro.md")]
    assert retro and all(p.get("note_date") == "2026-11-27" and "27 November 2026" in p.context for p in retro)
    assert note_date("memory/2026-11-27-deploy-retro.md") == datetime.date(2026, 11, 27)


def test_temporal_decay_ages_slugged_daily_notes_and_spares_user_md() -> None:
    now = datetime.datetime(2026, 3, 31, tzinfo=datetime.UTC).timestamp()
    hits = [Hit(pid, 1.0, Payload(path=path)) for pid, path in (
        ("slug", "memory/2026-03-01-deploy-retro.md"), ("plain", "memory/2026-03-01.md"), ("user", "USER.md"),
        ("memory", "MEMORY.md"), ("topic", "memory/projects/2026-03-01-plan/notes.md"))]
    scores = {h.id: h.score for h in decay(hits, half_life_days=30, now_s=now)}
    assert scores == {"slug": 0.5, "plain": 0.5, "user": 1.0, "memory": 1.0, "topic": 1.0}


# -- init --openclaw ----------------------------------------------------------------------------------------------
def test_json5_as_openclaw_writes_it() -> None:
    text = """// written by openclaw onboard
    {
      gateway: { mode: 'local', port: 18789, },  /* loopback */
      agents: { entries: { main: { workspace: "~/w", name: "it's \\"main\\"" } } },
      n: [0x1F, +.5, -Infinity, 1e3, null, true,],
    }"""
    cfg = read_json5(text)
    assert cfg["gateway"] == {"mode": "local", "port": 18789}
    assert cfg["agents"]["entries"]["main"] == {"workspace": "~/w", "name": 'it\'s "main"'}
    assert cfg["n"][:2] == [31, 0.5] and cfg["n"][2] == float("-inf") and cfg["n"][3:] == [1000.0, None, True]
    with pytest.raises(OpenClawConfigError):
        read_json5("{ a: 'unterminated }")


def test_agents_and_their_workspaces_as_openclaw_resolves_them(tmp_path) -> None:
    env = {"HOME": str(tmp_path / "home"), "OPENCLAW_STATE_DIR": str(tmp_path / "state")}
    state = tmp_path / "state"
    implicit = agents_of({}, env)
    assert [(a.id, a.workspace, a.sessions) for a in implicit] == [
        ("main", state / "workspace", state / "agents" / "main" / "sessions")]
    cfg = {"agents": {"entries": {"main": {}, "Ops": {"workspace": "~/ops"}, "writer": {}}}}
    assert [(a.id, a.workspace) for a in agents_of(cfg, env)] == [
        ("main", state / "workspace-main"), ("ops", tmp_path / "home" / "ops"), ("writer", state / "workspace-writer")]
    shared = {"agents": {"defaults": {"workspace": "/srv/claw"}, "entries": {"main": {}, "ops": {}}}}
    assert [a.workspace for a in agents_of(shared, env)] == [Path("/srv/claw/main"), Path("/srv/claw/ops")]
    legacy = {"agents": {"defaults": {"workspace": "/srv/claw"}, "list": [{"id": "a"}, {"id": "b", "default": True}]}}
    assert [a.workspace for a in agents_of(legacy, env)] == [Path("/srv/claw/a"), Path("/srv/claw")]
    sole = {"agents": {"entries": {"solo": {}}}}
    assert agents_of(sole, {**env, "OPENCLAW_WORKSPACE_DIR": "/w"})[0].workspace == Path("/w")
    with pytest.raises(OpenClawConfigError, match=r"\$include"):
        agents_of({"agents": {"$include": "./agents.json5"}}, env)


def test_init_writes_one_workspace_per_agent_and_refuses_to_overwrite(tmp_path, monkeypatch) -> None:
    state = tmp_path / "openclaw"
    main, ops = tmp_path / "ws-main", tmp_path / "ws-ops"
    entries = f"main: {{workspace: '{main}'}}, ops: {{workspace: '{ops}'}}, twin: {{workspace: '{ops}'}},"
    write(state / "openclaw.json", "// two agents, a third on the second one's workspace\n"
          "{agents: {entries: {" + entries + "},},}\n")
    monkeypatch.setenv("OPENCLAW_STATE_DIR", str(state))
    monkeypatch.delenv("OPENCLAW_CONFIG_PATH", raising=False)
    monkeypatch.delenv("QMD_INDEXER_CONFIG", raising=False)
    target = tmp_path / "qmd" / "config.toml"
    done = CliRunner().invoke(init, ["--openclaw", "--config", str(target)])
    assert done.exit_code == 0, done.output
    written = tomllib.loads(target.read_text())
    assert written["workspace"] == [
        {"agent": "main", "path": str(main), "sessions": str(state / "agents" / "main" / "sessions")},
        {"agent": "ops", "path": str(ops), "sessions": str(state / "agents" / "ops" / "sessions")}]
    settings = load_settings(target)  # the daemon reads what init wrote
    assert [w.agent for w in settings.workspace] == ["main", "ops"]
    assert "openclaw plugins install " in done.output
    assert "plugins/openclaw --force --accept-capabilities" in done.output
    assert "openclaw config set memory.search.enabled false" in done.output
    assert "openclaw config set plugins.entries.qmd-indexer.config.agents.twin ops" in done.output
    assert f"qmd-indexer run --config {target}" in done.output
    again = CliRunner().invoke(init, ["--openclaw", "--config", str(target)])
    assert again.exit_code == 2 and "pass --force" in again.output
    target.write_text("# mine\n")
    forced = CliRunner().invoke(init, ["--openclaw", "--config", str(target), "--force"])
    assert forced.exit_code == 0 and "[[workspace]]" in target.read_text()
    assert CliRunner().invoke(init, ["--config", str(target), "--force"]).exit_code == 2  # no source named


def test_init_without_an_openclaw_config_or_workspace_says_so(tmp_path, monkeypatch) -> None:
    """A mistyped OPENCLAW_CONFIG_PATH wrote a config for a default agent whose workspace does not exist, exit 0."""
    monkeypatch.setenv("OPENCLAW_STATE_DIR", str(tmp_path / "no-openclaw"))
    monkeypatch.setenv("OPENCLAW_CONFIG_PATH", str(tmp_path / "none.json"))
    monkeypatch.delenv("OPENCLAW_WORKSPACE_DIR", raising=False)
    monkeypatch.delenv("QMD_INDEXER_CONFIG", raising=False)
    target = tmp_path / "qmd" / "config.toml"
    done = CliRunner().invoke(init, ["--openclaw", "--config", str(target)])
    assert done.exit_code == 2 and "no OpenClaw config at" in done.output and not target.exists(), done.output
    (tmp_path / "no-openclaw" / "workspace").mkdir(parents=True)  # OpenClaw run without a config file: its defaults
    done = CliRunner().invoke(init, ["--openclaw", "--config", str(target)])
    assert done.exit_code == 0 and "OpenClaw's defaults" in done.output, done.output
