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
from indexer.config import compile_patterns
from indexer.config_load import load_settings
from indexer.errors import ConfigError
from indexer.memory import LocalMemory
from indexer.pipeline import Pipeline
from indexer.plugins import Registry
from indexer.redact import KINDS, Redactor
from indexer.schema import BootRequest, GetRequest, RecallRequest, SearchRequest
from indexer.sources.base import Prepared

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
    ("password: hunter2", "password: [redacted: password]"),  # YAML's form of password=hunter2 (kept before)
    ("db_passwd = 'correct horse'", "db_passwd = '[redacted: password]'"),
    ("Authorization: Bearer abcdefghij0123456789", "Authorization: Bearer [redacted: bearer_token]"),
])
def test_assignments_lose_their_values_and_keep_their_names(text: str, expected: str) -> None:
    assert Redactor().redact(text) == expected


@pytest.mark.parametrize("prose", [
    "The token: it expired yesterday, ask Dana for a new one.",
    "Reset your password: see the vault entry named Deploy.",
    "The token: v2 was revoked, the secret: rotate it yearly.",
    "We talked about password managers and secret santa gifts.",
    "A token bucket limits the rate; the secret is patience.",
    "sk-learn is not a key, and neither is ghp_short.",
    "The commit 3f9a1c2e7b4d5a6f8e9d0c1b2a3f4e5d6c7b8a9f fixed it.",
    "ASIA trip in 2025: AKIA is not a word.",
    "-----BEGIN PUBLIC KEY----- is fine to share.",
    # shapes of the second table, out of their context or as placeholders
    "The aws key rotation landed in commit 3f9a1c2e7b4d5a6f8e9d0c1b2a3f4e5d6c7b8a9f yesterday.",
    "aws_access_key_id and aws_secret_access_key go in ~/.aws/credentials, never in a note.",
    "An S3 path: aws s3 cp s3://heliotrope-logs/Quarterly/ReportsForTheBoardOfDirect ./out",
    "Docs at https://docs.python.org:443/3/library/re.html and http://[::1]:8080/health are fine.",
    "Clone ssh://git@github.com:22/org/repo.git or git@github.com:org/repo.git, mail dana@example.com.",
    'url = f"postgres://{user}:{password}@{host}/{db}"; alt = "mysql://%s:%s@%s" % args',
    'DSN="postgres://${DB_USER}:${DB_PASSWORD}@db/app" and <user>:<password>@host',
    'curl -u "$API_USER:$API_TOKEN" https://api.example.com and curl -u "${USER}:$(cat pw)" https://x',
    "docker run -u 1000:1000 --user 1000:1000 image; git push -u origin main; sort -u a:b",
    "Basic authentication sends the credentials with every request; Authorization: Basic auth is weak.",
    "Authorization: Basic authentication and Authorization: Basic {token}",
    "Stripe secret keys begin sk_live_ and publishable ones pk_live_51HxKqPzW4mT8vRn2Jc6Ld9Fy are public.",
    "The task_test_runner_module and risk_live_feed_handler are unrelated.",
    "Meet at 10:30@cafe; ratio 3:2@scale; http://a.b/c@d is a path and mailto:dana@example.com an address.",
])
def test_prose_with_secret_words_is_kept(prose: str) -> None:
    assert Redactor().redact(prose) == prose


# assignment lines as in a ``.env`` file (issue 57, item 6): the name stays, the value becomes one mark of its kind
ENV_LINES = {
    f"ANTHROPIC_API_KEY={SECRETS['anthropic_key']}": "ANTHROPIC_API_KEY=[redacted: anthropic_key]",
    f"OPENAI_API_KEY={SECRETS['openai_key']}": "OPENAI_API_KEY=[redacted: openai_key]",
    f"export GITHUB_TOKEN={SECRETS['github_token']}": "export GITHUB_TOKEN=[redacted: github_token]",
    f"SLACK_BOT_TOKEN = {SECRETS['slack_token']}": "SLACK_BOT_TOKEN = [redacted: slack_token]",
    f'"api_key": "{SECRETS["anthropic_key"]}",': '"api_key": "[redacted: anthropic_key]",',
    f"session_token: '{SECRETS['jwt']}'": "session_token: '[redacted: jwt]'",
    "db_password=hunter2 and token=Bearer abcdefghij0123456789":
        "db_password=[redacted: password] and token=[redacted: token] [redacted: bearer_token]",
}
# kinds past the first table (issue 57, item 16), each in the context it is recognised by; only the secret goes
CONTEXTUAL = {
    "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY":
        "aws_secret_access_key = [redacted: aws_secret_key]",
    "export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY":
        "export AWS_SECRET_ACCESS_KEY=[redacted: aws_secret_key]",
    '"SecretAccessKey": "Zq4rT8vW2xY6zA0bC3dE5fG7hJ9kL1mN+oP/sR2t",':
        '"SecretAccessKey": "[redacted: aws_secret_key]",',
    "aws configure set aws_secret_access_key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY":
        "aws configure set aws_secret_access_key [redacted: aws_secret_key]",
    "postgres://user:hunter2@db:5432/x": "postgres://user:[redacted: url_password]@db:5432/x",
    "DATABASE_URL=postgres://app:s3cr3t-Pw!@db.internal:5432/app":
        "DATABASE_URL=postgres://app:[redacted: url_password]@db.internal:5432/app",
    "redis://:hunter2@cache:6379/0 and amqp://bus:p@ss@mq//": "redis://:[redacted: url_password]@cache:6379/0 and "
                                                              "amqp://bus:[redacted: url_password]@mq//",
    "stripe.api_key = 'sk_live_51HxKqPzW4mT8vRn2Jc6Ld9Fy'": "stripe.api_key = '[redacted: stripe_key]'",
    "STRIPE_RESTRICTED=rk_live_51HxKqPzW4mT8vRn2Jc6Ld9Fy": "STRIPE_RESTRICTED=[redacted: stripe_key]",
    "test mode: sk_test_4eC39HqLyjWDarjtT1zdp7dc.": "test mode: [redacted: stripe_key].",
    "Authorization: Basic dXNlcjpwYXNz": "Authorization: Basic [redacted: basic_auth]",
    "curl -H 'authorization: basic ZGVwbG95OlRyMHViNGRvcg==' https://ci.example.com/api":
        "curl -H 'authorization: basic [redacted: basic_auth]' https://ci.example.com/api",
    '{"headers": {"Authorization": "Basic dXNlcjpwYXNz"}}':
        '{"headers": {"Authorization": "Basic [redacted: basic_auth]"}}',
    "curl -u user:pass https://api.example.com/v1": "curl -u user:[redacted: basic_auth] https://api.example.com/v1",
    "curl -s --user 'deploy:Tr0ub4dor' -X POST https://x":
        "curl -s --user 'deploy:[redacted: basic_auth]' -X POST https://x",
    'curl --user="ci:hunter22" https://x': 'curl --user="ci:[redacted: basic_auth]" https://x',
}


@pytest.mark.parametrize(("text", "expected"), [*ENV_LINES.items(), *CONTEXTUAL.items()])
def test_a_line_keeps_all_but_the_secret_which_becomes_one_mark(text: str, expected: str) -> None:
    """Issue 57: ``NAME_KEY=value`` lines came out ``NAME_KEY=[redacted: api_key] anthropic_key]`` (the key's shape and
    the assignment matched the same value, substituted one after the other); AWS secret keys, passwords in URLs,
    Stripe keys and HTTP Basic credentials were not redacted at all. Whole text, line by line (``get``) and text
    redacted again (a mark is never taken for a value) all read the same."""
    redactor = Redactor()
    assert redactor.redact(text) == expected
    assert list(redactor.lines([text + "\n", "after\n"])) == [expected + "\n", "after\n"]
    assert redactor.redact(expected) == expected


def test_overlapping_matches_of_the_users_patterns_and_the_table_make_one_mark() -> None:
    user = Redactor(True, compile_patterns(("ACME-[0-9]{6} password=\\S+", "ref-[a-z0-9-]+")))
    assert user.redact("order ACME-123456 password=hunter22 today") == "order [redacted: password] today"
    assert user.redact("see ref-sk-ant-x and secret=ref-abc123") == \
        "see [redacted: pattern] and secret=[redacted: secret]"
    assert user.redact(f"key {SECRETS['github_token']}\nline two") == "key [redacted: github_token]\nline two"


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
    assert Redactor.from_settings(settings, settings.workspace[0], always=True).redact(key) == \
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


class Recorder:
    """A tiny real HTTP server in front of a real embedding server: forwards each request and keeps every text
    sent to be embedded (``inputs``)."""

    def __init__(self, upstream: str) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        import httpx

        self.inputs: list[str] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                recorder.inputs += json.loads(body)["input"]
                reply = httpx.post(upstream + self.path, content=body, headers={"Content-Type": "application/json"},
                                   timeout=60)
                self.send_response(reply.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply.content)))
                self.end_headers()
                self.wfile.write(reply.content)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_env_lines_and_the_second_table_reach_neither_the_index_nor_the_embedding_server(
        tmp_path: Path, infinity_minilm: Any) -> None:
    """Issue 57 end to end: a note of ``.env`` lines and of the kinds the first table missed, indexed through a real
    OpenAI-compatible embedding server (infinity-emb): ``get`` shows each line with its value alone replaced by one
    mark, and no text sent to the server, no answer, payload or file under the state dir holds a secret."""
    from test_openai_embedder import close, endpoint_registry, open_indexer

    from indexer.worker import index_once

    aws, db, stripe, curl = ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "Hunter2-heliotrope",
                             "sk_live_51HxKqPzW4mT8vRn2Jc6Ld9Fy", "Tr0ub4dor-heliotrope")
    basic = "ZGVwbG95OlRyMHViNGRvci1oZWxpb3Ryb3Bl"  # base64 of deploy:Tr0ub4dor-heliotrope
    written = {
        **{line: shown for line, shown in ENV_LINES.items() if "hunter2" not in line},
        f"aws_secret_access_key = {aws}": "aws_secret_access_key = [redacted: aws_secret_key]",
        f"DATABASE_URL=postgres://heliotrope:{db}@db:5432/app":
            "DATABASE_URL=postgres://heliotrope:[redacted: url_password]@db:5432/app",
        f"STRIPE_KEY={stripe}": "STRIPE_KEY=[redacted: stripe_key]",
        f"curl -u deploy:{curl} https://ci.heliotrope.example/api":
            "curl -u deploy:[redacted: basic_auth] https://ci.heliotrope.example/api",
        f"Authorization: Basic {basic}": "Authorization: Basic [redacted: basic_auth]",
    }
    head = ["# Heliotrope staging env", "", "Copied from the heliotrope staging host, rotate after the launch:"]
    ws = tmp_path / "ws"
    write(ws / "memory" / "staging-env.md", "\n".join([*head, *written, ""]))
    leaks = [*SECRETS.values(), aws, db, stripe, curl, basic]
    recorder = Recorder(infinity_minilm.url)
    indexer = open_indexer(tmp_path, ws, endpoint_registry(recorder.url))
    try:
        assert index_once(indexer)["files_failed"] == 0
        sent = "\n".join(recorder.inputs)  # what indexing sent (the searches below send their queries)
        memory = LocalMemory(indexer.view)
        answers: list[Any] = [memory.search(SearchRequest(query=q, mode=mode, k=10))
                              for q in ["heliotrope staging env keys", *leaks] for mode in ("hybrid", "keyword")]
        assert any(hit["path"] == "memory/staging-env.md" for answer in answers for hit in answer["hits"])
        page = memory.get(GetRequest(path="memory/staging-env.md"))
        payloads = [p for c in indexer.state.plan.collections for p in indexer.store.scroll(c.name)]
        stored = json.dumps([dataclasses.asdict(p) for p in payloads], default=str)
    finally:
        close(indexer)
        recorder.close()
    assert [s for s in leaks if s in sent] == [] and [s for s in leaks if s in json.dumps(answers)] == []
    assert "[redacted: aws_secret_key]" in sent and "STRIPE_KEY=[redacted: stripe_key]" in sent
    assert page["text"].split("\n") == [*head, *written.values()]
    assert [s for s in leaks if s in stored] == []
    for path in (tmp_path / "state").rglob("*"):
        if path.is_file():
            assert not [s for s in leaks if s.encode() in path.read_bytes()], path


def test_every_kind_is_in_the_modules_table_and_the_configuration_docs() -> None:
    import re

    import indexer.redact

    docs = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert [k for k in KINDS if f"``{k}``" not in (indexer.redact.__doc__ or "")] == []
    assert [k for k in KINDS if not re.search(rf"`{k}\b", docs)] == []


@pytest.mark.parametrize("text", [
    "data:image/png;base64," + "Qm9vYmFy-_Zx8Y." * 12_500,  # a pasted blob: one long run of [\w.-] (was minutes)
    "curl " * 40_000, "_aws_key" * 25_000, "://a:b@" * 30_000, "Authorization: Basic " * 10_000,
])
def test_a_long_line_is_redacted_in_linear_time(text: str) -> None:
    """200 KB of what each pattern starts on, without the rest of it: every pattern gives up in bounded steps (a
    lazy or unbounded scan at each start made some of them take minutes)."""
    import time

    started = time.perf_counter()
    Redactor().redact(text)
    assert time.perf_counter() - started < 3.0
