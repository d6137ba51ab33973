"""Agents that look alike on one Qdrant server: the sequence that once let one agent read another's memory, rerun.

Per tenancy layout (``collections``, ``shared``), on a fresh single node (the pinned binary, started by
``tests/qdrant/nodes.py``, storage under a temporary directory), with the real model and real daemons (each its own
state dir and workspace, as on two machines):

1. ``Bob`` and ``bob`` (then ``alice.smith`` and ``alice_smith``): both index, both rescan; reported: each daemon's
   collection names, its points before and after the other's start and rescans (``deleted``: how many went missing),
   ``file_removed`` lines, and whether each daemon's search answered only from its own workspace.
2. The same id (``carol``) on two daemons: the second's refusal line (quoted whole), and the first's points after
   the second indexed and rescanned.
3. A store named the old way (``sanitise(agent)`` alone: ``memory-dir-mover`` for ``Mover``; ``--notes`` extra notes)
   opened by this release:
   the ``collection_renamed`` lines (points moved, chunks embedded) and what the first index after it embedded.

``python -m benchmarks.agent_claims [--layouts collections shared] [--notes 50]``; prints one JSON line per check
and exits 1 when an agent read another's note, a point was deleted, or the move embedded anything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
QUERY = "what animals are kept"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


class Daemons:
    """Daemons on one server in one layout, sharing one loaded model (``registry``)."""

    def __init__(self, root: Path, url: str, layout: str) -> None:
        self.root, self.url, self.layout = root, url, layout
        self.registry: Any = None
        self.opened: list[Any] = []

    def open(self, name: str, agent: str, fact: str) -> Any:
        from indexer.config import Settings
        from indexer.daemon import Indexer

        ws = self.root / f"ws-{name}"
        _write(ws / "MEMORY.md", f"# Memory\n\nThe private note of {name}: {fact}.\n")
        _write(ws / "memory" / "log.md", f"# Log\n\nToday {name} wrote about {fact} again.\n")
        settings = Settings.model_validate({"state_dir": self.root / f"state-{name}", "qdrant_url": self.url,
                                            "workspace": [{"agent": agent, "path": ws}],
                                            "qdrant_tenancy": self.layout})
        daemon = Indexer.open(settings, registry=self.registry)
        self.registry = daemon.registry
        self.opened.append(daemon)
        return daemon

    def close(self) -> None:
        for daemon in self.opened:
            daemon.store.close()


def counts(daemon: Any) -> dict[str, int]:
    return {c.name: daemon.store.count(c.name) for c in daemon.collections}


def own_only(daemon: Any, agent: str, own: str, other: str) -> bool:
    from indexer.search import SearchParams

    hits = daemon.view.searcher().search(SearchParams(QUERY, k=10, agent=agent))
    return bool(hits) and any(own in h["snippet"] for h in hits) and not any(other in h["snippet"] for h in hits)


def look_alike(d: Daemons, first: str, second: str) -> dict[str, Any]:
    from structlog.testing import capture_logs

    from indexer.worker import index_once

    with capture_logs() as logs:
        one = d.open(f"{first}-1", first, "keeps bees")
        index_once(one)
        before = counts(one)
        two = d.open(f"{second}-2", second, "keeps goats")
        index_once(two)
        for daemon in (one, two):
            daemon.scan("periodic")
        after = counts(one)
    removed = [e for e in logs if e["event"] == "file_removed"]
    return {"check": "look_alike", "layout": d.layout, "agents": [first, second],
            "names": [[c.name for c in one.collections], [c.name for c in two.collections]],
            "points_first_before": sum(before.values()), "points_first_after": sum(after.values()),
            "deleted": sum(before.values()) - sum(after.values()), "file_removed": len(removed),
            "first_answers_own_only": own_only(one, first, "bees", "goats"),
            "second_answers_own_only": own_only(two, second, "goats", "bees")}


def same_id(d: Daemons) -> dict[str, Any]:
    from structlog.testing import capture_logs

    from indexer.worker import index_once

    one = d.open("carol-1", "carol", "keeps bees")
    index_once(one)
    before = counts(one)
    with capture_logs() as logs:
        two = d.open("carol-2", "carol", "keeps goats")
        index_once(two)
        two.scan("periodic")
    refusal = [e for e in logs if e["event"] == "agent_claimed_elsewhere"]
    return {"check": "same_id", "layout": d.layout, "refusal": refusal, "second_serves": two.state.plan.agents(),
            "points_first_before": sum(before.values()), "points_first_after": sum(counts(one).values()),
            "deleted": sum(before.values()) - sum(counts(one).values()),
            "first_answers_own_only": own_only(one, "carol", "bees", "goats")}


def moved(d: Daemons, notes: int) -> dict[str, Any]:
    from structlog.testing import capture_logs

    from indexer.worker import index_once

    old = d.open("Mover", "Mover", "keeps bees")
    for n in range(notes):  # a store worth moving: ``notes`` more notes, a few chunks each
        _write(d.root / "ws-Mover" / "memory" / f"note{n}.md", f"# Note {n}\n\n" + "\n\n".join(
            f"## Part {k}\n\nOn day {n} the mover noted fact {k}: the bees of hive {n % 7} swarmed." for k in range(4)))
    former = replace(old.state.plan, collections=tuple(replace(c, name=c.former, former="")
                                                        for c in old.collections))
    old.connect(former)  # as the release before slugs named them
    index_once(old)
    stored = counts(old)
    old.store.close()
    d.opened.remove(old)
    with capture_logs() as logs:
        new = d.open("Mover", "Mover", "keeps bees")
        embedded = new.pipeline.stats.chunks_embedded
        index_once(new)
    renamed = [e for e in logs if e["event"] == "collection_renamed"]
    return {"check": "moved", "layout": d.layout, "former": stored, "renamed": renamed,
            "points_moved": sum(e["points_moved"] for e in renamed),
            "chunks_embedded": sum(e["chunks_embedded"] for e in renamed),
            "embedded_by_first_index_after": new.pipeline.stats.chunks_embedded - embedded,
            "points_now": counts(new)}


def run(layout: str, notes: int) -> list[dict[str, Any]]:
    sys.path.insert(0, str(REPO / "tests"))  # the Qdrant node starter the tests use (no pytest in it)
    from qdrant import nodes

    with tempfile.TemporaryDirectory() as tmp, nodes.running(nodes.make_node(Path(tmp) / "node")) as node:
        d = Daemons(Path(tmp), node.url, layout)
        try:
            return [look_alike(d, "Bob", "bob"), look_alike(d, "alice.smith", "alice_smith"), same_id(d),
                    moved(d, notes)]
        finally:
            d.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", nargs="+", default=["collections", "shared"])
    parser.add_argument("--notes", type=int, default=50, help="extra notes in the store that is moved")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(REPO / "tests"))
    from qdrant import nodes

    reason = nodes.missing()
    if reason:
        print(f"the Qdrant server binary is missing: {reason}", file=sys.stderr)
        return 2
    bad = False
    for layout in args.layouts:
        for row in run(layout, args.notes):
            print(json.dumps(row, default=str), flush=True)
            bad |= bool(row.get("deleted")) or row.get("first_answers_own_only") is False
            bad |= row.get("second_answers_own_only") is False or bool(row.get("chunks_embedded"))
            bad |= bool(row.get("embedded_by_first_index_after"))
            bad |= row["check"] == "same_id" and (len(row["refusal"]) != 1 or bool(row["second_serves"]))
    print(f"load average: {os.getloadavg()}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
