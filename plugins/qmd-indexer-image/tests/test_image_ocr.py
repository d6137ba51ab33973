"""OCR in the image extractor with the real Tesseract: screenshots rendered here with Debian fonts, read back.

Without Tesseract (or its English and Chinese data, or the fonts) these tests skip saying what to install; under
``CI=true`` they fail instead, since CI installs them (``.ci/run``).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
import structlog.testing
from PIL import Image
from qmd_indexer_image import ocr
from qmd_indexer_image.extract import ImageExtractor
from qmd_indexer_image.screenshots import ocr_missing, render, save

from indexer.api import Chunk
from indexer.plugins import load_registry
from indexer.redact import Redactor
from indexer.testing import check_extractor, check_extractor_rejects

LINES = ["Deploy failed: disk quota exceeded on build-07", "Retry the pipeline after clearing the cache",
         "Receipt: Harbor Hardware, three hinges, total 14.85"]
CHINESE = ["内存不足错误 请重启服务", "五金店的收据 合计十五元"]


def tesseract_or_skip(*languages: str, cjk: bool = False) -> None:
    """Skip (fail under ``CI=true``) unless Tesseract, the data of ``languages`` and the fonts are installed."""
    why = ocr_missing(*languages, cjk=cjk)
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the OCR tests cannot run: {why}")
        pytest.skip(why)


def text_chunks(chunks: list[Chunk]) -> list[Chunk]:
    return [c for c in chunks if c.modality == "text"]


def overlaps(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...], margin: int = 6) -> bool:
    """Whether box ``a`` holds box ``b`` give or take ``margin`` pixels on each side."""
    return a[0] <= b[0] + margin and a[1] <= b[1] + margin and a[2] >= b[2] - margin and a[3] >= b[3] - margin


@pytest.mark.parametrize("name", ["shot.png", "shot.jpg", "shot.webp"])
def test_lines_come_back_in_reading_order_with_their_box(tmp_path: Path, name: str) -> None:
    tesseract_or_skip("eng")
    picture, boxes = render(LINES)
    path = save(picture, tmp_path / "memory" / name)
    chunks = check_extractor(ImageExtractor({}), path, "image")
    assert chunks[0].modality == "image" and chunks[0].data == path.read_bytes()  # the picture keeps its chunk
    (text,) = text_chunks(chunks)
    assert text.text.splitlines() == LINES and (text.start_line, text.end_line) == (1, 3)
    assert text.kind == "image" and text.context == "shot"
    assert text.meta["source"] == "ocr" and text.meta["width"] == picture.width
    box = text.meta["box"]
    assert overlaps([box[0] - 8, box[1] - 8, box[2] + 8, box[3] + 8], [min(b[0] for b in boxes),
                    min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes)])


@pytest.mark.parametrize(("variant", "options"), [
    ("noisy background", {"noise": 25}),
    ("rotated 90 degrees", {"angle": 90}),
    ("rotated 270 degrees, low contrast", {"angle": 270, "contrast": 0.2}),
    ("low contrast", {"contrast": 0.2}),
    ("low contrast over noise", {"noise": 12, "contrast": 0.4}),
])
def test_hard_screenshots_are_read(tmp_path: Path, variant: str, options: dict) -> None:
    tesseract_or_skip("eng")
    path = save(render(LINES, **options)[0], tmp_path / "hard.png")
    (text,) = text_chunks(check_extractor(ImageExtractor({}), path, "image"))
    assert text.text.splitlines() == LINES, variant
    box = text.meta["box"]
    with Image.open(path) as im:
        width, height = im.size
    assert 0 <= box[0] < box[2] <= width and 0 <= box[1] < box[3] <= height  # in the picture's own pixels
    if options.get("angle"):
        assert box[3] - box[1] > box[2] - box[0]  # turned lines stand upright: taller than wide


def test_chinese_with_english(tmp_path: Path) -> None:
    tesseract_or_skip("eng", "chi_sim", cjk=True)
    path = save(render(CHINESE, cjk=True, noise=15)[0], tmp_path / "收据.png")
    (text,) = text_chunks(check_extractor(ImageExtractor({"ocr_languages": ["eng", "chi_sim"]}), path, "image"))
    assert text.text.splitlines() == ["内存不足错误请重启服务", "五金店的收据合计十五元"]  # no spaces between Han


@pytest.mark.parametrize("angle", [90, 270])
def test_chinese_turned_on_its_side(tmp_path: Path, angle: int) -> None:
    """Two short lines of Chinese are too few characters for Tesseract's orientation detection: the picture, taller
    than wide and read as empty, is read turned both ways too, and the boxes come back in its own pixels."""
    tesseract_or_skip("eng", "chi_sim", cjk=True)
    picture, boxes = render(CHINESE, cjk=True, size=(720, 360), angle=angle)
    path = save(picture, tmp_path / "turned.png")
    (text,) = text_chunks(check_extractor(ImageExtractor({"ocr_languages": ["eng", "chi_sim"]}), path, "image"))
    first, second = text.text.splitlines()  # both lines, in order (turned 90 degrees, "的" may be missed)
    assert first == "内存不足错误请重启服务" and second.startswith("五金店") and second.endswith("收据合计十五元")
    mask = Image.new("L", (720, 360), 0)
    mask.paste(255, tuple(ocr.union(boxes)))  # where the text was drawn, turned as the picture was
    where = mask.rotate(angle, expand=True).getbbox()
    box = text.meta["box"]
    assert overlaps([box[0] - 8, box[1] - 8, box[2] + 8, box[3] + 8], where)
    assert overlaps(where, box, margin=12)  # and not much more


def test_unturn_maps_boxes_back() -> None:
    base = Image.new("L", (40, 20), 0)
    base.paste(255, (5, 2, 15, 8))  # box (5, 2, 15, 8) in a 40x20 picture
    for angle in (90, 270):
        turned = base.rotate(angle, expand=True)
        assert ocr.unturn(turned.getbbox(), angle, (40, 20)) == (5, 2, 15, 8)


def test_a_picture_without_text_makes_no_text_chunk(tmp_path: Path) -> None:
    tesseract_or_skip("eng")
    noise = render([], noise=40)[0]
    chunks = check_extractor(ImageExtractor({}), save(noise, tmp_path / "desk.png"), "image")
    assert [c.modality for c in chunks] == ["image"]


def test_low_confidence_words_are_dropped() -> None:
    data = {"text": ["", "Traceback", "Ke", "3c", "last", "", "128"], "conf": [-1, 96, 20, 44, 95, -1, 93],
            "page_num": [1] * 7, "block_num": [1, 1, 1, 1, 1, 2, 2], "par_num": [1] * 7,
            "line_num": [1, 1, 1, 1, 1, 1, 1], "left": [0, 10, 100, 140, 200, 0, 10],
            "top": [0, 10, 10, 12, 10, 0, 50], "width": [0, 80, 20, 20, 40, 0, 30],
            "height": [0, 20, 20, 18, 20, 0, 20]}
    lines = ocr.lines_from_data(data, 60)
    assert [line.text for line in lines] == ["Traceback last", "128"]
    assert lines[0].box == (10, 10, 240, 30) and lines[0].confidence == 95.5
    assert [line.box for line in ocr.lines_from_data(data, 60, scale=0.5)][1] == (20, 100, 80, 140)


def test_large_pictures_are_shrunk_and_boxes_stay_in_their_pixels(tmp_path: Path) -> None:
    tesseract_or_skip("eng")
    picture, _ = render(LINES, size=(2400, 1200), font_px=48, origin=(200, 400))
    path = save(picture, tmp_path / "wide.png")
    full = text_chunks(check_extractor(ImageExtractor({}), path, "image"))[0]
    small = text_chunks(check_extractor(ImageExtractor({"ocr_max_pixels": 700_000}), path, "image"))[0]
    assert small.text == full.text == "\n".join(LINES)
    assert all(abs(a - b) <= 12 for a, b in zip(small.meta["box"], full.meta["box"]))


def test_results_are_remembered_by_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tesseract_or_skip("eng")
    path = save(render(LINES)[0], tmp_path / "a.png")
    first = text_chunks(check_extractor(ImageExtractor({"state_dir": str(tmp_path / "state")}), path, "image"))
    assert (tmp_path / "state" / "ocr-cache.sqlite3").is_file()

    def no_tesseract(*args: object, **kwargs: object) -> None:
        raise AssertionError("Tesseract ran again for bytes it has read before")

    monkeypatch.setattr(ocr, "recognise", no_tesseract)
    copy = tmp_path / "renamed" / "b.png"
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())  # another name, the same content: a new extractor (a restart) reads none
    again = text_chunks(check_extractor(ImageExtractor({"state_dir": str(tmp_path / "state")}), copy, "image"))
    assert [c.text for c in again] == [c.text for c in first]
    assert again[0].context == "b"  # the name is the file's own, not the cached one's


#: a screenshot holding secrets Tesseract reads exactly as drawn (an AWS key id, a password in a URL)
SECRET_LINES = ["Deploy notes for the heliotrope cluster", "aws key id AKIAZ4QXW7PLMNB3KJ5T",
                "postgres://deploy:Heliotrope2718@db:5432/app"]
SECRETS = ["AKIAZ4QXW7PLMNB3KJ5T", "Heliotrope2718"]


def held(state: Path, secrets: list[str]) -> list[tuple[str, str]]:
    """``(file name, secret)`` for each secret whose bytes are in a file under ``state`` (the SQLite file, its WAL)."""
    return [(path.name, s) for path in state.rglob("*") if path.is_file() for s in secrets
            if s.encode() in path.read_bytes()]


def test_the_ocr_cache_holds_no_secret_read_in_a_picture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 57: answers showed a screenshot's key redacted, but the OCR cache under the state dir kept the text as
    read. The text handed to the pipeline (which redacts it) is the text drawn; what the cache stores is sealed with
    a key only the picture's bytes give, and a restart still reads it back without Tesseract."""
    tesseract_or_skip("eng")
    path = save(render(SECRET_LINES, size=(1000, 200))[0], tmp_path / "memory" / "creds.png")
    state = tmp_path / "state"
    (text,) = text_chunks(check_extractor(ImageExtractor({"state_dir": str(state)}), path, "image"))
    assert text.text.splitlines() == SECRET_LINES  # read as drawn: the secrets are in what OCR found
    assert (state / "ocr-cache.sqlite3").is_file() and held(state, SECRETS) == []
    assert not [s for s in SECRETS if s in Redactor().redact(text.text)]  # what the index and answers get

    def no_tesseract(*args: object, **kwargs: object) -> None:
        raise AssertionError("Tesseract ran again for bytes it has read before")

    monkeypatch.setattr(ocr, "recognise", no_tesseract)
    (again,) = text_chunks(check_extractor(ImageExtractor({"state_dir": str(state)}), path, "image"))
    assert again.text == text.text and held(state, SECRETS) == []


def test_the_ocr_cache_keeps_lines_sealed_by_content_and_rules(tmp_path: Path) -> None:
    """``OcrCache`` over ``indexer.api.KeyedCache``, without Tesseract: lines come back for the same bytes and rules
    after a reopen, other rules or other bytes miss, and a table of the first sealed layout is dropped."""
    import sqlite3

    path = tmp_path / "state" / "ocr-cache.sqlite3"
    path.parent.mkdir()
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE ocr_sealed (key BLOB PRIMARY KEY, nonce BLOB NOT NULL, sealed BLOB NOT NULL)")
    old.close()
    lines = [ocr.OcrLine("aws key id AKIAZ4QXW7PLMNB3KJ5T", (1, 2, 300, 20), 91.5),
             ocr.OcrLine("合计", (1, 30, 40, 50), 88.0)]
    digest = ocr.OcrCache.digest(b"picture bytes")
    cache = ocr.OcrCache(path)
    cache.put("rules", digest, lines)
    cache.put("rules", ocr.OcrCache.digest(b"blank picture"), [])
    reopened = ocr.OcrCache(path)
    assert reopened.get("rules", digest) == lines and reopened.get("rules", ocr.OcrCache.digest(b"blank picture")) == []
    assert reopened.get("other rules", digest) is None and reopened.get("rules", ocr.OcrCache.digest(b"x")) is None
    assert held(path.parent, ["AKIAZ4QXW7PLMNB3KJ5T"]) == []
    db = sqlite3.connect(path)
    assert [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["ocr_lines"]
    db.close()


def test_a_cache_of_the_previous_version_loses_its_text_in_clear(tmp_path: Path) -> None:
    """A cache written before its text was sealed (table ``ocr``: each picture's lines as JSON in clear) is emptied
    when the plugin opens it, and its pages are rewritten, so the secrets it held leave the file."""
    import sqlite3

    tesseract_or_skip("eng")
    state = tmp_path / "state"
    state.mkdir()
    old = sqlite3.connect(state / "ocr-cache.sqlite3")
    old.execute("PRAGMA journal_mode=WAL")
    old.execute("CREATE TABLE ocr (key BLOB PRIMARY KEY, lines TEXT NOT NULL)")
    with old:
        old.execute("INSERT INTO ocr VALUES (?, ?)", (b"k" * 32, json.dumps([[line, [0, 0, 9, 9], 95.0]
                                                                             for line in SECRET_LINES])))
    old.close()
    assert held(state, SECRETS)
    path = save(render(LINES)[0], tmp_path / "shot.png")
    (text,) = text_chunks(check_extractor(ImageExtractor({"state_dir": str(state)}), path, "image"))
    assert text.text.splitlines() == LINES and held(state, SECRETS) == []


def test_bad_pictures_get_one_log_line_and_lose_nothing_else(tmp_path: Path) -> None:
    tesseract_or_skip("eng")
    extractor = ImageExtractor({})
    strip = tmp_path / "strip.png"
    Image.new("RGB", (1, 50_000), (0, 0, 0)).save(strip)
    frames = [render([f"Frame {n} says deploy window opens at nine"])[0].convert("P") for n in (1, 2)]
    gif = tmp_path / "anim.gif"
    frames[0].save(gif, save_all=True, append_images=frames[1:], duration=200)
    good = io.BytesIO()
    render(LINES)[0].save(good, "PNG")
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(good.getvalue()[: len(good.getvalue()) // 2])
    bomb = tmp_path / "bomb.png"
    Image.new("1", (20_000, 20_000)).save(bomb)  # 400 MP of nothing in a few kilobytes
    with structlog.testing.capture_logs() as logs:
        chunks = check_extractor(extractor, strip, "image")
        assert [c.modality for c in chunks] == ["image"] and chunks[0].meta["height"] == 50_000
        chunks = check_extractor(extractor, gif, "image")
        assert [c.text for c in text_chunks(chunks)] == ["Frame 1 says deploy window opens at nine"]
        assert chunks[0].meta["frames"] == 2
    assert [(e["event"], e["path"]) for e in logs] == [("ocr_skipped", "strip.png"), ("ocr_first_frame", "anim.gif")]
    assert "1x50000 pixels" in logs[0]["reason"]
    assert "corrupt or unreadable PNG" in str(check_extractor_rejects(extractor, truncated, "image"))
    assert "20000x20000 pixels (400,000,000) is over [plugin.image] max_pixels" in str(
        check_extractor_rejects(extractor, bomb, "image"))


def test_tesseract_out_of_time_keeps_the_picture(tmp_path: Path) -> None:
    tesseract_or_skip("eng")
    path = save(render(LINES * 12, size=(1600, 1800))[0], tmp_path / "long.png")
    with structlog.testing.capture_logs() as logs:
        chunks = list(ImageExtractor({"ocr_timeout_s": 0.05}).extract(_file(path), _context()))
    assert [c.modality for c in chunks] == ["image"]
    (line,) = [e for e in logs if e["event"] == "ocr_failed"]
    assert line["path"] == "long.png" and "timeout after 0.05 s" in line["error"]


def test_tesseract_removed_while_running_fails_that_picture_only(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    tesseract_or_skip("eng")
    import pytesseract

    extractor = ImageExtractor({})  # loaded with Tesseract there
    monkeypatch.setattr(pytesseract.pytesseract, "tesseract_cmd", str(tmp_path / "uninstalled-tesseract"))
    path = save(render(LINES)[0], tmp_path / "shot.png")
    with structlog.testing.capture_logs() as logs:
        chunks = list(extractor.extract(_file(path), _context()))
    assert [c.modality for c in chunks] == ["image"]
    (line,) = [e for e in logs if e["event"] == "ocr_failed"]
    assert "apt-get install tesseract-ocr" in line["error"]


def test_languages_are_checked_when_the_plugin_loads() -> None:
    tesseract_or_skip("eng")
    with pytest.raises(ValueError, match=r"no Tesseract data for xyz_abc .*apt-get install tesseract-ocr-xyz-abc"):
        ImageExtractor({"ocr_languages": ["eng", "xyz_abc"]})
    with pytest.raises(ValueError, match="must be a list"):
        ImageExtractor({"ocr_languages": "eng"})


def test_without_tesseract_the_plugin_loads_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pytesseract

    monkeypatch.setattr(pytesseract.pytesseract, "tesseract_cmd", str(tmp_path / "no-such-tesseract"))
    extractor = ImageExtractor({"ocr_languages": ["eng", "chi_sim"]})  # not checked: there is no engine to ask
    assert not extractor.ocr and extractor.notice.startswith("OCR off: Tesseract is not installed")
    assert "apt-get install tesseract-ocr" in extractor.notice
    path = save(render(LINES)[0], tmp_path / "shot.png")
    assert [c.modality for c in check_extractor(extractor, path, "image")] == ["image"]
    from importlib.metadata import entry_points

    records = load_registry(eps=[e for e in entry_points(group="qmd_indexer.extractors") if e.name == "image"]).records
    assert [(r.status, r.reason) for r in records] == [("loaded", extractor.notice)]


def _file(path: Path) -> object:
    from indexer.api import FileInfo

    return FileInfo(path, path.name, "image", path.stat().st_size, opener=lambda: open(path, "rb"))


def _context() -> object:
    from indexer.testing import whitespace_context

    return whitespace_context(256)
