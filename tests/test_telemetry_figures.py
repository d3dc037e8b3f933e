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
