"""Profiler traces of any engine -> ordinary `batchscope.timeline/1` timelines (docs/import.md).

    from batchscope.telemetry.importers import import_trace
    timeline = import_trace("rank0.pt.trace.json.gz")                  # or several ranks' files of one run
    timeline = import_trace(paths, kernels=True, progress=lambda done, total: ...)

Kineto / torch.profiler Chrome-trace JSON, plain or gzipped, whole or an excerpt, CUDA or ROCm, is streamed (never
loaded whole), split into steps by the engine's own markers (or steps inferred from the trace, said so in
`meta.source`), and every idle microsecond of the device is named: between steps as batchscope's own recordings
do, and inside them, which CUDA events cannot see. Bad input raises a one-line TraceImportError (a TimelineError).

A per-step record stream that is not a trace (forward-pass metrics, iteration logs) enters by the step-source
seam instead: `timeline_from_steps(source)` (step_source.py).

Which file holds what:
  reading        opening.py (plain or gzipped), kineto_json.py and parallel_read.py (Chrome-trace JSON, on every
                 core), nsys_sqlite.py (Nsight Systems exports), columns.py and tables.py (the events as columns),
                 names.py (runtime calls and op kinds by name), bad_trace.py (the errors), rank_files.py
  engines/       one file per engine (<name>_profile.py): how its traces are recognised, its step markers, the
                 host phases its ranges stand for; engines/__init__.py lists them (adding an engine: docs/import.md)
  recognition.py which engine (from the profiles) and vendor a trace came from
  markers.py     finding the step markers of the preferred kind (and the kinds any engine's trace may hold)
  step_plans.py  markers -> steps' windows and host phases; inference.py: steps without markers
  spans.py, busy.py, gaps.py, host_activity.py, phases.py
                 device ops -> steps' spans, busy time, and every idle stretch named by what the host was doing
  file_analysis.py one file analysed; to_timeline.py, steprecords.py, headline.py, coverage.py, kernel_spans.py,
                 agreement.py: the analyses -> one timeline
  step_source.py the seam for step streams that are not traces
"""
from __future__ import annotations

import os
from pathlib import Path

from ..export import validate_timeline
from .file_analysis import analyse
from .bad_trace import (ClockSkewError, NoDeviceActivityError, NotATraceError, TraceImportError,
                        TruncatedTraceError)
from .rank_files import order_ranks
from .reading import read_trace
from .step_source import SourceStep, StepSource, timeline_from_steps
from .to_timeline import build

__all__ = ["import_trace", "TraceImportError", "NotATraceError", "TruncatedTraceError", "NoDeviceActivityError",
           "ClockSkewError", "SourceStep", "StepSource", "timeline_from_steps"]


def import_trace(paths, *, kernels: bool = False, progress=None, partial: bool = False,
                 workers: int | None = None) -> dict:
    """One trace file, or several ranks' files of one run (a list), as a validated timeline dict.

    kernels:  also keep every device op and idle stretch (`timeline["kernels"]`, drawn by the Perfetto export);
              the timeline grows with the trace instead of with its steps.
    progress: called as progress(bytes_done, bytes_total) while the files are read (compressed bytes for .gz).
    partial:  import the part of a truncated file that was written, noting the cut, instead of refusing it.
    workers:  processes that parse a large file's events (default one per core; 1: this process only)."""
    paths = [str(paths)] if isinstance(paths, (str, Path)) else [str(p) for p in paths]
    paths = [f for p in paths for f in (_folder_traces(p) if os.path.isdir(p) else [p])]
    if not paths:
        raise TraceImportError("no trace files given")
    for p in paths:
        if not os.path.isfile(p):
            raise TraceImportError(f"{p}: no such file")
    sizes = [os.path.getsize(p) for p in paths]
    total, done_before = sum(sizes), 0
    tables = []
    for path, size in zip(paths, sizes):
        report = (lambda n, base=done_before: progress(base + n, total)) if progress else None
        tables.append(read_trace(path, report, partial, workers))
        done_before += size
        if progress:
            progress(done_before, total)
    analyses = [analyse(t, keep_stretches=kernels) for t in tables]
    timeline = build(analyses, order_ranks(tables), keep_kernels=kernels)
    return validate_timeline(timeline, paths[0])


TRACE_ENDINGS = (".json", ".json.gz", ".sqlite")


def _folder_traces(folder: str) -> list[str]:
    """A folder stands for the trace files in it (one run's ranks, as profilers write them), in name order."""
    found = sorted(os.path.join(folder, n) for n in os.listdir(folder)
                   if n.endswith(TRACE_ENDINGS) and not n.endswith(".timeline.json")
                   and os.path.isfile(os.path.join(folder, n)))
    if not found:
        raise TraceImportError(f"{folder}: a folder with no trace file in it (*.json, *.json.gz, *.sqlite)")
    return found
