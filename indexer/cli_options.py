"""What every ``qmd-indexer`` command shares: the ``--config``, ``--port`` and workspace options, settings from flags
(``settings_from``), the one-line failure (``fail``), the private umask (``private_files``) and the check that a
workspace is configured (``need_workspaces``). The commands are ``indexer.cli``'s (they ask a running daemon),
``indexer.cli_local``'s (they work in this process) and ``indexer.cli_release``'s.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from indexer.errors import EXIT_FAILURE, EXIT_USAGE

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Print ``qmd-indexer: <message>`` on stderr and exit with ``code`` (``indexer.errors``' EXIT_*)."""
    click.echo(f"qmd-indexer: {message}", err=True)
    sys.exit(code)


def settings_from(config: Path | None, workspace: Path | None, agent: str | None, state_dir: Path | None,
                  port: int | None, qdrant_url: str | None = None, extra: tuple[Path, ...] = (),
                  host: str | None = None, append: bool = False, sessions: Path | None = None) -> Any:
    """``load_settings(config, overrides)`` with the flags as overrides (``None``: not given); ``--workspace``
    replaces the config's workspaces with one (taking appends with ``append``, its transcripts from ``sessions``).
    Exits 2 (``fail``) on a config error or ``--agent``/``--extra-path``/``--sessions``/``--append`` without
    ``--workspace``."""
    from indexer.config_load import load_settings
    from indexer.errors import ConfigError

    overrides: dict[str, Any] = {"state_dir": state_dir, "port": port, "qdrant_url": qdrant_url, "host": host}
    if workspace is not None:
        overrides["workspace"] = [{"agent": agent or "main", "path": workspace, "extra_paths": list(extra),
                                   "append": append, "sessions": sessions and sessions.expanduser().absolute()}]
    elif agent is not None or extra or append or sessions is not None:
        fail("--agent, --extra-path, --sessions and --append need --workspace (in a config file: the [[workspace]] "
             "table's agent, extra_paths, sessions and append = true)", EXIT_USAGE)
    try:
        return load_settings(config, overrides)
    except ConfigError as exc:
        fail(f"config error: {exc}", EXIT_USAGE)


def private_files() -> None:
    """Set this process's umask to 077 before anything writes the state dir: every file and directory the store
    (Qdrant Edge segments and WAL), the embedding cache (SQLite) and the daemon create is 0600/0700, readable by
    this user alone (they hold the notes' text). ``hold_state_lock`` also tightens an existing loose state dir."""
    import os

    os.umask(0o077)


def need_workspaces(settings: Any) -> None:
    """Exit 2 (``fail``) when ``settings`` has no workspace."""
    if not settings.workspace:
        fail("no workspace configured: pass --workspace PATH [--agent ID], or add [[workspace]] tables to the "
             "config file (see `qmd-indexer run --help`)", EXIT_USAGE)


config_opt = click.option("--config", "config", type=click.Path(path_type=Path, dir_okay=False),
                          help="TOML config file [env QMD_INDEXER_CONFIG; default ~/.config/qmd-indexer/config.toml]")
port_opt = click.option("--port", type=click.IntRange(1, 65535), help="HTTP API port on 127.0.0.1 [default 8743]")


def workspace_opts(fn: F) -> F:
    """``fn`` with ``--config``, ``--workspace``, ``--agent``, ``--state-dir``, ``--qdrant-url``, ``--extra-path``,
    ``--sessions``."""
    fn = click.option("--sessions", type=click.Path(path_type=Path, file_okay=False),
                      help="The agent's folder of session transcripts (OpenClaw: ~/.openclaw/agents/<id>/sessions); "
                           "searched with --corpus sessions or all, named sessions/<file>.jsonl.")(fn)
    fn = click.option("--extra-path", "extra", multiple=True, type=click.Path(path_type=Path),
                      help="Extra memory file or directory (repeatable), absolute or workspace-relative.")(fn)
    fn = click.option("--qdrant-url", help="Qdrant server URL; empty = embedded Qdrant Edge under the state dir.")(fn)
    fn = click.option("--state-dir", type=click.Path(path_type=Path, file_okay=False),
                      help="Where the embedded store and embedding cache live "
                           "[default $XDG_STATE_HOME/qmd-indexer, else ~/.local/state/qmd-indexer].")(fn)
    fn = click.option("--agent", help="Agent id of --workspace [default main].")(fn)
    fn = click.option("--workspace", type=click.Path(path_type=Path, file_okay=False, exists=True),
                      help="Agent workspace directory (holds MEMORY.md and memory/); replaces the config's list.")(fn)
    return config_opt(fn)
