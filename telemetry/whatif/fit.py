"""Least-squares fits of one step figure (µs) on a few shape features, kept with their relative residuals so a
simulation can draw realistic noise and extrapolation can be told from interpolation. numpy only."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

HUBER_K = 1.345     # the usual Huber constant: 95% efficiency on Gaussian noise
HUBER_PASSES = 6
RIDGE = 0.01        # shrinks a slope the steps determine well by about 1%
MIN_US = 1.0        # a fitted duration is never below this (a negative intercept must not make time run back)


@dataclass
class Fit:
    """y = sum(coef[k] * x[k]) over `names` (each coefficient >= 0), with what it was fitted on."""
    names: tuple[str, ...]
    coef: list[float]
    residuals: list[float] = field(repr=False)        # (measured - fitted) / fitted, per step
    steps: int = 0
    seen_max: dict = field(default_factory=dict)       # the largest value of each feature the fit saw

    def predict(self, x: dict) -> float:
        total = 0.0
        for name, c in zip(self.names, self.coef):
            if c:
                total += c if name == "one" else c * x.get(name, 0.0)
        return max(MIN_US, total)

    def draw(self, x: dict, rng: random.Random | None) -> float:
        """The fitted value times one relative residual drawn from the fit's own (none: the fitted value)."""
        y = self.predict(x)
        if rng is None or not self.residuals:
            return y
        return max(MIN_US, y * (1.0 + rng.choice(self.residuals)))

    def outside(self, x: dict, slack: float = 1.1) -> list[str]:
        """The features of `x` beyond what the fit saw (more than `slack` times its largest)."""
        return [n for n in self.names if n != "one" and x.get(n, 0.0) > slack * self.seen_max.get(n, 0.0)
                and x.get(n, 0.0) > 0]

    def spread(self) -> float | None:
        """Median absolute relative residual: how far one step typically is from the fit."""
        return float(np.median(np.abs(self.residuals))) if self.residuals else None

    def as_dict(self) -> dict:
        return {"us": {n: round(c, 6) for n, c in zip(self.names, self.coef)}, "steps": self.steps,
                "median_abs_residual": _r(self.spread()), "seen_max": {k: _r(v) for k, v in self.seen_max.items()}}


def fit(rows: list[dict], names: tuple[str, ...], target: str) -> Fit | None:
    """Robust non-negative least squares of rows[target] on rows[names] ("one": the intercept); None without
    rows. Huber weights (a few reweighted passes) keep a handful of stalled steps (a busy machine, a collection)
    from bending the line: the stalls stay in the residuals, which the simulation draws from. A feature that
    never varies is dropped (its effect is in the intercept); a negative coefficient is dropped and the rest
    refitted (a step never gets faster with more work)."""
    rows = [r for r in rows if r.get(target) is not None]
    if not rows:
        return None
    y = np.array([float(r[target]) for r in rows])
    x = np.stack([np.array([1.0 if n == "one" else float(r.get(n) or 0.0) for r in rows]) for n in names], axis=1)
    weights = np.ones(len(y))
    coef = np.zeros(len(names))
    for _ in range(HUBER_PASSES):
        coef = _nonnegative(x, y, weights, names)
        resid = y - x @ coef
        scale = 1.4826 * float(np.median(np.abs(resid - np.median(resid)))) or 1.0
        weights = np.minimum(1.0, HUBER_K * scale / np.maximum(np.abs(resid), 1e-12))
    out = Fit(names, [float(c) for c in coef], [], len(rows),
              {n: float(x[:, i].max()) for i, n in enumerate(names) if n != "one"})
    fitted = np.array([out.predict({n: float(x[k, i]) for i, n in enumerate(names)}) for k in range(len(rows))])
    out.residuals = [float(v) for v in (y - fitted) / fitted]
    return out


def _nonnegative(x: np.ndarray, y: np.ndarray, weights: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    active = [i for i, n in enumerate(names) if n == "one" or np.ptp(x[:, i]) > 0]
    root = np.sqrt(weights)
    coef = np.zeros(len(names))
    # a light ridge on every slope (in units of its feature's spread), none on the intercept: where the steps
    # cannot tell two explanations apart (decode rows that hardly vary), the fixed cost takes the time
    penalty = np.sqrt(RIDGE * weights.sum()) * np.array([0.0 if n == "one" else float(np.std(x[:, i]))
                                                        for i, n in enumerate(names)])
    while active:
        a = np.vstack([x[:, active] * root[:, None], np.diag(penalty[active])])
        b = np.concatenate([y * root, np.zeros(len(active))])
        solution = np.linalg.lstsq(a, b, rcond=None)[0]
        negative = [(c, i) for i, c in zip(active, solution) if c < 0]
        if not negative:
            coef[active] = solution
            return coef
        active.remove(min(negative)[1])
    if "one" in names:
        coef[names.index("one")] = float(np.median(y))
    return coef


def _r(v, digits: int = 4):
    return None if v is None else round(float(v), digits)
