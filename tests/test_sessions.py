"""Session transcripts as a memory source: a workspace's ``sessions`` folder read by the transcript format plugins
(OpenClaw, Claude Code) into windows of whole turns, dated by their records, found by search with their session,
filtered by ``corpus``, shown by ``get`` as readable turns, listed by ``recall "*"``, never in ``boot``."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import write

from indexer.builtin.transcripts import ClaudeCodeTranscripts, OpenClawTranscripts
from indexer.memory import LocalMemory
from indexer.schema import BootRequest, GetRequest, RecallRequest, SearchRequest
from indexer.store.tenancy import shared_collection
from indexer.worker import index_once
from indexer.workspace import agent_slug, plan_collections

SESSION = "3418b17d-d5fc-56a3-81f2-d41a9587a88c"
FILLER = ["How was your week?", "Busy with the kids and work, and you?", "I painted a small lake at sunrise.",
          "That sounds lovely, send me a picture!", "I will, it came out better than I hoped.",
          "We should go hiking again soon.", "Yes, maybe next month when it is warmer."]


def _stamp(start: float, n: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(start + 37 * n))


def openclaw(session: str, day: str, said: list[tuple[str, str]], tool_every: int = 3) -> str:
    """An OpenClaw transcript: a header, bookkeeping records, then ``said`` as (name, text) turns alternating user
    and assistant, with thinking blocks and a tool call and its result as noise."""
    start = time.mktime(time.strptime(day + " 13:56", "%Y-%m-%d %H:%M")) - time.timezone
    records: list[dict[str, Any]] = [
        {"type": "session", "version": 3, "id": session, "timestamp": _stamp(start, 0), "cwd": "/home/agent"},
        {"type": "model_change", "id": "m1", "timestamp": _stamp(start, 0), "provider": "p", "modelId": "m"},
        {"type": "thinking_level_change", "id": "t1", "timestamp": _stamp(start, 0), "thinkingLevel": "low"}]
    for n, (name, text) in enumerate(said, 1):
        role = "user" if n % 2 else "assistant"
        content = [{"type": "text", "text": f"{name}: {text}"}]
        if role == "assistant":
            content.insert(0, {"type": "thinking", "thinking": "PRIVATETHOUGHT keep it friendly"})
        records.append({"type": "message", "id": f"r{n}", "timestamp": _stamp(start, n),
                        "message": {"role": role, "content": content}})
        if n % tool_every == 0:
            records.append({"type": "message", "id": f"c{n}", "timestamp": _stamp(start, n), "message": {
                "role": "assistant", "content": [{"type": "toolCall", "id": f"k{n}", "name": "exec",
                                                  "arguments": {"command": "TOOLCALLWORD ls"}}]}})
            records.append({"type": "message", "id": f"o{n}", "timestamp": _stamp(start, n), "message": {
                "role": "toolResult", "content": [{"type": "text", "text": "TOOLOUTPUTWORD " + "x" * 900}]}})
    records.append({"type": "custom", "customType": "note", "timestamp": _stamp(start, len(said) + 1)})
    return "".join(json.dumps(r) + "\n" for r in records)


def _talk(evidence: str, n: int = 10) -> list[tuple[str, str]]:
    said = [("Caroline" if i % 2 == 0 else "Melanie", FILLER[i % len(FILLER)]) for i in range(n)]
    said.insert(n // 2, ("Caroline", evidence))
    return said


EVIDENCE = "We finally booked the ferry to the island for the kayak race."


@pytest.fixture(name="agent")
def agent_fixture(tmp_path: Path) -> dict[str, Any]:
    """A workspace with a note, and its sessions folder beside it (as OpenClaw lays them out): a transcript, the
    folder's ``sessions.json`` index, a lock file, a JSON Lines file that is no transcript, a hidden transcript
    and a symlink to a transcript."""
    ws = tmp_path / "workspace"
    write(ws / "MEMORY.md", "# Memory\n\n- The user likes kayaks.\n")
    write(ws / "memory" / "boats.md", "# Boats\n\nThe kayak race ferry is a note here too.\n")
    sessions = tmp_path / "agents" / "main" / "sessions"
    write(sessions / f"{SESSION}.jsonl", openclaw(SESSION, "2023-06-02", _talk(EVIDENCE)))
    write(sessions / "sessions.json", json.dumps({"agent:main:main": {"sessionId": SESSION, "updatedAt": 1}}))
    write(sessions / f"{SESSION}.jsonl.lock", "4242\n")
    write(sessions / "metrics.jsonl", '{"cpu": 1}\n{"cpu": 2}\n')
    write(sessions / ".hidden" / "old.jsonl", openclaw("hidden", "2023-01-01", _talk("HIDDENWORD")))
    outside = write(tmp_path / "elsewhere" / "x.jsonl", openclaw("linked", "2023-01-01", _talk("LINKEDWORD")))
    os.symlink(outside, sessions / "linked.jsonl")
    return {"agent": "main", "path": ws, "sessions": os.path.relpath(sessions, ws)}


def _points(indexer: Any, name: str) -> list[Any]:
    return indexer.store.scroll(name)


def test_a_transcript_becomes_dated_windows_of_its_text_turns(make_indexer, agent) -> None:
    indexer = make_indexer([agent])
    assert [c.name for c in indexer.state.plan.collections][-1] == "sessions-main"
    index_once(indexer)
    points = _points(indexer, "sessions-main")
    assert {Path(p.abs_path).name for p in points} == {f"{SESSION}.jsonl"}  # index, lock, other JSONL, hidden, link
    text = " ".join(p.text + p.context for p in points)
    assert "Caroline: We finally booked the ferry" in text
    for noise in ("PRIVATETHOUGHT", "TOOLCALLWORD", "TOOLOUTPUTWORD"):
        assert noise not in text
    assert all(p.kind == "transcript" and p.get("session_id") == SESSION for p in points)
    assert all(p.get("note_date") == "2023-06-02" and "Friday, 2 June 2023" in p.context for p in points)
    assert all(p.end_line - p.start_line <= 12 for p in points)  # a few whole turns each
    statuses = indexer.view.status()["collections"]["sessions-main"]
    assert statuses["files"] == 1 and statuses["role"] == "sessions"


def test_a_transcript_hit_names_its_session_and_get_shows_its_turns(make_indexer, agent) -> None:
    indexer = make_indexer([agent])
    index_once(indexer)
    memory = LocalMemory(indexer.view)
    hits = memory.search(SearchRequest(query="booked the ferry for the kayak race", k=3, corpus="sessions"))["hits"]
    top = hits[0]
    assert top["collection"] == "sessions-main" and top["session_id"] == SESSION
    assert top["session_time"].startswith("2023-06-02T") and set(top["speakers"]) == {"Caroline", "Melanie"}
    lines = Path(indexer.state.plan.collections[-1].root, f"{SESSION}.jsonl").read_text().splitlines()
    evidence_line = next(n for n, line in enumerate(lines, 1) if "kayak race" in line)
    assert top["start_line"] <= evidence_line <= top["end_line"]
    page = memory.get(GetRequest(path=top["path"], from_line=top["start_line"],
                                 lines=top["end_line"] - top["start_line"] + 1))
    assert f"L{evidence_line} [2023-06-02 " in page["text"]
    assert f"Caroline (assistant): {EVIDENCE}" in page["text"]  # the sixth turn: an assistant message
    assert "PRIVATETHOUGHT" not in page["text"] and "TOOLCALLWORD" not in page["text"]
    first = memory.get(GetRequest(path=top["path"], lines=6))
    assert first["from"] == 1 and first["to"] == 6 and first["truncated"] and first["next_from"] == 7
    assert first["text"].splitlines()[0].startswith("L4 [2023-06-02 ")  # lines 1-3 are bookkeeping


def test_corpus_chooses_notes_transcripts_or_both_and_boot_never_has_transcripts(make_indexer, agent) -> None:
    indexer = make_indexer([agent])
    index_once(indexer)
    memory = LocalMemory(indexer.view)

    def where(corpus: str | None) -> set[str]:
        hits = memory.search(SearchRequest(query="kayak race ferry", k=10, corpus=corpus))["hits"]
        return {h["collection"] for h in hits}

    assert where("memory") <= {"memory-root-main", "memory-dir-main"} and where("memory")
    assert where("sessions") == {"sessions-main"}
    assert "sessions-main" in where(None) and "memory-dir-main" in where(None)  # the default: all
    listing = memory.recall(RecallRequest(query="*", corpus="sessions"))["hits"]
    assert [h["session_id"] for h in listing] == [SESSION]
    assert listing[0]["session_time"].startswith("2023-06-02T")
    assert len(memory.recall(RecallRequest(query="*"))["hits"]) == 3
    boot = memory.boot(BootRequest(budget_chars=100_000))
    assert "ferry to the island" not in json.dumps(boot)
    boot = memory.boot(BootRequest(budget_chars=100_000, query="kayak race ferry"))
    assert SESSION not in json.dumps(boot)


def test_a_day_named_in_the_question_favours_the_transcript_of_that_day(make_indexer, tmp_path) -> None:
    ws, sessions = tmp_path / "ws", tmp_path / "sessions"
    write(ws / "MEMORY.md", "# Memory\n")
    write(sessions / "a.jsonl", openclaw("june", "2023-06-02", _talk(EVIDENCE)))
    write(sessions / "b.jsonl", openclaw("july", "2023-07-14", _talk(EVIDENCE)))
    indexer = make_indexer([{"agent": "main", "path": ws, "sessions": sessions}])
    index_once(indexer)
    searcher = indexer.view.searcher()
    for as_of, query, want in [(None, "kayak race ferry in June 2023", "june"),
                               (None, "kayak race ferry on 14 July 2023", "july"),
                               ("2023-06-03", "the kayak race ferry yesterday", "june")]:
        hits = searcher.answer(SearchRequest(query=query, k=3, as_of=as_of)).hits
        assert hits[0]["session_id"] == want, (query, hits[0])


def test_a_transcripts_dense_part_is_weighed_down_in_hybrid_fusion(make_indexer, agent, monkeypatch) -> None:
    """Hybrid search fuses a transcript window's cosine at its source's ``dense_weight`` (chat windows look alike
    to a small model; ``indexer.workspace.TRANSCRIPT_DENSE_WEIGHT``) and a note's at 1."""
    from indexer import candidates
    from indexer.workspace import TRANSCRIPT_DENSE_WEIGHT

    seen: list[Any] = []
    real = candidates.fuse_scores

    def recording(lists: Any, *args: Any) -> Any:
        seen.append((lists, args))
        return real(lists, *args)

    monkeypatch.setattr(candidates, "fuse_scores", recording)
    indexer = make_indexer([agent])
    index_once(indexer)
    hits = LocalMemory(indexer.view).search(SearchRequest(query="the ferry for the kayak race", k=5))["hits"]
    assert {h["collection"] for h in hits} >= {"sessions-main", "memory-dir-main"}
    (lists, (_, _, _, weights)), = seen
    dense, keyword = lists[0], lists[1]
    transcript = set(indexer.store.payloads("sessions-main", [str(pid) for pid, _ in dense + keyword]))
    assert weights[0] == {pid: TRANSCRIPT_DENSE_WEIGHT for pid, _ in dense if str(pid) in transcript}
    assert len(weights[0]) == 3 and len(dense) == 5  # the three windows weighed, the two notes not
    assert weights[1] is None and TRANSCRIPT_DENSE_WEIGHT < 1 and keyword
    fused = real(lists, "dbsf", 60, 100, weights)
    assert hits[0]["score"] == pytest.approx(fused[0][1])  # the best hit is never narrowed (indexer.ranking.collapse)


@pytest.mark.parametrize(("lines_per_turn", "newline"), [(1, "\n"), (3, "\n"), (3, "\r\n")])
def test_the_hits_of_a_transcript_show_each_of_its_turns_once(make_indexer, agent, tmp_path, lines_per_turn,
                                                              newline) -> None:
    """Windows share turns; a window that overlaps a better hit is shown narrowed to its turns no better hit shows
    (it used to drop out, and the turns only it held with them), so hits never repeat lines and lose none; turns
    of several lines (``\\n`` or ``\\r\\n`` inside a message) are cut whole."""
    path = tmp_path / "agents" / "main" / "sessions" / f"{SESSION}.jsonl"
    said = [(name, newline.join([text] * lines_per_turn)) for name, text in _talk(EVIDENCE)]
    write(path, openclaw(SESSION, "2023-06-02", said))
    indexer = make_indexer([agent])
    index_once(indexer)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    turns = {n: block["text"].replace("\r\n", "\n") for n, r in enumerate(records, 1) if r["type"] == "message"
             for block in r["message"]["content"] if block["type"] == "text" and r["message"]["role"] != "toolResult"}
    assert len(turns) == 11 and len(_points(indexer, "sessions-main")) >= 3  # windows that share turns
    hits = LocalMemory(indexer.view).search(SearchRequest(query="kayak ferry picture hiking sunrise week", k=10,
                                                          corpus="sessions"))["hits"]
    shown = [n for h in hits for n in turns if h["start_line"] <= n <= h["end_line"]]
    assert sorted(shown) == sorted(turns)  # each turn in exactly one hit
    for h in hits:  # each hit shows the whole turns of its lines, a narrowed one its own only
        assert h["snippet"] == "\n".join(turns[n] for n in sorted(turns) if h["start_line"] <= n <= h["end_line"])
        assert h["start_line"] in turns and h["end_line"] in turns


@pytest.mark.parametrize("mode", ["hybrid", "dense", "keyword"])
def test_the_first_k_hits_are_the_first_k_of_a_longer_answer(make_indexer, agent, tmp_path, mode) -> None:
    """Narrowed windows go back in line at their lowered score; one that falls below what a candidate not read for
    ``k`` may score drops out, so asking for fewer hits gives a prefix of the longer answer."""
    sessions = tmp_path / "agents" / "main" / "sessions"
    for n, day in enumerate(("2023-06-02", "2023-06-09", "2023-06-16")):
        said = [(name, f"{text} Day {n} plans.") for name, text in _talk(EVIDENCE, 16)]
        write(sessions / f"{SESSION[:-1]}{n}.jsonl", openclaw(f"{SESSION[:-1]}{n}", day, said))
    # a turn over the model's window is cut into pieces of the same line, which all drop out after the best: they
    # use up the candidates read for k
    giant = [("Caroline", "Our week plans, a picture of the lake, hiking next month, the kids. " * 300),
             ("Melanie", "Lovely."), ("Caroline", "Day 9 plans: the ferry and the kayak race.")]
    write(sessions / "giant.jsonl", openclaw("giant", "2023-06-20", giant))
    indexer = make_indexer([agent])
    index_once(indexer)
    memory = LocalMemory(indexer.view)

    def answer(query: str, k: int) -> list[tuple[str, int, int]]:
        hits = memory.search(SearchRequest(query=query, k=k, mode=mode, corpus="sessions"))["hits"]
        assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
        return [(h["path"], h["start_line"], h["end_line"]) for h in hits]

    sizes = []
    for query in ("the week plans and a picture", "hiking next month", "kayak race ferry", "Day 1 plans",
                  "busy with the kids"):
        longest = answer(query, 60)
        sizes.append(len(longest))
        for k in range(1, 13):
            assert answer(query, k) == longest[:k], (query, k)
    assert max(sizes) > 12


def test_a_speaker_named_before_a_full_width_colon_or_after_a_time_is_read_as_one(make_indexer, agent,
                                                                                  tmp_path) -> None:
    """``小王：...`` (no ASCII colon) crashed the transcript's read and held every file of its batch;
    ``[10:42] Caroline: hi`` kept ``42] Caroline: hi`` as the text."""
    said = [("小王", "明天开会吗？"), ("小李", "开，十点。")] * 3
    sessions = tmp_path / "agents" / "main" / "sessions"

    def said_as(body: str, old: str, new: str) -> str:  # each message's text rewritten
        records = [json.loads(line) for line in body.splitlines()]
        for r in records:
            for block in r.get("message", {}).get("content", []):
                if block["type"] == "text":
                    block["text"] = block["text"].replace(old, new)
        return "".join(json.dumps(r) + "\n" for r in records)

    write(sessions / "zh.jsonl", said_as(openclaw("zh", "2023-06-02", said), ": ", "\uff1a"))
    write(sessions / f"{SESSION}.jsonl",
          said_as(openclaw(SESSION, "2023-06-02", _talk(EVIDENCE)), "Caroline: ", "[10:42] Caroline: "))
    indexer = make_indexer([agent])
    status = index_once(indexer)
    assert not status.get("failed_files")
    first = {Path(p.path).name: p.text for p in sorted(_points(indexer, "sessions-main"), key=lambda p: -p.start_line)}
    assert first["zh.jsonl"].startswith("小王: 明天开会吗？\n小李: 开，十点。")
    assert first[f"{SESSION}.jsonl"].startswith("Caroline: How was your week?")


def test_a_long_windows_snippet_cites_the_jsonl_lines_of_the_turns_it_shows(tmp_path) -> None:
    """A transcript window over ``WINDOW_CHARS`` (a model of 512 tokens makes them) shows whole turns from the one
    that best matches, its speaker first; its citation names the JSONL lines of those turns, not the window's first
    line plus the snippet's offset in its text: tool calls and results sit between its turns, and a turn may have
    several lines."""
    from indexer.api import ExtractContext, FileInfo
    from indexer.config import Workspace
    from indexer.hits import WINDOW_CHARS, shown
    from indexer.points import Payload
    from indexer.sources.transcripts import extract

    path = tmp_path / f"{SESSION}.jsonl"
    said = [(name, f"{text}\n{text} " * 6) for name, text in _talk(EVIDENCE)]
    write(path, openclaw(SESSION, "2023-06-02", said, tool_every=2))
    words = lambda text: [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]  # noqa: E731
    info = FileInfo(path, path.name, "transcript", path.stat().st_size, opener=lambda: open(path, "rb"))
    chunks = extract(info, OpenClawTranscripts(), Workspace(agent="main", path=tmp_path),
                     ExtractContext(max_tokens=512, token_offsets=words))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    turns = {n: block["text"] for n, r in enumerate(records, 1) if r["type"] == "message"
             for block in r["message"]["content"] if block["type"] == "text" and r["message"]["role"] != "toolResult"}
    long = [c for c in chunks if len(c.text) > WINDOW_CHARS]
    assert long
    for chunk in long:
        payload = Payload(kind=chunk.kind, path=path.name, start_line=chunk.start_line, end_line=chunk.end_line,
                          text=chunk.text, extra=chunk.meta)
        for query in ("booked the ferry for the kayak race", "hiking next month", "picture of the lake"):
            body, start, end = shown(payload, query)
            assert start in turns and end in turns and start >= chunk.start_line and end <= chunk.end_line
            cited = "\n".join(turns[n].strip() for n in sorted(turns) if start <= n <= end)
            assert cited.startswith(body.rstrip("…")) and len(body) <= WINDOW_CHARS  # whole turns, the speaker first
            assert body.rstrip("…").rsplit("\n", 1)[-1] in turns[end]


def test_tool_results_are_indexed_cut_where_the_workspace_asks(make_indexer, agent) -> None:
    indexer = make_indexer([{**agent, "sessions_tool_results": True, "sessions_tool_result_chars": 40}])
    index_once(indexer)
    text = " ".join(p.text for p in _points(indexer, "sessions-main"))
    assert "tool result: TOOLOUTPUTWORD" in text and "x" * 60 not in text
    assert "TOOLCALLWORD" not in text and "PRIVATETHOUGHT" not in text


def test_a_torn_last_line_waits_and_an_appended_turn_is_found(make_indexer, tmp_path) -> None:
    ws, sessions = tmp_path / "ws", tmp_path / "sessions"
    write(ws / "MEMORY.md", "# Memory\n")
    body = openclaw("live", "2023-06-02", _talk(EVIDENCE))
    turn = json.dumps({"type": "message", "id": "z", "timestamp": "2023-06-02T15:00:00.000Z", "message": {
        "role": "user", "content": [{"type": "text", "text": "Caroline: The zeppelin tour is on Saturday."}]}})
    path = write(sessions / "live.jsonl", body + turn[:40])  # a writer mid-append
    indexer = make_indexer([{"agent": "main", "path": ws, "sessions": sessions}])
    index_once(indexer)
    texts = [p.text for p in _points(indexer, "sessions-main")]
    assert texts and not any("zeppelin" in t for t in texts)
    assert indexer.view.status()["files_failed"] == 0
    path.write_text(body + turn + "\n")
    index_once(indexer)
    hits = indexer.view.searcher().answer(SearchRequest(query="zeppelin tour", k=1, corpus="sessions")).hits
    assert "zeppelin tour" in hits[0]["snippet"]
    assert hits[0]["end_line"] == len(path.read_text().splitlines())


def test_a_deleted_or_expired_transcript_loses_its_points(make_indexer, tmp_path) -> None:
    ws, sessions = tmp_path / "ws", tmp_path / "sessions"
    write(ws / "MEMORY.md", "# Memory\n")
    old = write(sessions / "old.jsonl", openclaw("old", "2023-06-02", _talk(EVIDENCE)))
    gone = write(sessions / "gone.jsonl", openclaw("gone", "2023-06-03", _talk(EVIDENCE)))
    write(sessions / "new.jsonl", openclaw("new", "2023-06-04", _talk(EVIDENCE)))
    workspace = {"agent": "main", "path": ws, "sessions": sessions}
    indexer = make_indexer([workspace])
    index_once(indexer)
    assert {p.get("session_id") for p in _points(indexer, "sessions-main")} == {"old", "gone", "new"}
    gone.unlink()
    index_once(indexer)
    assert {p.get("session_id") for p in _points(indexer, "sessions-main")} == {"old", "new"}
    indexer.close()
    again = make_indexer([{**workspace, "sessions_max_age_days": 7}])
    index_once(again)
    assert {p.get("session_id") for p in _points(again, "sessions-main")} == {"old", "new"}
    month_ago = time.time() - 30 * 86400
    os.utime(old, (month_ago, month_ago))  # it ages past the retention; its stat is what the scan compares
    assert old in again.scan()
    index_once(again)
    assert {p.get("session_id") for p in _points(again, "sessions-main")} == {"new"}


CLAUDE = [
    {"type": "summary", "summary": "Fixing the flaky deploy", "leafUuid": "u4"},
    {"parentUuid": None, "isSidechain": False, "userType": "external", "cwd": "/src/app", "sessionId": "cc-1",
     "version": "1.0.0", "type": "user", "message": {"role": "user", "content": "Why does the canary deploy of "
                                                                                "the billing service keep failing?"},
     "uuid": "u1", "timestamp": "2025-03-04T09:15:00.000Z"},
    {"parentUuid": "u1", "isSidechain": False, "sessionId": "cc-1", "type": "assistant", "uuid": "u2",
     "timestamp": "2025-03-04T09:15:05.000Z", "message": {"role": "assistant", "model": "m", "content": [
         {"type": "thinking", "thinking": "PRIVATETHOUGHT"},
         {"type": "text", "text": "Let me read the rollout config."},
         {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "TOOLCALLWORD.yaml"}}]}},
    {"parentUuid": "u2", "sessionId": "cc-1", "type": "user", "uuid": "u3", "timestamp": "2025-03-04T09:15:06.000Z",
     "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                              "content": "TOOLOUTPUTWORD canary: 5%"}]}},
    {"parentUuid": "u3", "sessionId": "cc-1", "type": "user", "isMeta": True, "uuid": "u3b",
     "timestamp": "2025-03-04T09:15:07.000Z", "message": {"role": "user", "content": "METACAVEAT injected"}},
    {"parentUuid": "u3", "sessionId": "cc-1", "type": "assistant", "uuid": "u4",
     "timestamp": "2025-03-04T09:16:00.000Z", "message": {"role": "assistant", "content": [
         {"type": "text", "text": "The health check times out after 2 seconds; the billing pods need 5 to warm."}]}},
]


def test_claude_code_transcripts_are_read_by_their_plugin(make_indexer, tmp_path) -> None:
    ws, project = tmp_path / "ws", tmp_path / ".claude" / "projects" / "-src-app"
    write(ws / "MEMORY.md", "# Memory\n")
    path = write(project / "cc-1.jsonl", "".join(json.dumps(r) + "\n" for r in CLAUDE))
    head = path.read_bytes()[:512]
    assert ClaudeCodeTranscripts().sniff(head) and not OpenClawTranscripts().sniff(head)
    indexer = make_indexer([{"agent": "main", "path": ws, "sessions": project}])
    index_once(indexer)
    points = _points(indexer, "sessions-main")
    text = " ".join(p.text for p in points)
    assert "user: Why does the canary deploy" in text and "assistant: The health check times out" in text
    for noise in ("PRIVATETHOUGHT", "TOOLCALLWORD", "TOOLOUTPUTWORD", "METACAVEAT"):
        assert noise not in text
    hit = indexer.view.searcher().answer(SearchRequest(query="why the canary deploy fails", k=1)).hits[0]
    assert hit["session_id"] == "cc-1" and hit["session_time"] == "2025-03-04T09:15:00Z"
    page = LocalMemory(indexer.view).get(GetRequest(path=str(path)))
    assert "L2 [2025-03-04 09:15] user: Why does the canary" in page["text"]  # not "user (user)"


def test_sniffing_tells_transcripts_from_other_json() -> None:
    openclaw_head = openclaw("s", "2023-06-02", _talk("x")).encode()[:512]
    assert OpenClawTranscripts().sniff(openclaw_head) and not ClaudeCodeTranscripts().sniff(openclaw_head)
    for other in (b'{\n  "agent:main:main": {"sessionId": "x"}\n}', b'{"cpu": 1}\n', b"4242\n", b"",
                  b'{"display": "ls", "timestamp": 1, "project": "/x"}\n'):
        assert not OpenClawTranscripts().sniff(other) and not ClaudeCodeTranscripts().sniff(other), other


def test_sessions_is_a_collection_and_a_tenancy_kind_of_its_own(tmp_path) -> None:
    from indexer.config import Workspace

    ws = Workspace(agent="main", path=tmp_path / "ws", sessions=Path("~/.openclaw/agents/main/sessions"))
    collections = plan_collections([ws, Workspace(agent="other", path=tmp_path / "o")], prefix="lab-")
    sessions = collections[2]
    assert (sessions.name, sessions.role, sessions.corpus) == ("lab-sessions-main", "sessions", "sessions")
    assert sessions.root == Path.home() / ".openclaw" / "agents" / "main" / "sessions"
    assert [c.role for c in collections] == ["root", "dir", "sessions", "root", "dir"]
    assert shared_collection("lab-sessions-main", "m").startswith("qmd-shared-sessions-")
    assert shared_collection("memory-dir-sessions", "m").startswith("qmd-shared-dir-")
    # an id sanitising changes gets the same hashed slug as its memory collections (indexer.workspace.agent_slug)
    bob = plan_collections([Workspace(agent="Bob", path=tmp_path / "b", sessions=Path("s"))])
    assert bob[2].name == bob[1].name.replace("memory-dir-", "sessions-") == f"sessions-{agent_slug('Bob')}"


def test_the_http_api_and_the_mcp_tool_take_corpus(make_indexer, agent) -> None:
    from fastapi.testclient import TestClient

    from indexer.server import create_app

    indexer = make_indexer([agent])
    index_once(indexer)
    with TestClient(create_app(indexer.view), base_url="http://127.0.0.1:8743") as client:
        sessions = client.post("/search", json={"query": "kayak race ferry", "corpus": "sessions"}).json()["hits"]
        memory = client.post("/search", json={"query": "kayak race ferry", "corpus": "memory"}).json()["hits"]
        assert {h["collection"] for h in sessions} == {"sessions-main"}
        assert sessions[0]["session_id"] == SESSION
        assert memory and "sessions-main" not in {h["collection"] for h in memory}
        assert client.post("/search", json={"query": "x", "corpus": "chats"}).status_code == 422
        listed = client.post("/recall", json={"query": "*", "corpus": "sessions"}).json()["hits"]
        assert [h["session_id"] for h in listed] == [SESSION]
        page = client.get("/get", params={"path": sessions[0]["path"], "from": 1, "lines": 5}).json()
        assert page["text"].startswith("L4 [2023-06-02 ")


def test_the_command_line_takes_corpus() -> None:
    import click

    from indexer.cli import _request, _search_request

    assert _search_request("ferry", {"corpus": "sessions", "kind": ()}).corpus == "sessions"
    assert _request("RecallRequest", query="*", corpus="memory").corpus == "memory"
    with pytest.raises(click.UsageError, match="--corpus"):
        _request("SearchRequest", query="x", corpus="chats")


def test_a_missing_sessions_folder_is_a_problem_until_it_appears(make_indexer, tmp_path) -> None:
    ws, sessions = tmp_path / "ws", tmp_path / "not-yet"
    write(ws / "MEMORY.md", "# Memory\n")
    indexer = make_indexer([{"agent": "main", "path": ws, "sessions": sessions}])
    status = index_once(indexer)
    assert [(p["kind"], p["path"]) for p in status["problems"]] == [("sessions_path_missing", str(sessions))]
    write(sessions / "s.jsonl", openclaw("s", "2023-06-02", _talk(EVIDENCE)))
    status = index_once(indexer)
    assert status["problems"] == [] and status["collections"]["sessions-main"]["files"] == 1
