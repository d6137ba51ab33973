// OpenClaw's memory contract over the daemon: search hits in OpenClaw's shape, reads of memory files, the session-hit
// authorization and the manager the host asks for status (MemoryPluginRuntime, MemorySearchManager of the SDK).

import { DaemonError, ask, daemonAgent, ownsTranscripts, probe, resolveSettings } from "./daemon.js";

export const DEFAULT_MAX_RESULTS = 6; // memory-core's memory.search.query.maxResults default
export const DEFAULT_READ_LINES = 120; // memory-core's default excerpt of memory_get
export const DEFAULT_READ_MAX_CHARS = 12_000;

// Which OpenClaw agent's search produced each hit object: authorizeSearchHits decides on it, never on a path. A hit
// the host copied or made up is not in here, and its transcript content is withheld (fail closed).
const OWNERS = new WeakMap();

/** An OpenClaw session key's agent (`agent:<id>:...`), or undefined for any other form. */
export function sessionKeyAgent(sessionKey) {
  const match = /^agent:([^:]+):/i.exec(String(sessionKey ?? "").trim());
  return match ? match[1].toLowerCase() : undefined;
}

function normalizeAgent(agentId) {
  return String(agentId || "main").trim().toLowerCase();
}

/** `corpus` (memory, sessions, all) from a tool's `corpus` or the host's `sources` list; undefined: the daemon's
 * default_corpus. */
export function corpusOf(corpus, sources) {
  if (corpus === "memory" || corpus === "sessions" || corpus === "all") return corpus;
  if (Array.isArray(sources) && sources.length === 1) return sources[0] === "sessions" ? "sessions" : "memory";
  if (Array.isArray(sources) && sources.length > 1) return "all";
  return undefined;
}

/** One daemon hit as OpenClaw's MemorySearchResult; `path` and `citation` are the daemon's, as it gives them. */
export function toResult(hit, ownerAgentId) {
  const transcript = hit.kind === "transcript" || String(hit.collection ?? "").startsWith("sessions-");
  const result = {
    path: hit.path,
    startLine: hit.start_line,
    endLine: hit.end_line,
    score: hit.score,
    ...(typeof hit.dense_score === "number" ? { vectorScore: hit.dense_score } : {}),
    ...(typeof hit.keyword_score === "number" ? { textScore: hit.keyword_score } : {}),
    snippet: hit.snippet,
    source: transcript ? "sessions" : "memory",
    citation: hit.citation,
  };
  if (ownerAgentId) OWNERS.set(result, normalizeAgent(ownerAgentId));  // none: a transcript hit is withheld
  return result;
}

/** The daemon's answer to `query` for OpenClaw agent `agentId`: `{hits, answer}`, hits as MemorySearchResult. */
export async function searchMemory(settings, agentId, query, { maxResults, minScore, corpus, sources, signal } = {}) {
  const agent = daemonAgent(settings, agentId);
  const body = { query, k: Math.min(Math.max(1, maxResults ?? DEFAULT_MAX_RESULTS), 1000), agent };
  if (typeof minScore === "number" && Number.isFinite(minScore)) body.min_score = minScore;
  const chosen = corpusOf(corpus, sources);
  if (chosen) body.corpus = chosen;
  const answer = await ask(settings, "POST", "/search", { body, agent, openclawAgent: agentId, signal });
  const owner = ownsTranscripts(settings, agentId) ? agentId : undefined;  // mapped elsewhere: not its transcripts
  return { answer, hits: (answer.hits ?? []).map((hit) => toResult(hit, owner)) };
}

/** memory_get's MemoryReadResult for `relPath` (a hit's path or citation, `path#L3-L5`) of OpenClaw agent `agentId`,
 * read through the daemon's GET /get (memory files of the workspace only). A missing file is `not_found`. */
export async function readMemory(settings, agentId, { relPath, from, lines, signal } = {}) {
  const agent = daemonAgent(settings, agentId);
  if (String(relPath ?? "").startsWith("sessions/") && !ownsTranscripts(settings, agentId)) {
    throw new DaemonError("REFUSED", `${relPath}: a session transcript of qmd-indexer agent "${agent}", which ` +
      `OpenClaw agent "${agentId}" is mapped to; an agent reads only its own transcripts`, "");
  }
  const cited = /#L\d+(?:-L\d+)?$/.test(relPath ?? "");
  const query = { path: relPath, agent, max_chars: DEFAULT_READ_MAX_CHARS };
  if (from !== undefined) query.from = from;
  if (lines !== undefined) query.lines = lines;
  else if (!cited || from !== undefined) query.lines = DEFAULT_READ_LINES;
  let page;
  try {
    page = await ask(settings, "GET", "/get", { query, agent, openclawAgent: agentId, signal });
  } catch (error) {
    if (error instanceof DaemonError && error.code === "NOT_FOUND") {
      return { status: "not_found", text: "", path: String(relPath).replace(/#L\d+(?:-L\d+)?$/, "") };
    }
    throw error;
  }
  const count = Math.max(0, page.to - page.from + 1);
  const result = { status: "ok", text: page.text, path: page.path, from: page.from, lines: count };
  if (page.truncated) result.truncated = true;
  if (typeof page.next_from === "number") {
    result.nextFrom = page.next_from;
    result.text = `${result.text}\n\n[More content available. Use from=${page.next_from} to continue.]`;
  }
  return result;
}

/** runtime.authorizeSearchHits: memory-file hits pass; a transcript hit passes only to the agent whose own search
 * found it (the daemon keeps each agent's transcripts in its own collection and never spans agents), asked from that
 * agent's session, and not from a sandboxed session unless agents.defaults.sandbox.sessionToolsVisibility is "all". */
export function authorizeSearchHits({ cfg, agentId, requesterSessionKey, sandboxed, hits }) {
  const scoped = normalizeAgent(agentId);
  const requester = sessionKeyAgent(requesterSessionKey) ?? scoped;
  const sandboxSeesAll = cfg?.agents?.defaults?.sandbox?.sessionToolsVisibility === "all";
  return (hits ?? []).filter((hit) => hit?.source !== "sessions" ||
    (OWNERS.get(hit) === requester && requester === scoped && (!sandboxed || sandboxSeesAll)));
}

function sum(collections, agent, test) {
  let files = 0;
  let chunks = 0;
  for (const [name, c] of Object.entries(collections ?? {})) {
    if (c.agent === agent && test(name, c)) {
      files += c.files;
      chunks += c.chunks;
    }
  }
  return { files, chunks };
}

/** MemoryProviderStatus of the daemon for qmd-indexer agent `agent` from a `probe` (`{health, status}` or
 * `{error}`); `null` before any probe. The daemon down: vector and keyword search unavailable, saying why. */
export function providerStatus(settings, agent, probed) {
  const base = { backend: "builtin", provider: "qmd-indexer", requestedProvider: "qmd-indexer" };
  if (!probed) return { ...base, files: 0, chunks: 0, custom: { daemon: settings.url, agent, probed: false } };
  if (probed.error) {
    const error = probed.error.reason;
    return {
      ...base, files: 0, chunks: 0, dirty: true, lastSyncError: error,
      vector: { enabled: true, available: false, storeAvailable: false, semanticAvailable: false, loadError: error },
      fts: { enabled: true, available: false, error },
      fallback: { from: "qmd-indexer", reason: error },
      custom: { daemon: settings.url, agent, state: "unavailable", error, action: probed.error.action },
    };
  }
  const { health, status } = probed;
  const collections = status.collections ?? {};
  const known = Object.values(collections).some((c) => c.agent === agent);
  const memory = sum(collections, agent, (name, c) => c.role !== "sessions");
  const sessions = sum(collections, agent, (name, c) => c.role === "sessions");
  const embedding = status.embedding ?? status.models?.text ?? {};
  const ready = Boolean(status.ready) && known;
  const state = !known ? "unknown agent" : health.status === "ok" ? (status.ready ? "ready" : "indexing") : "degraded";
  const reasons = [...(health.reasons ?? []), ...(known ? [] : [`no agent "${agent}" in the daemon's config`])];
  return {
    ...base,
    model: embedding.model_id,
    files: memory.files + sessions.files,
    chunks: memory.chunks + sessions.chunks,
    dirty: !status.ready || (status.queue_depth ?? 0) > 0,
    ...(reasons.length ? { lastSyncError: reasons.join("; ") } : {}),
    workspaceDir: Object.values(collections).find((c) => c.agent === agent && c.role === "root")?.root,
    sources: sessions.files > 0 ? ["memory", "sessions"] : ["memory"],
    sourceCounts: [{ source: "memory", ...memory }, ...(sessions.files > 0 ? [{ source: "sessions", ...sessions }] : [])],
    vector: { enabled: true, available: ready, storeAvailable: Boolean(status.store_connected),
      semanticAvailable: ready && health.status === "ok", index: { state: status.ready ? "complete" : "incomplete" } },
    fts: { enabled: true, available: Boolean(status.store_connected) },
    custom: { daemon: settings.url, agent, state, health: health.status, ready: Boolean(status.ready),
      queueDepth: status.queue_depth, filesFailed: status.files_failed, backend: status.backend,
      precision: embedding.precision, ...(reasons.length ? { reasons } : {}) },
  };
}

/** The MemorySearchManager of OpenClaw agent `agentId` (what `openclaw status` and other host surfaces ask): search
 * and readFile through the daemon, status() from the last probe (probeVectorAvailability and friends refresh it). */
export function createManager(settings, agentId) {
  const agent = daemonAgent(settings, agentId);
  let probed = null;
  const refresh = async () => {
    probed = await probe(settings);
    return probed;
  };
  const usable = (p) => Boolean(p.status) && Object.values(p.status.collections ?? {}).some((c) => c.agent === agent);
  return {
    async search(query, opts = {}) {
      const { hits } = await searchMemory(settings, agentId, query, opts);
      return hits;
    },
    async readFile(params) {
      return await readMemory(settings, agentId, params);
    },
    status() {
      return providerStatus(settings, agent, probed);
    },
    async sync() {
      await refresh(); // the daemon indexes on its own: a save is searchable about a second later
    },
    getCachedEmbeddingAvailability() {
      return probed ? { ok: !probed.error, ...(probed.error ? { error: probed.error.message } : {}), cached: true } : null;
    },
    async probeEmbeddingAvailability() {
      const p = await refresh();
      const ok = usable(p) && p.health.status === "ok";
      return { ok, checked: true, checkedAtMs: Date.now(),
        ...(ok ? {} : { error: p.error?.message ?? providerStatus(settings, agent, p).lastSyncError }) };
    },
    async probeVectorStoreAvailability() {
      const p = await refresh();
      return usable(p) && Boolean(p.status.store_connected);
    },
    async probeVectorAvailability() {
      return usable(await refresh());
    },
    async close() {},
  };
}

/** The memory capability's runtime (MemoryPluginRuntime); `fallbackConfig` is api.pluginConfig. */
export function createRuntime(fallbackConfig) {
  return {
    async getMemorySearchManager({ cfg, agentId, purpose }) {
      const settings = resolveSettings(cfg, fallbackConfig);
      const manager = createManager(settings, agentId);
      await manager.sync(); // status() is synchronous: it reports this probe (two local requests, a few ms)
      return { manager, debug: { backend: "builtin", purpose: purpose ?? "default", managerMs: 0 } };
    },
    resolveMemoryBackendConfig() {
      return { backend: "builtin" };
    },
    async authorizeSearchHits(params) {
      return authorizeSearchHits(params);
    },
    async closeMemorySearchManager() {},
    async closeAllMemorySearchManagers() {},
  };
}
