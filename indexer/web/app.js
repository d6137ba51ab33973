// The qmd-indexer web page: search, file and status views over the daemon's JSON API (/search, /get, /status,
// /health) on this origin. Note text is untrusted: everything is rendered with DOM APIs and textContent, never as
// HTML. The API token, when the daemon has one, is kept in sessionStorage (this tab only) and sent as a bearer token.
// Each view has its own URL, in the fragment (never sent to the server, so a query stays out of its logs):
// #/search?q=...&mode=...&corpus=...&agent=...&collection=..., #/file?path=...&agent=...&lines=3-5, #/status. A reload, a
// bookmark and back/forward show the same view again.
"use strict";

(() => {
  const TOKEN_KEY = "qmd-indexer-token";
  const REFRESH_MS = 2000; // status and health, without a reload
  const PAGE_LINES = 200; // lines of one file page (the API caps pages by characters too)
  const $ = (id) => document.getElementById(id);
  let timer = null;
  let file = null; // the open file: {path, agent, start, end, citation, next}
  let lastStatus = null;

  class Unauthorized extends Error {}

  // -- DOM helpers ----------------------------------------------------------------------------------------------
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (key.startsWith("data-") || key === "title") node.setAttribute(key, String(value));
      else node[key] = value;
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function table(headers, rows) {
    return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
      el("tbody", {}, rows));
  }

  function cell(value, field) {
    const props = typeof value === "number" ? { className: "num" } : {};
    if (field) props["data-field"] = field;
    return el("td", props, value === null || value === undefined ? "-" : value);
  }

  function facts(pairs) {
    return el("dl", { className: "facts" }, pairs.map(([k, v, cls]) => [el("dt", {}, k),
      el("dd", { className: cls || "", "data-fact": k }, v === null || v === undefined ? "-" : String(v))]));
  }

  function showError(message) {
    $("error").textContent = message || "";
  }

  // -- the API --------------------------------------------------------------------------------------------------
  // the JSON answer of path (a POST of body when given); with asBlob, the answer's bytes (a picture of /media)
  async function api(path, body, asBlob) {
    const headers = {};
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method: body === undefined ? "GET" : "POST", headers, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 401) {
      askToken(token ? "That token was refused." : "");
      throw new Unauthorized("token needed");
    }
    if (asBlob && response.ok) return response.blob();
    const data = await response.json().catch(() => ({}));
    if (!response.ok) {
      const detail = typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail || "");
      throw new Error(`${response.status}: ${detail || response.statusText}`);
    }
    return data;
  }

  function askToken(message) {
    if (timer !== null) clearInterval(timer);
    timer = null;
    $("main").hidden = true;
    $("token-form").hidden = false;
    $("token-error").textContent = message || "";
    $("health").textContent = "token needed";
    $("health").className = "badge warn";
    $("token").focus();
  }

  // -- views and their URLs -------------------------------------------------------------------------------------
  const VIEWS = ["search", "file", "status"];
  let lastSearch = ""; // the fragment of the last search and of the open file: the nav buttons go back to them
  let lastFile = "";

  function fragment(view, params) {
    const query = new URLSearchParams(Object.entries(params || {}).filter(([, v]) => v)).toString();
    return "#/" + view + (query ? "?" + query : "");
  }

  // go to a view's URL: a new history entry, then the view (the same URL again runs it again, as a new search does)
  function go(hash) {
    if (location.hash === hash) route();
    else location.hash = hash; // hashchange -> route()
  }

  // show the view the URL names, running its search or opening its file
  function route() {
    const [, view, query] = location.hash.match(/^#\/([a-z]+)\??(.*)$/) || [];
    const params = new URLSearchParams(query || "");
    if (view === "file" && params.get("path")) {
      const [start, end] = (params.get("lines") || "").split("-").map((n) => parseInt(n, 10));
      lastFile = location.hash;
      openFile({ path: params.get("path"), agent: params.get("agent") || "", start_line: start || 1,
        end_line: end || start || 0 });
    } else if (view === "status") {
      show("status");
    } else {
      show("search");
      const q = params.get("q");
      if (q === null) return;
      lastSearch = location.hash;
      $("query").value = q;
      $("mode").value = params.get("mode") || "";
      $("corpus").value = params.get("corpus") || "";
      for (const name of ["agent", "collection"]) {
        const value = params.get(name) || "";
        const select = $(name);
        if (value && ![...select.options].some((o) => o.value === value)) select.append(el("option", { value }, value));
        select.value = value;
      }
      runSearch(q, params);
    }
  }

  function show(view) {
    for (const button of document.querySelectorAll("nav button")) {
      button.setAttribute("aria-pressed", String(button.dataset.view === view));
    }
    for (const name of VIEWS) $("view-" + name).hidden = name !== view;
  }

  // -- search ---------------------------------------------------------------------------------------------------
  // the English stop words keyword search leaves out (Qdrant's BM25 default, as the daemon uses it): not marked
  const STOP_WORDS = new Set(("a about above after again against all am an and any are as at be because been " +
    "before being below between both but by can could did do does doing down during each few for from further " +
    "had has have having he her here hers herself him himself his how i if in into is it its itself just me more " +
    "most my myself no nor not now of off on once only or other our ours ourselves out over own same she should " +
    "so some such than that the their theirs them themselves then there these they this those through to too " +
    "under until up very was we were what when where which while who whom why will with would you your yours " +
    "yourself yourselves").split(" "));

  // the query's terms that carry meaning, longest first: words of two or more characters that are not stop words
  function queryWords(query) {
    const words = query.toLowerCase().split(/[^\p{L}\p{N}_-]+/u).filter((w) => w.length >= 2 && !STOP_WORDS.has(w));
    return [...new Set(words)].sort((a, b) => b.length - a.length);
  }

  // text with each whole-word occurrence of words as a <mark>, built as DOM nodes
  function marked(text, words) {
    if (!words.length) return [text];
    const escaped = words.map((w) => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    const edge = "[\\p{L}\\p{N}_]";
    const parts = text.split(new RegExp(`(?<!${edge})(${escaped.join("|")})(?!${edge})`, "giu"));
    return parts.map((part, i) => (i % 2 ? el("mark", {}, part) : part)).filter((p) => p !== "");
  }

  function signals(answer) {
    const out = [];
    if (answer.relevant === true) out.push(["relevant", "relevant: yes", "ok"]);
    else if (answer.relevant === false) {
      out.push(["relevant", "relevant: no (no hit reaches the relevance floor)", "warn"]);
    } else out.push(["relevant", "relevant: not judged (keyword search)", ""]);
    if (answer.relevance) {
      out.push(["relevance", `confidence: ${answer.relevance.level} (${answer.relevance.reason})`,
        answer.relevant === false ? "warn" : ""]);
    }
    if (answer.indexing) {
      out.push(["indexing", `indexing: first index still being built, ${answer.indexing.done} of ` +
        `${answer.indexing.total} file(s) done; the answer may miss notes`, "warn"]);
    }
    const pending = answer.pending || [];
    out.push(["pending", pending.length
      ? `pending: ${pending.length} file(s) changed and not indexed yet: ${pending.join(", ")}`
      : "pending: none", pending.length ? "warn" : "ok"]);
    if (answer.degraded) out.push(["degraded", "degraded: " + answer.degraded, "bad"]);
    return out.map(([name, text, cls]) => el("span", { className: cls, "data-signal": name }, text));
  }

  // the form: the search's URL (a history entry), which runs it
  function search(event) {
    event.preventDefault();
    const params = { q: $("query").value };
    for (const name of ["mode", "corpus", "agent", "collection"]) params[name] = $(name).value;
    go(fragment("search", params));
  }

  async function runSearch(query, params) {
    const body = { query, k: 10 };
    for (const name of ["mode", "corpus", "agent", "collection"]) {
      if (params.get(name)) body[name] = params.get(name);
    }
    try {
      const answer = await api("/search", body);
      const words = queryWords(query);
      $("signals").replaceChildren(...signals(answer));
      $("hits").replaceChildren(...(answer.hits.length ? answer.hits.map((hit) => hitItem(hit, words))
        : [el("li", { className: "muted" }, "No hits.")]));
      showError("");
    } catch (error) {
      if (!(error instanceof Unauthorized)) showError(error.message);
    }
  }

  function hitItem(hit, words) {
    const open = el("button", { type: "button", className: "open", title: "open " + hit.citation },
      `${hit.path}:${hit.start_line}-${hit.end_line}`);
    open.addEventListener("click", () => go(fragment("file", { path: hit.path, agent: hit.agent,
      lines: `${hit.start_line}-${hit.end_line}` })));
    const score = typeof hit.score === "number" ? hit.score.toFixed(3) : "-";
    return el("li", { className: "hit" },
      el("div", { className: "hit-head" }, open, el("span", { className: "score" }, "score " + score),
        el("span", { className: "muted" }, `${hit.agent} / ${hit.collection} / ${hit.kind}`
          + (hit.session_id ? ` / session ${hit.session_id} ${hit.session_time || ""} ${(hit.speakers || []).join(", ")}`
            : ""))),
      el("pre", { className: "snippet" }, marked(hit.snippet || "", words)));
  }

  // -- file -----------------------------------------------------------------------------------------------------
  function openFile(hit) {
    file = { path: hit.path, agent: hit.agent, start: hit.start_line, end: hit.end_line };
    $("file-citation").textContent = hit.end_line ? `${hit.path}#L${hit.start_line}-L${hit.end_line}` : hit.path;
    document.querySelector('nav button[data-view="file"]').disabled = false;
    show("file");
    loadPage(Math.max(1, hit.start_line - 10), true);
  }

  async function loadPage(from, scroll) {
    const params = new URLSearchParams({ path: file.path, from: String(from), lines: String(PAGE_LINES) });
    if (file.agent) params.set("agent", file.agent);
    try {
      const page = await api("/get?" + params.toString());
      const lines = page.text === "" && page.to < page.from ? [] : page.text.split("\n");
      // a transcript's rows are its turns, each starting "L<JSONL line> ": numbered by that line (the tool lines
      // between turns are not rows), a turn's further lines by its own; a note's rows count from page.from
      const transcript = /^sessions\/.*\.jsonl$/.test(page.path);
      let turn = page.from;
      $("file-text").replaceChildren(...lines.map((text, i) => {
        const own = transcript && /^L(\d+) /.exec(text);
        if (own) turn = Number(own[1]);
        const n = transcript ? turn : page.from + i;
        const hl = n >= file.start && n <= file.end;
        return el("div", { className: hl ? "line hl" : "line", "data-line": n },
          el("span", { className: "ln" }, n), el("span", { className: "tx" }, text));
      }));
      $("file-meta").textContent = `${page.path} (${page.collection}), ` + (page.kind
        ? `${page.kind}: ` + (lines.length ? "the text read from it" : "no text was read from it")
        : `lines ${page.from}-${page.to}`) + (page.next_from ? `, more from line ${page.next_from}`
        : page.kind ? "" : ", end of file");
      showPicture(page.kind ? params : null);
      file.next = page.next_from;
      $("file-next").disabled = !page.next_from;
      $("file-start").disabled = page.from === 1;
      const first = document.querySelector("#file-text .line.hl");
      if (scroll && first) first.scrollIntoView({ block: "center" });
      showError("");
    } catch (error) {
      if (!(error instanceof Unauthorized)) showError(error.message);
    }
  }

  // a media file's picture above its text, fetched with the token as the API is (an <img src> could not send it)
  async function showPicture(params) {
    const picture = $("file-picture");
    if (picture.src) URL.revokeObjectURL(picture.src);
    picture.removeAttribute("src");
    picture.hidden = true;
    if (!params) return;
    const query = new URLSearchParams({ path: params.get("path") });
    if (params.get("agent")) query.set("agent", params.get("agent"));
    try {
      picture.src = URL.createObjectURL(await api("/media?" + query.toString(), undefined, true));
      picture.alt = "picture " + params.get("path");
      picture.hidden = false;
    } catch (error) {
      if (!(error instanceof Unauthorized)) showError(error.message);
    }
  }

  // -- status ---------------------------------------------------------------------------------------------------
  function fillPickers(status) {
    const collections = Object.entries(status.collections || {});
    const agents = [...new Set(collections.map(([, c]) => c.agent))].sort();
    const agent = $("agent");
    const keep = agent.value;
    const same = (select, values) => select.options.length === values.length &&
      values.every((v, i) => select.options[i].value === v);
    if (!same(agent, agents)) agent.replaceChildren(...agents.map((a) => el("option", { value: a }, a)));
    agent.value = agents.includes(keep) ? keep : agents[0] || "";
    const picker = $("collection");
    const keepCollection = picker.value;
    const names = collections.filter(([, c]) => c.agent === agent.value).map(([name]) => name).sort();
    if (!same(picker, ["", ...names])) {
      picker.replaceChildren(el("option", { value: "" }, "all"), ...names.map((n) => el("option", { value: n }, n)));
    }
    picker.value = names.includes(keepCollection) ? keepCollection : "";
  }

  function renderStatus(status, health) {
    const out = [];
    const embedding = status.embedding || {};
    out.push(el("h2", {}, "Daemon"), facts([
      ["health", health.status + (health.reasons && health.reasons.length ? ": " + health.reasons.join("; ") : ""),
        health.status === "ok" ? "ok" : "bad"],
      ["ready", status.ready ? "yes" : "no (first full index running)", status.ready ? "ok" : "warn"],
      ["pending", `${status.queue_depth} file(s) queued or being indexed`, status.queue_depth ? "warn" : ""],
      ["drift", Object.entries(status.drift || {}).filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(", ")
        || "none"],
      ["last reconcile", status.last_reconcile
        ? `${new Date(status.last_reconcile * 1000).toLocaleTimeString()} (${status.last_reconcile_reason || "-"})`
        : "-"],
      ["files failing", status.files_failed, status.files_failed ? "bad" : ""],
      ["model", embedding.model_id], ["precision", embedding.precision], ["backend", status.backend],
      ["store", status.store_connected ? (status.store_degraded ? "writes failing (retried)" : "connected")
        : "not connected", status.store_connected && !status.store_degraded ? "ok" : "bad"],
      ["rebuilding", status.rebuilding ? "yes" : "no"],
      ["chunks embedded", status.chunks_embedded], ["cache hits", status.cache_hits],
      ["uptime", `${Math.round(status.uptime_s)} s`], ["listening on", status.bind],
    ]));

    const byAgent = {};
    for (const [name, c] of Object.entries(status.collections || {})) (byAgent[c.agent] ||= []).push([name, c]);
    out.push(el("h2", {}, "Collections"));
    const rows = [];
    for (const agent of Object.keys(byAgent).sort()) {
      const list = byAgent[agent].sort(([a], [b]) => a.localeCompare(b));
      for (const [name, c] of list) {
        rows.push(el("tr", { "data-collection": name }, cell(agent), cell(name), cell(c.role), cell(c.root),
          cell(c.files, "files"), cell(c.chunks, "chunks")));
      }
      rows.push(el("tr", { "data-agent": agent }, cell(agent), el("td", { colSpan: 3 }, el("strong", {}, "total")),
        cell(list.reduce((n, [, c]) => n + c.files, 0), "files"),
        cell(list.reduce((n, [, c]) => n + c.chunks, 0), "chunks")));
    }
    out.push(table(["agent", "collection", "role", "root", "files", "chunks"], rows));

    const sessions = Object.entries(status.sessions || {}).sort(([a], [b]) => a.localeCompare(b));
    if (sessions.length) {
      out.push(el("h2", {}, "Sessions"), table(["agent", "sessions", "turns"], sessions.map(([agent, s]) =>
        el("tr", { "data-sessions": agent }, cell(agent), cell(s.count, "sessions"), cell(s.turns, "turns")))));
    }

    const watch = status.watch || {};
    const polled = status.watch_polled || {};
    out.push(el("h2", {}, "Watching"), Object.keys(watch).length
      ? table(["root", "mode", "why polled", "health"], Object.keys(watch).sort().map((root) =>
        el("tr", { "data-root": root }, cell(root), cell(watch[root]), cell(polled[root] || ""),
          el("td", { className: watch[root] === "dead" ? "bad" : "ok" },
            watch[root] === "dead" ? "not watching: changes are found by the next reconcile" : "ok"))))
      : el("p", { className: "muted" }, "No watcher (an index-once run)."));

    const failed = status.failed_files || [];
    out.push(el("h2", {}, `Failing files (${status.files_failed})`), failed.length
      ? table(["path", "reason", "detail"], failed.map((f) => el("tr", {}, cell(f.path), cell(f.reason),
        cell(f.detail))))
      : el("p", { className: "muted" }, "None."));

    const problems = status.problems || [];
    if (problems.length) {
      out.push(el("h2", {}, "Configured paths not usable"), table(["kind", "agent", "path", "detail"],
        problems.map((p) => el("tr", {}, cell(p.kind), cell(p.agent), cell(p.path), cell(p.detail)))));
    }
    const models = status.models || {};
    const loading = (m) => m.loading ? `${m.loading.phase}, ${m.loading.percent} %` : "loaded";
    out.push(el("h2", {}, "Models"), table(["modality", "model", "precision", "load"],
      Object.keys(models).sort().map((m) => el("tr", { "data-modality": m }, cell(m), cell(models[m].model_id),
        cell(models[m].precision), cell(loading(models[m]), "load")))));
    $("status").replaceChildren(...out);
    $("status-time").textContent = "Last: " + new Date().toLocaleTimeString();
  }

  async function refresh() {
    try {
      const [status, health] = await Promise.all([api("/status"), api("/health")]);
      lastStatus = status;
      $("health").textContent = `${health.status}${health.ready ? "" : ", indexing"}`;
      $("health").className = "badge " + (health.status === "ok" ? "ok" : "bad");
      fillPickers(status);
      renderStatus(status, health);
      return true;
    } catch (error) {
      if (!(error instanceof Unauthorized)) {
        $("health").textContent = "unreachable";
        $("health").className = "badge bad";
        showError(error.message);
      }
      return false;
    }
  }

  async function start() {
    if (!(await refresh())) return;
    $("token-form").hidden = true;
    $("main").hidden = false;
    showError("");
    if (timer === null) timer = setInterval(refresh, REFRESH_MS);
    route(); // the view the URL names (a reload, a bookmark), once the pickers are filled
  }

  document.addEventListener("DOMContentLoaded", () => {
    for (const button of document.querySelectorAll("nav button")) {
      const view = button.dataset.view;
      button.addEventListener("click", () => go(view === "search" ? lastSearch || "#/search"
        : view === "file" ? lastFile : "#/status"));
    }
    window.addEventListener("hashchange", () => $("main").hidden || route());
    $("search-form").addEventListener("submit", search);
    $("agent").addEventListener("change", () => lastStatus && fillPickers(lastStatus));
    $("file-next").addEventListener("click", () => file && file.next && loadPage(file.next, false));
    $("file-start").addEventListener("click", () => file && loadPage(1, false));
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
      $("token").value = "";
      start();
    });
    start();
  });
})();
