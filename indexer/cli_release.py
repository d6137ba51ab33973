"""``qmd-indexer release``: end the claims of an agent on a shared Qdrant server (``indexer.store.claims``)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from indexer.cli_options import config_opt, fail, settings_from
from indexer.errors import EXIT_USAGE


@click.command()
@config_opt
@click.option("--agent", "agents", multiple=True, required=True, help="Agent id whose claims to end (repeatable).")
def release(config: Path | None, agents: tuple[str, ...]) -> None:
    """End the claims of --agent on the Qdrant server (qdrant_url), so that another
    daemon may serve that agent: run it once the daemon holding them is gone for good
    (its machine or state directory retired). A daemon whose agent is claimed by
    another refuses it and says so (`agent_claimed_elsewhere`, also in `doctor`);
    restart it after this. A claim never ends by itself. Points are left as they are:
    the new owner's first scan removes files that are not in its workspace.

    \b
    Examples:
      qmd-indexer release --config /etc/qmd-indexer/config.toml --agent carol
    """
    from indexer.errors import StoreUnavailable
    from indexer.state import Plan
    from indexer.statedir import recorded_tenancy
    from indexer.store import ServerOptions, ServerStore

    settings = settings_from(config, None, None, None, None)
    if not settings.qdrant_url:
        fail("release needs qdrant_url: claims live on a shared Qdrant server (the embedded store has none)",
             EXIT_USAGE)
    plan = Plan.of(settings)
    unknown = [a for a in agents if a not in plan.agents()]
    if unknown:
        fail(f"unknown agent {', '.join(map(repr, unknown))}; this config's agents: {', '.join(plan.agents())}",
             EXIT_USAGE)
    options = ServerOptions.from_settings(settings, recorded_tenancy(settings.state_dir, settings.qdrant_url))
    store = ServerStore(settings.qdrant_url, settings.qdrant_api_key, options)
    try:
        released = store.release([c.name for c in plan.collections if c.agent in agents])
    except StoreUnavailable as exc:
        fail(str(exc))
    finally:
        store.close()
    for claim in released:
        since = claim.since()
        click.echo(f"released {claim.collection} (agent {claim.agent!r}, held by {claim.by()} for "
                   f"{claim.workspace} since {since})")
    if not released:
        click.echo(f"no claim of {', '.join(map(repr, agents))} on the server")
    sys.exit(0)
