"""`make fuzz`: schemathesis against a real daemon, from the API's own OpenAPI schema, with a bounded run.

Starts `qmd-indexer run` on a copy of ``deploy/demo-workspace`` (plus a symlink to a file outside it, so traversal
and symlink inputs have something to find) on a free loopback port, waits until it is ready, runs
``schemathesis run`` with ``--max-examples`` per operation (``FUZZ_EXAMPLES``, default 100) and a fixed seed, and
checks every answer: no 5xx (``not_a_server_error``), the declared content type, the declared response schema. At
the end the daemon's log is searched for the outside file's text. Exit status: schemathesis's, or 1 when the
outside text leaked. Not collected by pytest (no ``test_`` prefix): it takes minutes.

    HF_HUB_OFFLINE=1 python tests/fuzz_api.py [--examples N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE = "OUTSIDE-FUZZ-SECRET-22c7"
#: what every answer is checked for: no 5xx; the declared content type, status code and response schema; and that
#: the server and the published request schema agree both ways (a request the schema allows is not refused with
#: 4xx for its shape, one it forbids is refused)
CHECKS = ("not_a_server_error,content_type_conformance,status_code_conformance,response_schema_conformance,"
          "positive_data_acceptance,negative_data_rejection")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=int(os.environ.get("FUZZ_EXAMPLES", "100")))
    parser.add_argument("--seed", type=int, default=8)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="qmd-fuzz-"))
    ws = base / "ws"
    shutil.copytree(ROOT / "deploy" / "demo-workspace", ws)
    (base / "outside.md").write_text(f"# Outside\n\n{OUTSIDE}\n")
    (ws / "memory" / "link.md").symlink_to(base / "outside.md")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "QMD_INDEXER_LOG_FORMAT": "json"}
    log = base / "daemon.log"
    with open(log, "w") as stderr:
        daemon = subprocess.Popen([sys.executable, "-m", "indexer.cli", "run", "--workspace", str(ws), "--agent",
                                   "demo", "--state-dir", str(base / "state"), "--port", str(port)],
                                  cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while not _ready(url):
            if daemon.poll() is not None or time.monotonic() > deadline:
                print(log.read_text(), file=sys.stderr)
                return 1
            time.sleep(0.5)
        schemathesis = [str(Path(sys.executable).with_name("schemathesis")), "run", f"{url}/openapi.json",
                        "--checks", CHECKS,
                        "--max-examples", str(args.examples), "--seed", str(args.seed), "--workers", "1",
                        "--phases", "examples,coverage,fuzzing", "--request-timeout", "30"]
        print("$", " ".join(schemathesis), flush=True)
        code = subprocess.run(schemathesis, cwd=base).returncode
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    text = log.read_text()
    errors = [line for line in text.splitlines() if '"level": "error"' in line and "file_" not in line]
    print(f"daemon log: {len(text.splitlines())} lines, {len(errors)} error lines", flush=True)
    for line in errors[:10]:
        print("  ", line[:300])
    shutil.rmtree(base, ignore_errors=True)
    if OUTSIDE in text:
        print("FAIL: the outside file's text reached the daemon's log", file=sys.stderr)
        return 1
    return code or (1 if errors else 0)


def _ready(url: str) -> bool:
    try:
        return bool(httpx.get(f"{url}/health", timeout=2).json().get("ready"))
    except (httpx.HTTPError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
