// memory_search and memory_get, as the memory slot's owner registers them: memory-core's parameters and result
// shapes, answered by the daemon. A daemon that cannot answer is never an empty "no results": the result says
// unavailable, why, and what to do (memory-core's unavailable shape: disabled, unavailable, error, warning, action).

import { DaemonError, resolveSettings } from "./daemon.js";
import { DEFAULT_MAX_RESULTS, authorizeSearchHits, readMemory, searchMemory } from "./memory.js";

const SEARCH_PARAMETERS = {
  type: "object",
  properties: {
    query: { type: "string" },
    maxResults: { type: "integer", minimum: 1 },
    minScore: { type: "number" },
    corpus: { type: "string", enum: ["memory", "sessions", "all"] },
  },
  required: ["query"],
  additionalProperties: false,
};

const GET_PARAMETERS = {
  type: "object",
  properties: {
    path: { type: "string" },
    from: { type: "integer", minimum: 1 },
    lines: { type: "integer", minimum: 1 },
    corpus: { type: "string", enum: ["memory", "all"] },
  },
  required: ["path"],
  additionalProperties: false,
};

const SEARCH_DESCRIPTION = "Mandatory recall step: semantically search MEMORY.md, USER.md, Markdown files under " +
  "memory/ and indexed session transcripts before answering questions about prior work, decisions, dates, people, " +
  "preferences, or todos. Hybrid search (meaning and exact words) by the qmd-indexer daemon. `corpus=memory` " +
  "restricts hits to memory files, `corpus=sessions` to this agent's own session transcripts. Cite a hit by its " +
  "`citation` (path#Lstart-Lend); read more with memory_get. If the response has disabled=true or unavailable=true, " +
  "tell the user and include the warning/action guidance.";

const GET_DESCRIPTION = "Safe exact excerpt read from MEMORY.md, USER.md and Markdown files under memory/ " +
  "(a hit's `path`, or its `citation` path#L3-L5 for those lines), through the qmd-indexer daemon. Defaults to 120 " +
  "lines; `nextFrom` continues a truncated read. status=ok means the excerpt was read; status=not_found means the " +
  "file does not exist; status=error means the read failed, not that memory is disabled.";

/** A tool result as OpenClaw's jsonResult makes it: the JSON as text, and the object as details. */
export function jsonResult(payload) {
  return { content: [{ type: "text", text: JSON.stringify(payload, null, 2) }], details: payload };
}

/** memory-core's unavailable search result, from a DaemonError (or any error). */
export function unavailableResult(error) {
  const known = error instanceof DaemonError;
  const reason = known ? error.reason : String(error?.message ?? error);
  const action = known && error.action ? error.action
    : "Check the qmd-indexer daemon (`qmd-indexer status`) and the plugin's config, then retry memory_search.";
  const warning = `Memory search is unavailable: ${reason.replace(/^memory is unavailable: /, "")}.`;
  return { results: [], disabled: true, unavailable: true, error: reason, warning, action,
    ...(known ? { code: error.code } : {}), debug: { warning, action, error: reason } };
}

function citationsIncluded(cfg, sessionKey) {
  const mode = cfg?.memory?.citations;
  if (mode === "on") return true;
  if (mode === "off") return false;
  const rest = String(sessionKey ?? "").split(":").slice(2);
  return !rest.includes("channel") && !rest.includes("group"); // auto: direct chats only, as memory-core
}

// memory.search.query.maxResults (per agent, then shared) sets the default k, as for memory-core. memory.search.enabled
// is not read: OpenClaw's bundled memory-core registers its own memory_search and memory_get while it is enabled, even
// when it does not own the memory slot, and the first registration wins; `memory.search.enabled: false` makes it
// register none (docs/cli/status.md: "Custom memory plugins can leave built-in memory.search.enabled disabled").
function defaultMaxResults(cfg, agentId) {
  const agent = cfg?.agents?.entries?.[agentId]?.memory?.search ?? {};
  return agent.query?.maxResults ?? cfg?.memory?.search?.query?.maxResults ?? DEFAULT_MAX_RESULTS;
}

/** The tool context's live config, agent and session, as memory-core reads them. */
function context(ctx, api) {
  const cfg = (ctx.getRuntimeConfig ? ctx.getRuntimeConfig() : undefined) ?? ctx.runtimeConfig ?? ctx.config ?? api.config;
  const agentId = String(ctx.agentId || /^agent:([^:]+):/.exec(ctx.sessionKey ?? "")?.[1] || "main").toLowerCase();
  return { cfg, agentId, sessionKey: ctx.sessionKey, sandboxed: ctx.sandboxed === true,
    settings: resolveSettings(cfg, api.pluginConfig) };
}

async function runSearch(ctx, api, params, signal) {
  const { cfg, agentId, sessionKey, sandboxed, settings } = context(ctx, api);
  const query = typeof params?.query === "string" ? params.query.trim() : "";
  if (!query) throw new Error("query required");
  if (params.corpus !== undefined && !SEARCH_PARAMETERS.properties.corpus.enum.includes(params.corpus)) {
    // as memory-core: an unknown corpus fails closed, never an unrestricted search
    throw new Error(`corpus must be one of: ${SEARCH_PARAMETERS.properties.corpus.enum.join(", ")}`);
  }
  const started = Date.now();
  let found;
  try {
    found = await searchMemory(settings, agentId, query, {
      maxResults: Number.isInteger(params.maxResults) ? params.maxResults : defaultMaxResults(cfg, agentId),
      minScore: params.minScore, corpus: params.corpus, signal });
  } catch (error) {
    if (signal?.aborted) throw error;
    // a request the daemon refused as malformed (a query over its length limit) is the caller's error, not memory
    // being unavailable
    if (error instanceof DaemonError && error.code === "BAD_REQUEST") throw new Error(error.reason);
    return jsonResult(unavailableResult(error));
  }
  const visible = authorizeSearchHits({ cfg, agentId, requesterSessionKey: sessionKey, sandboxed, hits: found.hits });
  const include = citationsIncluded(cfg, sessionKey);
  const results = visible.map((hit) => ({ ...hit, corpus: hit.source,
    ...(include ? { snippet: `${hit.snippet.trimEnd()}\n\nSource: ${hit.citation}` } : {}) }));
  const { answer } = found;
  const pending = answer.pending ?? [];
  const warnings = [
    ...(answer.relevant === false ? ["Nothing found is close enough to be relevant: the hits are only the closest."] : []),
    ...(answer.indexing ? [`The first index is still being built (${answer.indexing.done} of ${answer.indexing.total} ` +
      "files): the answer may miss notes."] : []),
    ...(pending.length ? [`${pending.length} file(s) changed and not indexed yet: ${pending.slice(0, 3).join(", ")}.`] : []),
    ...(answer.degraded ? [`Search degraded: ${answer.degraded}.`] : []),
  ];
  return jsonResult({
    results, provider: "qmd-indexer", citations: cfg?.memory?.citations ?? "auto", mode: "hybrid",
    relevant: answer.relevant ?? null, ...(answer.relevance ? { relevance: answer.relevance } : {}),
    ...(pending.length ? { pending } : {}), ...(warnings.length ? { warning: warnings.join(" ") } : {}),
    debug: { backend: "qmd-indexer", daemon: settings.url, hits: results.length, candidateHits: found.hits.length,
      withheldHits: found.hits.length - visible.length, toolMs: Date.now() - started },
  });
}

async function runGet(ctx, api, params, signal) {
  const { agentId, settings } = context(ctx, api);
  const relPath = typeof params?.path === "string" ? params.path.trim() : "";
  if (!relPath) throw new Error("path required");
  const from = Number.isInteger(params.from) ? params.from : undefined;
  const lines = Number.isInteger(params.lines) ? params.lines : undefined;
  try {
    return jsonResult(await readMemory(settings, agentId, { relPath, from, lines, signal }));
  } catch (error) {
    if (signal?.aborted) throw error;
    const known = error instanceof DaemonError;
    return jsonResult({ path: relPath, text: "", status: "error", code: known ? error.code : "MEMORY_READ_FAILED",
      error: known ? error.reason : String(error?.message ?? error), ...(known && error.action ? { action: error.action } : {}) });
  }
}

/** Registers memory_search and memory_get on `api` (each made per agent turn from its context). */
export function registerTools(api) {
  api.registerTool((ctx) => ({
    label: "Memory Search", name: "memory_search", description: SEARCH_DESCRIPTION, parameters: SEARCH_PARAMETERS,
    execute: async (_id, params, signal) => await runSearch(ctx, api, params ?? {}, signal),
  }), { names: ["memory_search"] });
  api.registerTool((ctx) => ({
    label: "Memory Get", name: "memory_get", description: GET_DESCRIPTION, parameters: GET_PARAMETERS,
    execute: async (_id, params, signal) => await runGet(ctx, api, params ?? {}, signal),
  }), { names: ["memory_get"] });
}
