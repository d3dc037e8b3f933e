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

The step-time model predicts device ms from a step's shape (StepShape): a fixed cost, decode rows, prefill
tokens, the prefill rows' attention work (sum of chunk x (cached context + chunk / 2) query-key pairs: a chunk
at the end of a long prompt attends to all of it) and the KV tokens the decode rows read. Its coefficients are a
non-negative least-squares fit, in relative error, over exponentially forgotten steps, anchored by a few
pseudo-steps of a prior (the H200 fit of llama3-8b) so directions the recent steps do not vary stay sensible.
Its inputs are times the engine already has when it consumes a step (the step's compute events, complete by
then, or on CPU its launch span): it adds no wait on the device. Plain Python, no torch: the scheduler asks it,
core.py feeds it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .config import EngineConfig

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
EMA = 0.25                  # weight of the newest step in the displayed averages (buckets, decode ms)
FORGET = 0.995              # each older step's weight in the fit shrinks by this per step (half-life ~140 steps)
OUTLIER = 0.5               # a step off its prediction by more than this (relative) counts proportionally less
MIN_PREFILL_STEPS = 2       # steps with prefill the fit needs before it sizes chunks (the prior covers the rest)
REFIT_EVERY = 8             # steps between solves of the fit
PUBLISH_EVERY = 32          # steps between refreshes of the engine's visible snapshot (Engine.info["budget"])

# the fit's terms: ms = sum(coefficient x feature); features in the units of StepShape.features
TERMS = ("ms", "ms_per_decode_row", "ms_per_prefill_token", "ms_per_k_attention_pairs", "ms_per_k_decode_kv")
# the prior: llama3-8b-random bf16 on one H200, fitted over the 16,472 steps of benchmarks/results/2026-12-04-h200-
# budget*/ (median error 3%); a few pseudo-steps of it, each PRIOR_WEIGHT of a real step
PRIOR = (4.4, 0.014, 0.019, 0.0028, 0.042)
PRIOR_WEIGHT = 0.1


@dataclass(frozen=True)
class StepShape:
    """What a step computes, as far as its time goes."""
    decode_rows: int = 0
    decode_kv: int = 0              # KV tokens the decode rows attend to, summed
    prefill_tokens: int = 0
    prefill_pairs: float = 0.0      # prefill query-key pairs: sum over rows of chunk x (cached + chunk / 2)

    @classmethod
    def of(cls, seqs) -> StepShape:
        """The shape of a planned step; `seqs` are scheduler.ScheduledSeq (start, num_tokens, is_decode)."""
        rows = kv = tokens = 0
        pairs = 0.0
        for s in seqs:
            if s.is_decode:
                rows += 1
                kv += s.start + 1
            else:
                tokens += s.num_tokens
                pairs += s.num_tokens * (s.start + s.num_tokens / 2)
        return cls(rows, kv, tokens, pairs)

    @classmethod
    def with_chunk(cls, decode_rows: int, decode_kv: int, rows: list[tuple[int, int]], chunk: int) -> StepShape:
        """A step of `decode_rows` decodes and a prefill chunk of `chunk` tokens taken from `rows` ((cached,
        still to compute) per prefilling request) in order, as the scheduler fills a step."""
        tokens, pairs = 0, 0.0
        for cached, todo in rows:
            if tokens >= chunk:
                break
            n = min(todo, chunk - tokens)
            tokens += n
            pairs += n * (cached + n / 2)
        return cls(decode_rows, decode_kv, tokens, pairs)

    def features(self) -> tuple[float, ...]:
        return (1.0, float(self.decode_rows), float(self.prefill_tokens), self.prefill_pairs / 1e3,
                self.decode_kv / 1e3)


PRIOR_SHAPES = (StepShape(1, 500), StepShape(32, 32 * 2000), StepShape(64, 64 * 500),
                StepShape(0, 0, 256, 256 * 128), StepShape(32, 32 * 1000, 256, 256 * 2128),
                StepShape(0, 0, 8192, 2 * 4000 * 2000 + 192 * 96))


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


class StepTimeModel:
    """StepShape -> device ms, fitted online from the engine's own steps (see the module docstring)."""

    def __init__(self):
        n = len(TERMS)
        self._xx = [[0.0] * n for _ in range(n)]    # forgotten sums of w x x^T and w x y over real steps
        self._xy = [0.0] * n
        self._prior_xx = [[0.0] * n for _ in range(n)]
        self._prior_xy = [0.0] * n
        for shape in PRIOR_SHAPES:
            x = shape.features()
            _accumulate(self._prior_xx, self._prior_xy, x, _dot(PRIOR, x), PRIOR_WEIGHT)
        self._coef: tuple[float, ...] = PRIOR
        self._dirty = False
        self._solved_at = 0
        self.steps = 0
        self.prefill_steps = 0
        self.decode_steps = 0               # steps that carried at least one decode
        self.error = None                   # forgotten mean |relative error| of each step's prediction, before it
        self.kv_per_row = 0.0               # averages the scheduler's questions fall back on when it gives no shape
        self.cached_per_prefill_row = 0.0
        # what the snapshot shows besides the fit (the earlier model's views, kept for readers of it)
        self.buckets: dict[int, list[float]] = {}   # tokens.bit_length() -> [mean tokens, mean ms, steps]
        self.decodes: dict[int, list[float]] = {}   # decode-only steps by rows.bit_length() -> [mean ms, last step]
        self.decode_ms: float | None = None

    @property
    def ready(self) -> bool:
        return self.prefill_steps >= MIN_PREFILL_STEPS

    def observe(self, shape: StepShape, ms: float) -> None:
        tokens = shape.decode_rows + shape.prefill_tokens
        if tokens < 1 or not ms > 0 or math.isinf(ms):
            return
        x = shape.features()
        weight = 1.0 / (ms * ms)            # relative error: a 5 ms step counts as much as a 200 ms one
        if self.ready:
            rel = abs(ms - self.predict(shape)) / ms
            self.error = rel if self.error is None else self.error + EMA * (rel - self.error)
            if rel > OUTLIER:               # a stall (GC, a preempted host) must not drag the fit
                weight *= OUTLIER / rel
        for row in self._xx:
            for j in range(len(row)):
                row[j] *= FORGET
        self._xy = [v * FORGET for v in self._xy]
        _accumulate(self._xx, self._xy, x, ms, weight)
        self._dirty = True
        self.steps += 1
        if shape.prefill_tokens:
            self.prefill_steps += 1
            rows_cached = shape.prefill_pairs / shape.prefill_tokens - shape.prefill_tokens / 2
            self.cached_per_prefill_row += EMA * (max(0.0, rows_cached) - self.cached_per_prefill_row)
        if shape.decode_rows:
            self.decode_steps += 1
            self.kv_per_row += EMA * (shape.decode_kv / shape.decode_rows - self.kv_per_row)
        self._show(tokens, ms, decode_only=not shape.prefill_tokens)

    def _show(self, tokens: int, ms: float, decode_only: bool) -> None:
        cell = self.buckets.get(tokens.bit_length())
        if cell is None:
            self.buckets[tokens.bit_length()] = [float(tokens), ms, 1]
        else:
            cell[0] += EMA * (tokens - cell[0])
            cell[1] += EMA * (ms - cell[1])
            cell[2] += 1
        if decode_only:
            rows = self.decodes.setdefault(tokens.bit_length(), [ms, self.steps])
            rows[0] += EMA * (ms - rows[0])
            rows[1] = self.steps
            self.decode_ms = rows[0]

    def coefficients(self) -> tuple[float, ...]:
        """The fit, solved again once REFIT_EVERY steps have come in since the last solve (every step for the
        first ones): a solve is ~0.1 ms of Python, and a step moves a fit with a 140-step half-life little."""
        if self._dirty and (self.steps - self._solved_at >= REFIT_EVERY or self.steps <= 2 * REFIT_EVERY):
            self._dirty = False
            self._solved_at = self.steps
            n = len(TERMS)
            xx = [[self._xx[i][j] + self._prior_xx[i][j] for j in range(n)] for i in range(n)]
            xy = [self._xy[i] + self._prior_xy[i] for i in range(n)]
            self._coef = _nonnegative_solve(xx, xy) or self._coef
        return self._coef

    def predict(self, shape: StepShape, attention: bool = True) -> float:
        """Device ms of a step of this shape; without its prefill attention with `attention=False` (the part
        that splitting a prompt into chunks does not change: its chunks' pairs always sum to the whole triangle)."""
        coef = self.coefficients()
        ms = _dot(coef, shape.features())
        return ms if attention else ms - coef[3] * shape.prefill_pairs / 1e3

    def knee_tokens(self) -> float:
        """Tokens whose compute costs what a step's fixed part does: the step becomes compute-bound there."""
        coef = self.coefficients()
        return coef[0] / coef[2] if coef[2] > 0 else 0.0

    def describe(self) -> dict:
        coef = self.coefficients()
        return {"intercept_ms": round(coef[0], 4), "ms_per_token": round(coef[2], 6),
                "decode_ms": round(self.decode_ms, 4) if self.decode_ms is not None else None,
                "decode_ms_by_rows": [{"rows_up_to": 2 ** k - 1, "ms": round(v[0], 4)}
                                      for k, v in sorted(self.decodes.items())],
                "steps_seen": self.steps,
                "buckets": [{"tokens": round(c[0], 1), "ms": round(c[1], 4), "steps": c[2]}
                            for _k, c in sorted(self.buckets.items())],
                "coefficients": {t: round(c, 7) for t, c in zip(TERMS, coef)},
                "ready": self.ready,
                "error_pct": round(100 * self.error, 2) if self.error is not None else None,
                "knee_tokens": round(self.knee_tokens(), 1)}


def _dot(a, b) -> float:
    return sum(x * y for x, y in zip(a, b))


def _accumulate(xx: list[list[float]], xy: list[float], x: tuple[float, ...], y: float, w: float) -> None:
    for i, xi in enumerate(x):
        if xi:
            xy[i] += w * xi * y
            row = xx[i]
            for j, xj in enumerate(x):
                row[j] += w * xi * xj


def _nonnegative_solve(xx: list[list[float]], xy: list[float]) -> tuple[float, ...] | None:
    """argmin over c >= 0 of the quadratic with normal equations xx c = xy: solve, pin the most negative
    coefficient at 0, solve for the rest, until none is negative (an active set; five terms, a few passes)."""
    n = len(xy)
    free = list(range(n))
    while free:
        sub = _solve([[xx[i][j] for j in free] for i in free], [xy[i] for i in free])
        if sub is None:
            return None
        worst = min(range(len(free)), key=lambda k: sub[k])
        if sub[worst] >= 0:
            out = [0.0] * n
            for k, i in enumerate(free):
                out[i] = sub[k]
            return tuple(out)
        free.pop(worst)
    return tuple([0.0] * n)


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    scale = max((abs(m[i][i]) for i in range(n)), default=0.0)
    if scale <= 0:
        return None
    for i in range(n):
        m[i][i] += 1e-12 * scale             # a whisper of ridge: a term no step varies stays at the prior
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) <= 1e-15 * scale:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            if f:
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (m[r][n] - sum(m[r][c] * out[c] for c in range(r + 1, n))) / m[r][r]
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
        return Budget(min(up) if derived and up else tokens, "decode_target", target)

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
