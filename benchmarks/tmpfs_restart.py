"""What a restart allocates in an embedded store on tmpfs, file by file.

Not a test and not part of ``make bench``: a probe of the store's growth at a restart on tmpfs (docs/performance.md,
"Qdrant Edge"). It writes ``--notes`` small notes into a temporary workspace, runs ``qmd-indexer index --once`` on
it with the state dir in a fresh folder under ``--tmpfs`` (the first start: it creates the collections), records
each file under ``<state_dir>/qdrant`` (apparent size and allocated bytes, ``st_blocks * 512``), runs the same
command again (a restart: it loads the shards and finds nothing to change) and records them again. Prints the
allocated bytes before and after per kind of file (vectors, payload indexes, payload, sparse vectors, id tracker,
WAL, ...), the files that grew most, and the totals. The folders are removed afterwards.

Run from the repository root, e.g.::

    python -m benchmarks.tmpfs_restart --notes 16
    python -m benchmarks.tmpfs_restart --notes 16 --json .bench/tmpfs-restart.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MIB = 1024 * 1024

# the kind of a store file, by Qdrant's segment layout (first match)
KINDS = (
    ("payload index", r"/payload_index/"),
    ("payload storage", r"/payload_storage/"),
    ("sparse vectors", r"/vector_storage-bm25/|/vector_index-bm25/"),
    ("dense vectors", r"/vector_storage-|/vector_index-"),
    ("id tracker", r"/id_tracker|/mutable_id_tracker|/id_"),
    ("WAL", r"(^|/)wal/"),
)


def kind(rel: str) -> str:
    """The kind of store file ``rel`` (a path relative to ``<state_dir>/qdrant``); "other" when none matches."""
    for name, pattern in KINDS:
        if re.search(pattern, "/" + rel):
            return name
    return "other"


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """``relative path -> (apparent bytes, allocated bytes)`` of every regular file under ``folder``."""
    out = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        if path.is_file() and not path.is_symlink():
            out[str(path.relative_to(folder))] = (st.st_size, st.st_blocks * 512)
    return out


def index_once(workspace: Path, state: Path) -> None:
    """``qmd-indexer index --once`` on ``workspace`` with the state dir ``state`` (fp32: no int8 export to wait for)."""
    env = {**os.environ, "QMD_INDEXER_PRECISION": "fp32", "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-m", "indexer", "index", "--once", "--workspace", str(workspace),
                    "--agent", "main", "--state-dir", str(state)], env=env, check=True, capture_output=True)


def write_notes(workspace: Path, notes: int) -> None:
    """``MEMORY.md`` and ``notes - 1`` notes under ``memory/``, a few paragraphs each."""
    (workspace / "memory").mkdir(parents=True)
    (workspace / "MEMORY.md").write_text("# Memory\n\nThe user prefers short answers and deploys on Tuesdays.\n")
    for i in range(notes - 1):
        body = "\n\n".join(f"Paragraph {j} of note {i}: the build of service {i} failed at step {j}; the fix was "
                           f"to pin version {i}.{j} and rerun the pipeline." for j in range(6))
        (workspace / "memory" / f"note-{i:02d}.md").write_text(f"# Note {i}\n\n{body}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notes", type=int, default=16)
    parser.add_argument("--tmpfs", type=Path, default=Path("/dev/shm"), help="a tmpfs folder [/dev/shm]")
    parser.add_argument("--json", type=Path, help="also write the per-file records here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qmd-tmpfs-ws-") as ws, \
            tempfile.TemporaryDirectory(prefix="qmd-tmpfs-state-", dir=args.tmpfs) as state_dir:
        workspace, state = Path(ws), Path(state_dir)
        write_notes(workspace, args.notes)
        index_once(workspace, state)
        before = snapshot(state / "qdrant")
        index_once(workspace, state)
        after = snapshot(state / "qdrant")
        shutil.rmtree(state / "qdrant", ignore_errors=True)
    rows = []
    for rel in sorted(set(before) | set(after)):
        size, was = before.get(rel, (0, 0))
        size, now = after.get(rel, (size, was))
        rows.append({"file": rel, "kind": kind(rel), "apparent": size, "before": was, "after": now})
    by_kind: dict[str, list[int]] = {}
    for row in rows:
        totals = by_kind.setdefault(row["kind"], [0, 0, 0, 0])
        totals[0] += 1
        totals[1] += row["apparent"]
        totals[2] += row["before"]
        totals[3] += row["after"]
    print(f"{args.notes} notes, state dir on {args.tmpfs}: allocated MiB per kind of file, first start -> restart")
    print(f"{'kind':16s} {'files':>5s} {'apparent':>9s} {'start':>8s} {'restart':>8s} {'grown':>8s}")
    for name, (files, apparent, was, now) in sorted(by_kind.items(), key=lambda kv: kv[1][2] - kv[1][3]):
        print(f"{name:16s} {files:5d} {apparent / MIB:9.1f} {was / MIB:8.2f} {now / MIB:8.2f} {(now - was) / MIB:8.2f}")
    total = [sum(r[k] for r in rows) for k in ("apparent", "before", "after")]
    print(f"{'total':16s} {len(rows):5d} {total[0] / MIB:9.1f} {total[1] / MIB:8.2f} {total[2] / MIB:8.2f} "
          f"{(total[2] - total[1]) / MIB:8.2f}")
    print("files that grew most (MiB):")
    for row in sorted(rows, key=lambda r: r["before"] - r["after"])[:12]:
        if row["after"] > row["before"]:
            print(f"  {(row['after'] - row['before']) / MIB:6.2f}  {row['file']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
