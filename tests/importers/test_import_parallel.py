"""A large trace is parsed on every core: cut into pieces at event boundaries, each parsed in a worker. The pieces
are made small here so small traces get many: the result must be the one-process reader's, a cut that lands in
a nested object must fall back to it, and truncated files must behave as they do there."""
from __future__ import annotations

import gzip
import json

import pytest

from batchscope.telemetry.importers import TruncatedTraceError, import_trace, opening, parallel_read
from kineto_builder import KinetoTrace


@pytest.fixture
def small_pieces(monkeypatch):
    monkeypatch.setattr(parallel_read, "CHUNK_BYTES", 16 * 1024)


def many_steps(n: int = 120, nested_args: bool = False) -> KinetoTrace:
    tr = KinetoTrace()
    for k in range(n):
        t = 200 * k
        tr.annotation(f"execute_context_0(0)_generation_{k % 7 + 1}({k % 7 + 1})", t, 150)
        tr.cpu_op("aten::mm", t + 5, 20)
        tr.launch(t + 10, 3, kernel_at=t + 30, kernel_dur=40)
        tr.launch(t + 50, 3, kernel_at=t + 75, kernel_dur=40)
        tr.sync(t + 60, 60)
    if nested_args:        # objects inside an event's args, shaped like the next event's start
        first_op = next(e for e in tr.events if e.get("cat") == "cpu_op")
        first_op["args"]["inputs"] = [{"ph": "X", "ts": 1}, {"ph": "X", "ts": 2}] * 400
    return tr


def comparable(tl: dict) -> list:
    return [(s["step"], s["compute_us"], s["gpu_idle_before_us"], s["idle_by_cause_us"],
             s.get("idle_inside_by_cause_us")) for s in tl["steps"]]


def test_pieces_parsed_in_workers_give_the_one_process_result(tmp_path, small_pieces):
    path = many_steps().write(tmp_path / "t.json")
    assert path.stat().st_size > 10 * parallel_read.CHUNK_BYTES
    one = import_trace(path, workers=1)
    two = import_trace(path, workers=2)
    assert comparable(two) == comparable(one) and len(two["steps"]) == 120
    assert two["summary"]["busy_pct_device_ops"] == one["summary"]["busy_pct_device_ops"]
    gz = import_trace(many_steps().write(tmp_path / "t.json.gz"), workers=2)
    assert comparable(gz) == comparable(one)


def test_keys_after_the_events_and_a_bare_array_in_pieces(tmp_path, small_pieces):
    tr = many_steps()
    after = import_trace(tr.write(tmp_path / "after.json", keys_after=True), workers=2)
    assert after["meta"]["source"]["trace_start"] is not None
    bare = import_trace(tr.write(tmp_path / "bare.json", array=True), workers=2)
    assert comparable(after) == comparable(bare) == comparable(import_trace(tmp_path / "after.json", workers=1))


def test_a_cut_inside_an_events_args_falls_back_to_one_process(tmp_path, small_pieces, monkeypatch):
    path = many_steps(nested_args=True).write(tmp_path / "nested.json")
    fell_back = []
    real = parallel_read.read_events_parallel

    def spy(*args, **kw):
        got = real(*args, **kw)
        fell_back.append(got is None)
        return got
    monkeypatch.setattr("batchscope.telemetry.importers.reading.read_events_parallel", spy)
    tl = import_trace(path, workers=2)
    assert fell_back == [True]
    assert comparable(tl) == comparable(import_trace(path, workers=1))


def test_truncated_files_in_pieces(tmp_path, small_pieces):
    text = json.dumps(many_steps().to_dict(), indent=1).encode()
    cut_gz = tmp_path / "cut.json.gz"
    cut_gz.write_bytes(gzip.compress(text)[: len(gzip.compress(text)) * 2 // 3])
    with pytest.raises(TruncatedTraceError):
        import_trace(cut_gz, workers=2)
    part = import_trace(cut_gz, workers=2, partial=True)
    assert any("ends early" in n for n in part["meta"]["source"]["notes"])
    assert 40 < len(part["steps"]) < 120
    cut_text = tmp_path / "cut.json"
    cut_text.write_bytes(text[: len(text) // 2])
    with pytest.raises(TruncatedTraceError):
        import_trace(cut_text, workers=2)                 # the one-process reader names the problem


def test_progress_while_pieces_are_read(tmp_path, small_pieces, monkeypatch):
    monkeypatch.setattr(opening, "PROGRESS_EVERY", 16 * 1024)
    path = many_steps().write(tmp_path / "t.json")
    seen = []
    import_trace(path, workers=2, progress=lambda done, total: seen.append(done))
    assert len(seen) > 5 and seen == sorted(seen) and seen[-1] == path.stat().st_size
