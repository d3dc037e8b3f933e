"""The frames the live viewers have yet to read: one ring shared by all of them, bounded for all of them together.

Every viewer is offered the same frames in the same order, so a viewer's backlog is always the newest part of
one sequence. The ring keeps that sequence once; a viewer holds a cursor (the number of the next frame it wants)
and nothing else. What the ring holds is what the viewer furthest behind still wants, within two caps for all
viewers together, `max_bytes` of JSON and `max_frames` frames (the newest frame always stays), so 50 viewers cost
one ring, not 50 queues, and a viewer that stalls pins nothing: the ring moves on without it.

A viewer further behind than it may be skips to the newest frames (`window_start`): past what the ring still
holds, past its own `max_queue` newest frames, and past frames more than `max_lag_s` older than the newest.
`Subscription` is that viewer: its cursor, what it lost, and the wake-up of a reader waiting for the next frame.
"""
from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from typing import Protocol


class Frame:
    """One flush: its messages, their JSON (encoded once for every viewer), when it was built (`at`, monotonic
    seconds; `t_us`, the hub's clock) and the newest step it carries."""

    __slots__ = ("messages", "texts", "nbytes", "seq", "at", "t_us", "last_step", "end_bytes")

    def __init__(self, messages: list, t_us: float | None = None, at: float = 0.0, last_step: int | None = None):
        self.messages = messages
        self.texts = [json.dumps(m, separators=(",", ":"), default=str) for m in messages]
        self.nbytes = sum(len(t) for t in self.texts)
        self.seq = -1
        self.at = at
        self.t_us = t_us
        self.last_step = last_step
        self.end_bytes = 0              # bytes appended to the ring up to and including this frame


class FrameRing:
    """Frames in order, numbered from 0. Callers hold `lock` around every method."""

    def __init__(self, max_bytes: int, max_frames: int):
        self.max_bytes = max(1, int(max_bytes))
        self.max_frames = max(1, int(max_frames))
        self.lock = threading.Lock()
        self._frames: deque[Frame] = deque()
        self.bytes = 0                  # JSON bytes held
        self._appended_bytes = 0
        self.next_seq = 0               # the number the next frame gets
        self.evicted = 0                # frames pushed out by the caps before every viewer had read them

    def __len__(self) -> int:
        return len(self._frames)

    def append(self, frame: Frame, wanted_from: int) -> None:
        """Add the newest frame, then drop the oldest while the caps are passed (frames some viewer still wanted,
        from `wanted_from` on, are counted as evicted)."""
        frame.seq = self.next_seq
        self.next_seq += 1
        self._appended_bytes += frame.nbytes
        frame.end_bytes = self._appended_bytes
        self._frames.append(frame)
        self.bytes += frame.nbytes
        frames = self._frames
        while len(frames) > 1 and (self.bytes > self.max_bytes or len(frames) > self.max_frames):
            old = frames.popleft()
            self.bytes -= old.nbytes
            if old.seq >= wanted_from:
                self.evicted += 1

    def trim(self, wanted_from: int) -> None:
        """Forget the frames before `wanted_from`: no viewer will read them."""
        frames = self._frames
        while frames and frames[0].seq < wanted_from:
            self.bytes -= frames.popleft().nbytes

    def get(self, seq: int) -> Frame | None:
        frames = self._frames
        if not frames or seq < frames[0].seq or seq >= self.next_seq:
            return None
        return frames[seq - frames[0].seq]

    def window_start(self, cursor: int, max_queue: int, max_lag_s: float | None) -> int:
        """The first frame a viewer whose next frame is `cursor` may still read (`next_seq` when there is none):
        it skips what the ring no longer holds, all but its newest `max_queue` frames, and frames more than
        `max_lag_s` older than the newest frame."""
        frames = self._frames
        if not frames:
            return max(cursor, self.next_seq)
        head = frames[0].seq
        start = max(cursor, head, self.next_seq - max_queue)
        if max_lag_s is None or start >= self.next_seq:
            return start
        oldest_fresh = frames[-1].at - max_lag_s
        lo, hi = start - head, len(frames) - 1
        if frames[lo].at >= oldest_fresh:
            return start
        while lo < hi:                  # the first frame at most max_lag_s older than the newest
            mid = (lo + hi) // 2
            if frames[mid].at < oldest_fresh:
                lo = mid + 1
            else:
                hi = mid
        return head + lo

    def bytes_from(self, seq: int) -> int:
        """JSON bytes of the frames from `seq` to the newest."""
        first = self.get(seq)
        return 0 if first is None else self._frames[-1].end_bytes - first.end_bytes + first.nbytes


class SubscriptionClosed(Exception):
    """The subscription (or the whole hub) was closed and every frame it was due has been read."""


def _dropped_notice(frames: int, total: int) -> dict:
    return {"type": "dropped", "frames": frames, "total_frames": total}


class Feed(Protocol):
    """What a Subscription reads from (the hub, hub.py): the ring, how far behind a viewer may fall, the catch-up
    for one that skipped, and its removal."""
    _ring: FrameRing
    max_lag_s: float | None
    _catch_up: object

    def _catch_up_message(self, since_us: float, after_step: int | None) -> dict | None: ...

    def _remove(self, sub: Subscription, dropped_frames: int = 0) -> None: ...


class Subscription:
    """One viewer: a cursor in the hub's ring. Create it with `Hub.subscribe` from inside an asyncio task; read
    with `await get()` (message dicts, shared between viewers: do not modify them) or `await get_text()` (the
    same, JSON-encoded)."""

    def __init__(self, hub: Feed, max_queue: int, loop: asyncio.AbstractEventLoop | None, since_us: float):
        self._hub = hub
        self.max_queue = max(1, int(max_queue))
        self._loop = loop
        self._cursor = 0                # the number of the next frame it wants (set by the hub)
        self._end: int | None = None    # once closed: the frames it is still due end here
        self._lock = threading.Lock()   # the wake-up handshake with the flusher
        self._ready = asyncio.Event()
        self._waiting = False
        self.closed = False
        self._skipped = 0               # frames it skipped, told or about to be
        self._unreported = 0
        self._seen_us = since_us        # the hub's clock at the last frame it read (or when it subscribed)
        self._seen_step: int | None = None  # the newest step it has read

    # ---- under the ring's lock -------------------------------------------------------------------------------
    def _start(self) -> int:
        return self._hub._ring.window_start(self._cursor, self.max_queue, self._hub.max_lag_s)

    def _pending_skip(self) -> int:
        return 0 if self.closed else self._start() - self._cursor

    # ---- the flusher thread ----------------------------------------------------------------------------------
    def _notify(self) -> None:
        with self._lock:
            wake, self._waiting = self._waiting, False
        if wake:
            self._wake()

    def _wake(self) -> None:
        if self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:        # the viewer's event loop is gone
            self.close()

    # ---- the viewer --------------------------------------------------------------------------------------------
    def _take(self) -> tuple | None:
        """Skip what this viewer may no longer read, then take its next frame: (frame, frames lost just now,
        frames lost in all, (hub clock, step) of what it had read before), or None."""
        ring = self._hub._ring
        with ring.lock:
            start = self._start()
            if start > self._cursor:
                self._skipped += start - self._cursor
                self._unreported += start - self._cursor
                self._cursor = start
            if self._cursor >= (ring.next_seq if self._end is None else self._end):
                return None
            frame = ring.get(self._cursor)
            if frame is None:
                return None
            self._cursor += 1
            lost, self._unreported = self._unreported, 0
            before = (self._seen_us, self._seen_step)
            self._seen_us = frame.t_us
            if frame.last_step is not None:
                self._seen_step = frame.last_step
            return frame, lost, self._skipped, before

    def _batch(self, taken: tuple, text: bool, catch_up: dict | None) -> list:
        frame, lost, total, _ = taken
        out = list(frame.texts if text else frame.messages)
        if lost:
            head = [_dropped_notice(lost, total)] + ([catch_up] if catch_up is not None else [])
            out[:0] = [json.dumps(m, separators=(",", ":"), default=str) for m in head] if text else head
        return out

    def get_nowait(self, text: bool = False) -> list | None:
        """The next frame's messages, or None when nothing is due."""
        taken = self._take()
        if taken is None:
            if self.closed:
                raise SubscriptionClosed("subscription closed")
            return None
        return self._batch(taken, text, self._hub._catch_up_message(*taken[3]) if taken[1] else None)

    async def get(self, text: bool = False) -> list:
        """Wait for the next frame and return its messages (after a skip: a dropped-frames notice first, then the
        catch-up, built off the event loop)."""
        while True:
            taken = self._take()
            if taken is not None:
                catch_up = None
                if taken[1] and self._hub._catch_up is not None:
                    catch_up = await asyncio.to_thread(self._hub._catch_up_message, *taken[3])
                return self._batch(taken, text, catch_up)
            with self._lock:
                if self.closed:
                    raise SubscriptionClosed("subscription closed")
                if self._hub._ring.next_seq > self._cursor:
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
        """Frames it may still read."""
        ring = self._hub._ring
        with ring.lock:
            return max(0, (ring.next_seq if self._end is None else self._end) - self._start())

    def queued_bytes(self) -> int:
        """JSON bytes of those frames (shared with every other viewer that has yet to read them)."""
        ring = self._hub._ring
        with ring.lock:
            return ring.bytes_from(self._start()) if self._end is None else 0

    @property
    def dropped_frames(self) -> int:
        """Frames it lost: those it skipped and those it will skip at its next read."""
        with self._hub._ring.lock:
            return self._skipped + self._pending_skip()

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            ring = self._hub._ring
            with ring.lock:
                self._skipped += self._pending_skip()
                self._end = ring.next_seq
                self.closed = True
        self._hub._remove(self, self._skipped)
        self._wake()
