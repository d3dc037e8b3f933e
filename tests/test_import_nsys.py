"""Nsight Systems SQLite exports, read on CPU from a real one: batchscope's engine (llama3-8b-random, sync then async,
BATCHSCOPE_ANNOTATE=1) recorded on an H200 by Nsight Systems 2022.4 (`-t cuda,nvtx --cuda-graph-trace=node`) and
exported with `nsys export --type sqlite` of the same version (tests/fixtures/README.md)."""
from __future__ import annotations

from pathlib import Path

from batchscope.telemetry.importers import import_trace

H200 = Path(__file__).parent / "fixtures" / "nsys-2022.4-batchscope-h200.sqlite"


def test_an_nsight_export_becomes_a_timeline_of_the_engines_own_steps():
    t = import_trace(H200)
    src = t["meta"]["source"]
    assert src["tool"] == "Nsight Systems 2022.4.2.1" and src["format"] == "nsys-sqlite (schema 3.0.0)"
    assert src["engine"] == "batchscope" and src["vendor"] == "nvidia" and t["meta"]["device"] == "cuda"
    assert src["steps_from"].startswith("batchscope's own ranges")        # its NVTX ranges, no inference
    assert src["trace_start"].startswith("2026-12-02T16:49")               # the session's UTC start
    steps = t["steps"]
    assert len(steps) == 241 and t["summary"]["per_mode"]["sync"]["steps"] == 210
    assert {s["mode"] for s in steps} == {"sync", "async"}
    # the launch range names its batch: 8 requests prefilling 2,705 tokens at the first step of the window
    first = steps[0]
    assert first["step"] == 16 and first["prefill_tokens"] == 2705 and first["decode_tokens"] == 0


def test_what_the_export_lost_is_said_not_guessed():
    """This export kept its NVTX ranges but few CUDA records (Nsight Systems 2022.4 against a CUDA 13 driver): the
    device ops it has are read, and the steps without any are said to have no compute span instead of being idle."""
    t = import_trace(H200)
    device = t["summary"]["devices"][0]
    assert device["ops"] == 9                                              # 6 kernels and 3 copies
    notes = " ".join(t["meta"]["source"]["notes"])
    assert "240 of 241 steps have no device work tied to them" in notes
    assert sum(1 for s in t["steps"] if s["compute_us"] is not None) == 1
    assert all(s["compute_basis"] == "none" and s["gpu_idle_before_us"] is None
               for s in t["steps"] if s["compute_us"] is None)


def test_the_host_phases_come_from_the_engines_nvtx_ranges():
    t = import_trace(H200)
    phased = [s for s in t["steps"] if set(s["cpu"]) >= {"schedule", "fill", "launch", "wait", "update"}]
    assert len(phased) >= 230
    s = phased[5]
    assert s["cpu"]["schedule"][0] < s["cpu"]["fill"][0] < s["cpu"]["launch"][0] < s["cpu"]["wait"][0]
