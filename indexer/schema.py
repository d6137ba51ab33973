"""The daemon's wire contract, shared by the HTTP API (``indexer.server``), the Python client (``indexer.client``)
and the MCP tools (``indexer.mcp``). Imports only pydantic, ``indexer.arguments`` and ``indexer.dates``.

- **Arguments** (``Query``, ``K``, ``Agent``, ``MemoryPath``, ``FromLine``...) are ``indexer.arguments``' annotated
  types, each described, bounded and aliased once and used by the request bodies below.
- **Requests** (``SearchRequest``, ``RecallRequest``, ``GetRequest``, ``BootRequest``, ``AppendRequest``) are
  pydantic models, one per operation of ``indexer.memory.Memory``: validated bodies (``GetRequest``: query
  parameters), the MCP tools' arguments, what the client sends and the CLI builds from its flags.
  ``SearchRequest`` is the one statement of a search: the ``/search`` body, the ``memory_search`` tool's arguments
  (all its fields but ``wait_s``), what ``Client.search`` sends, what the ``search`` command builds from its flags
  and what ``indexer.search.Searcher`` answers. A new filter is a field here and its condition in the store filter
  (``indexer.points.search_filter``); the CLI adds its flag.
- **Responses** (``Hit``, ``SearchResponse``, ``Page``, ``BootContext``, ``AppendResponse``, ``ErrorDetail``) are
  TypedDicts: the plain dicts the search and recall code build, typed for OpenAPI and MCP output schemas. ``Hit``
  and ``SearchResponse`` allow extra keys (a plugin's media fields, newer score fields). What the daemon reports of
  itself (``Status``, ``Health``) is ``indexer.status``; ``indexer.errors.error_answer`` maps the errors the daemon
  raises on purpose to the HTTP status and message it answers with.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, NotRequired

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
    with_config,
)
from typing_extensions import TypedDict

from indexer.arguments import (
    Agent,
    AppendPath,
    AppendText,
    AsOf,
    BootQuery,
    BudgetChars,
    Collections,
    Corpus,
    FromLine,
    K,
    Kinds,
    Lines,
    MaxChars,
    MemoryPath,
    MinScore,
    Mode,
    Offset,
    PathPrefix,
    Query,
    RecallK,
    RecallQuery,
    Since,
    Until,
    WaitS,
    clean_text,
)
from indexer.dates import RequestTimes, request_times

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
    corpus: Corpus = None
    since: Since = None
    until: Until = None
    min_score: MinScore = None
    as_of: AsOf = None
    wait_s: WaitS = 0.0

    def times(self, now_s: float | None = None) -> RequestTimes:
        """``since``, ``until`` and ``as_of`` read once (``indexer.dates.request_times``; a duration counts back
        from ``now_s``, default now). Raises ``ValueError`` naming the field and the accepted forms."""
        return request_times(self.since, self.until, self.as_of, now_s)


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


class RecallRequest(Request):
    """``POST /recall``: the ``k`` (default ``DEFAULT_K``) best memories for ``query``; ``*``, ``all`` or an empty
    query lists every memory file instead, in path order, from ``offset``, at most ``k`` and at most ``LIST_CAP``
    files a page (``SearchResponse.total`` and ``next_offset`` say how many there are and where the next page
    starts)."""

    query: RecallQuery = ""
    k: RecallK = None
    offset: Offset = 0
    agent: Agent = None
    corpus: Corpus = None


class BootRequest(Request):
    """``POST /boot``."""

    budget_chars: BudgetChars = DEFAULT_BUDGET_CHARS
    agent: Agent = None
    query: BootQuery = None


_CITATION = re.compile(r"(?P<path>.+)#L(?P<first>[1-9]\d{0,8})(?:-L(?P<last>[1-9]\d{0,8}))?")  # a hit's citation


class GetRequest(Request):
    """``GET /get`` (as query parameters) and the ``memory_get`` tool's arguments: a page of memory file ``path``
    from line ``from`` (1-based), at most ``lines`` lines and ``max_chars`` characters (``indexer.recall.read_memory``;
    the daemon caps both, ``indexer.memory``)."""

    path: MemoryPath
    from_line: FromLine = 1
    lines: Lines = None
    max_chars: MaxChars = DEFAULT_MAX_CHARS
    agent: Agent = None

    @model_validator(mode="before")
    @classmethod
    def _citation(cls, data: Any) -> Any:
        """A hit's ``citation`` as ``path`` (``memory/x.md#L3-L7``, ``#L3``) reads that file from line 3, 5 lines,
        where the request does not give ``from`` or ``lines`` itself; one that ends before it starts (``#L5-L2``)
        is refused (it read line 5 alone)."""
        if not isinstance(data, dict) or not isinstance(data.get("path"), str):
            return data
        match = _CITATION.fullmatch(data["path"])
        if match is None:
            return data
        first, last = int(match["first"]), int(match["last"] or match["first"])
        if last < first:
            raise ValueError(f"the citation {data['path']!r} ends before it starts: write "
                             f"{match['path']}#L{last}-L{first}")
        lines = last - first + 1
        cited = {"path": match["path"]}
        if not {"from", "from_line", "lines"} & set(data):
            cited |= {"from": first, "lines": lines}
        return {**data, **cited}


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


class Relevance(TypedDict):
    """How sure a search is that it found something relevant (``indexer.relevance.judge``), beside ``relevant``."""

    level: Annotated[Literal["high", "medium", "low", "none"], Field(description=(
        "high: a close meaning match that holds the question's telling words; medium: enough evidence (close "
        "meaning, most of the question's telling words in one hit, or a note dated in the period it names); "
        "relevant is true for these two. low: something related but the question's telling words are missing; "
        "none: nothing found or nothing close."))]
    reason: Annotated[str, Field(description="Why, in a few words (the evidence or what is missing).")]


class Indexing(TypedDict):
    """The first index is still being built: the answer may miss memory files not indexed yet."""

    done: Annotated[int, Field(description="Files of the agent's collections indexed so far.")]
    total: Annotated[int, Field(description="Files of the agent's collections known so far (indexed + queued).")]


@with_config(ConfigDict(extra="allow"))
class SearchResponse(TypedDict):
    """``POST /search`` and ``POST /recall``, the ``memory_search`` and ``memory_recall`` tools, ``Client.
    search_response``/``recall_response`` and the ``--json`` of the ``search`` and ``recall`` commands: hits, best
    first (a listing: files in path order), whether anything is relevant, what is not indexed yet, and for a
    listing how many files there are and where the next page starts."""

    hits: list[Hit]
    relevant: NotRequired[Annotated[bool | None, Field(
        description="False when none of the first 3 hits is close enough (the text model's relevance floor, "
                    "relevance_coverage; read whatever k): nothing relevant was found, or nothing at all; null for "
                    "a keyword-only search that found something (no meaning to judge by) and for a listing.")]]
    relevance: NotRequired[Annotated[Relevance, Field(description=(
        "A search only: the graded confidence behind `relevant` and its reason."))]]
    indexing: NotRequired[Annotated[Indexing, Field(description=(
        "Present only while the daemon's first index is being built (files done of those known so far): the "
        "answer may miss notes; search with wait_s (CLI: --wait) to wait for it."))]]
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
    "kind": NotRequired[Annotated[str, Field(description=(
        "Present for a media file (e.g. image): `text` is what its extractor read (a picture's OCR lines), and "
        "`GET /media` serves the file itself."))]],
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


class ErrorDetail(TypedDict):
    """Every error answer: 400 bad value, 403 not a memory file (or append off), 404 unknown agent/collection or
    missing file, 413 an entry too large, 503 Qdrant unreachable."""

    detail: str
