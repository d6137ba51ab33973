"""What the benchmarks share: ``qmd-indexer run`` as a subprocess (``Daemon``: every benchmark that starts a daemon
uses this one), a small workspace of real notes, the points of a stopped daemon's store, and the truth they are
compared with (a clean index of the same files).

Notes come from ``../shared/data/vault`` (Obsidian docs, real prose), else ``../shared/data/devvault``, else are
generated (numbered sentences); ``notes_source`` says which. Daemons run from this checkout with JSON log lines, by
default with ``precision = "fp32"`` (no model export under the state dir, which a full disk would otherwise meet
first); ``make bench`` runs them with the product's own precision (``fp32=False``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parent.parent
SHARED = [p / "shared" / "data" for p in (REPO.parent, REPO.parent.parent)]  # a checkout, or a worktree beside it
VAULTS = tuple(d / name for name in ("vault", "devvault") for d in SHARED)
AGENT = "main"
# what a daemon's environment adds to this process's (read when the daemon starts)
DAEMON_ENV = {"HF_HUB_OFFLINE": "1", "QMD_INDEXER_LOG_FORMAT": "json", "PYTHONPATH": str(REPO)}
FP32_ENV = {"QMD_INDEXER_PRECISION": "fp32"}
SAME_VECTOR = 0.999  # cosine above which two embeddings of one chunk count as the same vector


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(condition: Callable[[], Any], timeout_s: float, interval_s: float = 0.1, what: str = "") -> Any:
    """Poll ``condition`` until truthy (its value) or raise ``TimeoutError`` after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"not within {timeout_s} s: {what}")


# -- notes --------------------------------------------------------------------------------------------------------
def load_notes(n: int, seed: int = 0, min_bytes: int = 300, max_bytes: int = 6000) -> tuple[list[str], str]:
    """``n`` texts of real notes (markdown between ``min_bytes`` and ``max_bytes``), and where they came from."""
    for vault in VAULTS:
        if vault.is_dir():
            paths = sorted(p for p in vault.rglob("*.md") if min_bytes <= p.stat().st_size <= max_bytes)
            if len(paths) >= n:
                random.Random(seed).shuffle(paths)
                return [p.read_text(errors="replace") for p in paths[:n]], str(vault)
    rng = random.Random(seed)
    words = "deploy cache index shard note vector query agent memory review budget travel meeting".split()
    texts = [f"# Note {i}\n\n" + "\n".join(" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(20))
             for i in range(n)]
    return texts, "generated"


def make_workspace(ws: Path, texts: list[str]) -> None:
    """A fresh workspace: ``MEMORY.md`` and ``memory/note-<i>.md`` for each text (every fourth in a subfolder)."""
    shutil.rmtree(ws, ignore_errors=True)
    (ws / "memory" / "sub").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nThe fault trials write here.\n")
    for i, text in enumerate(texts):
        folder = ws / "memory" / ("sub" if i % 4 == 3 else "")
        (folder / f"note-{i}.md").write_text(text)


def memory_files(ws: Path) -> list[Path]:
    return sorted((ws / "memory").rglob("*.md"))


class Burst:
    """Random edits, renames, deletes and creations of notes under ``ws/memory`` (one ``step()`` each)."""

    def __init__(self, ws: Path, pool: list[str], seed: int) -> None:
        self.ws, self.pool, self.rng, self.made = ws, pool, random.Random(seed), 0

    def step(self) -> str:
        files = [p for p in memory_files(self.ws) if p.name != "probe.md"]
        op = self.rng.choice(["append", "append", "rewrite", "rename", "delete", "create"] if files else ["create"])
        target = self.rng.choice(files) if files else None
        if op == "append" and target:
            with open(target, "a") as handle:
                handle.write(f"\n\nEdit {self.rng.randrange(10**9)}: " + self.rng.choice(self.pool)[:400] + "\n")
        elif op == "rewrite" and target:
            target.write_text(self.rng.choice(self.pool))
        elif op == "rename" and target:
            self.made += 1
            folder = self.ws / "memory" / self.rng.choice(["", "sub"])
            target.replace(folder / f"renamed-{self.made}-{self.rng.randrange(10**6)}.md")
        elif op == "delete" and target:
            target.unlink()
        else:
            self.made += 1
            (self.ws / "memory" / f"new-{self.made}-{self.rng.randrange(10**6)}.md").write_text(
                self.rng.choice(self.pool))
        return op


# -- the daemon ---------------------------------------------------------------------------------------------------
class Daemon:
    """``qmd-indexer run`` on ``ws`` as agent ``agent`` with state in ``state``, on ``port`` (default: a free one), its
    output (JSON log lines) to ``log_path``. Run as ``python -m indexer.cli`` from this checkout, so the code measured
    is this tree's, or ``repo``'s (an installed ``qmd-indexer`` script imports whatever checkout the virtualenv was
    installed from).

    The environment is this process's plus ``DAEMON_ENV``, ``FP32_ENV`` unless ``fp32`` is false, then ``env``.
    With ``sample_rss``, a thread samples the resident set every 50 ms (``sampled_peak``, bytes: ``rss_peak``'s
    fallback where ``/proc`` has no ``VmHWM``; needs psutil). With ``config`` (a TOML file of ``[[workspace]]``
    tables, e.g. one with a ``sessions`` folder), the daemon reads its workspaces from it, not ``ws``/``agent``."""

    def __init__(self, ws: Path, state: Path, log_path: Path, env: dict[str, str] | None = None,
                 agent: str = AGENT, fp32: bool = True, sample_rss: bool = False, port: int | None = None,
                 repo: Path = REPO, config: Path | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.started = time.monotonic()
        # a config file (``config``) names the workspaces itself: ``ws`` and ``agent`` are then not passed
        where = ["--config", str(config)] if config is not None else ["--workspace", str(ws), "--agent", agent]
        cmd = [sys.executable, "-m", "indexer.cli", "run", *where, "--state-dir", str(state), "--port", str(self.port)]
        full_env = {**os.environ, **DAEMON_ENV, "PYTHONPATH": str(repo), **(FP32_ENV if fp32 else {}), **(env or {})}
        with open(log_path, "w") as output:
            self.proc = subprocess.Popen(cmd, stdout=output, stderr=subprocess.STDOUT, env=full_env, cwd=repo)
        self.client = httpx.Client(timeout=10)
        self.sampled_peak = 0
        self._sampling = threading.Event()
        if sample_rss:
            threading.Thread(target=self._sample_rss, daemon=True).start()

    def _sample_rss(self) -> None:
        import psutil

        process = psutil.Process(self.proc.pid)
        while not self._sampling.wait(0.05):
            try:
                self.sampled_peak = max(self.sampled_peak, process.memory_info().rss)
            except psutil.Error:
                return

    def _proc_status(self) -> dict[str, int]:
        """``/proc/<pid>/status`` memory lines of the daemon, kB; empty where there is no ``/proc``."""
        out: dict[str, int] = {}
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("RssAnon", "RssFile", "VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0])
        except OSError:
            pass
        return out

    def rss_peak(self) -> int:
        """Peak resident set (bytes): the kernel's high-water mark (``VmHWM``), else the sampled maximum."""
        hwm = self._proc_status().get("VmHWM")
        return hwm * 1024 if hwm is not None else self.sampled_peak

    def rss_parts(self) -> dict[str, int]:
        """The resident set now, MiB: ``RssAnon`` (heap: the process's own memory) and ``RssFile`` (pages of
        memory-mapped files, e.g. Qdrant's on-disk vectors, that the kernel may drop), with ``VmRSS`` and
        ``VmHWM``, from ``/proc/<pid>/status``."""
        return {key: kb // 1024 for key, kb in self._proc_status().items()}

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the daemon has used so far (psutil)."""
        import psutil

        times = psutil.Process(self.proc.pid).cpu_times()
        return float(times.user + times.system)

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def seen(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e.get("event") == event]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def get(self, path: str) -> Any:
        return self.client.get(self.url + path).json()

    def search(self, query: str, **kwargs: Any) -> httpx.Response:
        return self.client.post(self.url + "/search", json={"query": query, **kwargs})

    def _ready(self) -> bool:
        if not self.alive():
            raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.tail()}")
        try:
            return bool(self.get("/health").get("ready"))
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout_s: float = 300) -> float:
        """Seconds from the start to ``ready: true``."""
        wait_until(self._ready, timeout_s, 0.1, "daemon ready")
        return time.monotonic() - self.started

    def wait_quiet(self, timeout_s: float = 120, quiet_s: float = 1.5) -> None:
        """Until the queue has been empty for ``quiet_s`` seconds (the debounce is 1 s)."""
        since: list[float] = []

        def quiet() -> bool:
            if self.get("/status")["queue_depth"]:
                since.clear()
                return False
            since.append(time.monotonic())
            return since[-1] - since[0] >= quiet_s
        wait_until(quiet, timeout_s, 0.2, "queue empty")

    def kill(self) -> int:
        self.proc.send_signal(signal.SIGKILL)
        return self.close()

    def stop(self) -> int:
        """SIGTERM; the exit status (0: a clean stop)."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        return self.close()

    def close(self) -> int:
        self._sampling.set()
        try:
            code = self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.client.close()
        return code

    def tail(self, n: int = 5) -> str:
        return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-n:])


# -- what is in a store, and the truth ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Stored:
    """One point as compared: where it belongs, what it holds, and its dense vector."""

    collection: str
    path: str
    chunk_index: int
    file_hash: str
    text_sha: str
    vector: np.ndarray


Snapshot = dict[tuple[str, str], Stored]  # (collection, point id) -> point


def snapshot(qdrant_dir: Path) -> Snapshot:
    """Every point of every collection in the Edge store at ``qdrant_dir`` (its daemon must be stopped)."""
    from indexer.store import EdgeStore

    store = EdgeStore(qdrant_dir)
    try:
        out: Snapshot = {}
        for name in store.collections():
            for point in store.scroll_points(name):
                p = point.payload
                vector = point.dense.get("text", np.zeros(1, np.float32))
                out[(name, point.id)] = Stored(name, p.abs_path, p.chunk_index, p.file_hash,
                                               hashlib.sha256(p.text.encode()).hexdigest()[:16], vector)
        return out
    finally:
        store.close()


def compare(got: Snapshot, truth: Snapshot) -> dict[str, int]:
    """``lost``: truth points missing; ``stale``: points of another version of a file, or of a file that is not
    memory now; ``duplicated``: more than one point for one (collection, file, chunk); ``wrong_vector``: a point
    whose dense vector is not the clean index's (cosine under ``SAME_VECTOR``)."""
    lost = sum(1 for key in truth if key not in got)
    stale = wrong = 0
    slots: dict[tuple[str, str, int], int] = {}
    for key, point in got.items():
        slot = (point.collection, point.path, point.chunk_index)
        slots[slot] = slots.get(slot, 0) + 1
        clean = truth.get(key)
        if clean is None or (clean.path, clean.file_hash, clean.text_sha) != (point.path, point.file_hash,
                                                                               point.text_sha):
            stale += 1
        elif float(np.dot(clean.vector, point.vector)) < SAME_VECTOR:
            wrong += 1
    duplicated = sum(n - 1 for n in slots.values() if n > 1)
    return {"points": len(got), "truth": len(truth), "lost": lost, "duplicated": duplicated, "stale": stale,
            "wrong_vector": wrong}


class Truth:
    """A clean index of a workspace, in this process: a fresh state dir each time, ``index_once``. The model is
    loaded once; the clean indexes share an embedding cache of their own (never a daemon's)."""

    def __init__(self, out: Path) -> None:
        from indexer.config import Settings, Workspace
        from indexer.plugins import load_registry, plugin_configs
        from indexer.terminal import configure_logging

        configure_logging("json", "error")
        self.out = out
        self.cache = out / "truth-embeddings.sqlite3"
        self.n = 0
        base = Settings(state_dir=out / "truth-base", precision="fp32", log_level="error",
                        workspace=(Workspace(agent=AGENT, path=out),))
        self.registry = load_registry(base.plugins, plugin_configs(base), base.prefer)

    def index(self, ws: Path) -> Snapshot:
        from indexer.config import Settings, Workspace
        from indexer.daemon import Indexer
        from indexer.worker import index_once

        self.n += 1
        state = self.out / f"truth-{self.n}"
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir(parents=True)
        if self.cache.exists():
            shutil.copyfile(self.cache, state / "embeddings.sqlite3")
        settings = Settings(state_dir=state, precision="fp32", log_level="error",
                            workspace=(Workspace(agent=AGENT, path=ws),))
        indexer = Indexer.open(settings, registry=self.registry)
        try:
            index_once(indexer)
        finally:
            indexer.close()
        shutil.copyfile(state / "embeddings.sqlite3", self.cache)
        got = snapshot(state / "qdrant")
        shutil.rmtree(state, ignore_errors=True)
        return got


def mounted(path: Path) -> bool:
    return os.path.ismount(path)


def sh(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True)


def du_bytes(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z]{5,}", text)
