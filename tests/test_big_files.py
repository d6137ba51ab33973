"""A huge note (a conversation log of tens of thousands of turns) goes through the pipeline in bounded pieces: its
text is tokenized in blocks of lines, and its chunks are embedded and written in slices (``Sync._write_slices``),
each under the store's lock on its own, with the file's state point (chunk 0) deleted first and written last, so a
write stopped midway reads as incomplete and converges at the next start. What it costs is
``python -m benchmarks.big_log``'s; here the slices are made small so a small log takes several."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Running, make_settings, wait_for, write
from structlog.testing import capture_logs

from indexer import chunking, model_loading, sections, sync
from indexer.builtin.embedding import SentenceTransformerEmbedder
from indexer.daemon import Indexer
from indexer.memory import LocalMemory
from indexer.plugins import Registry
from indexer.points import Point
from indexer.schema import SearchRequest
from indexer.sync import Pace
from indexer.worker import index_once

NAMES = ("Caroline", "Melanie")
TOPICS = ["pottery class", "the camping trip", "adoption agencies", "a charity run", "the beach at sunset",
          "her violin lessons", "a support group", "painting a lake"]


def conversation(turns: int, last: str = "See you soon!") -> str:
    lines = ["# 2023-05-08", "", "Conversation between Caroline and Melanie.", ""]
    lines += [f"- [{10 + i // 60:02d}:{i % 60:02d}] {NAMES[i % 2]}: I keep thinking about {TOPICS[i % len(TOPICS)]}, "
              f"turn {i}." for i in range(turns - 1)]
    lines.append(f"- [23:59] Melanie: {last}")
    return "\n".join(lines) + "\n"


def test_a_note_tokenized_in_blocks_chunks_as_when_tokenized_whole(registry: Registry,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    text = conversation(120) + "\n## After\n\n" + "A long paragraph of plain prose follows here. " * 60 + "\n"
    embedder = registry.text_embedder
    assert embedder is not None
    whole = sections.chunk_markdown(text, embedder.token_offsets, 128, "memory/2023-05-08.md")
    calls: list[int] = []

    def counted(part: str) -> list[tuple[int, int]]:
        calls.append(len(part))
        return embedder.token_offsets(part)

    monkeypatch.setattr(chunking, "TOKENIZE_BLOCK_CHARS", 500)
    blocks = sections.chunk_markdown(text, counted, 128, "memory/2023-05-08.md")
    assert blocks == whole and len(whole) > 10
    big = [n for n in calls if n > 1000]
    assert len(big) == 1 and big[0] > 2500  # only the one-line paragraph, a line longer than a block, goes whole


def test_a_batch_of_long_chunks_holds_at_most_the_word_piece_budget(registry: Registry) -> None:
    embedder = registry.text_embedder
    assert isinstance(embedder, SentenceTransformerEmbedder)
    long, short = "I keep thinking about the camping trip. " * 40, "pottery class"
    texts = [long] * 20 + [short] * 40
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    batches = embedder.batches([len(texts[i]) for i in order], order)
    assert [i for batch in batches for i in batch] == order  # each text once, longest first
    assert (embedder.batch_size, embedder.batch_tokens, embedder.max_tokens + 2) == (32, 4096, 256)
    # long texts padded to the model's 256 word pieces: 16 a pass; short ones fill a batch of up to 32
    assert [len(batch) for batch in batches] == [16, 16, 28]
    # cut shorter, the same vectors as one text at a time: up to the padding's float rounding in fp32 and bf16; int8
    # quantizes each batch's activations with one scale (ONNX Runtime's dynamic quantization), so a text's vector
    # moves a little with its batch (cosine 0.9954 seen on an AVX2 machine, where auto picks int8)
    vectors = embedder.encode(texts[18:24])
    alone = np.stack([embedder.encode([text])[0] for text in texts[18:24]])
    agreement = 0.99 if embedder.precision == "int8" else 0.999
    assert np.einsum("ij,ij->i", vectors, alone).min() > agreement


@pytest.fixture(name="small_slices")
def small_slices_fixture(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of 4 chunks, and files of more than 8 chunks written in slices."""
    monkeypatch.setattr(sync, "GROUP_CHUNKS", 4)
    monkeypatch.setattr(sync, "STREAM_CHUNKS", 8)


def _points_of(indexer: Indexer, name: str, abs_path: str) -> list[Any]:
    return [p for p in indexer.store.scroll(name) if p.abs_path == abs_path]


def test_a_huge_note_is_written_in_slices_that_let_searches_in(tmp_path: Path, make_indexer: Any,
                                                               small_slices: None) -> None:
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# Memory\n\nNotes of conversations.\n")
    daemon = make_indexer([{"agent": "main", "path": str(ws)}])
    collection = next(c for c in daemon.state.plan.collections if c.role == "dir")
    upserts: list[int] = []
    searched: list[bool] = []
    upsert = daemon.store.upsert

    def watched(name: str, points: list[Point]) -> None:
        upsert(name, points)
        upserts.append(len(points))
        # another thread's search between two slices finds the store's lock free
        finder = threading.Thread(target=lambda: searched.append(bool(daemon.store.count(name) >= 0)))
        finder.start()
        finder.join(30)
        assert not finder.is_alive(), "a search waited for the whole file's write"

    daemon.store.upsert = watched  # type: ignore[method-assign]
    with capture_logs() as logs, Running(daemon):
        log = write(ws / "memory" / "2023-05-08.md", conversation(80, "the heliotrope kiln is fixed"))
        wait_for(lambda: any(e["event"] == "file_indexed" and e["path"] == str(log) for e in logs), 120)
        answer = LocalMemory(daemon.view).search(SearchRequest(query="heliotrope kiln", mode="hybrid"))
    indexed = next(e for e in logs if e["event"] == "file_indexed" and e["path"] == str(log))
    points = _points_of(daemon, collection.name, str(log))
    assert indexed["slices"] > 2 and len(points) == indexed["chunks"] == sum(upserts) + 1
    assert max(upserts) <= 4 and all(searched)
    assert sorted(p.chunk_index for p in points) == list(range(len(points)))
    assert daemon.store.file_states(collection.name)[str(log)].complete
    assert answer["hits"][0]["path"] == "memory/2023-05-08.md"


def test_a_huge_note_stopped_midway_reads_incomplete_and_converges_at_the_next_start(
        tmp_path: Path, registry: Registry, small_slices: None) -> None:
    ws = tmp_path / "ws"
    log = write(ws / "memory" / "2023-05-08.md", conversation(80))
    settings = make_settings(tmp_path, [{"agent": "main", "path": str(ws)}])
    first = Indexer.open(settings, registry=registry)
    try:
        index_once(first)
        name = next(c.name for c in first.state.plan.collections if c.role == "dir")
        before = first.store.file_states(name)[str(log)]
        assert before.complete
        # the last turn rewritten: as many chunks, other content; stopped after two slices
        write(log, conversation(80, "the heliotrope kiln is fixed"))
        beats = [0]
        stop = threading.Event()

        def beat() -> None:
            beats[0] += 1
            if beats[0] > 2:
                stop.set()

        first.sync.process([log], Pace(stop, beat))
        half = first.store.file_states(name)[str(log)]
        assert not half.complete and not first.state.indexed[str(log)].state.complete
        assert first.pipeline.prepare(next(c for c in first.state.plan.collections if c.role == "dir"), log,
                                      first.state.indexed[str(log)].state).__class__.__name__ == "Prepared"
    finally:
        first.close()
    again = Indexer.open(settings, registry=registry)  # a restart over the same store
    try:
        index_once(again)
        state = again.store.file_states(name)[str(log)]
        points = _points_of(again, name, str(log))
        assert state.complete and state.file_hash != before.file_hash
        assert {p.file_hash for p in points} == {state.file_hash} and len(points) == state.points
        assert any("heliotrope kiln" in p.text for p in points)
    finally:
        again.close()


def test_a_model_load_bounds_the_compiled_kernel_caches_unless_the_environment_sets_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's bf16 matmuls compile a kernel set per batch shape and oneDNN and ideep keep 1,024 of them by default:
    a first index of a big log grew the daemon by ~400 MiB for them alone. A model's load bounds both caches (read
    at the first kernel built), and leaves a value the environment gives alone."""
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "64")
    embedder = SentenceTransformerEmbedder({"precision": "fp32", "cache_dir": str(tmp_path)})
    assert embedder.encode(["a first batch"]).shape == (1, embedder.dim)
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(model_loading.KERNEL_CACHE_CAPACITY)
    assert os.environ["LRU_CACHE_CAPACITY"] == "64"


def test_onnx_sessions_plan_no_memory_pattern_per_shape(tmp_path: Path) -> None:
    """Each batch of chunks has a shape of its own; a session that keeps a memory plan and its buffers per shape
    grew 283 MiB over 150 batches, 151 without (docs/performance.md)."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    from indexer.builtin.onnx_runtime import onnx_session

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    session = onnx_session(tmp_path / "m.onnx", 1, spin=True)
    assert session.get_session_options().enable_mem_pattern is False
    assert list(session.run(["y"], {"x": np.ones(3, np.float32)})[0]) == [1.0, 1.0, 1.0]
