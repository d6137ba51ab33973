"""The ``openai`` text embedder: an OpenAI-compatible embedding server (Ollama, llama.cpp ``llama-server``, vLLM,
TEI, infinity, OpenAI) instead of the in-process model.

Registered as the ``openai`` entry point of ``qmd_indexer.embedders``; used only when chosen with
``prefer = { text = "openai" }``. Each request is ``POST {base_url}/embeddings`` with ``{"model", "input": [...]}``
(plus ``dimensions``, ``input_type`` when configured); the answer's ``data[i].embedding`` (ordered by ``index``)
are the vectors, L2-normalised here. Config keys (``[plugin.openai]``):

- ``base_url`` (required): as the OpenAI SDK takes it, e.g. ``http://127.0.0.1:11434/v1`` (Ollama).
- ``model`` (required): the model name the server knows.
- ``api_key_env``: the environment variable holding the API key, sent as ``Authorization: Bearer``; or ``api_key``,
  the key itself, accepted only from a config file readable by its owner alone (``indexer.config``). None: no
  header. Any other key is refused (``config_keys``).
- ``dimensions``: asked of models that can shorten their vectors (OpenAI ``text-embedding-3-*``); the vector size
  is always the one of the first answer.
- ``batch_size`` (default 32, TEI's default cap): inputs per request; a 413 or "batch too large" answer halves it
  for the rest of the run. ``max_concurrency`` (default 2): requests in flight at once.
- ``timeout_s`` (default 60): the deadline of one request while indexing, the whole request whatever the server's
  pace (``indexer.builtin.remote``); ``query_timeout_s`` (default 5): the deadline for a search's query, which then
  answers from keyword search instead of waiting. ``max_answer_bytes`` (default 1 MiB + 256 KiB per input): a longer
  answer is refused unread.
- ``query_prefix``/``document_prefix`` (default empty): prepended to queries/chunks, for asymmetric models (e5
  ``"query: "``/``"passage: "``, nomic ``"search_query: "``/``"search_document: "``); or ``query_input_type``/
  ``document_input_type``, sent as the request's ``input_type`` field (servers that take one).
- ``tokenizer``: a ``tokenizer.json`` path (Hugging Face ``tokenizers``) to size chunks by the model's own tokens,
  with ``max_tokens`` (default 510) tokens per chunk; without it, chunks are sized by a conservative budget of
  ``max_chars`` characters (default 1000), one character per "token".
- ``retries`` (default 3): attempts per request while the server is unavailable (exponential backoff from 0.5 s,
  or the server's ``Retry-After`` when it is at most ``max_retry_after_s``, default 30); then ``EmbedUnavailable``
  goes up and the daemon retries the files later, keeping their points.

Errors: ``EmbedUnavailable`` for anything transient or of the server's setup (unreachable, past the deadline, 429,
5xx, 401, 403, 404, an answer that is not JSON embeddings or is too long); ``BadVectors`` for embeddings that cannot
be stored (``indexer.api.check_vectors``: NaN, inf, all zeros, not one per input, another size than the first
answer's), permanent for those inputs (the file is marked failed and keeps its points; a query answers from keyword
search); ``EmbedError`` for an input the server refuses for itself even alone and split to its smallest. An input
refused as too long (413, or a 400/422 saying so) is split in two at a space near the middle, both halves embedded
and their mean taken, never truncated. Identity (``identity``): endpoint host and path, model, vector size,
``dimensions``, prefixes and input types, and the chunk sizing; a change of any rebuilds the collections safely.

The vector size learnt from the first answer is remembered in ``<state_dir>/openai-embedder.json``, so a daemon
restarted while the server is down still opens its collections and answers keyword searches. ``unavailable()``
says why the server could not be reached at its last request (``None`` once one succeeds), for ``/health``; asked
while the last word is older than ``PROBE_EVERY_S``, it sends one probe request in the background, so an idle
daemon notices a server gone down. The request's body and the reading of its answer are
``indexer.builtin.openai_wire``; the deadline and the size cap, ``indexer.builtin.remote``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import structlog

from indexer.api import Chunk, check_vectors, l2_normalise
from indexer.builtin.openai_wire import TooLarge, answer_embeddings, request_body, split_text
from indexer.builtin.remote import DeadlineClient, RemoteError, server_retrying
from indexer.errors import BadVectors, EmbedError, EmbedUnavailable
from indexer.statedir import openai_dims

log = structlog.get_logger("qmd_indexer.embedding")

PROBE_EVERY_S = 60.0  # ``unavailable()`` probes the server in the background when its last word is older


class OpenAIEmbedder:
    """Text chunks to ``(n, dim)`` float32 L2-normalised vectors through an OpenAI-compatible ``/embeddings``
    endpoint (see the module for the config keys, errors and identity)."""

    modality = "text"
    #: the keys ``[plugin.openai]`` may hold (``indexer.plugins`` refuses others, naming them)
    config_keys = frozenset({"base_url", "model", "api_key_env", "api_key", "dimensions", "batch_size",
                             "max_concurrency", "timeout_s", "query_timeout_s", "retries", "max_retry_after_s",
                             "max_answer_bytes", "query_prefix", "document_prefix", "query_input_type",
                             "document_input_type", "tokenizer", "max_chars", "max_tokens", "state_dir"})

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = dict(config or {})
        base_url, model = config.get("base_url"), config.get("model")
        if not base_url or not model:
            raise ValueError("[plugin.openai] needs base_url (e.g. \"http://127.0.0.1:11434/v1\") and model")
        self.base_url, self.model = str(base_url).rstrip("/"), str(model)
        self.url = f"{self.base_url}/embeddings"
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"[plugin.openai] base_url must be an http(s) URL, got {base_url!r}")
        self.endpoint = f"{parts.netloc}{parts.path}"
        self.api_key_env = config.get("api_key_env") or None
        self._api_key = str(config.get("api_key") or "")
        self.dimensions = int(config["dimensions"]) if config.get("dimensions") else None
        self.batch_size = max(1, int(config.get("batch_size", 32)))
        self.max_concurrency = max(1, int(config.get("max_concurrency", 2)))
        self.timeout_s = float(config.get("timeout_s", 60.0))
        self.query_timeout_s = float(config.get("query_timeout_s", 5.0))
        self.retries = max(1, int(config.get("retries", 3)))
        self.max_retry_after_s = float(config.get("max_retry_after_s", 30.0))
        self.max_answer_bytes = int(config["max_answer_bytes"]) if config.get("max_answer_bytes") else None
        self.query_prefix = str(config.get("query_prefix", ""))
        self.document_prefix = str(config.get("document_prefix", ""))
        self.query_input_type = config.get("query_input_type") or None
        self.document_input_type = config.get("document_input_type") or None
        self.tokenizer_path = Path(config["tokenizer"]).expanduser() if config.get("tokenizer") else None
        if self.tokenizer_path is not None and not self.tokenizer_path.is_file():
            raise ValueError(f"[plugin.openai] tokenizer: no tokenizer.json at {self.tokenizer_path}")
        self.max_chars = int(config.get("max_chars", 1000))
        self._max_tokens = int(config.get("max_tokens", 510)) if self.tokenizer_path else self.max_chars
        self.state_dir = Path(config["state_dir"]) if config.get("state_dir") else None
        self.precision = None
        self.query_file = None
        self._tokenizer: Any = None
        self._tokenizer_digest: str | None = None
        self._dim: int | None = None
        self._batch = self.batch_size  # halved for the rest of the run by a 413 / "batch too large"
        self._lock = threading.Lock()
        self._client: DeadlineClient | None = None
        # the server's last word: (monotonic time, why it could not be reached or None); a probe in flight
        self._last: tuple[float, str | None] = (time.monotonic(), None)
        self._probing = threading.Event()
        # counters since start (requests sent, retried while unavailable, batches halved, inputs split)
        self.stats = {"requests": 0, "retries": 0, "halved": 0, "split": 0}

    # -- identity and sizing ----------------------------------------------------------------------------------
    @property
    def model_id(self) -> str:
        """``openai:<model>@<host/path>``: the model and where it is served (payload; ``identity`` says more)."""
        return f"openai:{self.model}@{self.endpoint}"

    @property
    def sizing(self) -> str:
        """How chunks are sized: ``tokenizer=<sha256 of tokenizer.json, 16 hex>/<max_tokens>`` or
        ``chars=<max_chars>``."""
        if self.tokenizer_path is None:
            return f"chars={self.max_chars}"
        if self._tokenizer_digest is None:
            self._tokenizer_digest = hashlib.sha256(self.tokenizer_path.read_bytes()).hexdigest()[:16]
        return f"tokenizer={self._tokenizer_digest}/{self._max_tokens}"

    def _key(self) -> str:
        """Everything the vectors depend on, but their size."""
        parts = [f"openai:{self.endpoint}", f"model={self.model}"]
        if self.dimensions:
            parts.append(f"dimensions={self.dimensions}")
        if self.query_prefix or self.document_prefix:
            parts.append(f"prefixes={json.dumps([self.query_prefix, self.document_prefix])}")
        if self.query_input_type or self.document_input_type:
            parts.append(f"input_type={json.dumps([self.query_input_type, self.document_input_type])}")
        parts.append(self.sizing)
        return "|".join(parts)

    @property
    def identity(self) -> str:
        """``openai:<host/path>|model=<m>|dim=<n>[|dimensions=..][|prefixes=..][|input_type=..]|<sizing>``; asks
        the server for the vector size when not known yet (``dim``)."""
        key = self._key()
        first, rest = key.split("|", 1)
        return f"{first}|dim={self.dim}|{rest}"

    @property
    def dim(self) -> int:
        """The vector size of the first answer (one probe request when nothing was embedded yet); while the server
        is unavailable, the size it last answered (``<state_dir>/openai-embedder.json``): with one remembered, the
        probe is one try at ``query_timeout_s``, so a restart against a hung server does not wait out ``retries``
        tries at ``timeout_s`` before it serves. Raises ``EmbedUnavailable`` when neither is known."""
        if self._dim is None:
            remembered = self._read_dims().get(self._key())
            try:
                if remembered is None:
                    self._post(["dimension probe"], self.document_input_type, self.timeout_s, self.retries)
                else:
                    self._post(["dimension probe"], self.document_input_type, self.query_timeout_s, 1)
            except EmbedUnavailable:
                if remembered is None:
                    raise
                self._dim = int(remembered)
        assert self._dim is not None
        return self._dim

    def _read_dims(self) -> dict[str, int]:
        if self.state_dir is None:
            return {}
        try:
            record: dict[str, int] = json.loads(openai_dims(self.state_dir).read_text())
        except (OSError, ValueError):
            return {}
        return record

    def _remember_dim(self, dim: int) -> None:
        if self.state_dir is None or self._read_dims().get(self._key()) == dim:
            return
        with contextlib.suppress(OSError):
            self.state_dir.mkdir(parents=True, exist_ok=True)
            path = openai_dims(self.state_dir)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({**self._read_dims(), self._key(): dim}, indent=1, sort_keys=True))
            tmp.replace(path)

    @property
    def max_tokens(self) -> int:
        """Tokens one chunk may hold: ``max_tokens`` with a ``tokenizer`` (less the document prefix's tokens),
        else ``max_chars`` (less the prefix's length), one character per token."""
        if self.tokenizer_path is None:
            return max(1, self.max_chars - len(self.document_prefix))
        prefix = len(self.token_offsets(self.document_prefix)) if self.document_prefix else 0
        return max(1, self._max_tokens - prefix)

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """``(start, end)`` character offsets of each token of ``text``: the model's tokens with a ``tokenizer``
        (no special tokens), else one per character (the stand-in the contract allows)."""
        if self.tokenizer_path is None:
            return [(i, i + 1) for i in range(len(text))]
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(self.tokenizer_path))
            self._tokenizer.no_truncation()
            self._tokenizer.no_padding()
        return [tuple(pair) for pair in self._tokenizer.encode(text, add_special_tokens=False).offsets]

    # -- requests ---------------------------------------------------------------------------------------------
    def _http(self) -> DeadlineClient:
        with self._lock:
            if self._client is None:
                self._client = DeadlineClient(max_connections=self.max_concurrency + 2)
            return self._client

    def unavailable(self) -> str | None:
        """Why the server could not be reached at the last request (``EmbedUnavailable``'s message), ``None`` once
        one succeeded (or none was sent). When that word is older than ``PROBE_EVERY_S``, one probe request (one
        input, the query deadline) is sent in a background thread; this call never waits for it."""
        at, reason = self._last
        if time.monotonic() - at > PROBE_EVERY_S and not self._probing.is_set():
            self._probing.set()

            def probe() -> None:
                try:
                    self._post_once(["probe"], self.query_input_type, self.query_timeout_s)
                except (EmbedError, TooLarge):
                    pass
                finally:
                    self._probing.clear()

            threading.Thread(target=probe, name="openai-embed-probe", daemon=True).start()
        return reason

    def close(self) -> None:
        """Close the connections kept open to the server (a later request opens new ones)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env) if self.api_key_env else self._api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _post_once(self, inputs: list[str], input_type: str | None, timeout_s: float) -> np.ndarray:
        """One request: the inputs' checked, L2-normalised vectors; records the server's last word either way."""
        try:
            vectors = self._request(inputs, input_type, timeout_s)
        except EmbedUnavailable as exc:
            self._last = (time.monotonic(), str(exc).splitlines()[0][:300] if str(exc) else "unavailable")
            raise
        except (EmbedError, TooLarge):  # it answered, if not well: reachable
            self._last = (time.monotonic(), None)
            raise
        self._last = (time.monotonic(), None)
        return vectors

    def _request(self, inputs: list[str], input_type: str | None, timeout_s: float) -> np.ndarray:
        body = request_body(self.model, inputs, self.dimensions, input_type)
        self.stats["requests"] += 1
        cap = self.max_answer_bytes or (1 << 20) + len(inputs) * (256 << 10)
        try:
            answer = self._http().post(self.url, body, timeout_s, cap, headers=self._headers())
        except RemoteError as exc:  # past the deadline, an answer too long, cannot connect, connection dropped
            raise EmbedUnavailable(str(exc)) from exc
        embeddings = answer_embeddings(answer, self.url)  # TooLarge, EmbedUnavailable, EmbedError
        vectors = check_vectors(embeddings, len(inputs), self._dim, self.url)  # NaN, inf, zeros, shape: BadVectors
        if self._dim is None:
            self._dim = int(vectors.shape[1])
            self._remember_dim(self._dim)
        return l2_normalise(vectors)

    def _post(self, inputs: list[str], input_type: str | None, timeout_s: float, attempts: int) -> np.ndarray:
        """``_post_once`` retried while the server is unavailable: ``attempts`` in all, waiting 0.5 s, 1 s, 2 s, ...
        (at most 8 s) or the server's ``Retry-After``; one that asks for more than ``max_retry_after_s`` is not
        waited for here (the ``EmbedUnavailable`` carries it up)."""

        def count() -> None:
            self.stats["retries"] += 1

        retrying = server_retrying(EmbedUnavailable, attempts, self.max_retry_after_s, count)
        result: np.ndarray = retrying(self._post_once, inputs, input_type, timeout_s)
        return result

    def _embed_batch(self, texts: list[str], input_type: str | None, timeout_s: float, attempts: int) -> np.ndarray:
        """One request for ``texts``; refused as too big: halved (and the batch size kept halved), or for a single
        input, split in two and the mean of the halves' vectors taken."""
        try:
            return self._post(texts, input_type, timeout_s, attempts)
        except TooLarge as exc:
            if len(texts) > 1:
                half = len(texts) // 2
                with self._lock:
                    if self._batch > half:
                        self._batch = max(1, half)
                        self.stats["halved"] += 1
                        log.warning("embed_batch_halved", url=self.url, batch_size=self._batch, reason=str(exc)[:200])
                return np.concatenate([self._embed_batch(texts[:half], input_type, timeout_s, attempts),
                                       self._embed_batch(texts[half:], input_type, timeout_s, attempts)])
            text = texts[0]
            if len(text) < 2:
                raise EmbedError(f"{self.url} refused a {len(text)}-character input as too long: {exc}") from exc
            self.stats["split"] += 1
            log.info("embed_input_split", url=self.url, chars=len(text), reason=str(exc)[:200])
            parts = self._embed_batch(list(split_text(text)), input_type, timeout_s, attempts)
            return l2_normalise(parts.mean(axis=0, keepdims=True))

    def encode(self, texts: Sequence[str], input_type: str | None = None, timeout_s: float | None = None,
               attempts: int | None = None) -> np.ndarray:
        """``(len(texts), dim)`` float32, L2-normalised, in order: requests of the current batch size, up to
        ``max_concurrency`` at once. Raises ``EmbedUnavailable`` or ``EmbedError`` (see the module)."""
        texts = list(texts)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        tries = self.retries if attempts is None else attempts
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        size = self._batch
        batches = [texts[i : i + size] for i in range(0, len(texts), size)]
        if len(batches) == 1 or self.max_concurrency == 1:
            parts = [self._embed_batch(b, input_type, timeout, tries) for b in batches]
        else:
            with ThreadPoolExecutor(min(self.max_concurrency, len(batches)), thread_name_prefix="openai-embed") as pool:
                parts = list(pool.map(lambda b: self._embed_batch(b, input_type, timeout, tries), batches))
        return np.concatenate(parts)

    # -- contract ---------------------------------------------------------------------------------------------
    def embed(self, chunks: Sequence[Chunk]) -> np.ndarray:
        """``(len(chunks), dim)`` float32, L2-normalised: ``document_prefix`` + each chunk's ``embed_text``."""
        return self.encode([self.document_prefix + chunk.embed_text for chunk in chunks], self.document_input_type)

    def embed_query(self, text: str) -> np.ndarray:
        """``(dim,)`` float32, L2-normalised: ``query_prefix`` + ``text``, one try with the deadline
        ``query_timeout_s`` (a search answers from keyword search rather than wait). Raises ``EmbedUnavailable``
        (also for a bad answer: NaN, inf, zeros, wrong size)."""
        try:
            vector: np.ndarray = self.encode([self.query_prefix + text], self.query_input_type, self.query_timeout_s,
                                             attempts=1)[0]
        except BadVectors as exc:  # a bad answer to a query: the search answers from keyword search, saying why
            raise EmbedUnavailable(f"bad answer: {exc}") from exc
        return vector
