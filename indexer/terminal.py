"""What the command line shows on a terminal: logging setup, the first-index progress bar, hits and status.

The daemon's modules only log events and report progress through callbacks; drawing is done here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import click


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    """structlog for our events and the stdlib loggers of uvicorn and watchdog alike, to stderr: JSON lines when
    stderr is not a TTY (journald, pipes) or ``fmt == "json"``, colourless key=value console lines otherwise."""
    import structlog

    json_lines = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer = structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        # filter_by_level first: a debug event below the level costs no timestamp or rendering (a no-op rescan
        # logs one per file)
        processors=[structlog.stdlib.filter_by_level, *shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    from indexer.systemd import journal_priority, under_journald

    class Formatter(structlog.stdlib.ProcessorFormatter):
        """Under journald, each line starts with its syslog priority (``<3>`` error, ``<4>`` warning, ``<6>``
        info), so ``journalctl -p warning`` filters it (sd-daemon(3))."""

        def format(self, record: logging.LogRecord) -> str:
            line = super().format(record)
            return f"<{journal_priority(record.levelname)}>{line}" if journald else line

    journald = under_journald()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(Formatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer],
        foreign_pre_chain=shared))
    # libraries that log on the root logger itself below warning are chatter, not events: ONNX Runtime's
    # quantization wrote ~60 INFO lines there at the first int8 export, and its transformer optimizer ~12 more on
    # loggers named after its modules (``fusion_base``, ``onnx_model``: imported as top-level modules). Other named
    # loggers keep their levels.
    onnxruntime_dir = f"{os.sep}onnxruntime{os.sep}"
    handler.addFilter(lambda record: record.levelno >= logging.WARNING or (
        record.name != "root" and onnxruntime_dir not in record.pathname))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("watchdog", "httpx", "httpcore", "sentence_transformers", "transformers", "uvicorn.access",
                  "mcp.server.streamable_http", "mcp.server.streamable_http_manager", "mcp.server.lowlevel"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@contextlib.contextmanager
def progress_bar(total: int) -> Iterator[Callable[[int], None]]:
    """A ``worker.Progress``: on a terminal, a tqdm bar of ``total`` files that log lines print above; yields
    ``advance(n_files)``. Elsewhere (a pipe, journald) or with nothing to do, draws nothing."""
    if not total or not sys.stderr.isatty():
        yield lambda n: None
        return
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    bar = tqdm(total=total, unit="file", desc="indexing", file=sys.stderr, leave=False)
    try:
        with logging_redirect_tqdm():
            yield bar.update
    finally:
        bar.close()


SNIPPET_LINES = 8  # a hit's snippet lines printed; the rest is named, with the command that reads them


def print_hits(hits: list[dict[str, Any]]) -> None:
    if not hits:
        click.echo("no hits", err=True)
    for rank, hit in enumerate(hits, 1):
        where = f"{hit['path']}:{hit['start_line']}-{hit['end_line']}"
        if "start_s" in hit:
            where += f" [{hit['start_s']:.1f}s-{hit.get('end_s', hit['start_s']):.1f}s]"
        score = "" if hit.get("score") is None else f"  score {hit['score']:.3f}"
        click.echo(f"{rank}. {where}{score}  ({hit['collection']}, {hit['kind']})")
        lines = hit["snippet"].splitlines()
        for line in lines[:SNIPPET_LINES]:
            click.echo(f"     {line}")
        if len(lines) > SNIPPET_LINES:
            click.echo(f"     … ({len(lines) - SNIPPET_LINES} more lines: qmd-indexer get '{hit['citation']}')")


def print_answer(answer: Mapping[str, Any], offset: int = 0) -> None:
    """A ``SearchResponse``: its hits on stdout (``print_hits``), then on stderr a line while the first index is
    being built (``indexing``), the graded ``relevance`` (a "nothing relevant" line when ``relevant`` is false)
    and, for a recall listing (``total`` present), which files of how many it shows and the ``--offset`` that
    continues it. ``offset`` is the listing's, as asked."""
    print_hits(answer["hits"])
    if answer.get("degraded"):
        click.echo(f"degraded: {answer['degraded']}", err=True)
    if answer.get("indexing"):
        done, total = answer["indexing"]["done"], answer["indexing"]["total"]
        click.echo(f"indexing: the first index is still being built ({done} of {total} files done); the answer may "
                   f"miss notes (search --wait waits for it)", err=True)
    graded = answer.get("relevance")
    why = f" ({graded['level']}: {graded['reason']})" if graded else ""
    if answer.get("relevant") is False:
        click.echo("nothing relevant: nothing found reaches relevance_floor" + why
                   + ("; the hits above are only the closest" if answer["hits"] else ""), err=True)
    elif graded and answer.get("relevant") is not None:
        click.echo(f"relevance: {graded['level']} ({graded['reason']})", err=True)
    if "total" in answer:
        shown, total, after = len(answer["hits"]), answer["total"], answer.get("next_offset")
        where = f"files {offset + 1}-{offset + shown} of {total}" if shown else f"no file at offset {offset} of {total}"
        if after is not None:
            click.echo(f"listed {where}; continue with --offset {after}", err=True)
        elif offset == 0:
            click.echo(f"listed {shown} of {total} memory files", err=True)
        else:
            click.echo(f"listed {where}", err=True)


def print_status(status: Mapping[str, Any], served: bool = True) -> None:
    """``status`` as lines; ``served``: whether a daemon serves it (``index --once`` listens nowhere, so it names
    no address)."""
    if "bind" in status and served:
        click.echo(f"listening on: {status['bind']}")
    backend = status["backend"] + (f" ({status['tenancy']})" if status.get("tenancy") else "")
    click.echo(f"ready: {status['ready']}  backend: {backend}  queue: {status['queue_depth']}  "
               f"embedded since start: {status['chunks_embedded']}  cache hits: {status['cache_hits']}  "
               f"failed files: {status['files_failed']}")
    if status.get("store_degraded"):
        click.echo("store: degraded (writes to Qdrant are failing and being retried)")
    embedding = status.get("embedding") or {}
    if embedding:
        click.echo(f"text model: {embedding['model_id']}  relevance floor: "
                   f"{embedding.get('relevance_floor') or 'not measured yet (the probe runs once the model loads)'}")
    rerank = status.get("rerank")
    if rerank:
        click.echo(f"rerank: {rerank['reranker']} ({rerank['model_id'] or 'failed to load'})  "
                   f"reranked: {rerank['reranked']}  fused order kept: {rerank['failed']} failed, "
                   f"{rerank['over_budget']} over {rerank['budget_s']} s"
                   + (f"  last error: {rerank['last_error']}" if rerank.get("last_error") else ""))
    for name, notice in status.get("plugin_notices", {}).items():
        click.echo(f"plugin {name}: {notice}")
    for root, why in status.get("watch_polled", {}).items():
        click.echo(f"polled: {root} ({why})")
    if status.get("last_reconcile_reason"):
        click.echo(f"last reconcile: {status['last_reconcile_reason']}, {status.get('recovered', 0)} file(s) "
                   f"recovered ({status.get('recovered_total', 0)} since start)")
    failed = status.get("failed_files", [])
    for file in failed:
        click.echo(f"failed: {file['path']}: {file['reason']}" + (f" ({file['detail']})" if file["detail"] else ""))
    if status["files_failed"] > len(failed):
        click.echo(f"... and {status['files_failed'] - len(failed)} more failed file(s) (see the log: file_failed)")
    skipped = status.get("files_skipped") or {}
    if skipped:
        click.echo("skipped: " + ", ".join(f"{n} {reason}" for reason, n in skipped.items())
                   + " (on purpose, not failures; the log names each: file_skipped)")
    for problem in status.get("problems", []):
        click.echo(f"problem: {problem['kind']}: {problem['path']} ({problem['detail']})")
    click.echo(f"{'collection':<40} {'files':>7} {'chunks':>8}  root")
    for name, c in status["collections"].items():
        click.echo(f"{name:<40} {c['files']:>7} {c['chunks']:>8}  {c['root']}")
    for agent, sessions in status.get("sessions", {}).items():
        click.echo(f"sessions of {agent}: {sessions['count']} session(s), {sessions['turns']} turn(s)")
