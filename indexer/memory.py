"""The daemon's memory operations, stated once for every face: the ``Memory`` Protocol and ``LocalMemory``.

Each operation takes one request model of ``indexer.schema`` and returns one answer type:

==========  ===================  ================  =============================================================
operation   request              answer            what it does
==========  ===================  ================  =============================================================
search      ``SearchRequest``    ``SearchResponse``  hybrid search (``indexer.search``), after ``wait_s``
recall      ``RecallRequest``    ``SearchResponse``  recall, or a listing page (``indexer.recall.recall``)
get         ``GetRequest``       ``Page``            a page of one memory file (``indexer.recall.read_memory``)
boot        ``BootRequest``      ``BootContext``     the boot context (``indexer.recall.boot_context``)
append      ``AppendRequest``    ``AppendResponse``  one entry appended (``indexer.append.append_entry``)
status      (none)               ``Status``          what the daemon holds (``indexer.report.StatusView``)
==========  ===================  ================  =============================================================

``LocalMemory`` answers in-process (the HTTP API and the daemon's ``/mcp``); ``indexer.client.RemoteMemory`` asks a
daemon over HTTP (``qmd-indexer mcp``). The faces are adapters: an HTTP route is one call, each MCP tool is built from
its request model (``indexer.mcp``), the client sends the model as it is, the CLI turns flags into the model.

``LocalMemory`` is the one place that, for every operation:

- **scopes the agent**: a request without ``agent`` (or with ``""``) is about ``default_agent`` when configured, else
  the only agent; with several agents and no ``default_agent`` it is refused (``ValueError``, 400, naming them), so
  a request never spans agents (``scope_agent``);
- **checks the query**: at most ``MAX_QUERY_CHARS`` characters (else ``ValueError``, 400);
- **caps pages**: a ``get`` page holds at most ``MAX_PAGE_CHARS`` characters and ``MAX_PAGE_LINES`` lines whatever
  the request asks (the page is then ``truncated`` with ``next_from``);
- **attaches** ``pending`` (the scoped agent's files changed on disk and not yet indexed) to ``search``, ``recall``
  and ``boot``, and ``degraded`` (why an answer is less than the configured search) where the search was less.

Errors are the daemon's own (``indexer.errors.error_answer`` maps them to HTTP statuses): ``KeyError`` (unknown agent
or collection), ``ReadRefused`` (``AppendRefused`` too), ``EntryTooLarge``, ``FileNotFoundError``, ``ValueError``,
``StoreUnavailable``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, TypeVar

from indexer.append import append_entry
from indexer.errors import ReadRefused, unknown_agent
from indexer.media import find_media, media_page, read_picture
from indexer.recall import boot_context, read_memory, recall
from indexer.report import StatusView
from indexer.schema import (
    AppendRequest,
    AppendResponse,
    BootContext,
    BootRequest,
    GetRequest,
    Page,
    RecallRequest,
    Request,
    SearchRequest,
    SearchResponse,
)
from indexer.search import Searcher, join_degraded
from indexer.state import Plan
from indexer.status import Health, Status
from indexer.workspace import Collection

MAX_QUERY_CHARS = 10_000  # a query longer than a page of text is a mistake or an attack
MAX_PAGE_CHARS = 100_000  # characters of one get page, whatever max_chars asks
MAX_PAGE_LINES = 10_000  # lines of one get page, whatever lines asks

R = TypeVar("R", bound=Request)


class Memory(Protocol):
    """The memory operations every face serves: ``LocalMemory`` (in-process) or ``indexer.client.RemoteMemory`` (over
    HTTP). Errors: the daemon's own (see the module) or ``indexer.client.ClientError``."""

    def search(self, request: SearchRequest, /) -> SearchResponse: ...

    def recall(self, request: RecallRequest, /) -> SearchResponse: ...

    def get(self, request: GetRequest, /) -> Page: ...

    def boot(self, request: BootRequest, /) -> BootContext: ...

    def append(self, request: AppendRequest, /) -> AppendResponse: ...

    def status(self) -> Status: ...


def check_query(query: str | None) -> None:
    """Raise ``ValueError`` (400) for a query over ``MAX_QUERY_CHARS`` characters."""
    if query is not None and len(query) > MAX_QUERY_CHARS:
        raise ValueError(f"query is {len(query)} characters; the limit is {MAX_QUERY_CHARS}")


def scope_agent(plan: Plan, agent: str | None) -> str | None:
    """The agent a request is about: ``agent`` when given, else the configured ``default_agent``, else the only
    agent. Raises ``KeyError`` (404) for an agent no workspace has, naming the known ones, and ``ValueError`` (400)
    naming the agents when several are configured and none applies, so an unscoped request never spans agents
    (fail closed)."""
    agents = plan.agents()
    if agent:
        if agent not in agents:
            raise KeyError(unknown_agent(agent, agents))
        return agent
    if plan.settings.default_agent:
        return plan.settings.default_agent
    if len(agents) <= 1:
        return agents[0] if agents else None
    raise ValueError(f"several agents are configured ({', '.join(agents)}): name one with agent, or set "
                     f"default_agent in the config")


class LocalMemory:
    """The daemon's answers in-process over its ``view`` (``Indexer.view``); implements ``Memory``."""

    def __init__(self, view: StatusView) -> None:
        self.view = view
        self._plan = view.plan
        self._searcher = view.searcher(self._plan)

    @property
    def searcher(self) -> Searcher:
        """The searcher over the daemon's current plan (made again when a reload swapped it)."""
        plan = self.view.plan
        if plan is not self._plan:
            self._searcher, self._plan = self.view.searcher(plan), plan
        return self._searcher

    def scoped(self, request: R) -> R:
        """``request`` checked (its query's length) and scoped to one agent (``scope_agent`` under the current
        plan): every operation starts here."""
        check_query(getattr(request, "query", None))
        return request.model_copy(update={"agent": scope_agent(self.view.plan, getattr(request, "agent", None))})

    def health(self) -> Health:
        return self.view.health_answer()

    def status(self) -> Status:
        return self.view.status()

    def search(self, request: SearchRequest, /) -> SearchResponse:
        """``{"hits", "relevant", "relevance", "pending"}`` (and ``indexing`` while the first index is being built)
        for ``request``, after waiting up to its ``wait_s`` seconds for the first index and the agent's pending
        files (``relevant``, ``relevance``: ``indexer.relevance.judge``, on the whole search)."""
        scoped = self.scoped(request)
        if scoped.wait_s:
            self.view.wait_pending(scoped.agent, scoped.wait_s)
        searcher = self.searcher
        with self.view.metrics.search_timer() as timer:
            found = searcher.answer(scoped)  # ValueError (a bad since): 400
            timer.mode = scoped.mode or searcher.mode  # a refused mode raised above: never a label
        answer: SearchResponse = {"hits": found.hits, "relevant": found.relevant, "relevance": found.relevance}
        return self._attach(answer, scoped.agent, found.degraded)

    def recall(self, request: RecallRequest, /) -> SearchResponse:
        """``indexer.recall.recall``'s answer (a listing pages with ``offset`` and says ``total`` and
        ``next_offset``), with ``pending`` and ``degraded``."""
        scoped, notes = self.scoped(request), list[str]()
        answer = recall(self.searcher, scoped, notes)
        return self._attach(answer, scoped.agent, notes)

    def boot(self, request: BootRequest, /) -> BootContext:
        """``indexer.recall.boot_context``'s answer, with the scoped agent's ``pending``."""
        scoped = self.scoped(request)
        context = boot_context(self.searcher, scoped, self.view.registry.classify_text, self.view.plan.settings)
        context["pending"] = self.view.pending(scoped.agent)
        return context

    def get(self, request: GetRequest, /) -> Page:
        """A page of ``request.path``, capped at ``MAX_PAGE_CHARS`` characters and ``MAX_PAGE_LINES`` lines whatever
        ``max_chars`` and ``lines`` ask (a bigger ask gets a capped page, ``truncated`` with ``next_from``)."""
        scoped = self.scoped(request)
        lines = min(scoped.lines, MAX_PAGE_LINES) if scoped.lines is not None else MAX_PAGE_LINES
        max_chars = min(scoped.max_chars, MAX_PAGE_CHARS)
        try:
            return read_memory(self.view.plan.collections, scoped.path, scoped.from_line, lines, max_chars,
                               scoped.agent, self.view.registry.classify_text, self.view.registry.transcript_format,
                               self.view.plan.settings)
        except ReadRefused:  # a media file: the text the index holds for it (a picture's OCR lines)
            found = self._media(scoped.path, scoped.agent)
            if found is None:
                raise
            collection, abs_path, kind = found
            entry = self.view.state.indexed.get(str(abs_path))
            return media_page(self.view.store, entry.collection if entry else collection.name, abs_path,
                              entry.state.points if entry else 0, abs_path.relative_to(collection.workspace.path)
                              .as_posix(), kind, scoped.from_line, lines, max_chars)

    def media(self, path: str, agent: str | None) -> tuple[bytes, str]:
        """``(bytes, media type)`` of picture ``path`` (``GET /media``): a media memory file of the scoped agent's
        workspace, read beneath it (``indexer.media.read_picture``). Raises ``ReadRefused`` (403) for any other
        file, ``FileNotFoundError`` (404), ``KeyError`` (unknown agent, 404)."""
        scoped = self.scoped(GetRequest(path=path, agent=agent))
        found = self._media(scoped.path, scoped.agent)
        if found is None:
            raise ReadRefused(f"{path}: not a media file")
        return read_picture(found[0], found[1])

    def _media(self, path: str, agent: str | None) -> tuple[Collection, Path, str] | None:
        registry = self.view.registry
        return find_media(self.view.plan.collections, path, agent, registry.classify, registry.media_kinds)

    def append(self, request: AppendRequest, /) -> AppendResponse:
        """``indexer.append.append_entry`` in the scoped agent's workspace (its errors, its answer); the watcher
        indexes the entry."""
        plan = self.view.plan
        return append_entry(plan.collections, plan.settings, self.scoped(request))

    def _attach(self, answer: SearchResponse, agent: str | None, notes: list[str]) -> SearchResponse:
        """``answer`` with ``agent``'s ``pending``, ``indexing`` while the first index is being built and, when
        ``notes`` say why it is less, ``degraded``."""
        answer["pending"] = self.view.pending(agent)
        indexing = self.view.indexing(agent)
        if indexing is not None:
            answer["indexing"] = indexing
        reason = join_degraded(notes)
        if reason:
            answer["degraded"] = reason
        return answer
