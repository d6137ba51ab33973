"""The ``qmd-indexer`` command line (click): the group, and the commands that ask a running daemon over HTTP
(``search``, ``get``, ``recall``, ``boot``, ``status``, ``append``, ``reindex``, ``mcp``). The commands that work in
this process (``run``, ``index``, ``migrate``, ``doctor``, ``plugins``) are ``indexer.cli_local``'s, added to the group
here. Heavy modules (torch, the store) are imported inside the commands that need them, so ``search``, ``status``
and ``--help`` start in a fraction of a second.

Exit codes: 0 success; 1 runtime failure (daemon unreachable, Qdrant unreachable, collection mismatch);
2 usage or configuration error, or a request the daemon refused (4xx: a path refused, an append off or too
large); 3 ``index --once`` finished but some files failed (each was logged) or could not be embedded within
``--wait-s`` (the embedding server did not answer).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from indexer import __version__
from indexer.cli_local import COMMANDS
from indexer.cli_options import config_opt, fail, port_opt, settings_from
from indexer.cli_release import release
from indexer.errors import EXIT_FAILURE, EXIT_USAGE
from indexer.openclaw import init
from indexer.terminal import configure_logging, print_answer, print_status

AGENT_DEFAULT = ("[default: default_agent, or the only agent; with several agents and no default_agent it is "
                 "required: a request never spans agents]")
CORPUS_HELP = ("Look in the memory files, the session transcripts or all "
               "[default: the daemon's default_corpus, all].")
AGENT_HELP = "Only this agent's memory " + AGENT_DEFAULT + "."
#: ``search --wait`` without SECONDS: a first start loads (and exports) the model in about 20 s, then indexes
DEFAULT_WAIT_S = 120.0


def _search_request(query: str, fields: dict[str, Any]) -> Any:
    """The ``SearchRequest`` of the ``search`` command's flags (named as its fields; a repeatable flag's values
    become a list), checked here so a bad value is a usage error (exit 2) before the daemon is asked."""
    given = {name: list(value) if isinstance(value, tuple) else value for name, value in fields.items()
             if value != ()}
    request = _request("SearchRequest", query=query, **given)
    try:
        request.times()  # the daemon answers 400 to a time it cannot read
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    return request


def _request(model: str, **flags: Any) -> Any:
    """The request model ``model`` (an ``indexer.schema`` name) of a command's flags, named as its fields (those left
    at ``None`` take the model's defaults); a value that does not fit is a usage error naming the flag (exit 2)
    before the daemon is asked. The one flag-to-model step of every command that asks the daemon."""
    from pydantic import ValidationError

    from indexer import schema

    try:
        return getattr(schema, model)(**{name: value for name, value in flags.items() if value is not None})
    except ValidationError as exc:
        raise click.UsageError("; ".join(f"--{'.'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}"
                                         for e in exc.errors())) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="qmd-indexer")
def main() -> None:
    """Keep an AI agent's memory files indexed in Qdrant and search them by meaning.

    \b
    Memory is MEMORY.md at the workspace root, every .md under memory/ and any extra paths.
    Start the daemon on a workspace, then ask it questions from another shell:
      qmd-indexer run --workspace ~/agent --agent main
      qmd-indexer search "what did the user say about deploy windows?"
      qmd-indexer status

    Config comes from a TOML file (--config), QMD_INDEXER_* environment variables and flags.
    """


for _command in (*COMMANDS, release, init):  # run, index, migrate, doctor, plugins; release; init --openclaw
    main.add_command(_command)


def _ask(config: Path | None, port: int | None, call: Any) -> Any:
    """``call(client)`` against the daemon; an error answer exits 2 when the request was at fault (4xx), else 1."""
    from indexer.client import ClientError

    try:
        return call(_client(config, port))
    except ClientError as exc:
        fail(str(exc), EXIT_USAGE if 400 <= exc.status_code < 500 else EXIT_FAILURE)


def _note_pending(client: Any) -> None:
    """One line on stderr when the answer came while files were changed on disk and not yet indexed."""
    if client.pending:
        shown = ", ".join(client.pending[:3]) + (", ..." if len(client.pending) > 3 else "")
        click.echo(f"note: {len(client.pending)} file(s) changed and not yet indexed ({shown}); "
                   f"the answer may miss them (search --wait waits)", err=True)


def _client(config: Path | None, port: int | None) -> Any:
    from indexer.client import Client

    settings = settings_from(config, None, None, None, None)
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host  # all interfaces: loopback
    return Client(port=port or settings.port, host=host, token=settings.token or None)


@main.command()
@click.argument("query")
@click.option("-k", "k", type=click.IntRange(1, 1000), default=6, show_default=True, help="How many hits.")
@click.option("--agent", help=AGENT_HELP)
@click.option("--collection", multiple=True, help="Only this collection (repeatable).")
@click.option("--mode", type=click.Choice(["hybrid", "dense", "keyword"]),
              help="Retrieval mode [default: the daemon's search_mode, hybrid].")
@click.option("--path-prefix", help="Only files at or under this workspace-relative path.")
@click.option("--kind", multiple=True, help="Only this source kind: markdown, image, audio... (repeatable)")
@click.option("--corpus", type=click.Choice(["memory", "sessions", "all"]), help=CORPUS_HELP)
@click.option("--min-score", type=float,
              help="Drop hits scoring below this (the score shown: cosine for dense, fused otherwise).")
@click.option("--since", help="Only files modified since: a duration (7d, 12h, 30m, 2w) or an ISO date (2026-11-01).")
@click.option("--until", help="Only files modified before: a duration ago (7d, 12h...) or an ISO date (2026-11-01).")
@click.option("--as-of", help="The moment a time in QUERY counts from (\"last week\"): an ISO date or a duration ago; "
                               "default now. Notes dated then rank higher; nothing is filtered.")
@click.option("--wait", "wait", type=click.FloatRange(0, None), is_flag=False, flag_value=DEFAULT_WAIT_S,
              default=None, metavar="[SECONDS]",
              help=f"Wait (up to SECONDS, default {DEFAULT_WAIT_S:g}) until the first index is built and no changed "
                   "file is pending indexing, then search.")
@click.option("--json", "as_json", is_flag=True,
              help='Print the answer as JSON: {"hits", "relevant", "relevance", "pending"}.')
@config_opt
@port_opt
def search(query: str, as_json: bool, config: Path | None, port: int | None, wait: float | None,
           **fields: Any) -> None:
    """Ask the running daemon a question; print the best memory chunks.

    \b
    Each hit shows path:start-end (1-based lines), score, collection and a snippet.
    stderr says how sure the answer is (relevance: level and reason), when nothing
    relevant was found, while the first index is still being built (files done of
    total) and which changed files are not indexed yet. --json prints the same
    answer as the API and the MCP tool: {"hits": [{"path", "start_line",
    "end_line", "score", "snippet", ...}], "relevant": true|false|null,
    "relevance": {"level", "reason"}, "pending": [path, ...], "indexing": {"done",
    "total"} (only while the first index is built)}.

    \b
    Examples:
      qmd-indexer search "how do I make a task repeat every week"
      qmd-indexer search "ACME-4471" --mode keyword -k 3 --json
      qmd-indexer search "deploy window" --since 7d
      qmd-indexer search "deploy window" --until 2026-11-01
      qmd-indexer search "what did Dana decide last week?" --as-of 2026-11-30
    """
    if not query.strip():
        raise click.UsageError("QUERY is empty; to list every memory file use `qmd-indexer recall`")
    from indexer.arguments import MAX_WAIT_S

    # every option but --json, --wait, --config and --port is a request field; --wait asks in steps the daemon
    # allows (MAX_WAIT_S each) until the first index is built and nothing is pending, or SECONDS have passed
    deadline = time.monotonic() + (wait or 0.0)
    request = _search_request(query, {**fields, "wait_s": min(wait, MAX_WAIT_S) if wait else None})
    client = _client(config, port)
    answer = _ask(config, port, lambda _: client.search_response(request))
    while (answer.get("indexing") or answer.get("pending")) and (left := deadline - time.monotonic()) > 0:
        step = request.model_copy(update={"wait_s": min(left, MAX_WAIT_S)})
        answer = _ask(config, port, lambda _: client.search_response(step))  # noqa: B023 - called at once
    if as_json:
        click.echo(json.dumps(answer, ensure_ascii=False, indent=2))
    else:
        print_answer(answer)
    _note_pending(client)


@main.command()
@click.argument("path")
@click.option("--agent", help="Whose memory file PATH is " + AGENT_DEFAULT + ".")
@click.option("--from", "from_line", type=click.IntRange(min=1),
              help="First line to read (1-based) [default: 1, or a citation's first line].")
@click.option("--lines", type=click.IntRange(min=1), help="At most this many lines.")
@click.option("--max-chars", type=click.IntRange(min=1), default=12_000, show_default=True,
              help="At most this many characters, in whole lines (a single longer line is cut).")
@click.option("--json", "as_json", is_flag=True, help="Print the page as JSON, with next_from.")
@config_opt
@port_opt
def get(path: str, as_json: bool, config: Path | None, port: int | None, **fields: Any) -> None:
    """Read part of one memory file through the daemon (streamed: huge files are fine).

    \b
    Only memory files of the workspace can be read: ../ escapes, paths outside it and
    symlinks are refused (exit 2). When the page stops early, stderr says which --from
    continues it.

    \b
    Examples:
      qmd-indexer get MEMORY.md
      qmd-indexer get memory/2026-11-27.md --from 40 --lines 20
      qmd-indexer get 'memory/2026-11-27.md#L3-L5'        # a hit's citation: its lines
    """
    request = _request("GetRequest", path=path, **fields)  # every option but --json, --config and --port
    page = _ask(config, port, lambda client: client.ask(request))
    if page["to"] < page["from"] and request.from_line > 1:  # past the end: say so, as a bad --from
        fail(f"{page['path']} has no line {request.from_line}: the file ends before it (start lower with --from)",
             EXIT_USAGE)
    if as_json:
        click.echo(json.dumps(page, ensure_ascii=False, indent=2))
        return
    if page.get("note"):  # read under another spelling of the name
        click.echo(f"[{page['note']}]", err=True)
    if page["text"]:
        click.echo(page["text"])
    if page["truncated"]:
        click.echo(f"[lines {page['from']}-{page['to']}; continue with --from {page['next_from']}]", err=True)


@main.command()
@click.argument("query", required=False, default="*")
@click.option("-k", "k", type=click.IntRange(1, 10_000),
              help="How many memories: hits [default: 6], or files of a listing [default and at most: 1000].")
@click.option("--top-k", "top_k", type=click.IntRange(1, 10_000), hidden=True, help="Former name of -k.")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True,
              help="A listing's first file (0-based, in path order), as the line on stderr gives it.")
@click.option("--agent", help=AGENT_HELP)
@click.option("--corpus", type=click.Choice(["memory", "sessions", "all"]), help=CORPUS_HELP)
@click.option("--json", "as_json", is_flag=True,
              help='Print the answer as JSON: {"hits", "relevant", "pending"}, and for a listing "total" and '
                   '"next_offset".')
@config_opt
@port_opt
def recall(query: str, top_k: int | None, offset: int, as_json: bool, config: Path | None, port: int | None,
           **fields: Any) -> None:
    """The best memories for QUERY; `*`, `all` or no QUERY lists every memory file.

    \b
    A listing is in path order, at most 1000 files a page; stderr says how many
    files there are and which --offset continues it.

    \b
    Examples:
      qmd-indexer recall "coffee order"
      qmd-indexer recall --agent main             # list memory files
      qmd-indexer recall -k 100 --offset 100      # the second page of 100
    """
    if top_k is not None:  # the former name of -k
        fields["k"] = top_k
    request = _request("RecallRequest", query=query, offset=offset, **fields)
    client = _client(config, port)
    answer = _ask(config, port, lambda _: client.ask(request))
    if as_json:
        click.echo(json.dumps(answer, ensure_ascii=False, indent=2))
    else:
        print_answer(answer, offset)
    _note_pending(client)


@main.command()
@click.option("--budget-chars", type=click.IntRange(1, 1_000_000), default=4000, show_default=True,
              help="Size of the context, in characters.")
@click.option("--agent", help=AGENT_HELP)
@click.option("--query", help="Fill the budget with the best hits for this instead of root memory + recent notes.")
@click.option("--json", "as_json", is_flag=True, help="Print text, included and omitted as JSON.")
@config_opt
@port_opt
def boot(as_json: bool, config: Path | None, port: int | None, **fields: Any) -> None:
    """Print a boot context: memory for the start of an agent session, within a budget.

    \b
    MEMORY.md comes first, then the most recently changed notes; whole lines only.
    What did not fit is listed on stderr (or under "omitted" with --json).

    \b
    Example:
      qmd-indexer boot --agent main --budget-chars 6000
    """
    request = _request("BootRequest", **fields)  # every option but --json, --config and --port
    client = _client(config, port)
    context = _ask(config, port, lambda _: client.ask(request))
    _note_pending(client)
    if as_json:
        click.echo(json.dumps(context, ensure_ascii=False, indent=2))
        return
    click.echo(context["text"])
    omitted = context["omitted"]
    if omitted:  # one line: which files did not fit (--json lists each with its lines)
        names = ", ".join(item["citation"] for item in omitted[:3]) + (", ..." if len(omitted) > 3 else "")
        click.echo(f"[omitted {len(omitted)} file(s), {sum(item['lines'] for item in omitted)} lines, over "
                   f"--budget-chars {request.budget_chars}: {names}]", err=True)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the daemon's status as JSON.")
@config_opt
@port_opt
def status(as_json: bool, config: Path | None, port: int | None) -> None:
    """Show what the running daemon holds: per-collection files and chunks, queue depth,
    chunks embedded and cache hits since start. Exit 1 if no daemon answers."""
    info = _ask(config, port, lambda client: client.status())
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        print_status(info)


@main.command()
@click.argument("text", required=False)
@click.option("--path", help="A markdown file under memory/, workspace-relative (memory/projects/acme.md), created if "
                             "missing [default: today's daily note memory/YYYY-MM-DD.md, in the agent's timezone].")
@click.option("--agent", help="Whose memory " + AGENT_DEFAULT + ".")
@click.option("--json", "as_json", is_flag=True, help='Print the answer as JSON: {"path", "from", "to", "citation"}.')
@config_opt
@port_opt
def append(text: str | None, as_json: bool, config: Path | None, port: int | None, **fields: Any) -> None:
    """Append TEXT (or, without TEXT or with -, standard input) to the agent's memory, through the daemon.

    \b
    The workspace needs `append = true` in the config; the entry goes whole, after a
    blank line, to today's daily note or to --path (a .md file under memory/), and the
    watcher indexes it within about a second. Prints its citation (path#Lfrom-Lto).
    Exit 0: written; 2: refused or invalid, nothing written (append off, a path outside
    memory/, not .md or a symlink, too large, unknown agent; stderr says which); 1: no
    daemon answers, or it failed.

    \b
    Examples:
      qmd-indexer append "Decided: deploys move to Wednesdays."
      git log -1 --format=%B | qmd-indexer append --path memory/projects/acme.md
    """
    if text is None or text == "-":
        if sys.stdin.isatty():
            raise click.UsageError("give TEXT, or pipe the entry on standard input")
        text = sys.stdin.read()
    if not text.strip():
        raise click.UsageError("the entry is empty")
    request = _request("AppendRequest", text=text, **fields)  # --path, --agent
    answer = _ask(config, port, lambda client: client.ask(request))
    click.echo(json.dumps(answer, ensure_ascii=False, indent=2) if as_json else answer["citation"])


@main.command()
@config_opt
@port_opt
def reindex(config: Path | None, port: int | None) -> None:
    """Ask the running daemon to rebuild its collections (after a model or chunking change).

    The new collections are filled beside the live ones, from the embedding cache where it can, and swapped in
    when complete; searches keep answering from the old ones meanwhile. Returns at once; `qmd-indexer status`
    shows `rebuilding` until it is done. Exit 1 if no daemon answers."""
    _ask(config, port, lambda client: client.reindex())
    click.echo("rebuilding: searches answer from the current index until the new one is swapped in")


@main.command("mcp")
@click.option("--agent", help="Serve this agent's memory only: the tools take no agent argument and every call is "
                              "made for it (a multi-agent daemon) [default: each call may name one].")
@config_opt
@port_opt
def mcp_(agent: str | None, config: Path | None, port: int | None) -> None:
    """Serve the memory tools to an MCP client (an AI agent) over stdio.

    \b
    Tools: memory_search, memory_get, memory_recall, memory_boot, memory_status;
    memory_append too when the daemon takes appends (a workspace with append = true;
    asked at start, else read from the config).
    They ask the running daemon (`qmd-indexer run`) on --port; this process never
    opens the store or loads the model, so it starts in about a second. With no
    daemon answering, each tool call returns an error saying how to start one.
    Logs go to stderr; stdout carries the protocol. The daemon also serves the
    same tools over streamable HTTP at http://127.0.0.1:PORT/mcp.
    Exit 2: --agent names an agent the daemon does not have.

    \b
    Example MCP client config (stdio):
      {"mcpServers": {"memory": {"command": "qmd-indexer", "args": ["mcp", "--port", "8743"]}}}
      ... "args": ["mcp", "--port", "8743", "--agent", "alice"]   (one agent of several)
    """
    settings = settings_from(config, None, None, None, port)
    configure_logging(settings.log_format, settings.log_level)
    from indexer.client import RemoteMemory
    from indexer.mcp import build_server, daemon_appends, serve_stdio

    client = _client(config, settings.port)
    try:
        writes = daemon_appends(client, agent)  # what the daemon offers, when one answers
    except KeyError as exc:
        fail(str(exc.args[0]), EXIT_USAGE)
    if writes is None:  # no daemon yet: what the config allows
        writes = any(ws.append for ws in settings.workspace if agent in (None, ws.agent))
    serve_stdio(build_server(RemoteMemory(client), append=writes, agent=agent))


if __name__ == "__main__":  # pragma: no cover
    main()
