"""The per-step token budget: how many tokens (decodes plus prefill chunks) the next step may carry.

A fixed budget (`EngineConfig(max_batch_tokens=N)`) is the same for every step. The adaptive one (the default,
max_batch_tokens None) is chosen per step from what the engine measured of its own steps:
  - nothing decoding: the budget opens to `max_batch_tokens` (8192 on CUDA): long compute-bound chunks prefill
    fastest, and there is no decode whose inter-token latency a long step would stretch;
  - requests decoding: the prefill chunk is the largest whose step the model predicts within a target, the
    user's ITL target (`itl_target_ms`) or DECODE_FACTOR x the predicted decode step, so a step that carries a
    chunk delays each decode by at most that much. With the derived target a step never carries fewer tokens
    than the knee (intercept / ms per token, ~230 on an 8B H200, up to a graph bucket: 256): below it a
    step costs more in its fixed part (the weight read) than in its tokens, and prefill crawls for little ITL;
  - a prefill backlog (derived target only): when the waiting prompts would need more than BACKLOG_STEPS
    target-sized steps, those steps would stretch every decode for long and still prefill slowly (an 8B model on
    an H200 with 29 decodes over 4000-token contexts: a 227-token chunk step takes 16-18 ms, 0.07 ms a prompt
    token; an 8192-token one 220 ms, 0.027). The chunk becomes the smallest whose whole-step cost per prompt
    token (attention aside) is within BACKLOG_EFFICIENCY (2%) of the best any step size reaches, until the
    backlog falls under
    BACKLOG_EXIT_STEPS such steps. An explicit `itl_target_ms` is never exceeded.
The knee floor rounds to a graph bucket: up while that step stays within the target, else to the nearest by ratio.

The step-time model (step_time.py) predicts each step's device ms from its shape.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .config import EngineConfig
from .step_time import StepShape, StepTimeModel  # noqa: F401  (StepShape: callers read it from here too)

REASONS = ("decode_target", "no_decode", "fixed")
ADAPTIVE_MAX_TOKENS = {"cuda": 8192, "cpu": 2048}   # the adaptive budget's largest step, by device type
ADAPTIVE_GRAPH_TOKENS = 2048    # the adaptive budget's mixed-step graphs cover steps up to this many tokens
DECODE_FACTOR = 1.75        # the derived target: a step carrying a chunk takes at most this many decode steps
COLD_TOKENS = 256           # decoding before the model is ready: the budget measured safe on an 8B H200
MIN_CHUNK = 16              # a decode-target step always moves prefill on by at least this many tokens
BACKLOG_STEPS = 16          # more target-sized steps than this to clear the waiting prompts: a backlog
BACKLOG_PROMPTS = 4         # ... of at least this many prompts (a burst; one or two long prompts are served)
BACKLOG_EXIT_STEPS = 4      # ... which lasts until this many such steps would clear what is left
BACKLOG_EFFICIENCY = 0.02   # a backlog chunk's ms per prompt token within 2% of the best step size's
PUBLISH_EVERY = 32          # steps between refreshes of the engine's visible snapshot (Engine.info["budget"])


def step_token_limits(config: EngineConfig, device_type: str) -> tuple[int, int]:
    """(the most tokens one step may carry: what the IO buffers are sized for, the most a mixed-step graph is
    captured for). A fixed budget is both; the adaptive one sizes buffers for its largest chunk and captures
    graphs for the small steps that carry decodes."""
    if config.max_batch_tokens is not None:
        return config.max_batch_tokens, config.max_batch_tokens
    largest = config.budget_max_tokens or ADAPTIVE_MAX_TOKENS.get(device_type, ADAPTIVE_MAX_TOKENS["cuda"])
    return largest, min(largest, ADAPTIVE_GRAPH_TOKENS)


def make_budget(config: EngineConfig, device_type: str) -> StepBudget:
    return StepBudget(config.max_batch_tokens, step_token_limits(config, device_type)[0], config.itl_target_ms)


@dataclass
class Budget:
    """What one step ran with: the contract's `StepRecord.budget` (`tokens`, `reason`), plus the step-time
    target the chunk was sized for (decode_target steps only)."""
    tokens: int
    reason: str
    target_ms: float | None = None

    def as_dict(self) -> dict:
        out = {"tokens": self.tokens, "reason": self.reason}
        if self.target_ms is not None:
            out["target_ms"] = round(self.target_ms, 3)
        return out


class StepBudget:
    """The budget policy the scheduler asks once per step. Fixed when `fixed_tokens` is given, else adaptive."""

    def __init__(self, fixed_tokens: int | None, max_batch_tokens: int, itl_target_ms: float | None = None):
        self.fixed_tokens = fixed_tokens
        self.max_batch_tokens = fixed_tokens or max_batch_tokens  # the most any step may carry (buffers are this big)
        self.decode_max_tokens = self.max_batch_tokens        # the most a step with decodes may carry (graphs)
        self.graph_tokens: list[int] = []                     # the mixed-step graphs' token buckets
        self.itl_target_ms = itl_target_ms
        self.model = StepTimeModel()
        self.last: Budget | None = None
        self.backlog = False                # the adaptive budget is clearing a prefill backlog (module docstring)
        self.snapshot: dict = {}            # Engine.info["budget"]: same keys always, values replaced whole
        self._since_publish = 0
        self.publish()

    @property
    def adaptive(self) -> bool:
        return self.fixed_tokens is None

    def limit_decode_steps(self, graph_tokens: list[int] | int) -> None:
        """Steps that carry decodes stay within the largest mixed-step graph (an eager step among decodes costs
        the host a launch per op, which no ITL target survives). Given the graphs' token buckets, their budget
        also ends on one: a step of 257 tokens replays the 320-token graph and costs what 320 tokens do. Given one
        number, it is only the cap."""
        if isinstance(graph_tokens, int):
            self.decode_max_tokens = max(1, min(self.max_batch_tokens, graph_tokens))
        else:
            self.graph_tokens = sorted(t for t in graph_tokens if t <= self.max_batch_tokens)
            if self.graph_tokens:
                self.decode_max_tokens = self.graph_tokens[-1]
        self.publish()

    def choose(self, decoding: int, prefill_waiting: int, decode_left: float, decode_kv: int | None = None,
               prefill_rows: list[tuple[int, int]] | None = None) -> Budget:
        """The budget of the next step. `decoding`: requests that decode one token in it; `prefill_waiting`:
        prompt (or recompute) tokens that running requests and the admissible queue still have to compute;
        `decode_left`: the mean tokens the decoding requests may still produce (no longer weighed: the backlog
        test counts prompts and steps; kept for callers); `decode_kv`: the KV tokens the
        decoding requests attend to, summed; `prefill_rows`: (cached tokens, tokens still to compute) of each
        request with prefill waiting, in the order the scheduler fills a step. Without the last two the model
        falls back on the averages it saw."""
        if not self.adaptive:
            budget = Budget(self.fixed_tokens, "fixed")
        elif decoding == 0:
            self.backlog = False
            budget = Budget(self.max_batch_tokens, "no_decode")
        else:
            if decode_kv is None:
                decode_kv = int(decoding * self.model.kv_per_row)
            rows_known = prefill_rows is not None
            if not rows_known:
                prefill_rows = [(int(self.model.cached_per_prefill_row), prefill_waiting)] if prefill_waiting else []
            budget = self._decode_target(decoding, decode_kv, prefill_rows, rows_known)
        self.last = budget
        return budget

    def _decode_target(self, decoding: int, decode_kv: int, rows: list[tuple[int, int]], rows_known: bool) -> Budget:
        cap = max(self.decode_max_tokens, decoding)
        if not self.model.ready:
            self.backlog = False
            return Budget(min(cap, max(COLD_TOKENS, decoding + MIN_CHUNK)), "decode_target")
        model = self.model

        def step_ms(chunk: int, attention: bool = True) -> float:
            return model.predict(StepShape.with_chunk(decoding, decode_kv, rows, chunk), attention)

        derived = self.itl_target_ms is None
        target = DECODE_FACTOR * step_ms(0) if derived else self.itl_target_ms
        room = cap - decoding
        chunk = _largest_within(step_ms, room, target)
        waiting = sum(todo for _cached, todo in rows)
        if derived and waiting:
            steps = math.ceil(waiting / max(chunk, MIN_CHUNK))
            if self.backlog:
                self.backlog = steps > BACKLOG_EXIT_STEPS
            else:               # one long prompt among decodes is served, not a backlog: its target steps hold
                prompts = sum(1 for _cached, todo in rows if todo > 0) if rows_known else BACKLOG_PROMPTS
                self.backlog = steps > BACKLOG_STEPS and prompts >= BACKLOG_PROMPTS
        else:
            self.backlog = False
        if self.backlog:
            chunk = self._efficient_chunk(step_ms, decoding, waiting)
            return Budget(decoding + chunk, "decode_target", step_ms(chunk))
        lo = decoding + MIN_CHUNK
        tokens = max(lo, min(cap, decoding + chunk))
        # never below the knee with the derived target; on the largest graph bucket in reach, else the smallest
        # past the floor (a step of 257 tokens replays the 320-token graph and costs what 320 tokens do)
        floor = max(lo, min(cap, math.ceil(model.knee_tokens()))) if derived else lo
        tokens = max(tokens, floor)
        snapped = [t for t in self.graph_tokens if floor <= t <= tokens]
        if snapped:
            return Budget(snapped[-1], "decode_target", target)
        up = [t for t in self.graph_tokens if t >= floor]
        if not (derived and up):
            return Budget(tokens, "decode_target", target)
        return Budget(self._knee_bucket(min(up), floor, lo, lambda t: step_ms(t - decoding) <= target),
                      "decode_target", target)

    def _knee_bucket(self, up: int, floor: int, lo: int, within_target) -> int:
        """The graph bucket a knee-floored step runs on: the one past the knee while its step stays within the
        target, else the one nearest the knee by ratio (H200, 8B, 12 req/s: a knee of ~270 tokens rounded up to the
        320-token graph made 10.4-11.1 ms steps against a 9.3 ms target, an ITL p99 2.06x its median; 256 keeps
        it within 2x and prefills as fast)."""
        down = [t for t in self.graph_tokens if lo <= t < floor]
        if within_target(up) or not down:
            return up
        return up if up / floor <= floor / down[-1] else down[-1]     # nearest by ratio: what a step's cost scales by

    def _efficient_chunk(self, step_ms, decoding: int, waiting: int) -> int:
        """The smallest chunk whose step costs, per prompt token, within BACKLOG_EFFICIENCY of the cheapest step
        size. The attention is left out of that cost: however the prompts are cut, their chunks' attention sums
        to the same, so it says nothing about which cut is cheaper. Candidates: the mixed graphs' sizes, then
        powers of two past them (eager, compute-bound), and the largest step; none past what is waiting."""
        room = max(self.max_batch_tokens - decoding, MIN_CHUNK)
        sizes = {t - decoding for t in self.graph_tokens if t - decoding >= MIN_CHUNK}
        sizes |= {self.decode_max_tokens - decoding, room}
        size = 2 * self.decode_max_tokens
        while size < room:
            sizes.add(size - decoding)
            size *= 2
        sizes = sorted({min(max(c, MIN_CHUNK), room, max(waiting, MIN_CHUNK)) for c in sizes if c > 0})
        per_token = [(c, step_ms(c, attention=False) / min(c, max(waiting, 1))) for c in sizes]
        best = min(p for _c, p in per_token)
        return next(c for c, p in per_token if p <= best * (1 + BACKLOG_EFFICIENCY))

    def observe(self, tokens: int, ms: float | None, decode_only: bool, shape: StepShape | None = None) -> None:
        """A consumed step's token count, device time (None when it could not be read) and, when the caller has
        it, its shape (StepShape.of(plan.seqs)); without one, the step counts as decode rows or prefill tokens
        with no context."""
        if ms is not None:                  # fixed budgets too: the model is shown either way
            if shape is None:
                shape = StepShape(decode_rows=tokens) if decode_only else StepShape(prefill_tokens=tokens)
            self.model.observe(shape, ms)
        self._since_publish += 1
        if self._since_publish >= PUBLISH_EVERY or self.model.steps <= PUBLISH_EVERY:    # the first steps at once
            self.publish()

    def publish(self) -> None:
        """Refresh the visible snapshot in place: its keys never change, each value is replaced whole, so a
        reader on another thread (the server's /api/status, the timeline's meta) never sees a dict change size."""
        self._since_publish = 0
        values = {"mode": "adaptive" if self.adaptive else "fixed", "fixed_tokens": self.fixed_tokens,
                  "max_tokens": self.max_batch_tokens, "decode_max_tokens": self.decode_max_tokens,
                  "itl_target_ms": self.itl_target_ms, "decode_factor": None if self.itl_target_ms else DECODE_FACTOR,
                  "step_time_model": self.model.describe(),
                  "last": self.last.as_dict() if self.last is not None else None,
                  "backlog": self.backlog}
        for key, value in values.items():
            self.snapshot[key] = value


def _largest_within(step_ms, room: int, target: float) -> int:
    """The largest chunk in [0, room] whose predicted step is within target (step_ms rises with the chunk)."""
    if room <= 0 or step_ms(0) > target:
        return 0
    if step_ms(room) <= target:
        return room
    lo, hi = 0, room                        # step_ms(lo) <= target < step_ms(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if step_ms(mid) <= target:
            lo = mid
        else:
            hi = mid
    return lo
