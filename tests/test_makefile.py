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


def _pip_installs(tmp_path: Path, target: str, **variables: Path) -> list[str]:
    """Run ``make target`` of the real Makefile with ``FAKE_PYTHON`` as ``PYTHON`` (and ``variables``); returns the
    ``pip install`` calls its recipes made, in order. Fails the test when make fails."""
    python = tmp_path / "python3"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    log = tmp_path / "install.log"
    run = subprocess.run(["make", "-C", str(ROOT), "--no-print-directory", target, f"PYTHON={python}",
                          *(f"{name}={value}" for name, value in variables.items())],
                         env={"PATH": "/usr/local/bin:/usr/bin:/bin", "FAKE_LOG": str(log)},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return [call for call in log.read_text().splitlines() if call.startswith("pip install")]


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


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_service_venv_is_lean_and_the_readme_steps_have_no_placeholder(tmp_path: Path) -> None:
    """The README's service steps build the service's virtualenv with ``make service-venv``: the package (int8
    included), not the test, bench and lint extras nor the media plugins that ``make install`` adds (2.4 GB), and no
    step asks the operator to fill in a ``<placeholder>``."""
    installs = _pip_installs(tmp_path, "service-venv", PREFIX=tmp_path / "opt")
    assert any(call.endswith("--upgrade .") for call in installs), installs
    assert not any(word in call for call in installs for word in ("test", "bench", "lint", "plugins/", "-e ")), installs
    readme = (ROOT / "README.md").read_text()
    steps = readme[readme.index("## Running as a service"):readme.index("## Security")]
    assert "make service-venv" in steps
    assert "<" not in "".join(line for line in steps.splitlines() if line.startswith("sudo ")), steps


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_installs_the_package_alone_and_a_plain_install_gets_the_int8_path(tmp_path: Path) -> None:
    """``make demo`` used to install the test, bench and lint extras and both media plugins (2.4 GB, minutes)
    before its first answer; and a plain ``pip install`` of the package lacked ONNX Runtime, so CPUs without bf16
    ran fp32 (about 4x slower saves, 3x slower searches) where ``make install`` ran int8."""
    import tomllib

    installs = _pip_installs(tmp_path, "install-lean", VENV=tmp_path / "venv")
    assert installs[-1].endswith("-e ."), installs
    assert not any(word in call for call in installs for word in ("test", "bench", "lint", "plugins/")), installs
    demo = next(line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("demo:"))
    assert demo.split("##")[0].split(":")[1].split() == ["install-lean"], demo
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert {"onnx", "onnxruntime", "tokenizers"} <= {d.split(">")[0].split("=")[0].strip() for d in dependencies}


def test_make_demo_serves_a_copy_outside_the_checkout(tmp_path: Path) -> None:
    """``make demo`` indexes and serves a copy of ``deploy/demo-workspace`` under its state dir, so an append or an
    edit made while trying it leaves the checkout clean (it used to write ``memory/<today>.md`` into the tree)."""
    state = tmp_path / "demo"
    plan = subprocess.run(["make", "-C", str(ROOT), "--no-print-directory", "-n", "demo", f"STATE={state}"],
                          capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert f"cp -R deploy/demo-workspace {state}/workspace" in plan.stdout
    run = next(line for line in plan.stdout.splitlines() if " run --workspace " in line)
    assert f"--workspace {state}/workspace" in run and f"--state-dir {state}" in run, run
