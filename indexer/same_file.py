"""One file, two names: a hard link (``memory.md`` linked to ``MEMORY.md``), or one name spelled another way on a
case-insensitive or normalising file system. The file is indexed once, under the name the walk met first
(``indexed_name``, asked by ``indexer.sync`` for each file event)."""

from __future__ import annotations

import os
import stat
import unicodedata
from pathlib import Path

from indexer.state import IndexState
from indexer.workspace import ROOT_NAMES


def indexed_name(state: IndexState, key: str, st: os.stat_result) -> str | None:
    """One file, two names (a hard link; ``memory.md`` linked to ``MEMORY.md``; or one name spelled another way
    on a case-insensitive or normalising file system): the file is indexed once, under the name the walk met
    first. An event names only the name written through, so for a name that is not indexed this returns the
    indexed name of the same (device, inode), if any, still that file on disk. Another spelling is looked for
    among the root memory names only (``MEMORY.md``...: the same name under case folding and NFC)."""
    if not stat.S_ISREG(st.st_mode) or key in state.indexed:
        return None
    if st.st_nlink < 2:
        path = Path(key)
        spelled = _folded(path.name)
        candidates = [str(path.parent / name) for pair in ROOT_NAMES for name in pair if _folded(name) == spelled]
    else:
        candidates = state.indexed_as(st.st_ino, st.st_dev)
    for abs_path in [p for p in candidates if p in state.indexed]:
        if abs_path != key:
            try:
                if os.path.samestat(os.lstat(abs_path), st):
                    return abs_path
            except OSError:
                continue
    return None


def _folded(name: str) -> str:
    """``name`` as a case-insensitive, normalising file system compares it: NFC, case-folded."""
    return unicodedata.normalize("NFC", name).casefold()
