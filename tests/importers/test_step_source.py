"""A per-step record stream that is not a trace (forward-pass metrics, iteration logs) becomes an ordinary timeline
through the step-source seam: validated, one record per step, busy % from the device times the source gave, and
unknown, never zero, where it gave none."""
from __future__ import annotations

import pytest

from batchscope.telemetry.export import validate_timeline
from batchscope.telemetry.importers import SourceStep, timeline_from_steps

STEP_US, FORWARD_US, DEVICE_US = 1000.0, 800.0, 600.0
IDLE_AFTER = {49: 5000.0, 99: 12000.0, 150: 3000.0}       # the source's queue ran dry after these steps


class SyntheticMetrics:
    """200 steps of a forward-pass metrics stream, held in memory: 1 ms apart, 0.8 ms forward passes of which
    the device ran 0.6 ms, a few idle gaps; `device` False: a stream that does not report device time."""
    engine, tool, steps_from, basis = "sglang", "synthetic forward-pass metrics", "per-step metrics", "host"

    def __init__(self, n: int = 200, device: bool | set = True):
        self.n, self.device = n, device

    def steps(self):
        t = 5_000_000.0                                    # any origin: the timeline starts at the first step
        for i in range(self.n):
            has_device = self.device is True or (isinstance(self.device, set) and i in self.device)
            yield SourceStep(step=i, start_us=t, end_us=t + FORWARD_US, num_requests=8,
                             prefill_tokens=64 if i % 50 == 0 else 0, decode_tokens=0 if i % 50 == 0 else 8,
                             device_us=DEVICE_US if has_device else None,
                             phases={"schedule": (t - 150.0, t - 100.0), "launch": (t, t + FORWARD_US)})
            t += STEP_US + IDLE_AFTER.get(i, 0.0)


def test_a_metrics_stream_becomes_a_valid_timeline_with_busy_from_its_device_times():
    tl = timeline_from_steps(SyntheticMetrics())
    validate_timeline(tl)
    steps, summary = tl["steps"], tl["summary"]
    assert len(steps) == summary["steps"] == 200
    assert [s["step"] for s in steps] == list(range(200))
    assert steps[0]["compute_us"] == [0.0, FORWARD_US]
    window = 199 * STEP_US + sum(IDLE_AFTER.values()) + FORWARD_US + 150.0      # the first schedule span to the end
    assert summary["t1_us"] - summary["t0_us"] == pytest.approx(window)
    assert summary["busy_pct"] == pytest.approx(round(100.0 * 200 * DEVICE_US / window, 2))
    assert summary["busy_pct_steps"] == pytest.approx(round(100.0 * 200 * FORWARD_US / window, 2))
    assert all(s["device_busy_us"] == DEVICE_US for s in steps)
    gaps = {s["step"]: s["gpu_idle_before_us"] for s in steps[1:]}
    for after, idle in IDLE_AFTER.items():
        assert gaps[after + 1] == pytest.approx(STEP_US - FORWARD_US + idle)
        assert steps[after + 1]["idle_by_cause_us"] == {"unattributed": pytest.approx(STEP_US - FORWARD_US + idle)}
    assert steps[0]["gpu_idle_before_us"] is None
    assert steps[1]["cpu"] == {"schedule": [850.0, 900.0], "launch": [1000.0, 1800.0]}
    assert tl["meta"]["source"]["engine"] == "sglang" and "device_busy_us" not in tl["meta"]["source"]["unknown"]
    assert summary["prefill_tokens"] == 4 * 64 and summary["batch_requests_mean"] == 8


def test_without_device_times_busy_is_unknown_not_zero():
    tl = timeline_from_steps(SyntheticMetrics(device=False))
    summary = tl["summary"]
    assert summary["busy_pct"] is None
    assert summary["busy_pct_steps"] > 0                  # the steps' spans are still known, and kept beside
    assert not any("device_busy_us" in s for s in tl["steps"])
    assert "device_busy_us" in tl["meta"]["source"]["unknown"]


def test_device_time_on_only_some_steps_leaves_the_window_busy_unknown():
    tl = timeline_from_steps(SyntheticMetrics(device=set(range(0, 200, 2))))
    assert tl["summary"]["busy_pct"] is None
    assert sum("device_busy_us" in s for s in tl["steps"]) == 100


def test_counts_the_source_lacks_are_unknown():
    class Bare(SyntheticMetrics):
        def steps(self):
            for s in super().steps():
                yield SourceStep(step=s.step, start_us=s.start_us, end_us=s.end_us, device_us=s.device_us)
    tl = timeline_from_steps(Bare(n=20))
    unknown = tl["meta"]["source"]["unknown"]
    assert {"num_requests", "tokens_out", "prefill_tokens", "decode_tokens"} <= set(unknown)
    assert tl["summary"]["batch_requests_mean"] is None and tl["summary"]["tokens_out"] is None
    assert tl["summary"]["busy_pct"] is not None
