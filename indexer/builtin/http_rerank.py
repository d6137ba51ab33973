"""The ``http`` reranker: a rerank server the user already runs, asked over HTTP (the built-in plugin ``http`` of the
``qmd_indexer.rerankers`` entry-point group; ``reranker = "http"`` with a ``[plugin.http]`` table).

Two wire shapes, chosen by ``api``:

- ``"cohere"`` (the default): ``POST {base_url}/rerank`` with ``{"model", "query", "documents": [...], "top_n"}``,
  answered by ``{"results": [{"index", "relevance_score"}, ...]}`` (any order). Cohere and Jina (``base_url``
  ``https://api.cohere.com/v1``, ``https://api.jina.ai/v1``), llama.cpp ``llama-server --rerank`` and vLLM
  (``http://host:port/v1``), infinity (``http://host:port``, its routes have no prefix by default).
- ``"tei"``: Hugging Face text-embeddings-inference, ``POST {base_url}/rerank`` with ``{"query", "texts": [...]}``,
  answered by ``[{"index", "score"}, ...]``.

The API key is read from the environment variable ``api_key_env`` names, or ``api_key`` (accepted only from a config
file readable by its owner alone: ``indexer.config``), and sent as ``Authorization: Bearer <key>``.

Each call has one deadline for the whole request, whatever the server's pace (``indexer.builtin.remote``): ``timeout_s``
seconds, or sooner when the search hands it less of its ``rerank_budget_s``; its answer is read up to
``max_answer_bytes`` (default 1 MiB plus twice the request's size, as some servers echo the texts back). Past the
deadline it raises ``TimeoutError``; any other failure (connection refused, an HTTP error status, an answer too long
or of the wrong shape: indices out of range, scores that are not finite numbers) raises ``RerankError``, and
``indexer.rerank`` then keeps the fused order (it fails open).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from indexer.builtin.remote import DeadlineClient, RemoteError

__all__ = ["APIS", "HttpReranker", "RerankError"]

#: the wire shapes ``api`` may name
APIS = ("cohere", "tei")
#: the config keys ``[plugin.http]`` may hold (``state_dir`` is added by the daemon)
KEYS = frozenset({"base_url", "model", "api", "api_key_env", "api_key", "timeout_s", "max_answer_bytes",
                  "relevance_floor", "state_dir"})


def rerank_floor(config: dict[str, Any], table: str) -> float | None:
    """A reranker's ``relevance_floor`` setting (default 0.5, a probability's midpoint; ``"off"``: ``None``).
    Raises ``ValueError`` naming ``table`` for another value."""
    value = config.get("relevance_floor", 0.5)
    if value == "off":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{table} relevance_floor must be a number or \"off\", got {value!r}")
    return float(value)


class RerankError(RuntimeError):
    """The rerank server could not be reached, answered an HTTP error status, or answered something that is not
    one score per text."""


class HttpReranker:
    """The ``http`` reranker plugin. Config (``[plugin.http]``):

    - ``base_url`` (required): where the server's ``/rerank`` route lives, e.g. ``http://127.0.0.1:8080/v1``;
    - ``model``: the model name sent in a Cohere-shaped request (default ``""``; TEI serves one model and takes none);
    - ``api``: ``"cohere"`` (default) or ``"tei"``, the wire shape (module docstring);
    - ``api_key_env``: the name of an environment variable holding the API key (default: no key is sent);
    - ``timeout_s``: the longest one call may take, seconds (default 10; a search's budget may cut it shorter).
    - ``max_answer_bytes``: the longest answer read (default 1 MiB plus twice the request's size).
    - ``relevance_floor``: the score from which a hit answers the query (default 0.5: Cohere, Jina, infinity and
      TEI answer a probability; set 0 for a server that answers raw logits, as llama.cpp does; ``"off"``: the
      scores order the hits only and the embedding's evidence judges relevance).

    Raises ``ValueError`` for a missing ``base_url``, an unknown ``api`` or key, or an ``api_key_env`` naming an
    unset variable. Nothing is sent until the first ``score``."""

    #: the keys ``[plugin.http]`` may hold (``indexer.plugins`` refuses others, naming them)
    config_keys = KEYS

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = dict(config or {})
        unknown = sorted(set(config) - KEYS)
        if unknown:
            raise ValueError(f"[plugin.http]: unknown setting {unknown[0]!r} (known: {', '.join(sorted(KEYS))})")
        base_url = str(config.get("base_url") or "").rstrip("/")
        if not base_url or urlsplit(base_url).scheme not in ("http", "https"):
            raise ValueError("the http reranker needs `base_url` (http:// or https://, e.g. "
                             "\"http://127.0.0.1:8080/v1\"): set it in [plugin.http]")
        self.api = str(config.get("api", "cohere"))
        if self.api not in APIS:
            raise ValueError(f"[plugin.http] api must be one of {', '.join(APIS)}, got {self.api!r}")
        self.model = str(config.get("model", ""))
        self.relevance_floor = rerank_floor(config, "[plugin.http]")
        self.timeout_s = float(config.get("timeout_s", 10.0))
        self.max_answer_bytes = int(config["max_answer_bytes"]) if config.get("max_answer_bytes") else None
        if not self.timeout_s > 0:
            raise ValueError(f"[plugin.http] timeout_s must be > 0, got {self.timeout_s!r}")
        headers = {}
        key_env = config.get("api_key_env")
        if key_env:
            key = os.environ.get(str(key_env))
            if not key:
                raise ValueError(f"[plugin.http] api_key_env names {key_env!r}, which is not set in the environment")
            headers["Authorization"] = f"Bearer {key}"
        elif config.get("api_key"):
            headers["Authorization"] = f"Bearer {config['api_key']}"
        self.url = f"{base_url}/rerank"
        #: what ``status`` shows: the model (when named) and the route asked
        self.model_id = f"{self.model}@{self.url}" if self.model else self.url
        self._client = DeadlineClient(headers=headers)

    def request(self, query: str, texts: Sequence[str]) -> dict[str, Any]:
        """The JSON body of one rerank request for ``query`` and ``texts`` in this plugin's wire shape."""
        if self.api == "tei":
            return {"query": query, "texts": list(texts)}
        body: dict[str, Any] = {"query": query, "documents": list(texts), "top_n": len(texts)}
        if self.model:
            body["model"] = self.model
        return body

    def scores(self, answer: Any, count: int) -> list[float]:
        """One score per text, in the texts' order, from the server's JSON ``answer`` to a request of ``count``
        texts; raises ``RerankError`` unless every index in ``range(count)`` got exactly one finite score."""
        items = answer if self.api == "tei" else (answer.get("results") if isinstance(answer, dict) else None)
        field = "score" if self.api == "tei" else "relevance_score"
        if not isinstance(items, list):
            raise RerankError(f"{self.url} answered {str(answer)[:200]!r}, not a list of results")
        out: list[float | None] = [None] * count
        for item in items:
            index = item.get("index") if isinstance(item, dict) else None
            value = item.get(field) if isinstance(item, dict) else None
            if not isinstance(index, int) or not 0 <= index < count or out[index] is not None:
                raise RerankError(f"{self.url} answered a result with index {index!r} for {count} texts")
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise RerankError(f"{self.url} answered {field}={value!r} for text {index}")
            out[index] = float(value)
        missing = [i for i, s in enumerate(out) if s is None]
        if missing:
            raise RerankError(f"{self.url} answered no score for text {missing[0]} of {count}")
        return [float(s) for s in out if s is not None]

    def score(self, query: str, texts: Sequence[str], timeout_s: float | None = None) -> list[float]:
        """One relevance score per text, in order (the server's: higher is better). ``timeout_s``: the seconds the
        search can still wait (``None``: this plugin's ``timeout_s``; the smaller of the two applies to connecting,
        sending and the whole answer). Raises ``TimeoutError`` past it and ``RerankError`` for any other failure."""
        if not texts:
            return []
        limit = self.timeout_s if timeout_s is None else max(0.001, min(self.timeout_s, timeout_s))
        body = self.request(query, texts)
        cap = self.max_answer_bytes or (1 << 20) + 2 * len(json.dumps(body))
        try:
            response = self._client.post(self.url, body, limit, cap)
        except TimeoutError as exc:
            raise TimeoutError(f"{self.url} did not answer whole within {limit:.3g} s") from exc
        except RemoteError as exc:  # an answer too long, cannot connect, connection dropped
            raise RerankError(str(exc)) from exc
        if response.status >= 400:
            raise RerankError(f"{self.url} answered HTTP {response.status}: {response.text[:200]}")
        try:
            answer = response.json()
        except ValueError as exc:
            raise RerankError(f"{self.url} answered something that is not JSON: {response.text[:200]!r}") from exc
        return self.scores(answer, len(texts))

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()
