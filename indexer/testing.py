"""Contract checks for plugin authors: call them from your own tests to prove a plugin honours ``indexer.api``.

Each check raises ``AssertionError`` with a message that names the plugin, the member and what was wrong; none of
them needs pytest (they do not rely on ``assert`` statements, so ``python -O`` cannot strip them). Example::

    from indexer.testing import check_classifier, check_embedder, check_extractor, check_reranker

    def test_my_plugin(tmp_path):
        note = tmp_path / "a.txt"
        note.write_text("hello")
        check_classifier(MyClassifier({}), {note: "plaintext", tmp_path / "b.md": None})
        chunks = check_extractor(MyExtractor({}), note, "plaintext")
        check_embedder(MyEmbedder({}), chunks)
        check_reranker(MyReranker({}), "who fixed the disk?", ["Marco fixed the disk", "lunch is at noon"])

The checks use a whitespace tokenizer (``whitespace_context``) unless you pass the ``ExtractContext`` of a real text
embedder. Extractors get the sample as a ``FileInfo`` whose ``path`` does not exist while ``open()`` and
``read_bytes()`` serve the sample's bytes, as the daemon's opener does: an extractor that reads ``file.path`` fails.
The contract checked is the one ``indexer.plugins`` enforces when it loads a plugin, derived from the Protocols of
``indexer.api`` (``check_contract``); the checks here add behaviour: determinism, shapes, norms, the chunk rules, the
read rule, and one finite score per text for rerankers. Nothing here imports torch.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexer.api import HEAD_BYTES, MODALITY_PATTERN, TEXT, Chunk, ExtractContext, FileInfo
from indexer.contract import CLASSIFIERS, EMBEDDERS, EXTRACTORS, RERANKERS, check_contract, declared
from indexer.errors import ExtractError, FileSkipped, PluginError

__all__ = [
    "check_classifier", "check_embedder", "check_extractor", "check_extractor_rejects", "check_reranker",
    "whitespace_context",
]

_WORD = re.compile(r"\S+")
#: how far a row's L2 norm may be from 1 (float32 arithmetic in the model)
NORM_TOLERANCE = 1e-3
#: how far two embeddings of the same input may differ, per component
REPEAT_TOLERANCE = 1e-4


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def _name(obj: Any) -> str:
    return type(obj).__name__


def _contract(group: str, obj: Any) -> None:
    try:
        check_contract(group, obj)
    except PluginError as exc:
        raise AssertionError(f"{_name(obj)} breaks the {group} contract: {exc}") from None


def whitespace_context(max_tokens: int = 64) -> ExtractContext:
    """An ``ExtractContext`` whose tokens are runs of non-space characters, ``max_tokens`` per chunk."""
    return ExtractContext(max_tokens, lambda text: [m.span() for m in _WORD.finditer(text)])


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(HEAD_BYTES)
    except OSError:
        return b""


def check_classifier(classifier: Any, samples: Mapping[str | Path, str | None]) -> None:
    """Check a ``qmd_indexer.classifiers`` object.

    ``samples`` maps a path to the kind the classifier must answer for it (``None``: it must defer). An existing
    file is classified with its first ``HEAD_BYTES`` bytes, a missing one with ``b""``. Also checked: the contract
    members, ``priority`` is an ``int``, answers are ``str`` or ``None`` and repeat exactly, and junk heads (empty,
    NUL bytes, random bytes) never make ``classify`` raise.
    """
    _contract(CLASSIFIERS, classifier)
    name = _name(classifier)
    rng = np.random.default_rng(0)
    junk = [b"", b"\x00" * HEAD_BYTES, rng.integers(0, 256, HEAD_BYTES, dtype=np.uint8).tobytes()]
    for raw, expected in samples.items():
        path = Path(raw)
        head = _head(path)
        got = classifier.classify(path, head)
        _require(got is None or isinstance(got, str), f"{name}.classify({path.name!r}) returned {got!r}: "
                 f"must be a kind (str) or None")
        _require(got == expected, f"{name}.classify({str(path)!r}) returned {got!r}, expected {expected!r}")
        _require(classifier.classify(path, head) == got, f"{name}.classify({path.name!r}) is not deterministic")
        for bad in junk:
            try:
                answer = classifier.classify(path, bad)
            except Exception as exc:  # the contract: unknown input defers, never raises
                raise AssertionError(f"{name}.classify({path.name!r}, <{len(bad)} junk bytes>) raised "
                                     f"{type(exc).__name__}: {exc}; it must return None for input it does not "
                                     f"recognise") from None
            _require(answer is None or isinstance(answer, str),
                     f"{name}.classify on junk bytes returned {answer!r}: must be str or None")


#: the folder, never created, that the ``path`` of the ``FileInfo`` the checks hand to an extractor names
MISSING_DIR = ".qmd-indexer-check-path-does-not-exist"
#: the rule an extractor that reads ``file.path`` breaks, quoted by the checks
READ_RULE = ("read the file with file.read_bytes() or file.open(), never through file.path: the daemon's opener "
             "resolves it beneath the workspace with no symlink followed")


def _file_info(path: Path, kind: str) -> FileInfo:
    """The sample as the daemon hands it over, except that ``path`` (same name and suffix) names a file that does
    not exist: only ``open()`` (and so ``read_bytes()``) reaches the sample's bytes."""
    sample = Path(path).absolute()
    size = sample.stat().st_size
    decoy = sample.parent / MISSING_DIR / sample.name
    return FileInfo(path=decoy, rel_path=sample.name, kind=kind, size_bytes=size,
                    opener=lambda: open(sample, "rb"))


def _names_missing_path(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, is an ``OSError`` about the ``FileInfo.path`` that does
    not exist (a message that merely quotes ``file.path`` does not count)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and MISSING_DIR in f"{current.filename or ''} {current}":
            return True
        current = current.__cause__ or current.__context__
    return False


def _reads_path(extractor: Any, sample: Path, kind: str, context: ExtractContext, exc: Exception) -> bool:
    """Whether ``extractor``, having raised ``exc`` on the ``_file_info`` of ``sample``, read ``file.path``: the
    error names that missing path, or the extractor succeeds once ``path`` is the real file."""
    if _names_missing_path(exc):
        return True
    plain = FileInfo(path=sample, rel_path=sample.name, kind=kind, size_bytes=sample.stat().st_size)
    try:
        return len(list(extractor.extract(plain, context))) > 0
    except Exception:
        return False


def _path_reader(name: str, sample: Path, exc: Exception) -> AssertionError:
    return AssertionError(f"{name}.extract reads file.path: given a FileInfo whose path does not exist and whose "
                          f"open() serves the sample {sample.name!r}, it raised {type(exc).__name__}: {exc}; "
                          f"{READ_RULE}")


def _check_chunk(name: str, index: int, chunk: Any, kind: str, context: ExtractContext, token_limit: bool,
                 hit_fields: Sequence[str]) -> None:
    where = f"{name} chunk {index}"
    _require(isinstance(chunk, Chunk), f"{where} is a {type(chunk).__name__}, expected indexer.api.Chunk")
    _require(isinstance(chunk.text, str), f"{where}: text must be str, got {type(chunk.text).__name__}")
    _require(chunk.kind == kind, f"{where}: kind is {chunk.kind!r}, expected the file's kind {kind!r}")
    _require(isinstance(chunk.modality, str) and re.fullmatch(MODALITY_PATTERN, chunk.modality) is not None,
             f"{where}: modality must be the name of an embedder's modality ({MODALITY_PATTERN}), got "
             f"{chunk.modality!r}")
    _require(isinstance(chunk.start_line, int) and isinstance(chunk.end_line, int)
             and 1 <= chunk.start_line <= chunk.end_line,
             f"{where}: lines must be 1-based with start <= end, got {chunk.start_line}-{chunk.end_line}")
    if chunk.modality == TEXT:
        _require(bool(chunk.text.strip()), f"{where}: a text chunk must not be empty or whitespace")
        _require(chunk.data is None, f"{where}: a text chunk carries no data bytes")
        if token_limit:
            n = len(context.token_offsets(chunk.text))
            _require(n <= context.max_tokens, f"{where}: {n} tokens > max_tokens {context.max_tokens}; size "
                     f"chunks with context.token_offsets (see indexer.api.chunk_text)")
    else:
        _require(isinstance(chunk.data, bytes) and len(chunk.data) > 0,
                 f"{where}: a {chunk.modality!r} chunk must carry its bytes in data")
    _require((chunk.start_s is None) == (chunk.end_s is None),
             f"{where}: start_s and end_s are set together or not at all, got {chunk.start_s}, {chunk.end_s}")
    if chunk.start_s is not None:
        _require(all(isinstance(v, (int, float)) and math.isfinite(v) for v in (chunk.start_s, chunk.end_s))
                 and 0 <= chunk.start_s <= chunk.end_s,
                 f"{where}: need 0 <= start_s <= end_s seconds, got {chunk.start_s}, {chunk.end_s}")
    try:
        json.dumps(dict(chunk.meta))
    except (TypeError, ValueError) as exc:
        raise AssertionError(f"{where}: meta must be JSON-serialisable (it goes into the payload): {exc}") from None
    carried = set(chunk.meta) | ({"start_s", "end_s"} if chunk.start_s is not None else set())
    _require(not hit_fields or bool(carried & set(hit_fields)),
             f"{where}: carries none of the declared hit_fields {list(hit_fields)}")


def check_extractor(extractor: Any, file_path: str | Path, kind: str, context: ExtractContext | None = None,
                    *, token_limit: bool = True) -> list[Chunk]:
    """Check a ``qmd_indexer.extractors`` object on one good sample file of ``kind``; returns its chunks.

    Checked: the contract (with the optional ``media``/``hit_fields`` declarations); ``kind`` is in ``kinds``;
    when ``hit_fields`` are declared, each chunk carries at least one of them; ``extract``
    yields at least one ``Chunk``; each chunk has
    the file's kind, a known modality, a valid 1-based line range, non-empty text (text chunks) or data bytes
    (other modalities), ``start_s``/``end_s`` seconds set together with ``0 <= start_s <= end_s``, JSON-safe
    ``meta``, and (when ``token_limit``) at most ``context.max_tokens`` tokens per text chunk; a second extraction
    gives equal chunks; the file is read through ``file.open()``/``file.read_bytes()``, never ``file.path`` (the
    ``FileInfo`` handed over names a path that does not exist; the message names the rule). ``context`` defaults
    to ``whitespace_context()``.
    """
    _contract(EXTRACTORS, extractor)
    name = _name(extractor)
    _require(kind in extractor.kinds, f"{name}.kinds is {sorted(extractor.kinds)}, which lacks {kind!r}")
    context = context or whitespace_context()
    sample = Path(file_path).absolute()
    info = _file_info(sample, kind)
    try:
        chunks = list(extractor.extract(info, context))
    except Exception as exc:
        if _reads_path(extractor, sample, kind, context, exc):
            raise _path_reader(name, sample, exc) from None
        if not isinstance(exc, (ExtractError, FileSkipped)):
            raise
        raise AssertionError(f"{name}.extract refused a good {kind!r} sample {info.path.name!r}: "
                             f"{type(exc).__name__}: {exc}") from None
    _require(len(chunks) > 0, f"{name}.extract yielded no chunks for {info.path.name!r}")
    for index, chunk in enumerate(chunks):
        _check_chunk(name, index, chunk, kind, context, token_limit, declared(EXTRACTORS, extractor, "hit_fields"))
    again = list(extractor.extract(info, context))
    _require(again == chunks, f"{name}.extract is not deterministic: a second run over {info.path.name!r} gave "
             f"different chunks")
    return chunks


def check_extractor_rejects(extractor: Any, file_path: str | Path, kind: str,
                            context: ExtractContext | None = None) -> Exception:
    """Check that ``extractor`` refuses a bad sample (corrupt, truncated, unsupported) the way the daemon expects:
    by raising ``indexer.errors.ExtractError`` or ``FileSkipped`` with a non-empty reason, not because it could not
    find ``file.path`` (an ``OSError`` about that missing path, raised or chained, fails). Returns the exception."""
    name = _name(extractor)
    sample = Path(file_path).absolute()
    info = _file_info(sample, kind)
    try:
        chunks = list(extractor.extract(info, context or whitespace_context()))
    except (ExtractError, FileSkipped) as exc:
        if _names_missing_path(exc):  # refused for the wrong reason: it could not find file.path
            raise _path_reader(name, sample, exc) from None
        _require(bool(str(exc).strip()), f"{name} raised {type(exc).__name__} without a reason")
        return exc
    except Exception as exc:
        if _names_missing_path(exc):
            raise _path_reader(name, sample, exc) from None
        raise AssertionError(f"{name}.extract raised {type(exc).__name__}: {exc} for bad sample "
                             f"{info.path.name!r}; raise indexer.errors.ExtractError with the reason instead") from None
    raise AssertionError(f"{name}.extract accepted bad sample {info.path.name!r} ({len(chunks)} chunks); it must "
                         f"raise indexer.errors.ExtractError")


def _check_vectors(name: str, what: str, vectors: Any, shape: tuple[int, ...]) -> np.ndarray:
    _require(isinstance(vectors, np.ndarray), f"{name}.{what} returned {type(vectors).__name__}, expected a "
             f"numpy array")
    _require(vectors.shape == shape, f"{name}.{what} returned shape {vectors.shape}, expected {shape}")
    _require(vectors.dtype == np.float32, f"{name}.{what} returned dtype {vectors.dtype}, expected float32")
    _require(bool(np.isfinite(vectors).all()), f"{name}.{what} returned NaN or infinite values")
    norms = np.linalg.norm(vectors.reshape(-1, shape[-1]), axis=1)
    bad = np.flatnonzero(np.abs(norms - 1.0) > NORM_TOLERANCE)
    _require(bad.size == 0, f"{name}.{what}: rows must be L2-normalised; row {bad[:1].tolist()} has norm "
             f"{norms[bad[:1]].tolist()} (use indexer.api.l2_normalise)")
    return np.asarray(vectors)


def check_embedder(embedder: Any, chunks: Sequence[Chunk], query: str = "what did we decide about the launch?",
                   *, modality: str | None = None) -> np.ndarray:
    """Check a ``qmd_indexer.embedders`` object on sample ``chunks`` (at least one) of its modality; returns the
    ``(len(chunks), dim)`` vectors.

    Checked: the contract (a ``"text"`` embedder: ``TextEmbedder``); ``model_id`` a non-empty str; ``modality``
    a lowercase name (equal to ``modality`` when given); ``dim`` a positive int; ``max_tokens`` a positive int for
    text embedders (with a ``token_offsets`` giving in-range ``(start, end)`` pairs), ``None`` for others; ``embed``
    returns
    ``(n, dim)`` float32 finite L2-normalised rows, the same again on a second call, and row ``i`` equal to
    embedding chunk ``i`` alone; ``embed_query(query)`` returns ``(dim,)`` float32 L2-normalised, deterministic.
    """
    _contract(EMBEDDERS, embedder)
    name = _name(embedder)
    chunks = list(chunks)
    _require(len(chunks) > 0, "check_embedder needs at least one sample chunk")
    _require(isinstance(embedder.model_id, str) and bool(embedder.model_id),
             f"{name}.model_id must be a non-empty str, got {embedder.model_id!r}")
    if modality is not None:
        _require(embedder.modality == modality, f"{name}.modality is {embedder.modality!r}, expected {modality!r}")
    for i, chunk in enumerate(chunks):
        _require(chunk.modality == embedder.modality, f"sample chunk {i} has modality {chunk.modality!r}, not the "
                 f"embedder's {embedder.modality!r}")
    dim = embedder.dim
    _require(isinstance(dim, int) and not isinstance(dim, bool) and dim > 0,
             f"{name}.dim must be a positive int, got {dim!r}")
    if embedder.modality == TEXT:
        max_tokens = embedder.max_tokens
        _require(isinstance(max_tokens, int) and max_tokens > 0,
                 f"{name}.max_tokens must be a positive int for a text embedder, got {max_tokens!r}")
        text = chunks[0].text
        offsets = embedder.token_offsets(text)
        _require(all(0 <= s <= e <= len(text) for s, e in offsets),
                 f"{name}.token_offsets returned pairs outside the text: {offsets[:3]}...")
    else:
        _require(embedder.max_tokens is None, f"{name}.max_tokens must be None for a {embedder.modality!r} "
                 f"embedder, got {embedder.max_tokens!r}")
    vectors = _check_vectors(name, "embed", embedder.embed(chunks), (len(chunks), dim))
    again = np.asarray(embedder.embed(chunks))
    _require(again.shape == vectors.shape and np.allclose(again, vectors, atol=REPEAT_TOLERANCE),
             f"{name}.embed is not deterministic: two calls on the same chunks differ")
    for i, chunk in enumerate(chunks):
        alone = _check_vectors(name, "embed", embedder.embed([chunk]), (1, dim))
        _require(np.allclose(alone[0], vectors[i], atol=10 * REPEAT_TOLERANCE),
                 f"{name}.embed: chunk {i} alone differs from its row in the batch (max diff "
                 f"{float(np.abs(alone[0] - vectors[i]).max()):.2g}); embeddings must not depend on the batch")
    q = _check_vectors(name, "embed_query", embedder.embed_query(query), (dim,))
    _require(np.allclose(np.asarray(embedder.embed_query(query)), q, atol=REPEAT_TOLERANCE),
             f"{name}.embed_query is not deterministic")
    return vectors


def check_reranker(reranker: Any, query: str, texts: Sequence[str]) -> list[float]:
    """Check a ``qmd_indexer.rerankers`` object on ``query`` and sample ``texts`` (at least two); returns the scores.

    Checked: the contract; ``model_id`` a non-empty str; ``score(query, texts)`` returns a list of one finite float
    per text, the same again on a second call, and score ``i`` equal to scoring text ``i`` alone (scores must not
    depend on the batch: the stage rescores a different set of hits each search).
    """
    _contract(RERANKERS, reranker)
    name = _name(reranker)
    texts = list(texts)
    _require(len(texts) >= 2, "check_reranker needs at least two sample texts")
    _require(isinstance(reranker.model_id, str) and bool(reranker.model_id),
             f"{name}.model_id must be a non-empty str, got {reranker.model_id!r}")
    scores = reranker.score(query, texts)
    _require(isinstance(scores, list) and len(scores) == len(texts),
             f"{name}.score returned {type(scores).__name__} of {len(scores) if hasattr(scores, '__len__') else '?'}"
             f" items for {len(texts)} texts: must be a list of one float per text")
    _require(all(isinstance(v, float) and math.isfinite(v) for v in scores),
             f"{name}.score returned {scores[:3]}...: every score must be a finite float")
    _require(np.allclose(reranker.score(query, texts), scores, atol=REPEAT_TOLERANCE),
             f"{name}.score is not deterministic")
    for i, text in enumerate(texts):
        alone = reranker.score(query, [text])
        _require(len(alone) == 1 and abs(alone[0] - scores[i]) <= 10 * REPEAT_TOLERANCE * max(1.0, abs(scores[i])),
                 f"{name}.score: text {i} alone scores {alone}, {scores[i]} in the batch; scores must not depend "
                 f"on the batch")
    return list(scores)

