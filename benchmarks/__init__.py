"""Benchmarks and the retrieval evaluation of qmd-indexer: run from the repository root as
``python -m benchmarks.bench`` / ``python -m benchmarks.eval`` (``make bench`` / ``make eval``). Not shipped in
the package; they use only its public API."""
