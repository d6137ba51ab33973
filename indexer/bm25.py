"""BM25 terms: the one place that turns text into the sparse vector stored as ``"bm25"`` and searched by keyword.

Documents and queries must be tokenised by the same ``Bm25`` (same config), or their term ids do not meet; the
indexer builds one ``Bm25Terms`` and hands it to both the pipeline (documents) and the searcher (queries).

Numbers are terms too: Qdrant's multilingual tokenizer drops a token made only of digits, so "ticket 4471" searched
as "ticket" alone, and ``ZX-4471`` and ``ZX-9999`` (or two dates) had the same terms. A standalone run of two or more
digits (``NUMBER``: not part of a word such as ``A4471``, which the tokenizer keeps) adds the term Qdrant's word
tokenizer gives it, weighted as that tokenizer weighs it in the same text (BM25's term-frequency saturation with the
text's length), and the IDF modifier weighs it by how many chunks hold it, as every term. Single digits stay out:
with them SciFact test hybrid nDCG@10 went 0.7313 -> 0.7292, with two or more 0.7304, with three or more 0.7315,
but three would lose the month and day of a date (docs/performance.md, "Keyword search").
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

from indexer.config import Bm25 as Bm25Settings

if TYPE_CHECKING:
    from qdrant_edge import Bm25Config

SparseVector = tuple[list[int], list[float]]  # (term ids, weights), the shape ``Query.sparse`` and points carry

# bump when the terms a text gets change: part of every point's ``file_hash`` (``pipeline.index_hash``), so each file
# is re-indexed once with the new terms (its vectors come from the embedding cache). 2: numbers are terms.
TERMS_VERSION = 2
# a run of two or more digits that is a token of its own: not inside a word (letters or digits on either side); "_"
# separates, as in Qdrant's word tokenizer ("id_77" -> "id", "77")
NUMBER = re.compile(r"(?<![^\W_])\d{2,}(?![^\W_])")


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
        from qdrant_edge import Bm25, Bm25Config, DisabledStemmer, TokenizerType

        self.settings = settings or Bm25Settings()
        self._bm25 = Bm25(make_config(self.settings))
        # numbers' terms (see the module docstring): the word tokenizer keeps digits; the multilingual one does not
        self._numbers = None if self.settings.tokenizer != "multilingual" else Bm25(
            Bm25Config(tokenizer=TokenizerType.Word, avg_len=self.settings.avg_len, stemmer=DisabledStemmer()))

    def document(self, text: str) -> SparseVector | None:
        """The term vector of a chunk's ``text``; ``None`` when it has no terms (blank, or only stopwords)."""
        if not text.strip():
            return None
        terms = self._bm25.embed_document(text)
        indices, values = list(terms.indices), list(terms.values)
        numbers = self._number_ids(text)
        if numbers:
            assert self._numbers is not None
            words = self._numbers.embed_document(text)
            weights = dict(zip(words.indices, words.values))
            known = set(indices)
            for term in sorted(numbers - known):
                if term in weights:
                    indices.append(term)
                    values.append(weights[term])
        return (indices, values) if indices else None

    def query(self, text: str) -> SparseVector:
        """The term vector of a query (possibly empty: no term matches)."""
        terms = self._bm25.embed_query(text)
        indices, values = list(terms.indices), list(terms.values)
        for term in sorted(self._number_ids(text) - set(indices)):
            indices.append(term)
            values.append(1.0)  # as Qdrant weighs each query term
        return indices, values

    def number_terms(self, text: str) -> set[int]:
        """Term ids of the standalone numbers in ``text`` (two digits or more; empty without the multilingual
        tokenizer): what a query's keyword list may match with no word of it (``indexer.ranking.keyword_votes``)."""
        return self._number_ids(text)

    def _number_ids(self, text: str) -> set[int]:
        """Term ids of the standalone numbers in ``text`` (empty without the multilingual tokenizer)."""
        if self._numbers is None:
            return set()
        return {term for number in set(NUMBER.findall(text)) if (term := self._number_id(number)) is not None}

    @functools.lru_cache(maxsize=1 << 16)  # noqa: B019 - one Bm25Terms per indexer, kept for its life
    def _number_id(self, number: str) -> int | None:
        assert self._numbers is not None
        ids = list(self._numbers.embed_query(number).indices)
        return int(ids[0]) if ids else None
