"""``LazyModel``: the one lazy-load helper the embedders, the reranker and the plugins share (``indexer.api``)."""

from __future__ import annotations

import threading
import time

import pytest

from indexer.api import LazyModel


def test_concurrent_first_callers_share_one_load() -> None:
    calls: list[int] = []

    def load() -> object:
        calls.append(1)
        time.sleep(0.2)  # long enough for every thread to arrive while it runs
        return object()

    lazy: LazyModel[object] = LazyModel(load)
    assert not lazy.loaded and not calls  # construction loads nothing
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(lazy.get())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 8 and all(g is got[0] for g in got)
    assert lazy.loaded and lazy.get() is got[0]


def test_a_failed_load_is_raised_remembered_and_tried_again() -> None:
    attempts: list[int] = []

    def load() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("model not on disk yet")
        return "model"

    lazy = LazyModel(load)
    with pytest.raises(OSError, match="not on disk"):
        lazy.get()
    assert not lazy.loaded and isinstance(lazy.last_error, OSError)
    assert lazy.get() == "model" and lazy.last_error is None and len(attempts) == 2
    assert lazy.get() == "model" and len(attempts) == 2


def test_a_model_that_is_none_counts_as_loaded() -> None:
    calls: list[int] = []
    lazy: LazyModel[None] = LazyModel(lambda: calls.append(1))
    assert lazy.get() is None and lazy.get() is None and calls == [1] and lazy.loaded


def test_get_inside_its_own_load_raises_instead_of_deadlocking() -> None:
    lazy: LazyModel[object]

    def load() -> object:
        return lazy.get()

    lazy = LazyModel(load)
    with pytest.raises(RuntimeError, match="inside its own load"):
        lazy.get()
