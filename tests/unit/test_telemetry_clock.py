"""CUDA events onto the host clock: anchors, drift, bounds, and never waiting on an incomplete event."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from batchscope.telemetry.clock import EventClock
from synthetic import FakeEvent

ORIGIN = 1_000_000_000          # the session origin, host ns


class Device:
    """A device clock: dev_ms = (host_ns * (1 + drift) + offset_ns) / 1e6."""

    def __init__(self, offset_ms=7_777.0, drift_ppm=0.0):
        self.offset_ns, self.drift = offset_ms * 1e6, drift_ppm * 1e-6

    def event(self, host_ns):
        return FakeEvent((host_ns * (1 + self.drift) + self.offset_ns) / 1e6)


def trace(dev, t_ns, anchor=None, wait_extra_ns=8_000, step=0, queued_ns=0):
    """A step built at host time t_ns: 50 µs of build, then H2D 20 µs, compute 1 ms, D2H 10 µs. `queued_ns`
    delays the device work (async: the step waits behind the previous one)."""
    sched, fill, launch = (t_ns, t_ns + 20_000), (t_ns + 20_000, t_ns + 40_000), (t_ns + 40_000, t_ns + 50_000)
    h2d = (t_ns + 45_000 + queued_ns, t_ns + 65_000 + queued_ns)
    comp = (h2d[1], h2d[1] + 1_000_000)
    d2h = (comp[1], comp[1] + 10_000)
    wait = (launch[1], d2h[1] + wait_extra_ns)
    update = (wait[1], wait[1] + 20_000)
    spans = {"h2d": h2d, "compute": comp, "d2h": d2h}
    tr = SimpleNamespace(step=step, host={"schedule": sched, "fill": fill, "launch": launch, "wait": wait,
                                          "update": update},
                         gpu_events={p: (dev.event(a), dev.event(b)) for p, (a, b) in spans.items()},
                         anchor=anchor)
    truth = {p: [(a - ORIGIN) / 1000, (b - ORIGIN) / 1000] for p, (a, b) in spans.items()}
    return tr, truth


def test_an_anchor_maps_events_onto_host_time():
    dev, clock = Device(), EventClock(ORIGIN)
    t = ORIGIN + 5_000_000
    tr, truth = trace(dev, t, anchor=(dev.event(t), t))
    gpu, basis = clock.resolve(tr)
    assert basis == "gpu"
    for phase, (s, e) in truth.items():
        assert gpu[phase] == pytest.approx([s, e], abs=0.11)
    assert clock.corrections == 0


def test_the_newest_anchor_serves_later_steps_without_one():
    dev, clock = Device(), EventClock(ORIGIN)
    t = ORIGIN + 5_000_000
    anchor = (dev.event(t), t)
    clock.resolve(trace(dev, t, anchor=anchor)[0])
    tr, truth = trace(dev, t + 50_000_000, step=1)           # 50 ms later, no anchor in this trace
    gpu, basis = clock.resolve(tr)
    assert basis == "gpu"
    assert gpu["compute"] == pytest.approx(truth["compute"], abs=0.11)
    assert clock.anchors == 1


def test_drift_during_a_long_busy_stretch_is_held_inside_causal_bounds():
    # async steady state: each step is built ~1 ms before it runs, the engine never re-anchors, and the device
    # clock runs 300 ppm slow, so events drift early; only "the host woke when the copy ended" can hold them
    dev, clock = Device(drift_ppm=-300.0), EventClock(ORIGIN, wake_slack_us=30.0)
    t = ORIGIN + 1_000_000
    anchor = (dev.event(t), t)
    worst = 0.0
    for i in range(400):                                      # ~0.4 s of steps
        tr, truth = trace(dev, t, anchor=anchor if i == 0 else None, step=i, queued_ns=900_000)
        gpu, _ = clock.resolve(tr)
        host = {p: [(a - ORIGIN) / 1000, (b - ORIGIN) / 1000] for p, (a, b) in tr.host.items()}
        assert gpu["h2d"][0] >= host["schedule"][0] - 0.1
        assert gpu["d2h"][1] <= host["wait"][1] + 0.1
        # durations come from the device alone; the 300 ppm rate error only scales them
        assert gpu["compute"][1] - gpu["compute"][0] == pytest.approx(1000.0, rel=1e-3)
        worst = max(worst, abs(gpu["compute"][0] - truth["compute"][0]))
        t += 1_100_000
    assert clock.corrections > 0
    assert worst < 40.0           # without the wake bound the drift reaches ~130 µs


def test_one_slow_wake_up_does_not_move_the_clock():
    dev, clock = Device(), EventClock(ORIGIN, wake_slack_us=30.0, persist=8)
    t = ORIGIN + 1_000_000
    anchor = (dev.event(t), t)
    for i in range(30):
        # step 10: the OS ran something else and the host woke 3 ms after the copy ended
        tr, truth = trace(dev, t, anchor=anchor if i == 0 else None, step=i,
                          wait_extra_ns=3_000_000 if i == 10 else 8_000)
        gpu, _ = clock.resolve(tr)
        assert gpu["compute"] == pytest.approx(truth["compute"], abs=0.11), i
        t += 5_000_000
    assert clock.corrections == 0


def test_an_anchor_noted_late_is_pulled_back_by_the_wait():
    dev, clock = Device(), EventClock(ORIGIN)
    t = ORIGIN + 5_000_000
    # the host noted the anchor 300 µs after the device recorded it: every event would map 300 µs late
    tr, truth = trace(dev, t, anchor=(dev.event(t), t + 300_000))
    gpu, _ = clock.resolve(tr)
    wait_end = (tr.host["wait"][1] - ORIGIN) / 1000
    assert gpu["d2h"][1] == pytest.approx(wait_end, abs=0.11)
    assert gpu["compute"][0] == pytest.approx(truth["compute"][0] + 8.0, abs=0.2)   # within the wake-up delay
    assert clock.corrections == 1


def test_a_fresh_anchor_forgets_the_old_correction():
    dev, clock = Device(), EventClock(ORIGIN)
    t = ORIGIN + 5_000_000
    clock.resolve(trace(dev, t, anchor=(dev.event(t), t + 300_000))[0])
    assert clock._shift_ns != 0
    t2 = t + 10_000_000
    tr, truth = trace(dev, t2, anchor=(dev.event(t2), t2), step=1)
    gpu, _ = clock.resolve(tr)
    assert gpu["compute"] == pytest.approx(truth["compute"], abs=0.11)
    assert clock.anchors == 2


def test_without_any_anchor_the_copy_ends_when_the_wait_ends():
    dev, clock = Device(), EventClock(ORIGIN)
    tr, _ = trace(dev, ORIGIN + 5_000_000)
    gpu, basis = clock.resolve(tr)
    assert basis == "gpu_wait"
    assert gpu["d2h"][1] == pytest.approx((tr.host["wait"][1] - ORIGIN) / 1000, abs=0.11)
    assert gpu["compute"][1] - gpu["compute"][0] == pytest.approx(1000.0, abs=0.2)


def test_an_incomplete_event_is_reported_not_waited_for():
    dev, clock = Device(), EventClock(ORIGIN)
    t = ORIGIN + 5_000_000
    tr, _ = trace(dev, t, anchor=(dev.event(t), t))
    tr.gpu_events["d2h"][1].t_ms = None                    # still queued on the device
    gpu, basis = clock.resolve(tr)
    assert gpu is None and basis == "none"
    assert clock.failures == 1 and "not ready" in clock.last_error


def test_cpu_traces_have_nothing_to_resolve():
    clock = EventClock(ORIGIN)
    tr = SimpleNamespace(step=0, host={}, gpu_events=None, anchor=None)
    assert clock.resolve(tr) == (None, "none")


def _gaps(spans):
    return [b["compute"][0] - a["compute"][1] for a, b in zip(spans, spans[1:])]


def test_an_epoch_keeps_gaps_device_time_while_the_steps_anchors_jitter():
    # a busy device sees each step's anchor 0-80 µs after the host recorded it; the epoch was seen 60 µs late
    import random

    rng = random.Random(3)
    dev = Device()
    t = ORIGIN + 5_000_000
    epoch = (dev.event(t + 60_000), t)
    per_anchor, per_epoch = EventClock(ORIGIN), EventClock(ORIGIN)
    mapped = {"anchor": [], "epoch": []}
    truths = []
    for i in range(200):
        late = rng.uniform(0, 80_000)
        anchor = (dev.event(t + 45_000 + late), t + 45_000)
        tr, truth = trace(dev, t, anchor=anchor, step=i, queued_ns=900_000)
        mapped["anchor"].append(per_anchor.resolve(tr)[0])
        tr.epoch = epoch
        mapped["epoch"].append(per_epoch.resolve(tr)[0])
        truths.append(truth)
        t += 1_100_000
    true_gaps = _gaps(truths)
    off = [abs(g - h) for g, h in zip(_gaps(mapped["epoch"]), true_gaps)]
    assert sum(o <= 1.0 for o in off) >= 0.95 * len(off), max(off)      # device time, but for the lead's moves
    assert max(abs(g - h) for g, h in zip(_gaps(mapped["anchor"]), true_gaps)) > 30.0   # each its own: jitter
    # the least-delayed anchor sets the lead: events land within its delay (~0.4 µs of 80) of the truth
    late_steps = [abs(m["compute"][0] - tr_["compute"][0]) for m, tr_ in zip(mapped["epoch"][100:], truths[100:])]
    assert max(late_steps) < 5.0
    assert per_epoch.anchors == 1


def test_a_new_epoch_starts_where_the_old_one_maps_it():
    dev, clock = Device(), EventClock(ORIGIN)
    t = ORIGIN + 5_000_000
    first = (dev.event(t + 5_000), t)                 # seen 5 µs late
    tr, truth = trace(dev, t, anchor=(dev.event(t + 45_000), t + 45_000), step=0)
    tr.epoch = first
    gpu, _ = clock.resolve(tr)
    assert gpu["compute"] == pytest.approx(truth["compute"], abs=0.11)     # the anchor taught the 5 µs
    t2 = t + 1_000_000_000
    second = (dev.event(t2 + 70_000), t2)             # the next epoch was seen 70 µs late; no anchor says so
    tr, truth = trace(dev, t2, step=1)
    tr.epoch = second
    gpu, _ = clock.resolve(tr)
    assert gpu["compute"] == pytest.approx(truth["compute"], abs=0.11)
    assert clock.anchors == 2


def test_epochs_do_not_accumulate_drift():
    # the device clock runs 100 ppm fast; a fresh epoch every second for a minute, each seen 0-60 µs late, steps'
    # anchors 0-80 µs late: placement stays within the least anchor delay plus a second's drift, epoch after epoch
    import random

    rng = random.Random(5)
    dev, clock = Device(drift_ppm=100.0), EventClock(ORIGIN)
    t = ORIGIN + 5_000_000
    worst = 0.0
    for second in range(60):
        e0 = t
        epoch = (dev.event(e0 + rng.uniform(0, 60_000)), e0)
        for i in range(50):
            anchor = (dev.event(t + 45_000 + rng.uniform(0, 80_000)), t + 45_000)
            tr, truth = trace(dev, t, anchor=anchor, step=second * 50 + i, queued_ns=900_000)
            tr.epoch = epoch
            gpu, _ = clock.resolve(tr)
            if i >= 10:                 # once a few anchors have been seen in this epoch
                worst = max(worst, abs(gpu["compute"][0] - truth["compute"][0]))
            t += 20_000_000
    assert worst < 110.0, worst     # a second of 100 ppm is 100 µs; carried from epoch to epoch it grew without end


def test_an_epoch_after_an_idle_stretch_carries_nothing():
    dev, clock = Device(drift_ppm=10.0), EventClock(ORIGIN)
    t = ORIGIN + 5_000_000
    tr, _ = trace(dev, t, step=0)
    tr.epoch = (dev.event(t), t)
    clock.resolve(tr)
    t2 = t + 30_000_000_000             # 30 s idle: 300 µs of drift between the two epochs, not a delay to carry
    tr, truth = trace(dev, t2, step=1)
    tr.epoch = (dev.event(t2), t2)
    gpu, _ = clock.resolve(tr)
    assert clock._lead_ns == 0.0
    assert gpu["compute"] == pytest.approx(truth["compute"], abs=2.0)


@pytest.mark.parametrize("waited_us", [0.0, 0.4, 480.0])
def test_a_compute_span_starts_with_the_first_kernel_however_early_its_start_event_completed(waited_us):
    """The start event completes when the stream reaches it; the start kernel behind it may run only later (an
    idle device waiting for the launch). The span starts at the event, or one start kernel's run before the
    event behind the kernel when that is later."""
    dev, clock = Device(), EventClock(ORIGIN)
    t = ORIGIN + 5_000_000
    tr, truth = trace(dev, t, anchor=(dev.event(t), t))
    before = truth["compute"][0] * 1000 + ORIGIN                       # host ns of the start event
    kernel_ns = 1_200.0
    first_kernel = before + waited_us * 1000                           # when the start kernel began
    tr.compute_head = (dev.event(before), dev.event(first_kernel + kernel_ns))
    tr.start_kernel_ns = kernel_ns
    gpu, _ = clock.resolve(tr)
    assert gpu["compute"][0] == pytest.approx((first_kernel - ORIGIN) / 1000, abs=0.11)
    assert gpu["compute"][1] == pytest.approx(truth["compute"][1], abs=0.11)
    assert gpu["h2d"] == pytest.approx(truth["h2d"], abs=0.11)


def test_a_start_kernel_slower_than_measured_never_moves_the_span_before_its_start_event():
    dev, clock = Device(), EventClock(ORIGIN)
    t = ORIGIN + 5_000_000
    tr, truth = trace(dev, t, anchor=(dev.event(t), t))
    before = truth["compute"][0] * 1000 + ORIGIN
    tr.compute_head = (dev.event(before), dev.event(before + 900.0))   # it ran faster than the 1.2 µs measured
    tr.start_kernel_ns = 1_200.0
    gpu, _ = clock.resolve(tr)
    assert gpu["compute"][0] == pytest.approx(truth["compute"][0], abs=0.11)


def test_through_an_epoch_wake_ups_slow_for_a_whole_run_never_move_the_clock():
    # under a profiler every blocked wait ends ~80 µs after the copy (slow CUDA calls): not drift. Through an
    # epoch the anchors bound the mapping, so the gaps stay device time
    dev, clock = Device(), EventClock(ORIGIN, wake_slack_us=30.0, persist=8)
    t = ORIGIN + 5_000_000
    epoch = (dev.event(t), t)
    spans, truths = [], []
    for i in range(60):
        tr, truth = trace(dev, t, anchor=(dev.event(t + 45_000), t + 45_000), step=i, wait_extra_ns=80_000)
        tr.epoch = epoch
        spans.append(clock.resolve(tr)[0])
        truths.append(truth)
        t += 1_300_000
    assert max(abs(g - h) for g, h in zip(_gaps(spans), _gaps(truths))) < 0.2
    assert clock.corrections == 0


def test_through_an_epoch_the_anchors_hold_a_slow_device_clock():
    # the device clock runs 300 ppm slow, so the epoch maps events ever earlier; each step's anchor (seen 0-20 µs
    # after its record call began) pulls the mapping on, within the least anchor delay
    import random

    rng = random.Random(7)
    dev, clock = Device(drift_ppm=-300.0), EventClock(ORIGIN)
    t = ORIGIN + 1_000_000
    epoch = (dev.event(t), t)
    worst = 0.0
    for i in range(400):                                      # ~0.4 s: 120 µs of drift
        tr, truth = trace(dev, t, anchor=(dev.event(t + 45_000 + rng.uniform(0, 20_000)), t + 45_000), step=i,
                          queued_ns=900_000)
        tr.epoch = epoch
        gpu, _ = clock.resolve(tr)
        worst = max(worst, abs(gpu["compute"][0] - truth["compute"][0]))
        t += 1_100_000
    assert worst < 25.0, worst
