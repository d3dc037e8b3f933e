"""Nsight Systems SQLite exports, read on CPU from real ones: batchscope's engine (llama3-8b-random, sync then async,
BATCHSCOPE_ANNOTATE=1) recorded on an H200 by Nsight Systems 2022.4 and 2023.4 (`-t cuda,nvtx
--cuda-graph-trace=node`) and exported with `nsys export --type sqlite` of the same version (tests/fixtures/README.md):
schema 3.0 and 3.7, whose version rows sit in differently named tables."""
from __future__ import annotations

from pathlib import Path

from batchscope.telemetry.importers import import_trace

H200 = Path(__file__).parents[1] / "fixtures" / "nsys-2022.4-batchscope-h200.sqlite"
H200_2023 = Path(__file__).parents[1] / "fixtures" / "nsys-2023.4-batchscope-h200.sqlite"


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


def test_a_2023_export_says_its_version_and_keeps_the_records_it_has():
    """Nsight Systems 2023.4 (CUPTI 12.4) against the CUDA 13 driver: its importer stopped on a runtime call it does
    not know, so 6 of 236 steps kept device work; the version rows are in META_DATA_EXPORT (2022.4: EXPORT_META_DATA)."""
    t = import_trace(H200_2023)
    src = t["meta"]["source"]
    assert src["tool"] == "Nsight Systems 2023.4.4.54" and src["format"] == "nsys-sqlite (schema 3.7.2)"
    assert src["engine"] == "batchscope" and src["steps_from"].startswith("batchscope's own ranges")
    assert src["trace_start"].startswith("2026-12-02T17:55")
    steps = t["steps"]
    assert len(steps) == 236 and t["summary"]["per_mode"]["sync"]["steps"] == 209
    assert steps[0]["step"] == 16 and steps[0]["prefill_tokens"] == 2705
    assert t["summary"]["devices"][0]["ops"] == 1887                      # 1,738 kernels, 21 copies, 128 memsets
    assert sum(1 for s in steps if s["compute_us"] is not None) == 6
    assert "230 of 236 steps have no device work tied to them" in " ".join(src["notes"])
