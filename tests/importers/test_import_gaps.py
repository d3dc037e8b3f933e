"""Every idle microsecond named, on small synthetic traces whose answers are worked out by hand in the comments:
the gap before each step (batchscope's definition), the idle inside each step's compute span, host late against
the device waiting on itself, the cause from what the launching thread was doing, and busy time as a union."""
from __future__ import annotations

import pytest

from batchscope.telemetry import to_perfetto
from batchscope.telemetry.importers import import_trace
from kineto_builder import KinetoTrace

H2D, COMPUTE, D2H = 9, 7, 11


def imported(tr: KinetoTrace, tmp_path, name="t.pt.trace.json.gz", **kw) -> dict:
    return import_trace(tr.write(tmp_path / name), **kw)


def batchscope_sync_trace() -> KinetoTrace:
    """Two steps of batchscope's sync loop on a GPU, with its own ranges (times in µs):

    step 0   schedule [0,10]  fill [10,30]  launch [30,80]  wait [82,106] (cudaEventSynchronize [83,105.5])
             update [107,120]
             H2D copy [40,45] (call 32); kernels [50,60] (call 36), [75,95] (call 64, inside aten::mm [45,70]),
             [96,100] (call 70); D2H copy [101,105] (call 74)
    step 1   schedule [121,140]  fill [140,160] (aten::copy_ [145,150])  launch [160,200]  wait [201,216]
             (cudaEventSynchronize [202,215])  update [216,230]
             H2D copy [170,174] (call 162); kernel [180,212] (call 166); D2H copy [213,216] (call 172)
    """
    tr = KinetoTrace()
    tr.annotation("batchscope.schedule", 0, 10)
    tr.annotation("batchscope.fill step=0", 10, 20)
    tr.annotation("batchscope.launch step=0 mode=sync prefill=8 decode=0 requests=2", 30, 50)
    tr.copy("HtoD", 32, 3, copy_at=40, copy_dur=5, stream=H2D)
    tr.launch(36, 4, kernel_at=50, kernel_dur=10)
    tr.cpu_op("aten::mm", 45, 25)
    tr.launch(64, 4, kernel_at=75, kernel_dur=20)
    tr.launch(70, 2, kernel_at=96, kernel_dur=4)
    tr.copy("DtoH", 74, 3, copy_at=101, copy_dur=4, stream=D2H)
    tr.annotation("batchscope.wait step=0", 82, 24)
    tr.sync(83, 22.5, call="event_sync")
    tr.annotation("batchscope.update step=0", 107, 13)
    tr.annotation("batchscope.schedule", 121, 19)
    tr.annotation("batchscope.fill step=1", 140, 20)
    tr.cpu_op("aten::copy_", 145, 5)
    tr.annotation("batchscope.launch step=1 mode=sync prefill=0 decode=2 requests=2", 160, 40)
    tr.copy("HtoD", 162, 3, copy_at=170, copy_dur=4, stream=H2D)
    tr.launch(166, 4, kernel_at=180, kernel_dur=32)
    tr.copy("DtoH", 172, 3, copy_at=213, copy_dur=3, stream=D2H)
    tr.annotation("batchscope.wait step=1", 201, 15)
    tr.sync(202, 13, call="event_sync")
    tr.annotation("batchscope.update step=1", 216, 14)
    return tr


def test_batchscope_steps_get_their_spans_phases_and_counts(tmp_path):
    tl = imported(batchscope_sync_trace(), tmp_path)
    s0, s1 = tl["steps"]
    assert (s0["step"], s1["step"]) == (0, 1) and s0["mode"] == s1["mode"] == "sync"
    assert (s0["prefill_tokens"], s0["decode_tokens"], s0["num_requests"]) == (8, 0, 2)
    assert (s1["prefill_tokens"], s1["decode_tokens"]) == (0, 2)
    assert s0["cpu"] == {"schedule": [0, 10], "fill": [10, 30], "launch": [30, 80], "wait": [82, 106],
                         "update": [107, 120]}
    assert s0["gpu"] == {"h2d": [40, 45], "compute": [50, 100], "d2h": [101, 105]}
    assert s0["compute_us"] == [50, 100] and s0["compute_basis"] == "gpu"
    assert s1["gpu"] == {"h2d": [170, 174], "compute": [180, 212], "d2h": [213, 216]}
    assert tl["meta"]["source"]["engine"] == "batchscope"
    assert tl["meta"]["source"]["inferred"] == ["tokens_out (one token per request per step)"]


def test_the_gap_before_a_step_is_named_as_batchscope_names_it(tmp_path):
    s1 = imported(batchscope_sync_trace(), tmp_path)["steps"][1]
    # [100,180]: [100,101] the queued D2H copy not started yet (launch latency); [101,105] the D2H copy;
    # [105,162] host late, the thread in: wait [105,106] (0.5 of it in cudaEventSynchronize), update [107,120],
    # schedule [121,140], fill [140,160], launch [160,162]; the empty µs between wait and update and between
    # update and schedule are the ranges' own entry and exit, which batchscope times as phase time: each half
    # goes to the phase beside it; [162,170] the H2D copy's launch; [170,174] the H2D copy; [174,180] the kernel
    # queued behind it
    assert s1["gpu_idle_before_us"] == 80.0
    assert s1["idle_by_cause_us"] == {"d2h": 4.0, "h2d": 4.0, "wait": 1.5, "update": 14.0, "schedule": 19.5,
                                      "fill": 20.0, "launch": 17.0}
    assert sum(s1["idle_by_cause_us"].values()) == pytest.approx(s1["gpu_idle_before_us"])
    assert s1["idle_cause"] == "fill"
    assert s1["idle_host_late_us"] == 65.0                        # [105,170]: until the H2D copy's call
    assert s1["idle_host_ops_us"]["batchscope.fill step=1"] == 15.0    # fill less its aten::copy_


def test_idle_inside_a_step_is_named_too(tmp_path):
    s0 = imported(batchscope_sync_trace(), tmp_path)["steps"][0]
    # compute [50,100], busy [50,60] [75,95] [96,100]: idle [60,75] (host late: the thread in aten::mm inside the
    # launch range until the call at 64, then the launch) and [95,96] (the kernel was queued: launch latency)
    assert s0["gpu_idle_inside_us"] == 16.0
    assert s0["idle_inside_by_cause_us"] == {"launch": 16.0}
    assert s0["idle_inside_host_late_us"] == 15.0
    assert s0["device_busy_us"] == 34.0
    assert s0["idle_host_ops_us"] == {"aten::mm": 4.0}
    assert s0["gpu_idle_before_us"] is None                       # the first step seen


def test_the_summary_is_batchscopes_own_plus_the_traces_figures(tmp_path):
    summary = imported(batchscope_sync_trace(), tmp_path)["summary"]
    # window [0, 230]; compute spans [50,100] + [180,212] = 82 µs
    assert summary["busy_pct"] == round(100 * 82 / 230, 2)
    # device ops: [40,45] [50,60] [75,95] [96,100] [101,105] [170,174] [180,212] [213,216] = 82 µs as well, but
    # from a different set: copies count, the idle inside a step does not
    assert summary["busy_pct_device_ops"] == round(100 * 82 / 230, 2)
    assert summary["idle_us_total"] == 80.0
    assert summary["idle_inside_us_total"] == 16.0
    assert summary["idle_inside_us_by_cause"] == {"launch": 16.0}
    # the device's idle time adds up: 230 - 82 busy = 148 = 72 idle in the gap (80 less the 8 µs of copies)
    # + 16 inside + 60 outside every step's gap and compute span ([0,40], [45,50] before step 0's first kernel,
    # [212,213] after step 1's last, [216,230])
    dev = summary["devices"][0]
    assert dev["idle_in_steps_us"] == 72.0 + 16.0
    assert dev["idle_in_steps_us"] + dev["idle_outside_steps_us"] + dev["busy_us"] == pytest.approx(230.0)


def test_busy_is_the_union_of_all_streams_never_a_sum(tmp_path):
    tr = KinetoTrace()
    tr.annotation("ProfilerStep#1", 0, 100)
    tr.launch(1, 2, kernel_at=10, kernel_dur=40, stream=7)
    tr.launch(4, 2, kernel_at=20, kernel_dur=40, stream=13)      # overlaps the first: [10,60] busy, not 80 µs
    tr.copy("DtoD", 6, 2, copy_at=55, copy_dur=15, stream=7)      # to 70
    tl = imported(tr, tmp_path)
    step = tl["steps"][0]
    assert step["compute_us"] == [10, 70]
    assert step["device_busy_us"] == 60.0 and step["gpu_idle_inside_us"] == 0.0
    assert tl["summary"]["devices"][0]["busy_us"] == 60.0


def profiler_steps_with_syncs() -> KinetoTrace:
    """ProfilerStep#1 [0,100]: kernel [10,30] (call 2); cudaStreamSynchronize [31,40] (an .item()); kernel
    [45,60] (call 41); cudaStreamSynchronize [61,75].
    ProfilerStep#2 [100,200]: the thread in aten::index [100,130] then nothing; kernel [150,170] (call 140)."""
    tr = KinetoTrace()
    tr.annotation("ProfilerStep#1", 0, 100)
    tr.launch(2, 3, kernel_at=10, kernel_dur=20)
    tr.sync(31, 9)
    tr.launch(41, 3, kernel_at=45, kernel_dur=15)
    tr.sync(61, 14)
    tr.annotation("ProfilerStep#2", 100, 100)
    tr.cpu_op("aten::index", 100, 30)
    tr.launch(140, 4, kernel_at=150, kernel_dur=20)
    return tr


def test_blocking_calls_are_wait_between_steps_and_host_sync_inside_one(tmp_path):
    s1, s2 = imported(profiler_steps_with_syncs(), tmp_path)["steps"]
    assert (s1["step"], s2["step"]) == (1, 2)
    # inside [10,60]: idle [30,45]: the thread in cudaStreamSynchronize [31,40] (host_sync), nothing around it
    # [30,31] + [40,41], then the launch call [41,45]
    assert s1["idle_inside_by_cause_us"] == {"host_sync": 9.0, "host_other": 2.0, "launch": 4.0}
    # between [60,150]: in cudaStreamSynchronize [61,75] (wait); aten::index [100,130] (an op); nothing recorded
    # [60,61] + [75,100] + [130,140] (a step marker such as ProfilerStep#2 says nothing of what the host did);
    # then the launch [140,150]
    assert s2["idle_by_cause_us"] == {"wait": 14.0, "host_other": 36.0, "host_op": 30.0, "launch": 10.0}
    assert s2["idle_host_ops_us"] == {"(no recorded op)": 36.0, "aten::index": 30.0, "cudaStreamSynchronize": 14.0}
    assert s2["idle_host_late_us"] == 90.0


def test_a_device_waiting_on_another_stream_is_stream_wait_and_not_host_late(tmp_path):
    tr = KinetoTrace()
    tr.annotation("ProfilerStep#1", 0, 100)
    tr.launch(1, 2, kernel_at=10, kernel_dur=10, stream=7)
    tr.launch(3, 2, kernel_at=40, kernel_dur=10, stream=13)   # launched long before; waited on an event
    tr.stream_wait_record(20, 20, stream=13, waits_on=21)
    tr.launch(5, 2, kernel_at=60, kernel_dur=10, stream=7)    # queued: launch latency
    step = imported(tr, tmp_path)["steps"][0]
    assert step["idle_inside_by_cause_us"] == {"stream_wait": 20.0, "launch": 10.0}
    assert step["idle_inside_host_late_us"] == 0.0


def test_work_launched_before_the_window_is_unattributed(tmp_path):
    tr = KinetoTrace()
    tr.annotation("ProfilerStep#1", 0, 100)
    tr.launch(1, 2, kernel_at=10, kernel_dur=10)
    tr.kernel("early_kernel", 30, 10, corr=None)           # its launch is not in the file
    tr.launch(2, 2, kernel_at=40, kernel_dur=10)
    step = imported(tr, tmp_path)["steps"][0]
    # the early kernel belongs to no step (no launch to tie it to one): the step's compute span is [10,50], idle
    # [20,30] ended by an op of no known launch, and [40,40] none
    assert step["compute_us"] == [10, 50]
    assert step["idle_inside_by_cause_us"] == {"unattributed": 10.0}


def test_a_graph_launch_still_running_when_the_device_went_idle_is_launch(tmp_path):
    tr = KinetoTrace()
    tr.annotation("ProfilerStep#1", 0, 60)
    tr.launch(1, 2, kernel_at=5, kernel_dur=5)
    tr.graph(8, 40, kernels=[(45, 5), (51, 5)])             # the call [8,48] outlives the device's idle [10,45]
    tr.annotation("ProfilerStep#2", 60, 60)
    tr.graph(80, 30, kernels=[(105, 5)])                    # called after the device went idle at 56: host late
    s1, s2 = imported(tr, tmp_path)["steps"]
    assert s1["compute_us"] == [5, 56]
    assert s1["idle_inside_by_cause_us"] == {"launch": 36.0}          # [10,45] and [50,51]
    assert s1["idle_inside_host_late_us"] == 35.0
    # between [56,105]: nothing recorded [56,80] (inside the step markers only), then the launch [80,105]
    assert s2["idle_by_cause_us"] == {"host_other": 24.0, "launch": 25.0}


def test_collectives_count_as_busy_and_are_reported(tmp_path):
    tr = KinetoTrace()
    tr.annotation("ProfilerStep#1", 0, 50)
    tr.launch(1, 2, kernel_at=10, kernel_dur=10)
    tr.launch(3, 2, kernel_at=20, kernel_dur=15, name="ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgs)")
    tr.annotation("ProfilerStep#2", 50, 50)
    tr.launch(51, 2, kernel_at=60, kernel_dur=10, name="ncclKernel_AllGather_RING_LL_Sum_int8_t")
    tr.launch(52, 2, kernel_at=70, kernel_dur=10)
    tl = imported(tr, tmp_path)
    s1, s2 = tl["steps"]
    assert s1["collective_us"] == 15.0 and s1["gpu_idle_inside_us"] == 0.0
    assert s2["collective_us"] == 10.0
    assert tl["summary"]["collective_us"] == 25.0


def test_a_collective_in_the_gap_between_steps_is_named_collective(tmp_path):
    tr = KinetoTrace()
    tr.annotation("ProfilerStep#1", 0, 50)
    tr.launch(1, 2, kernel_at=10, kernel_dur=10)
    tr.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgs)", 25, 10, corr=None)   # no step's
    tr.annotation("ProfilerStep#2", 50, 50)
    tr.launch(51, 2, kernel_at=60, kernel_dur=10)
    s2 = imported(tr, tmp_path)["steps"][1]
    # [20,60]: [20,25] ended by the collective, whose launch is not in the file; the collective [25,35] (busy,
    # waiting for peers); [35,51] nothing recorded before the call; [51,60] the launch
    assert s2["gpu_idle_before_us"] == 40.0
    assert s2["idle_by_cause_us"] == {"unattributed": 5.0, "collective": 10.0, "host_other": 16.0, "launch": 9.0}


def test_kernel_spans_are_kept_on_request_and_drawn_by_perfetto(tmp_path):
    tl = imported(batchscope_sync_trace(), tmp_path, kernels=True)
    lane = tl["kernels"][0]
    assert len(lane["ops"]) == 8                     # 4 kernels and 4 copies
    kinds = {lane["kinds"][op[4]] for op in lane["ops"]}
    assert kinds == {"kernel", "copy_h2d", "copy_d2h"}
    assert {op[5] for op in lane["ops"]} == {0, 1}
    idle = {(i[0], i[1]): lane["causes"][i[2]] for i in lane["idle"]}
    assert idle[(60.0, 64.0)] == "launch" and idle[(105.0, 162.0)] == "fill"
    trace = to_perfetto(tl)
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "device_op"]
    assert len(ops) == 8 and any(e["name"] == "gemm_kernel" for e in ops)
    gaps = [e for e in trace["traceEvents"] if e.get("cat") == "device_idle"]
    assert any(e["name"] == "idle: launch" for e in gaps)
    assert "kernels" not in imported(batchscope_sync_trace(), tmp_path, name="u.json.gz")
