"""``make install`` (which ``make demo``, ``make test`` and the other targets run first) is safe to start twice at
once, as two shells following the README do: the second waits for the first and then finds the virtualenv made,
instead of installing into it at the same time (pip died with a traceback)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Stands in for `python3 -m venv DIR`: a virtualenv whose pip records each call and takes a while, so that the
# real Makefile recipe runs end to end in a second instead of downloading gigabytes.
FAKE_PYTHON = """#!/bin/sh
[ "$1 $2" = "-m venv" ] || exit 9
echo "venv $3" >> "$FAKE_LOG"
mkdir -p "$3/bin"
printf '#!/bin/sh\\necho "pip $*" >> "$FAKE_LOG"\\nsleep 0.2\\n' > "$3/bin/pip"
chmod +x "$3/bin/pip"
"""


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_two_make_installs_at_once_install_once(tmp_path: Path) -> None:
    python = tmp_path / "python3"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    log, venv = tmp_path / "install.log", tmp_path / "venv"
    command = ["make", "-C", str(ROOT), "--no-print-directory", "install", f"PYTHON={python}", f"VENV={venv}"]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "FAKE_LOG": str(log)}
    runs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=120)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    calls = log.read_text().splitlines()
    assert calls.count(f"venv {venv}") == 1, calls  # one of them made the virtualenv and installed; the other waited
    assert sum(call.startswith("pip install") for call in calls) == sum(
        line.lstrip().startswith("$(BIN)/pip install") for line in (ROOT / "Makefile").read_text().splitlines())
    assert (venv / "bin" / "qmd-indexer").exists()
