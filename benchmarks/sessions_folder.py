"""A big sessions folder indexed by a real daemon: time, memory, and what a restart reads and embeds again.

Run from the repository root: ``python -m benchmarks.sessions_folder`` (``--help`` for options). The default is the
folder of openclaw/openclaw#85398 (an agent's ``sessions/`` of 632 transcripts and 590 trajectory files, 966 MB):
1,000 OpenClaw transcripts, about 500 MB in all; ``--count 100 --mb 50`` is a quick run.

1. **The folder** (``--state``/``folder-<count>-<mb>``, kept and reused while its parameters match): each transcript
   a ``session`` header, then exchanges: a user message, the assistant's thinking, its reply, and tool calls whose
   results (file reads, command output) fill the transcript to its size. Sizes vary 0.2x-3x around the mean;
   text turns scale with the size (about one per ``--bytes-per-turn``). Turn texts come from the convmem dev set's
   conversations (``../shared/data/convmem``) when present, else are generated; the run says which. Timestamps
   advance through each session, so its windows are all distinct (the embedding cache spares nothing).
2. **First index**: ``qmd-indexer run`` (``harness.Daemon``, a config file naming the workspace's ``sessions``
   folder; fresh state dir) until ready, with a progress bar of transcripts indexed out of the folder's (read from
   ``GET /status``; the daemon's own bar draws only on its terminal). Seconds to ready, the daemon's CPU seconds,
   peak RSS (``VmHWM``, and psutil's sampled peak), chunks embedded, sessions and turns (``status.sessions``).
3. **Restart, nothing changed**: SIGTERM, start again, until ready: the transcripts read again (``file_indexed``
   lines of the second run: bytes and JSONL lines parsed, ``read_bytes``/``read_lines``) and chunks embedded.
4. **Restart after appends while down**: ``--grow`` transcripts (default 10%) each get two turns appended while the
   daemon is stopped; start again: bytes and lines parsed, chunks embedded and cache hits, against what the first
   index parsed of those same files (the cost of re-chunking them whole, measured in the same run).

Prints a table and the load average. Needs psutil and tqdm (both dependencies of the product or its dev extra).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO, SHARED, Daemon, log, wait_until

SESSIONS = "sessions-main"
CONVMEM = [d / "convmem" for d in SHARED]
WORDS = ("garden ferry invoice violin harbor lantern pottery canyon museum recipe glacier bicycle festival library "
         "orchard telescope marathon workshop meadow deploy cache shard budget travel review").split()


# -- the folder ----------------------------------------------------------------------------------------------------
def turn_texts(seed: int = 0) -> tuple[list[tuple[str, str]], str]:
    """``(speaker, text)`` turns: the convmem conversations' ``- Name: text`` lines, else generated; and the source."""
    for root in CONVMEM:
        files = sorted(root.glob("agents/*/memory/*.md"))
        turns = [(m[1], m[2]) for f in files for m in re.finditer(r"^- ([A-Z][a-z]+): (.+)$", f.read_text(), re.M)]
        if len(turns) >= 100:
            return turns, f"{root} ({len(turns)} turns)"
    rng = random.Random(seed)
    made = [(rng.choice(["Caroline", "Melanie"]), " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30)))
             + ".") for _ in range(2000)]
    return made, "generated (../shared/data/convmem not found)"


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


def _message(n: int, t: float, role: str, content: Any) -> str:
    return json.dumps({"type": "message", "id": f"m{n}", "timestamp": _stamp(t),
                       "message": {"role": role, "content": content}}) + "\n"


def write_transcript(path: Path, size: int, turns: list[tuple[str, str]], bytes_per_turn: int,
                     rng: random.Random, start: float) -> int:
    """An OpenClaw transcript of about ``size`` bytes; returns its text turns (user and assistant messages)."""
    text_turns = max(2, size // bytes_per_turn)
    tool_bytes = max(0, size - text_turns * 600) // max(1, text_turns // 2)  # per exchange: its tool results
    t, n, said = start, 0, 0
    with open(path, "w", encoding="utf-8") as out:
        out.write(json.dumps({"type": "session", "version": 3, "id": path.stem, "timestamp": _stamp(t),
                              "cwd": "/home/agent"}) + "\n")
        out.write(json.dumps({"type": "model_change", "id": "c0", "timestamp": _stamp(t), "provider": "ollama",
                              "modelId": "qwen3"}) + "\n")
        while said < text_turns:
            speaker, text = turns[rng.randrange(len(turns))]
            t += rng.uniform(20, 400)
            n += 1
            out.write(_message(n, t, "user", [{"type": "text", "text": f"{speaker}: {text}"}]))
            said += 1
            n += 1
            out.write(_message(n, t + 2, "assistant", [{"type": "thinking", "thinking": "Let me check. " * 20},
                                                       {"type": "toolCall", "id": f"k{n}", "name": "read",
                                                        "arguments": {"path": f"notes/{n}.md"}}]))
            left = tool_bytes
            while left > 0:  # results in pieces of at most 64 KiB (a file read, a command's output)
                piece = min(left, 65536)
                n += 1
                body = " ".join(rng.choice(WORDS) for _ in range(int(piece / 7.5)))  # 7.5: a word and its space
                out.write(_message(n, t + 3, "toolResult", [{"type": "text", "text": body}]))
                left -= piece
            speaker, text = turns[rng.randrange(len(turns))]
            n += 1
            out.write(_message(n, t + 5, "assistant", [{"type": "text", "text": text}]))
            said += 1
    return said


def make_folder(root: Path, count: int, mb: float, bytes_per_turn: int, seed: int) -> dict[str, Any]:
    """The folder under ``root`` (reused when ``root/folder.json`` records the same parameters)."""
    params = {"count": count, "mb": mb, "bytes_per_turn": bytes_per_turn, "seed": seed, "version": 2}
    marker = root / "folder.json"
    if marker.exists():
        made = json.loads(marker.read_text())
        if made.get("params") == params:
            return dict(made)
    shutil.rmtree(root, ignore_errors=True)
    sessions = root / "sessions"
    sessions.mkdir(parents=True)
    (root / "ws").mkdir()
    (root / "ws" / "MEMORY.md").write_text("# Memory\n")
    turns, source = turn_texts(seed)
    rng = random.Random(seed)
    mean = mb * 2**20 / count
    sizes = [rng.uniform(0.2, 3.0) for _ in range(count)]
    scale = mean * count / sum(sizes)
    total_turns = 0
    started = time.monotonic()
    for i, s in enumerate(sizes):
        name = f"{random.Random(seed * 100003 + i).getrandbits(128):032x}"
        session = f"{name[:8]}-{name[8:12]}-{name[12:16]}-{name[16:20]}-{name[20:]}"
        total_turns += write_transcript(sessions / f"{session}.jsonl", int(s * scale), turns, bytes_per_turn, rng,
                                        1_700_000_000.0 + i * 86400)
    (sessions / "sessions.json").write_text(json.dumps({f"agent:main:{i}": {"sessionId": p.stem}
                                                       for i, p in enumerate(sorted(sessions.glob("*.jsonl")))}))
    made = {"params": params, "source": source, "turns": total_turns,
            "bytes": sum(p.stat().st_size for p in sessions.glob("*.jsonl"))}
    marker.write_text(json.dumps(made))
    log(f"folder: {count} transcripts, {made['bytes'] / 2**20:.0f} MB, {total_turns} text turns, written in "
        f"{time.monotonic() - started:.0f} s")
    return made


# -- the daemon ----------------------------------------------------------------------------------------------------
def _config(root: Path, state: Path) -> Path:
    path = root / "config.toml"
    path.write_text(f'state_dir = "{state}"\n\n[[workspace]]\nagent = "main"\npath = "{root / "ws"}"\n'
                    f'sessions = "{root / "sessions"}"\n')
    return path


def _transcripts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == "file_indexed" and e.get("kind") == "transcript"]


def run_daemon(root: Path, state: Path, name: str, count: int, bar: bool) -> dict[str, Any]:
    """Start the daemon, wait until ready (a progress bar of transcripts indexed), stop it; what it did."""
    daemon = Daemon(root / "ws", state, root / f"{name}.log", sample_rss=True, config=_config(root, state))
    progress = None
    if bar:
        from tqdm import tqdm

        progress = tqdm(total=count, unit="transcript", desc=name, file=sys.stderr)

    def ready() -> bool:
        if progress is not None:
            try:
                files = daemon.get("/status")["collections"][SESSIONS]["files"]
                progress.update(files - progress.n)
            except Exception:  # not listening yet
                pass
        return daemon._ready()

    try:
        wait_until(ready, 3600, 0.5, "daemon ready")
        seconds = time.monotonic() - daemon.started
        status = daemon.get("/status")
        if progress is not None:
            progress.update(status["collections"][SESSIONS]["files"] - progress.n)
        out = {"seconds": seconds, "cpu_s": daemon.cpu_s(), "rss_peak": daemon.rss_peak(),
               "rss_sampled": daemon.sampled_peak, "status": status}
    finally:
        if progress is not None:
            progress.close()
        code = daemon.stop()
    events = daemon.events()
    out["exit"] = code
    out["indexed"] = _transcripts(events)
    out["startup"] = next((e for e in events if e.get("event") == "startup"), {})
    return out


def grow(sessions: Path, n: int, seed: int) -> list[Path]:
    """Two turns appended to ``n`` transcripts (the largest first, then by name), as a session that went on."""
    paths = sorted(sessions.glob("*.jsonl"), key=lambda p: (-p.stat().st_size, p.name))[:n]
    for i, path in enumerate(paths):
        with open(path, "a", encoding="utf-8") as out:
            t = 1_800_000_000.0 + i
            out.write(_message(900_001, t, "user", [{"type": "text", "text": f"Caroline: one more thing, {i}."}]))
            out.write(_message(900_002, t + 5, "assistant", [{"type": "text", "text": f"Noted, item {i}."}]))
    return paths


def _read(indexed: list[dict[str, Any]], paths: set[str] | None = None) -> dict[str, int]:
    rows = [e for e in indexed if paths is None or e["path"] in paths]
    return {"files": len(rows), "bytes": sum(e.get("read_bytes", 0) for e in rows),
            "lines": sum(e.get("read_lines", 0) for e in rows), "embedded": sum(e.get("embedded", 0) for e in rows),
            "chunks": sum(e.get("chunks", 0) for e in rows),
            "cache_hits": sum(e.get("cache_hits", 0) for e in rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sessions_folder", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", type=Path, default=REPO / ".sessions-folder", help="work folder [%(default)s]")
    parser.add_argument("--count", type=int, default=1000, help="transcripts [%(default)s]")
    parser.add_argument("--mb", type=float, default=500.0, help="their total size, MB [%(default)s]")
    parser.add_argument("--bytes-per-turn", type=int, default=8192,
                        help="transcript bytes per text turn (the rest: thinking, tool calls and results) "
                             "[%(default)s]")
    parser.add_argument("--grow", type=int, help="transcripts appended to while down [10%% of --count]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-bar", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    root = args.state / f"folder-{args.count}-{args.mb:g}"
    folder = make_folder(root, args.count, args.mb, args.bytes_per_turn, args.seed)
    print(f"folder: {args.count} transcripts, {folder['bytes'] / 2**20:.1f} MB, {folder['turns']} text turns; "
          f"turn texts: {folder['source']}")
    state = args.state / f"state-{args.count}-{args.mb:g}"
    shutil.rmtree(state, ignore_errors=True)
    load = os.getloadavg()[0]
    bar = not args.no_bar and sys.stderr.isatty()

    first = run_daemon(root, state, "first", args.count, bar)
    sessions = first["status"].get("sessions", {}).get("main", {})
    whole = _read(first["indexed"])
    again = run_daemon(root, state, "unchanged", args.count, bar)
    before = {str(p): p.stat().st_size for p in (root / "sessions").glob("*.jsonl")}
    grown = grow(root / "sessions", args.grow if args.grow is not None else max(1, args.count // 10), args.seed)
    names = {str(p) for p in grown}
    third = run_daemon(root, state, "appended", args.count, bar)
    after = _read(third["indexed"], names)
    baseline = _read(first["indexed"], names)  # what re-chunking those files whole parsed (the first index)
    prefix = sum(before[n] for n in names)
    for name in names:  # the folder as made, for the next run
        os.truncate(name, before[name])

    mib = 2**20
    print(f"\nload average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, {os.cpu_count()} CPUs")
    print(f"first index: {first['seconds']:.0f} s to ready (CPU {first['cpu_s']:.0f} s), peak RSS "
          f"{first['rss_peak'] / mib:.0f} MiB (VmHWM; psutil sampled {first['rss_sampled'] / mib:.0f} MiB), "
          f"{first['status']['chunks_embedded']} chunks embedded, status sessions {sessions}")
    print(f"  transcripts parsed: {whole['files']}, {whole['bytes'] / mib:.1f} MB, {whole['lines']} lines")
    print("\n| restart | s to ready | transcripts read | bytes parsed | lines parsed | chunks embedded | cache hits |")
    print("|---|---|---|---|---|---|---|")
    for label, run, read in (("nothing changed", again, _read(again["indexed"])),
                             (f"{len(grown)} transcripts +2 turns", third, after)):
        print(f"| {label} | {run['seconds']:.1f} | {read['files']} | {read['bytes']:,} | {read['lines']:,} | "
              f"{run['status']['chunks_embedded']} | {read['cache_hits']} |")
    # a whole re-chunk (before: a transcript's first change after a restart) parses what the first index parsed of
    # those files and looks each of their chunks up in the embedding cache (new windows alone embedded)
    print(f"| (baseline: those {len(grown)} re-chunked whole, as the first index read them) | | {baseline['files']} | "
          f"{baseline['bytes']:,} | {baseline['lines']:,} | new windows only | {baseline['chunks']} |")
    ratio = baseline["bytes"] / after["bytes"] if after["bytes"] else float("inf")
    print(f"\nafter appends: {after['bytes']:,} bytes parsed vs {baseline['bytes']:,} for a whole re-chunk "
          f"({ratio:.0f}x fewer); the indexed prefixes ({prefix / mib:.1f} MB) were hashed once, not parsed. "
          f"sessions after: {third['status'].get('sessions', {}).get('main')}")
    print(f"exit statuses: {first['exit']}, {again['exit']}, {third['exit']}")
    return 0 if (first["exit"], again["exit"], third["exit"]) == (0, 0, 0) else 1


if __name__ == "__main__":
    sys.exit(main())
