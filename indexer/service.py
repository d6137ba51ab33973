"""``qmd-indexer run`` as one call: ``serve(settings)`` opens the indexer, runs the worker on a thread and the HTTP
API (uvicorn) on this one, and on SIGTERM/SIGINT finishes the files in hand, flushes the store and returns. SIGHUP
reads the config again and applies the workspaces without a restart (``indexer.reload``).

Exit statuses (``indexer.errors``): ``EXIT_OK`` after a clean stop; ``EXIT_FAILURE`` when the port is taken, the
store cannot be opened (held by another process, built for another model, unreachable at open) or the API could
not serve; ``EXIT_USAGE`` for a configuration error. Each refusal is one ``qmd-indexer: ...`` line on stderr. A
store unreachable after opening is not fatal: the worker retries, the API answers ``ready: false`` meanwhile.
"""

from __future__ import annotations

import gc
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

import structlog

from indexer.config import Settings
from indexer.daemon import Indexer
from indexer.errors import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    CollectionMismatch,
    ConfigError,
    EmbedUnavailable,
    PluginError,
    StateReadOnly,
    StoreLocked,
    StoreUnavailable,
)
from indexer.reload import Reloader
from indexer.systemd import Notifier, Supervisor, watchdog_interval_s
from indexer.worker import Progress, run

log = structlog.get_logger("qmd_indexer.daemon")


class Refused(Exception):
    """The indexer cannot be opened: ``message`` says why in one line, ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.message, self.code = message, code


def open_indexer(settings: Settings, reindex: bool = False, connect: bool = True) -> Indexer:
    """``Indexer.open`` with its errors turned into ``Refused`` (config errors exit 2, the rest 1)."""
    try:
        return Indexer.open(settings, reindex=reindex, connect=connect)
    except ConfigError as exc:
        raise Refused(f"config error: {exc}", EXIT_USAGE) from None
    except (CollectionMismatch, StoreUnavailable, PluginError, StateReadOnly) as exc:
        raise Refused(str(exc)) from None
    except OSError as exc:
        raise Refused(f"cannot open the store under {settings.state_dir}: {exc}") from None


def check_port(host: str, port: int) -> None:
    """Raise ``Refused`` unless ``host:port`` can be listened on. Binds as uvicorn does (``SO_REUSEADDR``), so a
    port whose last connections linger in TIME_WAIT after a stop (about 60 s) does not refuse a restart."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise Refused(f"cannot listen on {host}:{port}: {exc.strerror}; is a daemon already running? "
                          f"(choose another with --port)") from None


def serve(settings: Settings, reindex: bool = False, progress: Progress | None = None,
          reload: Callable[[], Settings] | None = None) -> int:
    """Index, watch and serve ``settings`` until SIGTERM/SIGINT; returns the exit status. Installs signal handlers,
    so call it from the main thread. ``progress`` draws the first pass (see ``indexer.worker``). ``reload``: the
    settings again from the same sources (``load_settings`` with the same path and flags; raises ``ConfigError``),
    called on SIGHUP; without it a SIGHUP reapplies ``settings`` (nothing changes)."""
    try:
        check_port(settings.host, settings.port)
        indexer = open_indexer(settings, reindex, connect=False)
        # the models and modules loaded by now live as long as the process: the cyclic garbage collector need not
        # walk them again at random moments (a restart, a search; docs/performance.md, "Daemon start")
        gc.freeze()
        try:
            indexer.connect()
        except (CollectionMismatch, StoreLocked) as exc:  # not transient: a config mistake, so say it and stop
            raise Refused(str(exc)) from None
        except (StoreUnavailable, EmbedUnavailable):
            pass  # the worker logs it once and keeps retrying; the API answers meanwhile
    except Refused as exc:
        print(f"qmd-indexer: {exc.message}", file=sys.stderr)
        return exc.code
    import uvicorn

    from indexer.server import create_app

    stop, listening = threading.Event(), threading.Event()
    supervisor = Supervisor(Notifier(), watchdog_interval_s(), listening=listening)
    reloader = Reloader(indexer, reload or (lambda: settings), supervisor.notifier)
    # the handler runs on the main thread between bytecodes: it takes no lock itself (the notifier's and the
    # queue's are taken on a thread of its own)
    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=reloader.request, name="sighup").start())
    worker = threading.Thread(target=run, args=(indexer, stop, progress, supervisor, reloader), name="indexer-worker",
                              daemon=True)
    worker.start()
    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            listening.set()  # bound and serving: READY=1 may go out

    server = Server(uvicorn.Config(create_app(indexer.view), host=settings.host, port=settings.port,
                                   log_config=None, access_log=False, lifespan="on"))
    log.info("api_listening", url=f"http://{settings.host}:{settings.port}")
    # uvicorn handles SIGTERM/SIGINT while serving, then re-raises the signal to the handler that was installed
    # before it; with the default handler that would kill the process before the store is flushed.
    def on_stop(*_: object) -> None:
        supervisor.stopping()
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_stop)
    failed_to_serve = False
    try:
        server.run()
    except SystemExit:  # uvicorn exits when it cannot bind (a port taken between our probe and its bind)
        failed_to_serve = True
    finally:
        supervisor.stopping()  # STOPPING=1 (uvicorn took SIGTERM while serving, and returned)
        stop.set()
        listening.set()  # a worker waiting to say READY=1 must not wait for a server that is gone
        indexer.settler.wake()
        worker.join()
        indexer.close()
        log.info("daemon_stopped")
    return EXIT_OK if server.started and not failed_to_serve else EXIT_FAILURE
