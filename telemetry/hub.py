"""Fan-out to live viewers: coalesced frames, bounded per-subscriber queues, drops instead of back-pressure.

Producers (the engine thread, the sampler thread) only `publish`: one deque append, never a lock held on a
subscriber, never a wait. A flusher thread wakes ~20 times a second, drains what was published, builds one frame
(a short list of messages: "mode", "steps", "rank_steps", "requests", "nvml", every few frames "stats", at most
once a second after new steps "board", the scoreboard), encodes its JSON once and offers it to every subscriber. An idle engine (no step, request or mode record for `idle_s`) makes one frame
a second instead, the sampler's records of that second held back and gathered into it, with the stats: an idle
page wakes twice a second for its feed, not 24 times. The first record of new work goes out at the next flush.
A subscriber whose queue is full loses its oldest frame; its next `get` starts with a {"type": "dropped"} notice
saying how many frames it lost. So a stalled viewer costs the engine nothing.
Each queue is bounded in frames and in bytes, and the number of subscribers is capped (`TooManySubscribers`).
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Callable


MAX_SUBSCRIBERS = 64                    # live viewers at once; each costs a queue and a send per frame
MAX_QUEUE_FRAMES = 256                  # per viewer: ~13 s of frames at 20 frames/s
MAX_QUEUE_BYTES = 8 << 20               # per viewer: frames are shared, but a stalled viewer pins what it holds
IDLE_S = 1.0                            # an engine quiet this long is idle: one frame per IDLE_S, not per flush
BOARD_S = 1.0                           # the scoreboard goes out at most this often, and only after new steps


class SubscriptionClosed(Exception):
    """The subscription (or the whole hub) was closed and every queued frame has been read."""


class TooManySubscribers(RuntimeError):
    """The hub already feeds its maximum number of viewers."""


class Frame:
    __slots__ = ("messages", "texts", "nbytes")

    def __init__(self, messages: list):
        self.messages = messages
        self.texts = [json.dumps(m, separators=(",", ":"), default=str) for m in messages]
        self.nbytes = sum(len(t) for t in self.texts)


def _dropped_notice(frames: int, total: int) -> dict:
    return {"type": "dropped", "frames": frames, "total_frames": total}


class Subscription:
    """One viewer's queue. Create it with `Hub.subscribe` from inside an asyncio task; read with `await get()`
    (message dicts, shared between viewers: do not modify them) or `await get_text()` (the same, JSON-encoded)."""

    def __init__(self, hub: Hub, max_queue: int, loop: asyncio.AbstractEventLoop | None,
                 max_bytes: int = MAX_QUEUE_BYTES):
        self._hub = hub
        self.max_queue = max(1, int(max_queue))
        self.max_bytes = max(1, int(max_bytes))
        self._loop = loop
        self._frames: deque[Frame] = deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self._ready = asyncio.Event()
        self._waiting = False
        self.closed = False
        self.dropped_frames = 0
        self._unreported = 0

    # flusher thread
    def _offer(self, frame: Frame) -> None:
        with self._lock:
            if self.closed:
                return
            # the newest frame always stays, even one over the byte cap on its own
            while self._frames and (len(self._frames) >= self.max_queue or
                                    self._bytes + frame.nbytes > self.max_bytes):
                self._bytes -= self._frames.popleft().nbytes
                self.dropped_frames += 1
                self._unreported += 1
            self._frames.append(frame)
            self._bytes += frame.nbytes
            wake = self._waiting
            self._waiting = False
        if wake:
            self._wake()

    def _wake(self) -> None:
        if self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:        # the viewer's event loop is gone
            self.close()

    def _take(self, text: bool) -> list | None:
        with self._lock:
            if not self._frames:
                return None
            frame = self._frames.popleft()
            self._bytes -= frame.nbytes
            lost, self._unreported = self._unreported, 0
        out = list(frame.texts if text else frame.messages)
        if lost:
            notice = _dropped_notice(lost, self.dropped_frames)
            out.insert(0, json.dumps(notice) if text else notice)
        return out

    def get_nowait(self, text: bool = False) -> list | None:
        """The next frame's messages, or None when nothing is queued."""
        out = self._take(text)
        if out is None and self.closed:
            raise SubscriptionClosed("subscription closed")
        return out

    async def get(self, text: bool = False) -> list:
        """Wait for the next frame and return its messages (a dropped-frames notice first, if frames were lost)."""
        while True:
            out = self._take(text)
            if out is not None:
                return out
            with self._lock:
                if self.closed:
                    raise SubscriptionClosed("subscription closed")
                if self._frames:
                    continue
                self._ready.clear()
                self._waiting = True
            await self._ready.wait()

    async def get_text(self) -> list[str]:
        return await self.get(text=True)

    def __aiter__(self):
        return self

    async def __anext__(self) -> list:
        try:
            return await self.get()
        except SubscriptionClosed:
            raise StopAsyncIteration

    def queued(self) -> int:
        return len(self._frames)

    def queued_bytes(self) -> int:
        return self._bytes

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self._hub._remove(self, self.dropped_frames)
        self._wake()


class Hub:
    def __init__(self, stats: Callable[[], dict] | None = None, hz: float = 20.0, max_pending: int = 20_000,
                 stats_every: int = 5, start: bool = True, max_subscribers: int = MAX_SUBSCRIBERS,
                 max_queue_bytes: int = MAX_QUEUE_BYTES, idle_s: float = IDLE_S,
                 board: Callable[[], dict] | None = None, board_s: float = BOARD_S):
        self.period = 1.0 / hz
        self.idle_s = max(float(idle_s), self.period)
        self._active_until = -float("inf")  # monotonic time until which frames go out at every flush
        self._last_frame = -float("inf")    # when the last frame went out
        self._held: list = []               # an idle engine's sampler records, kept for the next idle frame
        self.max_subscribers = max_subscribers
        self.max_queue_bytes = max_queue_bytes
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
        """kind: "step" | "rank_step" | "request" | "nvml" | "mode". O(1); the oldest item goes when the flusher falls behind."""
        if len(self._pending) == self._pending.maxlen:
            self.pending_overflow += 1
        self._pending.append((kind, obj))

    def subscribe(self, max_queue: int = MAX_QUEUE_FRAMES) -> Subscription:
        """A new viewer's queue; raises TooManySubscribers when the hub already feeds `max_subscribers`."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None                # polled with get_nowait() from a thread
        sub = Subscription(self, max_queue, loop, self.max_queue_bytes)
        with self._subs_lock:
            if len(self._subs) >= self.max_subscribers:
                self.refused_subscribers += 1
                raise TooManySubscribers(f"{len(self._subs)} viewers already connected (limit "
                                         f"{self.max_subscribers})")
            self._subs.append(sub)
        return sub

    def _remove(self, sub: Subscription, dropped_frames: int = 0) -> None:
        with self._subs_lock:
            if sub in self._subs:
                self._subs.remove(sub)
                self.dropped_frames_closed += dropped_frames

    def status(self) -> dict:
        with self._subs_lock:
            subs = list(self._subs)
        return {"subscribers": len(subs), "max_subscribers": self.max_subscribers,
                "refused_subscribers": self.refused_subscribers, "pending": len(self._pending),
                "pending_overflow": self.pending_overflow,
                "queued_frames": sum(s.queued() for s in subs), "queued_bytes": sum(s.queued_bytes() for s in subs),
                "max_queue_bytes": self.max_queue_bytes,
                "dropped_frames": self.dropped_frames_closed + sum(s.dropped_frames for s in subs)}

    @property
    def subscribers(self) -> int:
        return len(self._subs)

    # ---- flusher thread ------------------------------------------------------------------------------------
    def flush(self) -> Frame | None:
        """Drain what was published into one frame and offer it to every subscriber. While the engine is idle
        (nothing but sampler records for `idle_s`), only one flush per `idle_s` makes a frame; the others keep
        the samples for it and return None."""
        with self._flush_lock:
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
            frame = Frame(messages)
            self._last_frame = now
            for sub in subs:
                sub._offer(frame)
            return frame

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
