"""``qmd-indexer run`` as one call: ``serve(settings)`` opens the indexer, runs the worker on a thread and the HTTP
API (uvicorn) on this one, and on SIGTERM/SIGINT finishes the files in hand, flushes the store and returns. SIGHUP
reads the config again and applies the workspaces without a restart (``indexer.reload``).

Exit statuses (``indexer.errors``): ``EXIT_OK`` after a clean stop; ``EXIT_FAILURE`` when the port is taken, the
store cannot be opened (held by another process, built for another model, unreachable at open) or the API could
not serve; ``EXIT_USAGE`` for a configuration error. Each refusal is one ``qmd-indexer: ...`` line on stderr. A
store unreachable after opening is not fatal: the worker retries, the API answers ``ready: false`` meanwhile.

A restart serves first: the store opens, the API listens, and only then do the models load (``warm_models``, on a
thread of its own) while the worker reconciles; until they have, hybrid and dense searches answer from keyword
search, flagged ``degraded`` ("keyword only: model loading"), and ``/health`` names "model loading". Each phase's
time since the process started is logged (``startup_phase``; ``startup`` once ready; docs/benchmarks.md). A first
start runs the same way: the store opens without the model (``model_id`` needs no load), and the ONNX exports are
part of the model's load behind the listening API, each step logged (``model_loading``) and in ``GET /status``
(``models.<modality>.loading``)."""

from __future__ import annotations

import gc
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from indexer.config import Settings
from indexer.contract import EMBEDDERS, declared
from indexer.daemon import Indexer
from indexer.dates import warm_dates
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
from indexer.ranking import load_fusion
from indexer.reload import Reloader
from indexer.state import process_age_s
from indexer.systemd import Notifier, Supervisor, watchdog_interval_s
from indexer.worker import Progress, run

if TYPE_CHECKING:
    import uvicorn

log = structlog.get_logger("qmd_indexer.daemon")


class Refused(Exception):
    """The indexer cannot be opened: ``message`` says why in one line, ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.message, self.code = message, code


def open_indexer(settings: Settings, reindex: bool = False, connect: bool = True, wait_s: float = 0.0) -> Indexer:
    """``Indexer.open`` with its errors turned into ``Refused`` (config errors exit 2, the rest 1). With
    ``connect``, an embedder that cannot answer yet (``EmbedUnavailable``: a remote one's vector size comes from its
    first answer) is waited out, with its retry hint, for up to ``wait_s`` seconds before that is refused too."""
    indexer = None
    try:
        indexer = Indexer.open(settings, reindex=reindex, connect=False)
        deadline = time.monotonic() + wait_s
        while connect:
            try:
                indexer.connect()
                break
            except EmbedUnavailable as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Refused(f"the embedding server did not answer within {wait_s:g} s: {exc}") from None
                pause = min(exc.retry_after_s or 2.0, left)
                log.warning("embedder_unavailable", error=str(exc), retry_after_s=round(pause, 1))
                time.sleep(pause)
        return indexer
    except Exception as exc:
        if indexer is not None:
            indexer.close()
        if isinstance(exc, Refused):
            raise
        if isinstance(exc, ConfigError):
            raise Refused(f"config error: {exc}", EXIT_USAGE) from None
        if isinstance(exc, (CollectionMismatch, StoreUnavailable, PluginError, StateReadOnly)):
            raise Refused(str(exc)) from None
        if isinstance(exc, OSError):
            raise Refused(f"cannot open the store under {settings.state_dir}: {exc}") from None
        raise


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


def warm_models(indexer: Indexer) -> None:
    """Load the daemon's models while it already serves (its own thread, started once the API listens): each embedder's
    model (``preload`` where it has one: its queries answer ``EmbedUnavailable`` meanwhile, so searches answer
    from keyword search, flagged ``degraded``), the fusion code and the reranker's model, then a warm-up query
    each, so no search pays for a first call (dateparser's data too: ``indexer.dates.warm_dates``; the relevance
    floor's probe, ``indexer.calibration``, for a text model that declares none). Logs
    ``model_loaded`` per embedder (seconds of its load and of its precision's step, where it says them) and
    ``startup_phase`` ``model_loaded`` at the end."""
    embedders = indexer.registry.embedders
    loads = [thread for e in embedders.values()
             if (preload := declared(EMBEDDERS, e, "preload")) is not None and (thread := preload()) is not None]
    load_fusion()  # qdrant-client's fusion: not inside the first hybrid search
    warm_dates()  # dateparser's language data: not inside the first question that names a time
    for thread in loads:
        thread.join()
    for embedder in embedders.values():
        try:
            while declared(EMBEDDERS, embedder, "loading"):  # a load begun elsewhere (a query may answer meanwhile)
                time.sleep(0.1)
            failed = declared(EMBEDDERS, embedder, "load_error")
            if failed is not None:  # queries may answer from the query model: the load's failure is said here
                raise failed
            while True:
                try:
                    embedder.embed_query("warm-up")
                    log.info("model_loaded", model_id=embedder.model_id,
                             precision=declared(EMBEDDERS, embedder, "precision"),
                             **declared(EMBEDDERS, embedder, "load_times"))
                    break
                except EmbedUnavailable as exc:  # a load another thread began (the first index's) still runs
                    if not declared(EMBEDDERS, embedder, "loading"):
                        raise
                    time.sleep(exc.retry_after_s or 0.5)
        except Exception as exc:
            indexer.metrics.error("embedder_failed")
            log.error("embedder_failed", model_id=embedder.model_id, error=f"{type(exc).__name__}: {exc}")
    indexer.view.searcher().floor.get()  # a model that declares no relevance floor: its probe, not in a search
    reranker = indexer.registry.configured_reranker(indexer.settings.reranker)
    if reranker is not None:  # not inside the first search's time budget
        try:
            reranker.score("warm-up", ["warm-up"])
        except Exception as exc:  # searches keep the fused order meanwhile (indexer.rerank fails open)
            log.error("reranker_failed", model_id=reranker.model_id, error=f"{type(exc).__name__}: {exc}")
    indexer.state.startup.mark("model_loaded")


def start(settings: Settings, reindex: bool = False) -> Indexer:
    """The daemon's first steps, before it serves: the port checked, the indexer opened without its models and its
    store connected where it can be now (a store or embedder unreachable yet is the worker's to retry). Raises
    ``Refused`` for what stops the start (the port taken, the store held or built for another model, a config
    error). Marks the ``imports`` and ``store_opened`` startup phases."""
    imported = process_age_s()
    check_port(settings.host, settings.port)
    indexer = open_indexer(settings, reindex, connect=False)
    indexer.state.startup.mark("imports", at=imported)
    # the modules loaded by now (and the models, once ``warm_models`` has them) live as long as the process: the
    # cyclic garbage collector need not walk them again at random moments (docs/performance.md, "Daemon start")
    gc.freeze()
    try:
        indexer.connect()
    except (CollectionMismatch, StoreLocked) as exc:  # not transient: a config mistake, so say it and stop
        raise Refused(str(exc)) from None
    except (StoreUnavailable, EmbedUnavailable):
        pass  # the worker logs it once and keeps retrying; the API answers meanwhile
    else:
        indexer.state.startup.mark("store_opened")
    return indexer


def _warm(indexer: Indexer) -> None:
    warm_models(indexer)
    gc.freeze()  # the models live as long as the process too


def http_server(indexer: Indexer, settings: Settings, listening: threading.Event,
                warming: threading.Thread) -> uvicorn.Server:
    """The uvicorn server of ``indexer``'s HTTP API on ``settings.host:port`` (MCP mounted once it listens). Once
    bound and serving it sets ``listening`` (READY=1 may go out), marks ``http_listening`` and starts ``warming``
    (the models' load: until then searches answer from keyword search)."""
    import uvicorn

    from indexer.server import create_app

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            listening.set()  # bound and serving: READY=1 may go out
            indexer.state.startup.mark("http_listening")
            warming.start()  # models load now: until then searches answer from keyword search

    return Server(uvicorn.Config(create_app(indexer.view, mcp_later=True), host=settings.host, port=settings.port,
                                 log_config=None, access_log=False, lifespan="on"))


def serve(settings: Settings, reindex: bool = False, progress: Progress | None = None,
          reload: Callable[[], Settings] | None = None) -> int:
    """Index, watch and serve ``settings`` until SIGTERM/SIGINT; returns the exit status. Installs signal handlers,
    so call it from the main thread. ``progress`` draws the first pass (see ``indexer.worker``). ``reload``: the
    settings again from the same sources (``load_settings`` with the same path and flags; raises ``ConfigError``),
    called on SIGHUP; without it a SIGHUP reapplies ``settings`` (nothing changes)."""
    try:
        indexer = start(settings, reindex)
    except Refused as exc:
        print(f"qmd-indexer: {exc.message}", file=sys.stderr)
        return exc.code
    stop, listening = threading.Event(), threading.Event()
    warming = threading.Thread(target=_warm, args=(indexer,), name="model-warm", daemon=True)
    supervisor = Supervisor(Notifier(), watchdog_interval_s(), listening=listening)
    reloader = Reloader(indexer, reload or (lambda: settings), supervisor.notifier)
    # the handler runs on the main thread between bytecodes: it takes no lock itself (the notifier's and the
    # queue's are taken on a thread of its own)
    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=reloader.request, name="sighup").start())
    worker = threading.Thread(target=run, args=(indexer, stop, progress, supervisor, reloader), name="indexer-worker",
                              daemon=True)
    worker.start()
    server = http_server(indexer, settings, listening, warming)
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
