"""Every input kind the importer takes: plain and gzipped files, excerpts without metadata, a bare array of events,
keys after the events, ROCm's HIP names, 2022-era category names, several devices of one process, several ranks'
files of one run (ranks found, clocks checked and aligned), and progress while reading."""
from __future__ import annotations

import gzip
import json

import pytest

from batchscope.telemetry import load_timeline
from batchscope.telemetry.importers import import_trace
from kineto_builder import BASE_NS, BASE_TS, KinetoTrace

NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgs)"


def two_steps(tr: KinetoTrace, t0: float = 0.0, nccl: bool = False) -> KinetoTrace:
    """ProfilerStep#1 [t0, t0+100]: kernels [t0+10,t0+40] and [t0+50,t0+60]; ProfilerStep#2 [t0+100, t0+200]:
    kernel [t0+130,t0+170] (and, with nccl, an all-reduce closing each step)."""
    tr.annotation("ProfilerStep#1", t0, 100)
    tr.launch(t0 + 2, 3, kernel_at=t0 + 10, kernel_dur=30)
    tr.launch(t0 + 45, 3, kernel_at=t0 + 50, kernel_dur=10)
    if nccl:
        tr.launch(t0 + 55, 3, kernel_at=t0 + 62, kernel_dur=8, name=NCCL)
    tr.annotation("ProfilerStep#2", t0 + 100, 100)
    tr.launch(t0 + 120, 3, kernel_at=t0 + 130, kernel_dur=40)
    if nccl:
        tr.launch(t0 + 165, 3, kernel_at=t0 + 171, kernel_dur=8, name=NCCL)
    return tr


def steps_of(tl: dict) -> list:
    return [(s["step"], s["compute_us"], s["gpu_idle_before_us"], s["idle_by_cause_us"]) for s in tl["steps"]]


def test_plain_and_gzipped_files_give_the_same_timeline(tmp_path):
    tr = two_steps(KinetoTrace())
    plain = import_trace(tr.write(tmp_path / "a.pt.trace.json"))
    gz = import_trace(tr.write(tmp_path / "a.pt.trace.json.gz"))
    assert steps_of(plain) == steps_of(gz)
    assert steps_of(plain) == [(1, [10, 60], None, {}), (2, [130, 170], 70.0, {"host_other": 60.0, "launch": 10.0})]
    assert gz["meta"]["source"]["files"][0]["name"] == "a.pt.trace.json.gz"
    # the gzip is told by its first bytes, not its name
    renamed = tmp_path / "a.json"
    renamed.write_bytes((tmp_path / "a.pt.trace.json.gz").read_bytes())
    assert steps_of(import_trace(renamed)) == steps_of(plain)


def test_the_trace_start_and_tool_are_in_meta_source(tmp_path):
    tl = import_trace(two_steps(KinetoTrace()).write(tmp_path / "a.json.gz"))
    src = tl["meta"]["source"]
    assert src["tool"] == "torch.profiler (Kineto)" and src["vendor"] == "nvidia"
    # the origin is the first event (ProfilerStep#1 at 0): baseTimeNanoseconds + its relative timestamp
    assert tl["meta"]["origin"]["unix_s"] == pytest.approx(BASE_NS / 1e9 + BASE_TS / 1e6, abs=1e-6)
    assert src["trace_start"].startswith("2026-12-")
    assert tl["meta"]["device"] == "cuda" and tl["meta"]["gpu"] == "NVIDIA H200"
    load_timeline(json.loads(json.dumps(tl)))                 # a file of it replays


def test_an_excerpt_without_metadata_rows_imports_the_same(tmp_path):
    tr = two_steps(KinetoTrace())
    whole = import_trace(tr.write(tmp_path / "whole.json"))
    excerpt = import_trace(tr.write(tmp_path / "excerpt.json", metadata=False))
    assert steps_of(excerpt) == steps_of(whole)


def test_keys_after_the_events_and_a_bare_array_of_events(tmp_path):
    tr = two_steps(KinetoTrace())
    after = import_trace(tr.write(tmp_path / "after.json.gz", keys_after=True))
    assert steps_of(after) == steps_of(import_trace(tr.write(tmp_path / "before.json.gz")))
    assert after["meta"]["source"]["trace_start"] is not None           # baseTimeNanoseconds came after
    bare = import_trace(tr.write(tmp_path / "bare.json", array=True))
    assert steps_of(bare) == steps_of(after)
    assert bare["meta"]["source"]["trace_start"] is None                 # nothing says when its clock started


def test_rocm_traces_with_hip_calls(tmp_path):
    tr = KinetoTrace(hip=True, gpu_name="AMD Instinct MI300X")
    tr.annotation("ProfilerStep#1", 0, 100)
    tr.launch(2, 3, kernel_at=10, kernel_dur=30)
    tr.sync(41, 9)                                     # hipStreamSynchronize inside the step
    tr.launch(50, 3, kernel_at=55, kernel_dur=10)
    tr.annotation("ProfilerStep#2", 100, 100)
    tr.graph(120, 10, kernels=[(135, 10), (146, 10)])  # hipGraphLaunch
    tl = import_trace(tr.write(tmp_path / "rocm.json.gz"))
    assert tl["meta"]["device"] == "rocm" and tl["meta"]["source"]["vendor"] == "amd"
    s1, s2 = tl["steps"]
    # idle [40,55]: nothing recorded [40,41], hipStreamSynchronize [41,50], the launch call [50,55]
    assert s1["idle_inside_by_cause_us"] == {"host_other": 1.0, "host_sync": 9.0, "launch": 5.0}
    assert s2["compute_us"] == [135, 156]
    assert s2["idle_by_cause_us"] == {"host_other": 55.0, "launch": 15.0}


def test_2022_category_names_and_absolute_timestamps(tmp_path):
    doc = two_steps(KinetoTrace(base_ns=None)).to_dict()
    legacy = {"cuda_runtime": "Runtime", "kernel": "Kernel", "gpu_memcpy": "Memcpy", "ac2g": "async_gpu"}
    for e in doc["traceEvents"]:
        e["cat"] = legacy.get(e.get("cat"), e.get("cat"))
        if "ts" in e:
            e["ts"] = e["ts"] - BASE_TS + 1665536373729077
    path = tmp_path / "old.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    tl = import_trace(path)
    assert steps_of(tl) == steps_of(import_trace(two_steps(KinetoTrace()).write(tmp_path / "new.json")))
    assert tl["meta"]["source"]["trace_start"].startswith("2022-10-12")


def test_two_devices_of_one_process_are_two_ranks(tmp_path):
    tr = two_steps(KinetoTrace())
    for t in (12, 132):
        corr = tr.runtime("launch", t, 2, flow=True)
        tr.events.append({"ph": "X", "cat": "kernel", "name": "k1", "pid": 1, "tid": 7, "ts": BASE_TS + t + 5,
                          "dur": 20, "args": {"device": 1, "stream": 7, "correlation": corr}})
    tl = import_trace(tr.write(tmp_path / "two.json.gz"))
    assert [r["device"] for r in tl["meta"]["info"]["ranks"]] == [0, 1]
    assert [(r["step"], r["rank"], r["compute_us"]) for r in tl["rank_steps"]] == [(1, 1, [17, 37]), (2, 1, [137, 157])]
    assert [r["rank"] for r in tl["summary"]["ranks"]] == [0, 1]


def rank_file(tmp_path, rank: int, skew_us: float = 0.0, named: bool = True, nccl: bool = True):
    tr = two_steps(KinetoTrace(pid=100 + rank, tid=100 + rank, device=rank, rank=rank if named else None),
                   t0=skew_us, nccl=nccl)
    return tr.write(tmp_path / f"worker_rank{rank}.pt.trace.json.gz")


def test_several_ranks_files_share_one_timeline(tmp_path):
    tl = import_trace([rank_file(tmp_path, 1), rank_file(tmp_path, 0)])        # the order given does not matter
    assert [f["rank"] for f in tl["meta"]["source"]["files"]] == [0, 1]
    assert [(r["rank"], r["device"], r["file_rank"]) for r in tl["meta"]["info"]["ranks"]] == [(0, 0, 0), (1, 1, 1)]
    assert [(r["step"], r["compute_us"]) for r in tl["rank_steps"]] == [(1, [10, 70]), (2, [130, 179])]
    assert [c["offset_us"] for c in tl["meta"]["source"]["clock"]] == [0.0]
    assert tl["summary"]["collective_us"] == 16.0


def test_ranks_named_only_by_their_files(tmp_path):
    tl = import_trace([rank_file(tmp_path, 1, named=False), rank_file(tmp_path, 0, named=False)])
    assert [f["name"] for f in tl["meta"]["source"]["files"]] == ["worker_rank0.pt.trace.json.gz",
                                                                   "worker_rank1.pt.trace.json.gz"]


def test_a_skewed_ranks_clock_is_found_by_its_collectives_and_aligned(tmp_path):
    tl = import_trace([rank_file(tmp_path, 0), rank_file(tmp_path, 1, skew_us=2500.0)])
    clock = tl["meta"]["source"]["clock"][0]
    assert clock["offset_us"] == 2500.0 and clock["corrected"]
    assert any("2500.0 µs off" in n for n in tl["meta"]["source"]["notes"])
    assert [(r["step"], r["compute_us"]) for r in tl["rank_steps"]] == [(1, [10, 70]), (2, [130, 179])]


def test_progress_is_reported_while_reading(tmp_path):
    seen = []
    files = [rank_file(tmp_path, 0), rank_file(tmp_path, 1)]
    import_trace(files, progress=lambda done, total: seen.append((done, total)))
    total = sum(f.stat().st_size for f in files)
    assert seen and seen[-1] == (total, total)
    assert all(t == total for _, t in seen) and [d for d, _ in seen] == sorted(d for d, _ in seen)
