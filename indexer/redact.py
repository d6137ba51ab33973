"""Secrets kept out of the index: each match of a documented pattern replaced by ``[redacted: kind]``.

People paste keys into chats and notes. The sources' readers (``indexer.sources``) redact every chunk
right after extraction, before anything is embedded, cached, keyword-indexed, stored in a payload, shown in a snippet
or logged; ``get`` (``indexer.recall.read_memory``) shows the file redacted the same way. Redaction keeps the line
count (a replaced span keeps its newlines), so line numbers and citations stay those of the file.

The built-in table (``KINDS``, in order: the first listed names a span where matches overlap), each with where its
shape comes from:

==================  ==========================================================================================
kind                what (source)
==================  ==========================================================================================
``private_key``     a PEM private-key block, ``-----BEGIN ... PRIVATE KEY-----`` to its ``END`` line, or to the
                    end of its base64 lines when cut short (RFC 7468 section 2; OpenSSH's ``OPENSSH PRIVATE KEY``)
``anthropic_key``   ``sk-ant-`` keys (Anthropic API keys: ``sk-ant-api03-...``, ``sk-ant-admin01-...``)
``openai_key``      ``sk-`` keys, ``sk-proj-``/``sk-svcacct-`` included (OpenAI API keys; gitleaks ``openai-api-key``)
``stripe_key``      ``sk_live_``, ``rk_live_`` (and ``_test_``, ``_prod_``) + 10-99 letters and digits: Stripe secret
                    and restricted keys (gitleaks ``stripe-access-token``); publishable ``pk_`` keys are public, kept
``github_token``    ``ghp_``, ``gho_``, ``ghu_``, ``ghs_``, ``ghr_`` + 36 base62 characters, ``github_pat_``
                    fine-grained tokens (GitHub docs, "About authentication: GitHub's token formats")
``aws_access_key``  access key ids ``AKIA``/``ASIA``/``ABIA``/``ACCA`` + 16 characters (AWS IAM, "Unique
                    identifiers": IDs prefixes)
``slack_token``     ``xoxa-``, ``xoxb-``, ``xoxp-``, ``xoxr-``, ``xoxs-`` tokens (Slack API, "Token types")
``jwt``             a JSON Web Token: three base64url parts, the first two JSON objects (``eyJ``) (RFC 7519)
``bearer_token``    ``Bearer <token>`` as in an ``Authorization`` header (RFC 6750 section 2.1)
``aws_secret_key``  a secret access key (40 of ``A-Za-z0-9/+``) after a name holding ``aws`` and ``secret``, ``key``,
                    ``token`` or ``pass``, or ``secret_access_key``/``SecretAccessKey``, then ``=``, ``:``, quotes
                    or spaces (AWS IAM "Manage access keys"; Yelp detect-secrets ``AWSKeyDetector``, adapted)
``url_password``    the password of a URL's ``user:password@`` (RFC 3986 section 3.2.1; detect-secrets
                    ``BasicAuthDetector``, adapted); placeholders (``${VAR}``, ``$(cmd)``, ``{name}``, ``%s``) kept
``basic_auth``      HTTP Basic credentials (RFC 7617): the base64 after ``Authorization: Basic`` (one character past
                    the first a digit, capital or symbol, so "Basic authentication" is prose; gitleaks
                    ``curl-auth-header``), and the password of ``curl -u``/``--user name:password`` (gitleaks
                    ``curl-auth-user``; ``$VAR`` and ``<...>`` placeholders kept)
``password``,       an assignment ``password=...``, ``token: ...``, ``"secret": "..."``, ``api_key = ...`` (names
``token``,          ending so: ``db_password``, ``GITHUB_TOKEN``): the value is redacted, the name kept. With ``=``
``secret``,         any value of 3+ characters; with ``:``, a quoted value or one of 6+ characters holding a digit
``api_key``         or a symbol, so prose ("the token: it expired", "password: see the vault") is kept
==================  ==========================================================================================

Patterns match within one line, except ``private_key``'s blocks; each marks only the secret, the name or URL around
it stays. Matches that overlap (a key's shape inside an assignment: ``ANTHROPIC_API_KEY=sk-ant-...``) are merged
into one span before anything is replaced, marked by the kind listed first (the table's order, then assignments,
then the config's patterns): ``ANTHROPIC_API_KEY=[redacted: anthropic_key]``. A mark is never taken for a value, so
redacted text redacted again is unchanged. The config adds patterns (``redact_patterns``, a list of regular
expressions, each compiled when the config loads: ``indexer.config.compile_patterns``); their matches become
``[redacted: pattern]``. Settings (``indexer.config``): ``redact_secrets`` (global, default true) and a workspace's
``redact_secrets`` (default: the global) for notes. Which applies to a collection is its source's policy
(``indexer.sources.Reader.redactor``: session transcripts are always redacted); this module is the mechanism.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from indexer.config import Settings, Workspace, compile_patterns

if TYPE_CHECKING:
    from indexer.api import Chunk

#: bump when the built-in table changes: part of every point's ``file_hash`` (``Redactor.version``), so a store
#: written under another table is re-chunked once and loses what the new one redacts
TABLE_VERSION = 3  # 3: a `name: value` assignment's value from 6 characters (8 before)
USER_KIND = "pattern"

_B = r"(?<![A-Za-z0-9_-])"  # a token starts at a word boundary of its own alphabet
_E = r"(?![A-Za-z0-9_-])"
_NAMES = r"(?:password|passwd|secret|token|api[_-]?key)"
_PATTERNS: tuple[tuple[str, str], ...] = (  # keys known by their shape alone
    ("anthropic_key", _B + r"sk-ant-[A-Za-z0-9_-]{20,}" + _E),
    ("openai_key", _B + r"sk-(?:proj-|svcacct-|admin-)?(?=[A-Za-z_-]*[0-9])[A-Za-z0-9_-]{20,}" + _E),
    ("stripe_key", _B + r"(?:sk|rk)_(?:live|test|prod)_[A-Za-z0-9]{10,99}" + _E),
    ("github_token", _B + r"(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})" + _E),
    ("aws_access_key", r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Z0-9])"),
    ("slack_token", _B + r"xox[abprs]-[A-Za-z0-9-]{10,}" + _E),
    ("jwt", _B + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}" + _E),
    ("bearer_token", r"(?<=\bBearer )[A-Za-z0-9._~+/-]{16,}=*"),
)
_MARKED = r"(?![\"']?\[redacted: )"  # a value that is already a mark is left alone
# secrets known by what surrounds them: (kind, words one of which the line holds, lowercased, for the pattern to be
# tried, as gitleaks' rule keywords; the pattern, whose group ``v`` is the secret)
_CONTEXTS: tuple[tuple[str, tuple[str, ...], re.Pattern[str]], ...] = (
    ("aws_secret_key", ("aws", "secret"), re.compile(
        r"(?i:(?<![A-Za-z0-9])(?:aws[\w.-]{0,20}?(?:secret|key|token|pass)|secret_?access_?key)\w{0,30})"
        r"[\s\"':=>]{1,6}(?P<v>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])")),
    ("url_password", ("://",), re.compile(
        r"://[^\s:/?#\[\]@\"'<>`]*:(?P<v>(?![$<{]|%s|%\()[^\s/?#\[\]\"'<>`]+)@")),
    ("basic_auth", ("basic",), re.compile(
        r"(?i:authorization)[\"']?[ \t]*[:=][ \t]*[\"']?(?i:basic)[ \t]+"
        r"(?P<v>(?=[A-Za-z0-9+/][A-Za-z0-9+/]*[0-9A-Z+/=])[A-Za-z0-9+/]{8,}={0,2})(?![A-Za-z0-9+/=])")),
    ("basic_auth", ("curl",), re.compile(
        r"\bcurl\b(?:(?!\bcurl\b).)*?[ \t](?:-u|--user)(?:=|[ \t]+)(?P<q>[\"']?)[^\s:\"']*:"  # scans to the next curl
        r"(?P<v>(?![$<{\[(])[^\s\"']{3,})(?P=q)(?!\S)")),
)
# ``name = value`` / ``name: value`` / ``"name": "value"``: group ``name`` ends the key (``db_password``: whatever
# comes before it is kept as it is, so it is not matched: a lazy prefix made a long run of ``[\w.-]`` quadratic),
# ``v1``/``v2`` what is redacted
_ASSIGNMENT = re.compile(
    r"(?P<name>" + _NAMES + r")[\"']?[ \t]*"
    r"(?:(?P<eq>=)[ \t]*" + _MARKED + r"(?P<v1>\"[^\"\n]+\"|'[^'\n]+'|[^\s\"',;]{3,})"
    r"|:[ \t]*" + _MARKED + r"(?P<v2>\"[^\"\n]+\"|'[^'\n]+'|(?=\S*[0-9!@#$%^&*+/=_~-])[^\s\"',;]{6,}))",
    re.IGNORECASE)
_BUILTIN = re.compile("|".join(f"(?P<{kind}>{pattern})" for kind, pattern in _PATTERNS))
_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----")
_PEM_BODY = re.compile(r"^\s*(?:[A-Za-z0-9+/]+=*|[A-Za-z-]+:[^\n]*)?\s*$")  # base64, an RFC 1421 header, blank
_MARKER = "PRIVATE KEY"
MAX_TAIL_LINES = 160  # base64 lines of the longest key block (RSA 8192: about 100 lines of 64 characters), rounded up
#: every kind of the built-in table, in the module's order (``private_key`` first: its blocks are cut before the rest)
KINDS = ("private_key", *(kind for kind, _ in _PATTERNS), *dict.fromkeys(kind for kind, _, _ in _CONTEXTS),
         "password", "token", "secret", "api_key")
_ASSIGNED, _USER = len(_PATTERNS) + len(_CONTEXTS), len(_PATTERNS) + len(_CONTEXTS) + 1  # ranks of the last two
_RANK = {kind: rank for rank, (kind, _) in enumerate(_PATTERNS)}
Span = tuple[int, int, int, str]  # start, end (character offsets in the text), rank (lowest: the kind shown), kind


def mark(kind: str) -> str:
    """What a secret of ``kind`` becomes: ``[redacted: kind]``."""
    return f"[redacted: {kind}]"


@lru_cache(maxsize=32)
def _assigned(match: re.Match[str]) -> Span:
    """The value of an assignment match, its quotes left out, with the kind its name gives."""
    group = "v1" if match.group("v1") else "v2"
    start, end = match.span(group)
    if match.group(group)[0] in "\"'":
        start, end = start + 1, end - 1
    name = match.group("name").lower().replace("-", "_")
    return start, end, _ASSIGNED, {"passwd": "password", "apikey": "api_key"}.get(name, name)


def _replaced(text: str, spans: list[Span]) -> str:
    """``text`` with ``spans`` replaced by marks, overlapping ones merged first into one span marked by the kind of
    the lowest rank among them (a span keeps its newlines, so the line count stays)."""
    out: list[str] = []
    done = 0
    merged: list[list[Any]] = []
    for start, end, rank, kind in sorted(spans):
        if merged and start < merged[-1][1]:
            last = merged[-1]
            last[1] = max(last[1], end)
            if rank < last[2]:
                last[2], last[3] = rank, kind
        elif start < end:
            merged.append([start, end, rank, kind])
    for start, end, _, kind in merged:
        out += [text[done:start], mark(kind), "\n" * text.count("\n", start, end)]
        done = end
    out.append(text[done:])
    return "".join(out)


@dataclass(frozen=True, slots=True)
class Redactor:
    """Redacts secrets from text (see the module). ``enabled`` false: text passes unchanged. ``patterns``: the
    user's, compiled (``compile_patterns``). Build it with ``from_settings``."""

    enabled: bool = True
    patterns: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings | None, workspace: Workspace | None = None,
                      always: bool = False) -> Redactor:
        """The redactor of ``workspace`` (its ``redact_secrets``, else the global one), or, with ``always``, one
        that is on whatever they say (the policy is the source's: ``indexer.sources.Reader.redactor``; session
        transcripts are always redacted). ``settings`` ``None``: the defaults (on, built-in table)."""
        patterns = compile_patterns(tuple(settings.redact_patterns)) if settings is not None else ()
        enabled = settings.redact_secrets if settings is not None else True
        own = getattr(workspace, "redact_secrets", None)
        if own is not None:
            enabled = own
        return cls(always or enabled, patterns)

    @property
    def version(self) -> str:
        """What a point's ``file_hash`` carries of this redactor (``indexer.sources.base.index_hash``): ``off``, or the
        table's version and a digest of the user's patterns, so changing either re-chunks the files once."""
        if not self.enabled:
            return "off"
        if not self.patterns:
            return str(TABLE_VERSION)
        digest = hashlib.sha256("\0".join(p.pattern for p in self.patterns).encode("utf-8")).hexdigest()[:12]
        return f"{TABLE_VERSION}.{digest}"

    def redact(self, text: str) -> str:
        """``text`` with every secret replaced by ``[redacted: kind]``; as many lines as ``text``."""
        if not self.enabled or not text:
            return text
        if _MARKER in text:
            return "".join(self.lines(text.splitlines(keepends=True), cut=True))
        return self._line(text)

    def lines(self, lines: Iterable[str], first: int = 1, cut: bool = False) -> Iterator[str]:
        """Each of ``lines`` (with or without their line ends, kept as they are) redacted, one out per one in: a
        private-key block's first line becomes ``[redacted: private_key]`` and the rest of it empty lines. Streams:
        ``get`` pages a file through it from its first line; lines before line ``first`` (1-based), which it skips,
        pass unredacted unless in a block (only a block's start is looked for). ``cut``: the lines may begin inside a
        block whose start was cut off (a chunk's text): up to ``MAX_TAIL_LINES`` base64 lines before an ``END``
        line are taken for its tail."""
        if not self.enabled:
            yield from lines
            return
        leading: list[str] = []  # lines that may be the tail of a block whose BEGIN was cut off (a chunk's start)
        in_block = False
        started = not cut
        for n, line in enumerate(lines, 1):
            if n < first and not in_block and _MARKER not in line:
                yield line
                continue
            if in_block:
                end = _PEM_END.search(line)
                if end:
                    in_block = False
                    yield self._line(line[end.end():]) if line[end.end():].strip() else _ending(line)
                    continue
                if _PEM_BODY.match(line):
                    yield _ending(line)
                    continue
                in_block = False
            if not started:
                if (len(leading) < MAX_TAIL_LINES and _PEM_BODY.match(line) and line.strip()
                        and not _PEM_BEGIN.search(line)):
                    leading.append(line)
                    continue
                started = True
                end = _PEM_END.search(line)
                if leading and end and not _PEM_BEGIN.search(line[: end.start()]):  # a cut block's tail
                    yield from (_ending(held) for held in leading)
                    leading = []
                    rest = line[end.end():]
                    yield mark("private_key") + (self._line(rest) if rest.strip() else _ending(line))
                    continue
                yield from (self._line(held) for held in leading)
                leading = []
            begin = _PEM_BEGIN.search(line)
            if begin is None:
                yield self._line(line)
                continue
            end = _PEM_END.search(line, begin.end())
            head = self._line(line[: begin.start()]) + mark("private_key")
            if end:  # a whole block on one line (a JSON string with \n escapes)
                yield head + self._line(line[end.end():])
            else:
                in_block = True
                yield head + _ending(line)
        yield from (self._line(held) for held in leading)

    def _line(self, text: str) -> str:
        """Every single-line pattern matched in ``text`` as it is, the matches then replaced (``_replaced``)."""
        spans: list[Span] = [(m.start(), m.end(), _RANK[m.lastgroup or ""], m.lastgroup or "")
                             for m in _BUILTIN.finditer(text)]
        lowered = text.lower()
        for rank, (kind, words, pattern) in enumerate(_CONTEXTS, len(_PATTERNS)):
            if any(word in lowered for word in words):
                spans += [(m.start("v"), m.end("v"), rank, kind) for m in pattern.finditer(text)]
        spans += [_assigned(m) for m in _ASSIGNMENT.finditer(text)]
        for pattern in self.patterns:
            spans += [(m.start(), m.end(), _USER, USER_KIND) for m in pattern.finditer(text)]
        return _replaced(text, spans) if spans else text

    def chunks(self, chunks: Sequence[Chunk]) -> list[Chunk]:
        """``chunks`` of one file with ``text``, ``context`` and the string values of ``meta`` redacted (a
        chunk's raw ``data``, an image's bytes, is left alone). A private-key block cut by chunk boundaries is
        followed across the chunks by their line numbers where each chunk's text has its line range's lines."""
        if not self.enabled:
            return list(chunks)
        blanked = _pem_lines(chunks) if any(_MARKER in c.text for c in chunks) else {}
        out = []
        for chunk in chunks:
            text = chunk.text
            if blanked and chunk.text.count("\n") == chunk.end_line - chunk.start_line:
                text = "".join(blanked[n].rstrip("\r\n") + _ending(line) if n in blanked else line for n, line in
                               enumerate(chunk.text.splitlines(keepends=True), chunk.start_line))
            meta = {k: self.redact(v) if isinstance(v, str) else v for k, v in chunk.meta.items()}
            redacted = replace(chunk, text=self.redact(text), context=self.redact(chunk.context), meta=meta)
            out.append(redacted)
        return out


def _ending(line: str) -> str:
    """The line end of ``line`` alone (an emptied line)."""
    return line[len(line.rstrip("\r\n")):]


def _pem_lines(chunks: Sequence[Chunk]) -> dict[int, str]:
    """Line number -> its redacted form, for the lines of private-key blocks of a file seen through its text
    ``chunks`` (those whose text has as many lines as their line range), in file order."""
    numbered: dict[int, str] = {}
    for chunk in chunks:
        if chunk.modality == "text" and chunk.text.count("\n") == chunk.end_line - chunk.start_line:
            for n, line in enumerate(chunk.text.splitlines(keepends=True), chunk.start_line):
                numbered.setdefault(n, line if line.endswith("\n") else line + "\n")
    out: dict[int, str] = {}
    plain = Redactor(True)
    run: list[int] = []
    for n in sorted(numbered):
        if run and n != run[-1] + 1:  # a gap in what the chunks show: the blocks are followed within runs
            out.update(_redacted_run(plain, run, numbered))
            run = []
        run.append(n)
    if run:
        out.update(_redacted_run(plain, run, numbered))
    return out


def _redacted_run(plain: Redactor, run: list[int], numbered: dict[int, str]) -> dict[int, str]:
    redacted = list(plain.lines((numbered[n] for n in run), cut=True))
    return {n: line for n, line, original in zip(run, redacted, (numbered[n] for n in run)) if line != original}
