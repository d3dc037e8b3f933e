"""What the importer knows of one engine's traces, as data: an `EngineProfile` per engine (one file each in this
folder, listed in `__init__.py`'s registry), read by the generic code that recognises the engine
(recognition.py), splits a trace into steps (markers.py, step_plans.py) and names what the host was doing
(phases.py)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class MarkerKind:
    """One kind of step marker: how its names are parsed and how its steps are cut.

    parse(name) -> the fields a marker of this kind carries (Marker's step, phase, mode, prefill, decode,
    requests; {} for none), or None when the name is not one of its markers. A trace holding several kinds is
    split by the one with the lowest `preference` (an engine whose profiling patches also write another engine's
    names ranks ahead of it)."""
    kind: str                          # meta.source.steps_from's key, Marker.kind
    preference: int
    description: str                   # meta.source.steps_from's words
    parse: Callable[[str], dict | None]
    python_frames: bool = False        # Python function rows (with_stack), not same-named ops
    evidence: str | None = "its step markers"   # why its markers name the engine (None: they do not)
    per_phase: bool = False            # each range is a host phase that names its step (batchscope's)
    host_timed: bool = False           # a CPU-only trace can be timed from these markers alone


@dataclass(frozen=True)
class EngineProfile:
    """One engine. Recognition, in order, over the registry: a marker kind of its, a top-level key of the trace
    (`header_keys`), a process name prefix, a source path in the trace's Python function rows."""
    name: str                                          # meta.source.engine
    markers: tuple[MarkerKind, ...] = ()
    # (regex searched in a host range's name, the host phase it stands for): the innermost match is the cause
    phases: tuple[tuple[str, str], ...] = ()
    # ranges named in the engine's own phase vocabulary (group 1 a phases.LABELS label): above blocking calls
    own_phases: re.Pattern | None = None
    header_keys: tuple[str, ...] = ()
    process_prefixes: tuple[str, ...] = ()
    source_path: re.Pattern | None = None
    # CPU-only traces: the Python functions of one loop turn, in loop order (phase, regex), the function that is
    # the forward where the turn has no `launch` function, and what the notes call the loop
    loop_functions: tuple[tuple[str, re.Pattern], ...] = ()
    loop_forward: re.Pattern | None = None
    loop_name: str = ""
    # False where the timeline schema's meta.source.engine has no value for it yet: reported as "unknown"
    reported: bool = True
