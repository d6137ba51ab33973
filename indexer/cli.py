"""The ``qmd-indexer`` command line (click). Heavy modules (torch, the store) are imported inside the commands
that need them, so ``search``, ``status`` and ``--help`` start in a fraction of a second.

Exit codes: 0 success; 1 runtime failure (daemon unreachable, Qdrant unreachable, collection mismatch);
2 usage or configuration error; 3 ``index --once`` finished but some files failed (each was logged).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from indexer import __version__
from indexer.errors import EXIT_FAILURE, EXIT_OK, EXIT_PARTIAL, EXIT_USAGE
from indexer.terminal import configure_logging, print_hits, print_status

F = TypeVar("F", bound=Callable[..., Any])


def _finite(value: float | None) -> float | None:
    import math

    if value is not None and not math.isfinite(value):
        raise click.BadParameter("must be a finite number")
    return value


def _since(value: str | None) -> str | None:
    """Check ``--since`` here, so a typo is a usage error (exit 2) before the daemon is asked."""
    if value is not None:
        from indexer.points import parse_since

        try:
            parse_since(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


def _fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    click.echo(f"qmd-indexer: {message}", err=True)
    sys.exit(code)


def _settings(config: Path | None, workspace: Path | None, agent: str | None, state_dir: Path | None,
              port: int | None, qdrant_url: str | None = None, extra: tuple[Path, ...] = (),
              host: str | None = None) -> Any:
    from indexer.config import load_settings
    from indexer.errors import ConfigError

    overrides: dict[str, Any] = {"state_dir": state_dir, "port": port, "qdrant_url": qdrant_url, "host": host}
    if workspace is not None:
        overrides["workspace"] = [{"agent": agent or "main", "path": workspace, "extra_paths": list(extra)}]
    elif agent is not None or extra:
        _fail("--agent and --extra-path need --workspace (or a config file with [[workspace]] tables)", EXIT_USAGE)
    try:
        return load_settings(config, overrides)
    except ConfigError as exc:
        _fail(f"config error: {exc}", EXIT_USAGE)


def _need_workspaces(settings: Any) -> None:
    if not settings.workspace:
        _fail("no workspace configured: pass --workspace PATH [--agent ID], or add [[workspace]] tables to the "
              "config file (see `qmd-indexer run --help`)", EXIT_USAGE)


_config_opt = click.option("--config", "config", type=click.Path(path_type=Path, dir_okay=False),
                           help="TOML config file [env QMD_INDEXER_CONFIG; default ~/.config/qmd-indexer/config.toml]")
_port_opt = click.option("--port", type=click.IntRange(1, 65535), help="HTTP API port on 127.0.0.1 [default 8743]")


def _workspace_opts(fn: F) -> F:
    fn = click.option("--extra-path", "extra", multiple=True, type=click.Path(path_type=Path),
                      help="Extra memory file or directory (repeatable), absolute or workspace-relative.")(fn)
    fn = click.option("--qdrant-url", help="Qdrant server URL; empty = embedded Qdrant Edge under the state dir.")(fn)
    fn = click.option("--state-dir", type=click.Path(path_type=Path, file_okay=False),
                      help="Where the embedded store and embedding cache live "
                           "[default $XDG_STATE_HOME/qmd-indexer, else ~/.local/state/qmd-indexer].")(fn)
    fn = click.option("--agent", help="Agent id of --workspace [default main].")(fn)
    fn = click.option("--workspace", type=click.Path(path_type=Path, file_okay=False, exists=True),
                      help="Agent workspace directory (holds MEMORY.md and memory/); replaces the config's list.")(fn)
    return _config_opt(fn)


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


@main.command()
@_workspace_opts
@_port_opt
@click.option("--host", help="Address to listen on [default 127.0.0.1]; any other needs a token (README: Security).")
@click.option("--reindex", is_flag=True,
              help="Rebuild the collections beside the live ones and swap them in (after a model change).")
def run(config: Path | None, workspace: Path | None, agent: str | None, state_dir: Path | None, qdrant_url: str | None,
        extra: tuple[Path, ...], port: int | None, host: str | None, reindex: bool) -> None:
    """Run the daemon: index the workspaces, keep watching them, serve searches.

    \b
    The first start indexes everything (a progress bar on a terminal); later starts only
    re-embed what changed. Logs are JSON lines when stderr is not a terminal (journald).
    SIGTERM or Ctrl-C finishes the files in hand, flushes the store and exits 0.

    \b
    Examples:
      qmd-indexer run --workspace ~/agent --agent main
      qmd-indexer run --config /etc/qmd-indexer/config.toml
    """
    from indexer.service import serve
    from indexer.terminal import progress_bar

    settings = _settings(config, workspace, agent, state_dir, port, qdrant_url, extra, host)
    _need_workspaces(settings)
    from indexer.errors import ConfigError
    from indexer.guard import check_bind

    try:
        warning = check_bind(settings.host, settings.token)
    except ConfigError as exc:
        _fail(f"config error: {exc}", EXIT_USAGE)
    configure_logging(settings.log_format, settings.log_level)
    if warning:
        import structlog

        structlog.get_logger("qmd_indexer.daemon").warning("non_loopback_bind", host=settings.host, detail=warning)
    sys.exit(serve(settings, reindex=reindex, progress=progress_bar))


@main.command()
@_workspace_opts
@click.option("--once", is_flag=True, help="Index everything now and exit (required; `run` keeps watching).")
@click.option("--reindex", is_flag=True, help="Rebuild the collections beside the current ones, then swap them in.")
@click.option("--json", "as_json", is_flag=True, help="Print the final status as JSON.")
def index(config: Path | None, workspace: Path | None, agent: str | None, state_dir: Path | None,
          qdrant_url: str | None, extra: tuple[Path, ...], once: bool, reindex: bool, as_json: bool) -> None:
    """Index the workspaces without the daemon, then exit (for scripts and CI).

    \b
    Exit status: 0 all memory files indexed or deliberately skipped; 3 some files failed
    (each was logged); 1 the store could not be opened; 2 bad usage or config.
    Do not run it against the embedded store of a running daemon: only one process can hold it.

    \b
    Example:
      qmd-indexer index --once --workspace ~/agent --agent main --state-dir /tmp/qmd
    """
    if not once:
        _fail("`index` needs --once (to keep watching and serving searches, use `qmd-indexer run`)", EXIT_USAGE)
    settings = _settings(config, workspace, agent, state_dir, None, qdrant_url, extra)
    _need_workspaces(settings)
    configure_logging(settings.log_format, settings.log_level)
    from indexer.service import Refused, open_indexer
    from indexer.terminal import progress_bar
    from indexer.worker import index_once

    try:
        indexer = open_indexer(settings, reindex)
    except Refused as exc:
        _fail(exc.message, exc.code)
    try:
        status = index_once(indexer, progress=progress_bar)
    finally:
        indexer.close()
    if as_json:
        click.echo(json.dumps(status, indent=2))
    else:
        print_status(status)
    sys.exit(EXIT_PARTIAL if status["files_failed"] else EXIT_OK)


@main.command()
@click.option("--to", "url", required=True, help="Qdrant server URL to copy into, e.g. http://qdrant:6333.")
@click.option("--api-key", help="API key of that server [default: the config's qdrant_api_key].")
@click.option("--state-dir", type=click.Path(path_type=Path, file_okay=False),
              help="State dir whose embedded store is copied [default: the configured one].")
@_config_opt
def migrate(url: str, api_key: str | None, state_dir: Path | None, config: Path | None) -> None:
    """Copy the embedded store into a Qdrant server or cluster, without embedding anything again.

    \b
    Every collection under <state-dir>/qdrant is copied with its points' ids, vectors and payloads into the
    server's collections of the same names (created with the configured qdrant_* collection settings). Running it
    again is safe: points already there are skipped, so an interrupted run resumes. Stop the daemon first (it
    holds the embedded store); afterwards, start it on the server (the output says how).

    \b
    Example:
      qmd-indexer migrate --to http://127.0.0.1:6333
    """
    settings = _settings(config, None, None, state_dir, None)
    configure_logging(settings.log_format, settings.log_level)
    from indexer.errors import CollectionMismatch, StoreLocked, StoreUnavailable
    from indexer.migrate import migrate as copy_store
    from indexer.store import EdgeStore, ServerOptions, ServerStore

    root = settings.state_dir / "qdrant"
    if not root.is_dir():
        _fail(f"no embedded store under {settings.state_dir} (nothing to migrate); pass --state-dir")
    source = EdgeStore(root)
    target = ServerStore(url, api_key or settings.qdrant_api_key, ServerOptions.from_settings(settings))
    try:
        results = copy_store(source, target)
    except StoreLocked as exc:
        _fail(f"{exc}. Stop the daemon, then migrate.")
    except (StoreUnavailable, CollectionMismatch) as exc:
        _fail(f"{exc}. Nothing is lost: run the same command again to resume.")
    finally:
        source.close()
        target.close()
    for r in results:
        click.echo(f"{r.collection:<40} {r.points:>8} points  ({r.copied} copied, {r.skipped} already there, "
                   f"{r.files_removed} stale files removed)")
    click.echo(f"Copied {len(results)} collections to {url}. Start the daemon on the server with\n"
               f"  qmd-indexer run --qdrant-url {url} ...\n"
               f"or set qdrant_url = \"{url}\" in the config file (environment: QMD_INDEXER_QDRANT_URL). Nothing is "
               f"embedded again; {root} is no longer used and can be removed once you are satisfied.")


def _ask(config: Path | None, port: int | None, call: Any) -> Any:
    """``call(client)`` against the daemon; an error answer exits 2 when the request was at fault (4xx), else 1."""
    from indexer.client import ClientError

    try:
        return call(_client(config, port))
    except ClientError as exc:
        _fail(str(exc), EXIT_USAGE if 400 <= exc.status_code < 500 else EXIT_FAILURE)


def _note_pending(client: Any) -> None:
    """One line on stderr when the answer came while files were changed on disk and not yet indexed."""
    if client.pending:
        shown = ", ".join(client.pending[:3]) + (", ..." if len(client.pending) > 3 else "")
        click.echo(f"note: {len(client.pending)} file(s) changed and not yet indexed ({shown}); "
                   f"the answer may miss them (search --wait waits)", err=True)


def _client(config: Path | None, port: int | None) -> Any:
    from indexer.client import Client

    settings = _settings(config, None, None, None, None)
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host  # all interfaces: loopback
    return Client(port=port or settings.port, host=host, token=settings.token or None)


@main.command()
@click.argument("query")
@click.option("-k", "k", type=click.IntRange(1, 1000), default=6, show_default=True, help="How many hits.")
@click.option("--agent", help="Only this agent's collections.")
@click.option("--collection", "collections", multiple=True, help="Only this collection (repeatable).")
@click.option("--mode", type=click.Choice(["hybrid", "dense", "keyword"]),
              help="Retrieval mode [default: the daemon's search_mode, hybrid].")
@click.option("--path-prefix", help="Only files at or under this workspace-relative path.")
@click.option("--kind", "kinds", multiple=True, help="Only this source kind: markdown, image, audio... (repeatable)")
@click.option("--min-score", type=float, callback=lambda ctx, param, value: _finite(value),
              help="Drop hits scoring below this (the score shown: cosine for dense, fused otherwise).")
@click.option("--since", callback=lambda ctx, param, value: _since(value),
              help="Only files modified since: a duration (7d, 12h, 30m, 2w) or an ISO date (2026-11-01).")
@click.option("--wait", "wait_s", type=click.FloatRange(0, 10), is_flag=False, flag_value=10.0, default=None,
              help="Wait (up to SECONDS, default 10) until no changed file is pending indexing, then search.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of hits.")
@_config_opt
@_port_opt
def search(query: str, k: int, agent: str | None, collections: tuple[str, ...], mode: str | None,
           path_prefix: str | None, kinds: tuple[str, ...], min_score: float | None, since: str | None,
           wait_s: float | None, as_json: bool, config: Path | None, port: int | None) -> None:
    """Ask the running daemon a question; print the best memory chunks.

    \b
    Each hit shows path:start-end (1-based lines), score, collection and a snippet.
    --json prints [{"collection", "path", "start_line", "end_line", "score", "snippet", ...}].

    \b
    Examples:
      qmd-indexer search "how do I make a task repeat every week"
      qmd-indexer search "ACME-4471" --mode keyword -k 3 --json
      qmd-indexer search "deploy window" --since 7d
    """
    if not query.strip():
        raise click.UsageError("QUERY is empty; to list every memory file use `qmd-indexer recall`")
    client = _client(config, port)
    hits = _ask(config, port, lambda _: client.search(
        query, k=k, agent=agent, collection=list(collections) or None, mode=mode, path_prefix=path_prefix,
        kind=list(kinds) or None, min_score=min_score, since=since, wait_s=wait_s))
    _note_pending(client)
    if as_json:
        click.echo(json.dumps(hits, ensure_ascii=False, indent=2))
        return
    print_hits(hits)


@main.command()
@click.argument("path")
@click.option("--agent", help="Whose memory file PATH is [default: default_agent, or the only agent; with several "
                               "agents and no default_agent it is required].")
@click.option("--from", "from_line", type=click.IntRange(min=1), default=1, show_default=True,
              help="First line to read (1-based).")
@click.option("--lines", type=click.IntRange(min=1), help="At most this many lines.")
@click.option("--max-chars", type=click.IntRange(min=1), default=12_000, show_default=True,
              help="At most this many characters, in whole lines (a single longer line is cut).")
@click.option("--json", "as_json", is_flag=True, help="Print the page as JSON, with next_from.")
@_config_opt
@_port_opt
def get(path: str, agent: str | None, from_line: int, lines: int | None, max_chars: int, as_json: bool,
        config: Path | None, port: int | None) -> None:
    """Read part of one memory file through the daemon (streamed: huge files are fine).

    \b
    Only memory files of the workspace can be read: ../ escapes, paths outside it and
    symlinks are refused (exit 2). When the page stops early, stderr says which --from
    continues it.

    \b
    Examples:
      qmd-indexer get MEMORY.md
      qmd-indexer get memory/2026-11-27.md --from 40 --lines 20
    """
    page = _ask(config, port, lambda client: client.get(path, from_line, lines, max_chars, agent))
    if as_json:
        click.echo(json.dumps(page, ensure_ascii=False, indent=2))
        return
    if page["text"]:
        click.echo(page["text"])
    if page["truncated"]:
        click.echo(f"[lines {page['from']}-{page['to']}; continue with --from {page['next_from']}]", err=True)


@main.command()
@click.argument("query", required=False, default="*")
@click.option("-k", "k", type=click.IntRange(1, 10_000), default=6, show_default=True,
              help="How many memories (hits, or files when listing).")
@click.option("--top-k", "top_k", type=click.IntRange(1, 10_000), hidden=True, help="Former name of -k.")
@click.option("--agent", help="Only this agent's memory.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@_config_opt
@_port_opt
def recall(query: str, k: int, top_k: int | None, agent: str | None, as_json: bool, config: Path | None,
           port: int | None) -> None:
    """The best memories for QUERY; `*`, `all` or no QUERY lists every memory file.

    \b
    Examples:
      qmd-indexer recall "coffee order"
      qmd-indexer recall --agent main -k 100      # list memory files
    """
    client = _client(config, port)
    hits = _ask(config, port, lambda _: client.recall(query, top_k or k, agent))
    _note_pending(client)
    if as_json:
        click.echo(json.dumps(hits, ensure_ascii=False, indent=2))
    else:
        print_hits(hits)


@main.command()
@click.option("--budget-chars", type=click.IntRange(1, 1_000_000), default=4000, show_default=True,
              help="Size of the context, in characters.")
@click.option("--agent", help="Only this agent's memory.")
@click.option("--query", help="Fill the budget with the best hits for this instead of root memory + recent notes.")
@click.option("--json", "as_json", is_flag=True, help="Print text, included and omitted as JSON.")
@_config_opt
@_port_opt
def boot(budget_chars: int, agent: str | None, query: str | None, as_json: bool, config: Path | None,
         port: int | None) -> None:
    """Print a boot context: memory for the start of an agent session, within a budget.

    \b
    MEMORY.md comes first, then the most recently changed notes; whole lines only.
    What did not fit is listed on stderr (or under "omitted" with --json).

    \b
    Example:
      qmd-indexer boot --agent main --budget-chars 6000
    """
    client = _client(config, port)
    context = _ask(config, port, lambda _: client.boot_context(budget_chars, agent, query))
    _note_pending(client)
    if as_json:
        click.echo(json.dumps(context, ensure_ascii=False, indent=2))
        return
    click.echo(context["text"])
    for item in context["omitted"]:
        click.echo(f"[omitted {item['citation']} ({item['lines']} lines)]", err=True)


@main.command()
@_config_opt
@click.option("--workspace", type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="Workspace directory to check; replaces the config's list.")
@click.option("--agent", help="Agent id of --workspace [default main].")
@click.option("--fix", is_flag=True, help="Archive the legacy memory.md and merge its text into MEMORY.md.")
def doctor(config: Path | None, workspace: Path | None, agent: str | None, fix: bool) -> None:
    """Check each workspace for a split root memory (MEMORY.md and memory.md as two files),
    and warn about workspaces that overlap (one nested in another's memory/).

    \b
    Only MEMORY.md is indexed; --fix moves memory.md to
    .openclaw-repair/root-memory/<UTC time>/memory.md and, when its text differs,
    appends it to MEMORY.md under a heading naming the archive. Nothing is lost.
    Exit status: 0 healthy (or repaired), 1 a problem found and not fixed.

    \b
    Examples:
      qmd-indexer doctor --workspace ~/agent
      qmd-indexer doctor --config /etc/qmd-indexer/config.toml --fix
    """
    from indexer.doctor import find_split, fix_split
    from indexer.workspace import overlaps, plan_collections

    settings = _settings(config, workspace, agent, None, None)
    _need_workspaces(settings)
    problems = 0
    for overlap in overlaps(plan_collections(settings.workspace)):
        click.echo(f"warning: overlapping workspaces: {overlap}")
    for ws in settings.workspace:
        legacy = find_split(ws)
        if legacy is None:
            click.echo(f"{ws.agent}: ok ({ws.path})")
        elif not fix:
            problems += 1
            click.echo(f"{ws.agent}: split root memory: {legacy} and MEMORY.md are different files; "
                       f"only MEMORY.md is indexed. Run with --fix to archive and merge it.")
        else:
            repair = fix_split(ws)
            if repair is None:  # repaired by someone else since find_split
                click.echo(f"{ws.agent}: ok ({ws.path})")
                continue
            merged = "its text appended to MEMORY.md" if repair.merged else "same text as MEMORY.md"
            click.echo(f"{ws.agent}: repaired: {legacy.name} archived to {repair.archived_to} ({merged})")
    sys.exit(EXIT_FAILURE if problems else EXIT_OK)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the daemon's status as JSON.")
@_config_opt
@_port_opt
def status(as_json: bool, config: Path | None, port: int | None) -> None:
    """Show what the running daemon holds: per-collection files and chunks, queue depth,
    chunks embedded and cache hits since start. Exit 1 if no daemon answers."""
    info = _ask(config, port, lambda client: client.status())
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        print_status(info)


@main.command()
@_config_opt
@_port_opt
def reindex(config: Path | None, port: int | None) -> None:
    """Ask the running daemon to rebuild its collections (after a model or chunking change).

    The new collections are filled beside the live ones, from the embedding cache where it can, and swapped in
    when complete; searches keep answering from the old ones meanwhile. Returns at once; `qmd-indexer status`
    shows `rebuilding` until it is done. Exit 1 if no daemon answers."""
    _ask(config, port, lambda client: client.reindex())
    click.echo("rebuilding: searches answer from the current index until the new one is swapped in")


@main.command("mcp")
@_config_opt
@_port_opt
def mcp_(config: Path | None, port: int | None) -> None:
    """Serve the memory tools to an MCP client (an AI agent) over stdio.

    \b
    Tools: memory_search, memory_get, memory_recall, memory_boot, memory_status.
    They ask the running daemon (`qmd-indexer run`) on --port; this process never
    opens the store or loads the model, so it starts in about a second. With no
    daemon answering, each tool call returns an error saying how to start one.
    Logs go to stderr; stdout carries the protocol. The daemon also serves the
    same tools over streamable HTTP at http://127.0.0.1:PORT/mcp.

    \b
    Example MCP client config (stdio):
      {"mcpServers": {"memory": {"command": "qmd-indexer", "args": ["mcp", "--port", "8743"]}}}
    """
    settings = _settings(config, None, None, None, port)
    configure_logging(settings.log_format, settings.log_level)
    from indexer.mcp import build_server

    build_server(_client(config, settings.port)).run("stdio")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of plugin records.")
@_config_opt
def plugins(as_json: bool, config: Path | None) -> None:
    """List every installed plugin: group, name, distribution and version, what it provides, status.

    \b
    Plugins are found through the entry-point groups qmd_indexer.classifiers,
    qmd_indexer.extractors and qmd_indexer.embedders; no model is loaded to list them.
    A plugin that fails to load is listed as failed with the reason.
    Status: loaded, failed, disabled (not in the `plugins` allow-list), unused (lost a `prefer` choice).
    """
    from indexer.errors import ConfigError
    from indexer.plugins import load_registry, plugin_configs

    settings = _settings(config, None, None, None, None)
    configure_logging("json" if as_json else settings.log_format, "critical" if as_json else "error")
    try:
        registry = load_registry(settings.plugins, plugin_configs(settings), settings.prefer)
    except ConfigError as exc:
        _fail(f"config error: {exc}", EXIT_USAGE)
    records = [r.as_dict() for r in registry.records]
    if as_json:
        click.echo(json.dumps(records, indent=2))
        return
    click.echo(f"{'group':<12} {'name':<24} {'distribution':<28} {'provides':<16} status")
    for r in records:
        dist = f"{r['distribution']} {r['version']}"
        group = r["group"].rsplit(".", 1)[-1]
        line = f"{group:<12} {r['name']:<24} {dist:<28} {', '.join(r['provides']):<16} {r['status']}"
        click.echo(line + (f" ({r['reason']})" if r["reason"] else ""))


if __name__ == "__main__":  # pragma: no cover
    main()
