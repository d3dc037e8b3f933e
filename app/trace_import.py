"""`batchscope import TRACE [TRACE ...]`: profiler traces -> one `batchscope.timeline/1` file, with a progress bar
while the files are read and a short summary of what the import found and could not find (docs/import.md).

The import itself is telemetry.importers.import_trace; here is what a terminal needs around it: where the
timeline goes, the bar (on stderr, only on a terminal, so logs and pipes stay clean) and the summary (stdout).
"""
from __future__ import annotations

import gzip
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

# the endings a trace file's name is known by; the timeline is named after what is left
TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".trace.json.gz", ".trace.json", ".json.gz", ".json", ".gz")
ENGINE_NAMES = {"batchscope": "batchscope", "vllm": "vLLM", "sglang": "SGLang", "transformers": "transformers",
                "unknown": "an engine it does not know"}
TOP_CAUSES = 4


def default_output(trace: str | Path) -> Path:
    """Beside the trace, its name with `.timeline.json` for the trace's own ending: rank0.pt.trace.json.gz ->
    rank0.timeline.json."""
    trace = Path(trace)
    name = trace.name
    for suffix in TRACE_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return trace.with_name(name + ".timeline.json")


@contextmanager
def progress_bar(what: str):
    """The importer's progress(bytes_done, bytes_total) as a bar on stderr, where stderr is a terminal; it appears
    at the first report (a timeline given to `batchscope replay` makes none)."""
    from tqdm import tqdm

    bars = []

    def progress(done: int, total: int) -> None:
        if not bars:
            bars.append(tqdm(desc=what, total=total, unit="B", unit_scale=True, unit_divisor=1024, leave=False,
                             file=sys.stderr, disable=None, dynamic_ncols=True))
        bar = bars[0]
        bar.update(done - bar.n)
        if done >= total:               # read; the steps and idle causes are worked out next
            bar.set_description_str(f"{what}: naming the idle time")

    try:
        yield progress
    finally:
        for bar in bars:
            bar.close()


def write_timeline(timeline: dict, path: Path) -> None:
    """Compact JSON (gzipped for a name ending in .gz), written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    unfinished = path.with_name(f".{path.name}.partial")
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(unfinished, "wt", encoding="utf-8") as f:
            json.dump(timeline, f, separators=(",", ":"))
        os.replace(unfinished, path)
    finally:
        if unfinished.exists():
            unfinished.unlink()


def run(traces: list[str], output: str | None, kernels: bool, workers: int | None, partial: bool) -> int:
    from batchscope.telemetry import TimelineError
    from batchscope.telemetry.importers import TruncatedTraceError, import_trace

    out = Path(output) if output else default_output(traces[0])
    if any(os.path.abspath(out) == os.path.abspath(t) for t in traces):
        return _fail(f"{out}: the timeline would overwrite the trace; name another with -o")
    try:
        with progress_bar(f"importing {Path(traces[0]).name}" + (f" and {len(traces) - 1} more"
                                                                 if len(traces) > 1 else "")) as progress:
            timeline = import_trace(traces, kernels=kernels, progress=progress, partial=partial, workers=workers)
    except TruncatedTraceError as e:
        return _fail(f"cannot import: {e}" + ("" if partial else " (--partial imports what was written)"))
    except TimelineError as e:           # every TraceImportError: one line naming the file and the reason
        return _fail(f"cannot import: {e}")
    try:
        write_timeline(timeline, out)
    except OSError as e:
        return _fail(f"cannot write {out}: {e.strerror or e}")
    try:
        print("\n".join(summary_lines(timeline, out)), flush=True)
    except BrokenPipeError:             # `batchscope import T | head`: the reader left; the timeline is written
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def summary_lines(timeline: dict, out: Path) -> list[str]:
    """What the import found: the engine and its steps, busy time, idle time by cause (between steps and inside
    them), and what it had to infer or could not know."""
    meta, summary, steps = timeline["meta"], timeline["summary"], timeline["steps"]
    source = meta.get("source", {})
    files = source.get("files", [])
    ranks = meta.get("info", {}).get("ranks", [])
    modes = ", ".join(f"{n} {m}" for m, n in sorted(summary.get("modes", {}).items()))
    lines = [f"wrote {out} ({_size(out)})",
             f"  source: {ENGINE_NAMES.get(source.get('engine'), source.get('engine'))} "
             f"({source.get('engine_evidence', 'no evidence')}), {len(files)} file{'s' * (len(files) != 1)}, "
             f"{sum(f.get('events', 0) for f in files):,} events"
             + (f", {len(ranks)} ranks" if len(ranks) > 1 else "") + f", on {meta.get('gpu') or meta.get('device')}",
             f"  steps: {len(steps)}" + (f" ({steps[0]['step']}-{steps[-1]['step']}, {modes})" if steps else "")
             + _without_device(len(steps), sum(1 for s in steps if s.get("compute_us")))
             + f" over {_seconds(summary.get('duration_s') or 0)}; " + _steps_from(source.get("steps_from", "?"))]
    lines.append(_busy(summary) + ("  [under-recorded: see below]" if source.get("under_recorded") else ""))
    lines += _rank_lines(summary)
    lines.append(_causes("idle between steps", summary.get("idle_us_total"), summary.get("idle_us_by_cause")))
    if "idle_inside_us_total" in summary:
        lines.append(_causes("idle inside steps", summary["idle_inside_us_total"],
                             summary.get("idle_inside_us_by_cause")))
    if kernels := timeline.get("kernels"):
        lines.append(f"  kernels kept: {sum(len(k.get('ops', [])) for k in kernels):,} device ops and their idle "
                     f"stretches (the Perfetto export draws them)")
    if source.get("inferred"):
        lines.append(f"  inferred: {', '.join(source['inferred'])}")
    if source.get("unknown"):
        lines.append(f"  not in the trace: {', '.join(source['unknown'])}")
    lines += [f"  under-recorded: {n}" for n in source.get("under_recorded", [])]
    lines += [f"  note: {n}" for n in source.get("notes", [])]
    return lines


def _without_device(steps: int, counted: int) -> str:
    """Steps with no device work tied to them are in the timeline but in none of its figures: say how many."""
    return f", {steps - counted} without device work (in no device figure)" if counted < steps else ""


def _steps_from(how: str) -> str:
    return how if how.startswith(("inferred", "no step")) else f"from {how}"


def _busy(summary: dict) -> str:
    if summary.get("busy_pct") is None:
        return "  busy: unknown (no step has a compute span)"
    if summary.get("busy_basis") != "device_ops":
        return f"  busy: {summary['busy_pct']:.1f}% (the steps' compute spans)"
    who = " (rank 0)" if len(summary.get("ranks") or []) > 1 else ""
    line = f"  busy{who}: {summary['busy_pct']:.1f}% (device ops: what the device ran over the steps' window)"
    if summary.get("busy_pct_steps") is not None:
        line += f"; {summary['busy_pct_steps']:.1f}% by the steps' compute spans (they see idle between steps only)"
    return line


def _rank_lines(summary: dict) -> list[str]:
    """One line per rank (device busy, collectives, the idle's top cause), and the straggler with its evidence."""
    ranks = summary.get("straggler") and summary.get("ranks") or []
    lines = []
    for r in ranks:
        top = next(iter(r.get("idle_us_by_cause") or {}), None)
        lines.append(f"  rank {r['rank']}: busy {r['busy_pct']:.1f}%, collectives {r['collective_us'] / 1e3:.2f} ms, "
                     f"idle {(r['idle_between_us'] + r['idle_inside_us']) / 1e3:.2f} ms"
                     + (f" (most: {top})" if top else "") + f", host late {r['host_late_us'] / 1e3:.2f} ms")
    straggler = summary.get("straggler") or {}
    if ranks:
        lines.append(f"  straggler: rank {straggler['rank']}: {straggler['evidence']}" if straggler.get("rank")
                     is not None else f"  straggler: none ({straggler.get('reason', '')})")
    return lines


def _causes(what: str, total_us: float | None, by_cause: dict | None) -> str:
    if not total_us:
        return f"  {what}: none"
    top = sorted((by_cause or {}).items(), key=lambda kv: -kv[1])
    parts = [f"{c} {us / 1e3:.2f} ms ({100 * us / total_us:.0f}%)" for c, us in top[:TOP_CAUSES]]
    if len(top) > TOP_CAUSES:
        parts.append(f"{len(top) - TOP_CAUSES} more")
    return f"  {what}: {total_us / 1e3:.2f} ms: " + ", ".join(parts)


def _seconds(s: float) -> str:
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.1f} ms"


def _size(path: Path) -> str:
    n = path.stat().st_size
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _fail(msg: str) -> int:
    print(f"batchscope: {msg}", file=sys.stderr, flush=True)
    return 2
