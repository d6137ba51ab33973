"""BM25 terms: the one place that turns text into the sparse vector stored as ``"bm25"`` and searched by keyword.

Documents and queries must be tokenised by the same ``Bm25`` (same config), or their term ids do not meet; the
indexer builds one ``Bm25Terms`` and hands it to both the pipeline (documents) and the searcher (queries).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from indexer.config import Bm25 as Bm25Settings

if TYPE_CHECKING:
    from qdrant_edge import Bm25Config

SparseVector = tuple[list[int], list[float]]  # (term ids, weights), the shape ``Query.sparse`` and points carry


def make_config(settings: Bm25Settings | None = None) -> Bm25Config:
    """The ``qdrant_edge.Bm25Config`` for the ``bm25`` settings (``None``: the defaults, the product's own).

    Multilingual tokenizer: words for Latin scripts, dictionary segmentation for CJK (keyword search in
    Chinese/Japanese works, where the Word tokenizer keeps a CJK phrase as one term); Qdrant's IDF modifier
    supplies the corpus statistics at query time. The language default (English stopwords + Snowball stemmer) is
    kept: it scores better on SciFact (docs/performance.md, "Keyword search").
    """
    from qdrant_edge import Bm25Config, DisabledStemmer, TokenizerType

    settings = settings or Bm25Settings()
    tokenizer = TokenizerType.Multilingual if settings.tokenizer == "multilingual" else TokenizerType.Word
    if not settings.stemmer:
        return Bm25Config(tokenizer=tokenizer, avg_len=settings.avg_len, stemmer=DisabledStemmer())
    return Bm25Config(tokenizer=tokenizer, avg_len=settings.avg_len)


class Bm25Terms:
    """Sparse BM25 term vectors of documents and queries, made with the ``bm25`` settings (``None``: defaults)."""

    def __init__(self, settings: Bm25Settings | None = None) -> None:
        from qdrant_edge import Bm25

        self.settings = settings or Bm25Settings()
        self._bm25 = Bm25(make_config(self.settings))

    def document(self, text: str) -> SparseVector | None:
        """The term vector of a chunk's ``text``; ``None`` when it has no terms (blank, or only stopwords)."""
        if not text.strip():
            return None
        terms = self._bm25.embed_document(text)
        return (list(terms.indices), list(terms.values)) if terms.indices else None

    def query(self, text: str) -> SparseVector:
        """The term vector of a query (possibly empty: no term matches)."""
        terms = self._bm25.embed_query(text)
        return list(terms.indices), list(terms.values)
