"""The arguments of the daemon's requests (``indexer.schema``'s request models and the MCP tool signatures), each
an annotated type described, bounded and aliased once: ``Query``, ``K``, ``Agent``, ``MemoryPath``, ``FromLine``...
The one name of an argument is the first of its ``AliasChoices``; the others are accepted and never listed in a
schema (``q`` for ``query``; ``top_k`` and ``limit`` for ``k``; ``from_line`` for ``from``; ``budget`` for
``budget_chars``). Integers are read as JSON Schema reads them (``JsonInt``), times as ``parse_time`` reads them
(refused at the contract, 422), and text is cleaned of unpaired UTF-16 surrogates (``clean_text``). Imports only
pydantic and ``indexer.dates``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AliasChoices, BeforeValidator, Field, ValidationInfo, WithJsonSchema

from indexer.dates import parse_time


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
CorpusName = Literal["memory", "sessions", "all"]
Corpus = Annotated[CorpusName | None, Field(description=(
    "Which memory to look in: memory (the memory files), sessions (the session transcripts of a workspace that "
    "configures `sessions`) or all; default the daemon's default_corpus (all)."))]
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
#: the longest one request waits (``wait_s``); ``search --wait`` asks again in such steps for longer waits
MAX_WAIT_S = 10.0
WaitS = Annotated[float, Field(strict=True, ge=0, le=MAX_WAIT_S, allow_inf_nan=False, description=(
    "Wait up to this many seconds until the daemon's first index is built and no file of the agent's collections "
    "is pending (changed on disk, not yet indexed), then search."))]
BootQuery = Annotated[str | None, Field(description="Fill the budget with the best hits for this instead of the "
                                                    "root memory file and the most recent notes.")]

AppendText = Annotated[str, Field(min_length=1, description=(
    "The entry to append, markdown; written whole after a blank line, with one final newline. At most the "
    "daemon's append_max_bytes (64 KiB by default) of UTF-8."))]
AppendPath = Annotated[str | None, Field(min_length=1, description=(
    "A markdown file under memory/, workspace-relative (memory/projects/acme.md), created if missing; default: "
    "today's daily note memory/YYYY-MM-DD.md in the agent's time zone."))]

