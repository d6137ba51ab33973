"""Loading models the way every model plugin should, built-in or not: once and on first use (``LazyModel``), and
offline with no progress bars (``load_sentence_transformer``); both re-exported by ``indexer.api``.

- ``LazyModel``: a model loaded on first use, once, under a lock; ``StillLoading`` while another thread loads it.
- ``load_sentence_transformer``: a ``SentenceTransformer`` loaded offline with no progress bars and its kernel caches
  bounded (``quiet_offline_hub``, ``bound_kernel_caches``; every sentence-transformers plugin uses it).

Which files the built-in text model loads, their fingerprint and the precision it runs at are the built-ins' own
(``indexer.builtin.text_model``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

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
