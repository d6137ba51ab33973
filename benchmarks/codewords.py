"""Exact rare words in hybrid search: do notes holding a unique codeword rank in the top 5 when an agent asks for it?

Run from the repository root: ``python -m benchmarks.codewords`` (``--help`` for options; part of ``make eval``).

What it does, in one run:

1. Reads the markdown notes of ``--vault`` (default ``../shared/data/vault`` relative to the repository; 205 notes
   of a public Obsidian plugin's documentation). A missing folder is reported on stderr and the process exits with
   status 2.
2. Plants each codeword of ``CODEWORDS`` (48: identifiers such as ``ZX-4471``, ``kestrel_9``, ticket and invoice
   numbers, hosts, versions, hex values, camelCase names, made-up words and plain numbers) in one sentence of its own
   note, as a new paragraph after a paragraph in the middle of the note (outside code fences). Notes are drawn with
   a fixed seed from those of at least 1 KiB; every codeword is checked to appear nowhere in the vault beforehand.
3. Writes the vault as a workspace (``<state>/workspace/memory/...``; unchanged files are not rewritten) and indexes
   it with the daemon's code (``benchmarks.eval.open_indexed``: ``Indexer.open`` + ``index_once``) into Qdrant Edge
   under ``<state>/state-default/``, with a kept embedding cache.
4. Asks, per codeword, as an agent would: ``what is <codeword>?``, ``<codeword> <a word of its sentence>`` and a
   natural question with the codeword inside, through ``Searcher.retrieve`` (the ranking behind ``POST /search``)
   in modes ``hybrid`` (the configured fusion, and the other one), ``keyword`` and ``dense``, ``k = 5``.
5. A query counts as found when one of its 5 hits is a chunk of the planted note whose text holds the codeword.

Plain numbers (shape ``number``) are reported apart: Qdrant's multilingual tokenizer keeps no token made of digits
alone, and the product adds them as terms of their own (``indexer.bm25.NUMBER``; before that, no keyword signal
existed for them and fusion could not lift them).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VAULT = REPO.parent / "shared" / "data" / "vault"
DEFAULT_STATE = REPO / ".codewords"
TOP = 5  # what "ranks in the top 5" means
SEED = 4471  # which notes get a codeword and where


@dataclass(frozen=True)
class Codeword:
    word: str  # the codeword, written in the note exactly so
    shape: str  # id, snake, ticket, invoice, host, version, hex, camel, made-up, number
    sentence: str  # the planted sentence; ``{w}`` stands for the codeword
    topic: str  # a word of the sentence, for the "<codeword> <word>" query
    question: str  # a natural question with the codeword inside; ``{w}`` stands for it


CODEWORDS: tuple[Codeword, ...] = (
    Codeword("ZX-4471", "id", "The staging deploy key for the sync service is {w}; rotate it after each release.",
             "deploy", "which service uses {w} and when do I rotate it?"),
    Codeword("kestrel_9", "snake", "Nightly builds fall back to the runner {w} when the main pool is busy.",
             "runner", "what happens to nightly builds on {w}?"),
    Codeword("INV-88213", "invoice", "Invoice {w} from the hosting provider was paid twice in March.",
             "invoice", "was {w} paid already?"),
    Codeword("JIRA-7730", "ticket", "The flaky timezone test is tracked in {w}, assigned to Priya.",
             "test", "who owns {w}?"),
    Codeword("glimmerwort", "made-up", "Priya's codename for the new query parser is {w}.",
             "parser", "what did Priya call {w}?"),
    Codeword("db-qorvex-07", "host", "The reporting database moved to {w} during the October migration.",
             "database", "when did the reporting database move to {w}?"),
    Codeword("v9.41.3-rc2", "version", "Pin the theme to {w} until the sidebar regression is fixed.",
             "theme", "why are we pinned to {w}?"),
    Codeword("0x7f3aQ9", "hex", "The crash dump always shows the address {w} in the renderer thread.",
             "crash", "where does {w} show up?"),
    Codeword("syncBlorpQueue", "camel", "Heavy vaults stall in {w} when more than ten thousand tasks change at once.",
             "stall", "why does {w} stall?"),
    Codeword("PRJ-5521", "ticket", "Budget approval for the mobile rewrite sits in {w} waiting for finance.",
             "budget", "what is the status of {w}?"),
    Codeword("falcon_22b", "snake", "The canary cluster is called {w}; never run migrations there on Fridays.",
             "canary", "can I run migrations on {w}?"),
    Codeword("tessaract", "made-up", "We agreed to spell the export format {w} on purpose, to avoid trademark trouble.",
             "export", "why is it spelled {w}?"),
    Codeword("ORD-33107", "invoice", "Order {w} for the two spare laptops arrives next Tuesday.",
             "laptops", "when does {w} arrive?"),
    Codeword("QK7-Z2", "id", "The shared drive folder for the audit is labelled {w}.",
             "audit", "what is in {w}?"),
    Codeword("mirthwick", "made-up", "Remember that {w} is the password hint for the old admin account.",
             "password", "what is {w} the hint for?"),
    Codeword("edge-node-vx3", "host", "Logs for the search cluster are shipped from {w} every five minutes.",
             "logs", "what does {w} ship?"),
    Codeword("HOTFIX-219b", "ticket", "The recurrence bug that skipped leap days was fixed under {w}.",
             "recurrence", "what did {w} fix?"),
    Codeword("zorblax", "made-up", "The team mascot, a purple owl, is named {w}.",
             "mascot", "who or what is {w}?"),
    Codeword("api_key_rotator_v2", "snake", "Secrets are now rotated by {w}, which runs hourly.",
             "secrets", "how often does {w} run?"),
    Codeword("RFC-0093x", "ticket", "The proposal for nested task lists is written up as {w}.",
             "proposal", "where is the proposal {w}?"),
    Codeword("quillfeather", "made-up", "Dana's branch {w} holds the unfinished calendar view.",
             "calendar", "what is on the branch {w}?"),
    Codeword("PO-77K41", "invoice", "Purchase order {w} covers the annual licence renewal.",
             "licence", "what does {w} cover?"),
    Codeword("wrenfield_3", "snake", "The beta testers' channel is {w} on the community server.",
             "beta", "who is in {w}?"),
    Codeword("BLD-2290-ARM", "id", "Build {w} is the last one that still starts on the old tablets.",
             "tablets", "why does {w} matter?"),
    Codeword("snarglewick", "made-up", "Our internal nickname for the due-date heuristic is {w}.",
             "heuristic", "what does {w} refer to?"),
    Codeword("cfgDriftWatch", "camel", "Config changes are caught by {w}, which pages whoever is on call.",
             "config", "who does {w} page?"),
    Codeword("SEC-4410-A", "ticket", "The disclosure from the external researcher is tracked as {w}.",
             "disclosure", "what is {w} about?"),
    Codeword("marrowby", "made-up", "Meetings with the design agency happen at {w}, the café near the station.",
             "café", "where is {w}?"),
    Codeword("rk-backup-x9", "host", "Weekly vault backups land on {w} and are kept for ninety days.",
             "backups", "how long are backups kept on {w}?"),
    Codeword("TXN-5G8812", "invoice", "The refund for the duplicate charge went out as transaction {w}.",
             "refund", "what was {w} for?"),
    Codeword("plinthcraft", "made-up", "The onboarding checklist lives in the notebook called {w}.",
             "onboarding", "what is in {w}?"),
    Codeword("owl_sentinel_4", "snake", "Uptime alerts come from the bot {w} in the ops room.",
             "alerts", "what does {w} post?"),
    Codeword("MX-0042-Q", "id", "The lab scanner with asset tag {w} needs a new power cable.",
             "scanner", "what is wrong with {w}?"),
    Codeword("renderFlushGate", "camel", "Slow previews were traced to {w} holding a lock during layout.",
             "previews", "why is {w} slow?"),
    Codeword("vortigen", "made-up", "The quarterly roadmap review is nicknamed {w} by the whole team.",
             "roadmap", "when is {w}?"),
    Codeword("CASE-90017Z", "ticket", "Support case {w} is the customer whose vault has forty thousand tasks.",
             "customer", "which customer is {w}?"),
    Codeword("gw-iris-12", "host", "The VPN gateway for the Berlin office is {w}.",
             "gateway", "which office uses {w}?"),
    Codeword("brambleton", "made-up", "The offsite in June will be held in {w}, two hours north.",
             "offsite", "how far is {w}?"),
    Codeword("KB-3317-W", "id", "The how-to for resetting the plugin cache is article {w}.",
             "cache", "what does {w} explain?"),
    Codeword("fennix_ops", "snake", "Pager duty for the weekend goes through the rota {w}.",
             "pager", "who is on {w} this weekend?"),
    Codeword("SKU-LX4490", "invoice", "The monitor stands we liked are {w} in the supplier catalogue.",
             "monitor", "which supplier sells {w}?"),
    Codeword("quorbital", "made-up", "The load-testing script that replays user edits is called {w}.",
             "load", "what does {w} replay?"),
    Codeword("ZQ-8804", "id", "Room {w} is booked every Thursday for the architecture sync.",
             "room", "when is {w} booked?"),
    Codeword("hxTaskMerge", "camel", "Duplicate tasks after a sync are merged by {w} on the next start.",
             "duplicate", "when does {w} run?"),
    Codeword("58213907", "number", "The courier's tracking number for the returned keyboard is {w}.",
             "courier", "where is the parcel {w}?"),
    Codeword("4471093", "number", "The conference call dial-in code is {w}.",
             "dial-in", "what is the code {w} for?"),
    Codeword("90412", "number", "Our customer account number with the electricity supplier is {w}.",
             "electricity", "which supplier has account {w}?"),
    Codeword("771046", "number", "The office alarm disarm code was changed to {w} last week.",
             "alarm", "what is {w}?"),
)

FORMS = ("what is", "word", "question")  # the three ways a codeword is asked for


def queries(cw: Codeword) -> dict[str, str]:
    """The codeword's queries, by form."""
    return {"what is": f"what is {cw.word}?", "word": f"{cw.word} {cw.topic}",
            "question": cw.question.format(w=cw.word)}


_FENCE = re.compile(r"^\s*(```|~~~)")


def plant(text: str, sentence: str, rng: random.Random) -> str:
    """``text`` with ``sentence`` as a new paragraph after a blank line outside code fences and front matter,
    drawn near the middle of the note (or at its end when it has none)."""
    lines = text.split("\n")
    fenced, body_from, spots = False, 0, []
    if lines and lines[0].strip() == "---":  # YAML front matter
        body_from = next((i + 1 for i in range(1, len(lines)) if lines[i].strip() == "---"), 0)
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
        elif i > body_from and not fenced and not line.strip() and lines[i - 1].strip() \
                and not lines[i - 1].lstrip().startswith(("#", ">", "|", "-", "*", "1")):
            spots.append(i)
    if not spots:
        return text.rstrip("\n") + "\n\n" + sentence + "\n"
    middle = spots[len(spots) // 4 : max(len(spots) // 4 + 1, 3 * len(spots) // 4)]
    at = rng.choice(middle)
    return "\n".join(lines[: at + 1] + [sentence, ""] + lines[at + 1 :])


def build_workspace(vault: Path, workspace: Path) -> dict[str, str]:
    """Write the vault with the codewords planted under ``workspace/memory/``; returns codeword -> note path
    (``memory/...``). Raises ``ValueError`` when a codeword already occurs in the vault."""
    notes = {p.relative_to(vault).as_posix(): p.read_text(encoding="utf-8") for p in sorted(vault.rglob("*.md"))}
    everything = "\n".join(notes.values()).lower()
    clash = [cw.word for cw in CODEWORDS if cw.word.lower() in everything]
    if clash:
        raise ValueError(f"codewords already in the vault: {clash}")
    rng = random.Random(SEED)
    hosts = rng.sample([rel for rel, text in notes.items() if len(text.encode()) >= 1024], len(CODEWORDS))
    where = {}
    for cw, rel in zip(CODEWORDS, hosts):
        notes[rel] = plant(notes[rel], cw.sentence.format(w=cw.word), rng)
        where[cw.word] = "memory/" + rel
    memory = workspace / "memory"
    for stale in [p for p in memory.rglob("*.md") if p.relative_to(memory).as_posix() not in notes]:
        stale.unlink()
    for rel, text in notes.items():
        target = memory / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
    return where


def found(hits: Sequence[Any], cw: Codeword, path: str) -> bool:
    """Whether one of ``hits`` (``indexer.points.Hit``) is a chunk of ``path`` whose text holds the codeword."""
    return any(h.payload.path == path and cw.word.lower() in h.payload.text.lower() for h in hits)


def run(indexer: Any, where: dict[str, str], methods: Sequence[tuple[str, str, str]]) -> dict[str, Any]:
    """``methods``: (label, mode, fusion). Returns label -> {"found": {form: [codeword, ...]}, "missed": ...}."""
    from indexer.search import SearchParams

    searchers = {label: indexer.view.searcher(mode=mode, fusion=fusion) for label, mode, fusion in methods}
    first = next(iter(searchers.values()))
    for searcher in searchers.values():  # one query embedding for every method (the int8 encoder is slow under load)
        searcher._embed_query = first._embed_query
    out: dict[str, Any] = {label: {"found": {form: [] for form in FORMS}, "missed": {form: [] for form in FORMS}}
                           for label in searchers}
    for cw in CODEWORDS:
        for form, text in queries(cw).items():
            for (label, mode, _), searcher in zip(methods, searchers.values()):
                ok = found(searcher.retrieve(SearchParams(text, k=TOP, mode=mode)), cw, where[cw.word])
                out[label]["found" if ok else "missed"][form].append(cw.word)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.codewords", description=__doc__.split("\n\n")[0])
    parser.add_argument("--vault", type=Path, default=DEFAULT_VAULT, help="markdown notes to plant in [%(default)s]")
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE, help="workspace, index and cache [%(default)s]")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if not args.vault.is_dir():
        print(f"codewords: vault folder not found: {args.vault}\nThe benchmark needs markdown notes at "
              f"{DEFAULT_VAULT} or --vault DIR.", file=sys.stderr)
        return 2

    import structlog

    from benchmarks.eval import open_indexed
    from indexer.config import Settings
    from indexer.plugins import load_registry, plugin_configs

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    state = args.state.resolve()
    defaults = Settings(state_dir=state)
    registry = load_registry(defaults.plugins, plugin_configs(defaults), defaults.prefer)
    where = build_workspace(args.vault.resolve(), state / "workspace")
    log(f"{len(CODEWORDS)} codewords planted in {len(where)} notes under {state / 'workspace'}")
    indexer, facts = open_indexed(state, state / "workspace", "default", "default", None, registry, log)
    other = "rrf" if defaults.fusion == "dbsf" else "dbsf"
    methods = [(f"hybrid {defaults.fusion}", "hybrid", defaults.fusion), (f"hybrid {other}", "hybrid", other),
               ("keyword", "keyword", defaults.fusion), ("dense", "dense", defaults.fusion)]
    started = time.monotonic()
    try:
        results = run(indexer, where, methods)
    finally:
        indexer.close()
    log(f"searches: {time.monotonic() - started:.1f} s")

    numbers = {cw.word for cw in CODEWORDS if cw.shape == "number"}
    n_words, n_numbers = len(CODEWORDS) - len(numbers), len(numbers)
    print(f"\ncodewords: {len(CODEWORDS)} planted ({n_words} with letters, {n_numbers} plain numbers) in "
          f"{facts['files']} notes -> {facts['chunks']} chunks; queries found in the top {TOP}, per form "
          f"({', '.join(FORMS)}); default fusion {defaults.fusion}")
    print(f"{'method':<14}" + "".join(f"{form:>12}" for form in FORMS) + f"{'numbers':>12}")
    for label, r in results.items():
        cells = [f"{sum(w not in numbers for w in r['found'][form])}/{n_words}" for form in FORMS]
        nums = sum(w in numbers for form in FORMS for w in r["found"][form])
        print(f"{label:<14}" + "".join(f"{c:>12}" for c in cells) + f"{f'{nums}/{n_numbers * len(FORMS)}':>12}")
    for label, r in results.items():
        misses = sorted({w for form in FORMS for w in r["missed"][form] if w not in numbers})
        if misses and not label.startswith(("keyword", "dense")):
            print(f"{label} missed (letters): "
                  + "; ".join(f"{w} [{', '.join(f for f in FORMS if w in r['missed'][f])}]" for w in misses))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"top": TOP, "where": where, "index": facts, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
