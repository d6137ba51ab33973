"""qmd-indexer as OpenClaw's memory, in a real OpenClaw (2026.9.6, from npm: ``make openclaw``).

One daemon and one OpenClaw gateway for the module. The setup is the README's "Use it from OpenClaw" lines, run as
written: ``qmd-indexer init --openclaw`` writes the daemon's config from OpenClaw's ``openclaw.json`` (two agents,
``main`` and ``ops``, each with notes and a session transcript), ``openclaw plugins install ./plugins/openclaw``
installs the plugin from this checkout, ``openclaw config set memory.search.enabled false``. Then the gateway runs on
loopback with no model provider, and every tool call goes through its ``POST /tools/invoke``, as an agent's would.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import test_sessions
from conftest import wait_for, write
from openclaw import OpenClaw, need_openclaw
from openclaw.gateway import NODE
from server_process import end, free_port, spawn, wait_ready

pytestmark = pytest.mark.openclaw

REPO = Path(__file__).resolve().parent.parent
MAIN_SESSION = "5c1d4a8e-0b7f-4e43-9d7a-6f2b1e0c9a11"
OPS_SESSION = "9e2f7b31-44c0-4c8a-b1d2-0a5e6c7d8f92"
KAYAK = test_sessions.EVIDENCE  # "We finally booked the ferry to the island for the kayak race."
CONTINUED = "[More content available. Use from={} to continue.]"  # memory-core's, after a read that stops early
DATACENTER = "The datacenter migration to Amsterdam is planned for the first Saturday of March."

NOTES = {  # main's workspace
    "MEMORY.md": "# Memory\n\n## Deploys\n\n- Deploy windows are Tuesday and Thursday, 10:00 to 12:00 local time.\n"
                 "- No deploys on Fridays; a hotfix needs Dana's approval.\n\n## Infrastructure\n\n"
                 "- The staging database runs on db-stage-03 in the Frankfurt region.\n",
    "USER.md": "# User\n\n- Prefers TypeScript for new tools; Python only for data scripts.\n"
               "- Takes coffee as a flat white, no sugar.\n- Lives in Lisbon and works 09:00 to 17:00.\n",
    "memory/2026-11-27-deploy-retro.md": "# Deploy retro\n\n- The billing-service deploy failed on its database "
                                         "migration and was rolled back at 11:40.\n- Priya adds a dry run of "
                                         "migrations to the pipeline.\n",
    "memory/2026-11-20.md": "# 2026-11-20\n\n- Booked the team offsite in Porto for 12 December, at the Ribeira "
                            "hotel.\n",
    "memory/projects/acme.md": "# ACME integration\n\n- Our contact at ACME is Jonas Weber (jonas@acme.example).\n"
                               "- The ACME API key rotates every 90 days.\n",
}

#: question -> (the file that answers it, words of its answering line, corpus)
QUESTIONS = {
    "when are we allowed to deploy?": ("MEMORY.md", "Deploy windows are Tuesday", None),
    "how does the user take their coffee?": ("USER.md", "flat white", None),
    "why was the billing-service deploy rolled back?": ("memory/2026-11-27-deploy-retro.md",
                                                        "failed on its database migration", None),
    "where is the team offsite?": ("memory/2026-11-20.md", "offsite in Porto", None),
    "who is our contact at ACME?": ("memory/projects/acme.md", "Jonas Weber", None),
    "what did we book for the kayak race?": (f"sessions/{MAIN_SESSION}.jsonl", "kayak race", "sessions"),
}


@dataclass
class Setup:
    claw: OpenClaw
    daemon: subprocess.Popen[bytes]
    daemon_url: str
    main_ws: Path
    sessions: dict[str, Path]  # OpenClaw agent -> its transcript

    def search(self, query: str, agent: str = "main", **args: Any) -> dict[str, Any]:
        return self.claw.invoke("memory_search", {"query": query, **args}, agent=agent)

    def get(self, path: str, agent: str = "main", **args: Any) -> dict[str, Any]:
        return self.claw.invoke("memory_get", {"path": path, **args}, agent=agent)


def readme_commands() -> list[str]:
    """The commands of the README's "Use it from OpenClaw" block, comments dropped, ``&&`` chains split."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Use it from OpenClaw"):]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block, "no sh block in the README's OpenClaw section"
    lines = [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    return [part.strip() for line in lines if line for part in line.split("&&")]


def _transcript(session: str, day: str, evidence: str) -> str:
    return test_sessions.openclaw(session, day, test_sessions._talk(evidence))


def _daemon_env(base: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("QMD_INDEXER_CONFIG", "QMD_INDEXER_TOKEN")}
    return {**env, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(base / "no-config"), "NO_COLOR": "1"}


@pytest.fixture(scope="module", name="setup")
def setup_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    need_openclaw()
    base = tmp_path_factory.mktemp("openclaw")
    claw = OpenClaw(base / "claw")
    main_ws, ops_ws = base / "ws-main", base / "ws-ops"
    for rel, text in NOTES.items():
        write(main_ws / rel, text)
    write(ops_ws / "MEMORY.md", "# Ops memory\n\n- The on-call rotation switches every Monday at 09:00.\n")
    sessions = {"main": write(claw.state / "agents" / "main" / "sessions" / f"{MAIN_SESSION}.jsonl",
                              _transcript(MAIN_SESSION, "2026-06-02", KAYAK)),
                "ops": write(claw.state / "agents" / "ops" / "sessions" / f"{OPS_SESSION}.jsonl",
                             _transcript(OPS_SESSION, "2026-06-03", DATACENTER))}
    claw.write_config({"agents": {"ownership": "explicit", "defaults": {"systemAgent": {"agentId": "main"}},
                                  "entries": {"main": {"workspace": str(main_ws)}, "ops": {"workspace": str(ops_ws)}}}})
    commands = readme_commands()
    config, port = base / "qmd-indexer.toml", free_port()
    init = next(c for c in commands if c.startswith("qmd-indexer init"))
    done = subprocess.run([sys.executable, "-m", "indexer", *shlex.split(init)[1:], "--config", str(config)],
                          env={**_daemon_env(base), **claw.env()}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert next(c for c in commands if c.startswith("qmd-indexer run")) == "qmd-indexer run"
    log = base / "daemon.log"
    daemon = spawn([sys.executable, "-m", "indexer", "run", "--config", str(config), "--state-dir",
                    str(base / "qmd-state"), "--port", str(port)], _daemon_env(base), log, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        for command in commands:  # install the plugin and configure OpenClaw as the README says, while it starts
            if command.startswith("openclaw ") and command != "openclaw gateway restart":
                claw.cli(*shlex.split(command)[1:])
        cfg = claw.config()  # then: two agents the daemon does not know (one mapped to main), the daemon's port
        cfg["agents"]["entries"].update({"guest": {"workspace": str(base / "ws-guest")},
                                         "helper": {"workspace": str(base / "ws-helper")}})
        cfg["plugins"]["entries"]["qmd-indexer"]["config"] = {"url": url, "agents": {"helper": "main"}}
        claw.write_config(cfg)
        claw.start()
        wait_ready(daemon, lambda: bool(httpx.get(f"{url}/health", timeout=5).json()["ready"]), "the daemon", 300, log)
        yield Setup(claw, daemon, url, main_ws, sessions)
    finally:
        claw.stop()
        end(daemon, signal.SIGTERM)


def _answer_line(path: str, words: str, setup: Setup) -> int:
    """The 1-based line of ``path`` (a note of main's workspace, or main's transcript) holding ``words``."""
    file = setup.sessions["main"] if path.startswith("sessions/") else setup.main_ws / path
    return next(n for n, line in enumerate(file.read_text().splitlines(), 1) if words in line)


def test_the_plugin_owns_the_memory_slot_from_the_readme_lines(setup: Setup) -> None:
    cfg = setup.claw.config()
    assert cfg["plugins"]["slots"]["memory"] == "qmd-indexer" and cfg["memory"]["search"]["enabled"] is False
    inspected = json.loads(setup.claw.cli("plugins", "inspect", "qmd-indexer", "--runtime", "--json").stdout)
    plugin = inspected["plugin"]
    assert plugin["status"] == "loaded" and plugin["activationReason"] == "selected memory slot"
    assert sorted(plugin["toolNames"]) == ["memory_get", "memory_search"] and plugin["cliCommands"] == ["qmd-indexer"]


@pytest.mark.parametrize("question", list(QUESTIONS))
def test_memory_search_finds_the_file_and_lines_that_answer(setup: Setup, question: str) -> None:
    path, words, corpus = QUESTIONS[question]
    answer = setup.search(question, **({"corpus": corpus} if corpus else {}))
    assert answer["provider"] == "qmd-indexer" and not answer.get("unavailable"), answer
    top = answer["results"][0]
    line = _answer_line(path, words, setup)
    assert top["path"] == path and top["startLine"] <= line <= top["endLine"], (question, answer["results"])
    assert top["citation"].startswith(f"{path}#L{top['startLine']}")
    assert top["source"] == ("sessions" if path.startswith("sessions/") else "memory") and top["score"] > 0
    assert words in top["snippet"]


def test_max_results_min_score_and_corpus_are_honoured(setup: Setup) -> None:
    assert len(setup.search("deploys", maxResults=2)["results"]) == 2
    assert setup.search("deploys", minScore=1000.0)["results"] == []
    notes = setup.search("kayak race ferry", corpus="memory", maxResults=10)["results"]
    assert notes and {r["source"] for r in notes} == {"memory"}
    assert {r["source"] for r in setup.search("kayak race ferry", corpus="sessions")["results"]} == {"sessions"}


@pytest.mark.parametrize("question", [q for q, (path, _, _) in QUESTIONS.items() if path.endswith(".md")])
def test_memory_get_returns_the_cited_lines(setup: Setup, question: str) -> None:
    top = setup.search(question)["results"][0]
    page = setup.get(top["citation"])
    lines = (setup.main_ws / top["path"]).read_text().splitlines()
    assert page["status"] == "ok" and page["path"] == top["path"], page
    assert page["from"] == top["startLine"] and page["lines"] == top["endLine"] - top["startLine"] + 1
    cited = "\n".join(lines[top["startLine"] - 1:top["endLine"]])
    more = top["endLine"] < len(lines)  # lines follow: memory-core's continuation line too
    assert page["text"] == (f"{cited}\n\n{CONTINUED.format(top['endLine'] + 1)}" if more else cited)


def test_memory_get_reads_a_range_a_transcript_and_refuses_what_is_not_memory(setup: Setup) -> None:
    page = setup.get("USER.md", **{"from": 4, "lines": 1})
    assert (page["status"], page["from"], page["lines"], page["truncated"], page["nextFrom"]) == ("ok", 4, 1, True, 5)
    assert page["text"] == "- Takes coffee as a flat white, no sugar.\n\n" + CONTINUED.format(5)  # as memory-core
    top = setup.search("what did we book for the kayak race?", corpus="sessions")["results"][0]
    assert KAYAK in setup.get(top["citation"])["text"]
    assert setup.get("memory/nope.md") == {"status": "not_found", "text": "", "path": "memory/nope.md"}
    for refused in ("../ws-ops/MEMORY.md", "/etc/passwd", "notes.txt"):
        page = setup.get(refused)
        assert page["status"] == "error" and page["code"] in ("REFUSED", "NOT_FOUND") and page["text"] == "", page


def test_transcript_hits_reach_only_their_own_agent(setup: Setup) -> None:
    mine = setup.search("when is the datacenter migration?", agent="ops", corpus="sessions")["results"]
    assert mine[0]["path"] == f"sessions/{OPS_SESSION}.jsonl" and "Amsterdam" in mine[0]["snippet"]
    for agent, foreign in (("ops", "kayak"), ("main", "Amsterdam")):
        for corpus in ("sessions", "all"):
            results = setup.search(f"{foreign} ferry datacenter migration race", agent=agent, corpus=corpus)["results"]
            assert not any(foreign in r["snippet"] for r in results), (agent, corpus, results)
    # the memory runtime's authorizeSearchHits, as the host calls it on raw hits: a transcript hit reaches only the
    # agent whose search found it, from its own session, not sandboxed; a hit object it did not make, never
    script = """
      import { authorizeSearchHits, searchMemory } from MODULE;
      const settings = { url: DAEMON, token: "", agents: {}, timeoutMs: 10000 };
      const { hits } = await searchMemory(settings, "main", "booked the ferry for the kayak race", { maxResults: 10 });
      const seen = (requesterSessionKey, sandboxed = false, given = hits) => authorizeSearchHits(
        { cfg: {}, agentId: "main", requesterSessionKey, sandboxed, hits: given }).map((h) => h.source);
      console.log(JSON.stringify({ raw: hits.map((h) => h.source), own: seen("agent:main:main"),
        other: seen("agent:ops:main"), sandboxed: seen("agent:main:main", true),
        copied: seen("agent:main:main", false, hits.map((h) => ({ ...h }))) }));
    """.replace("MODULE", json.dumps(str(REPO / "plugins" / "openclaw" / "src" / "memory.js"))).replace(
        "DAEMON", json.dumps(setup.daemon_url))
    ran = subprocess.run([str(NODE), "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout)
    assert "sessions" in seen["raw"] and "memory" in seen["raw"] and seen["own"] == seen["raw"]
    for withheld in ("other", "sandboxed", "copied"):
        assert seen[withheld] == [s for s in seen["raw"] if s == "memory"], (withheld, seen)


def test_a_saved_note_is_found_through_openclaw_within_2_s(setup: Setup) -> None:
    question, rel = "when does the quokka sticker order ship?", "memory/2026-12-01-standup.md"
    assert all(r["path"] != rel for r in setup.search(question)["results"])
    saved = time.monotonic()
    write(setup.main_ws / rel, "# Standup\n\n- The quokka sticker order ships on Wednesday.\n")
    wait_for(lambda: setup.search(question)["results"][0]["path"] == rel, timeout_s=2.0, interval_s=0.01)
    assert time.monotonic() - saved < 2.0


def test_an_agent_the_daemon_lacks_is_an_error_saying_the_fix_and_a_mapped_one_is_served(setup: Setup) -> None:
    answer = setup.search("deploy windows", agent="guest")
    assert answer["unavailable"] and answer["disabled"] and answer["results"] == [], answer
    assert answer["code"] == "UNKNOWN_AGENT" and 'qmd-indexer has no agent "guest"' in answer["error"]
    assert "qmd-indexer init --openclaw" in answer["action"]
    assert "plugins.entries.qmd-indexer.config.agents" in answer["action"]
    page = setup.get("MEMORY.md", agent="guest")
    assert page["status"] == "error" and page["code"] == "UNKNOWN_AGENT" and "[[workspace]]" in page["action"]
    assert setup.search("how does the user take their coffee?", agent="helper")["results"][0]["path"] == "USER.md"
    # a mapping shares notes, never conversations: helper reads none of main's transcripts (it read them all)
    for corpus in ("sessions", "all"):
        results = setup.search("booked the ferry for the kayak race", agent="helper", corpus=corpus)["results"]
        assert not any(r["source"] == "sessions" for r in results), (corpus, results)
    page = setup.get(f"sessions/{MAIN_SESSION}.jsonl", agent="helper")
    assert page["status"] == "error" and page["code"] == "REFUSED" and page["text"] == "", page


def test_a_server_that_is_not_the_daemon_is_unavailable_not_a_missing_file(tmp_path: Path) -> None:
    """A url pointing at another server: its 404 page read as "MEMORY.md not found" and its HTML filled the error."""
    need_openclaw()  # its Node runs the plugin's module
    script = """
      import http from "node:http";
      import { readMemory, searchMemory } from MODULE;
      const server = http.createServer((q, r) => { r.writeHead(404, { "content-type": "text/html" });
        r.end("<!DOCTYPE HTML><html><body>" + "x".repeat(2000) + "</body></html>"); });
      await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
      const settings = { url: `http://127.0.0.1:${server.address().port}`, token: "", agents: {}, timeoutMs: 5000 };
      const out = {};
      for (const [name, call] of [["get", () => readMemory(settings, "main", { relPath: "MEMORY.md" })],
                                  ["search", () => searchMemory(settings, "main", "deploy")]]) {
        try { out[name] = { answered: await call() }; } catch (e) { out[name] = { code: e.code, message: e.message }; }
      }
      server.close();
      console.log(JSON.stringify(out));
    """.replace("MODULE", json.dumps(str(REPO / "plugins" / "openclaw" / "src" / "memory.js")))
    ran = subprocess.run([str(NODE), "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    for name, got in json.loads(ran.stdout).items():
        assert got.get("code") == "DAEMON_ERROR" and "not a qmd-indexer daemon" in got["message"], (name, got)
        assert len(got["message"]) < 600 and "x" * 100 not in got["message"], got


def test_openclaw_reports_the_daemon_its_model_and_index(setup: Setup) -> None:
    status = json.loads(setup.claw.cli("qmd-indexer", "status", "--agent", "main", "--json").stdout)[0]
    assert status["provider"] == "qmd-indexer" and "all-MiniLM-L6-v2" in status["model"]
    assert status["custom"]["state"] == "ready" and status["vector"]["available"] is True
    files = {s["source"]: s["files"] for s in status["sourceCounts"]}
    assert files["memory"] >= len(NOTES) and files["sessions"] == 1, status
    probe = json.loads(setup.claw.cli("gateway", "call", "doctor.memory.status", "--params",
                                      json.dumps({"probe": True, "agentId": "main"}), "--json").stdout)
    assert probe["provider"] == "qmd-indexer" and probe["embedding"]["ok"] is True, probe
    found = setup.claw.cli("qmd-indexer", "search", "flat white coffee", "--agent", "main").stdout
    assert found.startswith("1. USER.md#L")


def test_the_daemon_over_mcp_is_the_alternative(setup: Setup, tmp_path: Path) -> None:
    """The README's MCP line (in an OpenClaw of its own: the gateway above keeps its config): OpenClaw connects to
    the daemon's /mcp and lists its tools."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    line = re.search(r"`(openclaw mcp add qmd-indexer [^`]*)`", readme.replace("\n", " "))
    assert line, "no openclaw mcp add line in the README"
    other = OpenClaw(tmp_path / "mcp-claw")
    other.write_config({})
    other.cli(*shlex.split(line.group(1).replace("http://127.0.0.1:8743", setup.daemon_url))[1:])
    probed = json.loads(other.cli("mcp", "probe", "qmd-indexer", "--json").stdout)
    assert "memory_search" in json.dumps(probed), probed


def test_a_stopped_daemon_is_an_error_saying_how_to_start_it(setup: Setup) -> None:
    """Last: it stops the module's daemon."""
    end(setup.daemon, signal.SIGTERM)
    answer = setup.search("when are we allowed to deploy?")
    assert answer["unavailable"] and answer["disabled"] and answer["results"] == [] and answer["code"] == \
        "DAEMON_UNREACHABLE", answer
    assert f"no qmd-indexer daemon answers at {setup.daemon_url}" in answer["error"]
    assert "qmd-indexer run" in answer["action"] and "systemctl --user start qmd-indexer" in answer["action"]
    assert "plugins.entries.qmd-indexer.config.url" in answer["action"]
    page = setup.get("MEMORY.md")
    assert page["status"] == "error" and page["code"] == "DAEMON_UNREACHABLE" and "qmd-indexer run" in page["action"]
    probe = json.loads(setup.claw.cli("gateway", "call", "doctor.memory.status", "--params",
                                      json.dumps({"probe": True, "agentId": "main"}), "--json").stdout)
    assert probe["embedding"]["ok"] is False and "no qmd-indexer daemon answers" in probe["embedding"]["error"], probe
    status = setup.claw.cli("qmd-indexer", "status", "--agent", "main", check=False)
    assert status.returncode == 1 and "unavailable" in status.stdout and "qmd-indexer run" in status.stdout
