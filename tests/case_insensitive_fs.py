"""A case-insensitive FUSE file system over a directory (fusepy), as a macOS volume or a Windows share mounted on
Linux behaves: ``memory.md`` opens ``MEMORY.md`` (the same inode, one link), while listings show the names as stored.
A real mount of real files, for the tests of names written under another spelling (``tests/test_unicode_names.py``).

Run as ``python tests/case_insensitive_fs.py BACKING MOUNTPOINT`` (foreground; unmount with ``fusermount -u``).
Needs fusepy and libfuse2 (``apt-get install libfuse2``); ``mount_case_insensitive`` skips the test without them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def lookup(root: str, path: str) -> str:
    """The backing path of ``path``: each component matched case-insensitively against the names stored (the stored
    name when one matches, else the component as given, for a file about to be created)."""
    here = root
    for part in [p for p in path.split("/") if p]:
        try:
            names = os.listdir(here)
        except OSError:
            names = []
        match = [n for n in names if n.casefold() == part.casefold()]
        here = os.path.join(here, match[0] if part not in names and match else part)
    return here


def serve(root: str, mountpoint: str) -> None:
    from fuse import FUSE, FuseOSError, Operations

    class CaseInsensitive(Operations):  # type: ignore[misc]
        def _call(self, fn: Any, *args: Any) -> Any:
            try:
                return fn(*args)
            except OSError as exc:
                raise FuseOSError(exc.errno) from None

        def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
            st = self._call(os.lstat, lookup(root, path))
            return {key: getattr(st, key) for key in ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime",
                                                      "st_nlink", "st_size", "st_uid", "st_ino")}

        def readdir(self, path: str, fh: Any) -> list[str]:
            return [".", "..", *self._call(os.listdir, lookup(root, path))]

        def open(self, path: str, flags: int) -> int:
            return int(self._call(os.open, lookup(root, path), flags))

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            return int(self._call(os.open, lookup(root, path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode))

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return bytes(self._call(os.pread, fh, size, offset))

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            return int(self._call(os.pwrite, fh, data, offset))

        def truncate(self, path: str, length: int, fh: Any = None) -> None:
            self._call(os.truncate, lookup(root, path), length)

        def unlink(self, path: str) -> None:
            self._call(os.unlink, lookup(root, path))

        def mkdir(self, path: str, mode: int) -> None:
            self._call(os.mkdir, lookup(root, path), mode)

        def rename(self, old: str, new: str) -> None:
            self._call(os.rename, lookup(root, old), lookup(root, new))

        def utimens(self, path: str, times: Any = None) -> None:
            self._call(os.utime, lookup(root, path), times)

        def chmod(self, path: str, mode: int) -> None:
            self._call(os.chmod, lookup(root, path), mode)

        def release(self, path: str, fh: int) -> None:
            os.close(fh)

        def flush(self, path: str, fh: int) -> None:
            return None

        def fsync(self, path: str, datasync: int, fh: int) -> None:
            self._call(os.fsync, fh)

    FUSE(CaseInsensitive(), mountpoint, foreground=True, use_ino=True)


def mount_case_insensitive(backing: Path, mountpoint: Path) -> subprocess.Popen[bytes]:
    """Mount ``backing`` case-insensitively at ``mountpoint`` (made here) in a child process; returns it once the
    mount is up. Skips the calling test when fusepy, libfuse or FUSE itself is not available here."""
    import pytest

    pytest.importorskip("fuse", reason="fusepy is not installed (pip install fusepy; apt-get install libfuse2)")
    mountpoint.mkdir(parents=True)
    child = subprocess.Popen([sys.executable, __file__, str(backing), str(mountpoint)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while not os.path.ismount(mountpoint):
        if child.poll() is not None:
            pytest.skip(f"cannot mount FUSE here: {child.stderr.read().decode()[-300:] if child.stderr else ''}")
        if time.monotonic() > deadline:
            child.kill()
            pytest.fail("the case-insensitive mount did not come up within 20 s")
        time.sleep(0.05)
    return child


def unmount(mountpoint: Path, child: subprocess.Popen[bytes]) -> None:
    subprocess.run(["fusermount", "-u", str(mountpoint)], capture_output=True)
    try:
        child.wait(10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(10)
    if child.stderr is not None:
        child.stderr.close()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
