"""Which change made it slower: two sets of recordings compared step by step at matched batch shapes, with
intervals that know their noise and a verdict per figure (`batchscope compare`, docs/compare.md).

    from batchscope.telemetry.comparison import compare, open_recordings
    result = compare(open_recordings("base.timeline.json.gz"), open_recordings("new.timeline.json.gz"))
    result["verdict"], result["step_time_ratio"]            # "slower", {"value": 1.12, "low": ..., "high": ...}

Rooms: inputs.py (any recording kind -> timelines), shapes.py (buckets and per-step figures), noise.py (bootstrap,
run spread, verdict rules), matched.py (the comparison), context.py (checks, settings, end-to-end figures),
text.py (terminal and Markdown).
"""
from .matched import SCHEMA_ID, compare
from .inputs import CompareInputError, Recording, open_recordings
from .text import markdown, text_lines

__all__ = ["compare", "open_recordings", "CompareInputError", "Recording", "SCHEMA_ID", "markdown", "text_lines"]
