"""The recorded load replayed through the engine's own scheduler (engine/scheduler.py, its KV block allocator
and its budget policy: the real code) on a virtual clock, each step's phases timed by the step-time model and
ordered as engine/loop.py orders them:

  sync:   schedule N, fill N, launch N, (traces), wait for N, update N, ...        the device idles meanwhile
  async:  schedule N+1, fill N+1, launch N+1, wait for N, update N, (traces), ...  the host works while N computes

On a GPU the device runs a step from max(its previous step's end, the launch's start + lead); on a CPU the step
computes inside its launch, so nothing overlaps in either loop. A token is known at its step's update end (what
the recorder stamps), a request finishes at the update that gives its last token. The output is step and request
records in the timeline's own shape, so recorded and predicted figures come from one function (measures.py).
"""
from __future__ import annotations

import bisect
import random
from collections import deque
from dataclasses import dataclass, field

from batchscope.engine.budget import make_budget
from batchscope.engine.config import EngineConfig, SamplingParams
from batchscope.engine.kv_cache import BlockAllocator
from batchscope.engine.request import Request
from batchscope.engine.scheduler import Scheduler, StepPlan

from .model import Graphs, StepModel, shape_row
from .recording import LoadItem

MAX_STEPS = 2_000_000           # a replay that would run longer than this is stuck (it says so)


@dataclass
class SimStep:
    plan: StepPlan
    dev: tuple[float, float] = (0.0, 0.0)       # device compute span (µs)
    host: dict = field(default_factory=dict)    # phase -> (start, end)
    kv_blocks: int = 0
    shape: dict = field(default_factory=dict)
    extrapolated: list[str] = field(default_factory=list)


@dataclass
class SimResult:
    steps: list[dict]
    requests: list[dict]
    extrapolated_steps: int
    extrapolated_why: dict[str, int]
    unfinished: int


class VirtualEngine:
    def __init__(self, model: StepModel, config: EngineConfig, mode: str, load: list[LoadItem], rate: float,
                 max_model_len: int, rng: random.Random | None):
        self.model, self.config, self.mode, self.rng = model, config, mode, rng
        device_type = "cuda" if model.basis == "gpu" else "cpu"
        budget = make_budget(config, device_type)
        self.graphs = Graphs.of(config, model.cuda_graphs)
        if self.graphs.mixed:                   # as engine.py: steps with decodes stay within the mixed graphs
            budget.limit_decode_steps(list(self.graphs.mixed))
        self.allocator = BlockAllocator(config.num_blocks)
        self.scheduler = Scheduler(self.allocator, config.block_size, budget, config.max_running, max_model_len)
        t0 = min(i.arrival_us for i in load)
        self.pending = deque(sorted(((t0 + (i.arrival_us - t0) / rate, i) for i in load),   # rate scales the gaps
                                    key=lambda p: p[0]))
        self.records: dict[str, dict] = {}
        self.t = self.pending[0][0]
        self.device_free = self.t
        self.steps: list[SimStep] = []
        self.idle_spans: list[tuple[float, float]] = []    # when the engine had no request at all

    # -- the two loops, as loop.py orders them ----------------------------------------------------------------
    def run(self) -> SimResult:
        if self.mode == "sync":
            self._run_sync()
        else:
            self._run_async()
        return self._result()

    def _run_sync(self) -> None:
        while self._more():
            step = self._build(None)
            if step is None:
                self._idle()
                continue
            self._launch(step)
            self._gap("launch_wait")
            self._consume(step)
            self._gap("update_schedule")

    def _run_async(self) -> None:
        in_flight = None
        while self._more() or in_flight is not None:
            step = self._build(in_flight)
            if step is not None:
                self._launch(step)
                self._gap("launch_wait")
            if in_flight is not None:
                self._consume(in_flight)
                self._gap("update_schedule")
            elif step is None:
                self._idle()
            in_flight = step

    # -- the parts -------------------------------------------------------------------------------------------
    def _more(self) -> bool:
        if len(self.steps) > MAX_STEPS:
            return False
        return bool(self.pending or self.scheduler.running or self.scheduler.queue)

    def _idle(self) -> None:
        """Nothing to schedule: sleep until the next arrival (an engine woken by a submit)."""
        if self.pending and self.pending[0][0] > self.t:
            if not self.scheduler.running and not self.scheduler.queue:
                self.idle_spans.append((self.t, self.pending[0][0]))
            self.t = self.pending[0][0]
        elif not self.pending:                  # nothing will arrive and nothing could be scheduled: what is
            self.scheduler.queue.clear()        # left can never run (counted as unfinished), never a loop
            self.scheduler.running.clear()

    def _arrivals(self) -> None:
        while self.pending and self.pending[0][0] <= self.t:
            t, item = self.pending.popleft()
            params = SamplingParams(max_new_tokens=item.output_tokens, ignore_eos=True)
            req = Request(item.id, [0] * item.prompt_tokens, params, 0, arrival_ns=int(t * 1000))
            self.scheduler.add(req)
            self.records[item.id] = {"id": item.id, "arrival_us": t, "first_token_us": None, "finish_us": None,
                                     "prompt_tokens": item.prompt_tokens, "output_tokens": 0, "token_us": [],
                                     "preemptions": 0, "finish_reason": None}

    def _shape(self, plan: StepPlan) -> dict:
        decode = sum(1 for s in plan.seqs if s.is_decode)
        return shape_row(self.graphs, self.model.basis, plan.num_tokens - decode, decode, len(plan.seqs),
                         len(plan.sampled), sum(1 for s in plan.seqs if s.start == 0),
                         self.allocator.num_used * self.config.block_size,
                         [(s.start, s.num_tokens) for s in plan.seqs if not s.is_decode])

    def _phase(self, name: str, shape: dict) -> float:
        f = self.model.host[self.mode].get(name)
        return f.draw(shape, self.rng) if f is not None else 0.0

    def _build(self, in_flight: SimStep | None) -> SimStep | None:
        t0 = self.t
        self._arrivals()
        plan = self.scheduler.schedule(len(self.steps), in_flight.plan if in_flight else None)
        if plan is None:
            return None
        step = SimStep(plan, kv_blocks=self.allocator.num_used)
        for rid in plan.preempted:
            self.records[rid]["preemptions"] += 1
        shape = self._shape(plan)
        step.extrapolated = self.model.device.outside(shape)
        if shape["eager"] and self.model.device.seen_max.get("eager", 1.0) == 0:
            step.extrapolated.append("eager")
        step.shape = shape
        self.t += self._phase("schedule", shape)
        step.host["schedule"] = (t0, self.t)
        t1 = self.t
        self.t += self._phase("fill", shape)
        step.host["fill"] = (t1, self.t)
        self.steps.append(step)
        return step

    def _launch(self, step: SimStep) -> None:
        t0, shape = self.t, step.shape
        compute = self.model.device.draw(shape, self.rng)
        if self.model.basis == "gpu":
            self.t += self._phase("launch", shape)
            start = max(self.device_free, t0 + self.model.lead_us[bool(shape["eager"])])
        else:                                   # the step computes inside its launch, on this thread
            start = t0
            self.t += compute
        step.dev = (start, start + compute)
        self.device_free = step.dev[1]
        step.host["launch"] = (t0, self.t)

    def _gap(self, name: str) -> None:
        gaps = self.model.gaps[self.mode][name]
        self.t += self.rng.choice(gaps) if self.rng is not None else sum(gaps) / len(gaps)

    def _consume(self, step: SimStep) -> None:
        t0 = self.t
        if self.model.basis == "gpu":
            self.t = max(self.t + self.model.wait_us, step.dev[1] + self.model.tail_us)
        else:
            self.t += self.model.wait_us
        step.host["wait"] = (t0, self.t)
        t1 = self.t
        self.t += self._phase("update", step.shape)
        step.host["update"] = (t1, self.t)
        self._update(step.plan, self.t)
        plan = step.plan
        self.scheduler.budget.observe(plan.num_tokens, (step.dev[1] - step.dev[0]) / 1000.0,
                                      all(s.is_decode for s in plan.seqs))

    def _update(self, plan: StepPlan, t: float) -> None:
        """core._update for a load whose only finish is its length: one token per sampled row."""
        for seq in plan.sampled:
            req = seq.req
            req.pending -= 1
            if req.finished:
                continue
            req.output_ids.append(0)
            rec = self.records[req.id]
            rec["token_us"].append(t)
            rec["output_tokens"] += 1
            if rec["first_token_us"] is None:
                rec["first_token_us"] = t
            if len(req.output_ids) >= req.params.max_new_tokens or req.known_len >= self.scheduler.max_model_len:
                req.finish_reason = "length"
                rec["finish_us"], rec["finish_reason"] = t, "length"
                self.scheduler.remove(req)

    # -- records ---------------------------------------------------------------------------------------------
    def _result(self) -> SimResult:
        steps, why, extrapolated = [], {}, 0
        self._idle_ends = [b for _a, b in self.idle_spans]
        prev_end = None
        for i, st in enumerate(self.steps):
            if st.extrapolated:
                extrapolated += 1
                for name in st.extrapolated:
                    why[name] = why.get(name, 0) + 1
            gap = None if prev_end is None else max(0.0, st.dev[0] - prev_end)
            by_cause = self._idle_causes(i, prev_end, st.dev[0]) if gap else {}
            prev_end = st.dev[1]
            plan, shape = st.plan, st.shape
            steps.append({"step": i, "mode": self.mode, "num_requests": shape["requests"],
                          "prefill_tokens": shape["real_prefill_tokens"], "decode_tokens": shape["real_decode_rows"],
                          "sampled": shape["sampled"], "tokens_out": shape["sampled"],
                          "kv_blocks_used": st.kv_blocks, "kv_blocks_total": self.config.num_blocks,
                          "queue_depth": plan.queue_depth, "preempted": list(plan.preempted),
                          "budget": plan.budget.as_dict() if plan.budget is not None else None,
                          "cpu": {k: list(v) for k, v in st.host.items()}, "compute_us": list(st.dev),
                          "compute_basis": self.model.basis, "gpu_idle_before_us": gap,
                          "idle_by_cause_us": by_cause, "eager": bool(shape["eager"])})
        requests = list(self.records.values())
        unfinished = sum(1 for r in requests if r["finish_us"] is None) + len(self.pending)
        return SimResult(steps, requests, extrapolated, why, unfinished)

    def _idle_causes(self, i: int, g0: float, g1: float) -> dict:
        """The device's gap before step i, split by the host phase running at each instant (telemetry/idle.py's
        rule), 'empty_queue' while the engine had no request, 'host_other' for the loop between phases."""
        out: dict[str, float] = {}
        covered = 0.0
        first = bisect.bisect_right(self._idle_ends, g0)      # idle spans are in time order and never overlap
        spans = [(a, b, "empty_queue") for a, b in self.idle_spans[first:first + 4] if a < g1]
        spans += [(a, b, p) for st in self.steps[max(0, i - 2):i + 1] for p, (a, b) in st.host.items()]
        for a, b, label in spans:
            part = max(0.0, min(b, g1) - max(a, g0))
            if part > 0:
                out[label] = out.get(label, 0.0) + part
                covered += part
        rest = (g1 - g0) - covered
        if rest > 0.5:
            out["host_other"] = out.get("host_other", 0.0) + rest
        return {k: round(v, 1) for k, v in out.items()}
