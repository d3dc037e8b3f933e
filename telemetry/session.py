"""Telemetry: one session attached to one engine. The facade the app codes against.

    tel = Telemetry(engine)          # attaches the observer, starts the sampler and the hub's flusher
    sub = tel.hub.subscribe()        # live frames for a viewer
    tel.start_recording("A"); ...; summary = tel.stop_recording()
    tel.timeline("A"); tel.close()

Its clock is the engine's: `perf_counter_ns`, shown as µs since this session started (`now_us`).
"""
from __future__ import annotations

import dataclasses
import time

from .catchup import catch_up
from .gc_pauses import CollectorPauses
from .export import build_timeline, created_now, shift_records
from .hub import MAX_SUBSCRIBERS, Hub, request_view
from .nvml import BUSY_NOTE, Sampler, unix_origin_ns
from .perfetto import to_perfetto
from .recorder import MAX_RECORDING_BYTES, MAX_RECORDING_STEPS, MAX_RECORDINGS, MAX_RECORDINGS_BYTES, Recorder
from .records import SCHEMA_ID, span_end, span_start
from .figures import board, recent
from .summary import compare, summarize, union_length
from .totals import Totals


@dataclasses.dataclass
class LiveStats:
    """The body of the websocket's "stats" messages (docs/timeline.md): the engine's counters under the names
    /api/status uses too, and the rates of the newest completed work (figures.recent: its window ends at the
    newest completed step while requests run, so the step in flight never empties it)."""
    t_us: float
    mode: str | None
    queue: int | None                   # requests waiting for admission
    running: int | None
    steps: int | None
    kv_blocks_used: int | None
    kv_blocks_total: int | None
    kv_usage: float | None              # kv_blocks_used / kv_blocks_total, 0-1
    steps_per_s: float | None
    tokens_per_s: float | None
    busy_pct_1s: float | None           # event-based busy share over that window (None: no step completed yet)
    window_s: float | None              # how much completed work busy % covers (up to figures.BUSY_US)
    subscribers: int
    error: str | None = None            # the engine could not be asked for its counters


class Telemetry:
    def __init__(self, engine, nvml_hz: float = 20.0, ring_steps: int = 20000, bandwidth_gbps: float | None = None,
                 *, hub_hz: float = 20.0, hub_max_pending: int = 20_000, ring_requests: int = 4096,
                 recent_s: float = 5.0, max_recording_steps: int = MAX_RECORDING_STEPS,
                 max_recordings: int = MAX_RECORDINGS, max_recording_bytes: int = MAX_RECORDING_BYTES,
                 max_recordings_bytes: int = MAX_RECORDINGS_BYTES, max_subscribers: int = MAX_SUBSCRIBERS):
        self.engine = engine
        self.origin_ns = time.perf_counter_ns()
        self.unix_origin_ns = unix_origin_ns(self.origin_ns)
        self.bandwidth_gbps = bandwidth_gbps
        self.recent_s = recent_s
        self.info = dict(getattr(engine, "info", None) or {})
        self.observer_errors = 0
        self.last_observer_error: str | None = None
        self._closed = False
        self._board_cache: dict = {}        # the live board's figures of a mode whose stretch is over

        self.hub = Hub(stats=self._live_stats, board=self.live_board, hz=hub_hz, max_pending=hub_max_pending,
                       max_subscribers=max_subscribers, catch_up=self._catch_up, clock=self.now_us)
        self.collector = CollectorPauses()
        self.totals = Totals(self.info, bandwidth_gbps)
        self.recorder = Recorder(self.origin_ns, ring_steps=ring_steps, ring_requests=ring_requests,
                                 ring_nvml=int(max(nvml_hz, 1.0) * 600), publish=self.hub.publish,
                                 max_recording_steps=max_recording_steps, max_recordings=max_recordings,
                                 max_recording_bytes=max_recording_bytes, max_recordings_bytes=max_recordings_bytes,
                                 collections=self.collector.take, totals=self.totals)
        device = self.info.get("device") or getattr(getattr(engine, "config", None), "device", None)
        self.device = str(device) if device is not None else None
        self.sampler = Sampler(self.recorder.on_sample, self.now_us, self.device, hz=nvml_hz,
                               unix_origin_ns=self.unix_origin_ns,
                               use_nvml=bool(self.device and self.device.startswith("cuda")),
                               rank_devices=[r["device"] for r in self.info.get("ranks") or []])
        self.sampler.start()
        self._observer = self._observe      # one bound method: the engine removes observers by identity
        try:
            engine.add_observer(self._observer)
        except Exception:
            self.sampler.close()
            self.hub.close()
            self.collector.close()
            raise

    # ---- the engine thread ---------------------------------------------------------------------------------
    def _observe(self, event) -> None:
        try:
            self.recorder.on_engine_event(event)
        except Exception as exc:          # telemetry must never take the engine down
            self.observer_errors += 1
            self.last_observer_error = f"{type(exc).__name__}: {exc}"

    # ---- clocks and status -----------------------------------------------------------------------------------
    def now_us(self) -> float:
        """µs since this session started, on the same clock as every record."""
        return (time.perf_counter_ns() - self.origin_ns) / 1000.0

    def _mode(self) -> str | None:
        return getattr(self.engine, "mode", None)

    def status(self) -> dict:
        s = self.sampler.status()
        rec = self.recorder
        return {
            "nvml": s["nvml"], "nvml_reason": s["nvml_reason"],
            "gpu_name": s["gpu_name"] or self.info.get("gpu_name"),
            "device": self.device, "sampler": s["sampler"], "sampler_hz": s["hz"], "busy_note": BUSY_NOTE,
            "clock": rec.clock.status(), "steps_seen": rec.steps_seen, "ring_steps": len(rec.steps),
            "out_of_order_steps": rec.out_of_order, "observer_errors": self.observer_errors,
            "observer_us_mean": round(rec.observer_ns / rec.steps_seen / 1000, 1) if rec.steps_seen else None,
            "observer_us_max": round(rec.observer_max_ns / 1000, 1),
            "last_observer_error": self.last_observer_error,
            "recording": rec.recording.name if rec.recording else None,
            "recordings": rec.recordings_status(),
            "evicted_active_requests": rec.evicted_active,
            "subscribers": self.hub.subscribers, "hub_pending_overflow": self.hub.pending_overflow,
            "hub": self.hub.status(),
            # the header's figure (figures.recent), so the status and the page never disagree
            "busy_pct_1s": self._live_stats()["busy_pct_1s"],
            "totals": self.totals.snapshot(),
        }

    def _config(self) -> dict:
        cfg = getattr(self.engine, "config", None)
        if cfg is None:
            return {}
        return dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(vars(cfg))

    def _meta(self, recording: dict | None, origin_us: float) -> dict:
        info = self.info
        return {"model": info.get("model"), "device": self.device, "gpu": info.get("gpu_name"),
                "dtype": info.get("dtype"), "config": self._config(), "created": created_now(),
                "info": info, "status": self.status(), "recording": recording,
                "origin": {"clock": "perf_counter", "session_offset_us": origin_us,
                           "unix_s": (self.unix_origin_ns + origin_us * 1000) / 1e9}}

    # ---- live viewers ----------------------------------------------------------------------------------------
    def hello(self) -> dict:
        """The first websocket message: who we are, the last few seconds so a new viewer can draw at once (the page
        then asks for `history`), and the scoreboard as it stands."""
        status = self.status()
        # model, device, gpu_name and nvml_available: the names /api/status gives the page's status line
        return {"type": "hello", "schema": SCHEMA_ID, "model": self.info.get("model"), "device": self.device,
                "gpu_name": status["gpu_name"], "nvml_available": bool(status["nvml"]), "info": self.info,
                "config": self._config(), "mode": self._mode(), "status": status, "t_us": self.now_us(),
                "recent": self.history(self.recent_s), "board": self.live_board()}

    def history(self, seconds: float) -> dict:
        """The live ring's records of the newest `seconds`: steps, NVML samples, requests (finished in it or still
        running), mode switches and the other ranks' steps, each as the stream sends them."""
        now = self.now_us()
        since = now - seconds * 1e6
        rec = self.recorder
        steps = [r for r in list(rec.steps) if (span_end(r) or now) >= since]
        nvml = [s for s in list(rec.nvml) if s["t_us"] >= since]
        done = [r for r in list(rec.requests) if (r["finish_us"] or now) >= since]
        ranks = [r for r in list(rec.rank_steps) if (r["compute_us"] or [now, now])[1] >= since]
        requests = [request_view(r) for r in done[-2000:] + rec.active_requests()[-500:]]
        switches = [m for m in list(rec.mode_changes) if m["t_us"] >= since]
        return {"t_us": now, "since_us": since, "steps": steps, "nvml": nvml, "mode_changes": switches,
                "requests": requests, "rank_steps": ranks,
                "kept": {"steps": len(rec.steps), "ring_steps": rec.steps.maxlen}}

    def _live_stats(self) -> dict:
        """The body of "stats" messages (on the hub's thread): engine counters plus the last second's rates."""
        now = self.now_us()
        error = None
        try:
            stats = self.engine.stats()
        except Exception as exc:
            stats, error = {}, str(exc)
        fig = recent(list(self.recorder.steps)[-2000:], now, stats.get("running"))
        width = fig["window_us"]
        return dataclasses.asdict(LiveStats(
            t_us=now, mode=stats.get("mode", self._mode()), queue=stats.get("queue"), running=stats.get("running"),
            steps=stats.get("steps"), kv_blocks_used=stats.get("kv_blocks_used"),
            kv_blocks_total=stats.get("kv_blocks_total"), kv_usage=stats.get("kv_usage"),
            steps_per_s=round(fig["window_steps"] / (width / 1e6), 2) if width else None,
            tokens_per_s=fig["tokens_per_s"], busy_pct_1s=fig["busy_pct"],
            window_s=round(width / 1e6, 3) if width else None, subscribers=self.hub.subscribers, error=error))

    def _catch_up(self, since_us: float, after_step: int | None) -> dict:
        """The body of a "catch_up" message for a viewer that skipped frames (catchup.py; off the event loop)."""
        return catch_up(self.recorder, self.now_us(), since_us, after_step)

    def live_board(self) -> dict:
        """The scoreboard over the live ring (figures.board): each mode's newest stretch, warm-up left out."""
        # a copy first: the engine thread appends to the ring while this runs on the hub's
        return board(list(self.recorder.steps), live=True, nvml=list(self.recorder.nvml)[-2000:],
                     cache=self._board_cache)

    def _recent_steps(self, now: float, window_s: float) -> list:
        """The steps whose compute started in the last `window_s` seconds (read from the ring's end)."""
        since = now - window_s * 1e6
        return [r for r in list(self.recorder.steps)[-2000:] if r.get("compute_us") and r["compute_us"][0] >= since]

    def busy_ratio(self, window_s: float = 1.0, now_us: float | None = None) -> float:
        """Event-based busy share of the last `window_s` seconds: the union of the steps' compute spans (CUDA
        events; the host launch spans on CPU) inside [now - window, now] over the window, as Prometheus
        scrapes it (`batchscope_gpu_busy_ratio`). The header's `busy_pct_1s` ends at the newest completed step instead
        (figures.recent), so a step in flight never reads as idle; on a steady load the two agree."""
        now = self.now_us() if now_us is None else now_us
        recent = self._recent_steps(now, window_s + 1.0)     # a span that started before the window may reach in
        return union_length([r["compute_us"] for r in recent], now - window_s * 1e6, now) / (window_s * 1e6)

    # ---- recordings, summaries, export -----------------------------------------------------------------------
    def start_recording(self, name: str) -> dict:
        """Start recording under `name` (a recording already running is stopped first). Returns its caps and
        the older recordings dropped to make room for it."""
        rec, dropped = self.recorder.start_recording(str(name), self.now_us())
        return {"max_bytes": rec.max_bytes, "max_steps": rec.caps["steps"], "dropped_recordings": dropped,
                "recordings": self.recorder.recordings_status()}

    def stop_recording(self) -> dict:
        """Stop the running recording and return its summary ({} when none was running)."""
        rec = self.recorder.stop_recording(self.now_us())
        if rec is None:
            return {}
        _, parts = self.recorder.recording_snapshot(rec.name)
        t0, t1 = _window(parts["steps"], rec.start_us, rec.stop_us)
        rec.summary = {"recording": rec.name, **summarize(parts["steps"], parts["requests"], parts["nvml"],
                                                             self.info, self.bandwidth_gbps, t0, t1,
                                                             rank_steps=parts["rank_steps"])}
        return rec.summary

    def recordings(self) -> list[str]:
        return list(self.recorder.recordings)

    def recording_info(self, name: str) -> dict:
        """What a recording holds and whether it was cut short (KeyError for an unknown name)."""
        rec = self.recorder.recordings.get(name)
        if rec is None:
            raise KeyError(f"no recording named {name!r}")
        return rec.info()

    def wait_finished(self, request_ids, timeout_s: float = 2.0) -> bool:
        """Until the recorder holds the finish of each request (False if `timeout_s` passed first). A client can
        see its last token before the engine thread records the finish (and joins the delivery times to it), so a
        summary taken as the last stream ends could leave the newest requests out."""
        wanted, deadline = {r for r in request_ids if r is not None}, time.monotonic() + timeout_s
        while True:
            wanted -= {req["id"] for req in list(self.recorder.requests)}
            if not wanted or time.monotonic() > deadline:
                return not wanted
            time.sleep(0.01)

    def summary(self, t0_us: float | None = None, t1_us: float | None = None) -> dict:
        """Summary of the live ring over [t0_us, t1_us) (session µs; None: from the first / to the last step)."""
        parts = self.recorder.snapshot()
        return summarize(parts["steps"], parts["requests"], parts["nvml"], self.info, self.bandwidth_gbps,
                         t0_us, t1_us, rank_steps=parts["rank_steps"])

    @staticmethod
    def compare(summary_a: dict, summary_b: dict, labels: tuple[str, str] = ("a", "b")) -> dict:
        return compare(summary_a, summary_b, labels)

    def timeline(self, recording: str | None = None) -> dict:
        """batchscope.timeline/1 of the live ring (times since session start) or of a named recording (times
        since the recording started). Raises KeyError for an unknown recording."""
        if recording is None:
            parts = self.recorder.snapshot()
            t0, t1, rec_meta, origin = None, None, None, 0.0
        else:
            rec, raw = self.recorder.recording_snapshot(recording)
            origin = rec.start_us
            parts = shift_records(raw, -origin)
            t0, t1 = _window(parts["steps"], 0.0, rec.stop_us - origin if rec.stop_us is not None else None)
            rec_meta = {"name": rec.name, "start_us": rec.start_us, "stop_us": rec.stop_us,
                        "dropped": dict(rec.dropped), "truncated": rec.truncated, "full": rec.full,
                        "full_at_us": rec.full_at_us, "bytes_estimate": rec.bytes}
        summary = summarize(parts["steps"], parts["requests"], parts["nvml"], self.info, self.bandwidth_gbps,
                            t0, t1, rank_steps=parts["rank_steps"])
        return build_timeline(self._meta(rec_meta, origin), parts["steps"], parts["requests"], parts["nvml"],
                              parts["mode_changes"], summary, parts["rank_steps"])

    def perfetto(self, recording: str | None = None, max_events: int = 2_000_000) -> dict:
        """The same timeline as a Chrome Trace Event dict (Perfetto / chrome://tracing)."""
        return to_perfetto(self.timeline(recording), max_events=max_events)

    # ---- shutdown --------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Detach from the engine and stop the sampler and the hub. Records stay readable."""
        if self._closed:
            return
        self._closed = True
        try:
            self.engine.remove_observer(self._observer)
        except Exception:
            pass
        self.sampler.close()
        self.hub.close()
        self.collector.close()

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _window(steps: list, start_us: float, stop_us: float | None) -> tuple[float, float | None]:
    """A recording's summary window: from its start to its stop, widened to cover every step it recorded (a
    step built just before the start can be delivered just after it)."""
    first = min((span_start(r) for r in steps if r["cpu"]), default=None)
    last = max((span_end(r) for r in steps if r["cpu"]), default=None)
    t0 = min(start_us, first) if first is not None else start_us
    t1 = stop_us if last is None else (last if stop_us is None else max(stop_us, last))
    return t0, t1
