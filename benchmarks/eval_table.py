"""One table of retrieval quality from the JSON files ``make eval`` writes: convmem (by category), the devvault dev
set, SciFact, exact codewords, and the ``relevant`` flag's confusion counts.

Run from the repository root after the evaluations: ``python -m benchmarks.eval_table`` (``--help``). A file that is
missing (its evaluation was not run, or its data set is absent) is said on its row; the exit status is 0 either way.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CATEGORIES = (("1", "multi-hop"), ("2", "temporal"), ("3", "open-domain"), ("4", "single-hop"))
FILES = {"convmem": REPO / ".convmem" / "convmem.json", "devvault": REPO / ".devvault" / "devvault.json",
         "scifact": REPO / ".eval" / "scifact.json", "codewords": REPO / ".codewords" / "codewords.json"}


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _convmem(label: str, r: dict[str, Any]) -> str:
    o = r["ALL"]
    cats = "  ".join(f"{name} {r[c]['hit@5']:.3f}/{r[c]['recall@5']:.3f}" for c, name in CATEGORIES if c in r)
    return (f"hit@5 {o['hit@5']:.3f}  recall@5 {o['recall@5']:.3f}  nDCG@10 {o['ndcg@10']:.3f}  "
            f"span@5 {o['span@5']:.1f}  |  {cats}")


def _devvault(label: str, r: dict[str, Any]) -> str:
    o = r["overall"]
    return f"nDCG@10 {o['ndcg@10']:.3f}  hit@5 {o['hit@5']:.3f}  recall@10 {o['recall@10']:.3f}"


def _scifact(label: str, m: dict[str, Any]) -> str:
    return f"nDCG@10 {m['ndcg@10']:.4f}  recall@100 {m['recall@100']:.4f}"


def _codewords(label: str, r: dict[str, Any]) -> str:
    found = sum(len(v) for v in r["found"].values())
    return f"in the top 5: {found}/{found + sum(len(v) for v in r['missed'].values())}"


SETS = (("convmem", "convmem", _convmem), ("devvault", "devvault", _devvault), ("scifact", "SciFact", _scifact),
        ("codewords", "codewords", _codewords))


def rows(files: dict[str, Path]) -> list[str]:
    """The table's lines: one per set and method, then the relevance counts."""
    out = [f"{'set':<10} {'run':<22} figures"]
    loaded = {}
    for key, name, line in SETS:
        loaded[key] = data = _load(files[key])
        if data is None:
            out.append(f"{name:<10} {'-':<22} not run ({files[key]} missing)")
            continue
        out.extend(f"{name:<10} {label.removeprefix('product '):<22} {line(label, r)}"
                   for label, r in data["results"].items())
    for label, (said, right) in (loaded["convmem"] or {}).get("relevant", {}).items():
        if right:
            out.append(f"{'relevant':<10} {'convmem ' + label.removeprefix('product '):<22} true on {said}/{right}"
                       " questions whose top hit is right")
    for label, (caught, neg, said, right) in (loaded["devvault"] or {}).get("relevant", {}).items():
        out.append(f"{'relevant':<10} {'devvault ' + label.removeprefix('product '):<22} true on {said}/{right}"
                   f" whose top hit is right; false on {caught}/{neg} unanswerable")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.eval_table", description=__doc__.split("\n\n")[0])
    for name, path in FILES.items():
        parser.add_argument(f"--{name}", type=Path, default=path, help="[%(default)s]")
    args = parser.parse_args(argv)
    print("\n".join(rows({name: getattr(args, name) for name in FILES})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
