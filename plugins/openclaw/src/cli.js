// `openclaw qmd-indexer status|search|get`: the slot owner's own CLI namespace (`openclaw memory` is memory-core's,
// present only while memory-core holds the slot). Each command asks the daemon directly.

import { DaemonError, daemonAgent, resolveSettings } from "./daemon.js";
import { createManager, readMemory, searchMemory } from "./memory.js";

// OpenClaw routes console.log to stderr while its CLI runs (stdout is kept for machine output): answers are written
// to stdout itself, so `openclaw qmd-indexer status --json | jq` works.
function out(text) {
  process.stdout.write(`${text}\n`);
}

function agentsOf(cfg) {
  const entries = cfg?.agents?.entries;
  if (entries && typeof entries === "object") return Object.keys(entries).map((id) => id.toLowerCase());
  if (Array.isArray(cfg?.agents?.list)) return cfg.agents.list.map((a) => String(a?.id ?? "main").toLowerCase());
  return ["main"];
}

function fail(error, json) {
  const known = error instanceof DaemonError;
  if (json) {
    out(JSON.stringify({ ok: false, error: { type: known ? error.code : "cli_error", message: error.message } }));
  } else {
    console.error(`qmd-indexer: ${error.message}`);
  }
  process.exitCode = 1;
}

function statusLine(status) {
  const c = status.custom ?? {};
  if (c.state === "unavailable") return `${c.agent}: unavailable: ${c.error}\n  ${c.action}`;
  const sources = (status.sourceCounts ?? []).map((s) => `${s.source} ${s.files} files, ${s.chunks} chunks`).join(" · ");
  const reasons = c.reasons?.length ? `\n  ${c.reasons.join("; ")}` : "";
  return `${c.agent}: ${c.state} · ${sources} · model ${status.model ?? "?"} (${c.precision ?? "?"}) · queue ` +
    `${c.queueDepth ?? 0} · failed ${c.filesFailed ?? 0} · ${c.daemon}${reasons}`;
}

async function status(cfg, fallback, opts) {
  const settings = resolveSettings(cfg, fallback);
  const agents = opts.agent ? [opts.agent.toLowerCase()] : agentsOf(cfg);
  const found = [];
  for (const agentId of agents) {
    const manager = createManager(settings, agentId);
    await manager.sync();
    found.push({ agentId, agent: daemonAgent(settings, agentId), ...manager.status() });
  }
  if (opts.json) out(JSON.stringify(found, null, 2));
  else for (const s of found) out(`${s.agentId} -> ${statusLine(s)}`);
  if (found.some((s) => s.custom?.state === "unavailable" || s.custom?.state === "unknown agent")) process.exitCode = 1;
}

async function search(cfg, fallback, query, opts) {
  const settings = resolveSettings(cfg, fallback);
  const agentId = (opts.agent ?? agentsOf(cfg)[0]).toLowerCase();
  const { hits } = await searchMemory(settings, agentId, query, {
    maxResults: opts.maxResults ? Number(opts.maxResults) : undefined, corpus: opts.corpus,
    minScore: opts.minScore === undefined ? undefined : Number(opts.minScore) });
  if (opts.json) {
    out(JSON.stringify({ agentId, results: hits }, null, 2));
    return;
  }
  hits.forEach((hit, i) => {
    out(`${i + 1}. ${hit.citation}  score ${hit.score?.toFixed(3)}  (${hit.source})`);
    out(hit.snippet.split("\n").map((line) => `     ${line}`).join("\n"));
  });
  if (!hits.length) out("no hits");
}

async function get(cfg, fallback, path, opts) {
  const settings = resolveSettings(cfg, fallback);
  const agentId = (opts.agent ?? agentsOf(cfg)[0]).toLowerCase();
  const page = await readMemory(settings, agentId, { relPath: path,
    from: opts.from ? Number(opts.from) : undefined, lines: opts.lines ? Number(opts.lines) : undefined });
  if (opts.json) out(JSON.stringify(page, null, 2));
  else if (page.status === "not_found") {
    console.error(`qmd-indexer: no such memory file: ${page.path}`);
    process.exitCode = 1;
  } else out(page.text);
}

/** Adds the `qmd-indexer` command group to commander `program`; `cfg` is OpenClaw's config. */
export function registerQmdCli(program, cfg, fallback) {
  const group = program.command("qmd-indexer")
    .description("Ask the qmd-indexer daemon that answers memory_search and memory_get");
  const guard = (run) => async (...args) => {
    const opts = args.at(-2) && typeof args.at(-2) === "object" ? args.at(-2) : {};
    try {
      await run(...args);
    } catch (error) {
      fail(error, opts.json);
    }
  };
  group.command("status").description("The daemon's health, model and index state, per OpenClaw agent")
    .option("--agent <id>", "Only this OpenClaw agent").option("--json", "Print JSON")
    .action(guard((opts) => status(cfg, fallback, opts)));
  group.command("search").description("Search an agent's memory as memory_search does").argument("<query>")
    .option("--agent <id>", "OpenClaw agent [default: the first configured]")
    .option("--max-results <n>", "How many hits [default 6]").option("--min-score <score>", "Drop hits scoring below")
    .option("--corpus <corpus>", "memory, sessions or all").option("--json", "Print JSON")
    .action(guard((query, opts) => search(cfg, fallback, query, opts)));
  group.command("get").description("Read a memory file or a hit's citation (path#L3-L5) as memory_get does")
    .argument("<path>").option("--agent <id>", "OpenClaw agent [default: the first configured]")
    .option("--from <line>", "First line").option("--lines <n>", "How many lines").option("--json", "Print JSON")
    .action(guard((path, opts) => get(cfg, fallback, path, opts)));
}
