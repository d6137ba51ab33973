// qmd-indexer as OpenClaw's memory: the plugin that owns the exclusive memory slot (plugins.slots.memory).
//
// - api.registerMemoryCapability: the runtime the host asks (getMemorySearchManager for `openclaw status` and other
//   surfaces, resolveMemoryBackendConfig, authorizeSearchHits so an agent sees only its own transcripts), the recall
//   prompt section and the pre-compaction memory flush plan.
// - memory_search and memory_get, the slot owner's tools (declared in openclaw.plugin.json contracts.tools).
// - `openclaw qmd-indexer status|search|get`.
//
// Everything is answered by a running qmd-indexer daemon over its HTTP API (POST /search, GET /get, /health,
// /status); plain ESM for Node 24, no dependencies, no build step.

import { createRuntime } from "./src/memory.js";
import { registerTools } from "./src/tools.js";

const FLUSH_TARGET = "Store durable memories only in memory/YYYY-MM-DD.md (create memory/ if needed).";
const FLUSH_APPEND = "If memory/YYYY-MM-DD.md already exists, APPEND new content only and do not overwrite existing entries.";
const FLUSH_READ_ONLY = "Treat workspace bootstrap/reference files such as MEMORY.md, USER.md, DREAMS.md, SOUL.md, and " +
  "AGENTS.md as read-only during this flush; never overwrite, replace, or edit them.";

function promptBuilder({ availableTools, citationsMode }) {
  if (!availableTools.has("memory_search") && !availableTools.has("memory_get")) return [];
  return [
    "## Memory Recall",
    "Before answering anything about prior work, decisions, dates, people, preferences, or todos: run memory_search" +
      (availableTools.has("memory_get") ? "; for memory-file hits, use memory_get to pull only the needed lines" : "") +
      ". If low confidence after search, say you checked.",
    "Session hits are search snippets of this agent's own transcripts. Never read raw transcript files to expand them.",
    "Report unavailable or partial recall to the user, including the returned warning and action guidance.",
    citationsMode === "off"
      ? "Citations are disabled: do not mention file paths or line numbers in replies unless the user explicitly asks."
      : "Citations: include Source: <path#line> when it helps the user verify memory snippets.",
    "",
  ];
}

function dayStamp(nowMs, timeZone) {
  try {
    return new Intl.DateTimeFormat("en-CA", { timeZone, year: "numeric", month: "2-digit", day: "2-digit" })
      .format(new Date(nowMs));
  } catch {
    return new Date(nowMs).toISOString().slice(0, 10);
  }
}

// memory-core's plan (its defaults: 4000 tokens before the compaction reserve, 2 MiB of transcript, a 20000-token
// floor), writing today's daily note in the user's time zone (agents.defaults.userTimezone), which the daemon indexes
function flushPlanResolver({ cfg, nowMs, contextWindowTokens } = {}) {
  const flush = cfg?.agents?.defaults?.compaction?.memoryFlush;
  if (flush?.enabled === false) return null;
  const zone = cfg?.agents?.defaults?.userTimezone?.trim() || Intl.DateTimeFormat().resolvedOptions().timeZone;
  const day = dayStamp(nowMs ?? Date.now(), zone || "UTC");
  const hints = [FLUSH_TARGET, FLUSH_READ_ONLY, FLUSH_APPEND].join(" ").replaceAll("YYYY-MM-DD", day);
  const reserveTokensFloor = 20_000;
  let softThresholdTokens = Number.isInteger(flush?.softThresholdTokens) && flush.softThresholdTokens >= 0
    ? flush.softThresholdTokens : 4000;
  if (Number.isInteger(contextWindowTokens) && contextWindowTokens > reserveTokensFloor) {
    softThresholdTokens = Math.min(softThresholdTokens, Math.floor((contextWindowTokens - reserveTokensFloor) / 2));
  }
  return {
    softThresholdTokens,
    forceFlushTranscriptBytes: 2 * 1024 * 1024,
    reserveTokensFloor,
    ...(flush?.model?.trim() ? { model: flush.model.trim() } : {}),
    prompt: `Pre-compaction memory flush. ${hints} If nothing to store, reply with NO_REPLY.`,
    systemPrompt: "Pre-compaction memory flush turn. The session is near auto-compaction; capture durable memories " +
      `to disk (qmd-indexer indexes them within seconds). ${hints} You may reply, but usually NO_REPLY is correct.`,
    relativePath: `memory/${day}.md`,
  };
}

export default {
  id: "qmd-indexer",
  name: "qmd-indexer memory",
  description: "memory_search and memory_get answered by a qmd-indexer daemon",
  kind: "memory",
  register(api) {
    api.registerMemoryCapability({
      deterministicRecallToolName: "memory_search",
      promptBuilder,
      flushPlanResolver,
      runtime: createRuntime(api.pluginConfig),
    });
    registerTools(api);
    api.registerCli(async ({ program, config }) => {
      const { registerQmdCli } = await import("./src/cli.js");
      registerQmdCli(program, config ?? api.config, api.pluginConfig);
    }, { descriptors: [{ name: "qmd-indexer", description: "Ask the qmd-indexer daemon behind the memory slot: " +
      "status, search, get", hasSubcommands: true, machineOutput: ({ argv }) => argv.includes("--json") }] });
  },
};
