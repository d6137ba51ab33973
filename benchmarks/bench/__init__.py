"""Benchmarks of indexing and search with the real daemon, model and Qdrant Edge (``make bench``).

A benchmark, not a test: it prints numbers and ratios against baselines measured in the same run (the machines are
shared and noisy, so absolute numbers drift; ratios much less). Input: the Obsidian vault at
``../shared/data/vault`` (relative to the repository; ``--vault DIR`` to override), copied as the ``memory/``
folder of a fresh workspace under ``.bench/``. A missing vault is reported on stderr and the exit status is 2.

Measured, in order:

1. **First index** (in this process, ``worker.index_once`` on an empty state and an empty embedding cache):
   chunks/s, and its ratio to the raw baseline: ``SentenceTransformer.encode`` (the same model object, same
   precision, same batch size) on exactly the texts the index embeds (each distinct chunk's ``embed_text``: its
   context line and text), in one call, timed before and after the index (the mean of the two is the baseline).
2. **No-op rescan**: ``index_once`` again in the same process, and once more after a restart (a new ``Indexer`` on
   the same state): seconds and embeddings (expected 0).
2b. **No-op rescan of 10,000 files** (Edge, ``bench_noop_many``; ``--skip-noop-many``): 10,000 one-sentence notes
   (real SciFact sentences under ``--scifact``), indexed once (the embedding cache of the first run is reused by
   later ones, kept under ``.bench/noop-many``), then step 2's two rescans; aim <= 2 s each, 0 embeddings.
2c. **Embedding precision** (``benchmarks.embed_precision.run``; ``--skip-precision``): chunks/s of int8 (ONNX
   Runtime) and bf16 (where the CPU has it) against torch fp32 in the same run, and each one's SciFact test
   nDCG@10 over the whole corpus (``--precision-docs N``: the first N abstracts only, a quicker run whose nDCG@10
   is then not SciFact's and is marked so); aim >= 2x and a loss <= 0.005.
3. **Save-to-searchable** (``qmd-indexer run`` as a subprocess on a free port, its own fresh state, so it does a
   full first index too): 20 edits, each appending a line with a unique token to a note; the time from the write
   to the first ``POST /search`` (keyword mode, polled every 20 ms) that returns that note. Includes the settle
   time (a file closed after writing settles at once: ``indexer.watcher.settle_for``).
4. **Search latency through the API**: 100 distinct queries (the vault's headings), hybrid mode, k=6.
5. **MCP stdio start to first answer**: ``qmd-indexer mcp`` spawned by the MCP SDK's stdio client against the
   daemon of step 3, timed from the spawn to the first answered ``memory_search`` (handshake included), 5 times;
   baseline in the same run: ``qmd-indexer search QUERY --json`` from spawn to exit (the lightest client process).
   Both run as ``python -m indexer.cli`` from this checkout.
6. **Peak RSS** of the daemon (``VmHWM`` from ``/proc/<pid>/status``; psutil's RSS sampled as a fallback).
7. **Hybrid search at 100,000 chunks** through the API (see ``build_big``: real SciFact sentences for text and BM25,
   dense vectors made from the real embeddings of step 1 with small perturbations). On Edge: first by exact scan
   (a daemon with ``edge_hnsw_min_points = 0``), then on a daemon with the default, which builds the HNSW index in a
   child process on a copy of the shard and swaps it in (``EdgeStore.build_index``): latency while it builds, the
   build's seconds, and latency after the swap. Each with the in-process split of a query's time (query embedding,
   each prefetch, fusion, the payloads of the k kept hits, snippets).

Backends (``--backend``, default ``both``): steps 1, 2 and 7 run on Qdrant Edge and on a real single-node Qdrant
server (the pinned binary of ``tests/qdrant/install.sh``, ``make qdrant``; started by ``tests/qdrant/nodes.py`` on free
loopback ports with its storage under ``.bench/qdrant-node``; the daemon talks to it over REST, the default). On the
server, step 7 waits until the server's own optimizer has built its HNSW index (the time is reported) and measures
then. Steps 3-6 run on Edge only. The table ends with the server's figures next to Edge's and their ratios.

Results are printed as a table and written to ``.bench/results-<timestamp>.json``.

Modules: ``common`` (paths, the run's sizes, helpers every step uses), ``index`` (steps 1, 2 and 2b), ``daemon``
(steps 3-6), ``big`` (step 7), ``table`` (the printed table), ``__main__`` (the command line). Step 2c is
``benchmarks.embed_precision``; daemons are started by ``benchmarks.harness.Daemon``.
"""
