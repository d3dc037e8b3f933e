"""The analysis room: what the page can compare or ask a what-if of (the live ring, the loaded replay, each named
recording), the step-by-step comparison of two of them (telemetry/comparison, `batchscope compare`'s JSON), the
what-if prediction on one (telemetry/whatif, `batchscope whatif`'s JSON) and its verify job on this server's
engine (whatif_verify.py).

A source is "live", "replay", or a recording's name ("recording:NAME" says the same, for a recording named live
or replay). Errors: ValueError (a malformed source, a setting whatif refuses, input that cannot be compared: 400),
NotFoundError (no such recording, no replay loaded, no such verify job: 404), NoEngineError ("live" or a verify on
a replay-only server: 409), Conflict (a setting only a restarted engine could take: 409, with the CLI command that
verifies it), EngineTaken (a verify while another run holds the engine, or the other way round: 409), BusyError
(a comparison or prediction while another one computes: 429).
"""
from __future__ import annotations

import threading
from typing import Annotated

from fastapi import Depends

from .deps import app_state
from .errors import BusyError, Conflict, EngineTaken, NotFoundError
from .timelines import RECORDING_NAME
from .whatif_verify import VerifyRun

LIVE, REPLAY, NAMED = "live", "replay", "recording:"
MAX_SIDE = 8                    # recordings a side of a comparison
MAX_VERIFY_REQUESTS = 5000      # requests a verify replays (all loops together)
MAX_KEPT_VERIFIES = 20
STOP_WAIT_S = 5.0               # POST /api/whatif/verify/{id}/stop waits this long for the job to wind down
# what a running engine can take: the mode switches live; rate and the new-load keys are the load, not the engine
LIVE_KEYS = ("mode", "rate", "arrival", "burstiness", "requests", "prompt_tokens", "new_tokens", "seed")
RESTART_KEYS = ("max_batch_tokens", "itl_target_ms", "max_running", "num_blocks", "mixed_graphs")


class AnalysisLab:
    """`state` is the AppState: its engine and telemetry (None on a replay-only server), its timelines room (named
    recordings, the replay) and its load lab (whose manager holds the engine for a verify)."""

    def __init__(self, state):
        self.state = state
        self._compare_lock = threading.Lock()
        self._predict_lock = threading.Lock()
        self._verifies: dict[str, VerifyRun] = {}
        self._verifies_lock = threading.Lock()

    # -- sources
    def sources(self) -> dict:
        out = []
        if self.state.telemetry is not None:
            out.append({"source": LIVE, "kind": "live", "label": "live: this server's recent history"})
        if self.state.replay is not None:
            meta = self.state.replay.get("meta") or {}
            out.append({"source": REPLAY, "kind": "replay",
                        "label": "replay" + (f": {meta['model']}" if meta.get("model") else "")})
        listed = self.state.timelines.recordings()
        for name in listed.recordings:
            out.append({"source": NAMED + name if name in (LIVE, REPLAY) else name, "kind": "recording",
                        "label": name, "active": name == listed.active})
        return {"sources": out}

    def open_source(self, source) -> tuple[str, dict]:
        """(what the output calls it, its timeline) for one source."""
        if not isinstance(source, str) or not source:
            raise ValueError(f"source must be {LIVE!r}, {REPLAY!r} or a recording's name, got {source!r}")
        if source == LIVE:
            self.state.need_engine()
            return "live", self.state.telemetry.timeline()
        if source == REPLAY:
            return "replay", self.state.timelines.replay()
        name = source.removeprefix(NAMED)
        if not RECORDING_NAME.match(name):
            raise ValueError(f"unknown source {source!r}: {LIVE!r}, {REPLAY!r} or a recording's name "
                             f"(GET /api/recordings/sources lists them)")
        return name, self.state.timelines.timeline(name)

    # -- compare
    def compare(self, base, new, min_effect_pct: float | None, fail_above_pct: float | None) -> dict:
        from batchscope.telemetry.comparison import Recording, compare
        from batchscope.telemetry.comparison.compare_command import with_exit_code

        sides = []
        for side, specs in (("base", base), ("new", new)):
            specs = [specs] if isinstance(specs, str) else list(specs)
            if not 1 <= len(specs) <= MAX_SIDE:
                raise ValueError(f"{side}: 1 to {MAX_SIDE} sources, got {len(specs)}")
            sides.append(specs)
        if not self._compare_lock.acquire(blocking=False):
            raise BusyError("another comparison is being computed; retry when it is done")
        try:
            recs = [[_compare_recording(Recording, *self.open_source(s)) for s in specs] for specs in sides]
            return with_exit_code(compare(recs[0], recs[1], min_effect_pct=min_effect_pct), fail_above_pct)
        finally:
            self._compare_lock.release()

    # -- what-if
    def whatif(self, source: str, settings: dict, runs: int) -> dict:
        from batchscope.telemetry.whatif import predict

        rec, parsed = self._whatif_input(source, settings)
        if not self._predict_lock.acquire(blocking=False):
            raise BusyError("another what-if is being predicted; retry when it is done")
        try:
            return predict(rec, parsed, runs=runs)
        finally:
            self._predict_lock.release()

    def _whatif_input(self, source: str, settings: dict):
        from batchscope.telemetry.whatif import parse
        from batchscope.telemetry.whatif.recording import from_timeline

        parsed = parse(settings_pairs(settings))
        name, timeline = self.open_source(source)
        return from_timeline(timeline, name), parsed

    def start_verify(self, source: str, settings: dict, runs: int) -> VerifyRun:
        from batchscope.telemetry.whatif.new_load import reshape
        from batchscope.telemetry.whatif.settings import apply

        runs_manager = self.state.load_lab.admit()          # NoEngineError, ShuttingDownError
        rec, parsed = self._whatif_input(source, settings)
        config = apply(rec, parsed)                           # impossible settings: 400 before anything runs
        self._refuse_restart(rec, config, parsed, source, settings)
        modes = [parsed["mode"]] if "mode" in parsed else list(rec.segments)
        requests = sum(len(reshape((rec.segments.get(m) or next(iter(rec.segments.values()))).load, parsed))
                       for m in modes)
        if requests > MAX_VERIFY_REQUESTS:
            raise ValueError(f"the verify would replay {requests} requests, more than this server runs in one "
                             f"verify ({MAX_VERIFY_REQUESTS}): ask for fewer (set requests=N) or use the CLI")
        job = VerifyRun(source, parsed, runs, rec, requests)
        try:
            runs_manager.hold_engine(job)
        except EngineTaken as exc:                            # what runs now, said for a verify (not a sweep)
            busy = str(exc).split(";")[0]
            raise EngineTaken(f"{busy}; a what-if verify needs the engine to itself: wait for it to end") from None
        with self._verifies_lock:
            self._verifies[job.id] = job
            for old in [k for k, v in self._verifies.items() if v.state != "running"][:-MAX_KEPT_VERIFIES]:
                del self._verifies[old]
        runs_manager.spawn(lambda j: j.run(self.state.engine, self.state.telemetry), job)
        return job

    def verify(self, verify_id: str) -> dict:
        return self._job(verify_id).status()

    def stop_verify(self, verify_id: str) -> dict:
        """Stop a verify (one that has ended is left as it is): what it submitted is cancelled, the mode put back."""
        job = self._job(verify_id)
        if job.state == "running":
            job.stop("stopped")
            job.ended.wait(STOP_WAIT_S)
        return job.status()

    def _job(self, verify_id: str) -> VerifyRun:
        with self._verifies_lock:
            job = self._verifies.get(verify_id)
        if job is None:
            raise NotFoundError(f"no what-if verify with id {verify_id!r}")
        return job

    def _refuse_restart(self, rec, config, parsed: dict, source: str, settings: dict) -> None:
        """Conflict when the configuration to verify differs from the running engine's in what only a restart
        changes, naming the CLI command that verifies it with an engine of its own."""
        engine = self.state.engine
        live = engine.config
        running = {"model": live.model, "max_batch_tokens": live.max_batch_tokens,
                   "max_running": live.max_running, "mixed_graphs": live.mixed_graphs,
                   "num_blocks": live.num_blocks or engine.info.get("num_blocks"),
                   "device": "cuda" if str(engine.info.get("device") or live.device).startswith("cuda") else "cpu"}
        wanted = {"model": config.model, "max_batch_tokens": config.max_batch_tokens,
                  "max_running": config.max_running, "mixed_graphs": config.mixed_graphs,
                  "num_blocks": config.num_blocks, "device": rec.device_type}
        if config.max_batch_tokens is None:
            running["itl_target_ms"], wanted["itl_target_ms"] = live.itl_target_ms, config.itl_target_ms
        differ = [k for k in wanted if wanted[k] != running[k] and not (k == "mixed_graphs" and running["device"]
                                                                        == "cpu")]
        if not differ:
            return
        said = ", ".join(f"{k}={_shown(wanted[k])} (this engine: {_shown(running[k])})" for k in differ)
        asked = " ".join(settings_pairs(settings))
        raise Conflict(f"{said}: a running engine cannot take that without a restart, so this server verifies "
                       f"only {', '.join(LIVE_KEYS)}. Verify it with an engine of its own: save the recording "
                       f"({_download_hint(source)}) and run `batchscope whatif RECORDING.json"
                       f"{' --set ' + asked if asked else ''} --verify`")


def _compare_recording(recording_type, name: str, timeline: dict):
    kind = "trace" if (timeline.get("meta") or {}).get("source") else "timeline"
    return recording_type(name=name, timeline=timeline, kind=kind)


def settings_pairs(settings: dict) -> list[str]:
    """A body's `set` object as whatif's KEY=VALUE pairs: a number as written, true/false as on/off, null as
    adaptive, [MIN, MAX] as MIN:MAX (whatif's own parse then says what is wrong with a value)."""
    if not isinstance(settings, dict):
        raise ValueError("set must be an object of KEY: VALUE")
    pairs = []
    for key, value in settings.items():
        if isinstance(value, bool):
            text = "on" if value else "off"
        elif value is None:
            text = "adaptive"
        elif isinstance(value, float) and value.is_integer():
            text = str(int(value))
        elif isinstance(value, (int, float, str)):
            text = str(value)
        elif isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
            text = f"{value[0]}:{value[1]}"
        else:
            raise ValueError(f"set.{key}: a number, a string, true/false, null or [MIN, MAX], got {value!r}")
        pairs.append(f"{key}={text}")
    return pairs


def _shown(value) -> str:
    return "adaptive" if value is None else ("on" if value is True else "off" if value is False else str(value))


def _download_hint(source: str) -> str:
    if source == LIVE:
        return "GET /api/timeline.json?download=true"
    if source == REPLAY:
        return "GET /api/replay.json?download=true"
    return f"GET /api/timeline.json?recording={source.removeprefix(NAMED)}&download=true"


def analysis_lab(state=Depends(app_state)) -> AnalysisLab:
    return state.analysis


AnalysisLabDep = Annotated[AnalysisLab, Depends(analysis_lab)]
