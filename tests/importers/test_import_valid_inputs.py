"""Every valid trace reads, and what the import could not see is said: integers beyond 64 bits (valid JSON the C
parser refuses), a file cut before its device events or inside its last step, device ops outside the steps'
window, a GPU missing from deviceProperties, a folder of rank files, and vLLM's execute_model Python frames as
step markers where its annotations are missing."""
from __future__ import annotations

import json

import pytest

from batchscope.app.cli import main as cli_main
from batchscope.telemetry.importers import NoDeviceActivityError, TraceImportError, import_trace, parallel_read
from kineto_builder import KinetoTrace

BIG = 18446744073709551615          # 2^64 - 1: RTP-LLM's GPU process sort_index
REPRO = ('{"traceEvents":[{"name":"process_sort_index","ph":"M","pid":0,"tid":0,"args":{"sort_index":%d}},'
         '{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":1,'
         '"args":{"device":0,"stream":7,"correlation":1}}]}' % BIG)


def steps(n: int, big_sort_index: bool = False) -> KinetoTrace:
    tr = KinetoTrace()
    for k in range(n):
        t = 200 * k
        tr.annotation(f"ProfilerStep#{k + 1}", t, 200)
        tr.launch(t + 10, 3, kernel_at=t + 30, kernel_dur=100)
        tr.sync(t + 20, 115)
    if big_sort_index:
        tr.events.append({"name": "process_sort_index", "ph": "M", "pid": 0, "tid": 0, "args": {"sort_index": BIG}})
    return tr


def test_an_integer_beyond_64_bits_is_valid_json_and_imports(tmp_path):
    path = tmp_path / "rtp.json"
    path.write_text(REPRO)
    tl = import_trace(path, workers=1)
    assert tl["summary"]["steps"] == 1 and tl["summary"]["busy_pct"] == 100.0
    assert any("beyond 64 bits" in n for n in tl["meta"]["source"]["notes"])


def test_an_integer_beyond_64_bits_in_one_piece_of_a_large_file(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel_read, "CHUNK_BYTES", 16 * 1024)
    path = steps(150, big_sort_index=True).write(tmp_path / "big.json")
    plain = steps(150).write(tmp_path / "plain.json")
    two, one = import_trace(path, workers=2), import_trace(plain, workers=1)
    assert [s["compute_us"] for s in two["steps"]] == [s["compute_us"] for s in one["steps"]]
    assert any("beyond 64 bits" in n for n in two["meta"]["source"]["notes"])
    assert not any("beyond 64 bits" in n for n in one["meta"]["source"]["notes"])


def device_events_last(tr: KinetoTrace) -> bytes:
    """The trace as Kineto writes it: host events first, the device's (pid = device) after them."""
    doc = tr.to_dict()
    doc["traceEvents"].sort(key=lambda e: e.get("pid") == tr.device and e.get("ph") != "M")
    return json.dumps(doc, indent=1).encode()


def test_a_file_cut_before_its_device_events_says_what_the_cut_lost(tmp_path):
    text = device_events_last(steps(40))
    path = tmp_path / "cut.json"
    path.write_bytes(text[: len(text) * 2 // 5])
    with pytest.raises(NoDeviceActivityError, match="cut before its device events") as err:
        import_trace(path, partial=True)
    assert "CPU-only" not in str(err.value)


def test_a_partial_import_leaves_out_the_step_the_cut_went_through(tmp_path):
    text = json.dumps(steps(40).to_dict(), indent=1).encode()
    path = tmp_path / "cut.json"
    path.write_bytes(text[: len(text) // 2])
    whole = import_trace(steps(40).write(tmp_path / "whole.json"))
    tl = import_trace(path, partial=True)
    notes = tl["meta"]["source"]["notes"]
    last = tl["steps"][-1]["step"]
    assert any(f"the last step ({last + 1}) may have lost device work to the cut" in n for n in notes), notes
    kept = {s["step"]: s["compute_us"] for s in whole["steps"]}
    assert all(kept[s["step"]] == s["compute_us"] for s in tl["steps"])     # every step kept is whole


def test_the_cli_counts_the_steps_the_figures_hold_and_says_how_steps_were_found(tmp_path, capsys):
    tr = KinetoTrace()                         # no markers: steps inferred from the blocking calls
    for k in range(6):
        t = 300 * k
        tr.launch(t + 10, 3, kernel_at=t + 20, kernel_dur=60)
        tr.launch(t + 15, 3, kernel_at=t + 80, kernel_dur=60)
        tr.sync(t + 20, 125)
    path = tr.write(tmp_path / "plain.json.gz")
    assert cli_main(["import", str(path)]) == 0
    out = capsys.readouterr().out
    tl = json.loads((tmp_path / "plain.timeline.json").read_text())
    assert "from inferred" not in out and "; inferred from the launching thread's blocking calls" in out
    assert f"steps: {len(tl['steps'])} (" in out and "steps)" not in tl["meta"]["source"]["steps_from"]


def test_device_ops_outside_the_steps_window_are_noted_not_dropped_silently(tmp_path):
    tr = steps(5)
    tr.kernel("before_any_step", -500, 300, corr=None)
    tl = import_trace(tr.write(tmp_path / "t.json"))
    note = next(n for n in tl["meta"]["source"]["notes"] if "before the first step" in n)
    assert "before the first step (0.30 ms)" in note and "in no figure" in note


def test_a_gpu_missing_from_device_properties_keeps_the_name_its_peers_share(tmp_path):
    tr = steps(3)
    tr.header["deviceProperties"] = [{"id": 4, "name": "NVIDIA H200"}, {"id": 5, "name": "NVIDIA H200"}]
    tl = import_trace(tr.write(tmp_path / "t.json"))
    assert tl["meta"]["gpu"] == "NVIDIA H200"


def test_a_folder_stands_for_the_traces_in_it(tmp_path):
    from test_import_headline import straggler_rank

    run = tmp_path / "run"
    run.mkdir()
    straggler_rank(run, 0, late=False)
    straggler_rank(run, 1, late=True)
    (run / "notes.txt").write_text("not a trace")
    tl = import_trace(run)
    assert [f["name"] for f in tl["meta"]["source"]["files"]] == ["worker_rank0.pt.trace.json.gz",
                                                                   "worker_rank1.pt.trace.json.gz"]
    from batchscope.app.server.replay import read_timeline_file        # `batchscope replay FOLDER` too
    assert read_timeline_file(run)["summary"]["straggler"] == tl["summary"]["straggler"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceImportError, match="a folder with no trace file in it"):
        import_trace(tmp_path / "empty")


def test_vllm_execute_model_frames_are_its_steps_where_annotations_are_missing(tmp_path):
    tr = KinetoTrace()
    frame = "vllm/v1/worker/gpu_model_runner.py(1834): execute_model"
    for k in range(4):
        t = 300 * k
        tr.python(frame, t, 200)
        tr.launch(t + 10, 3, kernel_at=t + 20, kernel_dur=40)
        tr.launch(t + 100, 3, kernel_at=t + 110, kernel_dur=30)
        tr.sync(t + 150, 20)
    tl = import_trace(tr.write(tmp_path / "vllm.json.gz"))
    src = tl["meta"]["source"]
    assert src["engine"] == "vllm" and src["steps_from"] == "vLLM's gpu_model_runner execute_model Python frames"
    assert "steps" not in src["inferred"]
    assert [s["compute_us"] for s in tl["steps"]] == [[300 * k + 20, 300 * k + 140] for k in range(4)]


def under(tl: dict) -> list[str]:
    return tl["meta"]["source"]["under_recorded"]


def test_a_healthy_trace_under_records_nothing(tmp_path):
    assert under(import_trace(steps(10).write(tmp_path / "t.json"))) == []


def test_graph_launches_without_their_nodes_are_said(tmp_path):
    tr = KinetoTrace()
    for k in range(10):
        t = 200 * k
        tr.annotation(f"ProfilerStep#{k + 1}", t, 200)
        tr.graph(t + 10, 5, kernels=[(t + 20, 150)])          # one record for the whole graph
    notes = under(import_trace(tr.write(tmp_path / "g.json")))
    assert any("10 CUDA-graph launches show at most one device record each" in n for n in notes), notes


def test_launches_the_profiler_dropped_are_said(tmp_path):
    tr = steps(12)
    for k in range(12):
        tr.runtime("launch", 200 * k + 150, 3)                # no kernel in the file for these
    notes = under(import_trace(tr.write(tmp_path / "d.json")))
    assert any(n.startswith("11 of 23 kernel launches have no device record") for n in notes), notes


def test_a_window_of_a_few_steps_is_said_to_be_short(tmp_path, capsys):
    path = steps(3).write(tmp_path / "short.json")
    assert under(import_trace(path)) == ["only 3 steps with device work: too short a window for the figures' "
                                         "medians (ms/step, idle per step) and for any comparison to stand on"]
    assert cli_main(["import", str(path)]) == 0
    assert "  under-recorded: only 3 steps with device work" in capsys.readouterr().out


def test_steps_without_device_work_are_said_before_any_figure(tmp_path, capsys):
    tr = KinetoTrace()
    for k in range(10):
        t = 200 * k
        tr.annotation(f"ProfilerStep#{k + 1}", t, 200)
        if k != 4:                                             # step 5's launch is not in the file
            tr.launch(t + 10, 3, kernel_at=t + 30, kernel_dur=100)
    path = tr.write(tmp_path / "holes.json")
    assert under(import_trace(path)) == ["1 of 10 steps have no device work in the trace (their device records or "
                                         "launches are missing): every figure stands on the other 9"]
    assert cli_main(["import", str(path)]) == 0
    out = capsys.readouterr().out
    assert "steps: 10 (1-10, 9 sync), 1 without device work (in no device figure)" in out
    assert "[under-recorded: see below]" in out
