"""What the daemon answers about itself, as the HTTP API, the MCP tools and the client type it: ``Status``
(``GET /status``), ``Health`` (``GET /health``) and ``Reindex`` (``POST /reindex``). TypedDicts, built by
``indexer.report.StatusView``; ``Status`` allows extra keys. Imports only pydantic.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict


class CollectionStatus(TypedDict):
    """One collection's counters."""

    agent: str
    role: str
    root: str
    files: int
    chunks: int


class SessionsStatus(TypedDict):
    """One agent's session transcripts (its ``sessions-<agent>`` collection)."""

    count: Annotated[int, Field(description="Transcripts indexed (one session each).")]
    turns: Annotated[int, Field(description=(
        "Their turns indexed: user and assistant messages with text (and tool results where "
        "sessions_tool_results is set)."))]


class RerankStatus(TypedDict):
    """The rerank stage (``reranker`` setting): the plugin, its model and how often it kept the fused order."""

    reranker: Annotated[str, Field(description="The configured qmd_indexer.rerankers plugin.")]
    model_id: Annotated[str | None, Field(description="Its model; null when the plugin failed to load.")]
    top_n: Annotated[int, Field(description="How many of the first fused hits it rescores.")]
    budget_s: Annotated[float, Field(description="Seconds scoring may take before the fused order is kept.")]
    reranked: Annotated[int, Field(description="Searches reranked since start.")]
    failed: Annotated[int, Field(description="Searches that kept the fused order because the reranker failed.")]
    over_budget: Annotated[int, Field(description="Searches that kept the fused order because scoring was slow.")]
    last_error: Annotated[str | None, Field(description="The last failure; null once a rerank succeeds.")]


@with_config(ConfigDict(extra="allow"))
class Status(TypedDict):
    """``GET /status``: what the daemon holds and is doing."""

    ready: Annotated[bool, Field(description="The first full index has finished.")]
    store_connected: bool
    backend: str | None
    tenancy: NotRequired[Annotated[str | None, Field(description=(
        "A Qdrant server's layout: collections, shared (tenants of shared collections), auto until connected; "
        "null for the embedded store."))]]
    state_dir: str
    uptime_s: float
    queue_depth: Annotated[int, Field(description="Files waiting to be indexed or in hand.")]
    chunks_embedded: Annotated[int, Field(description="Chunks embedded since start.")]
    cache_hits: int
    files_failed: Annotated[int, Field(description="Memory files failing to index now (each was logged).")]
    failed_files: NotRequired[Annotated[list[dict[str, str]], Field(description=(
        "The first 20 failing files by path, each {path, reason, detail}; files_failed counts them all."))]]
    files_skipped: NotRequired[Annotated[dict[str, int], Field(description=(
        "Files left out on purpose now, by reason worth knowing (too_large, symlink, not_regular_file, "
        "no_extractor...; each was logged as file_skipped with its path): not failures."))]]
    last_scan_s: float | None
    watch: NotRequired[Annotated[dict[str, str], Field(description="Watched root -> native, poll or dead.")]]
    last_reconcile: NotRequired[Annotated[float | None, Field(description="Unix time of the last reconcile.")]]
    watch_polled: NotRequired[Annotated[dict[str, str], Field(description=(
        "Polled root -> why: setting (watch = \"poll\"), fs:<type> (network, FUSE, VM-shared), "
        "watch_limit_reached (inotify refused a watch)."))]]
    last_reconcile_reason: NotRequired[Annotated[str | None, Field(description=(
        "Why the last reconcile ran: periodic, queue_overflow, watch_limit_reached, watcher_restarted..."))]]
    drift: NotRequired[Annotated[dict[str, int], Field(description=(
        "What the last reconcile found the watcher had missed: not_indexed (on disk), gone (still indexed), "
        "changed (stat differs from the indexed one); paths pending behind the debounce are not counted."))]]
    recovered: NotRequired[Annotated[int, Field(description="Files the last reconcile found missed (sum of drift).")]]
    recovered_total: NotRequired[Annotated[int, Field(description="Files all reconciles since start found missed.")]]
    problems: NotRequired[Annotated[list[dict[str, str]], Field(description=(
        "Paths not usable as configured, each {kind, agent, path, detail}: workspace_missing (its files keep their "
        "points), extra_path_missing, sessions_path_missing, extra_path_overlaps, unreadable_directory."))]]
    rerank: NotRequired[Annotated[RerankStatus | None, Field(description="The rerank stage; null when off.")]]
    plugin_errors: NotRequired[Annotated[list[str], Field(description=(
        "Plugins meant to run (the reranker, a prefer choice, one with its own settings) that failed to load, one "
        "line each; /health is degraded and the answers they would have shaped say so in degraded."))]]
    plugin_notices: NotRequired[Annotated[dict[str, str], Field(description=(
        "Loaded plugin -> what it runs without and what to install, e.g. image -> \"OCR off: Tesseract is not "
        "installed (...)\"."))]]
    store_degraded: NotRequired[Annotated[bool, Field(description="Store writes are failing (being retried).")]]
    rebuilding: NotRequired[Annotated[bool, Field(description="A rebuild runs beside the live index, or is asked.")]]
    hnsw: NotRequired[Annotated[dict[str, dict[str, Any]], Field(description=(
        "HNSW builds of Qdrant Edge collections: name -> {state, points, seconds | error}."))]]
    models: NotRequired[Annotated[dict[str, dict[str, Any]], Field(description=(
        "Modality -> {model_id, identity, precision} of each embedder, and while its model loads (a first start "
        "exports its ONNX models too) loading: {phase, percent}."))]]
    embedder_unavailable: NotRequired[Annotated[dict[str, Any], Field(description=(
        "The embedder could not answer (its server down, 429, 5xx): reason (null while it answers), since (unix "
        "time), deferred (batches put off since start, retried with backoff, never failed), files_waiting."))]]
    search_fallback: NotRequired[Annotated[dict[str, Any], Field(description=(
        "Searches answered from keyword search because the query could not be embedded: keyword_only (count "
        "since start), last_reason."))]]
    embedding: NotRequired[Annotated[dict[str, Any] | None, Field(description=(
        "The text embedder: model_id, precision, with int8 the ONNX file single queries run on, and relevance_floor: "
        "the cosine from which a hit is relevant and where it comes from (setting, model, probe; null until the "
        "probe has run, once the model has loaded)."))]]
    bind: NotRequired[Annotated[str, Field(description="host:port the API listens on.")]]
    collections: dict[str, CollectionStatus]
    sessions: NotRequired[Annotated[dict[str, SessionsStatus], Field(description=(
        "Agent -> {count, turns} of its session transcripts, for each agent whose workspace sets sessions."))]]


class Reindex(TypedDict):
    """``POST /reindex``: the rebuild was asked for; it runs beside the live index (``Status.rebuilding``)."""

    rebuilding: bool


class Health(TypedDict):
    """``GET /health``."""

    status: Annotated[Literal["ok", "degraded"], Field(description=(
        "degraded: the file watcher is dead, the last reconcile found files it had missed, store writes fail, "
        "the embedder cannot answer or answered bad vectors, or a configured plugin failed to load (see /status "
        "and reasons)."))]
    ready: Annotated[bool, Field(description="The first full index has finished.")]
    reasons: NotRequired[Annotated[list[str], Field(description=(
        "Present when degraded: one short line per cause (e.g. \"model loading\", \"state dir not writable\")."))]]
    append: NotRequired[Annotated[dict[str, str], Field(description=(
        "Agent -> whether its workspace takes appends now: on, off (append = true not set), or \"unavailable: "
        "<why>\" (e.g. read-only file system: the daemon cannot write its memory/ folder). What `qmd-indexer mcp` "
        "reads to list memory_append."))]]
