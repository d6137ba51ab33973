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


# -- the documentation's command samples, run ------------------------------------------------------------------------
CONSOLE = re.compile(r"^```console\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: the commands a sample may run here: the CLI asking a daemon on the demo workspace, offline (no server, no network)
OFFLINE = re.compile(r"^(?:\.venv/bin/)?qmd-indexer (search|status|get|recall|boot)\b")


def console_samples() -> list[tuple[str, str, list[str]]]:
    """Every ``$ command`` of the docs' ``console`` blocks as ``(doc, command, expected output lines)``."""
    samples = []
    for doc in DOCS:
        for block in CONSOLE.findall(doc.read_text(encoding="utf-8")):
            for part in re.split(r"^\$ ", block, flags=re.MULTILINE)[1:]:
                command, *output = re.sub(r"\\\n\s*", "", part.rstrip("\n")).split("\n")  # continued lines
                samples.append((str(doc.relative_to(REPO)), command, output))
    return samples


def shape(line: str) -> str:
    """A line's shape: numbers (scores, counts, line ranges, dates) as ``N``, an absolute path (or one the sample
    shortened to ``.../``) as ``…``, spacing collapsed."""
    line = re.sub(r"\d+(?:\.\d+)?", "N", line.strip())
    return re.sub(r"\s+", " ", re.sub(r"(^|\s)(\.\.\.)?/\S*", r"\1…", line))


def same_shape(expected: list[str], actual: list[str]) -> list[str]:
    """The expected lines (shapes; ``...`` skips any lines) not found, in order, in ``actual``'s: ``[]`` when the
    sample's output has the shape of what the command printed."""
    shapes, at, missing = [shape(a) for a in actual], 0, []
    for line in expected:
        if line.strip() in ("...", ""):
            continue
        want = shape(line)
        found = next((i for i in range(at, len(shapes)) if shapes[i] == want), None)
        if found is None:
            missing.append(line)
        else:
            at = found + 1
    return missing


def test_the_sample_shapes_compare_numbers_and_paths_loosely() -> None:
    assert shape("1. memory/2026-11-27.md:1-6  score 1.175  (memory-dir-demo, markdown)") == \
        "N. memory/N-N-N.md:N-N score N (memory-dir-demo, markdown)"
    assert shape("memory-root-demo     1   1  .../.state/demo/workspace") == "memory-root-demo N N …"
    assert shape("memory-root-demo 1 1 /tmp/x/workspace") == shape("memory-root-demo 2 2 .../y")
    assert same_shape(["a 1", "...", "c 2"], ["a 7", "b", "c 3.5"]) == []
    assert same_shape(["c 1", "a 1"], ["a 7", "c 3"]) == ["a 1"]  # in order


def test_every_console_sample_is_run_or_needs_a_server() -> None:
    """Each ``$`` line of the docs is either run against the demo below (``OFFLINE``), or installs something or
    starts a model server (docs/models.md), or follows an install on the reader's own workspace (the plugin guide's
    worked example): none of which runs offline here."""
    others = [(doc, command) for doc, command, _ in console_samples() if not OFFLINE.match(command)]
    elsewhere = re.compile(r"^(ollama|llama-server|vllm|docker|pip install|apt-get install|infinity_emb|MINILM=|"
                           r"qmd-indexer (plugins|index --once --workspace ~/))")
    assert [c for _, c in others if not elsewhere.match(c)] == []
    assert len([s for s in console_samples() if OFFLINE.match(s[1])]) >= 2


def test_console_samples_print_what_the_product_prints(tmp_path: Path) -> None:
    """The offline samples (README's search and status on the demo workspace) run against a real daemon on a copy of
    ``deploy/demo-workspace`` (``make demo``'s), once its model is loaded: each output line of the sample has the
    shape of a line the command printed, in order."""
    import os
    import shutil
    import signal
    import subprocess
    import sys

    from server_process import end, free_port, spawn, wait_ready

    shutil.copytree(REPO / "deploy" / "demo-workspace", tmp_path / "state" / "workspace")
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "QMD_INDEXER_PORT": str(port), "NO_COLOR": "1",
           "XDG_CONFIG_HOME": str(tmp_path / "no-config")}
    env.pop("QMD_INDEXER_CONFIG", None)
    log = tmp_path / "daemon.log"
    daemon = spawn([sys.executable, "-m", "indexer", *demo_command(tmp_path / "state", port)], env, log)
    try:
        def ready() -> bool:  # the first index done and the model loaded: hybrid searches answer in full
            import httpx

            status = httpx.get(f"http://127.0.0.1:{port}/status").json()
            return bool(status["ready"]) and httpx.get(f"http://127.0.0.1:{port}/health").json()["status"] == "ok"

        wait_ready(daemon, ready, "the demo daemon", 300, log)
        ran, wrong = [], []
        for doc, command, expected in console_samples():
            if not (match := OFFLINE.match(command)):
                continue
            args = __import__("shlex").split(command[match.start(1):])
            done = subprocess.run([sys.executable, "-m", "indexer", *args], capture_output=True, text=True, env=env,
                                  timeout=120)
            assert done.returncode == 0, (command, done.stderr)
            printed = (done.stdout + done.stderr).splitlines()
            ran.append(command)
            if missing := same_shape(expected, printed):
                wrong.append(f"{doc}: `{command}` printed:\n" + "\n".join(printed) + f"\nnot: {missing}")
        print("samples run:", *ran, sep="\n  ")
        assert not wrong, "\n\n".join(wrong)
        _the_readme_examples_run(port, env)
    finally:
        end(daemon, signal.SIGTERM)


def demo_command(state: Path, port: int) -> list[str]:
    """The arguments ``make demo`` gives ``qmd-indexer`` (its Makefile recipe), with its state dir and port."""
    recipe = re.search(r"^\t.*/qmd-indexer (run .*)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert recipe, "no qmd-indexer run line in the Makefile"
    line = recipe.group(1).replace("$(STATE)", str(state)).replace("$(PORT)", str(port))
    return __import__("shlex").split(line)


def _the_readme_examples_run(port: int, env: dict[str, str]) -> None:
    """The README's command-line ``append`` example and its Python example (every call, ``append`` included) work
    on the demo as ``make demo`` serves it."""
    import subprocess
    import sys

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    appends = [line.split("  #")[0].strip() for line in re.findall(r"^qmd-indexer append .*$", readme, re.MULTILINE)]
    assert appends
    for command in appends:
        args = __import__("shlex").split(command)[1:]
        done = subprocess.run([sys.executable, "-m", "indexer", *args, "--port", str(port)], capture_output=True,
                              text=True, env=env, timeout=120)
        assert done.returncode == 0 and "#L" in done.stdout, (command, done.stdout, done.stderr)
    [python] = [block for block in re.findall(r"^```python\n(.*?)^```", readme, re.MULTILINE | re.DOTALL)
                if "from indexer.client import Client" in block]
    python += "\nassert entry['citation'].startswith('memory/') and answer['hits'] and listing['total'] >= 4\n"
    done = subprocess.run([sys.executable, "-c", python.replace("port=8743", f"port={port}")], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
