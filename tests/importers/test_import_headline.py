"""What an imported trace leads with, worked out by hand on small traces: busy is what the device did (not the
steps' spans), overlap is recognised step by step whatever engine wrote the trace, a figure the trace does not
hold is None (never 0), and with several ranks each rank's figures and the rank that held the others back."""
from __future__ import annotations

import pytest

from batchscope.telemetry.importers import import_trace
from kineto_builder import KinetoTrace

NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgs)"


def launch_gapped_steps(n: int = 6, period: float = 100.0) -> KinetoTrace:
    """n steps (ProfilerStep#k): kernels [t+10, t+40] and [t+50, t+60], a 10 µs launch gap inside each step,
    the next step's first kernel 50 µs after the last one ended (a sync loop)."""
    tr = KinetoTrace()
    for k in range(n):
        t = period * k
        tr.annotation(f"ProfilerStep#{k + 1}", t, period)
        tr.launch(t + 2, 3, kernel_at=t + 10, kernel_dur=30)
        tr.launch(t + 45, 3, kernel_at=t + 50, kernel_dur=10)
    return tr


def test_busy_is_the_union_of_device_ops_and_the_steps_figure_keeps_its_own_name(tmp_path):
    tl = import_trace(launch_gapped_steps().write(tmp_path / "t.json.gz"))
    s = tl["summary"]
    window = s["t1_us"] - s["t0_us"]
    assert s["busy_basis"] == "device_ops"
    assert s["busy_pct"] == s["busy_pct_device_ops"] == pytest.approx(round(100 * 6 * 40 / window, 2))
    assert s["busy_pct_steps"] == pytest.approx(round(100 * 6 * 50 / window, 2))     # the launch gaps count there
    # every step carries its share: its own part of its span, and the gap before it
    assert [(r["device_ops_before_us"] if "device_ops_before_us" in r else None, r["device_ops_us"])
            for r in tl["steps"]] == [(None, 40.0)] + [(0.0, 40.0)] * 5


def test_the_board_reads_the_device_figure_too(tmp_path):
    tl = import_trace(launch_gapped_steps().write(tmp_path / "t.json.gz"))
    sync = tl["summary"]["board"]["modes"]["sync"]
    # warm-up (steps 0-2) left out: steps 3-5 span [310, 560], the device ran 3 x 40 µs of it
    assert sync["busy_basis"] == "device_ops"
    assert sync["busy_pct"] == pytest.approx(48.0) and sync["busy_pct_steps"] == pytest.approx(60.0)


def overlapping_steps() -> KinetoTrace:
    """Steps 0-2 launched after the step before ended (sync); steps 3-5 launched while the one before still ran
    (an overlap scheduler: each launch queued behind the previous kernel)."""
    tr = KinetoTrace()
    for k in range(3):
        t = 100 * k
        tr.annotation(f"step[DECODE bs=2] #{k}", t, 60)
        tr.launch(t + 5, 2, kernel_at=t + 10, kernel_dur=40)
    end = 250.0
    for k in range(3, 6):
        t = 300 + 50 * (k - 3)
        tr.annotation(f"step[DECODE bs=2] #{k}", t, 40)
        tr.launch(t + 5, 2, kernel_at=max(t + 10, end), kernel_dur=60)
        end = max(t + 10, end) + 60
    return tr


def test_a_step_launched_before_the_last_one_ended_is_async_whatever_engine_wrote_it(tmp_path):
    tl = import_trace(overlapping_steps().write(tmp_path / "sglang.json.gz"))
    assert tl["meta"]["source"]["engine"] == "sglang"
    # step 3 was launched at 305, after step 2 ended at 250: sync; 4 and 5 were queued behind 3 and 4
    assert [s["mode"] for s in tl["steps"]] == ["sync"] * 4 + ["async"] * 2
    assert [(c["step"], c["from"], c["to"]) for c in tl["mode_changes"]] == [(4, "sync", "async")]
    assert tl["summary"]["modes"] == {"sync": 4, "async": 2}


def test_what_the_trace_does_not_hold_is_none_never_zero(tmp_path):
    tl = import_trace(launch_gapped_steps().write(tmp_path / "t.json.gz"))
    s = tl["summary"]
    assert {"num_requests", "tokens_out", "queue_depth"} <= set(s["unknown"])
    for key in ("tokens_per_s", "tokens_out", "batch_requests_mean", "queue_depth_max", "kv_usage_pct_max"):
        assert s[key] is None, key
    for fig in (s["board"]["modes"]["sync"], s["per_mode"]["sync"]):
        assert fig["decode_tokens_per_s"] is None and fig["tokens_per_s"] is None
    assert s["board"]["modes"]["sync"]["ms_per_step"] == pytest.approx(0.1)       # what it does hold stays


def straggler_rank(tmp_path, rank: int, late: bool, steps: int = 4):
    """One rank's file: each step a 40 µs kernel, then an all-reduce ending at t+150 on every rank. The late
    rank's host is in a CPU op until t+130 before it launches its all-reduce; the other waits inside its own."""
    tr = KinetoTrace(pid=100 + rank, tid=100 + rank, device=rank, rank=rank)
    for k in range(steps):
        t = 200 * k
        tr.annotation(f"ProfilerStep#{k + 1}", t, 200)
        tr.launch(t + 2, 3, kernel_at=t + 10, kernel_dur=40)
        if late:
            tr.cpu_op("aten::slow_host_work", t + 50, 80)
            tr.launch(t + 130, 3, kernel_at=t + 135, kernel_dur=15, name=NCCL)
        else:
            tr.launch(t + 52, 3, kernel_at=t + 55, kernel_dur=95, name=NCCL)
    return tr.write(tmp_path / f"worker_rank{rank}.pt.trace.json.gz")


def test_the_rank_that_held_the_others_back_is_named_with_its_evidence(tmp_path):
    tl = import_trace([straggler_rank(tmp_path, 0, late=False), straggler_rank(tmp_path, 1, late=True)])
    s = tl["summary"]
    r0, r1 = s["ranks"]
    assert (r0["rank"], r1["rank"]) == (0, 1)
    assert r0["collective_us"] == 4 * 95 and r1["collective_us"] == 4 * 15
    assert r1["host_late_us"] >= 4 * 80 > r0["host_late_us"]
    assert r1["busy_pct"] < r0["busy_pct"] and r0["busy_basis"] == "device_ops"
    assert r1["idle_us_by_cause"] and sum(r1["idle_us_by_cause"].values()) > sum(r0["idle_us_by_cause"].values())
    assert s["straggler"]["rank"] == 1
    assert s["straggler"]["evidence"].startswith("rank 1's host launched late")


def test_ranks_in_step_name_no_straggler(tmp_path):
    tl = import_trace([straggler_rank(tmp_path, 0, late=False), straggler_rank(tmp_path, 1, late=False)])
    assert tl["summary"]["straggler"]["rank"] is None
    assert "no rank held the others back" in tl["summary"]["straggler"]["reason"]


def test_idle_inside_a_step_keeps_its_place_for_the_gantt(tmp_path):
    tl = import_trace(launch_gapped_steps().write(tmp_path / "t.json.gz"))
    for k, s in enumerate(tl["steps"]):
        t = 100 * k
        # [t+40, t+50]: the host late until its launch call at t+45, then the launch itself
        assert s["idle_inside_stretches"] == [[t + 40, t + 45, "host_other"], [t + 45, t + 50, "launch"]]
        assert sum(b - a for a, b, _ in s["idle_inside_stretches"]) == s["gpu_idle_inside_us"] == 10


def test_a_step_with_many_small_gaps_keeps_its_largest_in_place_and_the_rest_by_cause(tmp_path):
    from batchscope.telemetry.importers.steprecords import DRAWN_STRETCHES

    tr = KinetoTrace()
    tr.annotation("ProfilerStep#1", 0, 10_000)
    n = DRAWN_STRETCHES + 20
    for i in range(n):                          # gaps of 2 µs, and one of 50 µs in the middle
        at = 10 + 12 * i + (48 if i > n // 2 else 0)
        tr.launch(at - 5, 2, kernel_at=at, kernel_dur=10)
    s = import_trace(tr.write(tmp_path / "t.json.gz"))["steps"][0]
    drawn = s["idle_inside_stretches"]
    # the 50 µs gap is kept in place: 45 µs of the host late, then 5 µs of its launch call
    assert len(drawn) == DRAWN_STRETCHES and max(b - a for a, b, _ in drawn) == 45
    spread = sum(s["idle_inside_spread_us"].values())
    assert sum(b - a for a, b, _ in drawn) + spread == pytest.approx(s["gpu_idle_inside_us"])
