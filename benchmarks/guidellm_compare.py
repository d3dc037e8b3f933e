"""Compare GuideLLM's and batchscope's own measurements of the same server (benchmarks/guidellm_crosscheck.sh):
TTFT and ITL percentiles per run, for the synchronous run and the constant-rate run, with each tool's
run-to-run spread beside the difference between the tools.

Like for like: TTFT is TTFT in both. GuideLLM's ITL is each request's mean gap between tokens (weighted by its
tokens), which is batchscope's TPOT; batchscope's own ITL is every gap, shown as well.

    python benchmarks/guidellm_compare.py OUTDIR [TIMELINE]   # writes OUTDIR/comparison.json, prints Markdown

With the server's timeline (GET /api/timeline.json, saved after the runs; its live ring must still hold them),
each run's requests are also read as the engine recorded them (arrival, first token, each token), so that each
tool's client-side figures can be set against the engine's own for the very same requests: what remains is the
client's share (HTTP, SSE, its own processing), free of the machine's drift between runs.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from batchscope.app.loadtest.foreign.reports import latency, read_report

STATS = ("p50", "p90", "p99")


def runs(out: Path) -> dict:
    """{(tool, kind): [(point, its file), ...]} over the pairs, in order."""
    found: dict = {}
    for path in sorted(out.glob("guidellm-*.json")):
        (curve,) = read_report(path.read_bytes())["modes"].values()
        for p in curve["points"]:
            found.setdefault(("guidellm", p["kind"]), []).append((p, path))
    for path in sorted(out.glob("batchscope-*.json")):
        doc = read_report(path.read_bytes())
        for p in doc["modes"]["async"]["points"]:
            if p["kind"] != "throughput":
                found.setdefault(("batchscope", p["kind"]), []).append((p, path))
    return found


def engine_side(timeline: dict | None, p: dict, path: Path, tool: str) -> dict:
    """TTFT and mean gap of the requests that arrived in the run's window and finished, as the engine saw them."""
    if timeline is None:
        return {}
    if tool == "guidellm":
        b = json.loads(path.read_bytes())["benchmarks"][0]
        origin = timeline["meta"]["origin"]["unix_s"]
        lo, hi = (b["start_time"] - origin) * 1e6, (b["end_time"] - origin) * 1e6
    else:
        lo, hi = p["window_us"]
    ttft, gap = [], []
    for r in timeline["requests"]:
        if r.get("arrival_us") is None or r.get("first_token_us") is None:
            continue
        if not lo <= r["arrival_us"] <= hi or r["finish_reason"] not in ("length", "eos", "stop"):
            continue
        ttft.append((r["first_token_us"] - r["arrival_us"]) / 1e3)
        t = r["token_us"]
        if len(t) > 1:
            gap.append((t[-1] - t[0]) / 1e3 / (len(t) - 1))
    e_ttft, e_gap = latency(ttft), latency(gap)
    return {"engine_n": e_ttft["n"], **{f"engine_ttft_{s}": e_ttft[s] for s in STATS},
            **{f"engine_itl_{s}": e_gap[s] for s in STATS}}


def figures(p: dict, tool: str) -> dict:
    # GuideLLM's ITL is a per-request mean: compare it with batchscope's per-request mean (TPOT)
    itl = p["itl_ms"] if tool == "guidellm" else p["tpot_ms"]
    # GuideLLM cancels what is still running at its duration bound and leaves it out ("incomplete"); batchscope
    # lets it finish (within the drain bound), and counts arrivals it skipped at its in-flight cap
    left_out = (p.get("cancelled") or 0) + (p.get("skipped") or 0)
    out = {"n": p["completed"], "left_out": left_out, "requests_per_s": p["requests_per_s"]}
    out.update({f"ttft_{s}": p["ttft_ms"][s] for s in STATS})
    out.update({f"itl_{s}": itl[s] for s in STATS})
    if tool == "batchscope":
        out.update({f"every_gap_itl_{s}": p["itl_ms"][s] for s in STATS})
    return out


def main(out: Path, timeline_path: Path | None = None) -> None:
    found = runs(out)
    timeline = json.loads(timeline_path.read_bytes()) if timeline_path else None
    table, summary = [], {}
    for kind in ("synchronous", "constant"):
        per_tool = {}
        for tool in ("guidellm", "batchscope"):
            rows = [{**figures(p, tool), **engine_side(timeline, p, path, tool), "file": path.name}
                    for p, path in found.get((tool, kind), [])]
            per_tool[tool] = rows
            for i, r in enumerate(rows, 1):
                table.append((kind, f"{tool} #{i}", r))
        summary[kind] = {}
        for key in [f"{m}_{s}" for m in ("ttft", "itl") for s in STATS]:
            g = [r[key] for r in per_tool["guidellm"] if r[key] is not None]
            b = [r[key] for r in per_tool["batchscope"] if r[key] is not None]
            if not g or not b:
                continue
            gm, bm = statistics.median(g), statistics.median(b)
            summary[kind][key] = {"guidellm_median": gm, "batchscope_median": bm, "ratio": bm / gm,
                                  "guidellm_spread": max(g) / min(g), "batchscope_spread": max(b) / min(b)}
    (out / "comparison.json").write_text(json.dumps({"runs": [{"kind": k, "run": n, **r} for k, n, r in table],
                                                     "summary": summary}, indent=1) + "\n")
    print("| run | kind | finished | left out | req/s | TTFT p50 / p90 / p99 ms | ITL (per-request mean) p50 / p90 / "
          "p99 ms |")
    print("|---|---|---|---|---|---|---|")
    for kind, name, r in table:
        ttft = " / ".join(f"{r[f'ttft_{s}']:.0f}" for s in STATS)
        itl = " / ".join(f"{r[f'itl_{s}']:.0f}" for s in STATS)
        print(f"| {name} | {kind} | {r['n']} | {r['left_out']} | {r['requests_per_s']:.2f} | {ttft} | {itl} |")
    print()
    print("| kind | figure | GuideLLM median | batchscope median | batchscope / GuideLLM | spread GuideLLM | "
          "spread batchscope |")
    print("|---|---|---|---|---|---|---|")
    for kind, figs in summary.items():
        for key, v in figs.items():
            print(f"| {kind} | {key.replace('_', ' ')} | {v['guidellm_median']:.0f} | {v['batchscope_median']:.0f} | "
                  f"{v['ratio']:.2f} | {v['guidellm_spread']:.2f}x | {v['batchscope_spread']:.2f}x |")


    if timeline is not None:
        print()
        print("| run | kind | the tool's TTFT p50 / p90 | the engine's TTFT p50 / p90 | the tool's ITL p50 / p90 | "
              "the engine's ITL p50 / p90 | client share of TTFT p50 |")
        print("|---|---|---|---|---|---|---|")
        for kind, name, r in table:
            pair = lambda key: " / ".join(f"{r[f'{key}_{s}']:.0f}" for s in ("p50", "p90"))   # noqa: E731
            print(f"| {name} | {kind} | {pair('ttft')} | {pair('engine_ttft')} | {pair('itl')} | "
                  f"{pair('engine_itl')} | {r['ttft_p50'] - r['engine_ttft_p50']:+.0f} ms |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
