"""Memory stays private: the attacks of a local user, a web page and a LAN host, each tried against the product.

Every test here reproduces a way memory leaked before (it failed on the code before the fix) and checks that the
daemon now refuses it: reads raced outside the workspace, DNS rebinding, an open non-loopback bind, oversized
requests, unscoped requests across agents, shared and nested workspaces, permission errors, file text in logs.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from conftest import wait_for, write
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_process import free_port
from structlog.testing import capture_logs

from indexer import safeio
from indexer.cache import EmbeddingCache
from indexer.cli import main
from indexer.config import Workspace
from indexer.config_load import load_settings
from indexer.errors import ConfigError, ExtractError, FileSkipped, ReadRefused
from indexer.guard import MAX_BODY_BYTES
from indexer.memory import MAX_PAGE_CHARS, MAX_PAGE_LINES, MAX_QUERY_CHARS
from indexer.pipeline import Pipeline
from indexer.recall import read_memory
from indexer.server import create_app
from indexer.sources.base import read_fingerprint
from indexer.walk import route
from indexer.worker import index_once
from indexer.workspace import plan_collections

RACE_S = 4.0  # long enough to reproduce the race many times over on the code before the fix (see the test)
OUTSIDE = "OUTSIDE-SECRET-7f3a"
RENAME_EXCHANGE = 2
AT_FDCWD = -100


def _exchanger():
    """``exchange(a, b)``: atomically swap two paths with ``renameat2(RENAME_EXCHANGE)``, or ``None`` when libc or
    the filesystem lacks it."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]

    def exchange(a: Path, b: Path) -> None:
        if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))

    return exchange


@pytest.fixture(name="flipping")
def flipping_fixture(tmp_path: Path):
    """A workspace whose ``memory/flip`` is swapped, in a loop, with a symlink to a directory outside it holding
    ``secret.md``: ``(workspace, collections, run)`` where ``run(read)`` calls ``read()`` from three threads for
    ``RACE_S`` seconds and returns ``{"inside", "outside", "refused"}`` counts."""
    exchange = _exchanger()
    if exchange is None:
        pytest.skip("libc has no renameat2")
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# Memory\n")
    write(ws / "memory" / "flip" / "secret.md", "# Inside\n\nan ordinary note\n")
    write(tmp_path / "outside" / "secret.md", f"# Outside\n\n{OUTSIDE}\n")
    swap = tmp_path / "swap"
    swap.symlink_to(tmp_path / "outside", target_is_directory=True)
    try:
        exchange(ws / "memory" / "flip", swap)
        exchange(ws / "memory" / "flip", swap)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            pytest.skip(f"renameat2(RENAME_EXCHANGE) unsupported here: {exc.strerror}")
        raise
    collections = plan_collections([Workspace(agent="main", path=ws)])

    def run(read) -> dict[str, int]:
        counts = {"inside": 0, "outside": 0, "refused": 0}
        lock = threading.Lock()
        stop = threading.Event()

        def swapper() -> None:
            while not stop.is_set():
                exchange(ws / "memory" / "flip", swap)

        def reader() -> None:
            while not stop.is_set():
                try:
                    text = read()
                except (ReadRefused, FileSkipped, ExtractError, OSError, ValueError):
                    key = "refused"
                else:
                    key = "outside" if OUTSIDE in text else "inside"
                with lock:
                    counts[key] += 1

        threads = [threading.Thread(target=swapper)] + [threading.Thread(target=reader) for _ in range(3)]
        for thread in threads:
            thread.start()
        time.sleep(RACE_S)
        stop.set()
        for thread in threads:
            thread.join(10)
        return counts

    return ws, collections, run


@pytest.mark.parametrize("resolver", ["openat2", "openat walk"])
def test_1_get_cannot_be_raced_outside_the_workspace(flipping, registry, monkeypatch, resolver: str) -> None:
    """Item 1: swapping ``memory/flip`` with a symlink while ``get`` reads ``memory/flip/secret.md``. Before the fix
    the lexical checks passed and ``open()`` then followed the swapped-in symlink. Both resolvers are tried: the
    kernel's ``openat2`` and the component-by-component walk used where the kernel lacks it."""
    if resolver == "openat2":
        fd = os.open(flipping[0], os.O_RDONLY)
        try:
            probe = safeio._openat2(fd, "MEMORY.md", os.O_RDONLY)
        finally:
            os.close(fd)
        if probe is None:
            pytest.skip("the kernel has no openat2")
        os.close(probe)
    else:
        monkeypatch.setattr(safeio, "_have_openat2", False)
    _, collections, run = flipping
    counts = run(lambda: read_memory(collections, "memory/flip/secret.md", classify=registry.classify)["text"])
    total = sum(counts.values())
    assert counts["outside"] == 0, f"{counts['outside']} of {total} reads served the outside file ({counts})"
    assert counts["inside"] > 0 and counts["refused"] > 0, f"the race did not run both ways: {counts}"


def test_1_indexing_cannot_be_raced_outside_the_workspace(flipping) -> None:
    """Item 1, indexing side: the fingerprint read (hash and classifier head) of the same raced file."""
    ws, collections, run = flipping
    memory_dir = next(c for c in collections if c.role == "dir")
    target = ws / "memory" / "flip" / "secret.md"
    counts = run(lambda: read_fingerprint(target, 1 << 20, memory_dir)[1].decode())
    assert counts["outside"] == 0, f"{counts['outside']} fingerprint reads saw the outside file ({counts})"
    assert counts["inside"] > 0 and counts["refused"] > 0, f"the race did not run both ways: {counts}"



def test_1_extraction_cannot_be_raced_outside_the_workspace(flipping, registry, tmp_path: Path) -> None:
    """Item 1, extraction: the extractor read ``FileInfo.path`` by name after the fingerprint, so the chunks (and
    then search hits) could hold outside text. It now reads through ``FileInfo.open``, opened beneath the root."""
    ws, collections, run = flipping
    memory_dir = next(c for c in collections if c.role == "dir")
    pipeline = Pipeline(registry, EmbeddingCache(tmp_path / "embeddings.sqlite3"), 1 << 20)
    target = ws / "memory" / "flip" / "secret.md"
    counts = run(lambda: "".join(c.text for c in pipeline.prepare(memory_dir, target, None).chunks))
    assert counts["outside"] == 0, f"{counts['outside']} extractions held the outside text ({counts})"
    assert counts["inside"] > 0 and counts["refused"] > 0, f"the race did not run both ways: {counts}"

# -- the HTTP API through the real app ---------------------------------------------------------------------------
BOB_SECRET = "bob-pin-4412"
TOKEN = "t0ken-for-tests-0123456789"


@pytest.fixture(name="agents")
def agents_fixture(tmp_path: Path, make_indexer):
    """``make(**settings)``: an indexed daemon over two agents, alice and bob, each in a workspace of their own."""
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    write(alice / "MEMORY.md", "# Alice\n\nAlice keeps bees on the roof.\n")
    write(alice / "memory" / "garden.md", "# Garden\n\nThe tomatoes need water daily.\n")
    write(bob / "MEMORY.md", f"# Bob\n\nBob's bank PIN is {BOB_SECRET}.\n")
    write(bob / "memory" / "rowing.md", "# Rowing\n\nBob rows with the club on Saturdays.\n")

    def make(**overrides):
        indexer = make_indexer([{"agent": "alice", "path": alice}, {"agent": "bob", "path": bob}], **overrides)
        index_once(indexer)
        indexer.state.ready.set()
        return indexer

    return make, alice, bob


def _client(indexer, host: str = "127.0.0.1:8743", **headers: str) -> TestClient:
    return TestClient(create_app(indexer.view), base_url=f"http://{host}", headers=headers)


def test_2_dns_rebinding_and_cross_origin_requests_are_refused(agents) -> None:
    """Item 2: a web page whose name rebinds to 127.0.0.1 sends its own Host; a cross-origin POST sends its Origin."""
    make, *_ = agents
    indexer = make()
    rebound = _client(indexer, host="attacker.example:8743")
    response = rebound.get("/get", params={"path": "MEMORY.md", "agent": "bob"})
    assert response.status_code == 403 and BOB_SECRET not in response.text
    assert rebound.get("/health").status_code == 403
    local = _client(indexer)
    crossed = local.post("/search", json={"query": "bank PIN", "agent": "bob"},
                         headers={"Origin": "http://attacker.example"})
    assert crossed.status_code == 403 and BOB_SECRET not in crossed.text
    for origin in ("null", "http://127.0.0.1.attacker.example:8743", "file://"):
        assert local.get("/health", headers={"Origin": origin}).status_code == 403, origin
    assert _client(indexer, host="127.0.0.1:9999").get("/health").status_code == 403  # the wrong port
    for host in ("127.0.0.1:8743", "localhost:8743", "[::1]:8743"):
        assert _client(indexer, host=host).get("/health").status_code == 200, host
    same_origin = local.post("/search", json={"query": "bees", "agent": "alice"},
                             headers={"Origin": "http://127.0.0.1:8743"})
    assert same_origin.status_code == 200


def test_3_a_non_loopback_bind_needs_the_bearer_token(agents) -> None:
    """Item 3, in the app: with a token every request needs it; LAN address literals are fine Hosts then."""
    make, *_ = agents
    indexer = make(host="0.0.0.0", token=TOKEN)
    lan = _client(indexer, host="192.168.1.20:8743")
    response = lan.get("/get", params={"path": "MEMORY.md", "agent": "bob"})
    assert response.status_code == 401 and BOB_SECRET not in response.text
    assert response.headers["www-authenticate"] == "Bearer"
    wrong = lan.get("/get", params={"path": "MEMORY.md", "agent": "bob"}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    right = _client(indexer, host="192.168.1.20:8743", Authorization=f"Bearer {TOKEN}")
    assert BOB_SECRET in right.get("/get", params={"path": "MEMORY.md", "agent": "bob"}).json()["text"]
    assert right.get("/status").json()["bind"] == "0.0.0.0:8743"
    rebound = _client(indexer, host="attacker.example:8743", Authorization=f"Bearer {TOKEN}")
    assert rebound.get("/health").status_code == 403


def test_3_run_refuses_a_non_loopback_host_without_a_token(tmp_path: Path, workspace: Path) -> None:
    """Item 3, at start: `QMD_INDEXER_HOST=0.0.0.0` (or `run --host`) without a token exits 2 with one line."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "QMD_INDEXER_HOST": "0.0.0.0"}
    env.pop("QMD_INDEXER_TOKEN", None)
    command = [sys.executable, "-m", "indexer.cli", "run", "--workspace", str(workspace), "--state-dir",
               str(tmp_path / "state"), "--port", str(free_port())]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "0.0.0.0" in result.stderr and "token" in result.stderr
    env.pop("QMD_INDEXER_HOST")
    flag = subprocess.run([*command, "--host", "192.168.1.20"], capture_output=True, text=True, timeout=60, env=env)
    assert flag.returncode == 2 and "token" in flag.stderr, flag.stderr


def test_4_oversized_requests_are_refused_before_they_cost_anything(agents) -> None:
    """Item 4: a huge body (413, also when streamed without a length), a long query (400 naming the limit), and
    `max_chars`/`lines` far beyond a page (capped server-side)."""
    make, alice, _ = agents
    indexer = make()
    api = _client(indexer)
    huge = api.post("/search", json={"query": "x " * (MAX_BODY_BYTES // 2 + 10), "agent": "alice"})
    assert huge.status_code == 413
    streamed = api.post("/search", content=(b"x" * 65536 for _ in range(40)),
                        headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413
    long = api.post("/search", json={"query": "bees " * 4000, "agent": "alice"})
    assert long.status_code == 400 and str(MAX_QUERY_CHARS) in long.json()["detail"]
    assert api.post("/recall", json={"query": "q" * (MAX_QUERY_CHARS + 1), "agent": "alice"}).status_code == 400
    write(alice / "memory" / "big.md", ("y" * 99 + "\n") * 3000)  # 300,000 characters
    page = api.get("/get", params={"path": "memory/big.md", "agent": "alice", "max_chars": 10**9}).json()
    assert len(page["text"]) <= MAX_PAGE_CHARS and page["truncated"] and page["next_from"] == page["to"] + 1
    write(alice / "memory" / "many.md", "z\n" * (MAX_PAGE_LINES + 500))
    page = api.get("/get", params={"path": "memory/many.md", "agent": "alice", "lines": 10**9,
                                                 "max_chars": 10**9}).json()
    assert page["to"] == MAX_PAGE_LINES and page["truncated"]
    assert api.get("/health").json()["status"] == "ok"


def test_5_unscoped_requests_fail_closed_with_several_agents(agents) -> None:
    """Item 5: without an agent (or with ``""``) nothing spans agents: 400 naming them."""
    make, _, bob = agents
    api = _client(make())
    calls = [("post", "/search", {"json": {"query": "bank PIN"}}),
             ("post", "/search", {"json": {"query": "bank PIN", "agent": ""}}),
             ("post", "/recall", {"json": {"query": "*", "top_k": 100}}),
             ("post", "/boot", {"json": {"budget_chars": 4000}}),
             ("get", "/get", {"params": {"path": str(bob / "MEMORY.md")}})]
    for method, url, kwargs in calls:
        response = getattr(api, method)(url, **kwargs)
        assert response.status_code == 400, (url, kwargs, response.text)
        assert "alice" in response.json()["detail"] and "bob" in response.json()["detail"]
        assert BOB_SECRET not in response.text


def test_5_a_default_agent_scopes_unscoped_requests_to_it(agents) -> None:
    make, _, bob = agents
    api = _client(make(default_agent="alice"))
    hits = api.post("/search", json={"query": "bank PIN"}).json()["hits"]
    assert hits and {h["agent"] for h in hits} == {"alice"}
    listed = api.post("/recall", json={"query": "*", "top_k": 100}).json()["hits"]
    assert {h["agent"] for h in listed} == {"alice"}
    assert BOB_SECRET not in api.post("/boot", json={"budget_chars": 100_000}).text
    foreign = api.get("/get", params={"path": str(bob / "MEMORY.md")})
    assert foreign.status_code == 403 and BOB_SECRET not in foreign.text
    assert BOB_SECRET in api.get("/get", params={"path": "MEMORY.md", "agent": "bob"}).json()["text"]


def test_6_two_agents_on_one_workspace_path_are_refused(tmp_path: Path, workspace: Path) -> None:
    """Item 6: the second agent's collections stayed empty while its `get` worked; now the config is refused."""
    config = write(tmp_path / "config.toml", f'state_dir = "{tmp_path / "state"}"\n'
                   f'[[workspace]]\nagent = "alice"\npath = "{workspace}"\n'
                   f'[[workspace]]\nagent = "bob"\npath = "{workspace}/"\n')
    with pytest.raises(ConfigError, match="'alice' and 'bob' share"):
        load_settings(config)
    result = subprocess.run([sys.executable, "-m", "indexer.cli", "index", "--once", "--config", str(config)],
                            capture_output=True, text=True, timeout=60, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_7_a_workspace_nested_in_anothers_memory_owns_its_files(tmp_path: Path, make_indexer) -> None:
    """Item 7: bob's workspace inside alice's memory/: bob's files were indexed as alice's, bob saw nothing and
    nothing warned. Now each file belongs to the innermost workspace, and the overlap is named in the log and by
    `doctor`."""
    alice = tmp_path / "alice"
    bob = alice / "memory" / "bob"
    write(alice / "MEMORY.md", "# Alice\n\nbees\n")
    write(alice / "memory" / "garden.md", "# Garden\n\ntomatoes\n")
    write(bob / "MEMORY.md", f"# Bob\n\n{BOB_SECRET}\n")
    write(bob / "memory" / "rowing.md", "# Rowing\n\nSaturdays\n")
    write(bob / "loose.md", "# Loose\n\nnot memory for bob (outside his memory/), so alice keeps it\n")
    with capture_logs() as logs:
        indexer = make_indexer([{"agent": "alice", "path": alice}, {"agent": "bob", "path": bob}])
    index_once(indexer)
    owners = {Path(p).relative_to(tmp_path).as_posix(): e.collection for p, e in indexer.state.indexed.items()}
    assert owners == {"alice/MEMORY.md": "memory-root-alice", "alice/memory/garden.md": "memory-dir-alice",
                      "alice/memory/bob/loose.md": "memory-dir-alice",
                      "alice/memory/bob/MEMORY.md": "memory-root-bob",
                      "alice/memory/bob/memory/rowing.md": "memory-dir-bob"}
    assert route(indexer.collections, bob / "memory" / "rowing.md")[0].agent == "bob"
    [warning] = [e for e in logs if e["event"] == "workspaces_overlap"]
    assert str(bob) in warning["detail"] and "'alice'" in warning["detail"] and "'bob'" in warning["detail"]
    config = write(tmp_path / "config.toml", f'[[workspace]]\nagent = "alice"\npath = "{alice}"\n'
                   f'[[workspace]]\nagent = "bob"\npath = "{bob}"\n')
    doctor = CliRunner().invoke(main, ["doctor", "--config", str(config)])
    assert "warning: overlapping workspaces" in doctor.output and str(bob) in doctor.output


def test_8_get_without_an_agent_does_what_its_help_says(agents) -> None:
    """Item 8: `get` without an agent answered 404 when the first workspace lacked the file though another had it,
    while its help said "the first that has it". Help and behaviour now say the same: default_agent, else the only
    agent, else the agent is required."""
    make, *_ = agents
    help_text = " ".join(CliRunner().invoke(main, ["get", "--help"]).output.split())
    assert "default_agent" in help_text and "required" in help_text and "the first that has it" not in help_text
    api = _client(make())
    unscoped = api.get("/get", params={"path": "memory/rowing.md"})
    assert unscoped.status_code == 400 and "bob" in unscoped.json()["detail"]
    assert "Saturdays" in api.get("/get", params={"path": "memory/rowing.md", "agent": "bob"}).json()["text"]


# -- a real daemon: non-loopback bind with a token, permission errors, what the log holds -------------------------
MARKS = {"MEMORY.md": "ROOT-MARK-91c2", "memory/notes.md": "NOTE-MARK-5d0e", "memory/locked.md": "LOCKED-MARK-77aa",
         "memory/closed/inner.md": "CLOSED-MARK-3b19", "memory/nul.md": "NUL-MARK-e4f0"}


class Live:
    """`qmd-indexer run --host 0.0.0.0` with a token, as a user without the capabilities that bypass file
    permissions (root drops them with setpriv), JSON logs to a file."""

    def __init__(self, base: Path) -> None:
        self.ws = base / "ws"
        for rel, mark in MARKS.items():
            text = f"# Note\n\nthe private text {mark}\n"
            write(self.ws / rel, text.encode() + (b"\x00" if rel.endswith("nul.md") else b""))
        for d in (base, self.ws, self.ws / "memory"):
            os.chmod(d, 0o755)
        os.chmod(self.ws / "memory" / "locked.md", 0o000)
        os.chmod(self.ws / "memory" / "closed", 0o000)
        self.port = free_port()
        self.log = base / "run.log"
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "HOME": str(base), "QMD_INDEXER_LOG_FORMAT": "json",
                    "QMD_INDEXER_TOKEN": TOKEN, "QMD_INDEXER_HOST": "0.0.0.0"}
        command = [sys.executable, "-m", "indexer.cli", "run", "--workspace", str(self.ws), "--agent", "main",
                   "--state-dir", str(base / "state"), "--port", str(self.port)]
        if os.geteuid() == 0:
            drop = "-dac_override,-dac_read_search"
            command = [shutil.which("setpriv"), f"--inh-caps={drop}", f"--bounding-set={drop}", *command]
        with open(self.log, "w") as stderr:
            self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=self.env)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30,
                                 headers={"Authorization": f"Bearer {TOKEN}"})

    def ready(self) -> bool:
        try:
            return self.http.get("/health").json().get("ready", False)
        except httpx.HTTPError:
            assert self.proc.poll() is None, self.log.read_text()
            return False

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()


@pytest.fixture(scope="module", name="live")
def live_fixture():
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root and util-linux's setpriv is missing: cannot drop CAP_DAC_OVERRIDE")
    base = Path(tempfile.mkdtemp(prefix="qmd-live-"))
    live = Live(base)
    try:
        wait_for(live.ready, timeout_s=180, interval_s=0.2)
        yield live
    finally:
        live.proc.send_signal(signal.SIGTERM)
        live.proc.wait(60)
        live.http.close()
        os.chmod(live.ws / "memory" / "closed", 0o755)
        shutil.rmtree(base, ignore_errors=True)


def test_3_a_live_daemon_on_all_interfaces_warns_and_needs_the_token(live) -> None:
    [warning] = [json.loads(line) for line in live.lines() if '"non_loopback_bind"' in line]
    assert warning["level"] == "warning" and warning["host"] == "0.0.0.0"
    assert httpx.get(f"http://127.0.0.1:{live.port}/get", params={"path": "MEMORY.md"}).status_code == 401
    assert MARKS["MEMORY.md"] in live.http.get("/get", params={"path": "MEMORY.md"}).json()["text"]
    status = subprocess.run([sys.executable, "-m", "indexer.cli", "status", "--port", str(live.port)],
                            capture_output=True, text=True, timeout=60, env=live.env)
    assert status.returncode == 0 and f"listening on: 0.0.0.0:{live.port}" in status.stdout, status.stderr


def test_9_unreadable_files_answer_403_with_one_log_line(live) -> None:
    """Item 9: a mode-000 file, and a file in a mode-000 directory, gave 500 and a PermissionError traceback."""
    for rel in ("memory/locked.md", "memory/closed/inner.md"):
        before = len(live.lines())
        response = live.http.get("/get", params={"path": rel})
        assert response.status_code == 403 and response.json()["detail"] == "permission denied", response.text
        new = live.lines()[before:]
        assert len(new) == 1, new
        assert json.loads(new[0]) == {**json.loads(new[0]), "event": "read_refused", "path": rel,
                                      "reason": "permission_denied"}
    assert not any("Traceback" in line or "PermissionError" in line for line in live.lines())


def test_logs_never_carry_file_contents(live) -> None:
    """A full index (with a failed file and unreadable ones) and the requests above log paths, never text."""
    events = [json.loads(line)["event"] for line in live.lines() if line.startswith("{")]
    assert "file_indexed" in events and "file_failed" in events
    for line in live.lines():
        for mark in MARKS.values():
            assert mark not in line, line


# -- fuzzing the path handling ------------------------------------------------------------------------------------
PARTS = ["..", ".", "", "memory", "MEMORY.md", "memory.md", "notes.md", "link.md", "dirlink", "outside.md",
         "ws-private", ".hidden", "%2e%2e", "..%2f", "%252e", "\x00", "\\..", "x" * 300, "ws"]


def test_fuzzed_paths_never_read_outside_the_workspace_and_valid_ones_are_read(tmp_path: Path, registry) -> None:
    """Hypothesis over paths built from traversal pieces, encodings, NUL, long names, absolute prefixes, a
    `<workspace>-private` sibling and symlinked files and directories: every answer is a refusal or a file of the
    workspace, never text from outside it; and every path that normalises (lexically, as documented) to one of the
    workspace's memory files is read, giving that file's text (a read that refused everything would fail)."""
    ws = tmp_path / "ws"
    memory = {"MEMORY.md": "# Memory\n\ninside\n", "memory/notes.md": "# Notes\n\ninside too\n"}
    for rel, text in memory.items():
        write(ws / rel, text)
    write(ws / "memory" / ".hidden" / "x.md", "# Hidden\n\nhidden\n")
    write(tmp_path / "outside.md", f"# Out\n\n{OUTSIDE}\n")
    write(tmp_path / "ws-private" / "MEMORY.md", f"# Out\n\n{OUTSIDE}\n")
    write(tmp_path / "ws-private" / "memory" / "notes.md", f"# Out\n\n{OUTSIDE}\n")
    (ws / "memory" / "link.md").symlink_to(tmp_path / "outside.md")
    (ws / "memory" / "dirlink").symlink_to(tmp_path / "ws-private", target_is_directory=True)
    collections = plan_collections([Workspace(agent="main", path=ws)])
    prefixes = st.sampled_from(["", "/", f"{ws}/", f"{tmp_path}/", f"{ws}-private/", "memory/"])
    fuzzed = st.builds(lambda prefix, parts: prefix + "/".join(parts), prefixes,
                       st.lists(st.one_of(st.sampled_from(PARTS), st.text(max_size=4)), max_size=6))
    # valid spellings of the two memory files: detours that normalise away, absolute and relative forms
    detours = st.lists(st.sampled_from([".", "x/..", "memory/..", "dirlink/..", "x" * 300 + "/..", "%2e%2e/.."]),
                       max_size=3)
    valid = st.builds(lambda prefix, steps, target: prefix + "".join(f"{s}/" for s in steps) + target,
                      st.sampled_from(["", "./", f"{ws}/", f"{tmp_path}/ws/", f"{ws}-private/../ws/", "memory/../"]),
                      detours, st.sampled_from(["MEMORY.md", "memory/notes.md", "memory/./notes.md"]))
    read: set[str] = set()

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(path=st.one_of(fuzzed, valid))
    def check(path: str) -> None:
        named = os.path.normpath(path if os.path.isabs(path) else ws / path)
        expected = next((rel for rel in memory if named == str(ws / rel)), None)
        try:
            page = read_memory(collections, path, max_chars=1000, classify=registry.classify)
        except (ReadRefused, KeyError, ValueError, OSError) as exc:
            assert expected is None, f"{path!r} names {expected} but was refused: {type(exc).__name__}: {exc}"
            return
        assert OUTSIDE not in page["text"], path
        assert os.path.realpath(ws / page["path"]).startswith(f"{ws}/"), (path, page["path"])
        if expected is not None:
            assert (page["path"], page["text"]) == (expected, memory[expected].rstrip("\n")), path
            read.add(expected)

    check()
    assert read == set(memory)  # valid paths were generated and read, not only refusals checked


def test_get_never_reads_a_nested_workspace_through_the_outer_agent(tmp_path: Path, make_indexer) -> None:
    """dave's workspace lies inside alice's ``memory/``: search, recall and boot keep them apart, and so must ``get``
    (relative, absolute, HTTP): a file belongs to the innermost workspace on every face."""
    from indexer.errors import ReadRefused
    from indexer.recall import read_memory

    alice = tmp_path / "alice"
    dave = alice / "memory" / "dave"
    write(alice / "memory" / "a.md", "# Alice\n\nAlice's own note.\n")
    write(dave / "memory" / "d.md", "# Dave\n\nDave's private note: the safe code is 4471.\n")
    indexer = make_indexer([{"agent": "alice", "path": alice}, {"agent": "dave", "path": dave}])
    collections = indexer.collections
    assert read_memory(collections, "memory/d.md", agent="dave")["text"].endswith("4471.")
    assert "Alice's own note." in read_memory(collections, "memory/a.md", agent="alice")["text"]
    for path in ("memory/dave/memory/d.md", str(dave / "memory" / "d.md")):
        with pytest.raises(ReadRefused):
            read_memory(collections, path, agent="alice")
    api = TestClient(create_app(indexer.view), base_url="http://127.0.0.1:8743")
    answer = api.get("/get", params={"path": "memory/dave/memory/d.md", "agent": "alice"})
    assert answer.status_code == 403 and "4471" not in answer.text, answer.text
