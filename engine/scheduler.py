"""Who runs next: FCFS continuous batching over a token budget, with chunked prefill and preemption.

Plain Python over Request objects; it never touches the device. It knows about the async pipeline only through
`Request.pending` (a sampled token the host has not seen yet): such a request's next input is carried from the
previous step's output on the device, and a request whose last allowed token is in flight is not scheduled again.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from itertools import islice

from .budget import Budget, StepBudget
from .kv_cache import BlockAllocator
from .penalties import PenaltyRows
from .request import Request


@dataclass
class ScheduledSeq:
    req: Request
    start: int              # first position computed in this step
    num_tokens: int         # positions [start, start + num_tokens)
    sample: bool            # the step samples this request's next token
    carry_row: int = -1     # >= 0: the single input token is row `carry_row` of the previous step's output

    @property
    def is_decode(self) -> bool:
        """One token whose id the engine sampled (not part of the prompt being prefilled)."""
        return self.num_tokens == 1 and self.start >= len(self.req.prompt_ids)


@dataclass
class StepPlan:
    step: int
    seqs: list[ScheduledSeq]
    queue_depth: int
    running: int
    preempted: list[str] = field(default_factory=list)
    budget: Budget | None = None    # the token budget it was planned within, and why that one (budget.py)

    # A plan never changes once made; these are read several times a step (fill, launch, wait, update, trace).
    @cached_property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.seqs)

    @cached_property
    def sampled(self) -> list[ScheduledSeq]:
        return [s for s in self.seqs if s.sample]


class Scheduler:
    def __init__(self, allocator: BlockAllocator, block_size: int, max_batch_tokens: int | StepBudget,
                 max_running: int, max_model_len: int):
        """`max_batch_tokens`: a fixed per-step budget, or the StepBudget policy that chooses one per step."""
        self.allocator = allocator
        self.block_size = block_size
        self.budget = (max_batch_tokens if isinstance(max_batch_tokens, StepBudget)
                       else StepBudget(max_batch_tokens, max_batch_tokens))
        self.max_running = max_running
        self.max_model_len = max_model_len
        self.queue: deque[Request] = deque()
        self.running: list[Request] = []
        # rows of the device's token counts for requests with penalties: one per request that may run at once
        self.penalty_rows = PenaltyRows(max_running)

    @property
    def max_batch_tokens(self) -> int:
        """The most tokens any step may carry (a fixed budget's value)."""
        return self.budget.max_batch_tokens

    # -- bookkeeping --------------------------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        self.queue.append(req)

    def remove(self, req: Request) -> None:
        """Forget a finished request and give its blocks back. Safe while one of its steps is in flight: the
        device runs steps in order, so a block reused by a later step is written only after that step is done."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.queue:
            self.queue.remove(req)
        self.allocator.free(req.blocks)
        req.blocks = []
        self.penalty_rows.give_back(req)

    def _length_capped(self, req: Request) -> bool:
        """True when the tokens already sampled (seen or in flight) are all this request may produce."""
        return (len(req.output_ids) + req.pending >= req.params.max_new_tokens
                or req.total_len >= self.max_model_len)

    def _blocks_needed(self, req: Request, upto: int) -> int:
        return max(0, -(-upto // self.block_size) - len(req.blocks))

    def _preempt(self, req: Request) -> None:
        """Recompute-style preemption: drop the KV, keep the tokens. An in-flight token stays valid (its step
        already read the old blocks) and is appended when it arrives; the request waits for it before resuming."""
        self.running.remove(req)
        self.allocator.free(req.blocks)
        req.blocks = []
        req.num_computed = 0
        self.penalty_rows.give_back(req)      # its counts are rebuilt from position 0 when it is re-admitted
        # back to the front, oldest first, so a preempted request is the next one admitted (no starvation)
        idx = 0
        while idx < len(self.queue) and self.queue[idx].arrival_ns < req.arrival_ns:
            idx += 1
        self.queue.insert(idx, req)

    # -- one step -----------------------------------------------------------------------------------------------
    def schedule(self, step: int, previous: StepPlan | None) -> StepPlan | None:
        """Plan step `step`. `previous` is the step still in flight (async) whose sampled rows can be carried."""
        carry_rows = {}
        if previous is not None:
            carry_rows = {s.req.id: row for row, s in enumerate(previous.sampled)}
        queue_depth, running_now = len(self.queue), len(self.running)
        budget = self._choose_budget()
        draft = _Draft(budget=budget.tokens, carry_rows=carry_rows)
        self._schedule_running(draft)
        self._admit_queued(draft)
        if not draft.seqs:
            return None
        for seq in draft.seqs:
            seq.req.num_computed += seq.num_tokens
            if seq.sample:
                seq.req.pending += 1
        return StepPlan(step, draft.seqs, queue_depth, running_now, draft.preempted, budget)

    def _choose_budget(self) -> Budget:
        """Ask the budget policy, with what it weighs: the requests decoding, the prefill tokens waiting (running
        requests' and those the queue could admit now) and the tokens the decoding requests have left."""
        if not self.budget.adaptive:
            return self.budget.choose(len(self.running), 0, 0.0)
        decoding, prefill, left, decode_kv = 0, 0, 0, 0
        prefill_rows: list[tuple[int, int]] = []     # (cached, still to compute), in the order a step is filled
        for req in self.running:
            todo = req.total_len - req.num_computed
            if _decodes_next(req):
                decoding += 1
                decode_kv += req.num_computed + 1
                left += max(0, req.params.max_new_tokens - len(req.output_ids) - req.pending)
            else:
                prefill += todo
                prefill_rows.append((req.num_computed, todo))
        for req in islice(self.queue, max(0, self.max_running - len(self.running))):
            prefill += req.total_len - req.num_computed
            prefill_rows.append((req.num_computed, req.total_len - req.num_computed))
        return self.budget.choose(decoding, prefill, left / decoding if decoding else 0.0, decode_kv, prefill_rows)

    def _schedule_running(self, draft: _Draft) -> None:
        """Running requests first, in admission order. One short of KV blocks preempts the newest running request
        not yet in this step (or itself, when every other one already is)."""
        for req in list(self.running):
            if req not in self.running or draft.budget <= 0:
                continue
            seq = self._plan_for(req, draft)
            if seq is None:
                continue
            need = self._blocks_needed(req, seq.start + seq.num_tokens)
            while need > self.allocator.num_free:
                victims = [r for r in self.running if r.id not in draft.scheduled and r is not req]
                victim = victims[-1] if victims else req
                self._preempt(victim)
                draft.preempted.append(victim.id)
                if victim is req:
                    break
            if req not in self.running:
                continue
            req.blocks += self.allocator.allocate(need)
            draft.add(seq)

    def _admit_queued(self, draft: _Draft) -> None:
        """Queued requests, oldest first, while the budget, max_running and free blocks allow. A step that had to
        preempt admits nothing: the preempted request, now at the head of the queue, would take back its blocks."""
        while (self.queue and draft.budget > 0 and len(self.running) < self.max_running
               and not draft.preempted):
            req = self.queue[0]
            seq = self._plan_for(req, draft)
            if seq is None:
                break                            # head of line waits (e.g. for its in-flight token)
            need = self._blocks_needed(req, seq.start + seq.num_tokens)
            if need > self.allocator.num_free:
                break
            self.queue.popleft()
            self.running.append(req)
            req.blocks += self.allocator.allocate(need)
            self.penalty_rows.take(req)
            draft.add(seq)

    def _plan_for(self, req: Request, draft: _Draft) -> ScheduledSeq | None:
        """What `req` computes in this step within the remaining budget, or None when it must sit it out."""
        todo = req.total_len - req.num_computed
        n = min(todo, draft.budget)
        if n <= 0:
            return None
        sample = req.num_computed + n == req.total_len
        if sample and self._length_capped(req):
            return None
        carry = -1
        if req.pending:
            if req.id not in draft.carry_rows:   # its token comes from a step we cannot carry from
                return None
            if req.num_computed + 1 != req.total_len:
                return None                      # recompute must wait until the in-flight token is known
            n, carry = 1, draft.carry_rows[req.id]
        return ScheduledSeq(req, req.num_computed, n, sample, carry)


def _decodes_next(req: Request) -> bool:
    """Its next step computes one token: a sampled one (carried or known), not a prompt chunk."""
    return req.total_len - req.num_computed <= 1 and req.num_computed >= len(req.prompt_ids)


@dataclass
class _Draft:
    """The step being planned: what is in it so far and the token budget left."""
    budget: int
    carry_rows: dict[str, int]                   # request id -> its sampled row in the step in flight
    seqs: list[ScheduledSeq] = field(default_factory=list)
    scheduled: set[str] = field(default_factory=set)
    preempted: list[str] = field(default_factory=list)

    def add(self, seq: ScheduledSeq) -> None:
        self.seqs.append(seq)
        self.scheduled.add(seq.req.id)
        self.budget -= seq.num_tokens
