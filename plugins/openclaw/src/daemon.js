// The qmd-indexer daemon over HTTP (Node's global fetch): the plugin's settings, one request helper, and the errors
// a user can act on. Everything the plugin answers comes from here: POST /search, GET /get, /health and /status.

export const PLUGIN_ID = "qmd-indexer";
export const DEFAULT_URL = "http://127.0.0.1:8743";
export const DEFAULT_TIMEOUT_MS = 10_000;
const CONFIG_KEY = `plugins.entries.${PLUGIN_ID}.config`;
export const START_HINT = "`qmd-indexer run --config ~/.config/qmd-indexer/config.toml` (or " +
  "`systemctl --user start qmd-indexer` where it runs as a service)";

/** The plugin's settings from OpenClaw's config `cfg` (plugins.entries.qmd-indexer.config), else `fallback` (the
 * registration-time api.pluginConfig): url, token, agents (OpenClaw id -> qmd-indexer id), timeoutMs. */
export function resolveSettings(cfg, fallback) {
  const live = cfg?.plugins?.entries?.[PLUGIN_ID]?.config;
  const raw = live && typeof live === "object" ? live : fallback && typeof fallback === "object" ? fallback : {};
  const url = String(raw.url || process.env.QMD_INDEXER_URL || DEFAULT_URL).replace(/\/+$/, "");
  const token = raw.token || process.env.QMD_INDEXER_TOKEN || "";
  const agents = raw.agents && typeof raw.agents === "object" ? raw.agents : {};
  const timeoutMs = Number.isInteger(raw.timeoutMs) && raw.timeoutMs > 0 ? raw.timeoutMs : DEFAULT_TIMEOUT_MS;
  return { url, token, agents, timeoutMs };
}

/** The qmd-indexer agent that serves OpenClaw agent `agentId`: its mapping, else the same id. */
export function daemonAgent(settings, agentId) {
  const mapped = settings.agents[agentId];
  return typeof mapped === "string" && mapped ? mapped : agentId || "main";
}

/** Whether the daemon agent serving OpenClaw agent `agentId` is that agent itself (no mapping to another id): only
 * then are its session transcripts the agent's own. A mapping shares notes (agents on one workspace), never another
 * agent's conversations. */
export function ownsTranscripts(settings, agentId) {
  const own = String(agentId || "main").trim().toLowerCase();
  return String(daemonAgent(settings, agentId)).trim().toLowerCase() === own;
}

/** An answer the daemon could not give, with what to do about it. `code`: DAEMON_UNREACHABLE, DAEMON_UNAUTHORIZED,
 * UNKNOWN_AGENT, NOT_FOUND, REFUSED, BAD_REQUEST or DAEMON_ERROR; `action`: the fix, one sentence. */
export class DaemonError extends Error {
  constructor(code, message, action, status = 0) {
    super(action ? `${message}. ${action}` : message);
    this.code = code;
    this.reason = message;
    this.action = action;
    this.status = status;
  }
}

function unreachable(settings, cause) {
  return new DaemonError("DAEMON_UNREACHABLE",
    `memory is unavailable: no qmd-indexer daemon answers at ${settings.url} (${cause})`,
    `Start the daemon: ${START_HINT}; if it listens elsewhere, set ${CONFIG_KEY}.url ` +
    `(\`openclaw config set ${CONFIG_KEY}.url http://127.0.0.1:PORT\`)`);
}

function refusal(settings, status, detail, agent, openclawAgent) {
  if (status === 401) {
    return new DaemonError("DAEMON_UNAUTHORIZED", `the qmd-indexer daemon at ${settings.url} refused the token`,
      `Set ${CONFIG_KEY}.token to the daemon's token (its token or token_file setting, QMD_INDEXER_TOKEN)`, status);
  }
  if (status === 404 && /^unknown agent\b/.test(detail)) {
    const named = openclawAgent && openclawAgent !== agent ? ` (OpenClaw agent "${openclawAgent}")` : "";
    return new DaemonError("UNKNOWN_AGENT", `memory is unavailable: qmd-indexer has no agent "${agent}"${named}: ${detail}`,
      `Add a [[workspace]] table with agent = "${agent}" and its path to the daemon's config ` +
      "(`qmd-indexer init --openclaw --force` writes one per OpenClaw agent), then reload or restart the daemon; " +
      `or map the agent to one the daemon has in ${CONFIG_KEY}.agents`, status);
  }
  if (status === 404) return new DaemonError("NOT_FOUND", detail, "", status);
  if (status === 403) return new DaemonError("REFUSED", detail, "", status);
  if (status === 400 || status === 422) return new DaemonError("BAD_REQUEST", detail, "", status);
  return new DaemonError("DAEMON_ERROR", `the qmd-indexer daemon at ${settings.url} answered ${status}: ${detail}`,
    "Check the daemon's log (`journalctl --user -u qmd-indexer` or its terminal) and `qmd-indexer status`", status);
}

function detailOf(body, text) {
  const detail = body && typeof body === "object" ? body.detail : undefined;
  if (Array.isArray(detail)) return detail.map((e) => `${(e.loc || []).slice(1).join(".")}: ${e.msg}`).join("; ");
  return typeof detail === "string" ? detail : text.slice(0, 500);
}

/** The daemon's JSON answer to `method path` (`body` as JSON, `query` as parameters); throws `DaemonError`.
 * `agent`/`openclawAgent` name who asked, for an unknown-agent refusal; `signal` cancels the request. */
export async function ask(settings, method, path, { body, query, agent, openclawAgent, signal } = {}) {
  const url = new URL(settings.url + path);
  for (const [key, value] of Object.entries(query ?? {})) {
    if (value !== undefined && value !== null) url.searchParams.set(key, String(value));
  }
  const headers = { accept: "application/json" };
  if (settings.token) headers.authorization = `Bearer ${settings.token}`;
  if (body !== undefined) headers["content-type"] = "application/json";
  const timeout = AbortSignal.timeout(settings.timeoutMs);
  let response;
  try {
    response = await fetch(url, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      signal: signal ? AbortSignal.any([signal, timeout]) : timeout,
    });
  } catch (error) {
    if (signal?.aborted) throw signal.reason ?? error;
    const cause = timeout.aborted ? `no answer within ${settings.timeoutMs} ms` : error?.cause?.code || error?.message || String(error);
    throw unreachable(settings, cause);
  }
  const text = await response.text();
  let parsed;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {
    parsed = undefined;
  }
  if (parsed === undefined || parsed === null || typeof parsed !== "object") {
    // the daemon answers JSON, its refusals too ({"detail": ...}): anything else is another server, whose 404 must
    // not read as "no such memory file", nor its error page fill the tool's answer
    throw new DaemonError("DAEMON_ERROR", `memory is unavailable: ${settings.url} answered ${response.status} ` +
      `without JSON (${text.replace(/\s+/g, " ").slice(0, 80)}); it is not a qmd-indexer daemon`,
      `Point ${CONFIG_KEY}.url at the daemon (its port setting, default 8743), or start it: ${START_HINT}`,
      response.status);
  }
  if (!response.ok) throw refusal(settings, response.status, detailOf(parsed, text), agent, openclawAgent);
  return parsed;
}

/** `{health, status}` of the daemon, or `{error}` (a DaemonError) when it cannot be asked. */
export async function probe(settings, signal) {
  try {
    const [health, status] = await Promise.all([ask(settings, "GET", "/health", { signal }),
      ask(settings, "GET", "/status", { signal })]);
    return { health, status };
  } catch (error) {
    if (error instanceof DaemonError) return { error };
    throw error;
  }
}
