"""The ``qmd-indexer`` commands that work in this process, on the state dir and the workspaces themselves: ``run``
(the daemon), ``index --once``, ``migrate``, ``doctor`` and ``plugins``. What every command shares (the options,
settings from flags, the one-line failure) is ``indexer.cli_options``'.

``indexer.cli`` adds these commands to its group beside the ones that ask a running daemon. Heavy modules (torch,
the store) are imported inside the commands that need them. Exit codes are ``indexer.cli``'s.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from indexer.cli_options import (
    config_opt,
    fail,
    need_workspaces,
    port_opt,
    private_files,
    settings_from,
    workspace_opts,
)
from indexer.errors import EXIT_FAILURE, EXIT_OK, EXIT_PARTIAL, EXIT_USAGE
from indexer.terminal import configure_logging, print_status

if TYPE_CHECKING:  # the commands import the store and migrate themselves, when they run
    from indexer.migrate import Migrated
    from indexer.store import ServerStore, Store


@click.command()
@workspace_opts
@port_opt
@click.option("--host", help="Address to listen on [default 127.0.0.1]; any other needs a token (README: Security).")
@click.option("--reindex", is_flag=True,
              help="Rebuild the collections beside the live ones and swap them in (after a model change).")
@click.option("--append", is_flag=True, help="Let the agent of --workspace append to its memory/ (memory_append, "
              "`qmd-indexer append`); in a config file: append = true on its [[workspace]].")
def run(config: Path | None, workspace: Path | None, agent: str | None, state_dir: Path | None, qdrant_url: str | None,
        extra: tuple[Path, ...], sessions: Path | None, port: int | None, host: str | None, reindex: bool,
        append: bool) -> None:
    """Run the daemon: index the workspaces, keep watching them, serve searches.

    \b
    The first start indexes everything (a progress bar on a terminal); later starts only
    re-embed what changed. Logs are JSON lines when stderr is not a terminal (journald).
    SIGTERM or Ctrl-C finishes the files in hand, flushes the store and exits 0.

    \b
    Examples:
      qmd-indexer run --workspace ~/agent --agent main --append
      qmd-indexer run --workspace ~/.openclaw/workspace --sessions ~/.openclaw/agents/main/sessions
      qmd-indexer run --config /etc/qmd-indexer/config.toml
    """
    private_files()
    from indexer.service import serve
    from indexer.terminal import progress_bar

    settings = settings_from(config, workspace, agent, state_dir, port, qdrant_url, extra, host, append, sessions)
    need_workspaces(settings)
    from indexer.errors import ConfigError
    from indexer.guard import check_bind

    try:
        warning = check_bind(settings.host, settings.token)
    except ConfigError as exc:
        fail(f"config error: {exc}", EXIT_USAGE)
    configure_logging(settings.log_format, settings.log_level)
    if warning:
        import structlog

        structlog.get_logger("qmd_indexer.daemon").warning("non_loopback_bind", host=settings.host, detail=warning)
    from indexer.config_load import load_settings

    # SIGHUP: the same config file and environment again, with this command line's flags still on top
    flags = {"state_dir": state_dir, "port": port, "qdrant_url": qdrant_url, "host": host, "workspace": workspace}
    kept = {key: getattr(settings, key) for key, given in flags.items() if given is not None}
    sys.exit(serve(settings, reindex=reindex, progress=progress_bar, reload=lambda: load_settings(config, kept)))


@click.command()
@workspace_opts
@click.option("--once", is_flag=True, help="Index everything now and exit (required; `run` keeps watching).")
@click.option("--reindex", is_flag=True, help="Rebuild the collections beside the current ones, then swap them in.")
@click.option("--json", "as_json", is_flag=True, help="Print the final status as JSON.")
@click.option("--wait-s", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Seconds to wait out an embedding server that does not answer (down, 429, 5xx, loading).")
def index(config: Path | None, workspace: Path | None, agent: str | None, state_dir: Path | None,
          qdrant_url: str | None, extra: tuple[Path, ...], sessions: Path | None, once: bool, reindex: bool,
          as_json: bool, wait_s: float) -> None:
    """Index the workspaces without the daemon, then exit (for scripts and CI).

    \b
    Exit status: 0 all memory files indexed or deliberately skipped; 3 some files failed
    (each was logged) or could not be embedded within --wait-s; 1 the store could not be
    opened, or the embedding server did not answer within --wait-s; 2 bad usage or config.
    Do not run it against the embedded store of a running daemon: only one process can hold it.

    \b
    Example:
      qmd-indexer index --once --workspace ~/agent --agent main --state-dir /tmp/qmd
    """
    if not once:
        fail("`index` needs --once (to keep watching and serving searches, use `qmd-indexer run`)", EXIT_USAGE)
    private_files()
    settings = settings_from(config, workspace, agent, state_dir, None, qdrant_url, extra, sessions=sessions)
    need_workspaces(settings)
    configure_logging(settings.log_format, settings.log_level)
    from indexer.service import Refused, open_indexer
    from indexer.terminal import progress_bar
    from indexer.worker import index_once

    started = time.monotonic()
    try:
        indexer = open_indexer(settings, reindex, wait_s=wait_s)
    except Refused as exc:
        fail(exc.message, exc.code)
    try:
        status = index_once(indexer, progress=progress_bar, wait_s=max(0.0, wait_s - (time.monotonic() - started)))
    finally:
        indexer.close()
    if as_json:
        click.echo(json.dumps(status, indent=2))
    else:
        print_status(status, served=False)
    if status["queue_depth"]:
        click.echo(f"qmd-indexer: {status['queue_depth']} file(s) not indexed: the embedder did not answer within "
                   f"{wait_s:g} s (--wait-s): {indexer.state.ledger.outage.reason or 'unavailable'}", err=True)
    sys.exit(EXIT_PARTIAL if status["files_failed"] or status["queue_depth"] else EXIT_OK)


@click.command()
@click.option("--to", "url", help="Qdrant server URL to copy into, e.g. http://qdrant:6333 [default: --from's].")
@click.option("--from", "source_url", help="Copy from this Qdrant server (the state dir's collections) instead of "
              "the embedded store.")
@click.option("--tenancy", type=click.Choice(["collections", "shared"]),
              help="Layout to write [default: the config's qdrant_tenancy; from a server, shared when that is "
              "auto].")
@click.option("--from-tenancy", type=click.Choice(["collections", "shared"]),
              help="Layout of --from [default: the other one when --from is --to, else the config's].")
@click.option("--drop-source", is_flag=True, help="Then delete from --from what was copied and verified.")
@click.option("--api-key", help="API key of the server(s) [default: the config's qdrant_api_key].")
@click.option("--state-dir", type=click.Path(path_type=Path, file_okay=False),
              help="State dir whose store (or whose collections on --from) is copied [default: the configured one].")
@config_opt
def migrate(url: str | None, source_url: str | None, tenancy: str | None, from_tenancy: str | None,
            drop_source: bool, api_key: str | None, state_dir: Path | None, config: Path | None) -> None:
    """Copy an index to a Qdrant server, or between its two layouts, without embedding anything again.

    \b
    From the embedded store (--to): every collection under <state-dir>/qdrant is copied with its points' ids,
    vectors and payloads into the server, in the configured layout (qdrant_tenancy) or --tenancy.
    Between layouts (--from): the collections of the daemon whose state dir this is move from one layout to the
    other (collections: a Qdrant collection each; shared: tenants of shared collections).
    Each collection is counted on both sides afterwards; the command exits 1 when a count differs. Running it
    again is safe: points already there are skipped, so an interrupted run resumes. Stop the daemon first; then
    start it on the server in the new layout (the output says how).

    \b
    Examples:
      qmd-indexer migrate --to http://127.0.0.1:6333
      qmd-indexer migrate --from http://127.0.0.1:6333 --tenancy shared --drop-source
    """
    settings = settings_from(config, None, None, state_dir, None)
    configure_logging(settings.log_format, settings.log_level)
    from indexer.errors import CollectionMismatch, StoreLocked, StoreUnavailable
    from indexer.migrate import drop_sources, record_tenancy
    from indexer.migrate import migrate as copy_store
    from indexer.statedir import edge_store

    if not url and not source_url:
        fail("pass --to URL (from the embedded store) or --from URL (between layouts)", EXIT_USAGE)
    if drop_source and not source_url:
        fail("--drop-source needs --from (the embedded store is left for you to remove)", EXIT_USAGE)
    to_url = url or str(source_url)
    source, target, names = _migrate_stores(settings, to_url, source_url, tenancy, from_tenancy, api_key)
    try:
        results = copy_store(source, target, names=names)
        dropped = drop_sources(source, results) if drop_source else []
    except StoreLocked as exc:
        fail(f"{exc}. Stop the daemon, then migrate.")
    except (StoreUnavailable, CollectionMismatch) as exc:
        fail(f"{exc}. Nothing is lost: run the same command again to resume.")
    finally:
        source.close()
        target.close()
    _migrated_lines(results, dropped, names, source_url, source.tenancy)
    if not results:
        fail("nothing to copy: no collection of this state dir is in the source")
    if not all(r.verified for r in results):
        fail("some counts differ (was the daemon running?): run the same command again")
    record_tenancy(settings.state_dir, to_url, target.tenancy)  # the daemon's "auto" keeps this layout there
    layout = target.tenancy
    click.echo(f"Copied {len(results)} collections to {to_url} ({layout} layout), every count verified. Start the "
               f"daemon on it with\n  qmd-indexer run --qdrant-url {to_url} ...\nwith qdrant_tenancy = \"{layout}\" "
               f"(environment: QMD_INDEXER_QDRANT_URL, QMD_INDEXER_QDRANT_TENANCY). Nothing is embedded again."
               + ("" if source_url else f" {edge_store(settings.state_dir)} is no longer used and can be removed once "
                                         f"you are satisfied."))


def _migrate_stores(settings: Any, to_url: str, source_url: str | None, tenancy: str | None,
                    from_tenancy: str | None, api_key: str | None) -> tuple[Store, ServerStore, list[str] | None]:
    """``migrate.open_stores`` for the ``migrate`` command's flags: ``(source, target, names)``; exits 2 on bad
    flags (``ValueError``), 1 when the embedded store is locked or the server unreachable."""
    from indexer.errors import StoreLocked, StoreUnavailable
    from indexer.migrate import open_stores

    try:
        return open_stores(settings, to_url, source_url or "", tenancy, from_tenancy, api_key or "")
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    except StoreLocked as exc:
        fail(f"{exc}. Stop the daemon, then migrate.")
    except StoreUnavailable as exc:
        fail(f"{exc} ({source_url or to_url})")


def _migrated_lines(results: list[Migrated], dropped: list[str], names: list[str] | None, source_url: str | None,
                    source_layout: str | None) -> None:
    """One line per collection ``migrate`` copied (``migrate.Migrated``: its counts, verified or not, and whether
    its source was dropped), then one per collection of ``names`` the source did not hold."""
    for r in results:
        click.echo(f"{r.collection:<40} {r.points:>8} points  ({r.copied} copied, {r.skipped} already there, "
                   f"{r.files_removed} stale files removed; {r.in_target} in the target"
                   f"{'' if r.verified else ': COUNTS DIFFER'}{', source dropped' if r.collection in dropped else ''})")
    for name in sorted(set(names or ()) - {r.collection for r in results}):
        click.echo(f"{name:<40} not in the source ({source_url}, {source_layout} layout): already moved?")


def _served_agent(config: Path | None, workspace: Path) -> str | None:
    """The agent a daemon answering on the configured port serves ``workspace`` as (its ``root`` collection's
    ``agent`` in ``GET /status``), so ``doctor --workspace`` names it as the daemon does; ``None`` when no daemon
    answers within a second or none serves that path."""
    from indexer.client import Client, ClientError

    settings = settings_from(config, None, None, None, None)
    try:
        with Client(port=settings.port, timeout_s=1.0, token=settings.token or None) as client:
            collections = client.status().get("collections", {})
    except (ClientError, OSError):
        return None
    path = str(workspace.resolve())
    return next((c["agent"] for c in collections.values() if c.get("role") == "root" and c.get("root") == path), None)


@click.command()
@config_opt
@click.option("--workspace", type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="Workspace directory to check; replaces the config's list.")
@click.option("--agent", help="Agent id of --workspace [default: the running daemon's for that path, else main].")
@click.option("--fix", is_flag=True, help="Archive the legacy memory.md and merge its text into MEMORY.md.")
def doctor(config: Path | None, workspace: Path | None, agent: str | None, fix: bool) -> None:
    """Check each workspace for a split root memory (MEMORY.md and memory.md as two files),
    warn about workspaces that overlap (one nested in another's memory/), report extra paths
    missing or overlapping memory/ and directories that cannot be listed, and list the roots
    that are polled rather than watched, and why.

    With qdrant_url set, also check the server (read only) for the config's
    collections: the layout, and which Qdrant collection holds each one's points,
    how many. Problems: the server unreachable; points only in the layout
    qdrant_tenancy does not name (the hint names the migrate command); a shared
    collection of this model without the is_tenant index or per-tenant HNSW.
    Information: points a rebuild left in staging; tenants still in a former
    model's shared collection.

    \b
    Only MEMORY.md is indexed; --fix moves memory.md to
    .openclaw-repair/root-memory/<UTC time>/memory.md and, when its text differs,
    appends it to MEMORY.md under a heading naming the archive. Nothing is lost.
    --fix never touches the Qdrant server.
    Exit status: 0 healthy (or repaired), 1 a problem found and not fixed.

    \b
    Examples:
      qmd-indexer doctor --workspace ~/agent
      qmd-indexer doctor --config /etc/qmd-indexer/config.toml --fix
    """
    from indexer.doctor import findings, language_findings
    from indexer.walk import overlaps
    from indexer.workspace import plan_collections

    if workspace is not None and agent is None:
        agent = _served_agent(config, workspace)
    settings = settings_from(config, workspace, agent, None, None)
    need_workspaces(settings)
    problems = 0
    for overlap in overlaps(plan_collections(settings.workspace)):
        click.echo(f"warning: overlapping workspaces: {overlap}")
    found = findings(list(settings.workspace)) + language_findings(list(settings.workspace), settings.prefer)
    if settings.qdrant_url:  # the server's layout: read, never written (nor by --fix)
        from indexer.doctor_store import store_findings

        configure_logging(settings.log_format, "error")
        found += store_findings(settings)
    for finding in found:
        problems += finding.problem
        click.echo(finding.line())
    for ws in settings.workspace:
        problems += _root_memory(ws, fix, flagged=any(f.problem and f.agent == ws.agent for f in found))
    sys.exit(EXIT_FAILURE if problems else EXIT_OK)


def _root_memory(ws: Any, fix: bool, flagged: bool) -> int:
    """``doctor``'s line on workspace ``ws``'s root memory (a ``config.Workspace``): ``ok`` (left out when
    ``flagged``: a problem of this agent was printed already), split (MEMORY.md and memory.md as two files), or,
    with ``fix``, repaired. Returns the problems left: 1 for a split not fixed, else 0."""
    from indexer.doctor import find_split, fix_split

    legacy = find_split(ws)
    if legacy is None:
        if not flagged:
            click.echo(f"{ws.agent}: ok ({ws.path})")
        return 0
    if not fix:
        click.echo(f"{ws.agent}: split root memory: {legacy} and MEMORY.md are different files; "
                   f"only MEMORY.md is indexed. Run with --fix to archive and merge it.")
        return 1
    repair = fix_split(ws)
    if repair is None:  # repaired by someone else since find_split
        click.echo(f"{ws.agent}: ok ({ws.path})")
        return 0
    merged = "its text appended to MEMORY.md" if repair.merged else "same text as MEMORY.md"
    click.echo(f"{ws.agent}: repaired: {legacy.name} archived to {repair.archived_to} ({merged})")
    return 0


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of plugin records.")
@config_opt
def plugins(as_json: bool, config: Path | None) -> None:
    """List every installed plugin: group, name, distribution and version, what it provides, status.

    \b
    Plugins are found through the entry-point groups qmd_indexer.classifiers,
    qmd_indexer.extractors, qmd_indexer.embedders and qmd_indexer.rerankers; no
    model is loaded to list them. A plugin that fails to load is listed as failed
    with the reason. Status: loaded, failed, disabled (not in the `plugins`
    allow-list), unused (lost a `prefer` choice, a reranker other than the
    one the `reranker` setting names, or a media plugin that cannot load while
    no workspace indexes its media: the reason says what it needs).
    """
    from indexer.errors import ConfigError
    from indexer.plugins import load_registry, plugin_configs

    settings = settings_from(config, None, None, None, None)
    configure_logging("json" if as_json else settings.log_format, "critical" if as_json else "error")
    try:
        registry = load_registry(settings.plugins, plugin_configs(settings), settings.prefer,
                                 reranker=settings.reranker)
    except ConfigError as exc:
        fail(f"config error: {exc}", EXIT_USAGE)
    # a media plugin that cannot load (its model not on disk) while no workspace indexes its media is not failing
    # anything: unused, saying what it would need (a workspace enabling the kind keeps it "failed")
    enabled = {kind for w in settings.workspace if w.multimodal.enabled for kind in w.multimodal.modalities}
    records = []
    for record in registry.records:
        shown = record.as_dict()
        if record.status == "failed" and record.media and not ({"all", *record.media} & enabled):
            shown["status"] = "unused"
            shown["reason"] = f"no workspace indexes {', '.join(record.media)}; to use it: {record.reason}"
        records.append(shown)
    if as_json:
        click.echo(json.dumps(records, indent=2))
        return
    click.echo(f"{'group':<12} {'name':<24} {'distribution':<28} {'provides':<16} status")
    for r in records:
        dist = f"{r['distribution']} {r['version']}"
        group = r["group"].rsplit(".", 1)[-1]
        line = f"{group:<12} {r['name']:<24} {dist:<28} {', '.join(r['provides']):<16} {r['status']}"
        click.echo(line + (f" ({r['reason']})" if r["reason"] else ""))


#: the commands above, in the order ``indexer.cli`` adds them to its group
COMMANDS = (run, index, migrate, doctor, plugins)
