"""systemd integration: the sd_notify protocol against a real AF_UNIX datagram socket, journald priorities, and
the unit file checked by systemd-analyze."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from indexer.systemd import Notifier, journal_priority, watchdog_interval_s

ROOT = Path(__file__).resolve().parent.parent


def test_notifier_sends_the_sd_notify_datagrams(listener: socket.socket, tmp_path: Path) -> None:
    notifier = Notifier(str(tmp_path / "notify.sock"))
    assert notifier.ready("indexed 3 files")
    assert listener.recv(4096).decode() == "READY=1\nSTATUS=indexed 3 files"
    assert notifier.watchdog() and listener.recv(4096) == b"WATCHDOG=1"
    assert notifier.status("queue 2\nlines") and listener.recv(4096) == b"STATUS=queue 2 lines"
    assert notifier.stopping() and listener.recv(4096) == b"STOPPING=1"
    notifier.close()


def test_abstract_socket_names_and_no_socket() -> None:
    name = f"qmd-indexer-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        notifier = Notifier("@" + name)
        assert notifier.ready() and sock.recv(64) == b"READY=1"
        notifier.close()
    silent = Notifier("")
    assert not silent.enabled and not silent.ready()


def test_watchdog_interval_is_for_this_process_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog_interval_s() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert watchdog_interval_s() is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval_s() == 30.0
    monkeypatch.delenv("WATCHDOG_USEC")
    assert watchdog_interval_s() is None


def test_journald_lines_carry_their_priority(tmp_path: Path) -> None:
    """With JOURNAL_STREAM naming stderr, each JSON line starts with <N>; elsewhere lines are unchanged."""
    code = ("from indexer.cli import configure_logging; import structlog; configure_logging('json');"
            "log = structlog.get_logger('t'); log.error('bad'); log.warning('hmm'); log.info('fine')")
    err = tmp_path / "stderr"
    with open(err, "w") as handle:
        st = os.fstat(handle.fileno())
        env = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        subprocess.run([sys.executable, "-c", code], stderr=handle, env=env, check=True, timeout=60)
    lines = err.read_text().splitlines()
    assert [line[:3] for line in lines] == ["<3>", "<4>", "<6>"], lines
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"})
    assert all(line.startswith("{") for line in plain.stderr.splitlines())
    assert journal_priority("critical") == 2 and journal_priority("debug") == 7


def test_root_logger_chatter_below_warning_is_dropped() -> None:
    """A library logging INFO on the root logger itself (ONNX Runtime's quantization does, ~60 lines at the first
    int8 export) prints nothing; its warnings and named loggers' INFO lines still print."""
    code = ("import logging; from indexer.cli import configure_logging; configure_logging('json');"
            "logging.info('chatter'); logging.warning('root warning'); logging.getLogger('lib').info('named info')")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"})
    events = [json.loads(line)["event"] for line in run.stderr.splitlines()]
    assert events == ["root warning", "named info"], run.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed "
                    "(Debian package systemd); .ci/run installs it")
def test_unit_file_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """The shipped unit, with ExecStart pointed at this checkout's executable: no error and no warning."""
    result = subprocess.run(["systemd-analyze", "verify", str(_unit_copy(tmp_path))], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and "qmd-indexer.service" not in result.stderr, result.stderr


def _unit_copy(tmp_path: Path) -> Path:
    """The shipped unit with ExecStart pointed at this checkout's executable (the unit names /opt/qmd-indexer)."""
    unit = (ROOT / "deploy" / "qmd-indexer.service").read_text()
    executable = Path(sys.executable).parent / "qmd-indexer"
    if not executable.exists():
        pytest.skip(f"{executable} is not installed (make install)")
    copy = tmp_path / "qmd-indexer.service"
    copy.write_text(unit.replace("/opt/qmd-indexer/.venv/bin/qmd-indexer", str(executable)))
    return copy


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed "
                    "(Debian package systemd); .ci/run installs it")
def test_unit_file_exposure_is_at_most_3(tmp_path: Path) -> None:
    """``systemd-analyze security`` rates the shipped unit's sandbox (0 safe ... 10 exposed); it was 8.6 EXPOSED
    with only NoNewPrivileges, ProtectSystem, ProtectHome and PrivateTmp. ``--offline`` (systemd 250+) reads the
    file instead of a loaded unit."""
    import re

    result = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(_unit_copy(tmp_path))],
                            capture_output=True, text=True, timeout=60)
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert found, result.stdout + result.stderr
    print(result.stdout)
    assert float(found.group(1)) <= 3.0, result.stdout


def _unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in (ROOT / "deploy" / "qmd-indexer.service").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_unit_start_timeout_is_finite_and_a_config_error_is_not_restarted() -> None:
    """Start-up has a finite timeout (the daemon extends it with EXTEND_TIMEOUT_USEC while its first index makes
    progress: systemd arms the watchdog only after READY=1); exit 2 (config error) is not restarted every
    RestartSec; state is private (UMask, StateDirectoryMode)."""
    unit = _unit_settings()
    assert unit["TimeoutStartSec"] != ["infinity"] and len(unit["TimeoutStartSec"]) == 1, unit["TimeoutStartSec"]
    assert unit["RestartPreventExitStatus"] == ["2"]
    assert unit["UMask"] == ["0077"] and unit["StateDirectoryMode"] == ["0700"]


def test_unit_is_type_notify_with_a_watchdog() -> None:
    unit = (ROOT / "deploy" / "qmd-indexer.service").read_text().splitlines()
    for line in ("Type=notify", "NotifyAccess=main", "WatchdogSec=60s", "ExecReload=/bin/kill -HUP $MAINPID"):
        assert line in unit, line


def test_daemon_notifies_ready_status_watchdog_and_stopping_in_order(workspace: Path, tmp_path: Path,
                                                                      listener: socket.socket) -> None:
    """``qmd-indexer run`` (real model, real store) under a systemd-compatible listener: READY=1 after the first
    index, STATUS= with the files indexed, WATCHDOG=1 repeatedly (WATCHDOG_USEC 2 s), STOPPING=1 on SIGTERM."""
    import signal
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "QMD_INDEXER_LOG_FORMAT": "json",
           "NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "2000000"}
    env.pop("WATCHDOG_PID", None)
    with open(tmp_path / "run.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "indexer.cli", "run", "--workspace", str(workspace),
                                 "--state-dir", str(tmp_path / "state"), "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=log, env=env)
    messages: list[str] = []
    try:
        listener.settimeout(120)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and sum(m == "WATCHDOG=1" for m in messages) < 3 or not any(
                m.startswith("READY=1") for m in messages):
            messages.append(listener.recv(4096).decode())
        proc.send_signal(signal.SIGTERM)
        listener.settimeout(30)
        while "STOPPING=1" not in messages:
            messages.append(listener.recv(4096).decode())
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print("notify sequence:", messages)
    ready = next(i for i, m in enumerate(messages) if m.startswith("READY=1"))
    assert "STATUS=4 files indexed, queue 0" in messages[ready], messages
    assert any(m.startswith("EXTEND_TIMEOUT_USEC=") for m in messages[:ready]), messages
    assert not any(m.startswith("EXTEND_TIMEOUT_USEC=") for m in messages[ready:]), messages
    assert any(m == "WATCHDOG=1" for m in messages[ready:]), messages
    assert messages[-1] == "STOPPING=1" and messages.count("STOPPING=1") == 1, messages


def test_start_up_progress_extends_the_start_timeout(listener: socket.socket, tmp_path: Path) -> None:
    """Before READY=1 each beat (at most every quarter of the extension) sends EXTEND_TIMEOUT_USEC=<watchdog>, so
    a first index that makes progress outlives TimeoutStartSec and one stuck on a file for longer than the
    watchdog interval fails the start; after READY=1 beats send WATCHDOG=1 only."""
    from indexer.systemd import Supervisor

    now = [0.0]
    supervisor = Supervisor(Notifier(str(tmp_path / "notify.sock")), 60.0, clock=lambda: now[0])
    listener.settimeout(5)
    supervisor.beat()
    assert sorted(listener.recv(4096).decode() for _ in range(2)) == ["EXTEND_TIMEOUT_USEC=60000000", "WATCHDOG=1"]
    now[0] = 5.0
    supervisor.beat()  # within a quarter of the interval: nothing
    now[0] = 16.0
    supervisor.beat()
    assert sorted(listener.recv(4096).decode() for _ in range(2)) == ["EXTEND_TIMEOUT_USEC=60000000", "WATCHDOG=1"]
    supervisor.ready(0, 4)
    assert listener.recv(4096).decode().startswith("READY=1")
    now[0] = 40.0
    supervisor.beat()
    assert listener.recv(4096) == b"WATCHDOG=1"
    listener.settimeout(0.3)
    with pytest.raises(TimeoutError):
        listener.recv(4096)
    supervisor.notifier.close()


def test_ready_waits_until_the_api_listens(listener: socket.socket, tmp_path: Path) -> None:
    """``READY=1`` goes out only once the HTTP API is listening: a first index of a few files used to end before
    uvicorn had bound its port, and a client told "ready" was refused (seen in CI as a connection refused)."""
    import threading

    from indexer.systemd import Supervisor

    listening = threading.Event()
    supervisor = Supervisor(Notifier(str(tmp_path / "notify.sock")), None, listening=listening)
    said = threading.Thread(target=supervisor.ready, args=(0, 2))
    said.start()
    listener.settimeout(0.3)
    with pytest.raises(TimeoutError):
        listener.recv(4096)
    listening.set()
    said.join(timeout=5)
    listener.settimeout(5)
    assert listener.recv(4096).decode().startswith("READY=1")
    supervisor.notifier.close()


# ProtectSystem=strict with the state dir writable (StateDirectory=), ProtectHome=read-only, PrivateTmp=yes,
# NoNewPrivileges=yes, CapabilityBoundingSet= (empty) and UMask=0077, rebuilt from util-linux tools in a private
# mount namespace: every mount but /proc, /sys and /dev read-only, the state dir and a private temporary directory
# ($TMPDIR: the test's files live under /tmp, so no tmpfs over it) read-write bind mounts, then the daemon with no
# capabilities and no new privileges.
SANDBOX = r"""set -e
mount --bind "$STATE" "$STATE"
mount --bind "$TMPDIR" "$TMPDIR"
for mp in $(awk '{print $2}' /proc/self/mounts | grep -v -E '^/(proc|sys|dev)(/|$)' | sort -u); do
  mount -o remount,bind,ro "$mp" 2>/dev/null || true
done
mount -o remount,bind,rw "$STATE"
mount -o remount,bind,rw "$TMPDIR"
for outside in /etc "$HOME" "$(dirname "$STATE")"; do
  if touch "$outside/qmd-indexer-sandbox-check" 2>/dev/null; then echo "sandbox: $outside is writable" >&2; exit 97; fi
done
umask 0077
exec setpriv --no-new-privs --bounding-set -all --inh-caps -all --ambient-caps -all "$@"
"""

# SystemCallFilter= (an allow list, less the ~ groups; others fail with SystemCallErrorNumber=EPERM),
# SystemCallArchitectures=native and RestrictAddressFamilies=, loaded with libseccomp (the library systemd uses)
# just before the daemon's exec. argv: the allowed system calls (comma-separated), the address families
# (comma-separated numbers), then the command.
SECCOMP = r"""
import ctypes, errno, os, sys
lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
class Cmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]
lib.seccomp_init.restype = ctypes.c_void_p
lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
lib.seccomp_load.argtypes = [ctypes.c_void_p]
ALLOW, EQ = 0x7FFF0000, 4
ctx = lib.seccomp_init(0x00050000 | errno.EPERM)
for name in sys.argv[1].split(","):
    nr = lib.seccomp_syscall_resolve_name(name.encode())
    if nr >= 0 and name != "socket":
        assert lib.seccomp_rule_add_array(ctx, ALLOW, nr, 0, None) == 0, name
for family in sys.argv[2].split(","):
    cmp = Cmp(0, EQ, int(family), 0)
    nr = lib.seccomp_syscall_resolve_name(b"socket")
    assert lib.seccomp_rule_add_array(ctx, ALLOW, nr, 1, ctypes.byref(cmp)) == 0
assert lib.seccomp_load(ctx) == 0
os.execv(sys.argv[3], sys.argv[3:])
"""


def _syscall_groups() -> dict[str, list[str]]:
    """systemd's system call groups (``@system-service``...), each as its members (calls and ``@groups``)."""
    groups: dict[str, list[str]] = {}
    listing = subprocess.run(["systemd-analyze", "syscall-filter", "--no-pager"], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    for line in listing.splitlines():
        if line.startswith("@"):
            members = groups.setdefault(line.strip(), [])
        elif line.strip() and not line.strip().startswith("#") and line.startswith(" "):
            members.append(line.strip())
    return groups


def _unit_syscalls() -> set[str]:
    """The system calls the unit's ``SystemCallFilter=`` lines allow (systemd always allows ``@default``)."""
    groups = _syscall_groups()

    def expand(names: list[str]) -> set[str]:
        calls: set[str] = set()
        for name in names:
            calls |= expand(groups[name]) if name.startswith("@") else {name}
        return calls

    allowed = expand(["@default"])
    for line in _unit_settings()["SystemCallFilter"]:
        if line.startswith("~"):
            allowed -= expand(line[1:].split())
        else:
            allowed |= expand(line.split())
    return allowed


def _can_sandbox() -> str | None:
    """Why the sandbox test cannot run here, or ``None``."""
    import ctypes

    if os.geteuid() != 0:
        return "needs root (a private mount namespace with read-only remounts)"
    for tool in ("unshare", "setpriv", "mount", "systemd-analyze"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux, systemd) is not installed"
    try:
        ctypes.CDLL("libseccomp.so.2")
    except OSError:
        return "libseccomp is not installed"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, timeout=30)
    return None if probe.returncode == 0 else f"cannot make a mount namespace here: {probe.stderr.decode().strip()}"


@pytest.mark.skipif(_can_sandbox() is not None, reason=str(_can_sandbox()))
def test_daemon_runs_under_the_units_file_system_and_privilege_restrictions(workspace: Path, tmp_path: Path,
                                                                             listener: socket.socket) -> None:
    """The unit's ExecStart (``qmd-indexer run``) with everything read-only but its state dir, no capabilities, no
    new privileges, and the unit's system call and address family filters: it indexes, says READY=1, answers a
    search, logs no error, leaves only private files and stops cleanly. Not reproduced (PID 1 here is not systemd):
    the namespaces, device and IP address restrictions, which ``systemd-analyze security`` above checks are set."""
    import signal
    import time

    from indexer.client import Client

    unit = _unit_settings()
    assert unit["ProtectSystem"] == ["strict"] and unit["NoNewPrivileges"] == ["yes"]
    assert unit["CapabilityBoundingSet"] == [""] and unit["UMask"] == ["0077"]
    assert unit["SystemCallErrorNumber"] == ["EPERM"] and unit["SystemCallArchitectures"] == ["native"]
    [families] = unit["RestrictAddressFamilies"]
    numbers = ",".join(str(int(getattr(socket, name))) for name in families.split())
    state, private_tmp = tmp_path / "state", tmp_path / "private-tmp"
    state.mkdir(mode=0o700)
    private_tmp.mkdir(mode=0o700)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "QMD_INDEXER_LOG_FORMAT": "json", "STATE": str(state),
           "NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "QMD_INDEXER_STATE_DIR": str(state),
           "TMPDIR": str(private_tmp)}
    with open(tmp_path / "run.log", "w") as log:
        proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", SANDBOX, "sandbox",
                                 sys.executable, "-c", SECCOMP, ",".join(sorted(_unit_syscalls())), numbers,
                                 sys.executable, "-m", "indexer.cli", "run", "--workspace", str(workspace),
                                 "--port", str(port)], stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        deadline = time.monotonic() + 240
        message = ""
        while not message.startswith("READY=1") and time.monotonic() < deadline:
            message = listener.recv(4096).decode()
        assert message.startswith("READY=1"), (tmp_path / "run.log").read_text()[-3000:]
        hits = Client(port=port).search("when are deploys allowed?")
        assert hits and hits[0]["path"] == "MEMORY.md", hits
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    logged = (tmp_path / "run.log").read_text()
    assert "Read-only file system" not in logged and '"level": "error"' not in logged, logged[-3000:]
    loose = [str(path) for path in [state, *state.rglob("*")] if not path.is_symlink() and path.stat().st_mode & 0o077]
    assert loose == [] and len(list(state.rglob("*"))) > 5
