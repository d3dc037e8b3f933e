"""The what-if loop on a CPU, end to end: tiny-random records a small served-like load, the recording is asked
what a smaller token budget and a doubled arrival rate would do, each is run for real (--verify), and the
prediction must land near the measurement.

On a shared 2-core machine the same run's wall-clock figures swing by 2x or more when a neighbour starts a job,
between the recording and the run that checks it as much as anywhere: no bound that a correct model meets can
then tell it from a wrong one. So each bound is widened by the drift of an A/A run (the recorded configuration
run again on the same load, right after the check), and an attempt (record, predict, run) whose figures still
miss is repeated, up to ATTEMPTS times: a model that is right lands within the bounds on a quiet stretch, a wrong
one on none. What the
prediction says about the change itself (the direction, the budget the steps ran with) does not depend on the
machine, but a fit to a recording the neighbours slowed down can blur it: it is part of an attempt too."""
from __future__ import annotations

import json
import random

from batchscope.app.cli import main
from batchscope.engine.config import EngineConfig
from batchscope.telemetry.whatif import open_recording
from batchscope.telemetry.whatif.measures import error_pct, figures
from batchscope.telemetry.whatif.measure import measure, run_load
from batchscope.telemetry.whatif.recording import LoadItem
from batchscope.telemetry.whatif.settings import apply

# one math thread: on a shared 2-core machine torch's two threads wait on each other whenever a neighbour runs
CONFIG = dict(model="tiny-random", device="cpu", dtype="float32", mode="async", num_blocks=256, max_running=16,
              seed=0, cpu_threads=1)
REQUESTS = 32
ATTEMPTS = 3
THROUGHPUT_BOUND_PCT = 30.0
LATENCY_P50_BOUND_PCT = 50.0


def served_like_load(n: int = REQUESTS, rate: float = 25.0, seed: int = 1) -> list[LoadItem]:
    """Poisson arrivals, prompts 32-256 tokens, outputs 16-64 (the served workload's shape, scaled down)."""
    rng = random.Random(seed)
    t, load = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate) * 1e6
        load.append(LoadItem(f"req-{i}", t, rng.randint(32, 256), rng.randint(16, 64)))
    return load


def _verify(recording, tmp_path, capsys, *pairs) -> dict:
    out = tmp_path / "whatif.json"
    rc = main(["whatif", str(recording), "--set", *pairs, "--verify", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "measured" in text and "error" in text
    entry = json.loads(out.read_text())["modes"]["async"]
    assert entry["measured"]["requests"] == entry["predicted"]["requests"] == REQUESTS
    assert isinstance(entry["within_interval"]["output_tokens_per_s"], bool)
    return entry


def _drift(recording, load) -> dict:
    """The machine's own noise right now: the recorded configuration run again on the same load (an A/A), as
    error_pct against the recording (0 where it repeated itself exactly)."""
    rec = open_recording(str(recording))
    again = measure(apply(rec, {}), "async", load, 1.0, "cpu")
    seg = rec.segments["async"]
    return error_pct(again, figures(seg.steps, seg.requests))


def _misses(entry: dict, drift: dict) -> list[str]:
    """The headline figures whose prediction error is beyond the bounds, each widened by how far the same
    configuration run twice drifted on this machine just now."""
    err = entry["error_pct"]
    out = []
    if abs(err["output_tokens_per_s"]) >= THROUGHPUT_BOUND_PCT + abs(drift["output_tokens_per_s"] or 0):
        out.append(f"throughput {err['output_tokens_per_s']}% (A/A drift {drift['output_tokens_per_s']}%)")
    for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        noise = abs(drift[name]["p50"] or 0)
        if abs(err[name]["p50"]) >= LATENCY_P50_BOUND_PCT + noise:
            out.append(f"{name} p50 {err[name]['p50']}% (A/A drift {drift[name]['p50']}%)")
    return out


def _attempts(tmp_path, capsys, pairs: tuple[str, ...], check_change) -> None:
    misses = []
    for attempt in range(ATTEMPTS):
        recording = tmp_path / f"served-{attempt}.timeline.json"
        recording.write_text(json.dumps(run_load(EngineConfig(**CONFIG), served_like_load())))
        entry = _verify(recording, tmp_path, capsys, *pairs)
        missed = _misses(entry, _drift(recording, served_like_load())) + check_change(entry)
        if not missed:
            return
        misses.append(missed)
    raise AssertionError(f"{pairs}: the prediction missed the measurement in all {ATTEMPTS} attempts: {misses}")


def test_a_smaller_budget_is_predicted_then_measured(tmp_path, capsys):
    def change(entry) -> list[str]:
        assert entry["predicted"]["budgets"]["fixed"]["tokens_p50"] == 32
        # 32-token steps chunk every prompt (32-256 tokens): its first token waits for several steps (unless the
        # recording caught the machine so slow that its queue, not the budget, set the TTFT: then try again)
        before, after = entry["replayed"]["ttft_ms"]["p50"], entry["predicted"]["ttft_ms"]["p50"]
        return [] if after > 1.1 * before else [f"TTFT p50 predicted {after} ms, replayed {before} ms"]

    _attempts(tmp_path, capsys, ("max_batch_tokens=32",), change)


def test_a_doubled_arrival_rate_is_predicted_then_measured(tmp_path, capsys):
    def change(entry) -> list[str]:
        # arrivals twice as fast can only shorten the run (by less when the engine is already the bottleneck)
        before, after = entry["replayed"]["duration_s"], entry["predicted"]["duration_s"]
        return [] if after < before else [f"duration predicted {after} s, replayed {before} s"]

    _attempts(tmp_path, capsys, ("rate=2",), change)


def test_an_ab_recording_is_predicted_per_loop_from_its_own_half():
    """An A/B recording (a burst in sync, the same burst in async): each loop's prediction replays its own half."""
    from batchscope.engine.config import SamplingParams
    from batchscope.engine.engine import Engine
    from batchscope.telemetry import Telemetry
    from batchscope.telemetry.whatif import predict
    from batchscope.telemetry.whatif.recording import from_timeline

    engine = Engine(EngineConfig(**{**CONFIG, "mode": "sync"}))
    telemetry = Telemetry(engine)
    try:
        rng = random.Random(2)
        prompts = [[rng.randrange(1000) for _ in range(rng.randint(16, 96))] for _ in range(6)]
        params = SamplingParams(max_new_tokens=12, ignore_eos=True)
        engine.generate(prompts[:1], params)                  # warm-up, not recorded
        telemetry.start_recording("ab")
        engine.generate(prompts, params)
        engine.set_mode("async")
        engine.generate(prompts, params)
        telemetry.stop_recording()
        timeline = telemetry.timeline("ab")
    finally:
        telemetry.close()
        engine.close()
    rec = from_timeline(timeline, "ab")
    assert {m: len(s.load) for m, s in rec.segments.items()} == {"sync": 6, "async": 6}
    both = predict(rec, {"max_batch_tokens": 64}, runs=1)["modes"]
    assert set(both) == {"sync", "async"}
    for mode, entry in both.items():
        assert entry["recorded"]["mode"] == mode and entry["predicted"]["requests"] == 6
        assert entry["predicted"]["output_tokens_per_s"] > 0
    only = predict(rec, {"mode": "sync"}, runs=1)["modes"]
    assert list(only) == ["sync"] and only["sync"]["recorded"]["mode"] == "sync"
