"""The figures a room reads first: the header never reads 0 while requests run, and the scoreboard gives a verdict
only when the steps support one."""
import random

import pytest

from batchscope.telemetry.figures import MIN_STEPS, WARMUP_STEPS, board, compare, mode_runs, recent


def run(mode, n, period_ms, first_step=0, t0_us=0.0, batch=16, prefill_every=0, jitter=0.0, seed=0,
        compute_share=0.99):
    """n consecutive step records of one mode: each `period_ms` long (times a random factor within +-jitter),
    compute covering `compute_share` of it, `batch` requests decoding one token each; every `prefill_every`-th
    step carries a prefill chunk and lasts three times as long."""
    rng = random.Random(seed)
    out, t = [], t0_us
    for i in range(n):
        prefill = prefill_every and i % prefill_every == prefill_every - 1
        p = period_ms * 1000 * (3 if prefill else 1) * (1 + rng.uniform(-jitter, jitter))
        c0 = t + p * (1 - compute_share)
        out.append({"step": first_step + i, "mode": mode, "num_requests": batch,
                    "prefill_tokens": 256 if prefill else 0, "decode_tokens": batch, "tokens_out": batch,
                    "compute_us": [c0, t + p], "compute_basis": "gpu",
                    "gpu_idle_before_us": p * (1 - compute_share) if i else None,
                    "idle_by_cause_us": {"fill": p * (1 - compute_share)} if i else {},
                    "cpu": {"schedule": [t, t + 10]}})
        t += p
    return out


def test_the_header_counts_the_steps_just_done_not_the_one_in_flight():
    steps = run("async", 20, 400.0)                       # 400 ms steps, as SmolLM2 on a small CPU
    last_end = steps[-1]["compute_us"][1]
    for now in (last_end + 1, last_end + 390_000):        # the next step is in flight the whole time
        fig = recent(steps, now, running=16)
        assert fig["busy_pct"] == pytest.approx(99.0, abs=0.6)
        assert fig["tokens_per_s"] == pytest.approx(16 / 0.4, rel=0.15)


def test_an_idle_engine_reads_zero_and_a_busy_one_never_does():
    steps = run("sync", 20, 10.0)
    end = steps[-1]["compute_us"][1]
    assert recent(steps, end + 5e6, running=0)["busy_pct"] == 0.0
    assert recent(steps, end + 5e6, running=3)["busy_pct"] > 90           # a long step in flight: still busy
    assert recent([], 1e6, running=0)["busy_pct"] == 0.0
    assert recent([], 1e6, running=2)["busy_pct"] is None                 # nothing completed yet: unknown


def test_two_modes_alike_are_within_noise_however_the_steps_fall():
    for seed in range(5):
        s = run("sync", 60, 400.0, jitter=0.2, seed=seed)
        a = run("async", 60, 400.0, first_step=60, jitter=0.2, seed=seed + 100)
        c = compare([s], [a])
        assert c["verdict"] == "within noise", c
        lo, hi = c["ms_per_step"]["ci"]
        assert lo <= 1.0 <= hi or abs(c["ms_per_step"]["ratio"] - 1) < 0.02


def test_a_real_difference_gets_a_verdict_and_both_ratios_agree():
    s = run("sync", 80, 11.0, jitter=0.05, prefill_every=7)
    a = run("async", 80, 10.0, first_step=80, jitter=0.05, prefill_every=7, seed=3)
    c = compare([s], [a])
    assert c["verdict"] == "async faster"
    assert c["ms_per_step"]["ratio"] == pytest.approx(1.1, rel=0.03)
    assert c["ms_per_step"]["ci"][0] > 1.0
    # ms/step and tokens/s from the same decode steps: they cannot point different ways
    assert c["tokens_per_s"]["ratio"] == pytest.approx(c["ms_per_step"]["ratio"], rel=0.03)
    assert c["n"]["sync"] == c["n"]["async"] < 80                         # the prefill steps are left out


def test_no_ratio_before_enough_matched_steps():
    s = run("sync", MIN_STEPS - 5, 10.0)
    a = run("async", 200, 5.0, first_step=100)
    c = compare([s], [a])
    assert c["verdict"] == "not enough steps" and c["ms_per_step"] is None
    assert f"of {MIN_STEPS}" in c["reason"]
    # an A/B's warm-up of 2 requests does not match a 16-request half: nothing to compare
    small = run("async", 100, 2.0, first_step=300, batch=2)
    assert compare([run("sync", 100, 10.0)], [small])["verdict"] == "not enough steps"


def test_the_board_leaves_warm_up_out_and_says_where_it_was():
    steps = run("sync", 40, 10.0) + run("async", 40, 10.0, first_step=40, t0_us=400_000)
    b = board(steps, live=False)
    assert [(w["mode"], w["first_step"], w["last_step"]) for w in b["warmup"]] == [
        ("sync", 0, WARMUP_STEPS - 1), ("async", 40, 40 + WARMUP_STEPS - 1)]
    assert b["modes"]["sync"]["steps"] == 40 - WARMUP_STEPS
    assert b["modes"]["sync"]["warmup_steps"] == WARMUP_STEPS
    assert b["modes"]["async"]["first_step"] == 40 + WARMUP_STEPS
    assert b["compare"]["n"]["sync"] > 0


def test_live_covers_the_newest_stretch_of_each_mode():
    old = run("async", 30, 10.0)
    sync = run("sync", 30, 10.0, first_step=30, t0_us=300_000)
    new = run("async", 3000, 10.0, first_step=60, t0_us=600_000)           # 30 s of async
    runs = mode_runs(old + sync + new, live=True, window_us=15e6)
    assert runs["async"][0][0]["step"] > 60 + 1000                          # only its newest 15 s
    assert [r["step"] for r in runs["sync"][0]] == list(range(30, 60))
    whole = mode_runs(old + sync + new, live=False)
    assert len(whole["async"]) == 2


def _stretches(*specs, jitter=0.03):
    """Consecutive stretches (mode, period_ms, steps), one after the other in time and step numbers."""
    steps, t, first = [], 0.0, 0
    for i, (mode, period, n) in enumerate(specs):
        part = run(mode, n, period, first_step=first, t0_us=t, jitter=jitter, seed=i)
        steps += part
        t, first = part[-1]["compute_us"][1], first + n
    return steps


def test_load_that_moved_between_two_stretches_is_not_a_mode_effect():
    """One sync stretch while something else held the machine, one async stretch after it let go: the steps' own
    spread says "async faster" with a tight interval; the board says one switch cannot tell the two apart."""
    c = board(_stretches(("sync", 12.0, 80), ("async", 10.0, 80)), live=False)["compare"]
    assert c["step_verdict"] == "async faster" and c["ms_per_step"]["ci"][0] > 1.1
    assert c["verdict"] == "not enough alternations" and c["switches"]["n"] == 1
    assert "switches between the modes" in c["reason"]


def test_switches_that_disagree_are_within_noise_however_tight_the_steps_are():
    """Background load drifting across four stretches: each switch says something else (1.2x, 0.9x, 0.82x), so the
    interval over them holds 1, whatever the pooled steps say."""
    steps = _stretches(("sync", 12.0, 60), ("async", 10.0, 60), ("sync", 9.0, 60), ("async", 11.0, 60))
    c = board(steps, live=False)["compare"]
    assert c["switches"]["n"] == 3 and c["switches"]["ci"][0] < 1.0 < c["switches"]["ci"][1], c["switches"]
    assert c["verdict"] == "within noise", c


def test_a_real_effect_across_switches_names_its_winner_live_and_recorded():
    steps = _stretches(("sync", 11.0, 60), ("async", 10.0, 60), ("sync", 11.1, 60), ("async", 9.9, 60))
    for live in (False, True):
        c = board(steps, live=live)["compare"]
        assert c["verdict"] == "async faster" and c["switches"]["n"] == 3, c
        assert c["switches"]["ci"][0] > 1.0 and c["switches"]["ratio"] == pytest.approx(1.1, rel=0.03)


def test_no_winner_where_compute_runs_on_the_host():
    """A CPU engine: the same cores build and compute each step, nothing overlaps (the forecast says so), so even a
    consistent difference over many switches is the machine's, not the mode's."""
    steps = _stretches(("sync", 12.0, 60), ("async", 10.0, 60), ("sync", 12.0, 60), ("async", 10.0, 60))
    for rec in steps:
        rec["compute_basis"] = "host"
    c = board(steps, live=False)["compare"]
    assert c["step_verdict"] == "async faster" and c["verdict"] == "no winner here", c
    assert "host" in c["reason"]
