"""Markdown chunking: sized by the model's own tokenizer, 1-based line ranges, overlap, long lines, CJK, emoji."""

from __future__ import annotations

import pytest

from indexer.chunking import chunk_text, heading_lines


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
