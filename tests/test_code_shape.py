"""The code stays easy to change: no function over 60 lines in the package or the plugins, ``daemon.py`` (the map
a newcomer reads first) at most 250 lines, and the README at most 300."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 60


def test_no_function_is_over_60_lines() -> None:
    long = []
    for path in sorted([*(REPO / "indexer").rglob("*.py"), *(REPO / "plugins").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these into helpers whose names say their job:\n" + "\n".join(long)


def test_the_daemon_module_and_the_readme_stay_short() -> None:
    assert len((REPO / "indexer" / "daemon.py").read_text(encoding="utf-8").splitlines()) <= 250
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 300
