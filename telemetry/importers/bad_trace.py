"""Why a trace could not be imported, each a one-line message naming the file.

All are TimelineErrors (the replay loader's error), so a caller that already reports bad timelines reports bad
traces the same way, with no traceback.
"""
from __future__ import annotations

from ..export import TimelineError


class TraceImportError(TimelineError):
    """A profiler trace could not be turned into a timeline; the message says which file and why."""


class NotATraceError(TraceImportError):
    """The file is not JSON, or JSON that is not a Chrome/Kineto trace (no `traceEvents`), or empty."""


class TruncatedTraceError(TraceImportError):
    """The file ends before the trace does: a cut .gz, or JSON that stops mid-way (a profiler killed while writing)."""


class NoDeviceActivityError(TraceImportError):
    """The trace holds no kernel, copy or memset (a CPU-only profile) and no batchscope ranges to time steps by."""


class ClockSkewError(TraceImportError):
    """Several ranks' files whose clocks cannot be brought onto one timeline (or that come from different runs)."""
