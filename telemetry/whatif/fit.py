"""Least-squares fits of one step figure (µs) on a few shape features, kept with their relative residuals so a
simulation can draw realistic noise and extrapolation can be told from interpolation. numpy only."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

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
        return max(MIN_US, sum(c * x.get(n, 1.0 if n == "one" else 0.0) for n, c in zip(self.names, self.coef)))

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
    """Non-negative least squares of rows[target] on rows[names] ("one": the intercept); None without rows.
    A feature that never varies is dropped (its effect is in the intercept); a coefficient that comes out
    negative is dropped and the rest refitted (a step never gets faster with more work)."""
    rows = [r for r in rows if r.get(target) is not None]
    if not rows:
        return None
    y = np.array([float(r[target]) for r in rows])
    cols = {n: np.array([1.0 if n == "one" else float(r.get(n) or 0.0) for r in rows]) for n in names}
    active = [n for n in names if n == "one" or np.ptp(cols[n]) > 0]
    coef = {n: 0.0 for n in names}
    while active:
        a = np.stack([cols[n] for n in active], axis=1)
        solution = np.linalg.lstsq(a, y, rcond=None)[0]
        negative = [n for n, c in zip(active, solution) if c < 0]
        if not negative:
            coef.update(zip(active, (float(c) for c in solution)))
            break
        active.remove(min(negative, key=lambda n: solution[active.index(n)]))
    if not active:
        coef["one"] = float(np.median(y)) if "one" in names else 0.0
    out = Fit(names, [coef[n] for n in names], [], len(rows),
              {n: float(cols[n].max()) for n in names if n != "one"})
    fitted = np.array([out.predict({n: float(cols[n][i]) for n in names}) for i in range(len(rows))])
    out.residuals = [float(v) for v in (y - fitted) / fitted]
    return out


def _r(v, digits: int = 4):
    return None if v is None else round(float(v), digits)
