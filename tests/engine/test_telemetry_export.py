"""batchscope.timeline/1 round trips, malformed files are refused with a reason, Perfetto files are well formed."""
from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from batchscope.telemetry import SCHEMA, SCHEMA_ID, TimelineError, load_timeline, to_perfetto, validate_timeline

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def timeline(switched_timeline) -> dict:
    return switched_timeline(gpu=True)


def test_the_published_schema_is_the_one_the_loader_uses():
    Draft202012Validator.check_schema(SCHEMA)
    assert json.loads((DOCS / "timeline.schema.json").read_text()) == SCHEMA
    assert SCHEMA["properties"]["schema"]["const"] == SCHEMA_ID == "batchscope.timeline/1"
    assert (DOCS / "timeline.md").exists()


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu-events", "cpu"])
def test_a_timeline_round_trips_through_json_and_the_schema(gpu, tmp_path, switched_timeline):
    tl = switched_timeline(gpu)
    assert set(tl) >= {"schema", "meta", "steps", "requests", "nvml", "mode_changes", "summary"}
    assert set(tl["meta"]) >= {"model", "device", "gpu", "dtype", "config", "created"}
    assert tl["nvml"] and all(set(s) >= {"t_us", "gpu_util", "mem_util", "mem_used_mb", "power_w",
                                         "sm_clock_mhz"} for s in tl["nvml"])
    path = tmp_path / "run.json"
    path.write_text(json.dumps(tl))
    assert load_timeline(path) == tl
    assert load_timeline(str(path)) == tl
    assert load_timeline(path.read_text()) == tl
    assert load_timeline(path.read_bytes()) == tl
    assert load_timeline(io.BytesIO(path.read_bytes())) == tl
    assert load_timeline(tl) is tl


def broken(tl, edit):
    tl = copy.deepcopy(tl)
    edit(tl)
    return tl


def _set(path, value):
    def edit(tl):
        node = tl
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


def _delete(path):
    def edit(tl):
        node = tl
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return edit


MALFORMED = {
    "wrong schema id": (_set(["schema"], "batchscope.timeline/0"), "expected 'batchscope.timeline/1'"),
    "no steps": (_delete(["steps"]), "'steps' is a required property"),
    "step without cpu spans": (_delete(["steps", 1, "cpu"]), "$.steps[1]: 'cpu' is a required property"),
    "a span of three numbers": (_set(["steps", 0, "cpu", "fill"], [1.0, 2.0, 3.0]), "$.steps[0].cpu.fill"),
    "a span of text": (_set(["steps", 0, "gpu", "compute"], ["a", "b"]), "is not of type 'number'"),
    "an unknown mode": (_set(["steps", 2, "mode"], "turbo"), "$.steps[2].mode"),
    "an unknown idle cause": (_set(["steps", 2, "idle_cause"], "cosmic rays"), "$.steps[2].idle_cause"),
    "a negative token count": (_set(["requests", 0, "output_tokens"], -1), "$.requests[0].output_tokens"),
    "an nvml sample without power": (_delete(["nvml", 0, "power_w"]), "'power_w' is a required property"),
    "a mode change without step": (_delete(["mode_changes", 0, "step"]), "$.mode_changes[0]"),
    "steps out of order": (_set(["steps", 3, "step"], 0), "steps must increase"),
    "a span that ends before it starts": (_set(["steps", 1, "cpu", "wait"], [9e9, 1.0]), "ends before it starts"),
    "host spans out of loop order": (_set(["steps", 1, "cpu", "schedule"], [9e8, 9e8]), "before schedule ended"),
    "tokens not matching their times": (_set(["requests", 0, "output_tokens"], 99), "output_tokens is 99"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_timeline_is_rejected_with_a_clear_message(timeline, name):
    edit, message = MALFORMED[name]
    with pytest.raises(TimelineError) as err:
        validate_timeline(broken(timeline, edit), "run.json")
    assert message in str(err.value)
    assert str(err.value).startswith("run.json: ")


def test_files_that_are_not_timelines_are_rejected(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "batchscope.timeline/1", "steps": [1, 2,]}')
    with pytest.raises(TimelineError, match=r"bad.json: not valid JSON: line 1 column \d+"):
        load_timeline(bad)
    with pytest.raises(TimelineError, match="expected a JSON object at the top level, got list"):
        load_timeline("[1, 2]")
    with pytest.raises(TimelineError, match="cannot read"):
        load_timeline(tmp_path / "missing.json")
    with pytest.raises(TimelineError, match="not UTF-8"):
        load_timeline(b"\xff\xfe{")


# ---- Perfetto -----------------------------------------------------------------------------------------------------
def perfetto_problems(trace: dict) -> list[str]:
    """Structural checks of a Chrome Trace Event file, written independently of the exporter."""
    problems = []
    events = trace["traceEvents"]
    procs = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    tracks: dict = {}
    for e in events:
        if e["ph"] == "M":
            continue
        if e["pid"] not in procs:
            problems.append(f"pid {e['pid']} unnamed")
        if (e["pid"], e.get("tid")) not in threads:
            problems.append(f"pid/tid {e['pid']}/{e.get('tid')} unnamed")
        if not isinstance(e.get("ts"), (int, float)):
            problems.append(f"{e['name']}: no ts")
        if e["ph"] == "X":
            if not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
                problems.append(f"{e['name']}: bad dur")
                continue
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
        elif e["ph"] == "C":
            if not e.get("args") or not all(isinstance(v, (int, float)) for v in e["args"].values()):
                problems.append(f"counter {e['name']}: non-numeric args")
        elif e["ph"] != "i":
            problems.append(f"unexpected phase {e['ph']}")
    for key, spans in tracks.items():
        open_ends: list = []
        for s, end, name in sorted(spans, key=lambda x: (x[0], -x[1])):
            while open_ends and open_ends[-1] <= s:
                open_ends.pop()
            if open_ends and end > open_ends[-1]:
                problems.append(f"track {key}: {name} [{s}, {end}] partially overlaps a span ending {open_ends[-1]}")
            open_ends.append(end)
    return problems


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu-events", "cpu"])
def test_the_perfetto_file_is_structurally_valid(gpu, switched_timeline):
    tl = switched_timeline(gpu)
    trace = json.loads(json.dumps(to_perfetto(tl)))
    assert perfetto_problems(trace) == []
    events = trace["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "engine thread" in names and "compute idle (cause)" in names
    if gpu:
        assert {"H2D stream", "compute stream", "D2H stream"} <= names
    host = {e["pid"] for e in events if e["ph"] == "X" and e["cat"] == "host" and e["name"].startswith("schedule")}
    device = {e["pid"] for e in events if e["ph"] == "X" and e["name"].startswith("compute ")}
    assert host and device and host.isdisjoint(device)         # host and device lanes on separate tracks
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"batch requests", "KV usage %", "tokens/s", "queue depth"} <= counters
    assert "host CPU %" in counters                             # from the psutil samples
    switches = [e for e in events if e["ph"] == "i"]
    assert [e["name"] for e in switches] == ["mode sync -> async"]
    steps_x = [e for e in events if e["ph"] == "X" and e["cat"] == "host"]
    assert len(steps_x) == 5 * len(tl["steps"])


def test_nvml_counters_and_request_lanes(switched_timeline):
    tl = switched_timeline(gpu=True)
    for i, s in enumerate(tl["nvml"]):
        s.update(gpu_util=90.0 + i, mem_util=40.0, power_w=300.0)
    trace = to_perfetto(tl)
    counters = {e["name"] for e in trace["traceEvents"] if e["ph"] == "C"}
    assert {"NVML utilization %", "power W"} <= counters
    requests = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "request"]
    assert len([e for e in requests if e["name"].startswith("request ")]) == len(tl["requests"])
    assert perfetto_problems(trace) == []


def test_jittery_spans_are_clipped_so_no_track_partially_overlaps(timeline):
    tl = copy.deepcopy(timeline)
    # a clock hiccup: one step's compute starts 30 µs before the previous one ended
    a, b = tl["steps"][4], tl["steps"][5]
    b["gpu"]["compute"][0] = a["gpu"]["compute"][1] - 30.0
    trace = to_perfetto(tl)
    assert perfetto_problems(trace) == []
    assert trace["otherData"]["clipped_events"] >= 1


def test_long_timelines_are_capped_oldest_first(timeline):
    tl = copy.deepcopy(timeline)
    template = tl["steps"][-1]
    steps = []
    for i in range(3000):
        rec = copy.deepcopy(template)
        shift = i * 5000.0
        rec["step"] = i
        rec["cpu"] = {k: [s + shift, e + shift] for k, (s, e) in template["cpu"].items()}
        rec["gpu"] = {k: [s + shift, e + shift] for k, (s, e) in template["gpu"].items()}
        rec["compute_us"] = rec["gpu"]["compute"]
        steps.append(rec)
    tl["steps"] = steps
    trace = to_perfetto(tl, max_events=8000)
    assert trace["otherData"]["truncated_steps"] > 0
    assert len(trace["traceEvents"]) <= 8000 + 100
    kept = {e["args"]["step"] for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "host"}
    assert max(kept) == 2999 and min(kept) == trace["otherData"]["truncated_steps"]
    assert len(json.dumps(trace)) < 256 * 2**20
    assert perfetto_problems(trace) == []


def test_the_checker_itself_catches_broken_files():
    bad = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 1, "args": {"name": "host"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "engine thread"}},
        {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0.0, "dur": 10.0},
        {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 5.0, "dur": 10.0},
        {"ph": "X", "name": "c", "pid": 1, "tid": 2, "ts": 0.0},
    ]}
    problems = " | ".join(perfetto_problems(bad))
    assert "partially overlaps" in problems and "1/2 unnamed" in problems and "c: bad dur" in problems
