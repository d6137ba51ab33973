"""Prometheus metrics of one daemon, served at ``GET /metrics`` through ``prometheus-client``.

Each daemon owns a ``Metrics`` with its own ``CollectorRegistry`` (not the library's global one), so several
daemons in one process (the tests) never clash. What the daemon already knows (``StatusView.status()``, the ledger,
the watcher, the pipeline's counters) is read at scrape time by ``StatusCollector``; only what nothing else keeps
is recorded as it happens: three histograms and the error counts.

=================================================  =========  ==========================================================
name                                               type       what
=================================================  =========  ==========================================================
``qmd_indexer_files{collection,agent}``            gauge      files with points in the collection
``qmd_indexer_chunks{collection,agent}``           gauge      points (chunks) of those files
``qmd_indexer_embeddings_computed_total``          counter    chunks embedded by a model since start
``qmd_indexer_embedding_cache_hits_total``         counter    chunks whose vectors came from the embedding cache
``qmd_indexer_queue_depth``                        gauge      paths queued behind the debounce or in hand
``qmd_indexer_pending_files``                      gauge      memory files changed on disk and not yet indexed
``qmd_indexer_files_failed``                       gauge      files failing in their current state
``qmd_indexer_index_lag_seconds``                  histogram  first watcher event of a change -> the index reflects it
``qmd_indexer_errors_total{kind}``                 counter    errors logged, by kind (``store_unavailable``,
                                                              ``worker_error``, a file failure's reason...)
``qmd_indexer_search_seconds{mode}``               histogram  one search (embedding the query included), by mode
``qmd_indexer_reranks_total{outcome}``             counter    searches through the rerank stage (absent when it is
                                                              off): ``reranked``, or the fused order kept because
                                                              the reranker ``failed`` or was ``over_budget``
``qmd_indexer_store_write_seconds``                histogram  one file's points written to the store (upsert + delete)
``qmd_indexer_watch_state{root,...}``              stateset   each watched root: ``native``, ``poll`` or ``dead``
``qmd_indexer_last_reconcile_timestamp_seconds``   gauge      unix time of the last reconcile (from the start's scan)
``qmd_indexer_ready``                              gauge      1 once the first full index has finished
``qmd_indexer_info{version,backend,model}``        gauge      always 1; the labels say what runs
``process_*``                                      various    CPU, memory, open files (``ProcessCollector``)
=================================================  =========  ==========================================================

The index lag is measured for changes the watcher saw (a file's first unreleased event, ``Settler``'s clock, to the
end of the batch that processed it); files found by a scan have no known change time and are not measured.
"""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, StateSetMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from indexer import __version__

# seconds; a change settles in 0.05-1 s (``settle_s``), then is embedded and written
LAG_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
# seconds; one search embeds the query (a few ms to tens of ms on a CPU) and queries every collection
SEARCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
WRITE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)
WATCH_STATES = ("native", "poll", "dead")  # ``Watcher.modes()``


class Source(Protocol):
    """What the daemon's own numbers are read from at scrape time (``indexer.report.StatusView``)."""

    def status(self) -> Mapping[str, Any]: ...

    def pending(self, agent: str | None = None) -> list[str]: ...

    def failures(self) -> dict[str, int]: ...


class Metrics:
    """The metric objects of one daemon, in ``registry``. Thread-safe: the worker records the lag, writes and
    errors, API threads record searches, a scrape reads everything (and, once ``read_from`` is called, the daemon's
    own numbers through its ``Source``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.index_lag = Histogram("qmd_indexer_index_lag_seconds", "Seconds from a file's first watcher event to "
                                   "the index reflecting it", buckets=LAG_BUCKETS, registry=self.registry)
        self.search_seconds = Histogram("qmd_indexer_search_seconds", "Seconds per search, by mode", ["mode"],
                                        buckets=SEARCH_BUCKETS, registry=self.registry)
        self.store_write_seconds = Histogram("qmd_indexer_store_write_seconds", "Seconds to write one file's points",
                                             buckets=WRITE_BUCKETS, registry=self.registry)
        self._errors: Tally[str] = Tally()
        self._lock = threading.Lock()
        ProcessCollector(registry=self.registry)

    def read_from(self, view: Source) -> None:
        """Read the daemon's own numbers (status, pending, failures) from ``view`` at each scrape."""
        self.registry.register(StatusCollector(view, self))

    def error(self, kind: str) -> None:
        """Count one error of ``kind`` (a snake_case word, the event name it was logged with)."""
        with self._lock:
            self._errors[kind] += 1

    def errors(self) -> dict[str, int]:
        """Errors counted with ``error`` since start, by kind."""
        with self._lock:
            return dict(self._errors)

    def search_timer(self) -> SearchTimer:
        """``with metrics.search_timer() as timer: ...; timer.mode = mode``: observes the seconds under ``mode``
        only when the block succeeds (so a refused mode never becomes a label)."""
        return SearchTimer(self.search_seconds)

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """``(body, content type)`` of a scrape: the Prometheus text format (``text/plain; version=0.0.4``), or
        OpenMetrics when ``accept`` (the request's ``Accept`` header) asks for it."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type


class SearchTimer:
    """See ``Metrics.search_timer``."""

    def __init__(self, histogram: Histogram) -> None:
        self.histogram = histogram
        self.mode = ""
        self._started = 0.0

    def __enter__(self) -> SearchTimer:
        self._started = time.perf_counter()
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None and self.mode:
            self.histogram.labels(self.mode).observe(time.perf_counter() - self._started)


class StatusCollector(Collector):
    """Reads the daemon's own numbers through ``view`` at scrape time (see the module's table)."""

    def __init__(self, view: Source, metrics: Metrics) -> None:
        self.view, self.metrics = view, metrics

    def describe(self) -> list[Metric]:
        return []  # names are fixed here and unique in this registry: no registration-time check needed

    def collect(self) -> Iterator[Metric]:
        view = self.view
        status = view.status()
        files = GaugeMetricFamily("qmd_indexer_files", "Files with points in the collection",
                                  labels=["collection", "agent"])
        chunks = GaugeMetricFamily("qmd_indexer_chunks", "Points (chunks) in the collection",
                                   labels=["collection", "agent"])
        for name, entry in sorted(status["collections"].items()):
            files.add_metric([name, entry["agent"]], entry["files"])
            chunks.add_metric([name, entry["agent"]], entry["chunks"])
        yield files
        yield chunks
        yield CounterMetricFamily("qmd_indexer_embeddings_computed", "Chunks embedded by a model since start",
                                  value=status["chunks_embedded"])
        yield CounterMetricFamily("qmd_indexer_embedding_cache_hits", "Chunks whose vectors came from the "
                                  "embedding cache since start", value=status["cache_hits"])
        yield GaugeMetricFamily("qmd_indexer_queue_depth", "Paths queued or in hand", value=status["queue_depth"])
        yield GaugeMetricFamily("qmd_indexer_pending_files", "Memory files changed and not yet indexed",
                                value=len(view.pending()))
        yield GaugeMetricFamily("qmd_indexer_files_failed", "Files failing in their current state",
                                value=status["files_failed"])
        errors = CounterMetricFamily("qmd_indexer_errors", "Errors logged since start, by kind", labels=["kind"])
        for kind, count in sorted((Tally(view.failures()) + Tally(self.metrics.errors())).items()):
            errors.add_metric([kind], count)
        yield errors
        rerank = status.get("rerank")
        if rerank:
            reranks = CounterMetricFamily("qmd_indexer_reranks", "Searches through the rerank stage since start, "
                                          "by outcome (failed, over_budget: the fused order was kept)",
                                          labels=["outcome"])
            for outcome in ("reranked", "failed", "over_budget"):
                reranks.add_metric([outcome], rerank[outcome])
            yield reranks
        watch = StateSetMetricFamily("qmd_indexer_watch_state", "How each root is watched", labels=["root"])
        for root, mode in sorted(status["watch"].items()):
            watch.add_metric([root], {state: state == mode for state in WATCH_STATES})
        yield watch
        reconcile = GaugeMetricFamily("qmd_indexer_last_reconcile_timestamp_seconds",
                                      "Unix time of the last periodic rescan")
        if status["last_reconcile"] is not None:
            reconcile.add_metric([], status["last_reconcile"])
        yield reconcile
        yield GaugeMetricFamily("qmd_indexer_ready", "1 once the first full index has finished",
                                value=1 if status["ready"] else 0)
        info = GaugeMetricFamily("qmd_indexer_info", "What runs (always 1)", labels=["version", "backend", "model"])
        text = status["embedding"] or {}
        info.add_metric([__version__, status["backend"], str(text.get("model_id", ""))], 1)
        yield info
