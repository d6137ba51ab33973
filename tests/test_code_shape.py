"""The code stays easy to change: no function over 60 lines and no module over 400 in the package or the plugins,
``daemon.py`` (the map a newcomer reads first) at most 250 lines, the README at most 300, and only
``indexer/store/`` talks to Qdrant."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import write

REPO = Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 400


def test_no_function_is_over_60_lines() -> None:
    long = []
    for path in sorted([*(REPO / "indexer").rglob("*.py"), *(REPO / "plugins").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these into helpers whose names say their job:\n" + "\n".join(long)


def modules_over(limit: int, *packages: Path) -> list[str]:
    """``path (n lines)`` of each module of ``packages`` longer than ``limit`` lines, the path relative to the
    packages' folder (``indexer/search.py``)."""
    found = []
    for package in packages:
        for path in sorted(package.rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > limit:
                found.append(f"{path.relative_to(package.parent)} ({lines} lines)")
    return found


def test_every_module_is_at_most_400_lines() -> None:
    long = modules_over(MAX_MODULE_LINES, REPO / "indexer", REPO / "plugins")
    assert not long, ("split these along a seam, each part a module whose name says its one job (a cohesive group "
                      "of functions moved, not comments trimmed):\n" + "\n".join(long))


def test_the_size_check_finds_a_module_grown_past_400_lines(tmp_path: Path) -> None:
    write(tmp_path / "indexer" / "__init__.py", "")
    write(tmp_path / "indexer" / "kept.py", "x = 1\n" * MAX_MODULE_LINES)
    write(tmp_path / "indexer" / "store" / "grown.py", "x = 1\n" * (MAX_MODULE_LINES + 1))
    write(tmp_path / "plugins" / "example" / "grown.py", "x = 1\n" * 500)
    assert modules_over(MAX_MODULE_LINES, tmp_path / "indexer", tmp_path / "plugins") == [
        "indexer/store/grown.py (401 lines)", "plugins/example/grown.py (500 lines)"]


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


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (at the top, inside functions or under ``TYPE_CHECKING``: an
    import anywhere is an arrow), from the source of every module of ``package``."""
    base = package.parent
    modules = {".".join(p.relative_to(base).with_suffix("").parts).removesuffix(".__init__"): p
               for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                named = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            else:
                continue
            graph[module] |= {n for n in named if n in modules and n != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan's algorithm, iterative),
    each sorted: the import circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            step = next((w for w in edges if w not in index or w in stack), None)
            if step is not None and step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                work.append((step, iter(sorted(graph[step]))))
                continue
            if step is not None:
                low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = stack[stack.index(node):]
                del stack[stack.index(node):]
                if len(part) > 1:
                    found.append(sorted(part))
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert not circles(import_graph(REPO / "indexer")), "break these circles (a helper moved down, a type passed in)"


def test_the_circle_check_finds_a_circle_made_on_purpose(tmp_path: Path) -> None:
    write(tmp_path / "indexer" / "__init__.py", "")
    write(tmp_path / "indexer" / "a.py", "from indexer.b import x\n")
    write(tmp_path / "indexer" / "b.py", "def f():\n    from indexer import c\n")
    write(tmp_path / "indexer" / "c.py",
          "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from indexer.a import y\n")
    write(tmp_path / "indexer" / "d.py", "import indexer.a\n")
    assert circles(import_graph(tmp_path / "indexer")) == [["indexer.a", "indexer.b", "indexer.c"]]


def _reached(graph: dict[str, set[str]], module: str) -> set[str]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        for n in graph[todo.pop()] - seen:
            seen.add(n)
            todo.append(n)
    return seen


def test_the_plugin_contract_and_the_payload_schema_stand_on_their_own() -> None:
    """``indexer.api`` (what a plugin imports) reaches no built-in plugin, and ``schema``/``points`` (the wire and
    payload shapes) reach no store or pipeline: the lower floors never lean on the rooms above them."""
    graph = import_graph(REPO / "indexer")
    assert not {m for m in _reached(graph, "indexer.api") if m.startswith("indexer.builtin")}
    for shapes in ("indexer.schema", "indexer.points"):
        assert not {m for m in _reached(graph, shapes) if m.startswith(("indexer.store", "indexer.pipeline"))}
