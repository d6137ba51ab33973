"""Screenshots found by the words in them, end to end: the installed image plugin (its entry points) with the real
Tesseract, the real text model, a real Qdrant Edge store in ``tmp_path``, and no CLIP model (none is installed here):
the text read out of a picture is what finds it.

The screenshots are rendered here with Debian fonts (``qmd_indexer_image.screenshots``): English on a noisy
background, turned 90 degrees, at low contrast, as PNG, JPEG and WebP, and Chinese. Without Tesseract, its English
and Chinese data or the fonts, the tests skip saying what to install (under ``CI=true`` they fail).
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import structlog.testing

from indexer.api import GROUPS
from indexer.plugins import Registry, load_registry
from indexer.search import SearchParams

pytest.importorskip("qmd_indexer_image",
                    reason="the image plugin is not installed (pip install -e plugins/qmd-indexer-image)")

from qmd_indexer_image.screenshots import ocr_missing, render, save  # noqa: E402

from indexer.config import Settings  # noqa: E402
from indexer.daemon import Indexer  # noqa: E402
from indexer.worker import index_once  # noqa: E402

#: (path, lines drawn, render options, a phrase of the picture a search asks for)
SCREENSHOTS = [
    ("memory/screens/training-crash.png", ["Traceback (most recent call last):",
                                           "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"],
     {"noise": 25}, "CUDA out of memory"),
    ("memory/screens/ci-run.jpg", ["Deploy failed: disk quota exceeded on build-07",
                                   "Retry the pipeline after clearing the cache"], {"angle": 90},
     "disk quota exceeded"),
    ("memory/receipts/hardware.webp", ["Harbor Hardware", "3 brass hinges 14.85", "Thank you for shopping"],
     {"contrast": 0.2}, "brass hinges receipt"),
    ("memory/screens/ssh-error.png", ["ssh: connect to host vault.internal port 22: Connection refused"],
     {"noise": 12, "contrast": 0.4}, "connection refused vault"),
]
CHINESE = ("memory/screens/服务告警.png", ["内存不足错误 请重启服务", "五金店的收据 合计十五元"], "请重启服务")
NOTES = {  # the same words as the pictures, in other senses: a search must still put the picture first
    "memory/notes/training.md": "# Training\n\nWe train the model on a single GPU with 24 GiB of memory.\n",
    "memory/notes/deploys.md": "# Deploys\n\nDeploys happen after the pipeline is green; build servers are named "
                               "build-01 to build-09.\n",
    "memory/notes/house.md": "# House\n\nThe shed door needs new hinges; buy them at a hardware store.\n",
}


def tesseract_or_skip(*languages: str, cjk: bool = False) -> None:
    """Skip (fail under ``CI=true``) unless Tesseract, the data of ``languages`` and the fonts are installed."""
    why = ocr_missing(*languages, cjk=cjk)
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the OCR tests cannot run: {why}")
        pytest.skip(why)


def image_registry(registry: Registry, config: dict) -> Registry:
    """The session's markdown plugin and text embedder, plus the installed image plugin (classifier, extractor)
    configured with ``config``; no CLIP."""
    text = [r for r in registry.records if r.status == "loaded" and r.name in ("markdown", "sentence-transformers")]
    eps = [e for group in GROUPS[:2] for e in entry_points(group=group) if e.name == "image"]
    image = load_registry(config={"image": config}, eps=eps)
    assert [r.status for r in image.records] == ["loaded", "loaded"], [r.reason for r in image.records]
    return Registry(text + image.records)


def workspace(root: Path) -> Path:
    ws = root / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nScreenshots and receipts live under memory/.\n", encoding="utf-8")
    for rel, text in NOTES.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text, encoding="utf-8")
    for rel, lines, options, _ in SCREENSHOTS:
        save(render(lines, **options)[0], ws / rel)
    save(render(CHINESE[1], cjk=True, noise=15)[0], ws / CHINESE[0])
    save(render([], noise=40)[0], ws / "memory" / "screens" / "empty-desktop.png")  # no text: no text chunk
    return ws


def open_indexer(tmp_path: Path, registry: Registry) -> Indexer:
    settings = Settings(state_dir=tmp_path / "state", workspace=[{
        "agent": "main", "path": workspace(tmp_path), "multimodal": {"enabled": True, "modalities": ["image"]}}])
    return Indexer.open(settings, registry=registry)


def test_a_phrase_in_a_screenshot_finds_it_first(tmp_path: Path, registry: Registry) -> None:
    tesseract_or_skip("eng", "chi_sim", cjk=True)
    indexer = open_indexer(tmp_path, image_registry(registry, {"ocr_languages": ["eng", "chi_sim"]}))
    try:
        with structlog.testing.capture_logs() as logs:
            status = index_once(indexer)
        assert status["files_failed"] == 0
        skipped = {Path(e["path"]).name: e["reason"] for e in logs if e["event"] == "file_skipped"}
        assert skipped == {"empty-desktop.png": "no_embedder"}  # no text and no CLIP: nothing to index
        search = indexer.view.searcher()
        for rel, lines, options, phrase in [*SCREENSHOTS, (CHINESE[0], CHINESE[1], {}, CHINESE[2])]:
            for mode in ("hybrid", "keyword", "dense"):
                hits = search.search(SearchParams(phrase, k=5, mode=mode))
                top = hits[0]
                assert top["path"] == rel, (phrase, mode, options, [(h["path"], h["snippet"][:60]) for h in hits])
                if mode == "dense" and rel == CHINESE[0]:
                    break  # the English text model: Chinese is found by keyword (hybrid), not asserted by meaning
            assert top["kind"] == "image" and top["source"] == "ocr"
            left, upper, right, lower = top["box"]
            assert 0 <= left < right <= top["width"] and 0 <= upper < lower <= top["height"]
            assert lines[-1].split()[-1] in top["snippet"]  # the snippet is the text read
    finally:
        indexer.close()


def test_without_tesseract_images_are_reported_and_the_daemon_runs(tmp_path: Path, registry: Registry,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import pytesseract

    monkeypatch.setattr(pytesseract.pytesseract, "tesseract_cmd", str(tmp_path / "no-tesseract"))
    with structlog.testing.capture_logs() as logs:
        indexer = open_indexer(tmp_path, image_registry(registry, {"ocr_languages": ["eng", "chi_sim"]}))
    try:
        (line,) = [e for e in logs if e["event"] == "plugin_limited"]
        assert line["plugin"] == "image" and line["notice"].startswith("OCR off: Tesseract is not installed")
        index_once(indexer)
        assert indexer.view.status()["plugin_notices"] == {"image": line["notice"]}
        assert {Path(p).name for p in indexer.state.indexed} == {"MEMORY.md", *(Path(n).name for n in NOTES)}
        hits = indexer.view.searcher().search(SearchParams("hinges", k=3))
        assert hits[0]["path"] == "memory/notes/house.md"
    finally:
        indexer.close()


def test_a_screenshot_gets_its_clip_vector_and_its_text(tmp_path: Path, registry: Registry) -> None:
    """One file with chunks of two modalities (the picture for CLIP, the text read for the text model; vectors of
    two sizes) is embedded and stored whole."""
    tesseract_or_skip("eng")
    from qmd_indexer_image.tiny_clip import build_tiny_clip

    image = image_registry(registry, {})
    clip = load_registry(config={"clip": {"model": str(build_tiny_clip(tmp_path / "clip"))}},
                         eps=[e for e in entry_points(group=GROUPS[2]) if e.name == "clip"])
    indexer = open_indexer(tmp_path, Registry(image.records + clip.records))
    try:
        status = index_once(indexer)
        assert status["files_failed"] == 0
        shot = indexer.state.indexed[str(tmp_path / "ws" / SCREENSHOTS[0][0])]
        assert shot.state.points == 2  # the picture's point and one text chunk
        assert {Path(p).name for p in indexer.state.indexed} >= {"empty-desktop.png", "training-crash.png"}
        hits = indexer.view.searcher().search(SearchParams("CUDA out of memory", k=5))
        assert hits[0]["path"] == SCREENSHOTS[0][0] and hits[0]["source"] == "ocr"
    finally:
        indexer.close()


def test_a_picture_opened_from_a_hit_shows_its_text_and_itself(tmp_path: Path, registry: Registry) -> None:
    """``GET /get`` of a picture answers the text read from it (it was a 403: not a text file), and ``GET /media``
    serves its bytes, behind the token like every route, beneath the workspace only (no symlink, no other file)."""
    from fastapi.testclient import TestClient

    from indexer.server import create_app

    tesseract_or_skip("eng")
    token = "t" * 32
    settings = Settings(state_dir=tmp_path / "state", token=token, workspace=[{
        "agent": "main", "path": workspace(tmp_path), "multimodal": {"enabled": True, "modalities": ["image"]}}])
    indexer = Indexer.open(settings, registry=image_registry(registry, {"ocr_languages": ["eng"]}))
    rel, lines, _, _ = SCREENSHOTS[0]
    ws = tmp_path / "ws"
    (ws / "memory" / "link.png").symlink_to(ws / rel)
    try:
        index_once(indexer)
        app = create_app(indexer.view)
        with TestClient(app, base_url="http://127.0.0.1:8743") as client:
            auth = {"Authorization": f"Bearer {token}"}
            assert client.get("/media", params={"path": rel}).status_code == 401  # the guard holds
            page = client.get("/get", params={"path": rel}, headers=auth).json()
            assert page["kind"] == "image" and page["from"] == 1 and page["next_from"] is None, page
            assert lines[-1].split()[-1] in page["text"] and page["text"].count("\n") == page["to"] - 1, page
            picture = client.get("/media", params={"path": rel}, headers=auth)
            assert picture.status_code == 200 and picture.content == (ws / rel).read_bytes()
            assert picture.headers["content-type"] == "image/png"
            assert picture.headers["x-content-type-options"] == "nosniff"
            assert "sandbox" in picture.headers["content-security-policy"]
            (tmp_path / "outside.png").write_bytes((ws / rel).read_bytes())
            for path in ("MEMORY.md", "memory/link.png", "../outside.png", str(tmp_path / "outside.png"),
                         "/etc/passwd"):
                refused = client.get("/media", params={"path": path}, headers=auth)
                assert refused.status_code in (403, 404), (path, refused.status_code, refused.text)
            assert client.get("/get", params={"path": "memory/link.png"}, headers=auth).status_code == 403
    finally:
        indexer.close()
