"""``FakeModelServer``: a FAKE OpenAI-compatible embedding and Cohere-shaped rerank server on loopback, for the
misbehaviours no real server can be told to show. It is a fake, named so: the real servers' tests run against
infinity-emb (``tests/infinity.py``, ``tests/server_process.py``).

``POST /embeddings`` answers ``{"data": [{"index", "embedding"}]}``, each vector a deterministic function of the text
(a hashed bag of words, ``dim`` numbers, so similar texts are near); ``POST /rerank`` answers
``{"results": [{"index", "relevance_score"}]}`` (the words a text shares with the query). ``mode`` (changeable at any
time) decides how it misbehaves:

- ``ok``: well-formed answers;
- ``nan``, ``inf``, ``zeros``: one vector (rerank: one score) NaN, infinite, or all zeros;
- ``short``: one vector (rerank: one result) fewer than asked; ``wrong_size``: vectors of ``dim + 1`` numbers
  (rerank: an index out of range);
- ``trickle``: a well-formed answer sent one byte every ``trickle_s`` seconds (headers included);
- ``huge``: a well-formed answer padded to ``huge_bytes`` bytes;
- ``bad_json``: a 200 whose body is not JSON;
- ``down``: the port refuses connections (the listening socket is closed; any other mode opens it again).

``poison``: when set, the faults of ``nan``/``inf``/``zeros`` hit only inputs containing that word (the rest are
answered well), so one file of a batch can get a bad vector. ``requests`` counts the requests answered.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

MODES = ("ok", "nan", "inf", "zeros", "short", "wrong_size", "trickle", "huge", "bad_json", "down")


def fake_vector(text: str, dim: int) -> list[float]:
    """A deterministic unit vector of ``dim`` numbers: each word adds 1 at the slot its hash picks."""
    vector = np.full(dim, 1e-3, dtype=np.float64)
    for word in text.lower().split():
        vector[int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "big") % dim] += 1.0
    return [float(x) for x in vector / np.linalg.norm(vector)]


class FakeModelServer:
    """See the module. Use as a context manager; ``url`` is ``http://127.0.0.1:<port>`` (the embedder's
    ``base_url``, and the reranker's)."""

    def __init__(self, dim: int = 16, mode: str = "ok", poison: str | None = None, trickle_s: float = 0.05,
                 huge_bytes: int = 50 << 20) -> None:
        self.dim, self.poison, self.trickle_s, self.huge_bytes = dim, poison, trickle_s, huge_bytes
        self.requests = 0
        self._mode = "ok"
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port = 0
        self._connections: set[socket.socket] = set()  # open keep-alive connections, cut when going down
        self._start()
        self.mode = mode

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "down" and self._server is not None:
            self._stop()
        elif mode != "down" and self._server is None:
            self._start()
        self._mode = mode

    def _start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                fake._connections.add(self.connection)

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests += 1
                answer = fake.answer(self.path, body)
                try:
                    self._send(answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its deadline, or the answer's size cap)

            def _send(self, answer: bytes) -> None:
                mode = fake.mode
                if mode == "huge":
                    pad = fake.huge_bytes - len(answer)
                    answer = answer[:-1] + b', "padding": "' + b"x" * max(0, pad) + b'"}'
                head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(answer)}\r\n"
                        f"\r\n").encode()
                if mode == "trickle":
                    for byte in head + answer:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(fake.trickle_s)
                    return
                self.wfile.write(head)
                for start in range(0, len(answer), 1 << 20):
                    self.wfile.write(answer[start : start + (1 << 20)])
                self.wfile.flush()

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        server.daemon_threads = True
        server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="fake-model-server", daemon=True)
        self._thread.start()

    def _stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join(10)
        for connection in list(self._connections):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self._connections.clear()
        self._server = self._thread = None

    def answer(self, path: str, body: dict[str, Any]) -> bytes:
        """The body of the answer to ``body`` at ``path`` in the current mode (``trickle``/``huge`` are applied
        when sending)."""
        mode = self.mode
        if mode == "bad_json":
            return b'{"data": [{"index": 0, "embedding": [0.1, 0.2'
        if path.endswith("/rerank"):
            return json.dumps({"results": self._scores(body["query"], body["documents"], mode)}).encode()
        inputs = body["input"]
        data = [{"object": "embedding", "index": i, "embedding": self._vector(text, mode)}
                for i, text in enumerate(inputs)]
        if mode == "short":
            data = data[:-1]
        return json.dumps({"object": "list", "model": body.get("model"), "data": data}).encode()

    def _hit(self, text: str) -> bool:
        return self.poison is None or self.poison in text

    def _vector(self, text: str, mode: str) -> list[float]:
        vector = fake_vector(text, self.dim + (mode == "wrong_size"))
        if mode in ("nan", "inf", "zeros") and self._hit(text):
            value = {"nan": math.nan, "inf": math.inf, "zeros": 0.0}[mode]
            vector = [value] * len(vector) if mode == "zeros" else [value, *vector[1:]]
        return vector

    def _scores(self, query: str, texts: list[str], mode: str) -> list[dict[str, Any]]:
        words = set(query.lower().split())
        results: list[dict[str, Any]] = [{"index": i, "relevance_score": len(words & set(t.lower().split()))
                                          / (1 + len(words))} for i, t in enumerate(texts)]
        if mode in ("nan", "inf") and results:
            results[0]["relevance_score"] = math.nan if mode == "nan" else math.inf
        elif mode == "short":
            results = results[:-1]
        elif mode == "wrong_size" and results:
            results[0]["index"] = len(texts)
        return sorted(results, key=lambda r: -r["relevance_score"] if math.isfinite(r["relevance_score"]) else 0)

    def __enter__(self) -> FakeModelServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()
