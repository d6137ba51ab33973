"""Markdown chunking: sized by the model's own tokenizer, 1-based line ranges, overlap, long lines, CJK, emoji;
heading sections that carry their document's context; a chunking change re-indexes a store once."""

from __future__ import annotations

import pytest
from conftest import write

from indexer import chunking, sections
from indexer.chunking import chunk_text, heading_lines
from indexer.search import SearchParams
from indexer.sections import chunk_markdown
from indexer.worker import index_once


@pytest.fixture(name="embedder")
def embedder_fixture(registry):
    return registry.embedders["text"]


def _tokens(embedder, text: str) -> int:
    return len(embedder.token_offsets(text))


def test_chunks_fit_the_model_and_cite_their_lines(embedder) -> None:
    lines = [f"Line {i}: the deploy checklist item number {i} says to verify the canary first." for i in range(1, 201)]
    text = "\n".join(lines) + "\n"
    chunks = chunk_text(text, embedder.token_offsets, embedder.max_tokens)
    assert len(chunks) > 5
    for chunk in chunks:
        assert _tokens(embedder, chunk.text) <= embedder.max_tokens
        assert chunk.text == "\n".join(lines[chunk.start_line - 1 : chunk.end_line])
    assert chunks[0].start_line == 1 and chunks[-1].end_line == 200
    for before, after in zip(chunks, chunks[1:]):
        assert after.start_line <= before.end_line, "consecutive chunks overlap"
        assert after.start_line > before.start_line, "chunking moves forward"


def test_max_tokens_is_the_model_limit(embedder) -> None:
    # all-MiniLM-L6-v2 keeps 256 word pieces including [CLS] and [SEP]
    assert embedder.max_tokens == 254


def test_a_60000_character_line_is_split_at_token_boundaries(embedder) -> None:
    line = " ".join(f"word{i}" for i in range(10_000))[:60_000]
    chunks = chunk_text("# Title\n" + line + "\nlast line\n", embedder.token_offsets, embedder.max_tokens)
    assert len([c for c in chunks if c.start_line == c.end_line == 2]) > 10
    assert all(_tokens(embedder, c.text) <= embedder.max_tokens for c in chunks)
    assert {w for c in chunks for w in c.text.split()} == set(line.split()) | {"#", "Title", "last", "line"}
    assert chunks[-1].end_line == 3


def test_cjk_and_emoji_are_never_cut_inside_a_character(embedder) -> None:
    line = "部署窗口是星期二和星期四上午。不要在星期五部署。🚀👩‍💻✅" * 400
    text = f"# 记忆\n\n{line}\n"
    chunks = chunk_text(text, embedder.token_offsets, embedder.max_tokens)
    assert len(chunks) > 1
    for chunk in chunks:
        assert chunk.text in text
        chunk.text.encode("utf-8")  # no lone surrogates
        assert _tokens(embedder, chunk.text) <= embedder.max_tokens


def test_empty_and_blank_text_give_no_chunks(embedder) -> None:
    assert chunk_text("", embedder.token_offsets, embedder.max_tokens) == []
    assert chunk_text("\n\n   \n", embedder.token_offsets, embedder.max_tokens) == []


def test_blank_edges_do_not_widen_the_line_range(embedder) -> None:
    [chunk] = chunk_text("\n\n# Note\nbody\n\n\n", embedder.token_offsets, embedder.max_tokens)
    assert (chunk.start_line, chunk.end_line, chunk.text) == (3, 4, "# Note\nbody")


def test_sections_start_new_chunks_once_half_full(embedder) -> None:
    sentence = "Sentence about the billing service and its deploy rules. "  # 11 tokens
    text = f"# One\n{sentence * 13}\n# Two\n{sentence * 5}\n"  # 145 + 57 tokens: would fit one chunk
    chunks = chunk_text(text, embedder.token_offsets, embedder.max_tokens, overlap_tokens=0)
    assert [c.text.splitlines()[0] for c in chunks] == ["# One", "# Two"]
    assert heading_lines(text) == {0, 2}


# -- chunk_markdown: heading sections with their document's context ---------------------------------------------
SENTENCE = "Sentence about the billing service and its deploy rules. "  # 11 tokens


def _fits(embedder, chunk) -> bool:
    embedded = f"{chunk.context}\n{chunk.text}" if chunk.context else chunk.text
    return len(embedder.token_offsets(embedded)) == chunk.n_tokens <= embedder.max_tokens


def _lines(text: str, chunk) -> str:
    return "\n".join(text.split("\n")[chunk.start_line - 1 : chunk.end_line])


def test_a_section_that_fits_is_one_chunk_and_knows_its_document(embedder, monkeypatch) -> None:
    monkeypatch.setattr(sections, "MERGE_TOKENS", 0)
    text = (f"# Deploy runbook\n\nHow we ship.\n\n## Rollback\n\n{SENTENCE * 5}\n\n### Database\n\n{SENTENCE * 3}\n"
            f"\n## Canary\n\n{SENTENCE * 4}\n")
    chunks = chunk_markdown(text, embedder.token_offsets, embedder.max_tokens, "memory/ops/deploy.md")
    assert [(c.start_line, c.end_line, c.context) for c in chunks] == [
        (1, 3, ""),  # the title shows in the chunk itself
        (5, 7, "Deploy runbook"),  # "## Rollback" is its first line, so the context stops at its parent
        (9, 11, "Deploy runbook > Rollback"),
        (13, 15, "Deploy runbook"),
    ]
    for chunk in chunks:
        assert chunk.text == _lines(text, chunk) and _fits(embedder, chunk)


def test_a_long_section_is_split_into_overlapping_windows_that_each_carry_the_breadcrumb(embedder) -> None:
    body = "\n".join(f"{SENTENCE}Item {i}." for i in range(60))
    text = f"# Billing\n\n## Deploys\n\n### Rules\n{body}\n\n## Other\n\nshort\n"
    chunks = chunk_markdown(text, embedder.token_offsets, embedder.max_tokens, "memory/billing.md")
    rules = [c for c in chunks if c.start_line <= 65]
    assert len(rules) >= 3
    assert rules[0].start_line == 1  # "# Billing" and "## Deploys" have no body: they join the first window
    assert all(c.context == "Billing > Deploys > Rules" for c in rules)
    for before, after in zip(rules, rules[1:]):
        assert after.start_line <= before.end_line, "windows of one section overlap"
    assert rules[-1].end_line == 65 and chunks[-1].context == "Billing"
    for chunk in chunks:  # a window may start or end between two sentences of a line
        assert chunk.text in _lines(text, chunk) and _fits(embedder, chunk)


def test_the_title_falls_back_to_the_file_name_and_a_daily_note_keeps_its_date(embedder) -> None:
    [chunk] = chunk_markdown("Some text.\n", embedder.token_offsets, embedder.max_tokens, "memory/deploy-run_book.md")
    assert chunk.context == "deploy run book"
    text = "# Standup\n\nWe moved the release.\n\n## Actions\n\nDana files the ticket.\n"
    chunks = chunk_markdown(text, embedder.token_offsets, embedder.max_tokens, "memory/2026-03-02.md")
    # title line and "## Actions" merged: both shown; the date also in the words people ask with
    assert {c.context for c in chunks} == {"2026-03-02\nMonday, 2 March 2026"}


def test_front_matter_comments_and_quotes_do_not_make_sections(embedder, monkeypatch) -> None:
    monkeypatch.setattr(sections, "MERGE_TOKENS", 0)
    text = ("---\npublish: true\n---\n\n# Guide\n\nIntro.\n\n<!--\n# not a heading\n-->\n\n"
            "> [!Note]\n> ### quoted\n> text\n\n## Real\n\nBody.\n")
    chunks = chunk_markdown(text, embedder.token_offsets, embedder.max_tokens, "memory/guide.md")
    assert [(c.start_line, c.end_line, c.context) for c in chunks] == [(5, 15, ""), (17, 19, "Guide")]


def test_tiny_sections_merge_under_their_parent(embedder) -> None:
    text = "# Notes\n\n## Tools\n\n### Editor\n\nVim.\n\n### Shell\n\nZsh.\n"
    chunks = chunk_markdown(text, embedder.token_offsets, embedder.max_tokens, "memory/notes.md")
    assert [(c.start_line, c.end_line, c.context) for c in chunks] == [(1, 11, "")]
    assert sections.MERGE_TOKENS > chunks[0].n_tokens


def test_a_long_heading_path_takes_at_most_its_share_of_the_window(embedder) -> None:
    heading = " ".join(f"word{i}" for i in range(200))
    text = f"# {heading}\n\n## Part\n\n{SENTENCE * 30}\n"
    chunks = chunk_markdown(text, embedder.token_offsets, embedder.max_tokens, "memory/long.md")
    cap = int(embedder.max_tokens * sections.MAX_CONTEXT_RATIO)
    assert all(len(embedder.token_offsets(c.context + "\n")) <= cap for c in chunks)
    assert all(_fits(embedder, c) for c in chunks)


def test_the_embedded_and_keyword_text_carry_the_context(make_indexer, tmp_path) -> None:
    ws = tmp_path / "ws"
    write(ws / "memory" / "deploy-runbook.md",
          f"# Deploy runbook\n\n{SENTENCE * 20}\n\n## Rollback\n\nRevert the tag and redeploy the previous build.\n")
    write(ws / "memory" / "other.md", "# Other\n\nRevert the tag and redeploy the previous build.\n")
    indexer = make_indexer([{"agent": "main", "path": ws}])
    index_once(indexer)
    hits = indexer.view.searcher().search(SearchParams("runbook revert", k=3, mode="keyword"))
    # "runbook" is only in the title; the rollback section's chunk is found through its context
    assert (hits[0]["path"], hits[0]["start_line"]) == ("memory/deploy-runbook.md", 5)
    assert hits[0]["snippet"].startswith("## Rollback")  # the snippet is the file's own lines


def test_a_new_chunking_version_reindexes_an_existing_store_once(make_indexer, tmp_path, monkeypatch) -> None:
    ws = tmp_path / "ws"
    for i in range(3):
        write(ws / "memory" / f"n{i}.md", f"# Note {i}\n\n{SENTENCE * (5 + 30 * i)}\n")

    def payloads(indexer):
        return list(indexer.store.scroll("memory-dir-main", ["chunking_version", "file_hash"]))

    first = make_indexer([{"agent": "main", "path": ws}])
    index_once(first)
    before = payloads(first)
    first.store.close()
    monkeypatch.setattr(chunking, "CHUNKING_VERSION", chunking.CHUNKING_VERSION + 1)
    second = make_indexer([{"agent": "main", "path": ws}])
    status = index_once(second)
    after = payloads(second)
    assert status["cache_hits"] == len(before) and status["chunks_embedded"] == 0  # re-chunked; vectors cached
    assert len(after) == len(before), "the old version's points are gone"
    assert {p.chunking_version for p in after} == {chunking.CHUNKING_VERSION}
    second.store.close()
    third = make_indexer([{"agent": "main", "path": ws}])
    status = index_once(third)
    assert status["cache_hits"] == 0 and status["chunks_embedded"] == 0, "indexed once, then unchanged"


FRONT_MATTER_NOTE = ("---\ntitle: Deploy windows\ntags: [ops, kubernetes]\ndate: 2026-03-02\n"
                     "aliases:\n  - release days\n---\n\nWe ship from the main branch.\n\n## Freeze\n\n"
                     "No deploys on Fridays; ask Dana for an exception.\n")


def test_front_matter_stays_out_of_the_chunks_and_its_title_and_tags_feed_the_context(embedder) -> None:
    chunks = chunk_markdown(FRONT_MATTER_NOTE, embedder.token_offsets, embedder.max_tokens, "memory/deploys.md")
    assert chunks and chunks[0].start_line == 9  # the first line of the body, after the closing "---" (line 7)
    for chunk in chunks:
        embedded = f"{chunk.context}\n{chunk.text}"
        for raw in ("tags:", "title:", "date:", "aliases:", "2026-03-02", "release days", "---"):
            assert raw not in embedded
        assert chunk.text == _lines(FRONT_MATTER_NOTE, chunk) and _fits(embedder, chunk)
        # the front matter's title stands for the missing H1, its tags follow as hashtags
        assert chunk.context.startswith("Deploy windows") and chunk.context.endswith("\n#ops #kubernetes")


def test_toml_front_matter_is_skipped_and_a_leading_thematic_break_is_not_front_matter(embedder) -> None:
    toml = '+++\ntitle = "Lisbon trip"\ntags = ["travel"]\n+++\n\nFlights are booked for March.\n'
    [chunk] = chunk_markdown(toml, embedder.token_offsets, embedder.max_tokens, "memory/trip.md")
    assert (chunk.start_line, chunk.text, chunk.context) == (6, "Flights are booked for March.", "Lisbon trip\n#travel")
    # a thematic break over a paragraph and another break is no YAML mapping: it stays the note's text
    rule = "---\nJust a paragraph between two rules.\n\n---\n\nMore text.\n"
    [chunk] = chunk_markdown(rule, embedder.token_offsets, embedder.max_tokens, "memory/rule.md")
    assert (chunk.start_line, chunk.end_line) == (1, 6)


def test_a_note_that_is_only_front_matter_stays_findable(embedder) -> None:
    text = "---\ntitle: Reading list\ntags: books\n---\n"
    [chunk] = chunk_markdown(text, embedder.token_offsets, embedder.max_tokens, "memory/reading.md")
    assert (chunk.start_line, chunk.end_line) == (1, 4)


def test_a_front_matter_note_is_found_by_its_tag_and_cited_from_its_body(make_indexer, tmp_path) -> None:
    ws = tmp_path / "ws"
    write(ws / "memory" / "deploys.md", FRONT_MATTER_NOTE)
    write(ws / "memory" / "other.md", "# Other\n\nNo deploys on Fridays in the old team either.\n")
    indexer = make_indexer([{"agent": "main", "path": ws}])
    index_once(indexer)
    stored = list(indexer.store.scroll("memory-dir-main", ["path", "text", "context", "start_line"]))
    assert all("tags:" not in p.text and "tags:" not in p.context for p in stored)
    assert min(p.start_line for p in stored if p.path == "memory/deploys.md") == 9
    # the tag is in no line of the body: the note is found through its chunk context
    [hit] = indexer.view.searcher().search(SearchParams("kubernetes", k=1, mode="keyword"))
    assert hit["path"] == "memory/deploys.md" and hit["start_line"] >= 9
    assert not hit["snippet"].startswith("---")


def test_a_heading_with_no_body_belongs_to_the_section_under_it(embedder) -> None:
    # a daily note whose title has no text of its own above a conversation log (or a long section): the title line
    # alone was a one-line chunk that took hit slots and boot budget
    log = "\n".join(f"- {'Dana' if i % 2 else 'Marco'}: turn {i} about the billing deploy and the export job."
                    for i in range(12))
    text = f"# 2026-12-01\n\n## Call with Marco\n\n{log}\n"
    chunks = chunk_markdown(text, embedder.token_offsets, embedder.max_tokens, "memory/2026-12-01.md")
    assert chunks and chunks[0].start_line == 1, "the heading is shown with what follows it"
    assert all(c.end_line > c.start_line for c in chunks), [(c.start_line, c.end_line) for c in chunks]
    long = "\n".join(f"{SENTENCE}Item {i}." for i in range(20))
    text = f"# Runbook\n\n## Rollback\n\n{long}\n"
    chunks = chunk_markdown(text, embedder.token_offsets, embedder.max_tokens, "memory/runbook.md")
    assert chunks[0].start_line == 1 and chunks[0].end_line > 3
    for chunk in chunks:
        assert chunk.text in _lines(text, chunk) and _fits(embedder, chunk)
