"""Whether sync and async differ by more than the machine drifts between stretches: the ratio's spread over the
switches between the modes.

Steps of one stretch share whatever else the machine was doing then (another process, a clock or power change, a
neighbour on a shared host), so their own spread cannot tell a mode's effect from load that shifted between two
stretches: on a busy 2-core machine a one-stretch-a-side interval read async 1.13x-2.22x "faster" where the modes
cannot differ (compute on the host). Each switch gives one ratio, from the stretches either side of it on matched
decode steps; the interval is over those ratios (Student's t on their logs), so load that comes and goes widens
it instead of passing for a mode effect. The scoreboard names a winner only from MIN_SWITCHES switches on, and
never where compute runs on the host (nothing can overlap there: the forecast says so too).
"""
from __future__ import annotations

import math
import statistics

MIN_SWITCHES = 2          # sync -> async -> sync (or the other way): two ratios before a winner is named
MIN_PAIR_STEPS = 8        # matched decode steps each side of a switch for its ratio to count
MAX_SWITCHES = 12         # the newest ones (live: older load says little about now)
# two-sided 90% Student's t by degrees of freedom (beyond the table, the normal's 1.645 plus a little)
_T90 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812}


def switch_interval(ratios: list[float]) -> dict:
    """The geometric mean of the per-switch ratios with its 90% interval ({"n", "ratio", "ci", "ratios"}); ci
    None below two ratios."""
    out = {"n": len(ratios), "needed": MIN_SWITCHES, "ratios": [round(r, 4) for r in ratios], "ratio": None,
           "ci": None}
    logs = [math.log(r) for r in ratios if r > 0]
    if not logs:
        return out
    mean = statistics.fmean(logs)
    out["ratio"] = round(math.exp(mean), 4)
    if len(logs) >= 2:
        half = _T90.get(len(logs) - 1, 1.70) * statistics.stdev(logs) / math.sqrt(len(logs))
        out["ci"] = [round(math.exp(mean - half), 4), round(math.exp(mean + half), 4)]
    return out


def host_compute(runs) -> bool:
    """Every step's compute ran on the host (a CPU engine): no device to overlap with."""
    bases = {rec.get("compute_basis") for run in runs for rec in run}
    return bool(bases) and bases <= {"host"}
