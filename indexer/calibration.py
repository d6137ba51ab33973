"""The dense cosine from which a hit is relevant (``indexer.relevance``), for the text model that made the index.

Cosines are not comparable across models: all-MiniLM-L6-v2 puts unrelated texts near 0.05 and a question's answer
near 0.6, multilingual-e5-small puts both near 0.8 and 0.9. So the floor is the model's own, chosen in this order
(``resolve``; ``Calibration.source`` says which):

1. ``setting``: the ``relevance_floor`` setting, when set;
2. ``model``: the floor the embedder declares (``indexer.api.Embedder.relevance_floor``), measured on the public
   sets' unanswerable and right questions (``benchmarks/relevance_table.py --floor``): the built-in MiniLM one per
   precision (``indexer.builtin.embedding.RELEVANCE_FLOORS``), e5 its 0.83;
3. ``probe``: for a model that declares none (an OpenAI-compatible endpoint, a third-party plugin), measured here on
   the packaged probe (``calibration_probe.json``: 32 short memory notes, a question each answers, 20 questions none
   answers): the midpoint between the median cosine of a question to its note and the median best cosine of an
   unanswerable question over the notes. It is stored under the state dir with the model identity
   (``statedir.calibration_file``), so a restart reads it and a model swap (a new identity) measures again. On the
   built-in models the probe lands near the public sets' floor: MiniLM int8 0.433 (public 0.42), e5 0.857 (0.83);
4. ``default``: ``DEFAULT_RELEVANCE_FLOOR`` while the probe cannot run (the model still loading, an endpoint down):
   asked again at the next search.
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
import threading
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import structlog

from indexer.api import Chunk
from indexer.contract import EMBEDDERS, declared
from indexer.errors import EmbedUnavailable
from indexer.statedir import calibration_file, read_record, write_record

log = structlog.get_logger("qmd_indexer.search")

#: the floor before any is known: measured for all-MiniLM-L6-v2 on the public sets (docs/performance.md)
DEFAULT_RELEVANCE_FLOOR = 0.42
#: the probe's version: a change of the probe or of the rule measures every stored calibration again
PROBE_VERSION = 1


class Calibration(NamedTuple):
    """A model's dense floor (a cosine in [-1, 1]) and where it comes from (``setting``, ``model``, ``probe`` or
    ``default``); for ``probe``, the two medians it lies between."""

    floor: float
    source: str
    right: float | None = None
    unanswerable: float | None = None

    def describe(self) -> str:
        """One line for ``status``: ``0.43 (probe: right 0.64, unanswerable 0.23)``."""
        medians = (f": right {self.right:.2f}, unanswerable {self.unanswerable:.2f}"
                   if self.right is not None and self.unanswerable is not None else "")
        return f"{self.floor:.2f} ({self.source}{medians})"


def probe() -> dict[str, Any]:
    """The packaged probe: ``{"passages": [str], "questions": [[str, passage index]], "unanswerable": [str]}``."""
    return json.loads(resources.files("indexer").joinpath("calibration_probe.json").read_text(encoding="utf-8"))


def measure(embedder: Any) -> Calibration:
    """Embed the probe with ``embedder`` (passages as chunks, questions as queries: 84 inputs) and return its
    ``probe`` calibration (see the module). Raises what the embedder raises (``EmbedUnavailable`` while it cannot
    embed)."""
    data = probe()
    asked = [np.asarray(embedder.embed_query(q), dtype=np.float32) for q, _ in data["questions"]]  # first: a model
    unasked = [np.asarray(embedder.embed_query(q), dtype=np.float32) for q in data["unanswerable"]]  # still loading
    passages = np.asarray(embedder.embed([Chunk(text=p) for p in data["passages"]]), dtype=np.float32)  # says so
    right = [float(passages[i] @ vector) for (_, i), vector in zip(data["questions"], asked, strict=True)]
    unanswerable = [float(np.max(passages @ vector)) for vector in unasked]
    r, u = statistics.median(right), statistics.median(unanswerable)
    return Calibration(round((r + u) / 2, 3), "probe", round(r, 3), round(u, 3))


def read_stored(state_dir: Path, identity: str) -> Calibration | None:
    """The probe calibration stored for ``identity`` under ``state_dir``; ``None`` when there is none for this
    identity and ``PROBE_VERSION``, or the file or the entry is damaged (not JSON, not an object, a floor that is not
    a finite cosine between the two medians: logged once, then measured again and written over)."""
    path = calibration_file(state_dir)
    entry = read_record(path).get(identity)
    if entry is None:
        return None
    calibration = _valid(entry)
    if calibration is None and path not in _DAMAGED:
        _DAMAGED.add(path)
        log.warning("calibration_ignored", path=str(path), identity=identity, entry=str(entry)[:200])
    return calibration


def _valid(entry: Any) -> Calibration | None:
    """A stored entry as a ``probe`` calibration, ``None`` unless it is this probe version's and its three figures
    are finite cosines with the floor between the medians."""
    if not isinstance(entry, dict) or type(entry.get("probe")) is not int or entry["probe"] != PROBE_VERSION:
        return None
    try:
        floor, right, unanswerable = (float(entry[key]) for key in ("floor", "right", "unanswerable"))
    except (KeyError, TypeError, ValueError):
        return None
    if not all(math.isfinite(v) and -1 <= v <= 1 for v in (floor, right, unanswerable)):
        return None
    return Calibration(floor, "probe", right, unanswerable) if unanswerable <= floor <= right else None


def store(state_dir: Path, identity: str, calibration: Calibration) -> None:
    """Store ``calibration`` for ``identity`` under ``state_dir`` (the other identities' stay; a damaged file is
    written over); an unwritable state dir is logged, and this process keeps the calibration in memory."""
    path = calibration_file(state_dir)
    record = read_record(path)
    record[identity] = {"floor": calibration.floor, "right": calibration.right,
                        "unanswerable": calibration.unanswerable, "probe": PROBE_VERSION,
                        "measured": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    try:
        write_record(path, record)
    except OSError as exc:
        log.warning("calibration_not_stored", path=str(path), error=str(exc))
        path.with_suffix(".tmp").unlink(missing_ok=True)


#: probe calibrations measured by this process, by (state dir, model identity): every searcher and ``status`` see
#: one, whether or not the state dir could store it
_MEASURED: dict[tuple[Path, str], Calibration] = {}
_MEASURING = threading.Lock()  # one probe at a time: a second asker waits and reads the first one's
_DAMAGED: set[Path] = set()  # calibration files whose damage was logged
DEFAULT = Calibration(DEFAULT_RELEVANCE_FLOOR, "default")


class Floor:
    """The dense floor one searcher judges with (``get``), resolved once per model (see the module): a setting or a
    declared floor at once; the probe's once measured (by the daemon's warm-up, once the model is loaded, or by the
    first dense search that needs it), then read back from this process or the state dir. Thread-safe; while the
    probe cannot run (the model still loading, an endpoint down), ``get`` answers ``default`` and tries again at the
    next search."""

    def __init__(self, setting: float | None, embedder: Any | None, state_dir: Path | None) -> None:
        self._embedder = embedder
        self._state_dir = state_dir
        self._known: Calibration | None = None
        declared_floor = declared(EMBEDDERS, embedder, "relevance_floor") if embedder is not None else None
        if setting is not None:
            self._known = Calibration(float(setting), "setting")
        elif declared_floor is not None:
            self._known = Calibration(float(declared_floor), "model")
        elif embedder is None or state_dir is None:
            self._known = DEFAULT

    def known(self) -> Calibration | None:
        """The floor when known without embedding anything (a setting, a declared floor, a probe calibration this
        process measured or the state dir stored); ``None``: the probe is still to run."""
        if self._known is None and self._state_dir is not None:
            identity = self._identity()
            self._known = _MEASURED.get((self._state_dir, identity)) or read_stored(self._state_dir, identity)
        return self._known

    def get(self) -> Calibration:
        """The floor, measuring the probe when it is still to run and the model is not loading (see the class)."""
        known = self.known()
        if known is not None:
            return known
        if declared(EMBEDDERS, self._embedder, "loading"):  # the warm-up measures it once the model is loaded
            return DEFAULT
        with _MEASURING:
            known = self.known()  # measured by another searcher meanwhile
            if known is not None:
                return known
            assert self._state_dir is not None
            try:
                calibration = measure(self._embedder)
            except EmbedUnavailable as exc:  # loading, or its server down: asked again next search
                log.info("calibration_waiting", reason=str(exc)[:200])
                return DEFAULT
            except Exception as exc:  # a search never fails on its floor: it judges with the default
                log.warning("calibration_failed", error=f"{type(exc).__name__}: {exc}"[:300])
                return DEFAULT
            identity = self._identity()
            _MEASURED[(self._state_dir, identity)] = calibration
            store(self._state_dir, identity, calibration)
            log.info("relevance_calibrated", identity=identity, floor=calibration.floor, right=calibration.right,
                     unanswerable=calibration.unanswerable)
            self._known = calibration
            return calibration

    def _identity(self) -> str:
        embedder = self._embedder
        return str(declared(EMBEDDERS, embedder, "identity") or getattr(embedder, "model_id", ""))
