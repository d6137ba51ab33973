"""What one daemon holds while it runs: the ``Plan`` it indexes (settings and collections, swapped whole by a reload)
and the ``IndexState`` (what is indexed, what failed, what the last reconcile found, readiness).

One owner, one writer: ``IndexState`` changes only through its methods, and only the worker thread calls them
(``indexer.worker``, through ``indexer.sync.Sync`` and ``indexer.daemon.Indexer``). Every other thread (the HTTP
API, ``/metrics``, ``status``) reads it through ``indexer.report.StatusView``; the mappings it hands out are
read-only views, and a ``Plan`` is immutable, so a reader holding one sees a consistent set of collections.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import structlog

from indexer.config import Settings
from indexer.ledger import Ledger
from indexer.points import FileState
from indexer.walk import Problem
from indexer.workspace import Collection, plan_collections

if TYPE_CHECKING:
    from indexer.watcher import Watcher

_log = structlog.get_logger("qmd_indexer.daemon")
NO_DRIFT: Mapping[str, int] = MappingProxyType({"not_indexed": 0, "gone": 0, "changed": 0})


@dataclass(frozen=True, slots=True)
class Plan:
    """The settings a daemon runs with and the collections they plan (``workspace.plan_collections``). Immutable:
    a reload (``indexer.reload``) builds a new one and swaps it in whole."""

    settings: Settings
    collections: tuple[Collection, ...]

    @classmethod
    def of(cls, settings: Settings) -> Plan:
        """The plan of ``settings``: its workspaces' collections, named with ``collection_prefix``."""
        return cls(settings, tuple(plan_collections(settings.workspace, settings.collection_prefix)))

    def agents(self) -> list[str]:
        """The configured agents, in configuration order."""
        return list(dict.fromkeys(c.agent for c in self.collections))


@dataclass(slots=True)
class Indexed:
    """What the daemon knows is in the store for one file: its collection and the ``FileState`` it was written at."""

    collection: str
    state: FileState


@dataclass(frozen=True, slots=True)
class Reconcile:
    """What the last reconcile (a scan once ready) found the watcher had missed. ``drift``: files not indexed,
    indexed files gone, files changed since indexed; ``at``: its unix time (seconds), ``None`` before the first;
    ``recovered_total``: files all reconciles since start found missed."""

    drift: Mapping[str, int] = field(default_factory=lambda: NO_DRIFT)
    at: float | None = None
    reason: str | None = None
    recovered_total: int = 0


class IndexState:
    """The daemon's index state (see the module). Readers get read-only views; the worker changes it through the
    methods below. ``ready`` is set once the first full index has finished, ``connected`` once the store's
    collections are open, ``rebuild_requested`` asks the worker for a rebuild (``POST /reindex``, a model change)."""

    def __init__(self, plan: Plan) -> None:
        self._plan = plan
        self._indexed: dict[str, Indexed] = {}
        self.ledger = Ledger()  # skips and failures, one log line per file state (its own methods change it)
        self.ready = threading.Event()
        self.connected = threading.Event()
        self.rebuild_requested = threading.Event()
        self.started_at = time.time()
        self.startup = Startup()  # when this daemon's start reached each phase
        self._writable = True  # whether the state dir took writes at the last check (``record_writable``)
        self._rebuilding = False
        self._hand: tuple[Path, ...] = ()
        self._reconcile = Reconcile()
        self._last_scan_s: float | None = None
        self._problems: tuple[Problem, ...] = ()
        self._hnsw: dict[str, Mapping[str, Any]] = {}
        self._watcher: Watcher | None = None

    # -- read ---------------------------------------------------------------------------------------------------
    @property
    def writable(self) -> bool:
        """Whether the state dir could be written at the last check (the worker pauses indexing while not)."""
        return self._writable

    @property
    def plan(self) -> Plan:
        return self._plan

    @property
    def indexed(self) -> Mapping[str, Indexed]:
        """Absolute path -> ``Indexed``, for every file with points in a planned collection (a read-only view)."""
        return MappingProxyType(self._indexed)

    @property
    def hand(self) -> tuple[Path, ...]:
        """The paths the worker took from the queue and has not finished (``holding``)."""
        return self._hand

    @property
    def reconcile(self) -> Reconcile:
        return self._reconcile

    @property
    def last_scan_s(self) -> float | None:
        """Seconds the last scan took; ``None`` before the first."""
        return self._last_scan_s

    @property
    def problems(self) -> tuple[Problem, ...]:
        """The configured paths the last scan found not usable as meant (``walk.path_problems``)."""
        return self._problems

    @property
    def hnsw(self) -> Mapping[str, Mapping[str, Any]]:
        """HNSW builds of Qdrant Edge collections: name -> ``{"state", "points", "seconds" | "error"...}``."""
        return MappingProxyType(self._hnsw)

    @property
    def watcher(self) -> Watcher | None:
        """The watcher over the planned collections while the worker runs one."""
        return self._watcher

    @property
    def rebuilding(self) -> bool:
        """A rebuild is running or asked for."""
        return self._rebuilding or self.rebuild_requested.is_set()

    def indexed_as(self, inode: int, device: int) -> list[str]:
        """The indexed paths recorded with this (inode, device): the other names of a hard-linked file."""
        return [p for p, e in list(self._indexed.items()) if (e.state.inode, e.state.device) == (inode, device)]

    # -- write (the worker thread) --------------------------------------------------------------------------------
    def swap_plan(self, plan: Plan) -> Plan:
        """Run ``plan`` from now on (``Indexer.connect`` swaps a reload's in once its collections exist); returns the
        one it replaces."""
        previous, self._plan = self._plan, plan
        return previous

    def reset(self, indexed: Mapping[str, Indexed]) -> None:
        """Replace what is known indexed with what the store says (``Indexer.connect``)."""
        self._indexed = dict(indexed)

    def put(self, abs_path: str, collection: str, state: FileState) -> None:
        """Record ``abs_path`` as written whole to ``collection`` at ``state``."""
        self._indexed[abs_path] = Indexed(collection, state)

    def drop(self, abs_path: str) -> Indexed | None:
        """Forget ``abs_path`` (its points were deleted); returns what was known, if anything."""
        return self._indexed.pop(abs_path, None)

    def restat(self, abs_path: str, identity: tuple[int, int, int, int, int]) -> None:
        """Record the stat identity ``(size, mtime_ns, ctime_ns, inode, device)`` of an indexed file whose text did
        not change (a ``touch``, a ``chmod``): the next scan skips its hash, and a reconcile won't count it changed."""
        size, mtime, ctime, inode, device = identity
        entry = self._indexed[abs_path]
        entry.state = replace(entry.state, size_bytes=size, mtime_ns=mtime, ctime_ns=ctime, inode=inode,
                              device=device)

    def unstat_under(self, prefix: str) -> None:
        """Forget the stat identity of the files under ``prefix`` (a directory path ending in ``/``), so each is
        hashed again at the next scan (its workspace now names another directory)."""
        for abs_path, entry in self._indexed.items():
            if abs_path.startswith(prefix):
                entry.state = replace(entry.state, size_bytes=-1, mtime_ns=-1)

    @contextlib.contextmanager
    def holding(self, paths: Sequence[Path]) -> Iterator[None]:
        """Within the block, ``paths`` are in hand: taken from the queue, not yet processed (still ``pending``)."""
        self._hand = tuple(paths)
        try:
            yield
        finally:
            self._hand = ()

    def record_scan(self, seconds: float, problems: Iterable[Problem]) -> None:
        self._last_scan_s = seconds
        self._problems = tuple(problems)

    def record_reconcile(self, drift: Mapping[str, int], reason: str) -> None:
        """A reconcile for ``reason`` found ``drift`` (counts by kind) the watcher had missed."""
        self._reconcile = Reconcile(MappingProxyType(dict(drift)), time.time(), reason,
                                    self._reconcile.recovered_total + sum(drift.values()))

    def record_hnsw(self, collection: str, **build: Any) -> None:
        """The HNSW build of ``collection`` is now ``build`` (``state``, ``points``...)."""
        self._hnsw[collection] = MappingProxyType(build)

    def record_writable(self, writable: bool) -> bool:
        """Record whether the state dir can be written now; True when that changed."""
        changed, self._writable = writable != self._writable, writable
        return changed

    def watch(self, watcher: Watcher | None) -> None:
        self._watcher = watcher

    @contextlib.contextmanager
    def rebuilding_now(self) -> Iterator[None]:
        """Within the block a rebuild runs; the request that started it is taken."""
        self.rebuild_requested.clear()
        self._rebuilding = True
        try:
            yield
        finally:
            self._rebuilding = False


def process_age_s() -> float:
    """Seconds since this process started (Linux: its start time in ``/proc/self/stat`` against ``CLOCK_BOOTTIME``,
    10 ms resolution); elsewhere, since this module was imported."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rpartition(")")[2].split()  # the command name may hold spaces: fields after it
        return time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic() - _IMPORTED


_IMPORTED = time.monotonic()


class Startup:
    """When a daemon's start reached each phase, in seconds since the process started (``process_age_s``):
    ``imports``, ``store_opened``, ``http_listening``, ``model_loaded``, ``ready`` (first scan drained). Each
    ``mark`` logs ``startup_phase``; the ``ready`` mark logs ``startup`` with every phase (docs/benchmarks.md,
    "Restart"). Marked from several threads; a phase keeps its first time."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}

    def mark(self, phase: str, at: float | None = None, **fields: Any) -> None:
        """Record ``phase`` as reached now (or at ``at``, seconds since the process started) and log it."""
        if phase in self.phases:
            return
        self.phases[phase] = seconds = round(process_age_s() if at is None else at, 3)
        _log.info("startup_phase", phase=phase, s=seconds, **fields)
        if phase == "ready":
            _log.info("startup", **{name: s for name, s in sorted(self.phases.items(), key=lambda kv: kv[1])})
