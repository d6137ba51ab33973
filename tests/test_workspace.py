"""Which files are memory: root file rules, memory/, extra paths, symlinks, repair dir, collection names."""

from __future__ import annotations

import os
import re
from pathlib import Path

from conftest import write

from indexer.config import Workspace
from indexer.walk import route, walk
from indexer.workspace import plan_collections


def _ws(path: Path, agent: str = "main", extra: tuple[str, ...] = ()) -> Workspace:
    return Workspace(agent=agent, path=path, extra_paths=tuple(Path(e) for e in extra))


def _found(ws: Workspace) -> tuple[dict[str, str], list[tuple[str, str]]]:
    found, skips = walk(plan_collections([ws]))
    return ({p.relative_to(ws.path).as_posix(): c.name for c, p in found},
            [(s.path.name, s.reason) for s in skips])


def test_root_file_and_memory_dir_recursive(tmp_path: Path) -> None:
    write(tmp_path / "MEMORY.md", "root")
    write(tmp_path / "memory" / "a.md", "a")
    write(tmp_path / "memory" / "deep" / "er" / "b.md", "b")
    write(tmp_path / "notes.md", "not memory: at the root but not a root memory name")
    found, skips = _found(_ws(tmp_path))
    assert found == {"MEMORY.md": "memory-root-main", "memory/a.md": "memory-dir-main",
                     "memory/deep/er/b.md": "memory-dir-main"}
    assert skips == []


def test_legacy_root_name_used_when_canonical_absent(tmp_path: Path) -> None:
    write(tmp_path / "memory.md", "legacy")
    found, _ = _found(_ws(tmp_path))
    assert found == {"memory.md": "memory-root-main"}


def test_split_root_memory_indexes_canonical_and_reports(tmp_path: Path) -> None:
    write(tmp_path / "MEMORY.md", "canonical")
    write(tmp_path / "memory.md", "legacy")
    found, skips = _found(_ws(tmp_path))
    assert found == {"MEMORY.md": "memory-root-main"}
    assert skips == [("memory.md", "split_root_memory")]


def test_one_file_under_both_root_names_is_indexed_once(tmp_path: Path) -> None:
    # what a case-insensitive filesystem shows: two names, one file (here a hard link)
    write(tmp_path / "MEMORY.md", "one file")
    os.link(tmp_path / "MEMORY.md", tmp_path / "memory.md")
    found, skips = _found(_ws(tmp_path))
    assert found == {"MEMORY.md": "memory-root-main"}
    assert skips == []
    collections = plan_collections([_ws(tmp_path)])
    assert route(collections, tmp_path / "memory.md") == (None, None)


def test_symlinks_are_never_followed_and_reported(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(ws / "memory" / "real.md", "real")
    (ws / "memory" / "passwd.md").symlink_to("/etc/passwd")
    outside = write(tmp_path / "outside" / "secret.md", "secret")
    (ws / "memory" / "linked-dir").symlink_to(outside.parent)
    found, skips = _found(_ws(ws))
    assert found == {"memory/real.md": "memory-dir-main"}
    assert sorted(skips) == [("linked-dir", "symlink"), ("passwd.md", "symlink")]
    collections = plan_collections([_ws(ws)])
    assert route(collections, ws / "memory" / "linked-dir" / "secret.md") == (None, "symlink")


def test_symlinked_memory_dir_is_skipped(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(tmp_path / "elsewhere" / "note.md", "outside the workspace")
    ws.mkdir()
    (ws / "memory").symlink_to(tmp_path / "elsewhere")
    found, skips = _found(_ws(ws))
    assert found == {}
    assert skips == [("memory", "symlink")]
    assert route(plan_collections([_ws(ws)]), ws / "memory" / "note.md") == (None, "symlink")


def test_repair_archive_and_hidden_names_are_skipped(tmp_path: Path) -> None:
    write(tmp_path / "memory" / ".openclaw-repair" / "root-memory" / "x" / "memory.md", "archived")
    write(tmp_path / "memory" / ".obsidian" / "workspace.md", "editor state")
    write(tmp_path / "memory" / ".note.md.swp", "swap")
    write(tmp_path / "memory" / "kept.md", "kept")
    found, _ = _found(_ws(tmp_path))
    assert found == {"memory/kept.md": "memory-dir-main"}
    assert route(plan_collections([_ws(tmp_path)]), tmp_path / "memory" / ".obsidian" / "workspace.md") == \
        (None, "hidden")


def test_extra_path_overlapping_memory_dir_is_indexed_once(tmp_path: Path) -> None:
    write(tmp_path / "memory" / "projects" / "p.md", "project")
    write(tmp_path / "notes" / "n.md", "extra")
    single = write(tmp_path / "ideas.md", "single extra file")
    ws = _ws(tmp_path, extra=("memory/projects", "notes", str(single), "notes/"))
    found, _ = _found(ws)
    assert found == {"memory/projects/p.md": "memory-dir-main", "notes/n.md": "memory-extra-notes--main",
                     "ideas.md": "memory-extra-ideas--main"}
    names = [c.name for c in plan_collections([ws])]
    assert names == ["memory-root-main", "memory-dir-main", "memory-extra-projects--main",
                     "memory-extra-notes--main", "memory-extra-ideas--main"]


def test_collection_names_keep_safe_ids_readable_and_hash_the_others(tmp_path: Path) -> None:
    from indexer.workspace import agent_slug

    plan = plan_collections([_ws(tmp_path, "Main"), _ws(tmp_path, "main"), _ws(tmp_path, "Ops Bot/2")])
    main, ops = agent_slug("Main"), agent_slug("Ops Bot/2")
    assert main.startswith("main--") and ops.startswith("ops-bot-2--")
    assert [c.name for c in plan] == [f"memory-root-{main}", f"memory-dir-{main}", "memory-root-main",
                                      "memory-dir-main", f"memory-root-{ops}", f"memory-dir-{ops}"]
    # the names before hashes (``former``: a store under them moves once), set only where they differ
    assert [c.former for c in plan] == ["memory-root-main", "memory-dir-main", "memory-root-main-2",
                                        "memory-dir-main-2", "memory-root-ops-bot-2", "memory-dir-ops-bot-2"]
    names = [c.name for c in plan]
    assert all(re.fullmatch(r"[a-z0-9-]+", n) for n in names)
    assert len(set(names)) == len(names)


def test_collection_prefix_keeps_two_machines_apart(tmp_path: Path) -> None:
    laptop = [c.name for c in plan_collections([_ws(tmp_path, "main")], "laptop-")]
    desk = [c.name for c in plan_collections([_ws(tmp_path, "main")], "desk-")]
    assert laptop == ["laptop-memory-root-main", "laptop-memory-dir-main"]
    assert desk == ["desk-memory-root-main", "desk-memory-dir-main"]
