"""The documentation's relative links: every one in README.md, docs/*.md and the plugin guide names a file of the
repository and, with a ``#fragment``, a heading of that file (GitHub's anchor for it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", REPO / "plugins" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of markdown file ``path``: lower case, punctuation dropped, spaces to
    hyphens."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    headings = re.findall(r"^#+\s+(.+?)\s*$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def relative_links(path: Path) -> list[str]:
    """The links of ``path`` outside fenced code that are not URLs (``scheme:``)."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return [link for link in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", link)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for link in relative_links(doc):
        target, _, fragment = link.partition("#")
        file = (doc.parent / target).resolve() if target else doc
        if not file.exists():
            broken.append(f"{link}: no file {file.relative_to(REPO) if file.is_relative_to(REPO) else file}")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(f"{link}: no heading #{fragment} in {file.relative_to(REPO)}")
    assert not broken, f"{doc.relative_to(REPO)}: " + "; ".join(broken)


def test_the_check_sees_links_and_anchors(tmp_path: Path) -> None:
    """The parsing itself: links in code blocks and URLs are not checked, headings give GitHub's anchors."""
    doc = tmp_path / "a.md"
    doc.write_text("# Connect an agent (MCP)\n\n## `EdgeShard.load` at 1,000,000 points\n\n[x](b.md#top) "
                   "[y](https://example.com) [z](#connect-an-agent-mcp)\n\n```\n[w](missing.md)\n```\n")
    assert relative_links(doc) == ["b.md#top", "#connect-an-agent-mcp"]
    assert anchors(doc) == {"connect-an-agent-mcp", "edgeshardload-at-1000000-points"}
