"""Conversation memory: logs of turns cut into windows of whole turns, each chunk knowing its date and speakers,
questions about a time favouring the notes of that time, hits that show a whole window once."""

from __future__ import annotations

import datetime

import pytest
from conftest import write

from indexer import conversation
from indexer.conversation import is_conversation, turn_speaker, turn_windows
from indexer.dates import date_words, note_date, query_period
from indexer.hits import narrowed
from indexer.points import Hit, Payload
from indexer.ranking import NARROWED_EXPONENT, boost_period, collapse
from indexer.schema import SearchRequest
from indexer.sections import chunk_markdown
from indexer.worker import index_once

NAMES = ("Caroline", "Melanie")
TOPICS = ["the support group", "a painting of a lake", "counseling jobs", "the camping trip", "pottery class",
          "the adoption agency", "a charity race", "the kids' school", "a book about hope", "the beach"]


def _log(day: str, n_turns: int = 20) -> str:
    turns = [f"- {NAMES[i % 2]}: I keep thinking about {TOPICS[i % len(TOPICS)]}, turn {i + 1} of our talk."
             for i in range(n_turns)]
    return f"# {day}\n\nConversation between Caroline and Melanie, 1:56 pm.\n\n" + "\n".join(turns) + "\n"


@pytest.fixture(name="embedder")
def embedder_fixture(registry):
    return registry.embedders["text"]


@pytest.mark.parametrize(("line", "speaker"), [
    ("- Caroline: I went to a support group yesterday.", "Caroline"),
    ("Caroline: hi there", "Caroline"),
    ("[10:42] Dana Scully: the deploy is done", "Dana Scully"),
    ("10:42 - Dana: shipped", "Dana"),
    ("**user**: what is the plan?", "user"),
    ("* assistant: here it is", "assistant"),
    ("- Zoë: ça va?", "Zoë"),
    ("- [10:02] 小王：明天上午十点开会。", "小王"),  # the full-width colon of Chinese, no space after it
    ("老李：好的", "老李"),
    ("**小王**：收到", "小王"),
])
def test_a_turn_names_its_speaker(line: str, speaker: str) -> None:
    assert turn_speaker(line) == speaker


@pytest.mark.parametrize("line", ["# 2023-05-08", "see http://example.com/x", "  - Format: `YYYY-Www`",
                                  "Note:", "- a long list item without a speaker", "Line 1: step one",
                                  "- Four words name here: no"])
def test_other_lines_are_no_turns(line: str) -> None:
    assert turn_speaker(line) is None


def test_a_log_is_a_conversation_and_a_list_of_fields_is_not() -> None:
    assert is_conversation(_log("2023-05-08").splitlines())
    fields = ["- Decision: deploys on Tuesday", "- Owner: Dana", "- Ticket: ACME-4471", "- Status: open",
              "- Due: Friday", "- Risk: low"]
    assert not is_conversation(fields)
    output = ["```text", *[f"{w}: 4tNIzakiWp took 12 ms" for w in ("Search", "Render") * 4], "```"]
    assert not is_conversation(output)  # program output in a code block
    assert not is_conversation(["- Dana: hi", "- Sam: hello", "- Dana: bye"])  # too short to tell


def test_turn_windows_hold_whole_turns_with_overlap_and_cover_every_turn() -> None:
    windows = turn_windows([10] * 12, budget=1000, size=5, overlap=2)
    assert windows == [(0, 4), (3, 7), (6, 10), (9, 11)]
    # the token budget ends a window early; a turn over the budget is a window of its own
    assert turn_windows([10, 10, 200, 10], budget=100, size=5, overlap=2) == [(0, 1), (2, 2), (3, 3)]
    with pytest.raises(ValueError):
        turn_windows([1], budget=10, size=3, overlap=3)


def test_a_log_is_cut_into_windows_of_whole_turns_that_know_when_and_who(embedder) -> None:
    text = _log("2023-05-08")
    chunks = chunk_markdown(text, embedder.token_offsets, embedder.max_tokens, "memory/2023-05-08.md")
    lines = text.split("\n")
    turn_lines = {n for n, line in enumerate(lines, 1) if turn_speaker(line)}
    covered = set()
    for chunk in chunks:
        span = set(range(chunk.start_line, chunk.end_line + 1))
        covered |= span
        assert len(span & turn_lines) <= conversation.WINDOW_TURNS
        assert chunk.text == "\n".join(lines[chunk.start_line - 1 : chunk.end_line])  # whole lines, never split
        assert chunk.context.startswith("2023-05-08\nMonday, 8 May 2023\n")
        assert set(chunk.speakers) == set(NAMES) and chunk.context.endswith("Caroline, Melanie") \
            or chunk.context.endswith("Melanie, Caroline")
        assert chunk.date == "2023-05-08"
        assert chunk.n_tokens <= embedder.max_tokens
    assert turn_lines <= covered
    for before, after in zip(chunks, chunks[1:]):  # consecutive windows share OVERLAP_TURNS turns
        shared = set(range(after.start_line, before.end_line + 1)) & turn_lines
        assert len(shared) == conversation.OVERLAP_TURNS


def test_a_chinese_log_is_cut_into_windows_that_name_its_speakers(embedder) -> None:
    """A log written ``- [10:0n] 小王：...`` (full-width colon, no space) is a conversation as an English one is:
    windows of whole turns, each naming its speakers in its context, dated by the note's name."""
    said = ["周五的发布要推迟吗？", "要推迟，测试环境还没准备好。", "那改到下周一上午。", "好的，我通知运维。",
            "顺便把回滚脚本也检查一下。", "没问题，今天下班前完成。", "数据库备份呢？", "昨晚已经做完了。"]
    turns = [f"- [10:0{n}] {('小王', '老李')[n % 2]}：{what}" for n, what in enumerate(said)]
    text = "# 2026-10-21 周三\n\n" + "\n".join(turns) + "\n"
    assert is_conversation(text.splitlines()[2:])
    chunks = chunk_markdown(text, embedder.token_offsets, embedder.max_tokens, "memory/2026-10-21.md")
    assert len(chunks) == 3  # the title and 8 turns: windows of 5 units sharing 2
    for chunk in chunks:
        assert sum(1 for line in chunk.text.splitlines() if turn_speaker(line)) <= conversation.WINDOW_TURNS
        assert set(chunk.speakers) == {"小王", "老李"} and chunk.date == "2026-10-21"
        assert chunk.context.startswith("2026-10-21")


def test_a_turn_longer_than_the_window_is_cut_and_other_notes_keep_their_chunking(embedder) -> None:
    long_turn = "- Melanie: " + " ".join(f"word{i}" for i in range(600))
    text = _log("2023-05-09", 6).rstrip("\n") + "\n" + long_turn + "\n- Caroline: wow.\n"
    chunks = chunk_markdown(text, embedder.token_offsets, embedder.max_tokens, "memory/2023-05-09.md")
    long_line = text.split("\n").index(long_turn) + 1
    parts = [c for c in chunks if c.start_line == c.end_line == long_line]
    assert len(parts) >= 3 and all(c.n_tokens <= embedder.max_tokens for c in chunks)
    plain = "# Deploys\n\n- Decision: Tuesdays\n- Owner: Dana\n- Ticket: ACME-4471\n- Status: open\n"
    [chunk] = chunk_markdown(plain, embedder.token_offsets, embedder.max_tokens, "memory/deploys.md")
    assert chunk.speakers == () and chunk.date == "" and chunk.start_line == 1 and chunk.end_line == 6


def test_a_note_is_dated_by_its_name_its_front_matter_or_its_heading() -> None:
    assert note_date("memory/2023-05-08.md") == datetime.date(2023, 5, 8)
    assert note_date("memory/log.md", datetime.date(2024, 2, 29)) == datetime.date(2024, 2, 29)
    assert note_date("memory/log.md", "2024-03-01T10:00:00") == datetime.date(2024, 3, 1)
    assert note_date("memory/log.md", None, "Standup 2024-03-04") == datetime.date(2024, 3, 4)
    assert note_date("memory/2023-13-45.md") is None and note_date("memory/log.md") is None
    assert date_words(datetime.date(2023, 5, 8)) == "Monday, 8 May 2023"


def test_front_matter_dates_a_note(embedder) -> None:
    text = "---\ndate: 2024-02-29\n---\n# Standup\n\n- Dana: the canary is green.\n"
    [chunk] = chunk_markdown(text, embedder.token_offsets, embedder.max_tokens, "memory/standup.md")
    assert chunk.date == "2024-02-29" and "Thursday, 29 February 2024" in chunk.context


AS_OF = datetime.datetime(2023, 11, 1, 12, 0)


@pytest.mark.parametrize(("query", "first", "last"), [
    ("What did Audrey eat for dinner on October 24, 2023?", "2023-10-24", "2023-10-24"),
    ("what did Mel paint in July 2023?", "2023-07-01", "2023-07-31"),
    ("how many times did she go to the beach in 2023", "2023-01-01", "2023-12-31"),
    ("what did we decide last week?", "2023-10-23", "2023-10-29"),
    ("what happened yesterday", "2023-10-31", "2023-10-31"),
    ("what did Dana say two days ago", "2023-10-30", "2023-10-30"),
    ("when did she go camping in June?", "2023-06-01", "2023-06-30"),
])
def test_a_question_names_the_days_it_asks_about(query: str, first: str, last: str) -> None:
    assert query_period(query, AS_OF) == (datetime.date.fromisoformat(first), datetime.date.fromisoformat(last))


@pytest.mark.parametrize(("query", "first", "last"), [  # AS_OF is Wednesday 1 November 2023
    ("我10月3日做了什么？", "2023-10-03", "2023-10-03"),
    ("小王12月5号说了什么", "2022-12-05", "2022-12-05"),  # the latest 5 December not after as_of
    ("2023年5月的预算是多少", "2023-05-01", "2023-05-31"),
    ("上周二开会说了什么", "2023-10-24", "2023-10-24"),
    ("上周的会议", "2023-10-23", "2023-10-29"),  # Monday to Sunday, as "last week"
    ("昨天小王说了什么", "2023-10-31", "2023-10-31"),
    ("前天的账单", "2023-10-30", "2023-10-30"),
    ("三天前的事", "2023-10-29", "2023-10-29"),
    ("上个月的营业额", "2023-10-01", "2023-10-31"),
    ("去年的体检", "2022-01-01", "2022-12-31"),
    ("What did Xiao Wang say 上周二?", "2023-10-24", "2023-10-24"),
])
def test_a_chinese_question_names_the_days_it_asks_about(query: str, first: str, last: str) -> None:
    assert query_period(query, AS_OF) == (datetime.date.fromisoformat(first), datetime.date.fromisoformat(last))


@pytest.mark.parametrize("query", ["小王喜欢喝什么茶？", "周末", "2月30日的事"])
def test_a_chinese_question_without_a_time_names_none(query: str) -> None:
    assert query_period(query, AS_OF) is None


@pytest.mark.parametrize("query", ["How may I help?", "what did we say about the second deploy?",
                                   "Which year did Audrey adopt her dogs?", "deploy windows"])
def test_a_question_without_a_time_names_none(query: str) -> None:
    assert query_period(query, AS_OF) is None


def _hit(id_: str, score: float, path: str, start: int, end: int, day: str = "") -> Hit:
    return Hit(id_, score, Payload(path=path, start_line=start, end_line=end,
                                   extra={"note_date": day} if day else {}))


def test_a_period_boosts_the_notes_dated_in_it_and_keeps_the_others() -> None:
    hits = [_hit("a", 2.0, "memory/2023-05-01.md", 1, 5, "2023-05-01"),
            _hit("b", 1.5, "memory/2023-06-02.md", 1, 5, "2023-06-02"), _hit("c", 1.2, "MEMORY.md", 1, 3)]
    period = (datetime.date(2023, 6, 1), datetime.date(2023, 6, 30))
    assert [(h.id, h.score) for h in boost_period(hits, period, 1.0)] == [("b", 3.0), ("a", 2.0), ("c", 1.2)]


def test_a_hit_showing_lines_a_better_hit_shows_drops_out() -> None:
    hits = [_hit("a", 3.0, "memory/x.md", 5, 9), _hit("b", 2.0, "memory/x.md", 8, 12),
            _hit("c", 1.5, "memory/x.md", 10, 14), _hit("d", 1.0, "memory/y.md", 5, 9)]
    kept = collapse(hits, lambda h: (h.payload.start_line, h.payload.end_line))
    assert [h.id for h in kept] == ["a", "c", "d"]


def _window(id_: str, score: float, start: int, turns: list[str], path: str = "memory/2023-05-08.md") -> Hit:
    """A conversation window of a log (its text the file's lines from ``start``), as a hit."""
    speakers = sorted({t.split(":")[0].lstrip("- ") for t in turns})
    return Hit(id_, score, Payload(path=path, start_line=start, end_line=start + len(turns) - 1,
                                   text="\n".join(turns), extra={"speakers": speakers}))


def test_a_window_overlapping_a_better_hit_shows_only_its_turns_that_hit_does_not() -> None:
    turns = [f"- {'Caroline' if n % 2 else 'Melanie'}: turn {n}" for n in range(1, 12)]
    hits = [_window("a", 3.0, 1, turns[0:5]), _window("b", 2.0, 4, turns[3:8]), _window("c", 1.2, 7, turns[6:11]),
            _window("d", 1.0, 1, turns[0:5], path="memory/2023-06-02.md")]
    kept = collapse(hits, lambda h: (h.payload.start_line, h.payload.end_line), narrow=narrowed)
    # b keeps turns 6-8 (3 of its 5) at 2.0 * (3/5) ** 0.5 = 1.55, still above c, which then keeps 9-11 (0.93)
    assert [(h.id, h.payload.start_line, h.payload.end_line) for h in kept] == [
        ("a", 1, 5), ("b", 6, 8), ("d", 1, 5), ("c", 9, 11)]
    b = kept[1]
    assert b.payload.text == "\n".join(turns[5:8])
    assert b.score == pytest.approx(2.0 * (3 / 5) ** NARROWED_EXPONENT)
    assert kept[3].score == pytest.approx(1.2 * (3 / 5) ** NARROWED_EXPONENT)
    # every turn of the log is shown exactly once
    shown = sorted(n for h in kept if h.payload.path.endswith("05-08.md")
                   for n in range(h.payload.start_line, h.payload.end_line + 1))
    assert shown == list(range(1, 12))


def test_a_narrowed_window_yields_its_turns_only_to_hits_that_end_up_better() -> None:
    turns = [f"- {'Caroline' if n % 2 else 'Melanie'}: turn {n}" for n in range(1, 12)]
    # b narrowed (2.0 -> 1.55) falls below c (1.9): c is taken whole first, and b keeps what c leaves, turn 6
    hits = [_window("a", 3.0, 1, turns[0:5]), _window("b", 2.0, 4, turns[3:8]), _window("c", 1.9, 7, turns[6:11])]
    kept = collapse(hits, lambda h: (h.payload.start_line, h.payload.end_line), narrow=narrowed)
    assert [(h.id, h.payload.start_line, h.payload.end_line) for h in kept] == [("a", 1, 5), ("c", 7, 11), ("b", 6, 6)]
    assert kept[2].score == pytest.approx(2.0 * (1 / 5) ** NARROWED_EXPONENT)


def test_narrowing_lowers_a_negative_score_too() -> None:
    turns = [f"- {'Caroline' if n % 2 else 'Melanie'}: turn {n}" for n in range(1, 9)]
    hits = [_window("a", -0.02, 1, turns[0:5]), _window("b", -0.04, 4, turns[3:8]),
            _window("x", -0.05, 1, turns[0:4], path="memory/2023-06-02.md")]
    kept = collapse(hits, lambda h: (h.payload.start_line, h.payload.end_line), narrow=narrowed)
    assert [h.id for h in kept] == ["a", "x", "b"]  # b: -0.04 / (3/5) ** 0.5 = -0.052, below x
    assert kept[2].score == pytest.approx(-0.04 / (3 / 5) ** NARROWED_EXPONENT)
    assert [h.score for h in kept] == sorted((h.score for h in kept), reverse=True)


def test_a_narrowed_hit_below_what_an_unread_candidate_may_score_drops_out() -> None:
    turns = [f"- {'Caroline' if n % 2 else 'Melanie'}: turn {n}" for n in range(1, 9)]
    hits = [_window("a", 3.0, 1, turns[0:5]), _window("b", 2.0, 4, turns[3:8]),
            _window("x", 1.8, 1, turns[0:4], path="memory/2023-06-02.md")]
    # b narrowed scores 1.55: a candidate after x (at most 1.8) that was not read could stand above it
    kept = collapse(hits, lambda h: (h.payload.start_line, h.payload.end_line), narrow=narrowed, settled=1.8)
    assert [h.id for h in kept] == ["a", "x"]
    kept = collapse(hits, lambda h: (h.payload.start_line, h.payload.end_line), narrow=narrowed, settled=1.5)
    assert [h.id for h in kept] == ["a", "x", "b"]


def test_a_narrowed_window_goes_below_a_hit_its_new_score_no_longer_beats() -> None:
    turns = [f"- {'Caroline' if n % 2 else 'Melanie'}: turn {n}" for n in range(1, 9)]
    other = _window("x", 2.5, 1, turns[0:4], path="memory/2023-06-02.md")
    hits = [_window("a", 3.0, 1, turns[0:5]), _window("b", 2.9, 4, turns[3:8]), other]
    kept = collapse(hits, lambda h: (h.payload.start_line, h.payload.end_line), narrow=narrowed)
    assert [h.id for h in kept] == ["a", "x", "b"]  # b: 2.9 * (3/5) ** 0.5 = 2.25 < 2.5


def test_a_hit_that_is_no_conversation_window_or_shows_nothing_new_drops_out() -> None:
    turns = [f"- {'Caroline' if n % 2 else 'Melanie'}: turn {n}" for n in range(1, 9)]
    hits = [_window("a", 3.0, 1, turns[0:5]), _window("inside", 2.0, 2, turns[1:4]),
            _hit("note", 1.5, "memory/2023-05-08.md", 3, 7)]
    kept = collapse(hits, lambda h: (h.payload.start_line, h.payload.end_line), narrow=narrowed)
    assert [h.id for h in kept] == ["a"]


def test_a_question_finds_the_window_and_a_time_favours_its_day(tmp_path, make_indexer) -> None:
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# Memory\n\n- I keep notes of the talks between Caroline and Melanie.\n")
    write(ws / "memory" / "2023-05-08.md", _log("2023-05-08"))
    evidence = "- Melanie: We finally booked the ferry to the island for the kayak race."
    day = _log("2023-06-02", 12).rstrip("\n") + "\n" + evidence + "\n- Caroline: Amazing, good luck!\n"
    write(ws / "memory" / "2023-06-02.md", day)
    # the same words on another day: only the date in the question tells them apart
    write(ws / "memory" / "2023-07-14.md", _log("2023-07-14", 4).rstrip("\n") + "\n" + evidence + "\n")
    indexer = make_indexer([{"agent": "main", "path": ws}])
    index_once(indexer)
    searcher = indexer.view.searcher()
    line = day.split("\n").index(evidence) + 1
    for as_of, query, want in [(None, "kayak race ferry in June 2023", "memory/2023-06-02.md"),
                               (None, "kayak race ferry on 14 July 2023", "memory/2023-07-14.md"),
                               ("2023-06-03", "the kayak race ferry yesterday", "memory/2023-06-02.md")]:
        answer = searcher.answer(SearchRequest(query=query, k=3, as_of=as_of))
        assert answer.hits[0]["path"] == want, (query, answer.hits)
        assert answer.relevant is True
    top = searcher.answer(SearchRequest(query="kayak race ferry in June 2023", k=5)).hits[0]
    assert top["start_line"] <= line <= top["end_line"] and top["end_line"] - top["start_line"] < 8
    assert top["snippet"] == "\n".join(day.split("\n")[top["start_line"] - 1 : top["end_line"]])  # shown whole
    hits = searcher.answer(SearchRequest(query="Caroline Melanie", k=10)).hits
    shown = [(h["path"], h["start_line"], h["end_line"]) for h in hits]
    for i, (path, a, b) in enumerate(shown):  # overlapping windows of one log never both fill the list
        assert not any(p == path and a <= d and c <= b for p, c, d in shown[:i])
