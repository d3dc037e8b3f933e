"""A what-if verified on this server's own engine: the prediction first, then, per predicted loop, the recording's
requests replayed through the running engine (the same arrival offsets scaled by `rate`, the same prompt and
output lengths, greedy, EOS ignored: telemetry/whatif/measure.py's replay), and the same figures computed from the
live telemetry of those requests alone.

The job holds the engine as a sweep does (BurstManager.hold_engine): no burst, A/B, load, sweep or other verify
starts while it runs, and the mode is locked; it sets the mode itself and puts it back after. A running server
cannot change its engine's budget, running-request cap, KV size or graphs: analysis_lab.py refuses those with the
CLI command that verifies them (a fresh engine per run).
"""
from __future__ import annotations

import threading
import time
import uuid

from batchscope.engine.config import SamplingParams

WARMUP_REQUESTS = 4         # a few of the load's first prompts, in the mode about to run, before it is measured
WARMUP_TOKENS = 4
TIMEOUT_S = 600.0           # per loop, as the CLI's --verify
POLL_S = 0.1


class VerifyRun:
    """One verify job: `state` running -> done / error / stopped, `phase` what it does now, `progress` the
    requests finished of those to replay (all loops together). What BurstManager.hold_engine needs: id, state,
    stop(reason), describe()."""

    def __init__(self, source: str, settings: dict, runs: int, rec, requests: int):
        self.id = f"wv-{uuid.uuid4().hex[:8]}"
        self.source, self.settings, self.runs, self.rec = source, settings, runs, rec
        self.state, self.phase, self.error = "running", "predicting", None
        self.total, self.done = requests, 0
        self.result: dict | None = None
        self.created = time.time()
        self.ended_at: float | None = None
        self._stop = threading.Event()
        self.ended = threading.Event()
        self.stop_reason: str | None = None

    def describe(self) -> str:
        return f"a what-if verify ({self.id}) is running its load on the engine"

    def stop(self, reason: str = "stopped") -> None:
        self.stop_reason = reason
        self._stop.set()

    def status(self) -> dict:
        return {"id": self.id, "state": self.state, "phase": self.phase, "error": self.error,
                "source": self.source, "settings": self.settings,
                "progress": {"done": self.done, "total": self.total}, "created": self.created,
                "ended": self.ended_at, "result": self.result}

    # -- the run, on its own thread (BurstManager.spawn)
    def run(self, engine, telemetry) -> None:
        original = engine.mode
        state, error = "error", None
        try:
            self._run(engine, telemetry)
            state = "done"
        except Exception as exc:             # a failed job reports, it does not vanish
            error = str(exc) or type(exc).__name__
            state = "stopped" if self._stop.is_set() else "error"
        finally:
            self.phase = None
            try:
                engine.set_mode(original, reason=f"what-if verify {self.id}: back to {original}")
            except Exception:
                pass
            # only now does the hold go: a mode switch made as soon as it is allowed must not be undone by ours
            self.error, self.ended_at = error, time.time()
            self.state = state
            self.ended.set()

    def _run(self, engine, telemetry) -> None:
        from batchscope.telemetry.whatif import predict
        from batchscope.telemetry.whatif.measure import prompts_for, replay, score
        from batchscope.telemetry.whatif.new_load import reshape

        result = predict(self.rec, self.settings, runs=self.runs)
        self.result = result
        rate = float(self.settings.get("rate", 1.0))
        vocab = int(engine.info.get("vocab_size") or 1000)
        for mode, entry in result["modes"].items():
            self._check_stop()
            seg = self.rec.segments.get(mode) or next(iter(self.rec.segments.values()))
            load = sorted(reshape(seg.load, self.settings), key=lambda i: i.arrival_us)
            prompts = prompts_for(load, vocab)
            self.phase = f"warming up {mode}"
            engine.set_mode(mode, reason=f"what-if verify {self.id}: {mode}")
            engine.generate(prompts[:WARMUP_REQUESTS], SamplingParams(max_new_tokens=WARMUP_TOKENS, ignore_eos=True))
            self.phase = f"running {mode}"
            prefix = f"{self.id}-{mode}"
            handles = replay(engine, load, prompts, rate, id_prefix=prefix, stop=self._stop)
            before = self.done
            self._wait(handles, before)
            self._check_stop()
            score(entry, measured_figures(telemetry.timeline(), mode, prefix))
            entry["measured"]["where"] = "this server's engine (POST /api/whatif/verify)"

    def _wait(self, handles: list, before: int) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            finished = sum(bool(h.done) for h in handles)
            self.done = before + finished
            if finished == len(handles):
                return
            if self._stop.is_set() or time.monotonic() > deadline:
                for h in handles:
                    h.cancel()
                raise RuntimeError(f"cancelled: {self.stop_reason}" if self._stop.is_set() else
                                   f"the load did not finish within {TIMEOUT_S:.0f} s")
            time.sleep(POLL_S)

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise RuntimeError(f"cancelled: {self.stop_reason}")


def measured_figures(timeline: dict, mode: str, prefix: str) -> dict:
    """The what-if figures of the requests named `PREFIX-k` in the live timeline, over the steps of `mode` that
    ran while they did (the window from the first arrival to the last finish; other traffic in that window, an
    OpenAI request say, shares those steps as it shared the engine)."""
    from batchscope.telemetry.whatif.measures import figures

    mine = [r for r in timeline.get("requests", []) if str(r.get("id", "")).startswith(prefix + "-")]
    done = [r for r in mine if r.get("finish_us") is not None and r.get("arrival_us") is not None]
    if not done:
        raise RuntimeError("none of the replayed requests is in the live timeline (the ring dropped them?)")
    t0, t1 = min(r["arrival_us"] for r in done), max(r["finish_us"] for r in done)
    steps = [s for s in timeline.get("steps", []) if s.get("compute_us") and (s.get("rank") or 0) == 0
             and s.get("mode") == mode and t0 <= s["compute_us"][1] and s["compute_us"][0] <= t1]
    return {"mode": mode, **figures(steps, done)}
