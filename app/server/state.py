"""AppState: what the HTTP routes, the websocket and the Gradio UI share — the engine, its telemetry, the limits,
the requests in flight and a loaded replay — and its lifecycle (load, replay a file, shut down, close). It checks
what only the server knows (its limits, its load, whether it is shutting down); the engine checks prompts and
sampling itself.

The rest lives in rooms, one module each, built here and reached as attributes (the UI) or through each room's
FastAPI dependency (the routes, deps.py lists them):
    state.load_lab    load_lab.py      bursts, A/B comparisons, continuous loads, the guarded mode switch
    state.sweep_lab   sweep_lab.py     sweeps and foreign reports
    state.timelines   timelines.py     timelines, named recordings, the replay
    state.profiler    profiler.py      torch.profiler windows and their traces
    state.analysis    analysis_lab.py  compare, what-if and the what-if's verify job

Errors speak for themselves (errors.py): ValueError (bad input or over a cap, 400), BusyError (at capacity,
429), NotFoundError (404), NoEngineError (replay-only, 409), ShuttingDownError (503), telemetry.TimelineError (a
malformed timeline, 400); loadtest's ModeLocked (a mode switch during an A/B, 409 from routes/control.py).
"""
from __future__ import annotations

import functools
import threading
import time
from pathlib import Path
from typing import Annotated

from fastapi import Depends

from batchscope.engine.config import EngineConfig, SamplingParams
from batchscope.telemetry.nvml import BUSY_NOTE

from ..loadtest.manager import BurstManager
from ..loadtest.specs import Limits
from .deps import app_state
from .errors import BusyError, NoEngineError, ShuttingDownError
from .analysis_lab import AnalysisLab
from .load_lab import LoadLab
from .openai_logprobs import TokenStrings
from .profiler import Profiler
from .profiles import ProfileWindows
from .prompts import chat_ids, prompt_ids, sampling_params
from .replay import MAX_JSON_DEPTH, MAX_REPLAY_BYTES, read_timeline_file
from .schemas import Health, Status
from .sweep_lab import SweepLab
from .timelines import Timelines, with_board


class AppState:
    def __init__(self, engine=None, telemetry=None, limits: Limits | None = None, replay: dict | None = None):
        self.engine = engine
        self.telemetry = telemetry
        self.limits = limits or Limits()
        self.replay: dict | None = replay
        self.started = time.time()
        self._lock = threading.Lock()
        self._closed = False
        self._shutting_down = False
        self._inflight: set = set()    # handles submitted through this state and not finished yet
        self._inflight_lock = threading.Lock()
        self._metrics = None            # the Prometheus registry, made at the first scrape
        live = engine is not None
        self.load_lab = LoadLab(self, BurstManager(engine, self.limits, self.vocab_size, telemetry=telemetry)
                                if live else None)
        self.sweep_lab = SweepLab(self, self.load_lab)
        self.timelines = Timelines(self)
        self.profiler = Profiler(self, ProfileWindows(engine) if live else None, self.timelines)
        self.analysis = AnalysisLab(self)

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
        if self.load_lab.runs is not None:
            self.load_lab.runs.cancel_all()
        with self._inflight_lock:
            handles = list(self._inflight)
        for h in handles:
            h.cancel()

    def close(self) -> None:
        """Stop load tests, telemetry and the engine (in that order), then the profiler's folder. Safe to call
        twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.begin_shutdown()
        if self.load_lab.runs is not None:
            self.load_lab.runs.close()
        if self.telemetry is not None:
            self.telemetry.close()
        if self.engine is not None:
            self.engine.close()
        if self.profiler.windows is not None:
            self.profiler.windows.close()

    def need_engine(self):
        """The engine; NoEngineError on a replay-only server."""
        if self.engine is None:
            raise NoEngineError("this server is replaying a recorded timeline; no model is loaded")
        return self.engine

    def refuse_when_shutting_down(self) -> None:
        if self._shutting_down:
            raise ShuttingDownError("the server is shutting down")

    # ---------------------------------------------------------------------------------------------- about it
    @property
    def model_name(self) -> str | None:
        if self.engine is not None:
            return self.engine.info.get("model")
        return self._replay_meta().get("model")

    @property
    def vocab_size(self) -> int:
        eng = self.need_engine()
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
        runs = self.load_lab.runs
        return Status(**base, **counters,
                      dtype=info.get("dtype"), gpu_name=info.get("gpu_name") or tel.get("gpu_name"), info=info,
                      bursts_running=runs.running(), bursts=runs.status(), recording=self.timelines.recording,
                      loads_running=1 if runs.running_load() else 0, running_load=runs.running_load(),
                      mode_lock=runs.mode_lock(),
                      inflight=self._inflight_count(), max_inflight=self.max_inflight, telemetry=tel or None,
                      recordings=tel.get("recordings"), nvml_available=bool(tel.get("nvml")),
                      nvml_reason=tel.get("nvml_reason"), busy_note=tel.get("busy_note") or BUSY_NOTE)

    def metrics(self) -> bytes:
        """GET /metrics: the Prometheus text exposition of the live telemetry (telemetry/prometheus.py); empty on
        a replay-only server, where nothing runs."""
        if self.telemetry is None:
            return b""
        from batchscope.telemetry.prometheus import generate_latest, prometheus_registry

        if self._metrics is None:
            self._metrics = prometheus_registry(self.telemetry, self.model_name)
        return generate_latest(self._metrics)

    # ------------------------------------------------------------------------------------------- generating
    def encode(self, prompt: str | list[int], chat: bool | None = False) -> list[int]:
        """Token ids of a prompt within the server's limits (prompts.py says how chat and text are told apart)."""
        return prompt_ids(self.need_engine().tokenizer, prompt, self.limits, chat, self.model_name)

    def encode_messages(self, messages: list[dict]) -> list[int]:
        return chat_ids(self.need_engine().tokenizer, messages, self.limits, self.model_name)

    @functools.cached_property
    def token_strings(self) -> TokenStrings:
        """Token ids' strings and bytes for logprobs, kept for the server's life (the tokenizer does not change)."""
        return TokenStrings(self.need_engine().tokenizer)

    def sampling(self, prompt_len: int, max_new_tokens: int | None = None, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int | None = None, ignore_eos: bool = False,
                 stop=(), *, logprobs: int | None = None, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0, repetition_penalty: float = 1.0) -> SamplingParams:
        return sampling_params(self.limits, self.need_engine().info.get("max_model_len"), prompt_len,
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
        eng = self.need_engine()
        self.refuse_when_shutting_down()
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


State = Annotated[AppState, Depends(app_state)]


def rss_mb() -> float | None:
    """This process's resident memory in MiB (None where psutil cannot tell)."""
    try:
        import psutil

        return round(psutil.Process().memory_info().rss / (1 << 20), 1)
    except Exception:
        return None
