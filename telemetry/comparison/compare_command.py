"""`batchscope compare BASE... [-- NEW...]`: open the recordings, compare, print, write, and pick the exit code.

Exit codes (DESIGN.md §6): 0 when nothing regressed beyond `--fail-above` (or none was given), 1 when the device
step time is `slower` by more than it, 2 on input that cannot be compared. A warning (different models or
hardware) is the first line printed.
"""
from __future__ import annotations

import json
import math
import os
import sys

from .matched import compare
from .inputs import CompareInputError, open_recordings
from .text import markdown, text_lines

EXIT_OK, EXIT_REGRESSED, EXIT_BAD_INPUT = 0, 1, 2


def split_sides(recordings: list[str], new: list[str] | None) -> tuple[list[str], list[str]]:
    """BASE and NEW recordings: given apart (`A1 A2 -- B1 B2`), or two recordings, one a side."""
    if new:
        return recordings, new
    if len(recordings) == 2:
        return recordings[:1], recordings[1:]
    if new is not None and not new:
        raise CompareInputError("nothing after --: give NEW's recordings after it")
    raise CompareInputError(f"{len(recordings)} recording{'s' * (len(recordings) != 1)} given: compare takes BASE "
                            f"and NEW, one each, or several a side with -- between them (A1 A2 -- B1 B2)")


def run(recordings: list[str], new: list[str] | None, json_out: str | None = None, markdown_out: str | None = None,
        fail_above: float | None = None, min_effect: float | None = None) -> int:
    for option, value in (("--fail-above", fail_above), ("--min-effect", min_effect)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            return _fail(f"{option} takes a percentage of 0 or more, got {value:g}")
    try:
        base_specs, new_specs = split_sides(recordings, new)
        base = [r for spec in base_specs for r in open_recordings(spec)]
        new_recs = [r for spec in new_specs for r in open_recordings(spec)]
        result = compare(base, new_recs, min_effect_pct=min_effect)
    except CompareInputError as e:
        for warning in getattr(e, "warnings", ()):
            print(f"warning: {warning}", flush=True)
        return _fail(f"cannot compare: {e}")
    code = with_exit_code(result, fail_above)["exit_code"]
    print("\n".join(text_lines(result)), flush=True)
    for path, text in ((json_out, lambda: json.dumps(result, indent=1)), (markdown_out, lambda: markdown(result))):
        if path:
            try:
                _write(path, text())
            except OSError as e:
                return _fail(f"cannot write {path}: {e.strerror or e}")
    if code == EXIT_REGRESSED:
        ratio = result["step_time_ratio"]["value"]
        _say(f"regressed: device step time {100 * (ratio - 1):+.1f}%, beyond --fail-above {fail_above:g}%")
    return code


def with_exit_code(result: dict, fail_above: float | None) -> dict:
    """The result as --json writes it: with `fail_above_pct` and the `exit_code` it gives (the server answers the
    same document)."""
    result["fail_above_pct"] = fail_above
    result["exit_code"] = exit_code(result, fail_above)
    return result


def exit_code(result: dict, fail_above: float | None) -> int:
    """1 when the overall verdict is `slower` and NEW/BASE exceeds 1 + PCT/100; else 0."""
    ratio = result["step_time_ratio"]["value"]
    if fail_above is None or result["verdict"] != "slower" or ratio is None:
        return EXIT_OK
    return EXIT_REGRESSED if ratio > 1 + fail_above / 100 else EXIT_OK


def _write(path: str, text: str) -> None:
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + ("" if text.endswith("\n") else "\n"))


def _say(msg: str) -> None:
    print(f"batchscope: {msg}", file=sys.stderr, flush=True)


def _fail(msg: str) -> int:
    _say(msg)
    return EXIT_BAD_INPUT
