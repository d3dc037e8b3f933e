"""The per-step token budget: how many tokens (decodes plus prefill chunks) the next step may carry.

A fixed budget (`EngineConfig(max_batch_tokens=N)`) is the same for every step. The adaptive one (the default,
max_batch_tokens None) is chosen per step from what the engine measured of its own steps:
  - nothing decoding: the budget opens to `max_batch_tokens` (8192 on CUDA): long compute-bound chunks prefill fastest,
    and there is no decode whose inter-token latency a long step would stretch;
  - requests decoding: the prefill chunk is the largest whose step the model predicts within a target, the
    user's ITL target (`itl_target_ms`) or DECODE_FACTOR x the current decode step, so a step that carries a
    chunk delays each decode by at most that much. With the derived target (no itl_target_ms) and more prefill
    waiting than the decoding requests have left to decode (both in predicted device time), the target rises to
    the largest step: the steps the decodes still need cannot carry that prefill, the prompts behind them are
    most of the latency left, and small chunks would prefill them ~1.7x slower (an 8B model on an H200: 256
    tokens in 11 ms, 8192 in 213 ms). When the decodes have more left, small chunks cost little: each step's
    weight read serves decodes that had to run anyway.

The step-time model maps tokens to device ms: per token-count bucket (powers of two) an average of the recent
steps in it, a line fitted through those averages (each bucket counts once, so the many decode steps do not
outweigh the few prefill ones), and the recent decode-only step time on its own. Its inputs are times the engine
already has when it consumes a step (the step's compute events, complete by then, or on CPU its launch span): it
adds no wait on the device. Plain Python, no torch: the scheduler asks it, core.py feeds it.
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import EngineConfig

REASONS = ("decode_target", "no_decode", "fixed")
ADAPTIVE_MAX_TOKENS = {"cuda": 8192, "cpu": 2048}   # the adaptive budget's largest step, by device type
ADAPTIVE_GRAPH_TOKENS = 2048    # the adaptive budget's mixed-step graphs cover steps up to this many tokens
DECODE_FACTOR = 2.0         # the derived target: a step carrying a chunk takes at most this many decode steps
COLD_TOKENS = 256           # decoding before the model has two buckets: the budget measured safe on an 8B H200
MIN_CHUNK = 16              # a decode-target step always moves prefill on by at least this many tokens
EMA = 0.25                  # weight of the newest step in a bucket's average (recent steps count most)
DECODE_STALE_STEPS = 64     # a decode-only time older than this many steps no longer says what decoding costs
PUBLISH_EVERY = 32          # steps between refreshes of the engine's visible snapshot (Engine.info["budget"])


def step_token_limits(config: EngineConfig, device_type: str) -> tuple[int, int]:
    """(the most tokens one step may carry: what the IO buffers are sized for, the most a mixed-step graph is
    captured for). A fixed budget is both; the adaptive one sizes buffers for its largest chunk and captures
    graphs for the small steps that carry decodes."""
    if config.max_batch_tokens is not None:
        return config.max_batch_tokens, config.max_batch_tokens
    largest = config.budget_max_tokens or ADAPTIVE_MAX_TOKENS.get(device_type, ADAPTIVE_MAX_TOKENS["cuda"])
    return largest, min(largest, ADAPTIVE_GRAPH_TOKENS)


def make_budget(config: EngineConfig, device_type: str) -> "StepBudget":
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
    """tokens -> device ms, from the engine's own recent steps (see the module docstring)."""

    def __init__(self):
        self.buckets: dict[int, list[float]] = {}   # tokens.bit_length() -> [mean tokens, mean ms, steps]
        # decode-only steps by rows.bit_length() -> [mean ms, the step count when last seen]: a decode step's
        # time grows with its rows and their context, so 2 rows say little about 32
        self.decodes: dict[int, list[float]] = {}
        self.decode_ms: float | None = None         # the latest decode-only steps' mean, whatever their rows
        self.steps = 0
        self._line: tuple[float, float] | None = None
        self._dirty = False

    def observe(self, tokens: int, ms: float, decode_only: bool) -> None:
        if tokens < 1 or not ms > 0:
            return
        self.steps += 1
        cell = self.buckets.get(tokens.bit_length())
        if cell is None:
            self.buckets[tokens.bit_length()] = [float(tokens), ms, 1]
        else:
            cell[0] += EMA * (tokens - cell[0])
            cell[1] += EMA * (ms - cell[1])
            cell[2] += 1
        if decode_only:
            rows = self.decodes.get(tokens.bit_length())
            if rows is None:
                rows = self.decodes[tokens.bit_length()] = [ms, self.steps]
            rows[0] += EMA * (ms - rows[0])
            rows[1] = self.steps
            self.decode_ms = rows[0]
        self._dirty = True

    def line(self) -> tuple[float, float] | None:
        """(intercept ms, ms per token) of the least-squares line through the buckets' averages; None until two
        buckets are known or while the line does not rise with tokens."""
        if self._dirty:
            self._dirty = False
            self._line = _fit([(c[0], c[1]) for c in self.buckets.values()])
        return self._line

    def predict(self, tokens: int) -> float | None:
        fit = self.line()
        return None if fit is None else fit[0] + fit[1] * tokens

    def decode_step_ms(self, decoding: int) -> float | None:
        """What a step of `decoding` one-token rows costs now: recent decode-only steps of about as many rows
        (same power-of-two bucket), else the line (a prefill backlog leaves few decode-only steps to learn from)."""
        rows = self.decodes.get(decoding.bit_length())
        if rows is not None and self.steps - rows[1] <= DECODE_STALE_STEPS:
            return rows[0]
        return self.predict(decoding)

    def describe(self) -> dict:
        fit = self.line()
        return {"intercept_ms": round(fit[0], 4) if fit else None,
                "ms_per_token": round(fit[1], 6) if fit else None,
                "decode_ms": round(self.decode_ms, 4) if self.decode_ms is not None else None,
                "decode_ms_by_rows": [{"rows_up_to": 2 ** k - 1, "ms": round(v[0], 4)}
                                      for k, v in sorted(self.decodes.items())],
                "steps_seen": self.steps,
                "buckets": [{"tokens": round(c[0], 1), "ms": round(c[1], 4), "steps": c[2]}
                            for _k, c in sorted(self.buckets.items())]}


def _fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx <= 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    if slope <= 0:
        return None
    return my - slope * mx, slope


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
        self.snapshot: dict = {}            # Engine.info["budget"]: same keys always, values replaced whole
        self._since_publish = 0
        self.publish()

    @property
    def max_tokens(self) -> int:
        # until scheduler.py reads max_batch_tokens
        return self.max_batch_tokens

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

    def choose(self, decoding: int, prefill_waiting: int, decode_left: float) -> Budget:
        """The budget of the next step. `decoding`: requests that decode one token in it; `prefill_waiting`:
        prompt (or recompute) tokens that running requests and the admissible queue still have to compute;
        `decode_left`: the mean tokens the decoding requests may still produce."""
        if not self.adaptive:
            budget = Budget(self.fixed_tokens, "fixed")
        elif decoding == 0:
            budget = Budget(self.max_batch_tokens, "no_decode")
        else:
            budget = self._decode_target(decoding, prefill_waiting, decode_left)
        self.last = budget
        return budget

    def _decode_target(self, decoding: int, prefill_waiting: int, decode_left: float) -> Budget:
        cap = max(self.decode_max_tokens, decoding)
        decode_ms = self.model.decode_step_ms(decoding)
        fit = self.model.line()
        if decode_ms is None or fit is None:
            return Budget(min(cap, max(COLD_TOKENS, decoding + MIN_CHUNK)), "decode_target")
        per_token = fit[1]
        target = self.itl_target_ms or DECODE_FACTOR * decode_ms
        largest = decode_ms + per_token * max(0, self.max_batch_tokens - decoding)
        if self.itl_target_ms is None and prefill_waiting * per_token > decode_left * decode_ms and largest > target:
            # prefill first, eagerly past the graphs: such a step is compute-bound, its launch hides behind it
            return Budget(max(self.max_batch_tokens, decoding), "decode_target", largest)
        chunk = int((target - decode_ms) / per_token + 1e-9)
        tokens = max(decoding + MIN_CHUNK, min(cap, decoding + chunk))
        snapped = [t for t in self.graph_tokens if decoding + MIN_CHUNK <= t <= tokens]
        return Budget(snapped[-1] if snapped else tokens, "decode_target", target)

    def observe(self, tokens: int, ms: float | None, decode_only: bool) -> None:
        """A consumed step's token count and device time (None when it could not be read)."""
        if ms is not None:
            self.model.observe(tokens, ms, decode_only)     # fixed budgets too: the model is shown either way
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
                  "last": self.last.as_dict() if self.last is not None else None}
        for key, value in values.items():
            self.snapshot[key] = value
