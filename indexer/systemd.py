"""systemd integration with the standard library alone: ``sd_notify`` and journald log priorities.

- ``Notifier`` sends the service manager the state messages of sd_notify(3): one datagram of ``KEY=VALUE`` lines to
  the ``AF_UNIX`` socket named by ``$NOTIFY_SOCKET`` (a leading ``@`` names an abstract socket). Without that
  variable (not under systemd ``Type=notify``) every call is a no-op.
- ``Supervisor`` is what the worker says through a ``Notifier``: ``READY=1``, ``STATUS=``, watchdog pings, and
  ``EXTEND_TIMEOUT_USEC=`` while the first index makes progress (start-up).
- ``watchdog_interval_s()`` reads ``$WATCHDOG_USEC`` (microseconds; for this process when ``$WATCHDOG_PID`` is
  unset or ours): the daemon must send ``WATCHDOG=1`` more often than that, and only while its worker makes
  progress, so a hung worker gets the service restarted.
- ``journal_priority`` maps a log level to its syslog priority; ``qmd-indexer`` prefixes each line with ``<N>``
  when ``$JOURNAL_STREAM`` is set (stderr is connected to journald), see sd-daemon(3), so that
  ``journalctl -p warning`` works.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

# syslog priorities (sd-daemon(3), syslog(3)): <3> error, <4> warning, <6> info, <7> debug
PRIORITIES = {"critical": 2, "exception": 3, "error": 3, "warning": 4, "warn": 4, "info": 6, "debug": 7}


def journal_priority(level: str) -> int:
    """Syslog priority of a log level name (``"error"`` -> 3); unknown levels are info (6)."""
    return PRIORITIES.get(level.lower(), 6)


def under_journald() -> bool:
    """Whether stderr is the journald stream systemd connected (``$JOURNAL_STREAM`` is ``device:inode`` of it)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    if not stream:
        return False
    try:
        device, inode = (int(part) for part in stream.split(":"))
        st = os.fstat(2)
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (device, inode)


def watchdog_interval_s() -> float | None:
    """The service watchdog timeout in seconds (``$WATCHDOG_USEC``), or ``None`` when no watchdog is set for this
    process."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 1_000_000


class Notifier:
    """Sends sd_notify messages (``ready``, ``status``, ``watchdog``, ``reloading``, ``stopping``). Thread-safe;
    send errors are ignored (the service manager may be gone during shutdown), as sd_notify(3) does."""

    def __init__(self, address: str | None = None) -> None:
        address = os.environ.get("NOTIFY_SOCKET", "") if address is None else address
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        if self.address:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        return self._socket is not None

    def send(self, **fields: object) -> bool:
        """Send ``KEY=value`` lines (``send(READY=1, STATUS="...")``); returns whether a datagram went out."""
        if self._socket is None:
            return False
        message = "\n".join(f"{key}={str(value).replace(chr(10), ' ')}" for key, value in fields.items())
        with self._lock:
            try:
                self._socket.sendto(message.encode("utf-8"), self.address)
            except OSError:
                return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.send(READY=1, **({"STATUS": status} if status else {}))

    def status(self, status: str) -> bool:
        return self.send(STATUS=status)

    def watchdog(self) -> bool:
        return self.send(WATCHDOG=1)

    def reloading(self) -> bool:
        import time

        # systemd 253+ wants MONOTONIC_USEC with RELOADING=1 (Type=notify-reload); older versions ignore it
        return self.send(RELOADING=1, MONOTONIC_USEC=time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000)

    def stopping(self) -> bool:
        return self.send(STOPPING=1)

    def close(self) -> None:
        with self._lock:
            if self._socket is not None:
                self._socket.close()
                self._socket = None


#: how far each start-up beat extends systemd's start timeout when no watchdog interval is set, seconds
START_EXTEND_S = 60.0


class Supervisor:
    """What the worker tells the service manager through ``notifier``: ``beat()`` wherever the worker makes
    progress (each loop turn, each file, each embedded slice) sends ``WATCHDOG=1`` at most every quarter of
    ``watchdog_s`` (so a worker stuck on one file longer than ``watchdog_s`` sends none and systemd restarts it);
    until the first ``ready`` it also sends ``EXTEND_TIMEOUT_USEC=`` (``watchdog_s``, else ``START_EXTEND_S``, in
    microseconds) at most every quarter of that: systemd arms the watchdog only after ``READY=1``, so during the
    first index these extensions of ``TimeoutStartSec`` are what fails a start stuck on one file;
    ``status(queue_depth, files)`` sends ``STATUS=`` when the text changed, at most once per ``status_every_s``
    seconds (a change held back goes out on a later call); ``ready``/``stopping`` once each. ``listening``: set
    once the HTTP API accepts connections (or will not): ``ready`` waits for it, so ``READY=1`` never precedes the
    API (a first index of a few files can end before uvicorn has bound its port)."""

    def __init__(self, notifier: Notifier, watchdog_s: float | None, status_every_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, listening: threading.Event | None = None) -> None:
        self.notifier, self.watchdog_s, self.status_every_s, self.clock = notifier, watchdog_s, status_every_s, clock
        self.listening = listening
        self._last_ping = self._last_status_at = self._last_extend = float("-inf")
        self._last_status = ""
        self._stopping = False
        self._started = False  # READY=1 sent once: start-up is over, no more EXTEND_TIMEOUT_USEC
        self.extend_s = watchdog_s if watchdog_s is not None else START_EXTEND_S

    def beat(self) -> None:
        now = self.clock()
        if not self._started and now - self._last_extend >= self.extend_s / 4:
            self._last_extend = now
            self.notifier.send(EXTEND_TIMEOUT_USEC=int(self.extend_s * 1_000_000))
        if self.watchdog_s is not None and now - self._last_ping >= self.watchdog_s / 4:
            self._last_ping = now
            self.notifier.watchdog()

    def status(self, queue_depth: int, files: int) -> None:
        text = f"{files} files indexed, queue {queue_depth}"
        if text != self._last_status and self.clock() - self._last_status_at >= self.status_every_s:
            self._last_status, self._last_status_at = text, self.clock()
            self.notifier.status(text)

    def ready(self, queue_depth: int, files: int) -> None:
        if self.listening is not None:
            self.listening.wait()
        self._last_status, self._last_status_at = f"{files} files indexed, queue {queue_depth}", self.clock()
        self._started = True
        self.notifier.ready(self._last_status)

    def stopping(self) -> None:
        if not self._stopping:
            self._stopping = True
            self.notifier.stopping()
