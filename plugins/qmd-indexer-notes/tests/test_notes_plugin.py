"""The notes plugin against qmd-indexer's contract checks (``indexer.testing``), as any plugin author would test."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from indexer.testing import check_classifier, check_extractor, check_extractor_rejects, whitespace_context

if importlib.util.find_spec("qmd_indexer_notes") is None:
    # qmd-indexer's own suite runs this file without installing the example, so that it never claims .txt files in
    # the project's other tests; a plugin author installs it (pip install -e .) and this line does nothing.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qmd_indexer_notes import NotesClassifier, NotesExtractor  # noqa: E402

ORG = """#+TITLE: Garden
* Tomatoes
Planted the San Marzano seedlings on the south bed.
* Watering
Every second evening unless it rained.
"""


def test_classifier_claims_txt_and_org_by_name_and_content(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("plain words\n")
    (tmp_path / "b.ORG").write_text(ORG)
    (tmp_path / "c.txt").write_bytes(b"\x00\x01binary")
    (tmp_path / "d.md").write_text("# markdown is not ours\n")
    check_classifier(NotesClassifier({}), {
        tmp_path / "a.txt": "plaintext",
        tmp_path / "b.ORG": "org",
        tmp_path / "c.txt": None,
        tmp_path / "d.md": None,
    })


def test_suffixes_are_configurable_and_validated(tmp_path: Path) -> None:
    (tmp_path / "log.text").write_text("x\n")
    (tmp_path / "a.txt").write_text("x\n")
    check_classifier(NotesClassifier({"suffixes": [".text"]}),
                     {tmp_path / "log.text": "plaintext", tmp_path / "a.txt": None})
    with pytest.raises(ValueError, match="suffixes"):
        NotesClassifier({"suffixes": "txt"})


def test_extractor_gives_line_ranged_chunks(tmp_path: Path) -> None:
    note = tmp_path / "garden.org"
    note.write_text(ORG)
    chunks = check_extractor(NotesExtractor({}), note, "org")
    assert chunks[0].start_line == 1 and chunks[-1].end_line == 5
    assert "San Marzano" in " ".join(c.text for c in chunks)


def test_long_note_is_split_within_the_token_limit(tmp_path: Path) -> None:
    note = tmp_path / "long.txt"
    note.write_text("".join(f"line {i} of a long plain note about the garden\n" for i in range(1, 101)))
    chunks = check_extractor(NotesExtractor({}), note, "plaintext", whitespace_context(max_tokens=40))
    assert len(chunks) > 1
    assert chunks[-1].end_line == 100
    assert all(c.start_line <= c.end_line for c in chunks)


def test_binary_content_is_refused_with_a_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"text then \x00 binary")
    error = check_extractor_rejects(NotesExtractor({}), bad, "plaintext")
    assert "NUL" in str(error)
