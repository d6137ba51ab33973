"""Measure OCR in the image plugin on this CPU: word recall and precision against rendered text at several
confidence thresholds, phrase-search hit@1, Tesseract seconds per megapixel, and the first-index time of an image
folder with OCR on and off.

    python plugins/bench_ocr.py [--data ../shared/data] [--screenshots 50] [--folder 200] [--out DIR]

The set: ``--screenshots`` pictures rendered here (``qmd_indexer_image.screenshots``: DejaVu, and WenQuanYi for the
Chinese ones) in varied layouts (font 16-34 px, one to six lines, plain, noisy, low-contrast, turned 90 or 270
degrees; PNG, JPEG and WebP), each with known text, plus the pictures in ``<data>/images`` (photos and a diagram;
the script says when that folder is missing and goes on without it).

- **Words**: each picture read once with no threshold, then the words kept at each ``--thresholds`` value scored
  against the rendered words (recall: rendered words read; precision: words read that were rendered). Chinese is
  scored by character. The photos have no ground truth: the words kept on them count as false.
- **Phrase hit@1**: the rendered screenshots and three notes indexed by the real daemon (real text model, Qdrant
  Edge in a temporary folder, no CLIP); one query per screenshot (two to four words of one of its lines, hybrid
  search): is that screenshot the first hit?
- **Seconds per megapixel**: Tesseract's time (the plugin's default settings, cache off) over the pictures' size.
- **First index**: a folder of ``--folder`` pictures (the screenshots, the photos, more rendered ones, a third of
  them without text) indexed from scratch with a tiny CLIP (random weights: it stands for the CLIP vector's cost,
  not a real ViT-B/32) with OCR on and with ``ocr = false``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from indexer.api import GROUPS  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
STORES = ["Harbor Hardware", "Maple Grocers", "Northside Pharmacy", "Cedar Books", "Blue Door Bakery"]
ITEMS = ["brass hinges", "wood screws", "sourdough loaf", "allergy tablets", "paperback atlas", "paint roller"]
HOSTS = ["vault", "gitlab", "grafana", "ledger", "mailhub", "kiosk"]
ERRORS = ["CUDA out of memory", "disk quota exceeded", "connection refused", "permission denied",
          "certificate has expired", "segmentation fault", "too many open files", "no space left on device"]
SLIDES = ["Quarterly roadmap review", "Migration plan for the billing service", "Incident retrospective",
          "Onboarding checklist for new hires", "Latency budget per request"]
CHINESE = [["内存不足错误", "请重启服务"], ["五金店的收据", "合计十五元"], ["数据库连接超时", "请检查网络"],
           ["会议纪要", "下周三发布新版本"], ["证书已过期", "请联系管理员"]]


def screenshot_text(n: int, rng: random.Random) -> tuple[list[str], str, bool]:
    """Lines of screenshot ``n``, the phrase a search asks for, and whether it is Chinese."""
    kind, k = n % 5, n // 5  # five layouts, the k-th screenshot of its layout: no two phrases are the same
    if kind == 4 and k % 2 == 1:
        lines = CHINESE[(k // 2) % len(CHINESE)]
        return lines, lines[1], True
    if kind in (0, 1):
        error, host = ERRORS[(2 * k + kind) % len(ERRORS)], HOSTS[(2 * k + kind) // len(ERRORS) % len(HOSTS)]
        lines = [f"{host}-{n:02d}: job {1000 + n} failed", f"Error: {error} while syncing {host}",
                 "See the log for details"][: 2 + n % 2]
        return lines, f"{error} {host}", False
    if kind == 2:
        store, item = STORES[k % len(STORES)], ITEMS[k // len(STORES) % len(ITEMS)]
        lines = [store, f"{rng.randint(1, 9)} {item} {rng.randint(2, 90)}.{rng.randint(10, 99)}",
                 f"Receipt {4000 + n}", "Thank you for shopping"]
        return lines, f"{store} {item.split()[-1]}", False
    if kind == 3:
        title = SLIDES[k % len(SLIDES)]
        lines = [title, f"Owner: team {HOSTS[k % len(HOSTS)]}", f"Milestone {10 + n} due in week {n % 52 + 1}"]
        return lines, f"{title.split()[0]} {title.split()[-1]} milestone {10 + n}", False
    lines = [f"$ ssh admin@{HOSTS[k % len(HOSTS)]}.internal", f"ssh: connect to host port {20 + n}: timed out",
             f"exit code {n + 100}"]
    return lines, f"ssh {HOSTS[k % len(HOSTS)]} port {20 + n} timed out", False


def render_set(folder: Path, count: int, seed: int = 7) -> list[dict[str, Any]]:
    from qmd_indexer_image.screenshots import render, save

    rng = random.Random(seed)
    out = []
    for n in range(count):
        lines, phrase, cjk = screenshot_text(n, rng)
        options: dict[str, Any] = {"font_px": rng.choice([16, 20, 24, 28, 34]), "seed": n,
                                   "size": (rng.choice([640, 900, 1280]), rng.choice([360, 480, 720])),
                                   "origin": (rng.randint(10, 80), rng.randint(10, 60))}
        style = n % 6
        if style == 1:
            options["noise"] = 22
        elif style == 2:
            options["contrast"] = 0.25
        elif style == 3:
            options["angle"] = rng.choice([90, 270])
        elif style == 4:
            options.update(noise=12, contrast=0.45)
        suffix = [".png", ".jpg", ".webp"][n % 3]
        picture, _ = render(lines, cjk=cjk, **options)
        path = save(picture, folder / f"shot-{n:02d}{suffix}")
        out.append({"path": path, "lines": lines, "phrase": phrase, "cjk": cjk, "style": style})
    return out


def units(text: str, cjk: bool) -> list[str]:
    """Words to score: characters for Chinese, else lowercase words stripped of punctuation."""
    if cjk:
        return [ch for ch in text if not ch.isspace() and not ch.isascii()]
    return [w for w in (w.strip(".,:;$()'\"").lower() for w in text.split()) if w]


def bench_words(shots: list[dict[str, Any]], photos: list[Path], thresholds: list[int]) -> dict[str, Any]:
    """Recall/precision per threshold, and Tesseract seconds per megapixel at the default threshold. Each picture is
    read as the plugin reads it (``ocr.recognise``): Otsu's threshold, then Sauvola's where the first pass keeps no
    word; the threshold sweep applies each value to the same passes."""
    import pytesseract
    from PIL import Image
    from qmd_indexer_image import ocr

    def read(picture: Any, thresholding: str) -> tuple[dict[str, list[Any]], float]:
        t0 = time.perf_counter()
        data = pytesseract.image_to_data(picture, lang="eng+chi_sim", config=f"--psm 1 {thresholding}".strip(),
                                         output_type=pytesseract.Output.DICT)
        return data, time.perf_counter() - t0

    passes = []
    seconds = megapixels = 0.0
    for item in [*shots, *({"path": p, "lines": [], "cjk": False} for p in photos)]:
        with Image.open(item["path"]) as im:
            picture = im.convert("RGB")
        megapixels += picture.width * picture.height / 1e6
        otsu, spent = read(picture, ocr.THRESHOLDINGS[0])
        seconds += spent
        sauvola = None
        if not ocr.lines_from_data(otsu, min(thresholds)):
            sauvola, spent = read(picture, ocr.THRESHOLDINGS[1])
            seconds += spent  # the plugin's second pass: it runs whenever the first keeps nothing
        passes.append((units(" ".join(item["lines"]), item["cjk"]), otsu, sauvola, item["cjk"]))
    sweep = {}
    for threshold in thresholds:
        hit = truth_n = read_n = 0
        for truth, otsu, sauvola, cjk in passes:
            lines = ocr.lines_from_data(otsu, threshold)
            if not lines and sauvola is not None:
                lines = ocr.lines_from_data(sauvola, threshold)
            kept = units(" ".join(line.text for line in lines), cjk)
            matched = sum((Counter(truth) & Counter(kept)).values())
            hit, truth_n, read_n = hit + matched, truth_n + len(truth), read_n + len(kept)
        sweep[threshold] = {"recall": round(hit / max(truth_n, 1), 3), "precision": round(hit / max(read_n, 1), 3),
                            "words_read": read_n}
    return {"sweep": sweep, "pictures": len(passes), "megapixels": round(megapixels, 2),
            "ocr_s_per_megapixel": round(seconds / max(megapixels, 1e-9), 3)}


def registry(models: Path, clip: Path | None, ocr_on: bool = True) -> Any:
    from indexer.plugins import load_registry

    names = {"markdown", "sentence-transformers", "image"} | ({"clip"} if clip else set())
    eps = [e for g in GROUPS for e in entry_points(group=g) if e.name in names]
    config = {"sentence-transformers": {"model": "all-MiniLM-L6-v2", "cache_dir": str(models)},
              "image": {"ocr_languages": ["eng", "chi_sim"], "ocr": ocr_on}}
    if clip:
        config["clip"] = {"model": str(clip)}
    reg = load_registry(config=config, eps=eps)
    failed = [(r.name, r.reason) for r in reg.records if r.status != "loaded"]
    if failed:
        raise SystemExit(f"plugins failed to load: {failed}")
    return reg


def index_folder(ws: Path, state: Path, reg: Any) -> tuple[Any, float]:
    from indexer.config import Settings
    from indexer.daemon import Indexer
    from indexer.worker import index_once

    settings = Settings(state_dir=state, workspace=[{"agent": "main", "path": ws,
                                                     "multimodal": {"enabled": True, "modalities": ["image"]}}])
    indexer = Indexer.open(settings, registry=reg)
    t0 = time.perf_counter()
    index_once(indexer)
    return indexer, time.perf_counter() - t0


def bench_search(shots: list[dict[str, Any]], root: Path, models: Path) -> dict[str, Any]:
    from indexer.search import SearchParams

    ws = root / "search-ws"
    (ws / "memory" / "screens").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nScreenshots live under memory/screens.\n")
    (ws / "memory" / "notes.md").write_text("# Notes\n\nThe vault host was migrated; ssh admin access needs a key.\n"
                                            "Receipts from Harbor Hardware go in the shoebox.\n")
    for shot in shots:
        target = ws / "memory" / "screens" / shot["path"].name
        target.write_bytes(shot["path"].read_bytes())
    indexer, _ = index_folder(ws, root / "search-state", registry(models, None))
    try:
        search, hits1, misses = indexer.view.searcher(), 0, []
        for shot in shots:
            hits = search.search(SearchParams(shot["phrase"], k=5))
            first = hits[0]["path"] if hits else None
            if first == f"memory/screens/{shot['path'].name}":
                hits1 += 1
            else:
                misses.append((shot["phrase"], shot["path"].name, first, shot["style"]))
        return {"queries": len(shots), "hit@1": round(hits1 / len(shots), 3), "misses": misses}
    finally:
        indexer.close()


def bench_first_index(shots: list[dict[str, Any]], photos: list[Path], size: int, root: Path,
                      models: Path) -> dict[str, Any]:
    import numpy as np
    from PIL import Image
    from qmd_indexer_image.tiny_clip import build_tiny_clip

    folder = root / "folder-ws"
    pics = folder / "memory" / "pictures"
    pics.mkdir(parents=True)
    (folder / "MEMORY.md").write_text("# Memory\n\nPictures under memory/pictures.\n")
    sources = [s["path"] for s in shots] + photos
    for n, src in enumerate(sources[:size]):
        (pics / f"{n:03d}-{src.name}").write_bytes(src.read_bytes())
    extra = render_set(root / "extra", max(0, size - len(sources)) * 2 // 3, seed=11)
    for n, shot in enumerate(extra):
        (pics / f"x{n:03d}-{shot['path'].name}").write_bytes(shot["path"].read_bytes())
    rng = np.random.default_rng(3)
    n = len(list(pics.iterdir()))
    while n < size:  # photos without text: smooth colour fields with grain
        grad = np.linspace(0, 1, 640)[None, :, None] * rng.integers(0, 255, 3) + rng.normal(0, 18, (480, 640, 3))
        Image.fromarray(np.clip(grad + 40, 0, 255).astype(np.uint8)).save(pics / f"p{n:03d}.jpg", quality=88)
        n += 1
    clip = build_tiny_clip(root / "tiny-clip")
    out: dict[str, Any] = {"pictures": n}
    for label, on in (("ocr_off", False), ("ocr_on", True)):
        indexer, seconds = index_folder(folder, root / f"state-{label}", registry(models, clip, on))
        try:
            status = indexer.view.status()
            out[label] = {"seconds": round(seconds, 1), "chunks": sum(c["chunks"] for c in status["collections"]
                                                                      .values()),
                          "files_failed": status["files_failed"]}
        finally:
            indexer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--screenshots", type=int, default=50)
    parser.add_argument("--folder", type=int, default=200, help="pictures in the first-index folder (0: skip)")
    parser.add_argument("--thresholds", default="0,30,50,60,70,80,90")
    parser.add_argument("--out", type=Path, help="keep the rendered screenshots here (default: a temporary folder)")
    args = parser.parse_args()
    from qmd_indexer_image import ocr

    from indexer.terminal import configure_logging

    configure_logging("json", "warning")
    problem = ocr.engine_problem()
    if problem:
        raise SystemExit(problem)
    images = args.data / "images"
    photos = sorted(p for p in images.glob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp"))
    if not photos:
        print(f"images: {images} is missing or empty; measuring on the rendered screenshots alone", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-ocr-") as tmp:
        root = Path(tmp)
        shots = render_set(args.out or root / "shots", args.screenshots)
        models = root / "models"
        result: dict[str, Any] = {"cpus": os.cpu_count(), "screenshots": len(shots), "photos": len(photos)}
        result["words"] = bench_words(shots, photos, [int(t) for t in args.thresholds.split(",")])
        print(json.dumps(result["words"]), file=sys.stderr)
        result["search"] = bench_search(shots, root, models)
        print(json.dumps(result["search"]), file=sys.stderr)
        if args.folder:
            result["first_index"] = bench_first_index(shots, photos, args.folder, root, models)
        print(json.dumps(result, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
