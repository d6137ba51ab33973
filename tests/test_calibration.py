"""The relevance floor per text model (``indexer.calibration``): the setting, the floor a model declares, the probe
for a model that declares none (stored with its identity, measured again on a model swap), and the reason and
``status`` naming it. Real all-MiniLM-L6-v2 throughout; the model that declares no floor is the same weights loaded
from another folder, as a user's own model would be."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_settings, write

from indexer.api import Chunk
from indexer.builtin.embedding import RELEVANCE_FLOORS, SentenceTransformerEmbedder
from indexer.builtin.text_model import resolve_model
from indexer.calibration import DEFAULT_RELEVANCE_FLOOR, Floor, measure, probe, read_stored
from indexer.daemon import Indexer
from indexer.errors import EmbedUnavailable
from indexer.plugins import Registry, load_registry
from indexer.relevance import versus
from indexer.schema import SearchRequest
from indexer.service import warm_models
from indexer.statedir import calibration_file
from indexer.worker import index_once


class Counted:
    """A real embedder seen through a count of its calls, with an identity that can change (a model swap) and,
    when ``down`` is set, the ``EmbedUnavailable`` an endpoint raises while its server is down. It declares no
    ``relevance_floor``, as a third-party embedder need not."""

    modality = "text"

    def __init__(self, inner: Any, identity: str) -> None:
        self.inner, self.identity, self.calls, self.down = inner, identity, 0, False
        self.model_id, self.dim, self.max_tokens = inner.model_id, inner.dim, inner.max_tokens

    def embed(self, chunks: list[Chunk]) -> np.ndarray:
        self.calls += 1
        return self.inner.embed(chunks)

    def embed_query(self, text: str) -> np.ndarray:
        self.calls += 1
        if self.down:
            raise EmbedUnavailable("connection refused (the endpoint's server is down)")
        return self.inner.embed_query(text)

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return self.inner.token_offsets(text)


@pytest.fixture(name="own_registry", scope="module")
def own_registry_fixture(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    """The installed plugins with all-MiniLM-L6-v2 copied to a folder of its own and loaded from there at fp32: to
    the daemon a model it has no measured floor for."""
    folder = tmp_path_factory.mktemp("own") / "my-model"
    shutil.copytree(resolve_model("all-MiniLM-L6-v2")[1], folder)
    return load_registry(config={"sentence-transformers": {
        "model": str(folder), "precision": "fp32", "cache_dir": str(tmp_path_factory.mktemp("cache"))}})


@pytest.fixture(name="own_model", scope="module")
def own_model_fixture(own_registry: Registry) -> SentenceTransformerEmbedder:
    return own_registry.embedders["text"]  # type: ignore[return-value]


def test_the_probe_is_well_formed() -> None:
    data = probe()
    assert len(data["passages"]) >= 30 and len(data["unanswerable"]) >= 20
    assert sorted(i for _, i in data["questions"]) == list(range(len(data["passages"])))  # one question each


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_probe_puts_the_packaged_models_floor_between_its_answers_and_its_unanswerables(
        precision: str, tmp_path: Path) -> None:
    """On the real model at each precision this CPU can force, the probe's floor lies between the two medians and
    within 0.03 of the floor measured on the public sets for that precision (what the model declares)."""
    embedder = SentenceTransformerEmbedder({"precision": precision, "cache_dir": str(tmp_path)})
    calibration = measure(embedder)
    assert calibration.source == "probe" and calibration.unanswerable is not None and calibration.right is not None
    assert calibration.unanswerable < calibration.floor < calibration.right
    assert calibration.right - calibration.unanswerable > 0.3  # far apart: MiniLM separates them well
    assert embedder.relevance_floor == RELEVANCE_FLOORS[precision]
    assert abs(calibration.floor - embedder.relevance_floor) <= 0.03


def test_a_model_that_declares_no_floor_is_calibrated_once_and_again_on_a_swap(
        own_model: SentenceTransformerEmbedder, tmp_path: Path) -> None:
    assert own_model.relevance_floor is None  # not the packaged model: nothing measured for it
    model = Counted(own_model, "my-model#1")
    floor = Floor(None, model, tmp_path)
    assert floor.known() is None  # before the first search, nothing embedded
    first = floor.get()
    assert first.source == "probe" and first.unanswerable < first.floor < first.right  # type: ignore[operator]
    stored = json.loads(calibration_file(tmp_path).read_text())
    assert stored["my-model#1"]["floor"] == first.floor
    calls = model.calls

    assert read_stored(tmp_path, "my-model#1") == first  # what a restart reads back
    again = Floor(None, model, tmp_path)  # another searcher: nothing embedded
    assert again.get() == first and model.calls == calls

    model.identity = "my-model#2"  # a swap (same weights here, so the same floor)
    assert Floor(None, model, tmp_path).get() == first and model.calls > calls
    assert set(json.loads(calibration_file(tmp_path).read_text())) == {"my-model#1", "my-model#2"}


def test_an_endpoint_that_cannot_embed_judges_with_the_default_until_it_can(
        own_model: SentenceTransformerEmbedder, tmp_path: Path) -> None:
    model = Counted(own_model, "http://127.0.0.1:7997 my-model")
    model.down = True
    floor = Floor(None, model, tmp_path)
    assert floor.get() == (DEFAULT_RELEVANCE_FLOOR, "default", None, None)
    assert not calibration_file(tmp_path).exists()  # nothing stored while down
    model.down = False
    assert floor.get().source == "probe" and calibration_file(tmp_path).exists()


def test_the_setting_wins_then_the_declared_floor(registry: Registry, tmp_path: Path) -> None:
    text = registry.embedders["text"]
    assert Floor(0.7, text, tmp_path).get() == (0.7, "setting", None, None)
    assert Floor(None, text, tmp_path).get() == (text.relevance_floor, "model", None, None)
    assert not calibration_file(tmp_path).exists()  # a declared floor needs no probe


def test_the_answer_and_status_name_the_floor_that_decided(make_indexer: Any, workspace: Path,
                                                            own_model: SentenceTransformerEmbedder) -> None:
    """The reason says ``cosine X >= floor`` with the model's floor; ``status`` shows it and where it comes from,
    and with a model that declares none, the probe's once the first search ran."""
    write(workspace / "memory" / "pets.md", "# Pets\n\nThe cat is called Miso; she is twelve.\n")
    indexer = make_indexer([{"agent": "main", "path": str(workspace)}])
    index_once(indexer)
    answer = indexer.view.searcher().answer(SearchRequest(query="what is the cat called?", k=3))
    floor = indexer.registry.embedders["text"].relevance_floor
    assert answer.relevant is True and answer.relevance["reason"].startswith("cosine ")
    assert f">= {floor:.2f}" in answer.relevance["reason"]
    assert indexer.view.status()["embedding"]["relevance_floor"] == f"{floor:.2f} (model)"

    searcher = indexer.view.searcher()
    searcher.floor = Floor(None, Counted(own_model, "my-model#1"), indexer.settings.state_dir)
    assert searcher.floor.known() is None
    searcher.answer(SearchRequest(query="what is the cat called?", k=3))
    assert searcher.floor.known() is not None and searcher.floor.known().source == "probe"


def test_the_daemon_measures_the_probe_while_it_warms_its_models(own_registry: Registry, workspace: Path,
                                                                 tmp_path: Path) -> None:
    """Not inside the first search: ``warm_models`` (the daemon's start, once the API listens) runs the probe of a
    text model that declares no floor, so the searchers read it back."""


    indexer = Indexer.open(make_settings(tmp_path, [{"agent": "main", "path": str(workspace)}]),
                           registry=own_registry)
    try:
        assert indexer.view.searcher().floor.known() is None
        warm_models(indexer)
        identity = own_registry.embedders["text"].identity  # type: ignore[attr-defined]
        assert identity in json.loads(calibration_file(indexer.settings.state_dir).read_text())
        known = indexer.view.searcher().floor.known()
        assert known is not None and known.source == "probe"
        assert indexer.view.status()["embedding"]["relevance_floor"] == known.describe()
    finally:
        indexer.close()


@pytest.mark.parametrize("damage", ["[1, 2]", '"text"', "null", "{not json", "folder",
                                    '{"my-model#1": {"floor": "nan", "right": 1, "unanswerable": 0, "probe": 1}}',
                                    '{"my-model#1": {"floor": 7, "right": 1e999, "unanswerable": 0, "probe": 1}}',
                                    '{"my-model#1": {"floor": 0.9, "right": 0.6, "unanswerable": 0.2, "probe": 1}}',
                                    '{"my-model#1": {"floor": 0.4, "right": 0.6, "unanswerable": 0.2, "probe": true}}'])
def test_a_damaged_calibration_file_is_measured_again_and_never_fails_a_search(
        damage: str, own_model: SentenceTransformerEmbedder, tmp_path: Path) -> None:
    """Whatever the file holds (JSON that is no object, no JSON, a folder in its place, a floor that is no finite
    cosine between its medians, another probe version), the entry reads as missing: the probe measures again and
    the file is written over where it can be (a folder cannot: then this process keeps the floor in memory)."""
    path = calibration_file(tmp_path)
    if damage == "folder":
        path.mkdir()
    else:
        path.write_text(damage)
    assert read_stored(tmp_path, "my-model#1") is None
    floor = Floor(None, Counted(own_model, "my-model#1"), tmp_path)
    measured = floor.get()
    assert measured.source == "probe" and -1 < measured.floor < 1
    assert Floor(None, Counted(own_model, "my-model#1"), tmp_path).known() == measured  # status sees it too
    if damage != "folder":
        assert read_stored(tmp_path, "my-model#1") == measured
    assert not path.with_suffix(".tmp").exists()


def test_a_keyword_search_never_runs_the_probe(make_indexer: Any, workspace: Path,
                                               own_model: SentenceTransformerEmbedder) -> None:
    """A keyword-only answer has no cosine to judge: it neither waits on an endpoint for the probe nor measures."""
    indexer = make_indexer([{"agent": "main", "path": str(workspace)}])
    index_once(indexer)
    searcher = indexer.view.searcher()
    model = Counted(own_model, "my-model#1")
    searcher.floor = Floor(None, model, indexer.settings.state_dir)
    answer = searcher.answer(SearchRequest(query="deploy windows", k=3, mode="keyword"))
    assert answer.hits and answer.relevant is None and model.calls == 0 and searcher.floor.known() is None


def test_the_reason_tells_a_cosine_from_the_floor_it_rounds_to() -> None:
    assert versus(0.4169, 0.42) == "cosine 0.417 < 0.420"
    assert versus(0.65, 0.42) == "cosine 0.65 >= 0.42"
    assert versus(0.4421, 0.442) == "cosine 0.4421 >= 0.4420"


def test_a_floor_setting_must_be_a_finite_cosine() -> None:
    from indexer.config import Settings

    for bad in (True, float("nan"), 1.5):
        with pytest.raises(ValueError, match="relevance_floor"):
            Settings(relevance_floor=bad)
    assert Settings(relevance_floor=1).relevance_floor == 1.0


def test_a_model_still_loading_is_not_probed_by_a_search(own_model: SentenceTransformerEmbedder,
                                                         tmp_path: Path) -> None:
    """While the model loads, a search judges with the default and does not wait for the load to measure: the
    daemon's warm-up measures once it is loaded."""
    model = Counted(own_model, "my-model#1")
    model.loading = True  # type: ignore[attr-defined]  # what the built-in embedder declares while it loads
    floor = Floor(None, model, tmp_path)
    assert floor.get() == (DEFAULT_RELEVANCE_FLOOR, "default", None, None) and model.calls == 0
    model.loading = False  # type: ignore[attr-defined]
    assert floor.get().source == "probe"
