"""A real OpenClaw for the tests (``tests/openclaw/gateway.py``'s, no pytest there, so the benchmark uses it too).

Without Node 24 and OpenClaw installed (``make openclaw``), a test that needs them skips and says how to get them;
under ``CI=true`` it fails instead (``.ci/run`` installs them, so nothing may skip there).

    from openclaw import need_openclaw, OpenClaw

    need_openclaw()
    claw = OpenClaw(tmp_path)
    claw.write_config({...}); claw.cli("plugins", "install", ...); claw.start(); claw.invoke("memory_search", {...})
"""

from __future__ import annotations

import os

import pytest

from openclaw.gateway import OpenClaw, missing  # noqa: F401  (re-exported for the tests)


def need_openclaw() -> None:
    """Skip the calling test when Node 24 or OpenClaw is not installed (fail under ``CI=true``)."""
    reason = missing()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must install OpenClaw: {reason}")
        pytest.skip(reason)
