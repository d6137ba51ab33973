"""Images for qmd-indexer: a classifier and an extractor (``image``) and a CLIP embedder (``clip``).

- ``image`` classifier: ``.jpg .jpeg .png .webp .gif`` (and ``.heic .heif`` when ``pillow-heif`` is installed) are
  kind ``"image"``; the workspace's ``multimodal`` settings decide whether they are indexed.
- ``image`` extractor: the content must confirm the name (magic bytes, then Pillow ``verify`` and a full decode);
  one chunk per file, ``modality="image"``, the file's bytes in ``data``, a caption (file name, size, format and any
  embedded description) as ``text``, ``meta = {"width", "height", "format"}`` (pixels, Pillow's format name); with
  Tesseract installed, also the text read out of the picture as text chunks (``ocr``: ``meta["source"] = "ocr"``,
  ``meta["box"]`` its pixels; config ``[plugin.image] ocr_languages = ["eng", "chi_sim"]``).
- ``clip`` embedder: a CLIP model through sentence-transformers fills the named vector ``"image"``; its text tower
  embeds queries, so a text question finds photos. Config ``[plugin.clip] model = "/path/to/clip-ViT-B-32"``.
"""

__version__ = "0.1.0"
