"""The life of a server process the tests and benchmarks start (a Qdrant node: ``qdrant/nodes.py``; an infinity-emb
server: ``infinity/server.py``), without pytest: a free loopback port, the start, the wait until it answers, the
stop, and no process left behind.

Each server is a child in its own session (``end`` signals the whole group: the server and anything it forked),
stopped at interpreter exit too and, should the parent be killed, by the kernel (``PR_SET_PDEATHSIG``; the death
signal follows the forking *thread*, so only for processes started from the main thread).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

_LIVE: dict[int, subprocess.Popen[bytes]] = {}


def _kill_leftovers() -> None:
    for proc in list(_LIVE.values()):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
            proc.wait(5)


atexit.register(_kill_leftovers)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def missing_executable(path: Path, what: str, install: str) -> str | None:
    """Why ``path`` (``what``: e.g. "Qdrant server binary") cannot run, with how to get it (``install``), in one
    line; ``None`` when it is an executable file."""
    if not path.is_file() or not os.access(path, os.X_OK):
        return f"no {what} at {path}; install it with {install}"
    return None


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn(args: list[str], env: dict[str, str], log_path: Path, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``args`` in a session of its own with exactly ``env``, stdout and stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:  # the child holds its own copy
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_die_with_parent
                                if threading.current_thread() is threading.main_thread() else None)
    _LIVE[proc.pid] = proc
    return proc


def wait_ready(proc: subprocess.Popen[bytes] | None, answers: Callable[[], bool], what: str, timeout_s: float,
               log_path: Path, interval_s: float = 0.05) -> None:
    """Poll ``answers()`` (its ``httpx.HTTPError`` and ``ValueError`` count as "not yet") until it is true. Raises
    ``RuntimeError`` with the log's tail when ``proc`` exits first or ``timeout_s`` seconds pass."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is None or proc.poll() is not None:
            raise RuntimeError(f"{what} exited while starting: {log_tail(log_path)}")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            if answers():
                return
        time.sleep(interval_s)
    raise RuntimeError(f"{what} not ready after {timeout_s} s: {log_tail(log_path)}")


def log_tail(log_path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of ``log_path`` ("" when it cannot be read)."""
    try:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def end(proc: subprocess.Popen[bytes] | None, sig: int) -> None:
    """Send ``sig`` to ``proc``'s session (SIGTERM: a stop; SIGKILL: a crash), then SIGKILL after 10 s."""
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    _LIVE.pop(proc.pid, None)
