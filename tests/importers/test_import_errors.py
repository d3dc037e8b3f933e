"""Bad input: a clear one-line error naming the file (a TimelineError, never a traceback), or a timeline that says
what it could not determine."""
from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import pytest

from batchscope.telemetry import TimelineError
from batchscope.telemetry.importers import (ClockSkewError, NoDeviceActivityError, NotATraceError,
                                            TraceImportError, TruncatedTraceError, import_trace)
from kineto_builder import KinetoTrace


def fails(path, error=TraceImportError, match: str = "", **kw) -> str:
    with pytest.raises(error, match=match) as info:
        import_trace(path, **kw)
    msg = str(info.value)
    named = Path(path[-1] if isinstance(path, list) else path).name
    assert isinstance(info.value, TimelineError)
    assert "\n" not in msg and named in msg, msg
    return msg


def small_trace() -> KinetoTrace:
    tr = KinetoTrace()
    for k in range(3):
        tr.annotation(f"ProfilerStep#{k}", 100 * k, 100)
        tr.launch(100 * k + 5, 3, kernel_at=100 * k + 20, kernel_dur=50)
    return tr


@pytest.mark.parametrize("text, match", [
    (b"hello, trace", "not valid JSON"),
    (b"\xff\xfe\x00{", "not valid JSON"),
    (b'{"schemaVersion": 1, "deviceProperties": []}', "not a trace: no traceEvents"),
    (b"42", "a single number, not a trace"),
    (b"[[1, 2], [3]]", "not a trace"),
    (b'{"traceEvents": []}', "a trace with no events"),
    (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": "soon", "dur": 1}]}',
     "event 1 has a field of the wrong kind"),
    (b"", "empty file"),
])
def test_files_that_are_not_traces(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_bytes(text)
    fails(path, NotATraceError, match)


def test_a_truncated_gzip_is_refused_or_imported_in_part(tmp_path):
    tr = small_trace()
    for k in range(3, 400):
        tr.launch(100 * k + 5, 3, kernel_at=100 * k + 20, kernel_dur=50)
    data = gzip.compress(json.dumps(tr.to_dict()).encode())
    path = tmp_path / "cut.pt.trace.json.gz"
    path.write_bytes(data[: len(data) // 2])
    fails(path, TruncatedTraceError, "truncated: the gzip stream ends")
    tl = import_trace(path, partial=True)
    assert any("ends early" in n for n in tl["meta"]["source"]["notes"])
    assert tl["steps"]


def test_a_truncated_json_text_is_refused(tmp_path):
    text = json.dumps(small_trace().to_dict()).encode()
    path = tmp_path / "cut.json"
    path.write_bytes(text[: len(text) * 2 // 3])
    fails(path, TruncatedTraceError, "truncated: the JSON text stops")


def test_a_cpu_only_profile_has_no_device_activity(tmp_path):
    tr = KinetoTrace()
    tr.annotation("ProfilerStep#1", 0, 100)
    tr.cpu_op("aten::mm", 10, 50)
    fails(tr.write(tmp_path / "cpu.json.gz"), NoDeviceActivityError, "no device activity")


def test_a_trace_of_an_unknown_engine_imports_with_inferred_steps(tmp_path):
    tr = KinetoTrace()
    for k in range(5):
        tr.cpu_op("aten::mm", 200 * k, 40)
        tr.launch(200 * k + 50, 3, kernel_at=200 * k + 60, kernel_dur=100)
        tr.sync(200 * k + 54, 107)
    tl = import_trace(tr.write(tmp_path / "who.json"))
    src = tl["meta"]["source"]
    assert src["engine"] == "unknown" and "steps" in src["inferred"] and len(tl["steps"]) == 5
    assert {"request_ids", "kv_blocks_used", "prefill_tokens", "num_requests"} <= set(src["unknown"])


def rank_trace(tmp_path, rank: int, t0: float, nccl: bool = False):
    tr = KinetoTrace(pid=10 + rank, tid=10 + rank, device=rank, rank=rank)
    tr.annotation("ProfilerStep#1", t0, 100)
    tr.launch(t0 + 5, 3, kernel_at=t0 + 20, kernel_dur=50)
    return tr.write(tmp_path / f"r{rank}.json.gz")


def test_ranks_whose_clocks_cannot_be_lined_up_are_refused(tmp_path):
    files = [rank_trace(tmp_path, 0, 0), rank_trace(tmp_path, 1, 3.6e9)]      # an hour apart, nothing to align by
    fails(files, ClockSkewError, "do not overlap")


def test_two_files_of_one_rank_are_refused(tmp_path):
    a = rank_trace(tmp_path, 0, 0)
    b = tmp_path / "copy.json.gz"
    b.write_bytes(a.read_bytes())
    fails([a, b], TraceImportError, "rank 0")


NSYS_CPU_ONLY = Path(__file__).parents[1] / "fixtures" / "nsys-2022.4-cpu-only.sqlite"


def test_other_files(tmp_path):
    db = tmp_path / "report.sqlite"
    sqlite3.connect(db).execute("create table t (x)").connection.commit()
    fails(db, NotATraceError, "SQLite file, but not an Nsight Systems export")
    fails(tmp_path / "missing.json", TraceImportError, "no such file")
    with pytest.raises(TraceImportError, match="no trace files"):
        import_trace([])


def test_an_nsight_export_without_device_work_says_so():
    """A real export (Nsight Systems 2022.4, schema 3.0) of a process that ran no CUDA: its tables are read, and
    with no kernel, copy or memset there is no device idle time to name."""
    fails(NSYS_CPU_ONLY, NoDeviceActivityError, "no device activity")


def test_an_nsight_export_of_another_schema_is_refused_with_its_version(tmp_path):
    other = tmp_path / "newer.sqlite"
    other.write_bytes(NSYS_CPU_ONLY.read_bytes())
    con = sqlite3.connect(other)
    con.execute("UPDATE EXPORT_META_DATA SET value = '4' WHERE name = 'EXPORT_SCHEMA_VERSION_MAJOR'")
    con.execute("UPDATE EXPORT_META_DATA SET value = '4.1.0' WHERE name = 'EXPORT_SCHEMA_VERSION'")
    con.commit()
    con.close()
    msg = fails(other, TraceImportError, "schema 4.1.0")
    assert "2022.4.2.1" in msg and "3.x" in msg


def test_an_nsight_export_whose_tables_are_not_as_expected_is_one_line(tmp_path):
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(NSYS_CPU_ONLY.read_bytes())
    con = sqlite3.connect(broken)
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER)")     # a kernel table without its columns
    con.commit()
    con.close()
    fails(broken, TraceImportError, "does not understand")


def test_steps_whose_device_work_cannot_be_tied_to_them_say_so(tmp_path):
    tr = KinetoTrace()
    for k in range(2):
        tr.annotation("execute_context_0(0)_generation_2(2)", 100 * k, 50)
        tr.kernel("launched_by_another_process", 100 * k + 10, 20, corr=None)
    tl = import_trace(tr.write(tmp_path / "loose.json"))
    assert [s["compute_us"] for s in tl["steps"]] == [None, None]
    assert tl["summary"]["busy_pct"] is None                   # not a silently wrong figure
    notes = " ".join(tl["meta"]["source"]["notes"])
    assert "2 of 2 steps have no device work" in notes and "100% of device 0's op time belongs to no step" in notes
