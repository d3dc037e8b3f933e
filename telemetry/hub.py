"""Fan-out to live viewers: coalesced frames in one shared, bounded ring; a viewer that falls behind skips ahead.

Producers (the engine thread, the sampler thread) only `publish`: one deque append, never a lock held on a
subscriber, never a wait. A flusher thread wakes ~20 times a second, drains what was published, builds one frame
(a short list of messages: "mode", "steps", "rank_steps", "requests", "nvml", every few frames "stats", at most
once a second after new steps "board", the scoreboard), encodes its JSON once and appends it to the ring every
viewer reads from (fanout.py). An idle engine (no step, request or mode record for `idle_s`) makes one frame
a second instead, the sampler's records of that second held back and gathered into it, with the stats: an idle
page wakes twice a second for its feed, not 24 times. The first record of new work goes out at the next flush.

Memory is bounded for all viewers together: the ring holds the frames some viewer has yet to read, at most
`max_queue_bytes` of JSON (and the newest frame), however many viewers there are; a stalled viewer pins nothing.
A viewer that falls behind (more than its `max_queue` frames, frames more than `max_lag_s` older than the newest,
or frames the ring no longer holds) skips to the newest frames instead of reading a stale backlog. Its next `get`
starts with a {"type": "dropped"} notice saying how many frames it lost, then, when the hub has a `catch_up`
source (Telemetry gives one), a {"type": "catch_up"} message: what the lost frames held that the page needs to
stay right (request states, mode changes) and the newest steps. So a stalled viewer costs the engine nothing.
The number of subscribers is capped (`TooManySubscribers`).
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable

from .fanout import Frame, FrameRing, Subscription, SubscriptionClosed

__all__ = ["Hub", "Subscription", "SubscriptionClosed", "TooManySubscribers", "Frame", "request_view"]

MAX_SUBSCRIBERS = 64                    # live viewers at once; each costs a cursor and a send per frame
MAX_QUEUE_FRAMES = 256                  # per viewer: the most frames it may fall behind (MAX_LAG_S cuts first)
MAX_QUEUE_BYTES = 8 << 20               # all viewers together: JSON of the frames some viewer has yet to read
MAX_LAG_S = 2.0                         # a viewer further behind than this skips to the newest frames
IDLE_S = 1.0                            # an engine quiet this long is idle: one frame per IDLE_S, not per flush
BOARD_S = 1.0                           # the scoreboard goes out at most this often, and only after new steps


class TooManySubscribers(RuntimeError):
    """The hub already feeds its maximum number of viewers."""


def _clock_us() -> float:
    return time.perf_counter_ns() / 1000.0


class Hub:
    """`stats()` and `board()` give the bodies of the "stats" and "board" messages; `catch_up(since_us, after_step)`
    the body of a "catch_up" message for a viewer that skipped frames: what changed since `since_us` (on `clock`,
    the hub's clock in µs, which stamps frames) and the steps after `after_step` (None: it has read none)."""

    def __init__(self, stats: Callable[[], dict] | None = None, hz: float = 20.0, max_pending: int = 20_000,
                 stats_every: int = 5, start: bool = True, max_subscribers: int = MAX_SUBSCRIBERS,
                 max_queue_bytes: int = MAX_QUEUE_BYTES, idle_s: float = IDLE_S,
                 board: Callable[[], dict] | None = None, board_s: float = BOARD_S,
                 catch_up: Callable[[float, int | None], dict] | None = None,
                 clock: Callable[[], float] | None = None, max_lag_s: float | None = MAX_LAG_S):
        self.period = 1.0 / hz
        self.idle_s = max(float(idle_s), self.period)
        self._active_until = -float("inf")  # monotonic time until which frames go out at every flush
        self._last_frame = -float("inf")    # when the last frame went out
        self._held: list = []               # an idle engine's sampler records, kept for the next idle frame
        self.max_subscribers = max_subscribers
        self.max_queue_bytes = max_queue_bytes
        self.max_lag_s = max_lag_s
        self._ring = FrameRing(max_queue_bytes, MAX_QUEUE_FRAMES)
        self._catch_up = catch_up
        self._clock = clock or _clock_us
        self.catch_ups = 0              # catch-up messages built for viewers that skipped frames
        self.refused_subscribers = 0
        self.dropped_frames_closed = 0  # frames lost by viewers that have left
        self._stats = stats
        self.stats_every = max(1, stats_every)
        self._board = board
        self.board_s = board_s
        self._board_due = -float("inf")     # monotonic time of the next "board" message
        self._board_dirty = True            # steps or a switch arrived since the last one
        self._pending: deque = deque(maxlen=max_pending)
        self.pending_overflow = 0
        self._subs: list[Subscription] = []
        self._subs_lock = threading.Lock()
        self._flushes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._flush_lock = threading.Lock()
        if start:
            self.start()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="batchscope-hub", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.flush()
            except Exception:          # a bad record must not kill the viewers' feed
                pass

    # ---- any thread, cheap ---------------------------------------------------------------------------------
    def publish(self, kind: str, obj) -> None:
        """kind: "step" | "rank_step" | "request" | "nvml" | "mode". O(1); the oldest item goes when the flusher
        falls behind."""
        if len(self._pending) == self._pending.maxlen:
            self.pending_overflow += 1
        self._pending.append((kind, obj))

    def subscribe(self, max_queue: int = MAX_QUEUE_FRAMES) -> Subscription:
        """A new viewer's queue; raises TooManySubscribers when the hub already feeds `max_subscribers`."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None                # polled with get_nowait() from a thread
        sub = Subscription(self, max_queue, loop, self._clock())
        with self._subs_lock:
            if len(self._subs) >= self.max_subscribers:
                self.refused_subscribers += 1
                raise TooManySubscribers(f"{len(self._subs)} viewers already connected (limit "
                                         f"{self.max_subscribers})")
            with self._ring.lock:
                sub._cursor = self._ring.next_seq       # from the next frame on
                self._ring.max_frames = max(self._ring.max_frames, sub.max_queue)
            self._subs.append(sub)
        return sub

    def _remove(self, sub: Subscription, dropped_frames: int = 0) -> None:
        with self._subs_lock:
            if sub in self._subs:
                self._subs.remove(sub)
                self.dropped_frames_closed += dropped_frames
            subs = list(self._subs)
        with self._ring.lock:
            self._ring.trim(self._wanted_from(subs))

    def _wanted_from(self, subs: list[Subscription]) -> int:
        """The oldest frame some viewer may still read (under the ring's lock)."""
        return min((s._start() for s in subs if not s.closed), default=self._ring.next_seq)

    def _catch_up_message(self, since_us: float, after_step: int | None) -> dict | None:
        if self._catch_up is None:
            return None
        self.catch_ups += 1
        try:
            return {"type": "catch_up", **self._catch_up(since_us, after_step)}
        except Exception as exc:
            return {"type": "catch_up", "error": f"{type(exc).__name__}: {exc}"}

    def status(self) -> dict:
        """`queued_frames` and `queued_bytes` count what the ring holds for all viewers together (frames are
        shared); `dropped_frames` what every viewer lost, those gone included."""
        with self._subs_lock:
            subs = list(self._subs)
        ring = self._ring
        with ring.lock:
            dropped = sum(s._skipped + s._pending_skip() for s in subs)
            frames, nbytes, evicted = len(ring), ring.bytes, ring.evicted
        return {"subscribers": len(subs), "max_subscribers": self.max_subscribers,
                "refused_subscribers": self.refused_subscribers, "pending": len(self._pending),
                "pending_overflow": self.pending_overflow,
                "queued_frames": frames, "queued_bytes": nbytes, "max_queue_bytes": self.max_queue_bytes,
                "evicted_frames": evicted, "max_lag_s": self.max_lag_s, "catch_ups": self.catch_ups,
                "dropped_frames": self.dropped_frames_closed + dropped}

    @property
    def subscribers(self) -> int:
        return len(self._subs)

    # ---- flusher thread ------------------------------------------------------------------------------------
    def flush(self) -> Frame | None:
        """Drain what was published into one frame and offer it to every subscriber. While the engine is idle
        (nothing but sampler records for `idle_s`), only one flush per `idle_s` makes a frame; the others keep
        the samples for it and return None."""
        with self._flush_lock:
            stamp = self._clock()           # before the drain: whatever was published earlier is in this frame
            items, self._held = self._held, []
            pending = self._pending
            while pending:
                items.append(pending.popleft())
            self._flushes += 1
            with self._subs_lock:
                subs = list(self._subs)
            if not subs:
                return None
            now = time.monotonic()
            if any(kind != "nvml" for kind, _ in items):        # the engine did something: full rate
                self._active_until = now + self.idle_s
            active = now < self._active_until
            if not active and now - self._last_frame < self.idle_s - self.period / 2:
                self._held = items
                return None
            messages = self._messages(items)
            if self._stats is not None and (not active or self._flushes % self.stats_every == 0):
                try:
                    messages.append({"type": "stats", **self._stats()})
                except Exception as exc:
                    messages.append({"type": "stats", "error": str(exc)})
            self._board_dirty = self._board_dirty or any(kind in ("step", "mode") for kind, _ in items)
            if self._board is not None and self._board_dirty and now >= self._board_due:
                self._board_due, self._board_dirty = now + self.board_s, False
                try:
                    messages.append({"type": "board", **self._board()})
                except Exception as exc:
                    messages.append({"type": "board", "error": f"{type(exc).__name__}: {exc}"})
            if not messages:
                return None
            frame = Frame(messages, t_us=stamp, at=now, last_step=_last_step(items))
            self._last_frame = now
            self._offer(frame, subs)
            return frame

    def _offer(self, frame: Frame, subs: list[Subscription]) -> None:
        ring = self._ring
        with ring.lock:
            ring.append(frame, self._wanted_from(subs))
            ring.trim(self._wanted_from(subs))
        for sub in subs:
            sub._notify()

    @staticmethod
    def _messages(items: list) -> list:
        steps, rank_steps, nvml, modes, requests = [], [], [], [], {}
        for kind, obj in items:
            if kind == "step":
                steps.append(obj)
            elif kind == "rank_step":
                rank_steps.append(obj)
            elif kind == "nvml":
                nvml.append(obj)
            elif kind == "mode":
                modes.append({"type": "mode", **obj})
            elif kind == "request":
                requests[obj["id"]] = obj       # latest state wins
        out = list(modes)
        if steps:
            out.append({"type": "steps", "steps": steps})
        if rank_steps:
            out.append({"type": "rank_steps", "rank_steps": rank_steps})
        if requests:
            out.append({"type": "requests", "requests": [request_view(r) for r in requests.values()]})
        if nvml:
            out.append({"type": "nvml", "samples": nvml})
        return out

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
        with self._subs_lock:
            subs = list(self._subs)
        for sub in subs:
            sub.close()


def _last_step(items: list) -> int | None:
    steps = [obj.get("step") for kind, obj in items if kind == "step" and isinstance(obj, dict)]
    return max((n for n in steps if isinstance(n, int)), default=None)


def request_view(req: dict) -> dict:
    """A request's state for viewers, copied now (the engine thread keeps growing running requests). Token
    times travel once, with the finished request."""
    view = {k: v for k, v in req.items() if k != "token_us"}
    if req.get("finish_us") is not None:
        view["token_us"] = list(req["token_us"])
        view["state"] = "finished"
    else:
        view["state"] = "decoding" if req.get("first_token_us") is not None else "pending"
    return view
