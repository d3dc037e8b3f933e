"""AppState: what the HTTP routes, the websocket and the Gradio UI share — the engine, its telemetry, the
load generator, the limits and a loaded replay — behind a small set of methods that check what only the server
knows (its limits, its load, whether it is shutting down). The engine checks prompts and sampling itself.

Errors speak for themselves (errors.py): ValueError (bad input or over a cap, 400), BusyError (at capacity,
429), NotFoundError (404), NoEngineError (replay-only, 409), ShuttingDownError (503), telemetry.TimelineError (a
malformed timeline, 400); loadtest's ModeLocked (a mode switch during an A/B, 409 from routes/control.py).
"""
from __future__ import annotations

import functools
import re
import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

from batchscope.engine.config import EngineConfig, SamplingParams
from batchscope.telemetry.nvml import BUSY_NOTE

from ..loadtest.manager import BurstManager
from ..loadtest.specs import BurstSpec, Limits, LoadSpec, Mode
from ..loadtest.statuses import ABStatus, BurstList, BurstStatus, LoadStatus
from ..loadtest.sweep.sweeps import Sweeps
from ..loadtest.sweep.spec import SLO, SweepSpec
from ..loadtest.sweep.progress import SweepList, SweepStarted, SweepStatus
from .errors import BusyError, NoEngineError, NotFoundError, ShuttingDownError
from .openai_logprobs import TokenStrings
from .profiles import ProfileWindows
from .prompts import chat_ids, prompt_ids, sampling_params
from .replay import MAX_JSON_DEPTH, MAX_REPLAY_BYTES, accept_timeline, read_timeline_file
from .schemas import (Health, ModeChanged, ModeLock, ProfileStatus, RecordingCaps, RecordingInfo, Recordings,
                      RecordingStarted, RecordingStopped, ReplayLoaded, Status)

RECORDING_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
T = TypeVar("T")


class AppState:
    def __init__(self, engine=None, telemetry=None, limits: Limits | None = None, replay: dict | None = None):
        self.engine = engine
        self.telemetry = telemetry
        self.limits = limits or Limits()
        self.replay: dict | None = replay
        self.started = time.time()
        self._lock = threading.Lock()
        self._recording: str | None = None
        self._closed = False
        self._shutting_down = False
        self._inflight: set = set()    # handles submitted through this state and not finished yet
        self._inflight_lock = threading.Lock()
        self._replay_lock = threading.Lock()
        self.bursts: BurstManager | None = None
        self.profiles: ProfileWindows | None = None
        self._metrics = None            # the Prometheus registry, made at the first scrape
        self.sweeps: Sweeps | None = None
        self._import_lock = threading.Lock()
        if engine is not None:
            self.bursts = BurstManager(engine, self.limits, self.vocab_size, telemetry=telemetry)
            self.profiles = ProfileWindows(engine)
            self.sweeps = Sweeps(self.bursts)

    # ------------------------------------------------------------------------------------------------ lifecycle
    @classmethod
    def load(cls, config: EngineConfig, limits: Limits | None = None, nvml_hz: float = 20.0) -> AppState:
        """Load the model, start the engine and its telemetry."""
        from batchscope.engine import Engine
        from batchscope.telemetry import Telemetry

        engine = Engine(config)
        try:
            # ten seconds of history in the hello message: a new viewer fills its default window at once
            telemetry = Telemetry(engine, nvml_hz=nvml_hz, recent_s=10.0)
        except Exception:
            engine.close()
            raise
        return cls(engine, telemetry, limits)

    @classmethod
    def from_replay_file(cls, path: str | Path, limits: Limits | None = None, progress=None) -> AppState:
        """Replay-only: no model, the UI shows a recorded timeline, or a profiler trace imported as one
        (`progress(bytes_done, bytes_total)` while it is read). Raises TimelineError if the file is bad. A local
        file has no size limit (that is the way to replay one over MAX_REPLAY_BYTES)."""
        return cls(limits=limits, replay=with_board(read_timeline_file(path, progress=progress)))

    def begin_shutdown(self) -> None:
        """The server is going down: refuse new work, cancel bursts and every request in flight, so that open
        streams end now (finish_reason "cancelled") instead of holding the shutdown up. Waits for nothing
        (the server calls it from its event loop when a shutdown signal arrives)."""
        self._shutting_down = True
        if self.bursts is not None:
            self.bursts.cancel_all()
        with self._inflight_lock:
            handles = list(self._inflight)
        for h in handles:
            h.cancel()

    def close(self) -> None:
        """Stop bursts, telemetry and the engine (in that order). Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.begin_shutdown()
        if self.bursts is not None:
            self.bursts.close()
        if self.telemetry is not None:
            self.telemetry.close()
        if self.engine is not None:
            self.engine.close()
        if self.profiles is not None:
            self.profiles.close()

    def _need_engine(self):
        if self.engine is None:
            raise NoEngineError("this server is replaying a recorded timeline; no model is loaded")
        return self.engine

    def _refuse_when_shutting_down(self) -> None:
        if self._shutting_down:
            raise ShuttingDownError("the server is shutting down")

    def _runs(self) -> BurstManager:
        """The load tests' manager (NoEngineError on a replay-only server, which has none)."""
        self._need_engine()
        return self.bursts

    def _admit(self) -> BurstManager:
        """The manager, to start a run with: refused while the server shuts down."""
        runs = self._runs()
        self._refuse_when_shutting_down()
        return runs

    def _look_up(self, find: Callable[[BurstManager], T]) -> T:
        """A run's status through the manager; an id it does not know is a NotFoundError (404)."""
        runs = self._runs()
        try:
            return find(runs)
        except KeyError as e:
            raise NotFoundError(e.args[0]) from None

    # ---------------------------------------------------------------------------------------------- about it
    @property
    def model_name(self) -> str | None:
        if self.engine is not None:
            return self.engine.info.get("model")
        return self._replay_meta().get("model")

    @property
    def vocab_size(self) -> int:
        eng = self._need_engine()
        return int(eng.info.get("vocab_size") or len(eng.tokenizer))

    def _replay_meta(self) -> dict:
        return (self.replay or {}).get("meta", {})

    def health(self) -> Health:
        if self.engine is None:
            return Health(model=self._replay_meta().get("model"), device=self._replay_meta().get("device"),
                          mode=None, replay_only=True)
        return Health(model=self.model_name, device=self.engine.info.get("device"), mode=self.engine.mode,
                      replay_only=False)

    def status(self) -> Status:
        base = {**self.health().model_dump(), "limits": self.limits,
                "uptime_s": time.time() - self.started, "replay_loaded": self.replay is not None,
                "rss_mb": rss_mb(), "shutting_down": self._shutting_down, "max_replay_bytes": MAX_REPLAY_BYTES,
                "max_json_depth": MAX_JSON_DEPTH}
        if self.engine is None:
            meta = self._replay_meta()
            return Status(**base, gpu_name=meta.get("gpu"), dtype=meta.get("dtype"), nvml_available=False,
                          nvml_reason="replay-only: nothing is sampled", busy_note=BUSY_NOTE)
        info = self.engine.info
        tel = self.telemetry.status() if self.telemetry is not None else {}
        counters = {k: v for k, v in self.engine.stats().items() if k != "mode"}   # the mode is the health's
        return Status(**base, **counters,
                      dtype=info.get("dtype"), gpu_name=info.get("gpu_name") or tel.get("gpu_name"), info=info,
                      bursts_running=self.bursts.running(), bursts=self.bursts.status(), recording=self._recording,
                      loads_running=1 if self.bursts.running_load() else 0, running_load=self.bursts.running_load(),
                      mode_lock=self.bursts.mode_lock(),
                      inflight=self._inflight_count(), max_inflight=self.max_inflight, telemetry=tel or None,
                      recordings=tel.get("recordings"), nvml_available=bool(tel.get("nvml")),
                      nvml_reason=tel.get("nvml_reason"), busy_note=tel.get("busy_note") or BUSY_NOTE)

    def set_mode(self, mode: Mode) -> ModeChanged:
        """Switch loops at the next step boundary (the engine refuses a mode it does not have). Raises
        ModeLocked while an A/B runs."""
        previous = self._runs().set_mode(mode)
        return ModeChanged(mode=mode, previous=previous)

    def mode_lock(self) -> ModeLock:
        if self.engine is None:
            return ModeLock(mode=None, locked=True, reason="replay-only: no engine to switch")
        reason = self.bursts.mode_lock()
        return ModeLock(mode=self.engine.mode, locked=reason is not None, reason=reason)

    # ------------------------------------------------------------------------------------------- generating
    def encode(self, prompt: str | list[int], chat: bool | None = False) -> list[int]:
        """Token ids of a prompt within the server's limits (prompts.py says how chat and text are told apart)."""
        return prompt_ids(self._need_engine().tokenizer, prompt, self.limits, chat, self.model_name)

    def encode_messages(self, messages: list[dict]) -> list[int]:
        return chat_ids(self._need_engine().tokenizer, messages, self.limits, self.model_name)

    @functools.cached_property
    def token_strings(self) -> TokenStrings:
        """Token ids' strings and bytes for logprobs, kept for the server's life (the tokenizer does not change)."""
        return TokenStrings(self._need_engine().tokenizer)

    def sampling(self, prompt_len: int, max_new_tokens: int | None = None, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int | None = None, ignore_eos: bool = False,
                 stop=(), *, logprobs: int | None = None, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0, repetition_penalty: float = 1.0) -> SamplingParams:
        return sampling_params(self.limits, self._need_engine().info.get("max_model_len"), prompt_len,
                               max_new_tokens, temperature, top_p, top_k, seed, ignore_eos, stop, logprobs=logprobs,
                               presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                               repetition_penalty=repetition_penalty)

    @property
    def max_inflight(self) -> int:
        """Requests submitted here and not finished: the queue limit plus what the engine runs at once. The
        engine's own count misses submissions it has not picked up yet, so a flood could pass it."""
        running = (self.engine.info.get("max_running") or 0) if self.engine is not None else 0
        return self.limits.max_waiting_requests + running

    def _inflight_count(self) -> int:
        with self._inflight_lock:
            self._inflight = {h for h in self._inflight if not h.done}
            return len(self._inflight)

    def submit(self, ids: list[int], params: SamplingParams):
        """Queue one request (refused with 429 when the engine's queue is already deep)."""
        eng = self._need_engine()
        self._refuse_when_shutting_down()
        queued = eng.stats().get("queue", 0)
        if queued >= self.limits.max_waiting_requests:
            raise BusyError(f"{queued} requests already waiting (limit {self.limits.max_waiting_requests}); "
                            "retry later")
        with self._inflight_lock:
            self._inflight = {h for h in self._inflight if not h.done}
            if len(self._inflight) >= self.max_inflight:
                raise BusyError(f"{len(self._inflight)} requests in flight (limit {self.max_inflight}); retry later")
            handle = eng.submit(ids, params)
            self._inflight.add(handle)
        if self._shutting_down:          # begin_shutdown ran while we submitted: it may have missed this one
            handle.cancel()
        return handle

    # --------------------------------------------------------------------------------------------- load tests
    def start_burst(self, spec: BurstSpec) -> str:
        return self._admit().start_burst(spec)

    def start_ab(self, spec: BurstSpec) -> str:
        return self._admit().start_ab(spec)

    def start_load(self, spec: LoadSpec) -> str:
        return self._admit().start_load(spec)

    def burst_status(self, burst_id: str) -> BurstStatus:
        return self._look_up(lambda runs: runs.burst(burst_id))

    def ab_status(self, ab_id: str) -> ABStatus:
        return self._look_up(lambda runs: runs.ab(ab_id))

    def load_status(self, load_id: str) -> LoadStatus:
        return self._look_up(lambda runs: runs.load(load_id))

    def stop_load(self, load_id: str) -> LoadStatus:
        return self._look_up(lambda runs: runs.stop_load(load_id))

    def running_load(self) -> str | None:
        return self.bursts.running_load() if self.bursts is not None else None

    def list_bursts(self) -> BurstList:
        if self.bursts is None:
            return BurstList(bursts=[], ab=[], kept=0, dropped={})
        return self.bursts.list()

    # ------------------------------------------------------------------------------------------------ sweeps
    def start_sweep(self, spec: SweepSpec) -> SweepStarted:
        self._admit()
        info = self.engine.info
        meta = {"model": self.model_name, "device": info.get("device"), "dtype": info.get("dtype"),
                "gpu": info.get("gpu_name"), "mode_before": self.engine.mode}
        return self.sweeps.start(spec, meta)

    def sweep_run(self, sweep_id: str):
        """A sweep by id, running or kept (NotFoundError if neither): its status(), document(), values."""
        return self._look_up(lambda _: self.sweeps.get(sweep_id))

    def sweep_status(self, sweep_id: str) -> SweepStatus:
        return self.sweep_run(sweep_id).status()

    def stop_sweep(self, sweep_id: str) -> SweepStatus:
        return self._look_up(lambda _: self.sweeps.stop(sweep_id))

    def list_sweeps(self) -> SweepList:
        return self.sweeps.list() if self.sweeps is not None else SweepList(sweeps=[], imports=[])

    def import_report(self, raw, slo: SLO | None = None) -> dict:
        """Read a GuideLLM, vllm bench serve or batchscope.sweep/1 report (loadtest/foreign/reports.py) and keep it to
        overlay; ReportError (400) when it is not what it claims. One at a time, like a replay upload."""
        from ..loadtest.foreign.reports import read_report

        self._runs()
        if not self._import_lock.acquire(blocking=False):
            raise BusyError("another report is being read; retry when it is done")
        try:
            report = read_report(raw, slo or SLO())
        finally:
            self._import_lock.release()
        return {**report, "id": self.sweeps.add_import(report)}

    def imported_report(self, import_id: str) -> dict:
        return self._look_up(lambda _: self.sweeps.get_import(import_id))

    def running_sweep(self) -> str | None:
        return self.sweeps.running() if self.sweeps is not None else None

    def load_test_values(self) -> dict:
        """The raw latencies of the newest burst, A/B and load (BurstManager.latest_values), for CDFs."""
        return self.bursts.latest_values() if self.bursts is not None else {}

    # ------------------------------------------------------------------------------------ timelines and replay
    def timeline(self, recording: str | None = None) -> dict:
        if self.telemetry is None:
            if recording is not None:
                raise NotFoundError(f"no recording {recording!r}: this server is replay-only")
            if self.replay is None:
                raise NotFoundError("no timeline: nothing recorded or loaded")
            return self.replay
        if recording is not None and recording not in self.telemetry.recordings():
            raise NotFoundError(f"no recording named {recording!r}")
        return self.telemetry.timeline(recording=recording)

    def perfetto(self, recording: str | None = None) -> dict:
        from batchscope.telemetry import to_perfetto

        return to_perfetto(self.timeline(recording))

    def _shown(self, recording: str | None, replay: bool) -> dict:
        """The timeline a page shows: the loaded replay (also on a live server that has one), a named recording,
        or the live ring."""
        if replay:
            if self.replay is None:
                raise NotFoundError("no replay loaded: POST a timeline to /api/replay or start with "
                                    "`batchscope replay`")
            return self.replay
        return self.timeline(recording)

    def request_waits(self, request_id: str, recording: str | None = None, replay: bool = False) -> dict:
        """One request's spans, steps and waits in that timeline (telemetry/request_waits.py); NotFoundError when
        it holds no request with that id."""
        from batchscope.telemetry.request_waits import request_waits

        tl = self._shown(recording, replay)
        found = request_waits(tl.get("steps", []), tl.get("requests", []), request_id)
        if found is None:
            where = "the replay" if replay or self.telemetry is None else (
                f"recording {recording!r}" if recording else "the live timeline")
            raise NotFoundError(f"no request {request_id!r} in {where} (GET /api/requests/slowest lists some)")
        return found

    def slowest_requests(self, n: int, recording: str | None = None, replay: bool = False) -> dict:
        from batchscope.telemetry.request_waits import slowest_requests

        tl = self._shown(recording, replay)
        return {"requests": slowest_requests(tl.get("steps", []), tl.get("requests", []), n),
                "finished": sum(r.get("finish_us") is not None for r in tl.get("requests", []))}

    def start_recording(self, name: str | None = None) -> RecordingStarted:
        tel = self._need_telemetry()
        taken = set(tel.recordings())
        if not name:
            name = base = time.strftime("rec-%Y%m%d-%H%M%S")
            n = 1
            while name in taken:
                n += 1
                name = f"{base}-{n}"
        elif name in taken:
            raise ValueError(f"a recording named {name!r} exists already; choose another name")
        if not RECORDING_NAME.match(name):
            raise ValueError("recording name must be 1-64 letters, digits, '.', '_' or '-', starting with a letter "
                             f"or digit; got {name!r}")
        with self._lock:
            if self._recording is not None:
                raise ValueError(f"recording {self._recording!r} is already running; stop it first")
            started = tel.start_recording(name)
            self._recording = name
        return RecordingStarted(recording=name, **started)

    def stop_recording(self) -> RecordingStopped:
        tel = self._need_telemetry()
        with self._lock:
            if self._recording is None:
                raise ValueError("no recording is running")
            name, self._recording = self._recording, None
            summary = tel.stop_recording()
        # `stored` says whether it hit its caps (truncated) and what it dropped
        return RecordingStopped(recording=name, summary=summary, stored=tel.recording_info(name))

    def recordings(self) -> Recordings:
        if self.telemetry is None:
            return Recordings(recordings=[], active=None, details=[], limits=None)
        details = []
        for name in self.telemetry.recordings():
            try:
                details.append(RecordingInfo(**self.telemetry.recording_info(name)))
            except KeyError:            # dropped meanwhile
                pass
        return Recordings(recordings=[d.name for d in details], active=self._recording, details=details,
                          limits=RecordingCaps(**self.telemetry.status()["recordings"]))

    # ------------------------------------------------------------------------------- metrics and profiling
    def metrics(self) -> bytes:
        """GET /metrics: the Prometheus text exposition of the live telemetry (telemetry/prometheus.py); empty on
        a replay-only server, where nothing runs."""
        if self.telemetry is None:
            return b""
        from batchscope.telemetry.prometheus import generate_latest, prometheus_registry

        if self._metrics is None:
            self._metrics = prometheus_registry(self.telemetry, self.model_name)
        return generate_latest(self._metrics)

    def start_profile(self, steps: int) -> ProfileStatus:
        """A torch.profiler window over the engine's next `steps` steps (profiles.py): ValueError out of range,
        Conflict while one is open."""
        self._need_engine()
        self._refuse_when_shutting_down()
        return ProfileStatus(**self.profiles.start(steps))

    def profile_status(self) -> ProfileStatus:
        self._need_engine()
        return ProfileStatus(**self.profiles.status())

    def profile_trace(self) -> str:
        """The latest window's trace file (NotFoundError until one is done)."""
        self._need_engine()
        path = self.profiles.trace_path()
        if path is None:
            raise NotFoundError("no profiler trace yet: POST /api/profile, then wait for state 'done'")
        return path

    def open_profile(self) -> ReplayLoaded:
        """The latest trace imported as a timeline and loaded as the replay (NotInThisBuild without the importer)."""
        self._need_engine()
        return self.load_replay(self.profiles.import_trace())

    def _need_telemetry(self):
        self._need_engine()
        return self.telemetry

    def load_replay(self, obj, name: str | None = None) -> ReplayLoaded:
        """Validate a timeline (or import a profiler trace as one) and keep it for the UI's replay view (replay.py
        says what `obj` may be; `name` is what its errors call it). Raises telemetry.TimelineError saying where and
        why, BusyError while another replay is being loaded."""
        # one at a time: each holds its text and parsed records (~5x the text) until it is done
        if not self._replay_lock.acquire(blocking=False):
            raise BusyError("another timeline is being loaded for replay; retry when it is done")
        try:
            replay = accept_timeline(obj, name)
            with_board(replay)
            self.replay = replay
        finally:
            self._replay_lock.release()
        return ReplayLoaded(loaded=True, steps=len(self.replay.get("steps", [])),
                            requests=len(self.replay.get("requests", [])), meta=self.replay.get("meta", {}),
                            board=self.replay["summary"].get("board"))

    def replay_perfetto(self) -> dict:
        """The loaded replay as a Perfetto trace: what a replay-only server (or a page showing a replay) exports."""
        from batchscope.telemetry import to_perfetto

        if self.replay is None:
            raise NotFoundError("no replay loaded: POST a timeline to /api/replay or start with `batchscope replay`")
        return to_perfetto(self.replay)

    def history(self, seconds: float) -> dict:
        """The live ring's newest `seconds` (steps, requests, NVML, every mode switch), for a viewer that joins
        late: the page's windows then hold what the server kept, not only what this viewer saw."""
        return self._need_telemetry().history(seconds)


def with_board(timeline: dict) -> dict:
    """A timeline's summary with the scoreboard in it: recordings made before the board existed get it computed
    here, once, so the page never computes figures itself."""
    summary = timeline.setdefault("summary", {})
    if not isinstance(summary.get("board"), dict):
        from batchscope.telemetry.figures import board

        summary["board"] = board(timeline.get("steps", []), live=False, nvml=timeline.get("nvml", []))
    return timeline


def rss_mb() -> float | None:
    """This process's resident memory in MiB (None where psutil cannot tell)."""
    try:
        import psutil

        return round(psutil.Process().memory_info().rss / (1 << 20), 1)
    except Exception:
        return None
