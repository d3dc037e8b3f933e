"""How sure a compare is: intervals from the steps and from run-to-run spread, and the verdict rules.

Two kinds of noise move a figure (docs/compare.md):
- step to step: a bootstrap that resamples blocks of consecutive steps within each recording (neighbouring steps
  share background load, so single steps are not independent), and the recordings themselves when a side has
  several (a hierarchical bootstrap);
- run to run: clocks, power, placement and other tenants move a whole run. With two or more recordings a side,
  a Welch t interval over the per-recording figures measures it; the reported interval covers both. With one
  recording a side nothing measures it, and a minimum effect stands in for it: a difference smaller than that is
  never called a change.

Verdicts (ratio NEW/BASE with interval [low, high], minimum effect m):
    slower        low > 1 + m              faster   high < 1 / (1 + m)
    same          the interval lies within [1 / (1 + m), 1 + m]
    inconclusive  anything else, or too few matched steps
"""
from __future__ import annotations

import math

import numpy as np

RESAMPLES = 400
LEVEL = 0.90                          # two-sided: the 5th and 95th percentiles
# Minimum effects: one recording a side / several (run spread then measured). A host-timed (CPU) engine on a
# shared machine moves 7% at decode and up to 20% at prefill between two runs of one build; a GPU run 2-4%.
MIN_EFFECT = {"host": (0.10, 0.03), "gpu": (0.03, 0.01)}
BLOCK_STEPS = 16                      # consecutive steps resampled together (fewer in short recordings)
MAX_BLOCK_STEPS = 64                  # ... within one burst of load, when the load paused between bursts
MIN_BLOCKS = 12
WINSOR_PCT = (2.0, 98.0)              # a stall in under 2% of a bucket's steps is not the build's speed
SMALL_GROUP_SIGMAS = 5.0
# The middle of each bucket's steps: trimmed means drop this share of the weight at each end. A CPU engine on a
# shared machine has a third of its steps stretched by other processes (p95 at 3x the median on a busy 2-core
# machine); a GPU's events see few such steps, and its trim only drops stalls.
TRIM = {"host": 0.25, "gpu": 0.10}
# t quantiles at 0.95 (a two-sided 90% interval) for 1..30 degrees of freedom; above 30, the normal's
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
        1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697)


def min_effect(basis: str, runs_per_side: int) -> float:
    one, several = MIN_EFFECT["host" if basis == "host" else "gpu"]
    return several if runs_per_side >= 2 else one


def block_ids(pauses: list[bool]) -> np.ndarray:
    """Each step's block within its recording (`pauses`: whether the load paused before each step, in order).
    A block never spans a pause, so a burst of work is resampled whole (the machine's state shifts between
    bursts); blocks are cut every MAX_BLOCK_STEPS within a burst, every BLOCK_STEPS where the load never paused,
    and shorter where that would leave fewer than MIN_BLOCKS blocks."""
    n = len(pauses)
    cap = MAX_BLOCK_STEPS if any(pauses[1:]) else BLOCK_STEPS
    cap = max(1, min(cap, n // MIN_BLOCKS))
    ids = np.empty(n, dtype=np.int64)
    current, length = -1, 0
    for i, pause in enumerate(pauses):
        if i == 0 or pause or length >= cap:
            current, length = current + 1, 0
        ids[i] = current
        length += 1
    return ids


def resample_weights(recording_of_step: np.ndarray, block_of_step: np.ndarray, resamples: int,
                     rng: np.random.Generator) -> np.ndarray:
    """(resamples x steps) weights: how often each step is drawn. Recordings are drawn with replacement (when
    there are several), then within each drawn recording its blocks of consecutive steps."""
    n_rec = int(recording_of_step.max()) + 1 if recording_of_step.size else 0
    weights = np.zeros((resamples, recording_of_step.size), dtype=np.float32)
    picks = (rng.multinomial(n_rec, [1.0 / n_rec] * n_rec, size=resamples) if n_rec > 1
             else np.ones((resamples, 1), dtype=np.int64))
    for r in range(n_rec):
        mine = np.flatnonzero(recording_of_step == r)
        _, blocks = np.unique(block_of_step[mine], return_inverse=True)     # blocks with a step here
        n_blocks = int(blocks.max()) + 1
        counts = rng.multinomial(picks[:, r] * n_blocks, [1.0 / n_blocks] * n_blocks)
        weights[:, mine] = counts[:, blocks]
    return weights


def winsorize(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Values clipped to their own group's WINSOR_PCT percentiles (NaN, an unknown figure, stays NaN). A group
    too small for percentiles (a short trace window) is clipped at its median +- SMALL_GROUP_SIGMAS robust
    deviations instead: one cut-off step among five must not pass for the speed of the other four."""
    out = values.copy()
    for g in np.unique(groups):
        mine = (groups == g) & ~np.isnan(values)
        if mine.sum() >= 10:
            low, high = np.percentile(values[mine], WINSOR_PCT)
        elif mine.sum() >= 3:
            median = float(np.median(values[mine]))
            sigma = 1.4826 * float(np.median(np.abs(values[mine] - median)))
            if sigma == 0:
                continue
            low, high = median - SMALL_GROUP_SIGMAS * sigma, median + SMALL_GROUP_SIGMAS * sigma
        else:
            continue
        out[mine] = np.clip(values[mine], low, high)
    return out


def trim_for(basis: str) -> float:
    return TRIM["host" if basis == "host" else "gpu"]


def bucket_means(weights: np.ndarray, values: np.ndarray, bucket: np.ndarray, n_buckets: int,
                 trim: float = 0.0) -> np.ndarray:
    """(resamples x buckets) weighted trimmed means of `values` per bucket: the mean of the middle (1 - 2 trim)
    of each bucket's weight, sorted by value; NaN where a resample drew none of the bucket."""
    out = np.full((weights.shape[0], n_buckets), np.nan)
    known = ~np.isnan(values)
    for b in range(n_buckets):
        idx = np.flatnonzero((bucket == b) & known)
        if not idx.size:
            continue
        order = idx[np.argsort(values[idx], kind="stable")]
        w = weights[:, order].astype(np.float64)
        upto = np.cumsum(w, axis=1)
        total = upto[:, -1:]
        kept = np.clip(np.minimum(upto, (1 - trim) * total) - np.maximum(upto - w, trim * total), 0.0, None)
        mass = kept.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, b] = np.where(mass > 0, kept @ values[order] / mass, np.nan)
    return out


def mix_total(means: np.ndarray, point: np.ndarray, mix: np.ndarray) -> np.ndarray:
    """Per resample, the figure per step over the common mix of buckets (`mix`: weights summing to 1); a bucket a
    resample missed counts at its point estimate, a bucket with no known value at all is left out."""
    filled = np.where(np.isnan(means), point, means)
    usable = ~np.isnan(point)
    if not usable.any():
        return np.full(means.shape[0], np.nan)
    w = np.where(usable, mix, 0.0)
    return np.nansum(filled * w, axis=-1) / w.sum()


def quantiles(samples: np.ndarray) -> tuple[float | None, float | None]:
    samples = samples[np.isfinite(samples)]
    if samples.size == 0:
        return None, None
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def run_spread_ratio(base: list[float], new: list[float]) -> tuple[float, float] | None:
    """A Welch t interval for mean(log NEW) - mean(log BASE) over per-recording figures, as a ratio; None unless
    each side has two recordings or more with positive figures."""
    base = [math.log(x) for x in base if x and x > 0]
    new = [math.log(x) for x in new if x and x > 0]
    if len(base) < 2 or len(new) < 2:
        return None
    low, high = _welch(base, new)
    return math.exp(low), math.exp(high)


def run_spread_delta(base: list[float], new: list[float]) -> tuple[float, float] | None:
    base, new = [x for x in base if x is not None], [x for x in new if x is not None]
    if len(base) < 2 or len(new) < 2:
        return None
    return _welch(base, new)


def _welch(a: list[float], b: list[float]) -> tuple[float, float]:
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    se = math.sqrt(va + vb)
    diff = float(np.mean(b) - np.mean(a))
    if se == 0:
        return diff, diff
    df = (va + vb) ** 2 / ((va ** 2) / (len(a) - 1) + (vb ** 2) / (len(b) - 1))
    t = _T95[min(int(df), 30) - 1] if df < 31 else 1.645
    return diff - t * se, diff + t * se


def ratio_verdict(low: float | None, high: float | None, m: float, enough: bool) -> str:
    if not enough or low is None or high is None:
        return "inconclusive"
    if low > 1 + m:
        return "slower"
    if high < 1 / (1 + m):
        return "faster"
    if low >= 1 / (1 + m) and high <= 1 + m:
        return "same"
    return "inconclusive"


def share_verdict(low: float | None, high: float | None, m: float, enough: bool) -> str:
    """For a part of the step (idle, a host phase, a cause): its change as a share of BASE's step time."""
    if not enough or low is None or high is None:
        return "inconclusive"
    if low > m:
        return "slower"
    if high < -m:
        return "faster"
    if low >= -m and high <= m:
        return "same"
    return "inconclusive"
