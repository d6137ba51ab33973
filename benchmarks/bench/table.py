"""The table ``python -m benchmarks.bench`` prints at the end of a run, from its results dict."""

from __future__ import annotations

from typing import Any

from benchmarks.bench import common


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def print_table(r: dict[str, Any]) -> None:
    rows: list[tuple[str, str, str, str]] = []
    f, n, d = r.get("first_index"), r.get("noop_rescan"), r.get("daemon")
    b = r.get("big")
    points = ((b or r.get("server", {}).get("big") or {}).get("collection") or {}).get("points", common.BIG_POINTS)
    big = f"{points / 1e6:g}M" if points >= 1_000_000 else f"{points // 1000}k"
    if f and n:
        rows += [
            ("first index, chunks/s", f"{f['chunks_per_s']:.1f}", f"raw encode {f['raw_encode_chunks_per_s']:.1f}/s",
             f"wall ratio {f['ratio_to_raw']:.3f} (aim >= 0.95)"),
            ("  per CPU second", f"ratio {f['ratio_to_raw_cpu']:.3f}",
             f"CPU s: index {f['cpu_s']}, raw {f['raw_encode_cpu_s']}", f"load avg {f['load_average'][0]}"),
            ("  chunks / seconds", f"{f['chunks_embedded']} / {f['seconds']:.1f} s", f["model_id"],
             f"batch {f['batch_size']}"),
            ("no-op rescan (same process)", f"{n['same_process_s']:.3f} s", f"{n['same_process_embedded']} embedded",
             "aim 0, < 1 s"),
            ("no-op after restart", f"{n['restart_open_and_scan_s']:.3f} s", f"{n['restart_embedded']} embedded",
             "open + scan"),
        ]
    m = r.get("noop_many")
    if m:
        rows += [
            (f"no-op rescan, {m['files']} files", f"{m['same_process_s']:.3f} s", f"{m['same_process_embedded']} "
             f"embedded", f"aim <= {common.NOOP_FILES_TARGET_S:g} s, 0 embedded; same process"),
            ("  after restart", f"{m['restart_open_and_scan_s']:.3f} s", f"{m['restart_embedded']} embedded",
             f"open {m['restart_open_s']:.3f} s + scan {m['restart_scan_s']:.3f} s"),
            ("  first index (not the aim)", f"{m['first_index_s']} s", f"{m['first_index_embedded']} embedded",
             f"cache {'reused' if m['embedding_cache_reused'] else 'new'}; step {m['step_s']} s"),
        ]
    p = r.get("precision")
    if p:
        fp32 = p["precisions"]["fp32"]
        where = (f"first {p['docs']} abstracts: NOT SciFact's nDCG@10" if p["subset"] else
                 f"SciFact test, {p['queries']} queries, {p['docs']} abstracts")
        for name, x in p["precisions"].items():
            if name == "fp32":
                continue
            rows += [
                (f"embedding {name} vs torch fp32", f"x{x['x_fp32']:.2f}",
                 f"{x['best_per_s']:.1f} vs {fp32['best_per_s']:.1f} chunks/s",
                 f"aim >= 2x; best of {p['rounds']} rounds of {p['sample']} abstracts"),
                (f"  nDCG@10 {name} - fp32", f"{x['ndcg_vs_fp32']:+.4f}",
                 f"{x['ndcg_at_10']:.4f} vs {fp32['ndcg_at_10']:.4f}", f"aim loss <= 0.005; {where}"),
            ]
        rows.append(("  step 2c took", f"{p.get('step_s', '-')} s", "", "--precision-docs N: quicker, not SciFact's"))
        if len(p["precisions"]) == 1:
            rows.append(("embedding precision", "fp32 only", "int8 unavailable", "see the step's output"))
    if d:
        rows += [
            ("save-to-searchable", f"p50 {d['save_to_searchable_s']['p50']:.2f} s",
             f"p95 {d['save_to_searchable_s']['p95']:.2f} s", f"{d['save_to_searchable_s']['n']} edits; p95 aim 0.5 s"),
            ("API search (hybrid, k=6)", f"p50 {d['search_ms']['p50']:.1f} ms", f"p95 {d['search_ms']['p95']:.1f} ms",
             f"{d['search_ms']['chunks']} chunks; aim p50 < 30 ms"),
            ("  while the first index runs", f"p50 {(d.get('search_during_first_index_ms') or {}).get('p50')} ms",
             f"p95 {(d.get('search_during_first_index_ms') or {}).get('p95')} ms",
             f"{(d.get('search_during_first_index_ms') or {}).get('n')} searches before ready"),
            ("MCP stdio start to 1st search", f"{d['mcp']['mcp_first_answer_s']:.2f} s",
             f"CLI search {d['mcp']['cli_search_s']:.2f} s", f"ratio {d['mcp']['ratio_to_cli']:.2f} (median of "
             f"{d['mcp']['n']})"),
            ("daemon peak RSS", f"{d['peak_rss_mib']:.0f} MiB", f"sampled {d['peak_rss_sampled_mib']:.0f} MiB",
             "VmHWM, incl. first index"),
        ]
    if b:
        rows += [
            (f"{big} API hybrid, exact scan", f"p50 {b['exact']['p50_ms']:.1f} ms",
             f"p95 {b['exact']['p95_ms']:.1f} ms",
             f"{b['exact']['chunks']} chunks; aim p50 < 15 ms"),
            (f"{big} API hybrid, HNSW building", f"p50 {b['hnsw'].get('during_build', {}).get('p50_ms', '-')} ms",
             f"p95 {b['hnsw'].get('during_build', {}).get('p95_ms', '-')} ms", "child process builds, daemon serves"),
            (f"{big} HNSW build (child, swap)", f"{b['optimize_s'] or '-'} s",
             f"state {b['hnsw'].get('build', {}).get('state')}",
             f"indexed {b['hnsw'].get('build', {}).get('indexed')} of {b['hnsw'].get('build', {}).get('points')}"),
            (f"{big} API hybrid, HNSW", f"p50 {b['hnsw']['p50_ms']:.1f} ms", f"p95 {b['hnsw']['p95_ms']:.1f} ms",
             f"ratio to exact p50 {_ratio(b['hnsw']['p50_ms'], b['exact']['p50_ms'])}, p95 "
             f"{_ratio(b['hnsw']['p95_ms'], b['exact']['p95_ms'])}"),
        ]
        if "restarted" in b:
            x = b["restarted"]
            rows.append((f"{big} API hybrid, after a restart", f"p50 {x['p50_ms']:.1f} ms", f"p95 {x['p95_ms']:.1f} ms",
                         f"first 3 searches {x['first_searches_ms']} ms; ready incl. model {x['ready_s']} s; peak "
                         f"RSS {x['peak_rss_mib']} MiB"))
        for kind in ("exact", "hnsw"):
            x, restart = b[kind], b.get(f"{kind}_restart")
            rows.append((f"{big} {kind}: daemon peak RSS", f"{x['peak_rss_mib']} MiB",
                         f"at the end {x.get('rss_end_mib', {})}", f"store {b['collection'].get('store', {})}"))
            if restart:
                rows.append((f"{big} {kind}: restart to ready", f"{restart['ready_s']} s",
                             f"open+connect {restart['open_connect_s']} s, scan {restart['scan_s']} s",
                             f"model load excluded; API ready incl. model {x['ready_s']} s"))
            if "cached_embedding_p50_ms" in x:
                rows.append((f"  {kind}: query embedding cached", f"p50 {x['cached_embedding_p50_ms']:.1f} ms",
                             f"p95 {x['cached_embedding_p95_ms']:.1f} ms",
                             f"daemon CPU {x['daemon_cpu_ms_per_search']} ms a search (embedding included)"))
    for label, part in (("edge", b), ("server", r.get("server", {}).get("big"))):
        for kind in ("exact", "hnsw"):
            sp = (part or {}).get(f"{kind}_split")
            if sp:
                rows.append((f"{big} split {label} {kind} (ms)", f"embed {sp['embed_query_ms']}",
                             f"dense {sp['dense_search_ms']} bm25 {sp['bm25_search_ms']} fuse {sp['fuse_ms']}",
                             f"payloads(k) {sp['payloads_k_ms']} snippets {sp['snippets_ms']} retrieve "
                             f"{sp['retrieve_ms']}"))
    sv = r.get("server")
    if sv:
        sf, sb = sv.get("first_index"), sv.get("big")
        rows += [("", "", "", ""), ("SERVER vs EDGE (same run)", "server", "edge", "ratio server/edge")]
        if sf:
            rows.append(("first index, chunks/s", f"{sf['chunks_per_s']:.1f}",
                         f"{f['chunks_per_s']:.1f}" if f else "-",
                         _ratio(sf["chunks_per_s"], f["chunks_per_s"] if f else None)))
            rows.append(("  ratio to raw encode (wall)", f"{sf['ratio_to_raw']:.3f}",
                         f"{f['ratio_to_raw']:.3f}" if f else "-", ""))
            rows.append(("no-op rescan (same process)", f"{sv['noop_rescan']['same_process_s']:.3f} s",
                         f"{n['same_process_s']:.3f} s" if n else "-",
                         _ratio(sv["noop_rescan"]["same_process_s"], n["same_process_s"] if n else None)))
        if sb:
            sh = sb["hnsw"]
            for stat in ("p50_ms", "p95_ms"):
                for kind in ("exact", "hnsw"):
                    e = (b or {}).get(kind, {}).get(stat)
                    rows.append((f"{big} API hybrid {stat[:3]} vs edge {kind}", f"{sh[stat]:.1f} ms",
                                 f"{e:.1f} ms" if e else "-", _ratio(sh[stat], e)))
            for kind in ("exact", "hnsw"):
                e = (b or {}).get(kind, {})
                if "daemon_cpu_ms_per_search" in sh and "daemon_cpu_ms_per_search" in e:
                    rows.append((f"  embedding cached p50 vs edge {kind}", f"{sh['cached_embedding_p50_ms']:.1f} ms",
                                 f"{e['cached_embedding_p50_ms']:.1f} ms",
                                 _ratio(sh["cached_embedding_p50_ms"], e["cached_embedding_p50_ms"])))
                    rows.append((f"  daemon CPU a search vs edge {kind}", f"{sh['daemon_cpu_ms_per_search']:.1f} ms",
                                 f"{e['daemon_cpu_ms_per_search']:.1f} ms",
                                 _ratio(sh["daemon_cpu_ms_per_search"], e["daemon_cpu_ms_per_search"])))
            rows.append((f"{big} HNSW build", f"{sb['optimize_s']:.1f} s", f"{b['optimize_s'] or '-'} s" if b else "-",
                         "server: first upsert to green; edge: child process + swap"))
            rows.append((f"{big} daemon ready / peak RSS", f"{sh['ready_s']} s / {sh['peak_rss_mib']} MiB",
                         f"{b['hnsw']['ready_s']} s / {b['hnsw']['peak_rss_mib']} MiB" if b else "-",
                         "daemon only (server process not counted)"))
    print(f"\nCPU: {r.get('cpu')}; {r.get('cpus')} CPUs; load average at the end {r.get('load_average_end')}")
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
