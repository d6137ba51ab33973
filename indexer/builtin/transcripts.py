"""The built-in transcript formats (group ``qmd_indexer.transcripts``): OpenClaw's session files and Claude Code's
project transcripts, registered through entry points like any third-party format.

- **OpenClaw** (``~/.openclaw/agents/<agentId>/sessions/<sessionId>.jsonl``): a ``session`` header record (``id``,
  ``timestamp``), then ``message`` records whose ``message.role`` is ``user``, ``assistant`` or ``toolResult`` and
  whose ``content`` is a list of ``text``, ``thinking`` and ``toolCall`` blocks (or a string), and bookkeeping
  records (``model_change``, ``thinking_level_change``, ``custom``). The folder's ``sessions.json`` is its index,
  not a transcript: its first line is no ``session`` record.
- **Claude Code** (``~/.claude/projects/<project>/<sessionId>.jsonl``): records of ``type`` ``user`` or
  ``assistant`` with ``message.role`` and ``message.content`` (a string, or a list of ``text``, ``thinking``,
  ``tool_use`` and ``tool_result`` blocks; a tool's result comes back in a ``user`` record), ``timestamp``,
  ``sessionId``, ``uuid``/``parentUuid``; and bookkeeping records (``summary``, ``system``,
  ``file-history-snapshot``, ``permission-mode``). ``isMeta`` records (injected caveats) are not the user's words.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from indexer.api import Message, TranscriptRecord

_OPENCLAW_HEAD = re.compile(rb'\A\s*\{[^\n]*"type"\s*:\s*"session"')
_CLAUDE_HEAD = re.compile(
    rb'\A\s*\{"[^\n]*(?:"(?:parentUuid|leafUuid|sessionId)"\s*:|'
    rb'"type"\s*:\s*"(?:summary|file-history-snapshot|permission-mode|user|assistant|system)")')


def _text(content: Any, kinds: tuple[str, ...] = ("text",)) -> str:
    """The text of a message's ``content``: a string as it is, else the ``text`` of its blocks of ``kinds``."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") in kinds]
    return "\n".join(p for p in parts if isinstance(p, str) and p)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


class OpenClawTranscripts:
    """OpenClaw's session transcripts (JSON Lines, one session a file)."""

    priority = 100

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        del config  # no settings

    def sniff(self, head: bytes) -> bool:
        return bool(_OPENCLAW_HEAD.match(head))

    def read(self, record: Mapping[str, Any]) -> TranscriptRecord:
        kind, when = record.get("type"), _str(record.get("timestamp"))
        if kind == "session":
            return TranscriptRecord(session_id=_str(record.get("id")), timestamp=when)
        message = record.get("message")
        if kind != "message" or not isinstance(message, dict):
            return TranscriptRecord(timestamp=when)
        role = message.get("role")
        role = "tool" if role == "toolResult" else role
        if role not in ("user", "assistant", "tool"):
            return TranscriptRecord(timestamp=when)
        return TranscriptRecord(timestamp=when, messages=(Message(role, _text(message.get("content")), when),))


class ClaudeCodeTranscripts:
    """Claude Code's project transcripts (JSON Lines, one session a file)."""

    priority = 110

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        del config  # no settings

    def sniff(self, head: bytes) -> bool:
        return bool(_CLAUDE_HEAD.match(head))

    def read(self, record: Mapping[str, Any]) -> TranscriptRecord:
        kind, when, session = record.get("type"), _str(record.get("timestamp")), _str(record.get("sessionId"))
        message = record.get("message")
        if kind not in ("user", "assistant") or not isinstance(message, dict) or record.get("isMeta"):
            return TranscriptRecord(session_id=session, timestamp=when)
        content = message.get("content")
        messages = []
        text = _text(content)
        if text:
            messages.append(Message(kind, text, when))
        if isinstance(content, list):  # a tool's result comes back in a user record
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    result = _text(block.get("content"))
                    if result:
                        messages.append(Message("tool", result, when))
        return TranscriptRecord(session_id=session, timestamp=when, messages=tuple(messages))
