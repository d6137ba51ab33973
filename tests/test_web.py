"""The web page at ``GET /`` (``indexer/web``): its files hold no data and carry a strict Content-Security-Policy, and,
in a real headless browser (Debian's chromium and chromedriver, through selenium) over a real daemon (``qmd-indexer
run`` with a token), it asks for the token before showing anything, searches and marks the query's words, opens a
hit in the file view with its lines highlighted and pages on, shows the status change after a note is edited, and
renders a note holding HTML as text.

Screenshots of the search, file and status views go to ``$QMD_SCREENSHOTS`` when set (docs/img holds the ones the
docs show), else to the test's temporary folder."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import wait_for, write
from fastapi.testclient import TestClient
from server_process import free_port
from test_sessions import openclaw

from indexer.server import PAGE_FILES, create_app

TOKEN = "web-page-test-token"
XSS = '<img src=x onerror="window.__xss = 1; document.title = \'owned\'">'
LOG_LINES = 260  # more than one page of the file view (200 lines)
PICTURE_TEXT = "Osprey nest camera moved to the north mast"  # drawn in a picture, read by OCR
INSTALL = ("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver) and selenium "
           "(the test extra: make install)")


# -- the page's files, in-process (no browser) -------------------------------------------------------------------
def test_the_page_holds_no_data_and_allows_only_its_own_files(make_indexer, workspace: Path) -> None:
    """With a token set, ``/`` and its script and style answer without it (they hold no data: no note, no path of
    the workspace), every API route still needs it, and the CSP lets the page load only its own files."""
    indexer = make_indexer([{"agent": "main", "path": workspace}], token=TOKEN)
    with TestClient(create_app(indexer.view), base_url="http://127.0.0.1:8743") as client:
        for route in PAGE_FILES:
            answer = client.get(route)
            assert answer.status_code == 200, (route, answer.text)
            csp = answer.headers["content-security-policy"]
            assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe" not in csp
            assert answer.headers["x-content-type-options"] == "nosniff"
            assert str(workspace) not in answer.text and "Tuesday" not in answer.text
            own = answer.text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # the icon's namespace: no fetch
            assert not re.findall(r"https?://", own), route  # nothing fetched from elsewhere
        assert "<script src=\"/web/app.js\"" in client.get("/").text and "<script>" not in client.get("/").text
        assert "innerHTML" not in client.get("/web/app.js").text  # note text is set as text, never parsed
        for route in ("/status", "/health", "/get?path=MEMORY.md"):
            assert client.get(route).status_code == 401, route
        assert client.post("/search", json={"query": "deploy"}).status_code == 401
        assert client.post("/", json={}).status_code == 401  # only a GET of the page's files goes without the token
        assert client.get("/", headers={"host": "evil.example:8743"}).status_code == 403  # the Host guard holds


def test_on_a_lan_address_the_page_may_call_the_api_and_no_other_origin_may(make_indexer, workspace: Path) -> None:
    """Bound to all interfaces (with a token), the page opened at a LAN address sends that address as its Origin:
    the daemon's own origin is accepted; another LAN origin, or a DNS name, is not."""
    indexer = make_indexer([{"agent": "main", "path": workspace}], token=TOKEN, host="0.0.0.0", port=8743)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app(indexer.view), base_url="http://192.168.7.20:8743") as client:
        own = client.post("/search", json={"query": "deploy"}, headers={**auth, "Origin": "http://192.168.7.20:8743"})
        assert own.status_code == 200, own.text
        for origin in ("http://192.168.7.21:8743", "http://192.168.7.20:8744", "http://evil.example:8743"):
            answer = client.post("/search", json={"query": "deploy"}, headers={**auth, "Origin": origin})
            assert answer.status_code == 403, origin


# -- a real daemon in a real browser -----------------------------------------------------------------------------
def _browser_or_skip() -> tuple[Any, str, str]:
    """selenium's webdriver module and the chromium and chromedriver paths; skips (fails under CI=true) without."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    try:
        from selenium import webdriver
    except ImportError:
        webdriver = None
    if webdriver is None or chromium is None or driver is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the browser tests cannot run: {INSTALL}")
        pytest.skip(INSTALL)
    return webdriver, chromium, driver


class Daemon:
    """``qmd-indexer run`` over a workspace of its own, with ``TOKEN``; stderr goes to a file."""

    def __init__(self, base: Path) -> None:
        self.ws = base / "ws"
        write(self.ws / "MEMORY.md", "# Memory\n\nDeploy windows are Tuesday and Thursday mornings.\n")
        write(self.ws / "memory" / "incidents.md",
              "# Incidents\n\nACME-4471: the export job ran out of disk on batch-02.\nFixed by a larger volume.\n")
        write(self.ws / "memory" / "log.md", "# Log\n\n" + "".join(
            "The zebra crossing permit was renewed at the town hall.\n" if i == 230 else f"routine entry {i}\n"
            for i in range(1, LOG_LINES + 1)))
        write(self.ws / "memory" / "html.md", f"# Pasted\n\nA pasted snippet with a broken tag {XSS} in it.\n")
        self.picture = self.ws / "memory" / "screens" / "osprey.png"
        self.picture.parent.mkdir(parents=True)
        from qmd_indexer_image.screenshots import render, save

        save(render([PICTURE_TEXT])[0], self.picture)
        config = base / "config.toml"  # the image plugin reads the pictures of memory/ (OCR; no CLIP model here)
        sessions = base / "sessions"  # one OpenClaw transcript: the status view counts its session and turns
        write(sessions / "5f1c0d2e-7a43-4b8e-9c61-0d2f3a4b5c6d.jsonl", openclaw(
            "5f1c0d2e-7a43-4b8e-9c61-0d2f3a4b5c6d", "2026-11-30",
            [("Caroline", "Can we move the deploy window?"), ("Melanie", "Thursday morning works."),
             ("Caroline", "Did the harbour office stamp the kayak regatta permit?"), ("Melanie", "Yes, on Monday."),
             ("Caroline", "Then the boats can launch at nine."), ("Melanie", "I will tell the crew.")],
            tool_every=1))  # a tool call and its result after every turn: JSONL lines no row of the page shows
        config.write_text(f'plugins = ["image"]\n[[workspace]]\nagent = "main"\npath = "{self.ws}"\n'
                          f'sessions = "{sessions}"\n'
                          'multimodal = { enabled = true, modalities = ["image"] }\n')
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = base / "run.log"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HOME": str(base), "QMD_INDEXER_TOKEN": TOKEN,
               "QMD_INDEXER_PRECISION": "fp32"}
        env.pop("QMD_INDEXER_CONFIG", None)
        with open(self.log, "w") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "indexer.cli", "run", "--config", str(config),
                 "--state-dir", str(base / "state"), "--port", str(self.port)],
                stdout=subprocess.DEVNULL, stderr=stderr, env=env)

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=2).json()[
                "ready"]
        except httpx.HTTPError:
            assert self.proc.poll() is None, self.log.read_text()
            return False


@pytest.fixture(scope="module", name="daemon")
def daemon_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    _browser_or_skip()
    pytest.importorskip("qmd_indexer_image", reason="the image plugin (make install) draws and reads the picture")
    from qmd_indexer_image.screenshots import ocr_missing

    if (missing := ocr_missing("eng")) is not None:
        pytest.skip(missing)
    daemon = Daemon(tmp_path_factory.mktemp("web"))
    try:
        wait_for(daemon.ready, timeout_s=180, interval_s=0.2)
        yield daemon
    finally:
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.proc.wait(60)


@pytest.fixture(scope="module", name="browser")
def browser_fixture(daemon: Daemon) -> Iterator[Any]:
    """Headless chromium at 1200x800 (the screenshots' size)."""
    webdriver, chromium, driver = _browser_or_skip()
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,800",
                "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    browser = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 1200, "height": 800, "deviceScaleFactor": 1, "mobile": False})
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture(scope="module", name="shots")
def shots_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ.get("QMD_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _visible(browser: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By

    found = [e for e in browser.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()]
    return found[0] if found else None


def _texts(browser: Any, css: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.text for e in browser.find_elements(By.CSS_SELECTOR, css)]


def _fetch_status(browser: Any) -> int:
    """The HTTP status of ``GET /status`` fetched from the page, as its script would, with no token."""
    return int(browser.execute_async_script(
        "const done = arguments[0]; fetch('/status', {cache: 'no-store'}).then(r => done(r.status))"))


def _search(browser: Any, query: str, mode: str = "") -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.find_element(By.CSS_SELECTOR, "nav button[data-view=search]").click()
    Select(browser.find_element(By.ID, "mode")).select_by_value(mode)
    box = browser.find_element(By.ID, "query")
    box.clear()
    box.send_keys(query)
    before = browser.execute_script("return document.getElementById('hits').firstChild")
    browser.find_element(By.CSS_SELECTOR, "#search-form button[type=submit]").click()
    wait_for(lambda: browser.execute_script("return document.getElementById('hits').firstChild") != before,
             timeout_s=30)


def test_1_without_the_token_the_page_shows_nothing(daemon: Daemon, browser: Any) -> None:
    """The page loads without the token but shows no data: it asks for the token, and the API refuses its calls."""
    browser.get(daemon.url + "/")
    wait_for(lambda: _visible(browser, "#token-form"), timeout_s=20)
    assert _visible(browser, "#main") is None
    assert browser.execute_script("return document.getElementById('status').childElementCount") == 0
    assert _fetch_status(browser) == 401
    assert "Tuesday" not in browser.page_source and str(daemon.ws) not in browser.page_source


def test_2_search_marks_the_query_words_and_shows_the_signals(daemon: Daemon, browser: Any, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "#token-form button").click()
    wait_for(lambda: _visible(browser, "#main") and browser.find_elements(By.CSS_SELECTOR, "#agent option"),
             timeout_s=20)
    assert _texts(browser, "#agent option") == ["main"]
    assert set(_texts(browser, "#collection option")) == {"all", "memory-root-main", "memory-dir-main", "sessions-main"}
    _search(browser, "export job out of disk")
    first = browser.find_element(By.CSS_SELECTOR, "#hits li.hit")
    assert first.find_element(By.CSS_SELECTOR, "button.open").text == "memory/incidents.md:1-4"
    assert {"export", "job", "disk"} <= {m.text.lower() for m in first.find_elements(By.TAG_NAME, "mark")}
    assert re.fullmatch(r"score \d\.\d{3}", first.find_element(By.CSS_SELECTOR, ".score").text)
    assert browser.execute_script(  # whole words only: no "out" marked inside "routine"
        "return [...document.querySelectorAll('#hits mark')].every(m => "
        "!/[\\p{L}\\p{N}_]$/u.test(m.previousSibling ? m.previousSibling.textContent : '') && "
        "!/^[\\p{L}\\p{N}_]/u.test(m.nextSibling ? m.nextSibling.textContent : ''))")
    signals = {e.get_attribute("data-signal"): e.text for e in browser.find_elements(By.CSS_SELECTOR, "#signals span")}
    assert signals["relevant"] == "relevant: yes" and signals["pending"] == "pending: none"
    browser.save_screenshot(str(shots / "web-search.png"))


def test_3_a_hit_opens_in_the_file_view_with_its_lines_highlighted(daemon: Daemon, browser: Any,
                                                                   shots: Path) -> None:
    from selenium.webdriver.common.by import By

    _search(browser, "zebra crossing permit", mode="keyword")
    hit = browser.find_element(By.CSS_SELECTOR, "#hits li.hit button.open")
    path, lines = hit.text.split(":")
    start, end = (int(n) for n in lines.split("-"))
    assert path == "memory/log.md" and start <= 232 <= end  # line 232: the permit (two heading lines before)
    assert _texts(browser, "#signals span[data-signal=relevant]") == ["relevant: not judged (keyword search)"]
    hit.click()
    wait_for(lambda: _visible(browser, "#view-file") and browser.find_elements(By.CSS_SELECTOR, "#file-text .hl"),
             timeout_s=20)
    highlighted = browser.execute_script(
        "return [...document.querySelectorAll('#file-text .hl')].map(e => Number(e.dataset.line))")
    assert highlighted == list(range(start, end + 1))
    assert browser.find_element(By.ID, "file-citation").text == f"memory/log.md#L{start}-L{end}"
    shown = browser.execute_script("return document.querySelector('#file-text [data-line=\"232\"] .tx').textContent")
    assert shown == "The zebra crossing permit was renewed at the town hall."
    browser.save_screenshot(str(shots / "web-file.png"))
    # paged like `get`: from the start, a page of 200 lines, then the next page to the end
    def shown_lines() -> list[int]:
        return browser.execute_script(
            "return [...document.querySelectorAll('#file-text .line')].map(e => Number(e.dataset.line))")

    browser.find_element(By.ID, "file-start").click()
    wait_for(lambda: shown_lines()[0] == 1)
    assert shown_lines() == list(range(1, 201))
    browser.find_element(By.ID, "file-next").click()
    wait_for(lambda: shown_lines()[0] == 201)
    assert shown_lines() == list(range(201, LOG_LINES + 3))
    assert not browser.find_element(By.ID, "file-next").is_enabled()


def test_4_the_status_view_changes_after_a_note_is_edited(daemon: Daemon, browser: Any, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    browser.find_element(By.CSS_SELECTOR, "nav button[data-view=status]").click()

    def count(field: str) -> int:  # read in one script: the view is redrawn every 2 s
        text = browser.execute_script(f"const c = document.querySelector("
                                      f"'#status tr[data-collection=memory-dir-main] td[data-field={field}]');"
                                      f"return c ? c.textContent : '-1'")
        return int(text)

    wait_for(lambda: count("files") == 4, timeout_s=20)  # three notes and the picture
    chunks = count("chunks")

    def read_facts() -> dict[str, str]:
        return browser.execute_script("return Object.fromEntries([...document.querySelectorAll('dd[data-fact]')]"
                                      ".map(e => [e.dataset.fact, e.textContent]))")

    # searches answer (ready) before the model has loaded, the query model being in the shared cache: health says
    # "degraded: model loading" until it has
    wait_for(lambda: read_facts().get("health") == "ok", timeout_s=120)
    facts = read_facts()
    assert facts["model"] == "sentence-transformers/all-MiniLM-L6-v2", facts
    assert facts["precision"] == "fp32" and facts["backend"] == "edge", facts
    assert facts["health"] == "ok" and facts["files failing"] == "0" and facts["drift"] == "none", facts
    assert browser.execute_script(  # the model's load has ended (while it runs: its step and percent)
        "return document.querySelector('#status tr[data-modality=text] td[data-field=load]').textContent") == "loaded"
    modes = browser.execute_script("return [...document.querySelectorAll('#status tr[data-root] td:nth-child(2)')]"
                                   ".map(e => e.textContent)")
    assert modes and set(modes) == {"native"}, modes
    write(daemon.ws / "memory" / "incidents.md", "# Incidents\n\nACME-4471: the export job ran out of disk.\n\n"
          + "".join(f"## Follow-up {i}\n\n" + "A longer postmortem paragraph about volumes. " * 40 + "\n\n"
                    for i in range(4)))
    write(daemon.ws / "memory" / "new.md", "# New\n\nA note written while the page was open.\n")
    wait_for(lambda: count("files") == 5 and count("chunks") > chunks + 1, timeout_s=60, interval_s=0.2)
    browser.save_screenshot(str(shots / "web-status.png"))


def test_5_a_note_holding_html_is_shown_as_text(daemon: Daemon, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    _search(browser, "pasted snippet broken tag", mode="keyword")
    first = browser.find_element(By.CSS_SELECTOR, "#hits li.hit")
    assert XSS in first.find_element(By.CSS_SELECTOR, "pre.snippet").text
    first.find_element(By.CSS_SELECTOR, "button.open").click()
    wait_for(lambda: _visible(browser, "#view-file") and XSS in browser.find_element(By.ID, "file-text").text,
             timeout_s=20)
    assert browser.find_elements(By.CSS_SELECTOR, "#hits img, #file-text img") == []  # nothing the note made
    assert not browser.find_element(By.ID, "file-picture").is_displayed()  # a note has no picture
    assert browser.execute_script("return window.__xss === undefined && document.title === 'qmd-indexer'")


def _shown(browser: Any) -> dict[str, Any]:
    """What the page shows now, read in one script: the visible view, the query box, the hits' buttons, the marked
    words and the file view's highlighted lines."""
    return browser.execute_script(
        "const visible = ['search', 'file', 'status'].find(v => !document.getElementById('view-' + v).hidden);"
        "return {view: visible, query: document.getElementById('query').value,"
        " mode: document.getElementById('mode').value, hash: location.hash,"
        " hits: [...document.querySelectorAll('#hits button.open')].map(b => b.textContent),"
        " marks: [...new Set([...document.querySelectorAll('#hits mark')].map(m => m.textContent.toLowerCase()))],"
        " lines: [...document.querySelectorAll('#file-text .hl')].map(e => Number(e.dataset.line))}")


def test_6_each_view_has_a_url_that_survives_reload_and_back_forward(daemon: Daemon, browser: Any,
                                                                      shots: Path) -> None:
    """A search, a file's line range and the status each have their own URL: opened as a bookmark, reloaded, or
    reached with back and forward, the page shows that view again (the token stays in the tab)."""
    bookmark = daemon.url + "/#/search?q=export+job+out+of+disk&mode=keyword&agent=main"
    browser.get(bookmark)
    wait_for(lambda: _shown(browser)["hits"], timeout_s=30)
    browser.refresh()
    wait_for(lambda: _shown(browser)["hits"] and _shown(browser)["query"], timeout_s=30)
    after = _shown(browser)
    assert after["view"] == "search" and after["query"] == "export job out of disk" and after["mode"] == "keyword"
    assert after["hits"][0].startswith("memory/incidents.md:") and browser.current_url == bookmark
    browser.save_screenshot(str(shots / "web-bookmark-after-reload.png"))

    _search(browser, "zebra crossing permit", mode="keyword")  # a second search: a second history entry
    assert "zebra" in _shown(browser)["hash"] and _shown(browser)["hits"][0].startswith("memory/log.md:")
    browser.back()
    wait_for(lambda: _shown(browser)["query"] == "export job out of disk"
             and _shown(browser)["hits"][0].startswith("memory/incidents.md:"), timeout_s=30)
    browser.forward()
    wait_for(lambda: _shown(browser)["query"] == "zebra crossing permit"
             and _shown(browser)["hits"][0].startswith("memory/log.md:"), timeout_s=30)

    browser.get(daemon.url + "/#/file?path=memory%2Fincidents.md&agent=main&lines=3-4")
    browser.refresh()
    wait_for(lambda: _shown(browser)["lines"] == [3, 4], timeout_s=30)
    assert _shown(browser)["view"] == "file"
    browser.get(daemon.url + "/#/status")
    browser.refresh()
    wait_for(lambda: _shown(browser)["view"] == "status" and _visible(browser, "#status table"), timeout_s=30)
    assert _texts(browser, "#status tr[data-sessions] td") == ["main", "1", "6"]
    browser.back()  # the file view again, from its URL
    wait_for(lambda: _shown(browser)["view"] == "file" and _shown(browser)["lines"] == [3, 4], timeout_s=30)


def test_7_only_the_query_terms_that_carry_meaning_are_marked_and_the_page_has_an_icon(daemon: Daemon,
                                                                                      browser: Any) -> None:
    _search(browser, "what is the job of the export", mode="keyword")
    marks = _shown(browser)["marks"]
    assert {"export", "job"} <= set(marks) and not {"what", "is", "the", "of"} & set(marks), marks
    icon = httpx.get(daemon.url + "/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert browser.execute_script("return document.querySelector('link[rel=icon]').href").endswith("/web/favicon.svg")


def test_8_a_picture_hit_shows_the_picture_and_the_text_read_from_it(daemon: Daemon, browser: Any,
                                                                     shots: Path) -> None:
    """A hit on a picture's OCR text opened in the file view showed a 403 (not a text file): now the picture itself
    (fetched with the token, shown as a blob) above the text read from it."""
    from selenium.webdriver.common.by import By

    _search(browser, "osprey nest camera north mast", mode="keyword")
    hit = browser.find_element(By.CSS_SELECTOR, "#hits li.hit button.open")
    assert hit.text.startswith("memory/screens/osprey.png:"), hit.text
    hit.click()
    wait_for(lambda: _visible(browser, "#file-picture") and browser.execute_script(
        "const p = document.getElementById('file-picture'); return p.complete && p.naturalWidth > 0"), timeout_s=20)
    assert browser.find_element(By.ID, "error").text == ""
    width, src = browser.execute_script(
        "const p = document.getElementById('file-picture'); return [p.naturalWidth, p.src]")
    from PIL import Image

    with Image.open(daemon.picture) as picture:
        assert width == picture.width and src.startswith("blob:")
    text = " ".join(_texts(browser, "#file-text .tx"))
    assert "Osprey" in text and "north mast" in text, text
    assert "the text read from it" in browser.find_element(By.ID, "file-meta").text
    browser.save_screenshot(str(shots / "web-picture.png"))


def test_9_a_transcript_hit_highlights_its_own_turns(daemon: Daemon, browser: Any, shots: Path) -> None:
    """A transcript page's rows are turns numbered by their JSONL lines (tool lines between them are not shown):
    the rows highlighted are the hit's lines, the answering turn among them, not rows counted from the page's
    first line."""
    from selenium.webdriver.common.by import By

    _search(browser, "kayak regatta permit harbour office", mode="keyword")
    hit = next(h for h in browser.find_elements(By.CSS_SELECTOR, "#hits li.hit button.open")
               if h.text.startswith("sessions/"))
    start, end = (int(n) for n in hit.text.rpartition(":")[2].split("-"))
    hit.click()
    wait_for(lambda: _visible(browser, "#view-file") and browser.find_elements(By.CSS_SELECTOR, "#file-text .hl"),
             timeout_s=20)
    rows = browser.execute_script("return [...document.querySelectorAll('#file-text .line')].map(e => "
                                  "[Number(e.dataset.line), e.classList.contains('hl'), "
                                  "e.querySelector('.tx').textContent])")
    for line, _, text in rows:
        assert text.startswith(f"L{line} "), (line, text)  # each row carries its own JSONL line
    lit = [(line, text) for line, hl, text in rows if hl]
    assert lit and all(start <= line <= end for line, _ in lit)
    assert any("regatta" in text for _, text in lit), lit
    browser.save_screenshot(str(shots / "web-transcript.png"))
