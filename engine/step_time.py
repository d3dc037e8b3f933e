"""What a step costs on the device, predicted from its shape: the budget's step-time model.

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

EMA = 0.25                  # weight of the newest step in the displayed averages (buckets, decode ms)
FORGET = 0.995              # each older step's weight in the fit shrinks by this per step (half-life ~140 steps)
OUTLIER = 0.5               # a step off its prediction by more than this (relative) counts proportionally less
MIN_PREFILL_STEPS = 2       # steps with prefill the fit needs before it sizes chunks (the prior covers the rest)
REFIT_EVERY = 8             # steps between solves of the fit

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
