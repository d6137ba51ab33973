"""``qmd-indexer init --openclaw``: the daemon's config for the agents of an OpenClaw install, and the lines that
make qmd-indexer their memory (the OpenClaw plugin in ``plugins/openclaw``, docs/openclaw.md).

OpenClaw's config is ``$OPENCLAW_CONFIG_PATH``, else ``<state dir>/openclaw.json``, the state dir being
``$OPENCLAW_STATE_DIR``, else ``~/.openclaw`` (``~`` is ``$OPENCLAW_HOME`` when set). It is JSON5 (comments, unquoted
keys, trailing commas), read by ``read_json5``. Its agents (``agents_of``) are the keys of ``agents.entries`` (or the
``id`` of each entry of the legacy ``agents.list``), lower-cased; with neither, the one implicit agent ``main``. An
agent's workspace is, as OpenClaw resolves it: its entry's ``workspace``; else, for the default agent (the only one,
or the legacy entry marked ``default: true``), ``agents.defaults.workspace``, else ``$OPENCLAW_WORKSPACE_DIR``, else
``<state dir>/workspace``; else, for any other agent, ``<agents.defaults.workspace>/<id>``, else
``<state dir>/workspace-<id>``. Its session transcripts are in ``<state dir>/agents/<id>/sessions``.

The config written (``config_toml``) has one ``[[workspace]]`` per agent with its ``path`` and ``sessions``; two
agents on one workspace path are one workspace (the daemon refuses two), the second served through the plugin's
agent mapping, which the printed lines set.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from indexer.errors import EXIT_USAGE

PLUGIN_ID = "qmd-indexer"
#: the plugin's folder in a checkout (an editable install); a wheel does not carry it
PLUGIN_DIR = Path(__file__).resolve().parent.parent / "plugins" / "openclaw"


class OpenClawConfigError(ValueError):
    """OpenClaw's config cannot be read or has a shape ``init`` does not know."""


@dataclass(frozen=True)
class OpenClawAgent:
    """One OpenClaw agent: its id, workspace and session transcript folder."""

    id: str
    workspace: Path
    sessions: Path


# -- JSON5 ---------------------------------------------------------------------------------------------------------
def read_json5(text: str) -> Any:
    """``text`` (JSON5: comments, unquoted keys, single quotes, trailing commas, hex numbers; the ``json5``
    package) as Python values. Raises ``OpenClawConfigError`` saying where it does not parse."""
    import json5

    try:
        return json5.loads(text)
    except ValueError as exc:
        raise OpenClawConfigError(f"not JSON5: {exc}") from None


# -- OpenClaw's layout ---------------------------------------------------------------------------------------------
def _home(env: Mapping[str, str]) -> Path:
    return Path(env.get("OPENCLAW_HOME") or env.get("HOME") or str(Path.home())).expanduser()


def _user_path(value: str, env: Mapping[str, str]) -> Path:
    """``value`` with a leading ``~`` as OpenClaw's home (``$OPENCLAW_HOME``), made absolute."""
    if value == "~" or value.startswith("~/"):
        value = str(_home(env)) + value[1:]
    return Path(os.path.abspath(os.path.expanduser(value)))


def state_dir(env: Mapping[str, str] = os.environ) -> Path:
    """OpenClaw's state dir: ``$OPENCLAW_STATE_DIR``, else ``~/.openclaw``."""
    override = env.get("OPENCLAW_STATE_DIR", "").strip()
    return _user_path(override, env) if override else _home(env) / ".openclaw"


def config_path(env: Mapping[str, str] = os.environ) -> Path:
    """OpenClaw's config file: ``$OPENCLAW_CONFIG_PATH``, else ``<state dir>/openclaw.json``."""
    override = env.get("OPENCLAW_CONFIG_PATH", "").strip()
    return _user_path(override, env) if override else state_dir(env) / "openclaw.json"


def _agent_id(raw: object) -> str:
    """An agent id as OpenClaw normalises it: lower case, characters outside ``[a-z0-9_-]`` as ``-``."""
    text = str(raw or "").strip().lower()
    return re.sub(r"^-+|-+$", "", re.sub(r"[^a-z0-9_-]+", "-", text))[:64] or "main"


def _table(value: object) -> dict[str, Any]:
    """``value`` when it is an object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _roster(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The configured agent entries, each with its ``id``: ``agents.entries`` (keyed), else ``agents.list``."""
    agents = _table(cfg.get("agents"))
    entries, listed = agents.get("entries"), agents.get("list")
    if isinstance(entries, dict):
        return [{**entry, "id": key} for key, entry in entries.items() if isinstance(entry, dict)]
    if isinstance(listed, list):
        return [entry for entry in listed if isinstance(entry, dict)]
    if entries is not None or listed is not None:
        raise OpenClawConfigError("agents.entries must be an object (agents.list an array)")
    return []


def agents_of(cfg: Mapping[str, Any], env: Mapping[str, str] = os.environ) -> list[OpenClawAgent]:
    """The agents of OpenClaw config ``cfg`` with their workspaces and transcript folders (see the module)."""
    if "$include" in json.dumps(cfg):
        raise OpenClawConfigError("it uses $include, which init does not follow: write the [[workspace]] tables "
                                  "by hand (docs/openclaw.md)")
    state = state_dir(env)
    agents = _table(cfg.get("agents"))
    defaults = _table(agents.get("defaults"))
    shared = str(defaults.get("workspace") or "").strip()
    roster = _roster(cfg) or [{"id": "main"}]
    marked = [e for e in roster if e.get("default") is True] if agents.get("ownership") != "explicit" else []
    owner = _agent_id(marked[0]["id"]) if len(marked) == 1 else _agent_id(roster[0]["id"]) if len(roster) == 1 else ""
    out: list[OpenClawAgent] = []
    for entry in roster:
        agent = _agent_id(entry.get("id"))
        own = str(entry.get("workspace") or "").strip()
        if own:
            workspace = _user_path(own, env)
        elif agent == owner:
            default_ws = env.get("OPENCLAW_WORKSPACE_DIR", "").strip()
            workspace = _user_path(shared or default_ws, env) if shared or default_ws else state / "workspace"
        else:
            workspace = _user_path(shared, env) / agent if shared else state / f"workspace-{agent}"
        if all(a.id != agent for a in out):
            out.append(OpenClawAgent(agent, workspace, state / "agents" / agent / "sessions"))
    return out


def read_agents(path: Path, env: Mapping[str, str] = os.environ) -> list[OpenClawAgent]:
    """The agents of OpenClaw's config file ``path`` (a missing file: OpenClaw's one default agent)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return agents_of({}, env)
    except (OSError, UnicodeDecodeError) as exc:
        raise OpenClawConfigError(f"cannot read it: {exc}") from None
    cfg = read_json5(text)
    if not isinstance(cfg, dict):
        raise OpenClawConfigError("its top level is not an object")
    return agents_of(cfg, env)


# -- what init writes and prints -----------------------------------------------------------------------------------
def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string (the same escapes)


def config_toml(agents: list[OpenClawAgent], source: Path) -> tuple[str, dict[str, str]]:
    """The daemon's config for ``agents`` (read from ``source``), and the agents sharing another's workspace ->
    that agent (to map in the plugin's config)."""
    lines = [f"# qmd-indexer for the OpenClaw agents of {source}, written by `qmd-indexer init --openclaw`.",
             "# Every setting: docs/configuration.md. Run `qmd-indexer init --openclaw --force` after adding agents.",
             ""]
    served: dict[Path, str] = {}
    shared: dict[str, str] = {}
    for agent in agents:
        if agent.workspace in served:
            shared[agent.id] = served[agent.workspace]
            lines.append(f"# agent {agent.id!r} shares {served[agent.workspace]!r}'s workspace: the plugin maps it")
            continue
        served[agent.workspace] = agent.id
        lines += ["[[workspace]]", f"agent = {_toml_string(agent.id)}", f"path = {_toml_string(str(agent.workspace))}",
                  f"sessions = {_toml_string(str(agent.sessions))}", ""]
    return "\n".join(lines).rstrip("\n") + "\n", shared


def next_steps(config: Path, shared: dict[str, str], default_config: bool) -> list[str]:
    """The commands that start the daemon and make it OpenClaw's memory (docs/openclaw.md)."""
    found = (PLUGIN_DIR / "openclaw.plugin.json").is_file()
    plugin = str(PLUGIN_DIR) if found else "path/to/qmd-indexer/plugins/openclaw"  # a wheel does not carry it
    run = "qmd-indexer run" if default_config else f"qmd-indexer run --config {config}"
    steps = [f"{run}   # or: systemctl --user start qmd-indexer",
             f"openclaw plugins install {plugin} --force --accept-capabilities",
             "openclaw config set memory.search.enabled false   # memory-core's own memory_search stays out of the way"]
    steps += [f"openclaw config set plugins.entries.{PLUGIN_ID}.config.agents.{agent} {target}"
              for agent, target in shared.items()]
    return [*steps, "openclaw gateway restart"]


@click.command()
@click.option("--openclaw", "from_openclaw", is_flag=True,
              help="Write one [[workspace]] per agent of OpenClaw's config (its workspace and session transcripts).")
@click.option("--config", "config", type=click.Path(path_type=Path, dir_okay=False),
              help="The config file to write [default: $QMD_INDEXER_CONFIG, else ~/.config/qmd-indexer/config.toml].")
@click.option("--openclaw-config", type=click.Path(path_type=Path, dir_okay=False),
              help="OpenClaw's config [default: $OPENCLAW_CONFIG_PATH, else $OPENCLAW_STATE_DIR/openclaw.json, "
                   "else ~/.openclaw/openclaw.json].")
@click.option("--force", is_flag=True, help="Overwrite the config file if it exists.")
def init(from_openclaw: bool, config: Path | None, openclaw_config: Path | None, force: bool) -> None:
    """Write the daemon's config for an existing agent setup (today: OpenClaw's).

    \b
    Reads OpenClaw's openclaw.json, writes one [[workspace]] per agent (path: its workspace; sessions:
    ~/.openclaw/agents/<id>/sessions), then prints the lines that make the daemon OpenClaw's memory.
    Refuses to overwrite an existing config file without --force.

    \b
    Examples:
      qmd-indexer init --openclaw
      qmd-indexer init --openclaw --config ./qmd.toml --openclaw-config ~/.openclaw/openclaw.json --force
    """
    from indexer.config import ENV_PREFIX
    from indexer.config_load import default_config_path

    if not from_openclaw:
        raise click.UsageError("say what to initialise from: --openclaw (the agents of OpenClaw's openclaw.json)")
    env_config = os.environ.get(ENV_PREFIX + "CONFIG")
    target = config or (Path(env_config) if env_config else default_config_path())
    if target.exists() and not force:
        click.echo(f"qmd-indexer: {target} exists; pass --force to overwrite it, or --config PATH to write another",
                   err=True)
        sys.exit(EXIT_USAGE)
    source = openclaw_config or config_path()
    if not source.exists() and not any(a.workspace.is_dir() for a in agents_of({}, os.environ)):
        click.echo(f"qmd-indexer: no OpenClaw config at {source} and no workspace of OpenClaw's default agent: is "
                   f"OpenClaw set up here (`openclaw setup`)? Name its config with --openclaw-config PATH", err=True)
        sys.exit(EXIT_USAGE)
    try:
        agents = read_agents(source)
    except OpenClawConfigError as exc:
        click.echo(f"qmd-indexer: {source}: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    text, shared = config_toml(agents, source)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    click.echo(f"wrote {target}: {len(agents)} OpenClaw agent(s) from "
               + (str(source) if source.exists() else f"OpenClaw's defaults ({source} does not exist)"))
    for agent in agents:
        missing = "" if agent.workspace.is_dir() else " (no such directory yet)"
        where = f"shares {shared[agent.id]}'s workspace" if agent.id in shared else f"{agent.workspace}{missing}"
        click.echo(f"  {agent.id}: {where}; sessions {agent.sessions}")
    click.echo("Then:")
    for line in next_steps(target, shared, config is None and not env_config):
        click.echo(f"  {line}")
