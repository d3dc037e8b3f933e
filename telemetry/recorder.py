"""Turns engine traces into records and keeps them: a bounded live ring plus named recordings.

`on_engine_event` is the engine's observer: it runs on the engine's hot thread, so it only converts numbers,
builds dicts and appends to deques. It reads the trace's CUDA events right there (they are complete and will be
reused two steps later) and keeps no reference to the trace. Everything else (summaries, JSON, fan-out) happens on
other threads, which read the deques through `list(deque)` (a single C call under the GIL, so it never sees a
half-appended record).

Memory stays flat: the ring keeps the last `ring_steps` steps, `ring_requests` finished requests and
`ring_nvml` samples; requests still running are capped too; a recording stops storing (and counts what it
dropped) past its caps, of which one is its estimated JSON size; only the last `max_recordings` recordings are
kept, and the oldest go sooner when all of them together would pass `max_recordings_bytes`.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from batchscope.engine.trace import ModeChange, RankSpans, StepTrace

from .clock import EventClock, place
from .delivery import Deliveries
from .idle import IdleAttributor
from .records import mode_record, rank_step_record, request_record, step_record
from .totals import Totals

MAX_RECORDINGS = 8                      # named recordings kept; starting one more drops the oldest
MAX_RECORDING_STEPS = 200_000           # per recording and kind of record
# A recording stops storing once its export would pass this: half the server's replay limit (64 MiB), so any
# recording can be uploaded back. Parsed records take ~5 bytes of memory per byte of JSON (measured).
MAX_RECORDING_BYTES = 32 << 20
MAX_RECORDINGS_BYTES = 96 << 20         # all kept recordings together, the running one counted at its cap
MAX_DROPPED_NAMES = 32                  # names of dropped recordings remembered for the status

# Compact-JSON bytes of a record, estimated without encoding it (encoding a step costs ~10 µs on the engine
# thread). Calibrated on real GPU timelines with times of 10 digits, so they err on the large side.
STEP_JSON_BYTES = 850                   # plus each request id it lists (twice for those it prefilled)
REQUEST_JSON_BYTES = 220                # plus each token time
TOKEN_JSON_BYTES = 12
NVML_JSON_BYTES = 200
MODE_JSON_BYTES = 80
RANK_STEP_JSON_BYTES = 260


def json_bytes_estimate(kind: str, rec: dict) -> int:
    if kind == "steps":
        ids = rec.get("request_ids") or ()
        prefilled = rec.get("prefill_tokens_by_request") or ()
        return STEP_JSON_BYTES + (len(ids) * (len(ids[-1]) + 3) if ids else 0) + \
            sum(len(rid) + 10 for rid in prefilled)
    if kind == "requests":
        return REQUEST_JSON_BYTES + TOKEN_JSON_BYTES * (len(rec.get("token_us") or ()) + len(rec.get("sent_us") or ()))
    if kind == "rank_steps":
        return RANK_STEP_JSON_BYTES
    return NVML_JSON_BYTES if kind == "nvml" else MODE_JSON_BYTES


class Recording:
    """A named window of records. Its steps/nvml/mode changes are appended live; requests join when they
    finish (those still running at stop are added as they were)."""

    def __init__(self, name: str, start_us: float, max_steps: int, max_requests: int, max_nvml: int,
                 max_bytes: int = MAX_RECORDING_BYTES):
        self.name = name
        self.start_us = start_us
        self.stop_us: float | None = None
        self.steps: list = []
        self.requests: list = []
        self.nvml: list = []
        self.mode_changes: list = []
        self.rank_steps: list = []      # tensor parallel: the other ranks' GPU spans, per step
        self.caps = {"steps": max_steps, "requests": max_requests, "nvml": max_nvml, "mode_changes": max_steps,
                     "rank_steps": 8 * max_steps}
        self.dropped = {"steps": 0, "requests": 0, "nvml": 0, "mode_changes": 0, "rank_steps": 0}
        self.max_bytes = max_bytes
        self.bytes = 0                  # estimated JSON size of what it holds
        self.full = False               # the byte cap was reached: nothing of any kind is kept after
        self.full_at_us: float | None = None    # when (session µs), where the record that hit it says
        self.summary: dict | None = None

    def add(self, kind: str, rec: dict) -> None:
        items = getattr(self, kind)
        if not self.full and len(items) < self.caps[kind]:
            size = json_bytes_estimate(kind, rec)
            if self.bytes + size <= self.max_bytes:
                items.append(rec)
                self.bytes += size
                return
            # one cut for every kind, so that what is kept is a consistent window
            self.full = True
            self.full_at_us = _step_end(rec) if kind == "steps" else rec.get("t_us", rec.get("finish_us"))
        self.dropped[kind] += 1

    @property
    def truncated(self) -> bool:
        return self.full or any(self.dropped.values())

    def info(self) -> dict:
        return {"name": self.name, "state": "recording" if self.stop_us is None else "stopped",
                "start_us": self.start_us, "stop_us": self.stop_us, "bytes": self.bytes, "max_bytes": self.max_bytes,
                "steps": len(self.steps), "requests": len(self.requests), "nvml": len(self.nvml),
                "truncated": self.truncated, "full": self.full, "full_at_us": self.full_at_us,
                "dropped": dict(self.dropped)}


class Recorder:
    def __init__(self, origin_ns: int, ring_steps: int = 20000, ring_requests: int = 4096,
                 ring_nvml: int = 12000, max_active: int = 8192, publish: Callable[[str, object], None] | None = None,
                 max_recording_steps: int = MAX_RECORDING_STEPS, max_recordings: int = MAX_RECORDINGS,
                 max_recording_bytes: int = MAX_RECORDING_BYTES, max_recordings_bytes: int = MAX_RECORDINGS_BYTES,
                 collections: Callable[[], list] | None = None, totals: Totals | None = None):
        """`collections`: returns the garbage collections since its last call, (start_ns, end_ns, generation)
        (telemetry.collector); each step's gap is attributed with those that ran before its trace arrived.
        `totals`: the running totals every record is added to as it is made (totals.py)."""
        self.origin_ns = origin_ns
        self.totals = totals if totals is not None else Totals()
        self.collections = collections
        self.steps: deque = deque(maxlen=ring_steps)
        self.requests: deque = deque(maxlen=ring_requests)     # finished requests
        self.active: OrderedDict = OrderedDict()               # id -> record of requests not finished yet
        self.nvml: deque = deque(maxlen=ring_nvml)
        self.mode_changes: deque = deque(maxlen=1000)
        self.rank_steps: deque = deque(maxlen=8 * ring_steps)   # the other tensor-parallel ranks' spans
        self._step_modes: dict[int, str] = {}                    # recent steps' modes, for those spans
        self.max_active = max_active
        self.publish = publish or (lambda kind, obj: None)
        self.clock = EventClock(origin_ns)
        self.idle = IdleAttributor()
        self.delivery = Deliveries(self._us)    # streamed requests' chunk write times, from the server
        self.steps_seen = 0
        self.last_step: int | None = None
        self.out_of_order = 0
        self.observer_ns = 0            # time spent in our own callback, to report what telemetry costs
        self.observer_max_ns = 0
        self.evicted_active = 0
        self.max_recording_steps = max_recording_steps
        self.max_recordings = max(1, max_recordings)
        self.max_recording_bytes = max_recording_bytes
        self.max_recordings_bytes = max(max_recordings_bytes, max_recording_bytes)
        self.recording: Recording | None = None
        self.recordings: OrderedDict[str, Recording] = OrderedDict()
        self.dropped_recordings = 0
        self.dropped_names: deque = deque(maxlen=MAX_DROPPED_NAMES)
        self._lock = threading.Lock()       # guards only the switch of `recording` against appends to it

    # ---- the engine thread -------------------------------------------------------------------------------
    def _us(self, ns: int) -> float:
        return ((ns - self.origin_ns) // 100) / 10.0

    def on_engine_event(self, event) -> None:
        if isinstance(event, StepTrace):
            self._on_step(event)
        elif isinstance(event, ModeChange):
            self._on_mode(event)
        elif isinstance(event, RankSpans):
            self._on_rank_spans(event)

    def _on_rank_spans(self, event: RankSpans) -> None:
        """Other ranks' spans arrive a step or two after rank 0's trace of the same step: own records."""
        us = self._us
        for rank, step, anchor_ns, spans in event.spans:
            rec = rank_step_record(step, rank, self._step_modes.get(step),
                                   {phase: [us(place(anchor_ns, a)), us(place(anchor_ns, b))]
                                    for phase, (a, b) in spans.items()})
            self.rank_steps.append(rec)
            self.totals.on_rank_busy(rank, rec["compute_us"])
            self._to_recording("rank_steps", rec)
            self.publish("rank_step", rec)

    def _on_mode(self, change: ModeChange) -> None:
        rec = mode_record(self._us(change.t_ns), change.step, change.from_mode, change.to_mode,
                          getattr(change, "reason", None))
        self.mode_changes.append(rec)
        self.totals.on_mode_change()
        self._to_recording("mode_changes", rec)
        self.publish("mode", rec)

    def _on_step(self, tr: StepTrace) -> None:
        entered = time.perf_counter_ns()
        us = self._us
        cpu = {phase: [us(a), us(b)] for phase, (a, b) in tr.host.items()}
        # never more than the span's wall time (a virtual machine's thread clock can run tens of µs ahead)
        cpu_us = {phase: min(round(ns / 1000, 1), round(cpu[phase][1] - cpu[phase][0], 1))
                  for phase, ns in getattr(tr, "host_cpu", {}).items() if phase in cpu}
        if tr.gpu_events:
            gpu, basis = self.clock.resolve(tr)
            compute = gpu.get("compute") if gpu else None
            if compute is None:
                basis = "none"
        else:                    # CPU: the forward runs inside launch, so launch stands in for compute
            gpu, compute = None, cpu.get("launch")
            basis = "host" if compute else "none"

        if self.collections is not None:
            for start, end, _generation in self.collections():
                self.idle.note("gc", [us(start), us(end)])
        empty_until = None
        if tr.arrivals:
            new_ids = {a[0] for a in tr.arrivals}
            if all(rid in new_ids for rid in tr.request_ids):
                empty_until = us(min(a[1] for a in tr.arrivals))    # nothing ran before these arrived
        idle_us, cause, parts = self.idle.attribute(cpu, gpu, compute, empty_until, cpu_us)

        if self.last_step is not None and tr.step <= self.last_step:
            self.out_of_order += 1
        self.last_step = tr.step
        self.steps_seen += 1

        tokens_out = sum(n for _, n in tr.tokens)
        rec = step_record(tr, cpu, gpu, compute, basis, idle_us, cause, parts, tokens_out, cpu_us)
        self._step_modes[tr.step] = tr.mode
        if len(self._step_modes) > 64:
            del self._step_modes[next(iter(self._step_modes))]
        self.steps.append(rec)
        self.totals.on_step(rec)
        self._to_recording("steps", rec)
        self.publish("step", rec)
        self._update_requests(tr, cpu)
        left = time.perf_counter_ns()
        self.idle.note("telemetry", [us(entered), us(left)])
        self.observer_ns += left - entered
        self.observer_max_ns = max(self.observer_max_ns, left - entered)

    def _update_requests(self, tr: StepTrace, cpu: dict) -> None:
        if not (tr.arrivals or tr.tokens or tr.finished or tr.preempted or tr.prefill_tokens):
            return
        done = cpu.get("update") or cpu.get("wait") or max(cpu.values(), key=lambda s: s[1], default=None)
        t = done[1] if done else None
        for rid, arrival_ns, prompt in tr.arrivals:
            if rid not in self.active:
                self._admit(request_record(rid, self._us(arrival_ns), prompt))
        if tr.prefill_tokens and "schedule" in cpu:      # a request's first step is one with prefill
            self._mark_scheduled(tr.request_ids, cpu["schedule"][1])
        totals = self.totals
        itl = totals.itl.observe
        for rid, n in tr.tokens:
            if n <= 0:
                continue
            req = self.active.get(rid) or self._admit(request_record(rid, None, None))
            times = req["token_us"]
            if req["first_token_us"] is None:
                req["first_token_us"] = t
                totals.on_first_token(req)
                self.publish("request", req)
            elif times:
                itl((t - times[-1]) / 1e6)
            if n == 1:
                times.append(t)
            else:
                times.extend([t] * n)
                for _ in range(n - 1):
                    itl(0.0)
            req["output_tokens"] += n
        for rid in tr.preempted:
            req = self.active.get(rid)
            if req is not None:
                req["preemptions"] += 1
        for rid, reason, prompt, output in tr.finished:
            req = self.active.pop(rid, None) or request_record(rid, None, prompt)
            req["finish_us"] = t
            req["finish_reason"] = reason
            if req["prompt_tokens"] is None:
                req["prompt_tokens"] = prompt
            if output != req["output_tokens"]:   # attached mid-request: keep count == token times, note the rest
                req["output_tokens_engine"] = output
            self.delivery.finished(req)
            self.requests.append(req)
            totals.on_finished(req)
            self._to_recording("requests", req)
            self.publish("request", req)

    def _mark_scheduled(self, request_ids: list, t: float) -> None:
        """The first step a request is in was scheduled at `t`: its queue time ends there."""
        active = self.active
        for rid in request_ids:
            req = active.get(rid)
            if req is not None and req["scheduled_us"] is None:
                req["scheduled_us"] = t

    def _admit(self, req: dict) -> dict:
        if len(self.active) >= self.max_active:      # a request the engine never finished: forget the oldest
            self.active.popitem(last=False)
            self.evicted_active += 1
        self.active[req["id"]] = req
        self.publish("request", req)
        return req

    def on_sample(self, sample: dict) -> None:
        """Called on the sampler thread."""
        self.nvml.append(sample)
        self._to_recording("nvml", sample)
        self.publish("nvml", sample)

    def _to_recording(self, kind: str, rec: dict) -> None:
        if self.recording is None:
            return
        with self._lock:
            if self.recording is not None:
                self.recording.add(kind, rec)

    # ---- other threads -----------------------------------------------------------------------------------
    def note_sent(self, request_id: str, times_ns: list[int]) -> None:
        """The server wrote a streamed request's chunks at these perf_counter times (one per token written)."""
        self.delivery.sent(request_id, times_ns)

    def active_requests(self) -> list:
        """Copies of the running requests' records (the engine thread keeps growing the originals)."""
        out = []
        for req in list(self.active.values()):
            copy = dict(req)
            copy["token_us"] = list(req["token_us"])
            out.append(copy)
        return out

    def snapshot(self) -> dict:
        return {"steps": _in_step_order(list(self.steps)), "requests": list(self.requests) + self.active_requests(),
                "nvml": list(self.nvml), "mode_changes": list(self.mode_changes),
                "rank_steps": list(self.rank_steps)}

    def start_recording(self, name: str, now_us: float) -> tuple[Recording, list[str]]:
        """Start a named recording; a recording already running is stopped first. A name used before is
        replaced. Returns it and the names of the older recordings dropped to make room for it: the oldest go
        first, until the count and the byte budget (the new one counted at its cap) both hold."""
        rec = Recording(name, now_us, self.max_recording_steps, self.max_recording_steps, self.max_recording_steps,
                        self.max_recording_bytes)
        with self._lock:
            previous, self.recording = self.recording, rec
        if previous is not None:
            self._finish(previous, now_us)
        self.recordings.pop(name, None)
        dropped = []
        while self.recordings and (len(self.recordings) >= self.max_recordings or
                                   self.stored_bytes() + rec.max_bytes > self.max_recordings_bytes):
            old, _ = self.recordings.popitem(last=False)
            dropped.append(old)
        self.recordings[name] = rec
        self.dropped_recordings += len(dropped)
        self.dropped_names.extend(dropped)
        return rec, dropped

    def stored_bytes(self) -> int:
        return sum(r.bytes for r in list(self.recordings.values()))

    def recordings_status(self) -> dict:
        return {"count": len(self.recordings), "max_count": self.max_recordings, "bytes": self.stored_bytes(),
                "max_bytes": self.max_recordings_bytes, "max_bytes_each": self.max_recording_bytes,
                "policy": "drop-oldest", "dropped": self.dropped_recordings,
                "dropped_names": list(self.dropped_names),
                "truncated": [r.name for r in list(self.recordings.values()) if r.truncated]}

    def stop_recording(self, now_us: float) -> Recording | None:
        with self._lock:
            rec, self.recording = self.recording, None
        if rec is not None:
            self._finish(rec, now_us)
        return rec

    def _finish(self, rec: Recording, now_us: float) -> None:
        rec.stop_us = now_us
        # requests still running at stop go in as they are now (unfinished: finish_us is null)
        known = {r["id"] for r in rec.requests}
        for req in self.active_requests():
            if req["id"] not in known:
                rec.add("requests", req)

    def recording_snapshot(self, name: str) -> tuple[Recording, dict]:
        rec = self.recordings.get(name)
        if rec is None:
            raise KeyError(f"no recording named {name!r}; known: {list(self.recordings)}")
        requests = list(rec.requests)
        if rec.stop_us is None:          # still running: include requests in flight
            known = {r["id"] for r in requests}
            requests += [r for r in self.active_requests() if r["id"] not in known]
        return rec, {"steps": _in_step_order(list(rec.steps)), "requests": requests, "nvml": list(rec.nvml),
                     "mode_changes": list(rec.mode_changes), "rank_steps": list(rec.rank_steps)}


def _step_end(rec: dict) -> float | None:
    ends = [b for _, b in (rec.get("cpu") or {}).values()]
    return max(ends) if ends else None


def _in_step_order(steps: list) -> list:
    """Steps sorted by number. The engine reports a step that failed while being built or launched at once,
    which can be before the step launched ahead of it; exports must still read in step order."""
    if all(a["step"] < b["step"] for a, b in zip(steps, steps[1:])):
        return steps
    return sorted(steps, key=lambda r: r["step"])
