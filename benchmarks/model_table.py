"""Every public memory set x {MiniLM, e5} in one run: quality, first index time and peak RSS, one row each.

Run from the repository root: ``python -m benchmarks.model_table`` (``--help`` for options). Each row is one child
process, run one after the other so their resident sets and CPU do not mix:

    python -m benchmarks.<set>_eval --model <model> --modes hybrid --state <state>/<model> --json <row>.json

(``devvault``: documentation-like notes; ``convmem``: daily conversation logs as notes; ``sessmem``: session
transcripts through the transcript source; ``zhmem``: notes in Chinese, questions in Chinese and English). The row
reads the child's summary (hybrid, the product's search: nDCG@10, hit@5, recall@5 where the set's scorer has it,
recall@10 for devvault; zhmem's hit@5 per question language too), its first index in seconds (chunks embedded, none
from the cache: each model has its own ``--state``, cleared first unless ``--keep``) and its peak resident set
(``ru_maxrss`` of the child, MiB). The load average is printed beside each row: on a shared machine the seconds are
only comparable within one run.

A set missing under ``../shared/data`` is said on stderr and skipped (the sets are not part of the repository).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = next((p / "shared" / "data" for p in (REPO.parent, REPO.parent.parent)
                     if (p / "shared" / "data").is_dir()), REPO.parent / "shared" / "data")
SETS = ("devvault", "convmem", "sessmem", "zhmem")
KIND = {"devvault": "notes (docs-like)", "convmem": "notes (conversation logs)", "sessmem": "transcripts",
        "zhmem": "notes (Chinese)"}
METRICS = ("ndcg@10", "hit@5", "recall@5", "recall@10")


def hybrid_label(results: dict[str, Any]) -> str:
    """The label of the product's default search among a summary's runs (``product hybrid``, or devvault's
    ``product hybrid dbsf``)."""
    return next(k for k in results if k in ("product hybrid", "product hybrid dbsf"))


def overall(results: dict[str, Any]) -> dict[str, float]:
    """The hybrid run's overall metrics from a child's ``--json`` summary (each set's scorer names its overall row
    differently: ``overall``, ``all``, or the metrics at the top)."""
    run = results[hybrid_label(results)]
    for key in ("overall", "ALL", "all", "total"):
        if isinstance(run.get(key), dict):
            run = run[key]
            break
    return {m: float(run[m]) for m in METRICS if isinstance(run.get(m), int | float)}


def one_row(name: str, model: str, data: Path, state: Path, keep: bool) -> dict[str, Any] | None:
    """Run one child (see the module) and return its row; ``None`` (said on stderr) when it failed."""
    folder = state / model / name
    if folder.exists() and not keep:
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "summary.json"
    command = [sys.executable, "-m", f"benchmarks.{name}_eval", "--data", str(data / name), "--model", model,
               "--state", str(folder), "--json", str(out)]
    command += ["--no-baselines"] if name == "devvault" else ["--modes", "hybrid"]  # devvault runs every mode
    load = os.getloadavg()[0]
    began = time.monotonic()
    log = folder / "stderr.log"
    with open(log, "w", encoding="utf-8") as err:
        child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)  # reaped here, so its own peak RSS is read
    code = os.waitstatus_to_exitcode(status)
    if code != 0 or not out.exists():
        print(f"model_table: {name} with {model} failed (exit {code}): "
              f"{log.read_text(encoding='utf-8').strip()[-400:]}", file=sys.stderr)
        return None
    summary = json.loads(out.read_text())
    index = summary.get("index", {})
    hybrid = summary["results"][hybrid_label(summary["results"])]
    by_lang = " / ".join(f"{lang} {v['hit@5']:.3f}" for lang, v in hybrid.get("by_lang", {}).items())
    return {"set": name, "kind": KIND[name], "model": model, **overall(summary["results"]),
            "hit@5 by language": by_lang,
            "index_s": index.get("seconds"), "chunks": index.get("chunks"), "wall_s": round(time.monotonic() - began),
            "rss_mib": round(usage.ru_maxrss / 1024, 1), "load": f"{load:.1f}-{os.getloadavg()[0]:.1f}"}


def print_table(rows: Sequence[dict[str, Any]]) -> None:
    print(f"{'set':<10}{'kind':<27}{'model':<8}{'nDCG@10':>9}{'hit@5':>7}{'rec@5':>7}{'rec@10':>7}"
          f"{'chunks':>8}{'index s':>9}{'RSS MiB':>9}  load")
    for r in rows:
        cells = [f"{r[m]:.3f}" if m in r else "-" for m in METRICS]
        print(f"{r['set']:<10}{r['kind']:<27}{r['model']:<8}{cells[0]:>9}{cells[1]:>7}{cells[2]:>7}{cells[3]:>7}"
              f"{r['chunks'] or '-':>8}{r['index_s'] or '-':>9}{r['rss_mib'] or '-':>9}  {r['load']}"
              + (f"  hit@5 {r['hit@5 by language']}" if r["hit@5 by language"] else ""))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding the sets [%(default)s]")
    parser.add_argument("--state", type=Path, default=REPO / ".model-table", help="indexes [%(default)s]")
    parser.add_argument("--sets", default=",".join(SETS), help="sets, in this order [%(default)s]")
    parser.add_argument("--models", default="minilm,e5", help="models, in this order [%(default)s]")
    parser.add_argument("--keep", action="store_true", help="keep earlier indexes (then index_s is not a first index)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = []
    for name in [s for s in args.sets.split(",") if s]:
        if name not in SETS:
            print(f"model_table: unknown set {name!r} (known: {', '.join(SETS)})", file=sys.stderr)
            return 2
        if not (args.data / name / "queries.jsonl").exists():
            print(f"model_table: {name} skipped: {args.data / name}/queries.jsonl not found (the public sets live "
                  f"in {DEFAULT_DATA}; pass --data DIR)", file=sys.stderr)
            continue
        for model in [m for m in args.models.split(",") if m]:
            row = one_row(name, model, args.data.resolve(), args.state.resolve(), args.keep)
            if row is not None:
                rows.append(row)
                print(f"model_table: {name} {model} done in {row['wall_s']} s", file=sys.stderr, flush=True)
    print(f"\nmodel table; QMD_INDEXER_PRECISION={os.environ.get('QMD_INDEXER_PRECISION', 'auto')}; "
          f"{os.cpu_count()} CPUs")
    print_table(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
