"""One request's state inside the engine, and what callers get back from it."""
from __future__ import annotations

import asyncio
import collections
import functools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .config import SamplingParams

FINISH_REASONS = ("eos", "length", "stop", "cancelled", "error")


@dataclass
class RequestOutput:
    id: str
    prompt_token_ids: list[int]
    token_ids: list[int]            # generated tokens only, prompt excluded
    finish_reason: str | None       # one of FINISH_REASONS once finished
    error: str | None = None
    arrival_ns: int = 0
    first_token_ns: int | None = None
    finish_ns: int | None = None
    text_cut: int | None = None     # where a stop string cut the text
    # aligned with token_ids, None unless the request asked (SamplingParams.logprobs): each token's logprob, and
    # the k most likely tokens at its position as (token id, logprob), most likely first (empty lists for k = 0)
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    detokenize: Callable[[list[int], int | None], str] | None = field(default=None, repr=False, compare=False)

    @functools.cached_property
    def text(self) -> str:
        """Decoded on first use, on the reader's thread: a finishing request costs the engine's loop no
        detokenization (256 requests of 512 tokens finishing over a few steps cost the loop ~5 ms a step)."""
        return self.detokenize(self.token_ids, self.text_cut) if self.detokenize is not None else ""


@dataclass
class TokenDelta:
    """One streamed item: the tokens that became known at a step, and the text they complete."""
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list[float] | None = None                       # aligned with token_ids, as in RequestOutput
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass(eq=False)  # identity equality: list membership and removal must not compare token lists
class Request:
    id: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int                       # the sampling seed actually used (params.seed or one drawn at submit)
    arrival_ns: int = field(default_factory=time.perf_counter_ns)
    output_ids: list[int] = field(default_factory=list)
    # scheduling state: tokens whose KV is written or in flight, and sampled tokens not yet seen by the host
    num_computed: int = 0
    pending: int = 0
    blocks: list[int] = field(default_factory=list)
    penalty_row: int = -1           # its row of the device's token counts while it runs (penalties.py), else -1
    finish_reason: str | None = None
    error: str | None = None
    first_token_ns: int | None = None
    finish_ns: int | None = None
    text_cut: int | None = None     # where a stop string cut the output text
    stop_scan: IncrementalDetokenizer | None = None   # the output's text so far, kept for stop strings only
    output_logprobs: list[float] | None = None        # aligned with output_ids when params.logprobs is set
    output_top_logprobs: list[list[tuple[int, float]]] | None = None
    # whether the steps it is in run penalties and logprobs (batch.py's extras steps): read at every fill
    wants_extras: bool = field(init=False, default=False)

    def __post_init__(self):
        if self.params.logprobs is not None and self.output_logprobs is None:
            self.output_logprobs, self.output_top_logprobs = [], []
        self.wants_extras = self.params.has_penalties or self.params.logprobs is not None

    @property
    def known_len(self) -> int:
        """Tokens the host knows: prompt plus confirmed outputs."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def total_len(self) -> int:
        """Tokens that exist or are being sampled right now (known plus in flight)."""
        return self.known_len + self.pending

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def token_at(self, pos: int) -> int:
        p = len(self.prompt_ids)
        return self.prompt_ids[pos] if pos < p else self.output_ids[pos - p]

    def output(self, detokenize=None) -> RequestOutput:
        logprobs = None if self.output_logprobs is None else list(self.output_logprobs)
        top = None if self.output_top_logprobs is None else list(self.output_top_logprobs)
        return RequestOutput(self.id, list(self.prompt_ids), list(self.output_ids), self.finish_reason, self.error,
                             self.arrival_ns, self.first_token_ns, self.finish_ns, self.text_cut, logprobs, top,
                             detokenize)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without re-decoding everything each time, and without
    emitting half a multi-byte character (it waits while the tail decodes to the replacement character)."""

    def __init__(self, decode):
        self.decode = decode
        self.ids: list[int] = []
        self.prefix = 0     # tokens whose text is already emitted as context for the next decode
        self.read = 0
        self.emitted = ""

    def push(self, ids: list[int]) -> str:
        if self.decode is None:
            return ""
        self.ids.extend(ids)
        before = self.decode(self.ids[self.prefix:self.read])
        after = self.decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            self.emitted += after[len(before):]
            return after[len(before):]
        return ""


def _joined(a: TokenDelta, b: TokenDelta) -> TokenDelta:
    """Two consecutive deltas of one request as one (text is decoded later, from the joined tokens)."""
    return TokenDelta(a.token_ids + b.token_ids, "", b.finished, b.finish_reason, b.error,
                      None if a.logprobs is None else a.logprobs + (b.logprobs or []),
                      None if a.top_logprobs is None else a.top_logprobs + (b.top_logprobs or []))


def _put_all(items: list) -> None:
    """On the readers' event loop: a step's deltas into their readers' queues, in the order they were made."""
    for q, delta in items:
        q.put_nowait(delta)


class StepDeliveries:
    """A step's deltas for readers on event loops, handed to each loop in ONE `call_soon_threadsafe` when the step
    is done (`flush`): the loop wakes once a step instead of once a token a request, and the engine thread pays one
    self-pipe write a step and loop instead of one a token (issue #41: at 30 tokens a step those writes were 15% of
    the engine thread's samples on a 2-core CPU server). Readers on threads are not batched (their queue is a
    `queue.Queue`, put at once). One per step, on the engine thread only."""

    def __init__(self):
        self._by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        self._targets: dict[asyncio.AbstractEventLoop, list] = {}

    def add(self, handle: RequestHandle, target: tuple, delta: TokenDelta) -> None:
        loop, q = target
        items = self._by_loop.get(loop)
        if items is None:
            items = self._by_loop[loop] = []
            self._targets[loop] = []
        items.append((q, delta))
        self._targets[loop].append((handle, target))

    def flush(self) -> None:
        by_loop, targets = self._by_loop, self._targets
        self._by_loop, self._targets = {}, {}
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:        # that event loop is closed: its readers are gone, not the step
                for handle, target in targets[loop]:
                    handle._unsubscribe(target)


class RequestHandle:
    """Returned by `Engine.submit`: iterate it (threads) or `async for` over `astream()` to get TokenDeltas.
    Text deltas are decoded here, on the consumer's thread, to keep detokenization off the engine's hot path."""

    def __init__(self, request_id: str, engine, streaming: bool = True, detokenize=None):
        self.id = request_id
        self.streaming = streaming
        self._engine = engine
        self._decode = (lambda ids: detokenize(ids)) if detokenize is not None else None
        self._queue: queue.Queue[TokenDelta] = queue.Queue()
        self._done = threading.Event()
        self._output: RequestOutput | None = None
        self._async_targets: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = []
        self._lock = threading.Lock()

    def deliver(self, delta: TokenDelta, output: RequestOutput | None = None,
                batch: StepDeliveries | None = None) -> None:
        """The engine thread hands this request's next delta (and, with the last one, its output) to its reader.
        With `batch`, a reader on an event loop gets it when the batch is flushed, together with the step's other
        deltas for that loop (one wakeup a step, not one a token)."""
        with self._lock:
            if output is not None:
                self._output = output
            if not self._async_targets:
                self._queue.put(delta)          # a reader subscribed through astream gets it there instead
            for target in list(self._async_targets):
                if batch is not None:
                    batch.add(self, target, delta)
                    continue
                loop, q = target
                try:
                    loop.call_soon_threadsafe(q.put_nowait, delta)
                except RuntimeError:            # the reader's event loop is closed: it is gone, not the step
                    self._async_targets.remove(target)
        if delta.finished:
            self._done.set()

    def _unsubscribe(self, target) -> None:
        with self._lock:
            if target in self._async_targets:
                self._async_targets.remove(target)

    def _with_text(self, detok: IncrementalDetokenizer, delta: TokenDelta) -> TokenDelta:
        before = detok.emitted
        text = detok.push(delta.token_ids)
        if delta.finished and self._output is not None and self._output.text.startswith(before):
            # the final text is authoritative (a stop string cuts it): emit exactly what is still missing
            text = self._output.text[len(before):]
        return TokenDelta(delta.token_ids, text, delta.finished, delta.finish_reason, delta.error, delta.logprobs,
                          delta.top_logprobs)

    def __iter__(self):
        detok = IncrementalDetokenizer(self._decode)
        while True:
            delta = self._queue.get()
            yield self._with_text(detok, delta)
            if delta.finished:
                return

    async def astream(self, coalesce: bool = False):
        """Async iterator of TokenDeltas; consumes the same items the thread iterator would. With `coalesce`, the
        deltas already waiting when the reader comes back are handed over as one (their tokens, logprobs and text
        joined, the finish of the last): a reader that fell a step behind catches up in one write, not one a step.
        An error is never joined to the tokens before it (an OpenAI stream ends with the error event alone)."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        with self._lock:
            while not self._queue.empty():       # items that arrived before we subscribed
                q.put_nowait(self._queue.get_nowait())
            self._async_targets.append((loop, q))
        detok = IncrementalDetokenizer(self._decode)
        try:
            held: collections.deque[TokenDelta] = collections.deque()
            while True:
                delta = held.popleft() if held else await q.get()
                if coalesce:
                    while not q.empty():
                        held.append(q.get_nowait())
                    # an error stays a delta of its own
                    while held and not delta.finished and not (held[0].finished and held[0].finish_reason == "error"):
                        delta = _joined(delta, held.popleft())
                yield self._with_text(detok, delta)
                if delta.finished:
                    return
        finally:                                 # a reader that stops early unsubscribes
            with self._lock:
                if (loop, q) in self._async_targets:
                    self._async_targets.remove((loop, q))

    def result(self, timeout: float | None = None) -> RequestOutput:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        assert self._output is not None
        return self._output

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        self._engine.cancel(self.id)
