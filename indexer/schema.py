"""The daemon's wire contract, shared by the HTTP API (``indexer.server``), the Python client (``indexer.client``)
and the MCP tools (``indexer.mcp``). Imports only pydantic.

- **Arguments** (``Query``, ``K``, ``Agent``, ``MemoryPath``, ``FromLine``...) are annotated types: each argument
  is described, bounded and aliased once, and used both by the request bodies below and by the MCP tool
  signatures. The one name of an argument is the first of its ``AliasChoices``; the others are accepted and never
  listed in a schema (``q`` for ``query``; ``top_k`` and ``limit`` for ``k``; ``from_line`` for ``from``;
  ``budget`` for ``budget_chars``).
- **Requests** (``SearchRequest``, ``RecallRequest``, ``GetRequest``, ``BootRequest``, ``AppendRequest``) are
  pydantic models, one per operation of ``indexer.memory.Memory``: validated bodies (``GetRequest``: query
  parameters), the MCP tools' arguments, what the client sends and the CLI builds from its flags.
  ``SearchRequest`` is the one statement of a search: the ``/search`` body, the ``memory_search`` tool's arguments
  (all its fields but ``wait_s``), what ``Client.search`` sends, what the ``search`` command builds from its flags
  and what ``indexer.search.Searcher`` answers. A new filter is a field here and its condition in the store filter
  (``indexer.points.search_filter``); the CLI adds its flag.
- **Responses** (``Hit``, ``SearchResponse``, ``Page``, ``BootContext``, ``Status``, ``Health``) are TypedDicts:
  the plain dicts the search and recall code build, typed for OpenAPI and MCP output schemas. ``Hit``,
  ``SearchResponse`` and ``Status`` allow extra keys (a plugin's media fields, newer score fields).
- ``error_answer`` maps the errors the daemon raises on purpose to the HTTP status and message it answers with.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Annotated, Any, Literal, NotRequired

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    with_config,
)
from typing_extensions import TypedDict


def clean_text(text: str) -> str:
    """``text`` with each unpaired UTF-16 surrogate (``"\\ud800"``, which JSON may carry and no tokenizer can
    encode) replaced by ``?``."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _integral(value: Any) -> Any:
    """JSON Schema's ``integer`` counts a number with a zero fractional part (``842.0``) as one (JSON Schema
    Validation, "type"); pydantic's strict ``int`` does not. Such a float is read as its integer; ``842.5``, ``true``
    and ``"842"`` stay refused, as the published schema refuses them."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


#: an integer argument of a request body, as JSON Schema reads one (``_integral``)
JsonInt = BeforeValidator(_integral)


def _readable_time(value: str | None, info: ValidationInfo) -> str | None:
    """Refuse at the contract (422) a ``since``/``until`` that ``parse_time`` cannot read (one holding a lone
    surrogate is left to ``Request``'s check, which says so)."""
    if value is not None and value == clean_text(value):
        parse_time(value, info.field_name or "since", 0.0)
    return value


#: the forms ``parse_time`` reads, as the published schema: a duration, an RFC 3339 date or date-time
_TIME_SCHEMA = {"anyOf": [{"type": "string", "pattern": r"^ *[0-9]+(\.[0-9]+)? *[smhdw] *$"},
                          {"type": "string", "format": "date"}, {"type": "string", "format": "date-time"},
                          {"type": "null"}]}


# -- arguments ---------------------------------------------------------------------------------------------------
Query = Annotated[str, AfterValidator(clean_text), Field(
    validation_alias=AliasChoices("query", "q"),
    description="What to look for, in natural language or exact words (names, ids).")]
K = Annotated[int, Field(strict=True, ge=1, le=1000, validation_alias=AliasChoices("k", "top_k", "limit"),
                         description="How many hits to return, best first."), JsonInt]
RecallK = Annotated[int | None, Field(strict=True, ge=1, le=10_000,
                                      validation_alias=AliasChoices("k", "top_k", "limit"), description=(
    "How many memories to return: hits (default 6), or files of a listing (default and at most 1000 a page; "
    "`next_offset` continues).")), JsonInt]
Offset = Annotated[int, Field(strict=True, ge=0, description=(
    "A listing's first file (0-based, in path order): the `next_offset` of the page before.")), JsonInt]
Agent = Annotated[str | None, Field(description=(
    "Whose memory: this agent's only. Optional when the daemon has one agent or a configured default_agent (then "
    "that one); with several agents and no default_agent it is required (a request without it is refused, naming "
    "the agents). A request never spans agents."))]
Collections = Annotated[list[str] | str | None, Field(
    description="Only these collections (one name or a list), e.g. memory-dir-main.")]
Mode = Annotated[Literal["hybrid", "dense", "keyword"] | None, Field(
    description="hybrid (default: meaning + exact words), dense (meaning only) or keyword (BM25 words only).")]
PathPrefix = Annotated[str | None, Field(
    description="Only files at or under this workspace-relative path, e.g. memory/projects.")]
Kinds = Annotated[list[str] | str | None, Field(
    description="Only these source kinds (one or a list): markdown, image, audio...")]
MinScore = Annotated[float | None, Field(
    strict=True, allow_inf_nan=False, description="Drop hits scoring below this (fused score; cosine in dense mode).")]
Since = Annotated[str | None, AfterValidator(_readable_time), WithJsonSchema(_TIME_SCHEMA), Field(
    description="Only files modified since: a duration (7d, 12h, 30m, 2w) or an ISO date/date-time (2026-11-01, "
                "2026-11-01T09:30).")]
Until = Annotated[str | None, AfterValidator(_readable_time), WithJsonSchema(_TIME_SCHEMA), Field(
    description="Only files modified before: a duration ago (7d, 12h, 30m, 2w) or an ISO date/date-time "
                "(2026-11-01, 2026-11-01T09:30).")]
AsOf = Annotated[str | None, AfterValidator(_readable_time), WithJsonSchema(_TIME_SCHEMA), Field(
    description="The moment a time in the query counts from (\"last week\", \"yesterday\"): an ISO date/date-time "
                "(2026-11-01, 2026-11-01T09:30) or a duration ago (2d); default now. A time the query names only "
                "favours notes dated then; since/until filter.")]
MemoryPath = Annotated[str, Field(min_length=1, description="A memory file, workspace-relative (memory/2026-11-27.md, "
                                                      "MEMORY.md), as a hit's `path` gives it.")]
FromLine = Annotated[int, Field(ge=1, validation_alias=AliasChoices("from", "from_line"), serialization_alias="from",
                                description="First line to read, 1-based (a hit's start_line, or a page's next_from).")]
Lines = Annotated[int | None, Field(ge=1, description="At most this many lines.")]
MaxChars = Annotated[int, Field(ge=1, description=(
    "At most this many characters, in whole lines (the daemon caps a page at 100,000 whatever this asks)."))]
BudgetChars = Annotated[int, Field(strict=True, ge=1, le=1_000_000,
                                   validation_alias=AliasChoices("budget_chars", "budget"),
                                   description="Size of the boot context, in characters."), JsonInt]
RecallQuery = Annotated[str, Field(validation_alias=AliasChoices("query", "q"),
                                   description="What to recall; `*`, `all` or empty lists every memory file.")]
WaitS = Annotated[float, Field(strict=True, ge=0, le=10, allow_inf_nan=False, description=(
    "Wait up to this many seconds until no file of the agent's collections is pending (changed on disk, not yet "
    "indexed), then search."))]
BootQuery = Annotated[str | None, Field(description="Fill the budget with the best hits for this instead of the "
                                                    "root memory file and the most recent notes.")]

AppendText = Annotated[str, Field(min_length=1, description=(
    "The entry to append, markdown; written whole after a blank line, with one final newline. At most the "
    "daemon's append_max_bytes (64 KiB by default) of UTF-8."))]
AppendPath = Annotated[str | None, Field(min_length=1, description=(
    "A markdown file under memory/, workspace-relative (memory/projects/acme.md), created if missing; default: "
    "today's daily note memory/YYYY-MM-DD.md in the agent's time zone."))]

DEFAULT_K = 6
LIST_CAP = 1000  # files of one recall listing page, whatever k asks
DEFAULT_BUDGET_CHARS = 4000
DEFAULT_MAX_CHARS = 12_000


# -- requests ----------------------------------------------------------------------------------------------------
class Request(BaseModel):
    """What every request body shares: its published schema is what is enforced. Numbers are strict (``true`` is not
    1, ``842.5`` is not an integer; ``842.0`` is one, as JSON Schema reads it), a field the schema does not have is
    refused, a ``since``/``until`` must be a form ``parse_time`` reads, and no text argument but the query (which is
    cleaned, ``clean_text``) may hold an unpaired UTF-16 surrogate, which JSON can carry and UTF-8 cannot (it reached
    the store's filter as a ``UnicodeEncodeError``). Each is a 422 over HTTP."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _no_lone_surrogate(cls, value: Any, info: ValidationInfo) -> Any:
        texts = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        if info.field_name != "query" and any(isinstance(t, str) and t != clean_text(t) for t in texts):
            raise ValueError("holds an unpaired UTF-16 surrogate (not valid Unicode text)")
        return value


class SearchRequest(Request):
    """``POST /search``, and the ``memory_search`` tool's arguments (all but ``wait_s``): ``k`` hits for ``query``."""

    # A bad value, a since/until that parse_time cannot read included, is pydantic's ValidationError (422 over
    # HTTP). search_request also refuses an unknown keyword.

    query: Query
    k: K = DEFAULT_K
    mode: Mode = None
    agent: Agent = None
    collection: Collections = None
    path_prefix: PathPrefix = None
    kind: Kinds = None
    since: Since = None
    until: Until = None
    min_score: MinScore = None
    as_of: AsOf = None
    wait_s: WaitS = 0.0

    def since_ns(self, now_s: float | None = None) -> int | None:
        """``since`` as nanoseconds since the epoch (``parse_time``; a duration counts back from ``now_s``, default
        now), or ``None``. Raises ``ValueError`` naming the accepted forms."""
        return None if self.since is None else parse_time(self.since, "since", now_s)

    def until_ns(self, now_s: float | None = None) -> int | None:
        """``until`` as nanoseconds since the epoch, like ``since_ns``."""
        return None if self.until is None else parse_time(self.until, "until", now_s)


def search_request(query: str | SearchRequest, /, **fields: Any) -> SearchRequest:
    """``query`` if it is a request already, else the request for ``query`` with ``fields`` (``SearchRequest``'s
    field names or aliases). Raises ``TypeError`` for an unknown keyword (pydantic would ignore it) and
    ``pydantic.ValidationError`` for a bad value."""
    if isinstance(query, SearchRequest):
        if fields:
            raise TypeError("pass a SearchRequest alone, or a query string with keywords")
        return query
    unknown = set(fields) - _ACCEPTED
    if unknown:
        raise TypeError(f"unknown search field(s): {', '.join(sorted(unknown))}")
    return SearchRequest(query=query, **fields)


def names(value: list[str] | str | None) -> tuple[str, ...]:
    """A ``collection`` or ``kind`` value (one name, a list, or none) as a tuple of names."""
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


_DURATION = re.compile(r"^ *([0-9]+(?:\.[0-9]+)?) *(s|m|h|d|w) *$")  # as _TIME_SCHEMA publishes it
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def parse_time(value: str, name: str = "since", now_s: float | None = None) -> int:
    """A time argument (``name``, for the error) as nanoseconds since the epoch: a duration back from ``now_s``
    (``90s``, ``30m``, ``12h``, ``7d``, ``2w``), an ISO 8601 date (``2026-11-01``: local midnight) or date-time
    (``2026-11-01T09:30``, local time unless it carries an offset; RFC 3339's lower-case ``t`` and ``z`` too).
    A moment beyond what 64 bits of nanoseconds hold (before 1677, after 2262) is clamped to that range. Raises
    ``ValueError`` naming the accepted forms."""
    match = _DURATION.match(value)
    if match:
        now = time.time() if now_s is None else now_s
        return _clamped((now - float(match[1]) * _SECONDS[match[2]]) * 1e9)
    try:
        moment = datetime.fromisoformat(value.upper())
    except ValueError:
        raise ValueError(f"{name} must be a duration such as 7d, 12h, 30m, 2w or an ISO date/date-time such as "
                         f"2026-11-01 or 2026-11-01T09:30, got {value!r}") from None
    try:
        return _clamped(moment.timestamp() * 1e9)
    except (OverflowError, OSError, ValueError):  # year 1 or 9999 shifted out of range by the local offset
        return _clamped(float("-inf") if moment.year < 1970 else float("inf"))


def _clamped(ns: float) -> int:
    return int(max(-(2**63), min(2**63 - 1, ns)))


class RecallRequest(Request):
    """``POST /recall``: the ``k`` (default ``DEFAULT_K``) best memories for ``query``; ``*``, ``all`` or an empty
    query lists every memory file instead, in path order, from ``offset``, at most ``k`` and at most ``LIST_CAP``
    files a page (``SearchResponse.total`` and ``next_offset`` say how many there are and where the next page
    starts)."""

    query: RecallQuery = ""
    k: RecallK = None
    offset: Offset = 0
    agent: Agent = None


class BootRequest(Request):
    """``POST /boot``."""

    budget_chars: BudgetChars = DEFAULT_BUDGET_CHARS
    agent: Agent = None
    query: BootQuery = None


class GetRequest(Request):
    """``GET /get`` (as query parameters) and the ``memory_get`` tool's arguments: a page of memory file ``path``
    from line ``from`` (1-based), at most ``lines`` lines and ``max_chars`` characters (``indexer.recall.read_memory``;
    the daemon caps both, ``indexer.memory``)."""

    path: MemoryPath
    from_line: FromLine = 1
    lines: Lines = None
    max_chars: MaxChars = DEFAULT_MAX_CHARS
    agent: Agent = None


class AppendRequest(Request):
    """``POST /append`` and the ``memory_append`` tool's arguments: append ``text`` to ``path`` (default: today's
    daily note) of the agent's workspace (``indexer.append``). Strict: a field of another type is refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    text: AppendText
    path: AppendPath = None
    agent: Agent = None


_ACCEPTED = frozenset(SearchRequest.model_fields).union(*(  # the fields' names and aliases (q, top_k, limit)
    f.validation_alias.choices for f in SearchRequest.model_fields.values()
    if isinstance(f.validation_alias, AliasChoices)))


# -- responses ---------------------------------------------------------------------------------------------------
@with_config(ConfigDict(extra="allow"))
class Hit(TypedDict):
    """One search hit, or one file of a recall listing (``score`` is then null). Media hits add ``start_s``/
    ``end_s`` (audio, seconds) or ``width``/``height`` (images, pixels), and text read out of an image ``source``
    and ``box``; plugins may add more keys."""

    collection: str
    agent: str
    path: Annotated[str, Field(description="Workspace-relative path of the memory file.")]
    start_line: Annotated[int, Field(description="First line the snippet shows (1-based).")]
    end_line: Annotated[int, Field(description="Last line the snippet shows (1-based, inclusive).")]
    score: Annotated[float | None, Field(description="Higher is better; null in a recall listing.")]
    snippet: Annotated[str, Field(description="At most 700 characters, whole lines around the best match.")]
    kind: Annotated[str, Field(description="Source kind: markdown, image, audio...")]
    citation: Annotated[str, Field(description="path#Lstart-Lend, to quote as the source.")]
    dense_score: NotRequired[Annotated[float | None, Field(
        description="Raw cosine similarity of the query's text embedding, in [-1, 1]; null if not in that list.")]]
    keyword_score: NotRequired[Annotated[float | None, Field(
        description="Raw BM25 score (>= 0); null if not in that list.")]]
    start_s: NotRequired[float]
    end_s: NotRequired[float]
    width: NotRequired[int]
    height: NotRequired[int]
    format: NotRequired[str]
    source: NotRequired[Annotated[str, Field(description="\"ocr\": the snippet is text read out of the image.")]]
    box: NotRequired[Annotated[list[int], Field(description=(
        "OCR hits: [left, top, right, bottom], the image's pixels holding the snippet's lines."))]]


@with_config(ConfigDict(extra="allow"))
class SearchResponse(TypedDict):
    """``POST /search`` and ``POST /recall``, the ``memory_search`` and ``memory_recall`` tools, ``Client.
    search_response``/``recall_response`` and the ``--json`` of the ``search`` and ``recall`` commands: hits, best
    first (a listing: files in path order), whether anything is relevant, what is not indexed yet, and for a
    listing how many files there are and where the next page starts."""

    hits: list[Hit]
    relevant: NotRequired[Annotated[bool | None, Field(
        description="False when nothing the search found is close enough (relevance_floor, relevance_coverage; "
                    "judged on every candidate, so k does not change it): nothing relevant was found; null for a "
                    "keyword-only search and for a listing.")]]
    pending: NotRequired[Annotated[list[str], Field(description=(
        "Workspace-relative paths of the agent's collections changed on disk and not yet indexed (queued or in "
        "hand): the answer may miss or still show them."))]]
    total: NotRequired[Annotated[int, Field(description="A listing only: how many memory files there are.")]]
    next_offset: NotRequired[Annotated[int | None, Field(description=(
        "A listing only: the `offset` of the next page; null when this page ends the listing."))]]
    degraded: NotRequired[Annotated[str, Field(description=(
        "Present only when the answer is less than the configured search; a short reason: \"keyword only: <why>\" "
        "when the query could not be embedded (the embedding server is down, or the model is still loading; the "
        "answer comes from keyword search), \"fusion order: rerank <timeout|error>\" when the reranker did not "
        "answer within budget. Two reasons join with \"; \"."))]]


Page = TypedDict("Page", {
    "path": Annotated[str, Field(description="Workspace-relative path of the file read.")],
    "collection": str,
    "from": Annotated[int, Field(description="First line of `text` (1-based).")],
    "to": Annotated[int, Field(description="Last line of `text` (inclusive; below `from` when there were none).")],
    "text": Annotated[str, Field(description="Whole lines from..to, joined with newlines.")],
    "truncated": Annotated[bool, Field(description="True when `lines` or `max_chars` stopped the read early.")],
    "next_from": Annotated[int | None, Field(description="The `from` that continues the read; null at the end.")],
    "line_truncated": NotRequired[Annotated[bool, Field(description="The one line returned was cut at max_chars.")]],
    "note": NotRequired[Annotated[str, Field(description=(
        "Present when the path asked for names no file but one file has the same name in another Unicode "
        "normalisation form (NFC/NFD): that file was read, and `path` is its spelling."))]],
})
Page.__doc__ = "``GET /get``: a page of one memory file."


AppendResponse = TypedDict("AppendResponse", {
    "agent": str,
    "path": Annotated[str, Field(description="Workspace-relative path of the file appended to.")],
    "from": Annotated[int, Field(description="First line of the entry (1-based).")],
    "to": Annotated[int, Field(description="Last line of the entry (inclusive).")],
    "citation": Annotated[str, Field(description="path#Lfrom-Lto, to cite the entry.")],
    "bytes": Annotated[int, Field(description="Bytes written, the blank line before the entry included.")],
})
AppendResponse.__doc__ = ("``POST /append``: where the entry landed. It is searchable once the watcher has seen "
                          "the write (within about a second; a search with ``wait_s`` waits for it).")


class Omitted(TypedDict):
    """A piece of memory that did not fit the boot budget."""

    citation: str
    lines: int


class BootContext(TypedDict):
    """``POST /boot``: memory for the start of a session, within ``budget_chars`` characters."""

    text: Annotated[str, Field(description="Pieces, each a `## path#La-Lb` header line then whole lines.")]
    used_chars: int
    budget_chars: int
    included: Annotated[list[str], Field(description="Citations of the pieces in `text`, in order.")]
    omitted: Annotated[list[Omitted], Field(description="What did not fit, to read with memory_get if needed.")]
    pending: NotRequired[Annotated[list[str], Field(description=(
        "Workspace-relative paths of the agent's collections changed on disk and not yet indexed (queued or in "
        "hand): the answer may miss or still show them."))]]
    degraded: NotRequired[Annotated[str, Field(description=(
        "With a query, present only when its search was less than the configured one; the same short reasons as "
        "a search's `degraded` (e.g. \"keyword only: model loading\")."))]]


class CollectionStatus(TypedDict):
    """One collection's counters."""

    agent: str
    role: str
    root: str
    files: int
    chunks: int


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
    state_dir: str
    uptime_s: float
    queue_depth: Annotated[int, Field(description="Files waiting to be indexed or in hand.")]
    chunks_embedded: Annotated[int, Field(description="Chunks embedded since start.")]
    cache_hits: int
    files_failed: Annotated[int, Field(description="Memory files failing to index now (each was logged).")]
    failed_files: NotRequired[Annotated[list[dict[str, str]], Field(description=(
        "The first 20 failing files by path, each {path, reason, detail}; files_failed counts them all."))]]
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
        "Paths not usable as configured, each {kind, agent, path, detail}: extra_path_missing, extra_path_overlaps, "
        "unreadable_directory."))]]
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
        "The text embedder: model_id, precision, and with int8 the ONNX file single queries run on."))]]
    bind: NotRequired[Annotated[str, Field(description="host:port the API listens on.")]]
    collections: dict[str, CollectionStatus]


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


class ErrorDetail(TypedDict):
    """Every error answer: 400 bad value, 403 not a memory file (or append off), 404 unknown agent/collection or
    missing file, 413 an entry too large, 503 Qdrant unreachable."""

    detail: str


def error_answer(exc: BaseException) -> tuple[int, str] | None:
    """``(HTTP status, message)`` for an error the daemon raises on purpose while answering, else ``None``:
    ``ReadRefused`` (``AppendRefused`` too) and ``PermissionError`` 403; ``KeyError`` (unknown agent or collection)
    and ``FileNotFoundError`` 404; ``EntryTooLarge`` 413; ``ValueError`` and other ``OSError`` 400;
    ``StoreUnavailable`` 503."""
    from indexer.errors import EntryTooLarge, ReadRefused, StoreUnavailable

    if isinstance(exc, EntryTooLarge):
        return 413, str(exc)
    if isinstance(exc, ReadRefused):
        return 403, str(exc)
    if isinstance(exc, KeyError):
        return 404, str(exc.args[0] if exc.args else exc)
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return 404, f"no such file: {exc.filename or exc}"
    if isinstance(exc, PermissionError):
        return 403, "permission denied"
    if isinstance(exc, ValueError):
        return 400, str(exc)
    if isinstance(exc, StoreUnavailable):
        return 503, str(exc)
    if isinstance(exc, OSError):  # a name too long, a directory given as a file...: the request's fault
        return 400, f"cannot read {exc.filename or 'the file'}: {exc.strerror or exc}"
    return None
