"""The wire format of the ``openai`` embedder (``indexer.builtin.openai_embed``): the ``POST /embeddings`` request's
body (``request_body``), its answer read into embeddings or the error it means (``answer_embeddings``), and the cut of
an input refused as too long (``split_text``).
"""

from __future__ import annotations

import re
from typing import Any

from indexer.builtin.remote import Answer, retry_after
from indexer.errors import EmbedError, EmbedUnavailable

# what servers say when an input or a request is too long or too big (llama.cpp, vLLM, TEI, OpenAI, Ollama)
_TOO_LONG = re.compile(r"too (long|large|many)|maximum (context|input|sequence|batch)|context length|exceed|"
                       r"batch size|must have less than|payload", re.IGNORECASE)


class TooLarge(Exception):
    """The server refused a request as too big (413, or a 400/422 saying so): fewer inputs, or shorter ones."""


def split_text(text: str) -> tuple[str, str]:
    """``text`` in two halves, cut at the whitespace nearest its middle (at the middle when it has none)."""
    middle = len(text) // 2
    spaces = [m.start() for m in re.finditer(r"\s", text)]
    cut = min(spaces, key=lambda i: abs(i - middle)) if spaces else middle
    if cut <= 0 or cut >= len(text):
        cut = middle
    return text[:cut], text[cut:]


def request_body(model: str, inputs: list[str], dimensions: int | None, input_type: str | None) -> dict[str, Any]:
    """``{"model", "input", "encoding_format": "float"}``, plus ``dimensions`` and ``input_type`` when given."""
    body: dict[str, Any] = {"model": model, "input": inputs, "encoding_format": "float"}
    if dimensions:
        body["dimensions"] = dimensions
    if input_type:
        body["input_type"] = input_type
    return body


def answer_embeddings(answer: Answer, url: str) -> list[Any]:
    """The answer's ``data[i].embedding``, ordered by ``index`` (unchecked: ``indexer.api.check_vectors`` checks
    them). Raises ``TooLarge`` (413, or a 400/422 saying too long), ``EmbedUnavailable`` (429, 5xx, 401, 403, 404,
    408, with the server's ``Retry-After``; a 200 without embeddings) or ``EmbedError`` (any other refusal)."""
    status, text = answer.status, answer.text[:300]
    if status == 413 or (status in (400, 422) and _TOO_LONG.search(text)):
        raise TooLarge(f"{status}: {text}")
    if status == 429 or status >= 500 or status in (401, 403, 404, 408):
        raise EmbedUnavailable(f"{url} answered {status}: {text}",
                               retry_after_s=retry_after(answer.headers.get("retry-after")))
    if status != 200:
        raise EmbedError(f"{url} refused the input ({status}): {text}")
    try:
        data = sorted(answer.json()["data"], key=lambda item: item["index"])
        return [item["embedding"] for item in data]
    except (ValueError, KeyError, TypeError) as exc:
        raise EmbedUnavailable(f"{url} answered 200 without embeddings: {text}") from exc
