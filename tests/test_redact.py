"""Secrets never enter the index: a key pasted into a note is replaced by ``[redacted: kind]`` before it is embedded,
cached, keyword-indexed, stored in a payload, shown in a snippet or ``get``, or logged (``indexer.redact``, applied
once in ``Pipeline.prepare``). The daemon runs its real pipeline on real files over real Qdrant Edge."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import Running, make_settings, write
from structlog.testing import capture_logs

from indexer.api import Chunk
from indexer.cache import cache_key
from indexer.config import load_settings
from indexer.errors import ConfigError
from indexer.memory import LocalMemory
from indexer.pipeline import Pipeline, Prepared
from indexer.plugins import Registry
from indexer.redact import Redactor
from indexer.schema import BootRequest, GetRequest, RecallRequest, SearchRequest

# one example of each kind (shapes from the sources in indexer.redact's table; none is a real credential)
SECRETS = {
    "anthropic_key": "sk-ant-api03-Qm9vYmFyQmF6UXV4Q29yZ2VHcmF1bHQ0Mg",
    "openai_key": "sk-proj-7fJq2LxW9aBcDeFgHiJkLmNoPqRsTuVw",
    "github_token": "ghp_Zx8Yw7Vu6Ts5Rq4Po3Nm2Lk1Jh0GfEdCbA98",
    "aws_access_key": "AKIAZ4QXW7PLMNB3KJ5T",
    "slack_token": "xoxb-2718281828-3141592653-QwErTyUiOp",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJkYW5hIn0.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg",
}
PEM_BODY = ["MIIEowIBAAKCAQEAvWqZ8RstUvWxYz0123456789abcdefghijklmnopqrstuv",
            "wxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/abcdefghijklmnopqrs=="]
NOTE = "\n".join([
    "# Deploy credentials",
    "",
    "The heliotrope deploy uses these; rotate them after the launch.",
    *(f"- {kind}: {value}" for kind, value in SECRETS.items()),
    "- database: password=Tr0ub4dor-heliotrope",
    "-----BEGIN RSA PRIVATE KEY-----",
    *PEM_BODY,
    "-----END RSA PRIVATE KEY-----",
    "After the key: the heliotrope launch is on Thursday.",
    "",
])
LEAKS = [*SECRETS.values(), "Tr0ub4dor-heliotrope", *PEM_BODY, "MIIEowIBAAKCAQEA"]


def _leaks(text: str) -> list[str]:
    return [secret for secret in LEAKS if secret in text]


def test_a_secret_in_a_note_is_absent_from_every_answer_payload_cache_file_and_log_line(
        tmp_path: Path, registry: Registry, make_indexer: Any) -> None:
    ws = tmp_path / "ws"
    note = write(ws / "memory" / "deploy.md", NOTE)
    write(ws / "MEMORY.md", "# Memory\n\nThe heliotrope launch keys are in memory/deploy.md.\n")
    with capture_logs() as logs:
        daemon = make_indexer([{"agent": "main", "path": str(ws)}], log_level="debug")
        with Running(daemon):
            memory = LocalMemory(daemon.view)
            answers: list[Any] = [memory.search(SearchRequest(query=q, mode=mode, k=20))
                                  for q in ["heliotrope deploy credentials", *LEAKS, "private key password token"]
                                  for mode in ("hybrid", "keyword", "dense")]
            hits = [hit for answer in answers for hit in answer["hits"]]
            assert any(hit["path"] == "memory/deploy.md" for hit in hits)  # the note itself is indexed
            answers.append(memory.recall(RecallRequest(query="*")))
            answers.append(memory.recall(RecallRequest(query="heliotrope keys")))
            answers.append(memory.boot(BootRequest()))
            answers.append(memory.boot(BootRequest(query="heliotrope deploy keys")))
            page = memory.get(GetRequest(path="memory/deploy.md"))
            inside = memory.get(GetRequest(path="memory/deploy.md", from_line=NOTE.split("\n").index(PEM_BODY[0]) + 1))
            answers += [page, inside]
            payloads = [p for c in daemon.state.plan.collections for p in daemon.store.scroll(c.name)]
            stored = [json.dumps(dataclasses.asdict(p), default=str) for p in payloads]
    assert not _leaks(json.dumps(answers, default=str))
    assert not _leaks("\n".join(stored)) and "[redacted: private_key]" in "\n".join(stored)
    assert not [event for event in logs if _leaks(json.dumps(event, default=str))]
    # get: the same lines, numbered as in the file (the key block keeps its lines), each secret marked by kind
    lines = page["text"].split("\n")
    original = NOTE.split("\n")[:-1]
    assert page["to"] == len(original) == len(lines) and lines[-1] == original[-1]
    assert [f"- {kind}: [redacted: {kind}]" for kind in SECRETS] == lines[3:3 + len(SECRETS)]
    assert "- database: password=[redacted: password]" in lines
    block = original.index("-----BEGIN RSA PRIVATE KEY-----")
    assert lines[block:block + 4] == ["[redacted: private_key]", "", "", ""]
    assert inside["from"] == block + 2 and inside["text"].split("\n")[:4] == ["", "", "", original[block + 4]]
    # nothing under the state dir (Edge's segments, the embedding cache) holds a secret's bytes
    for path in (tmp_path / "state").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not [s for s in LEAKS if s.encode() in data], path
    # the embedding cache holds the redacted chunks' vectors and never those of the text as written
    raw = Pipeline(registry, daemon.pipeline.cache, 10 << 20, daemon.terms,
                   make_settings(tmp_path, [{"agent": "main", "path": str(ws)}], redact_secrets=False))
    collection = next(c for c in daemon.state.plan.collections if c.role == "dir")
    as_written = raw.prepare(collection, note, None)
    redacted = daemon.pipeline.prepare(collection, note, None)
    assert isinstance(as_written, Prepared) and isinstance(redacted, Prepared)
    model = str(registry.text_embedder.identity)  # type: ignore[union-attr]
    keys = {c.embed_text: cache_key(model, c.embed_text.encode()) for c in as_written.chunks + redacted.chunks}
    cached = daemon.pipeline.cache.get_many(list(keys.values()), 384)
    leaked = [text for text, key in keys.items() if key in cached and _leaks(text)]
    assert not leaked and any(keys[c.embed_text] in cached for c in redacted.chunks)


@pytest.mark.parametrize("kind", sorted(SECRETS))
def test_each_kind_is_replaced_by_its_mark(kind: str) -> None:
    text = f"pasted {SECRETS[kind]}, then more\nsecond line"
    assert Redactor().redact(text) == f"pasted [redacted: {kind}], then more\nsecond line"


@pytest.mark.parametrize(("text", "expected"), [
    ("password=hunter2", "password=[redacted: password]"),
    ("export GITHUB_TOKEN=abc123def", "export GITHUB_TOKEN=[redacted: token]"),
    ('{"client_secret": "s3cr3t-value"}', '{"client_secret": "[redacted: secret]"}'),
    ("api_key: 9f8e7d6c5b4a", "api_key: [redacted: api_key]"),
    ("db_passwd = 'correct horse'", "db_passwd = '[redacted: password]'"),
    ("Authorization: Bearer abcdefghij0123456789", "Authorization: Bearer [redacted: bearer_token]"),
])
def test_assignments_lose_their_values_and_keep_their_names(text: str, expected: str) -> None:
    assert Redactor().redact(text) == expected


@pytest.mark.parametrize("prose", [
    "The token: it expired yesterday, ask Dana for a new one.",
    "Reset your password: see the vault entry named Deploy.",
    "We talked about password managers and secret santa gifts.",
    "A token bucket limits the rate; the secret is patience.",
    "sk-learn is not a key, and neither is ghp_short.",
    "The commit 3f9a1c2e7b4d5a6f8e9d0c1b2a3f4e5d6c7b8a9f fixed it.",
    "ASIA trip in 2025: AKIA is not a word.",
    "-----BEGIN PUBLIC KEY----- is fine to share.",
])
def test_prose_with_secret_words_is_kept(prose: str) -> None:
    assert Redactor().redact(prose) == prose


def test_a_key_block_keeps_its_lines_whole_or_cut() -> None:
    block = ["-----BEGIN OPENSSH PRIVATE KEY-----", *PEM_BODY, "-----END OPENSSH PRIVATE KEY-----"]
    text = "\n".join(["before", *block, "after"])
    assert Redactor().redact(text) == "\n".join(["before", "[redacted: private_key]", "", "", "", "after"])
    # cut short (a paste that lost its end): its base64 lines go, the prose after them stays
    cut = "\n".join(["before", *block[:2], "and then we talked about lunch"])
    assert Redactor().redact(cut) == "\n".join(
        ["before", "[redacted: private_key]", "", "and then we talked about lunch"])
    # one line with \n escapes, as in a JSON file
    escaped = '{"key": "' + "\\n".join(block) + '\\n", "user": "dana"}'
    assert Redactor().redact(escaped) == '{"key": "[redacted: private_key]\\n", "user": "dana"}'


def test_a_key_block_cut_by_chunk_boundaries_is_redacted_in_every_chunk() -> None:
    lines = ["# Keys", "-----BEGIN PRIVATE KEY-----", *PEM_BODY, "-----END PRIVATE KEY-----", "done"]
    first = Chunk("\n".join(lines[:3]), 1, 3, context="Keys")  # ends inside the block
    second = Chunk("\n".join(lines[3:]), 4, 6, context="Keys")  # begins inside it
    out = Redactor().chunks([first, second])
    assert [c.text for c in out] == ["# Keys\n[redacted: private_key]\n", "\n\ndone"]
    assert not _leaks(" ".join(c.text for c in out))


def test_context_and_meta_are_redacted_and_media_bytes_left_alone() -> None:
    key = SECRETS["github_token"]
    chunk = Chunk(f"ocr text {key}", kind="image", context=f"title {key}", meta={"caption": key, "width": 3})
    picture = Chunk("photo.png", kind="image", modality="image", data=key.encode())
    text, image = Redactor().chunks([chunk, picture])
    assert text.text == "ocr text [redacted: github_token]" and text.context == "title [redacted: github_token]"
    assert text.meta == {"caption": "[redacted: github_token]", "width": 3}
    assert image.data == key.encode()


def test_a_pattern_of_the_config_is_redacted_and_a_bad_one_refused(tmp_path: Path, make_indexer: Any) -> None:
    config = write(tmp_path / "config.toml", 'redact_patterns = ["ACME-[0-9]{6}", "(unclosed"]\n')
    with pytest.raises(ConfigError, match=r"redact_patterns.*'\(unclosed'.*not a regular expression"):
        load_settings(config)
    write(config, 'redact_patterns = ["x*"]\n')
    with pytest.raises(ConfigError, match="'x\\*' matches the empty string"):
        load_settings(config)
    ws = tmp_path / "ws"
    write(ws / "memory" / "orders.md", "# Orders\n\nThe heliotrope order is ACME-123456, placed Monday.\n")
    daemon = make_indexer([{"agent": "main", "path": str(ws)}], redact_patterns=["ACME-[0-9]{6}"])
    with Running(daemon):
        memory = LocalMemory(daemon.view)
        answer = memory.search(SearchRequest(query="heliotrope order", mode="hybrid"))
        page = memory.get(GetRequest(path="memory/orders.md"))
    assert "[redacted: pattern]" in answer["hits"][0]["snippet"] and "ACME-123456" not in json.dumps(answer)
    assert page["text"].endswith("The heliotrope order is [redacted: pattern], placed Monday.")


def test_a_workspace_may_keep_its_notes_as_written_and_transcripts_are_always_redacted(tmp_path: Path,
                                                                                      make_indexer: Any) -> None:
    ws = tmp_path / "ws"
    key = SECRETS["openai_key"]
    write(ws / "memory" / "keys.md", f"# Keys\n\nThe heliotrope sandbox key is {key}.\n")
    daemon = make_indexer([{"agent": "main", "path": str(ws), "redact_secrets": False}])
    with Running(daemon):
        answer = LocalMemory(daemon.view).search(SearchRequest(query="heliotrope sandbox key", mode="hybrid"))
        page = LocalMemory(daemon.view).get(GetRequest(path="memory/keys.md"))
    assert key in answer["hits"][0]["snippet"] and key in page["text"]
    settings = make_settings(tmp_path, [{"agent": "main", "path": str(ws), "redact_secrets": False}])
    assert not Redactor.from_settings(settings, settings.workspace[0]).enabled
    assert Redactor.from_settings(settings, settings.workspace[0], transcripts=True).redact(key) == \
        "[redacted: openai_key]"
    # the setting is part of each point's file_hash: turning it on re-chunks the file (no stale secret stays)
    assert Redactor(False).version != Redactor().version != Redactor(True, Redactor.from_settings(
        make_settings(tmp_path, [], redact_patterns=["ACME-[0-9]+"])).patterns).version


def test_a_secret_pasted_into_a_transcript_is_absent_from_every_answer_payload_cache_file_and_log_line(
        tmp_path: Path, make_indexer: Any) -> None:
    """A session transcript whose user pastes every kind of secret (in one message, and a tool result that prints
    them, indexed here): search in every mode, recall, get of the transcript, the stored payloads, every file under
    the state dir and every log line hold none of them, and each is marked by its kind."""
    from test_sessions import openclaw

    ws, sessions = tmp_path / "ws", tmp_path / "sessions"
    write(ws / "MEMORY.md", "# Memory\n\nThe heliotrope launch is discussed in the sessions.\n")
    said = [("Dana", "Here is everything for the heliotrope deploy: " + " ".join(NOTE.split("\n")[3:])),
            ("Sam", "Thanks, I will rotate them after the heliotrope launch on Thursday."),
            ("Dana", "Also the key block:\n" + "\n".join(NOTE.split("\n")[10:14]))]
    session = "5b0c9f1e-6f1d-4c5e-9a51-1d2f3c4b5a69"
    path = write(sessions / f"{session}.jsonl", openclaw(session, "2023-06-02", said, tool_every=1)
                 .replace("TOOLOUTPUTWORD", "TOOLOUTPUTWORD " + SECRETS["github_token"]))
    with capture_logs() as logs:
        daemon = make_indexer([{"agent": "main", "path": str(ws), "sessions": str(sessions),
                                "sessions_tool_results": True}], log_level="debug")
        with Running(daemon):
            memory = LocalMemory(daemon.view)
            answers: list[Any] = [memory.search(SearchRequest(query=q, mode=mode, k=20, corpus="sessions"))
                                  for q in ["heliotrope deploy credentials", *LEAKS]
                                  for mode in ("hybrid", "keyword", "dense")]
            hits = [hit for answer in answers for hit in answer["hits"]]
            assert hits and all(hit["session_id"] == session for hit in hits)
            answers.append(memory.recall(RecallRequest(query="*")))
            page = memory.get(GetRequest(path=hits[0]["path"], lines=100))
            answers.append(page)
            payloads = [p for c in daemon.state.plan.collections for p in daemon.store.scroll(c.name)]
            stored = [json.dumps(dataclasses.asdict(p), default=str) for p in payloads]
    assert path.read_text().count(SECRETS["github_token"]) >= 2  # the file itself holds them, as written
    assert not _leaks(json.dumps(answers, default=str)) and not _leaks("\n".join(stored))
    assert all(f"[redacted: {kind}]" in page["text"] for kind in SECRETS)
    assert "[redacted: private_key]" in page["text"] and "[redacted: password]" in page["text"]
    assert "TOOLOUTPUTWORD [redacted: github_token]" in "\n".join(stored)  # the tool result too
    assert not [event for event in logs if _leaks(json.dumps(event, default=str))]
    for file in (tmp_path / "state").rglob("*"):
        if file.is_file():
            assert not [s for s in LEAKS if s.encode() in file.read_bytes()], file
