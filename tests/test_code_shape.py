"""The code stays easy to change: no function over 60 lines in the package or the plugins, ``daemon.py`` (the map
a newcomer reads first) at most 250 lines, the README at most 300, and only ``indexer/store/`` talks to Qdrant."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import write

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


#: a qdrant-client client in use: its class, an import of the package (but for ``qdrant_client.hybrid``'s pure fusion
#: functions), or a request through a store's ``client`` (``indexer.client``'s HTTP ``Client`` has ``ask``/``status``)
_QDRANT = re.compile(r"\bQdrantClient\b|^\s*(?:from|import) qdrant_client(?!\.hybrid)\b|\.client\.(?!ask\b|status\b)"
                     r"\w+\(", re.MULTILINE)


def qdrant_outside_the_store(package: Path) -> list[str]:
    """``path:line`` of each use of a qdrant-client client in ``package`` outside its ``store/`` (the wall the
    ``indexer.store`` docstring states: only ``store/`` talks to Qdrant)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if "store" in path.relative_to(package).parts[:1]:
            continue
        text = path.read_text(encoding="utf-8")
        found += [f"{path.relative_to(package.parent)}:{text.count(chr(10), 0, m.start()) + 1}"
                  for m in _QDRANT.finditer(text)]
    return found


def test_only_the_store_talks_to_qdrant() -> None:
    assert not qdrant_outside_the_store(REPO / "indexer"), "move these requests into indexer/store/"


def test_the_wall_check_finds_a_request_made_outside_the_store(tmp_path: Path) -> None:
    write(tmp_path / "indexer" / "store" / "server.py", "self.client.upsert(name, points)\n")
    write(tmp_path / "indexer" / "migrate.py", "x = 1\nsource.client.collection_exists(probe)\n")
    write(tmp_path / "indexer" / "ranking.py", "from qdrant_client.hybrid.fusion import reciprocal_rank_fusion\n")
    write(tmp_path / "indexer" / "other.py", "from qdrant_client import QdrantClient\n")
    assert qdrant_outside_the_store(tmp_path / "indexer") == ["indexer/migrate.py:2", "indexer/other.py:1",
                                                              "indexer/other.py:1"]
