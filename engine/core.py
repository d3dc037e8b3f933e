"""The parts both loops are made of: build a step, launch it, consume it, deliver traces. The loops (loop.py)
only order them: no part asks which loop called it.

Everything here runs on the engine thread, except `submit`, `cancel`, `request_mode` and `request_close`, which
any thread may call: submissions and cancels arrive through a thread-safe inbox drained at the start of each build.
"""
from __future__ import annotations

import queue
import logging
import threading
import time
from dataclasses import dataclass, field

import torch

from .batch import read_record
from .budget import StepShape
from .profiling import Profiling
from .request import Request, RequestHandle, StepDeliveries, TokenDelta
from .runner import Launched, ModelRunner
from .scheduler import Scheduler, StepPlan
from .trace import ModeChange, RankSpans, StepTrace

log = logging.getLogger(__name__)

now = time.perf_counter_ns
cpu_now = time.thread_time_ns       # the engine thread's CPU time: read beside the wall clock at each phase boundary


@dataclass
class Step:
    """One step's life on the host: plan, launched work, and the host spans collected along the way."""
    plan: StepPlan
    mode: str
    launched: Launched | None = None
    host: dict = field(default_factory=dict)
    host_cpu: dict = field(default_factory=dict)    # phase -> the engine thread's CPU ns in it (beside `host`)
    built_during_step: int | None = None     # the step in flight while this one was built (async), else None
    arrivals: list = field(default_factory=list)
    batch: object = None
    failed: bool = False
    kv_blocks_used: int = 0          # right after this step's blocks were allocated: what it ran with


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, eos_ids: tuple[int, ...], detokenize,
                 stop_checker):
        self.scheduler, self.runner = scheduler, runner
        self.eos_ids = frozenset(eos_ids)
        self.detokenize = detokenize            # (token ids, cut) -> text: a finished request's, decoded by its reader
        self.stop_checker = stop_checker        # (request) -> where a stop string starts in its text, or None
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.wakeup = threading.Event()
        self.handles: dict[str, RequestHandle] = {}
        self.requests: dict[str, Request] = {}
        self.observers: list = []
        self.step_counter = 0
        self.requested_mode = "async"
        self.mode_reason: str | None = None     # why the requested mode was asked for, for its ModeChange
        self.closing = False
        self._new_arrivals: list = []
        self._finished: list = []       # (id, reason, prompt, output) since the last trace
        self._held: list = []           # consumed steps whose traces wait for the loop's flush_traces
        self.profiling = Profiling()     # named ranges while a profiler runs, and the engine's own window

    # -- from any thread ----------------------------------------------------------------------------------------
    def submit(self, items: list) -> None:
        """Queue (request, handle) pairs; one call's pairs reach the scheduler together."""
        self.inbox.put(("submit", items))
        self.wakeup.set()

    def cancel(self, request_id: str) -> None:
        self.inbox.put(("cancel", request_id))
        self.wakeup.set()

    def request_mode(self, mode: str, reason: str | None = None) -> None:
        """The running loop returns at its next step boundary (async drains first) and the other one starts."""
        self.mode_reason = reason
        self.requested_mode = mode
        self.wakeup.set()

    def request_close(self) -> None:
        self.closing = True
        self.wakeup.set()

    def add_observer(self, fn) -> None:
        self.observers = self.observers + [fn]      # a new list: notify() may be iterating the old one

    def remove_observer(self, fn) -> None:
        self.observers = [o for o in self.observers if o is not fn]

    # -- control ------------------------------------------------------------------------------------------------
    def keep_running(self, mode: str) -> bool:
        return not self.closing and self.requested_mode == mode

    def idle(self) -> None:
        """Nothing to do: deliver what is held, then sleep until a submission, a cancel, a mode switch or close."""
        self.flush_traces()
        self.runner.went_idle()
        self.wakeup.wait(0.05)
        self.wakeup.clear()

    def notify(self, event) -> None:
        for fn in list(self.observers):
            try:
                fn(event)
            except Exception:               # an observer must never take the engine down
                log.exception("an observer of the engine's steps failed; the engine goes on")

    def mode_changed(self, from_mode: str, to_mode: str) -> None:
        self.flush_traces()
        self.notify(ModeChange(now(), self.step_counter, from_mode, to_mode, self.mode_reason))

    def flush_traces(self) -> None:
        """Build the held traces and hand them to the observers, in step order. The loops call it where the
        observers' time hides behind the device: right after launching the next step (loop.py)."""
        if not self._held:
            return self._flush_peer_spans()
        with self.profiling.range("telemetry"):
            while self._held:
                try:
                    trace = self._build_trace(*self._held.pop(0))
                except Exception:               # telemetry must never stop a launched step from being consumed
                    log.exception("building a step's trace failed; the step is consumed without it")
                    continue
                self.notify(trace)
        self._flush_peer_spans()

    def _flush_peer_spans(self) -> None:
        spans = self.runner.peer_spans()
        if spans and self.observers:
            self.notify(RankSpans(spans))

    def shutdown(self) -> None:
        """After the last loop returned for good: deliver what is held and cancel whatever never ran, so that no
        caller waits forever."""
        self.flush_traces()
        self.profiling.close()
        self._drain_inbox()
        for req in list(self.scheduler.running) + list(self.scheduler.queue):
            self._finish(req, "cancelled")

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, item = self.inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "submit":                # a list: what one `generate` call sends arrives together
                for req, handle in item:
                    self.requests[req.id] = req
                    self.handles[req.id] = handle
                    self.scheduler.add(req)
                    self._new_arrivals.append((req.id, req.arrival_ns, len(req.prompt_ids)))
            elif kind == "cancel":
                req = self.requests.get(item)
                if req is not None and not req.finished:
                    self._finish(req, "cancelled")

    # -- build: schedule + fill ---------------------------------------------------------------------------------
    def build(self, mode: str, in_flight: Step | None = None) -> Step | None:
        marks = self.profiling
        if self.scheduler.running or self.scheduler.queue or not self.inbox.empty():
            marks.before_build()     # an idle engine's polls leave a window pending until there is work
        t0, c0 = now(), cpu_now()
        with marks.range("schedule"):
            self._drain_inbox()
            plan = self.scheduler.schedule(self.step_counter, in_flight.plan if in_flight else None)
        if plan is None:
            return None
        marks.built(plan.step)
        self.step_counter += 1
        step = Step(plan, mode, built_during_step=in_flight.plan.step if in_flight else None,
                    kv_blocks_used=self.scheduler.allocator.num_used)
        step.arrivals, self._new_arrivals = self._new_arrivals, []
        t1, c1 = now(), cpu_now()
        try:
            with marks.range("fill", plan):
                step.batch = self.runner.prepare(plan)
        except Exception as exc:
            self.fail(step, exc)
            return None
        step.host["schedule"] = (t0, t1)
        step.host["fill"] = (t1, now())
        step.host_cpu["schedule"], step.host_cpu["fill"] = c1 - c0, cpu_now() - c1
        return step

    # -- launch -------------------------------------------------------------------------------------------------
    def launch(self, step: Step) -> None:
        t0, c0 = now(), cpu_now()
        try:
            with self.profiling.range("launch", step.plan, step.mode):
                step.launched = self.runner.launch(step.batch)
        except Exception as exc:
            self.fail(step, exc)
        step.host["launch"] = (t0, now())
        step.host_cpu["launch"] = cpu_now() - c0

    # -- consume: wait + update ---------------------------------------------------------------------------------
    def consume(self, step: Step) -> None:
        if step.failed:
            return
        marks = self.profiling
        t0, c0 = now(), cpu_now()
        try:
            with marks.range("wait", step.plan):
                tokens = self.runner.wait(step.launched)
            t1, c1 = now(), cpu_now()
            with marks.range("update", step.plan):
                delivered = self._update(step.plan, tokens, self.runner.logprobs(step.launched))
        except Exception as exc:
            self.fail(step, exc)
            return
        t2, c2 = now(), cpu_now()
        step.host["wait"] = (t0, t1)
        step.host["update"] = (t1, t2)
        step.host_cpu["wait"], step.host_cpu["update"] = c1 - c0, c2 - c1
        self._observe_step_time(step)
        self._trace(step, delivered, None)
        marks.consumed(step.plan.step)

    def _observe_step_time(self, step: Step) -> None:
        """Teach the budget's step-time model what this step cost: its compute events (complete once the wait
        returned, so reading them waits for nothing), or on CPU its launch span (the step ran inside it)."""
        plan = step.plan
        if self.runner.cuda:
            ms = self.runner.compute_ms(step.launched)
        else:
            t0, t1 = step.host["launch"]
            ms = (t1 - t0) / 1e6
        self.scheduler.budget.observe(plan.num_tokens, ms, all(s.is_decode for s in plan.seqs), StepShape.of(plan.seqs))

    def _update(self, plan: StepPlan, tokens: list[int], records):
        """The step's tokens (and, from an extras step, their logprobs records) into their requests."""
        delivered = []
        t = now()
        batch = StepDeliveries()         # the step's deltas reach each event loop in one wakeup
        try:
            self._update_rows(plan, tokens, records, t, delivered, batch)
        finally:
            batch.flush()
        return delivered

    def _update_rows(self, plan: StepPlan, tokens: list[int], records, t, delivered, batch) -> None:
        for row, seq in enumerate(plan.sampled):
            req = seq.req
            req.pending -= 1
            if req.finished:
                continue                 # learned one step late (EOS/stop/cancel): this extra token is dropped
            tok = tokens[row]
            req.output_ids.append(tok)
            if req.output_logprobs is not None:
                chosen, top = read_record(records[row], req.params.logprobs)
                req.output_logprobs.append(chosen)
                req.output_top_logprobs.append(top)
            if req.first_token_ns is None:
                req.first_token_ns = t
            delivered.append((req.id, 1))
            reason = cut = None
            if tok in self.eos_ids and not req.params.ignore_eos:
                reason = "eos"
            elif req.params.stop and (cut := self.stop_checker(req)) is not None:
                reason = "stop"
            elif (len(req.output_ids) >= req.params.max_new_tokens
                  or req.known_len >= self.scheduler.max_model_len):
                reason = "length"
            handle = self.handles.get(req.id)
            if reason is None:
                if handle is not None and handle.streaming:
                    handle.deliver(TokenDelta([tok], "", **_latest_logprobs(req, 1)), batch=batch)
            else:
                self._finish(req, reason, last_token=tok, text_cut=cut, batch=batch)

    def _finish(self, req: Request, reason: str, error: str | None = None, last_token: int | None = None,
                text_cut: int | None = None, batch: StepDeliveries | None = None) -> None:
        req.finish_reason, req.error, req.finish_ns = reason, error, now()
        self._finished.append((req.id, reason, len(req.prompt_ids), len(req.output_ids)))
        self.scheduler.remove(req)
        req.text_cut = text_cut
        handle = self.handles.pop(req.id, None)
        self.requests.pop(req.id, None)
        if handle is not None:
            toks = [last_token] if last_token is not None and handle.streaming else []
            handle.deliver(TokenDelta(toks, "", True, reason, error, **_latest_logprobs(req, len(toks))),
                           req.output(self.detokenize), batch=batch)

    def fail(self, step: Step, exc: BaseException) -> None:
        """A step raised: its requests fail with the reason; everyone else keeps going. A later step that
        carried tokens from this one may hold some of them: their extra tokens are dropped as finished."""
        step.failed = True
        msg = f"{exc.__class__.__name__}: {exc}"
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            msg = (f"out of device memory in a step of {step.plan.num_tokens} tokens for {len(step.plan.seqs)} "
                   f"request(s); a smaller --max-batch-tokens or --max-prompt-tokens avoids it. {msg}")
            self.runner.free_cached_memory()
        log.error("a step failed; its requests end with an error", exc_info=exc)
        for seq in step.plan.seqs:
            req = seq.req
            if seq.sample:
                req.pending = max(0, req.pending - 1)
            if not req.finished:
                self._finish(req, "error", error=msg)
        self._trace(step, [], msg)

    def _trace(self, step: Step, delivered, error) -> None:
        """Hold the step's trace until the loop calls flush_traces. Its events stay valid until the step after
        next reuses the slot, which both loops build only after flushing. A failed step is reported at once."""
        finished, self._finished = self._finished, []
        if not self.observers:
            return
        self._held.append((step, delivered, finished, error))
        if error is not None:
            self.flush_traces()

    def _build_trace(self, step: Step, delivered, finished, error) -> StepTrace:
        plan, la, batch = step.plan, step.launched, step.batch
        decode = sum(1 for s in plan.seqs if s.is_decode)
        return StepTrace(
            step=plan.step, mode=step.mode, slot=plan.step % 2, request_ids=[s.req.id for s in plan.seqs],
            prefill_tokens=plan.num_tokens - decode, decode_tokens=decode, sampled=len(plan.sampled),
            carried=batch.num_carried if batch is not None else 0,
            kv_blocks_used=step.kv_blocks_used, kv_blocks_total=self.scheduler.allocator.num_blocks,
            queue_depth=plan.queue_depth, running=plan.running, host=step.host, host_cpu=step.host_cpu,
            gpu_events=la.events.spans() if la is not None and la.events is not None else None,
            compute_head=la.events.head() if la is not None and la.events is not None else None,
            start_kernel_ns=self.runner.start_kernel_ns,
            anchor=la.anchor if la is not None else None, epoch=la.epoch if la is not None else None,
            built_during_step=step.built_during_step,
            arrivals=step.arrivals, tokens=delivered, finished=finished, preempted=plan.preempted,
            prefill_tokens_by_request={seq.req.id: seq.num_tokens for seq in plan.seqs
                                       if not seq.is_decode}, error=error,
            budget=plan.budget.as_dict() if plan.budget is not None else None)


def _latest_logprobs(req: Request, n: int) -> dict:
    """A streamed delta's logprobs fields for the request's latest `n` tokens (none when it did not ask)."""
    if req.output_logprobs is None:
        return {}
    latest = len(req.output_logprobs) - n
    return {"logprobs": req.output_logprobs[latest:], "top_logprobs": req.output_top_logprobs[latest:]}
