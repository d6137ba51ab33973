"""The image plugin against qmd-indexer's contract checks, with pictures made here and a tiny CLIP built here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from qmd_indexer_image.clip import ClipEmbedder, resolve_model
from qmd_indexer_image.extract import ImageClassifier, ImageExtractor
from qmd_indexer_image.sniff import image_format
from qmd_indexer_image.tiny_clip import TINY_DIM, build_tiny_clip

from indexer.api import Chunk
from indexer.errors import EmbedError
from indexer.testing import check_classifier, check_embedder, check_extractor, check_extractor_rejects


def picture(path: Path, fmt: str, size: tuple[int, int] = (64, 48), colour: tuple[int, int, int] = (200, 30, 30),
            **save: object) -> Path:
    """Save a two-colour picture of ``size`` in ``fmt`` at ``path``."""
    im = Image.new("RGB", size, colour)
    im.paste((20, 20, 220), (0, 0, size[0] // 2, size[1] // 2))
    path.parent.mkdir(parents=True, exist_ok=True)
    im.save(path, fmt, **save)
    return path


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> ClipEmbedder:
    return ClipEmbedder({"model": str(build_tiny_clip(tmp_path_factory.mktemp("clip")))})


def test_signatures() -> None:
    assert image_format(b"\x89PNG\r\n\x1a\n....") == "PNG"
    assert image_format(b"\xff\xd8\xff\xe0") == "JPEG"
    assert image_format(b"GIF89a") == "GIF"
    assert image_format(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "WEBP"
    assert image_format(b"\x00\x00\x00\x18ftypheic") == "HEIF"
    assert image_format(b"# a note") is None


def test_classifier_claims_image_names(tmp_path: Path) -> None:
    samples: dict[Path, str | None] = {
        picture(tmp_path / "a.png", "PNG"): "image",
        picture(tmp_path / "b.JPG", "JPEG"): "image",
        picture(tmp_path / "c.jpeg", "JPEG"): "image",
        picture(tmp_path / "d.gif", "GIF"): "image",
        picture(tmp_path / "e.webp", "WEBP"): "image",
        tmp_path / "notes.md": None,
        tmp_path / "clip.flac": None,
    }
    check_classifier(ImageClassifier({}), samples)


@pytest.mark.parametrize(("name", "fmt", "expected"), [
    ("photo.png", "PNG", "PNG"), ("photo.jpg", "JPEG", "JPEG"), ("anim.gif", "GIF", "GIF"), ("w.webp", "WEBP", "WEBP"),
])
def test_extractor_one_chunk_with_size_format_and_caption(tmp_path: Path, name: str, fmt: str, expected: str) -> None:
    path = picture(tmp_path / "memory" / "trips" / name, fmt)
    (chunk,) = check_extractor(ImageExtractor({}), path, "image")
    assert chunk.modality == "image" and chunk.data == path.read_bytes()
    assert dict(chunk.meta) == {"width": 64, "height": 48, "format": expected}
    assert Path(name).stem in chunk.text and "64x48" in chunk.text


def test_caption_includes_an_embedded_description(tmp_path: Path) -> None:
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("Description", "the red bicycle by the harbour")
    path = picture(tmp_path / "IMG_0042.png", "PNG", pnginfo=info)
    (chunk,) = check_extractor(ImageExtractor({}), path, "image")
    assert "IMG 0042" in chunk.text and "red bicycle by the harbour" in chunk.text


def test_corrupt_truncated_mislabelled_and_oversized_pictures_are_refused(tmp_path: Path) -> None:
    good = picture(tmp_path / "good.png", "PNG", size=(300, 200)).read_bytes()
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(good[: len(good) // 2])
    flipped = bytearray(good)
    flipped[60] ^= 0xFF  # inside the first chunk: its CRC no longer matches
    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes(bytes(flipped))
    jpeg = picture(tmp_path / "good.jpg", "JPEG", size=(300, 200)).read_bytes()
    cut_jpeg = tmp_path / "cut.jpg"
    cut_jpeg.write_bytes(jpeg[: len(jpeg) // 2])
    text = tmp_path / "not-really.png"
    text.write_text("just some text with a picture's name\n")
    extractor = ImageExtractor({})
    for bad in (truncated, corrupt, cut_jpeg):
        assert "corrupt or unreadable" in str(check_extractor_rejects(extractor, bad, "image"))
    assert "not an image" in str(check_extractor_rejects(extractor, text, "image"))
    small = ImageExtractor({"max_pixels": 1000})
    refused = check_extractor_rejects(small, tmp_path / "good.png", "image")
    assert "over [plugin.image] max_pixels = 1000" in str(refused)


def test_max_pixels_is_honoured_over_pillows_own_limit(tmp_path: Path) -> None:
    """A 95 MP picture is over Pillow's decompression-bomb default (89.5 MP): with ``max_pixels`` above it, it is
    indexed; under the default ``max_pixels`` it is refused with a line naming the setting, not as "corrupt"."""
    path = tmp_path / "scan.png"
    Image.new("1", (10_000, 9_500), 1).save(path)  # 1 bit a pixel: 12 MB decoded
    (chunk,) = check_extractor(ImageExtractor({"max_pixels": 200_000_000, "ocr": False}), path, "image")
    assert (chunk.meta["width"], chunk.meta["height"]) == (10_000, 9_500)
    refused = str(check_extractor_rejects(ImageExtractor({"ocr": False}), path, "image"))
    assert "corrupt" not in refused and "10000x9500" in refused and "[plugin.image] max_pixels" in refused, refused


def test_clip_embedder_honours_the_contract(tmp_path: Path, clip: ClipEmbedder) -> None:
    paths = [picture(tmp_path / "red.png", "PNG"), picture(tmp_path / "green.jpg", "JPEG", colour=(10, 200, 10)),
             picture(tmp_path / "big.png", "PNG", size=(1200, 900), colour=(240, 240, 10))]
    transparent = tmp_path / "alpha.png"
    Image.new("RGBA", (40, 40), (0, 0, 0, 0)).save(transparent)
    chunks = [chunk for path in [*paths, transparent] for chunk in check_extractor(ImageExtractor({}), path, "image")]
    vectors = check_embedder(clip, chunks, "a red square", modality="image")
    assert vectors.shape == (4, TINY_DIM) and clip.dim == TINY_DIM and clip.max_tokens is None
    assert not np.allclose(vectors[0], vectors[1])  # different pictures, different vectors
    assert clip.embed_query("word " * 200).shape == (TINY_DIM,)  # longer than CLIP's 77 tokens: truncated


def test_clip_refuses_undecodable_bytes_by_chunk(clip: ClipEmbedder) -> None:
    with pytest.raises(EmbedError, match="does not decode"):
        clip.embed([Chunk("broken.png", kind="image", modality="image", data=b"\x89PNG\r\n\x1a\nbroken")])


def test_model_resolution_is_cheap_and_explains_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(LookupError, match=r"not in the local Hugging Face cache.*\[plugin.clip\] model"):
        resolve_model("clip-ViT-B-32")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no modules.json"):
        resolve_model(str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert resolve_model("clip-ViT-B-32") == ("sentence-transformers/clip-ViT-B-32",) * 2


def test_jpeg_draft_decode_keeps_aspect(tmp_path: Path) -> None:
    from qmd_indexer_image.decode import to_rgb

    data = picture(tmp_path / "wide.jpg", "JPEG", size=(1600, 400)).read_bytes()
    rgb = to_rgb(data)
    assert rgb.mode == "RGB" and max(rgb.size) <= 448 and abs(rgb.size[0] / rgb.size[1] - 4) < 0.1
