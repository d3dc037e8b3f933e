"""`batchscope bench`'s options: argparse only, so that `batchscope --help` lists them without loading torch.
app/cli.py adds them to its `bench` command; command.py parses them when run on its own (`python -m
batchscope.app.bench`) and fills in what another parser left out (`complete`).
"""
from __future__ import annotations

import argparse

from batchscope.engine.config import MODES

from ..engine_flags import ADAPTIVE, add_engine_flags, non_negative_int, positive_float, positive_int
from ..engine_flags import engine_budget  # noqa: F401  (re-exported: the bench's callers read it here)
from ..help_format import HelpFormatter

DESCRIPTION = ("`batchscope bench`: batchscope's sync and async loops (and transformers' own continuous batching) "
               "on one fixed workload, each set against the memory-bandwidth floor of a decode step; or, with "
               "--workload served, on requests arriving over time with mixed lengths.")
WORKLOADS = ("uniform", "served")
ARRIVALS = ("poisson", "gamma")
SERVED_ONLY = ("rate", "arrival", "burstiness", "max_running")      # options that only a served workload takes
# the engine's flags (app/engine_flags.py) where the bench gives them a meaning of its own
ENGINE_HELPS = {
    "tensor_parallel_size": "split the model over N GPUs (the transformers baseline is then skipped)",
    "seed": "seeds the prompts and the random presets' weights",
    "num_blocks": "batchscope KV blocks (default: exactly enough for the workload, plus one per request)",
    "max_running": "served: requests the engine runs at once (default: 64, as `batchscope serve`); the uniform "
                   "workload runs every request at once",
    "max_batch_tokens": "per-step token budget, for both systems: N (fixed) or 'adaptive' (batchscope chooses per "
                        "step from measured step times; docs/budget.md) (default: uniform, enough to prefill all "
                        "prompts at once, between 2048 and 8192; served, adaptive as `batchscope serve`)",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_engine_flags(p, skip=("mode", "block_size"), defaults={"max_running": None}, helps=ENGINE_HELPS)
    p.add_argument("--workload", default="uniform", choices=WORKLOADS,
                   help="uniform: every request at once, equal lengths; served: arrivals over time (--rate, "
                        "--arrival), lengths drawn from MIN:MAX ranges")
    p.add_argument("--requests", type=positive_int, default=32, help="requests in the workload")
    p.add_argument("--prompt-tokens", type=lengths, default=256,
                   help="random token ids per prompt (served: N or MIN:MAX, drawn per request)")
    p.add_argument("--new-tokens", type=lengths, default=512,
                   help="generated per request, EOS ignored (served: N or MIN:MAX, drawn per request)")
    p.add_argument("--rate", type=positive_float, default=None, help="served: mean arrivals per second")
    p.add_argument("--arrival", default=None, choices=ARRIVALS, help="served: the arrival process (default: poisson)")
    p.add_argument("--burstiness", type=positive_float, default=None,
                   help="served, gamma arrivals: the gaps' shape (1 is Poisson, < 1 burstier, > 1 more regular)")
    p.add_argument("--no-stream", action="store_true",
                   help="served: submit without streaming (no reader thread); latencies from the engine's own "
                        "token times in the timeline")
    p.add_argument("--modes", type=_modes, default=list(MODES),
                   help=f"comma-separated, e.g. sync,async (default: {','.join(MODES)})")
    p.add_argument("--baseline", default="none", choices=["none", "transformers"],
                   help="also time transformers' continuous batching (generate_batch, async off and on)")
    p.add_argument("--baseline-profile-steps", type=non_negative_int, default=32,
                   help="record transformers' steps: after each transformers run, a pass of N new tokens per "
                        "request (about N steps) under torch.profiler, imported into the run's timeline; 0: none")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="timed rounds; the order reverses every other round; the table shows medians")
    p.add_argument("--warmup-tokens", type=positive_int, default=8, help="new tokens of the untimed warm-up")
    p.add_argument("--bandwidth-mib", type=positive_int, default=None,
                   help="size of the copy that measures bandwidth (default: 1024 on CUDA, 128 on CPU)")
    p.add_argument("--no-telemetry", action="store_true",
                   help="run batchscope with no observer attached: wall and tokens/s only, no timelines")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--out", default="bench.json", help="results JSON; timelines go next to it")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="batchscope bench", description=DESCRIPTION,
                                formatter_class=HelpFormatter)
    add_arguments(p)
    return p


def lengths(text: str) -> int | tuple[int, int]:
    """N (one length) or MIN:MAX (a range a served workload draws from, both ends included)."""
    if ":" not in text:
        return positive_int(text)
    lo, _, hi = text.partition(":")
    lo, hi = positive_int(lo), positive_int(hi)
    if lo > hi:
        raise argparse.ArgumentTypeError(f"MIN:MAX with MIN {lo} greater than MAX {hi}")
    return (lo, hi)


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise argparse.ArgumentTypeError(f"modes are a comma-separated subset of {','.join(MODES)}, got {text!r}")
    return list(dict.fromkeys(modes))


def complete(args) -> argparse.Namespace:
    """Fill what another parser (app/cli.py) did not define with our defaults, and normalise a few values."""
    defaults = vars(build_parser().parse_args([]))
    ns = argparse.Namespace(**{**defaults, **{k: v for k, v in vars(args).items() if v is not None}})
    if isinstance(ns.modes, str):
        ns.modes = _modes(ns.modes)
    if ns.baseline in (None, "none"):
        ns.baseline = None
    for name in ("prompt_tokens", "new_tokens"):     # a Namespace from elsewhere may carry "MIN:MAX" or [MIN, MAX]
        v = getattr(ns, name)
        setattr(ns, name, lengths(v) if isinstance(v, str) else tuple(v) if isinstance(v, list) else v)
    return ns


def settle_workload(ns: argparse.Namespace) -> argparse.Namespace:
    """Check the workload's options against each other and fill in the served defaults; ValueError (said plainly,
    exit status 2) for a combination that cannot run. The uniform workload is left exactly as it was."""
    if ns.workload not in WORKLOADS:
        raise ValueError(f"--workload is one of {', '.join(WORKLOADS)}, got {ns.workload!r}")
    budget = ns.max_batch_tokens
    fixed = budget != ADAPTIVE if budget is not None else ns.workload == "uniform"    # uniform's default is fixed
    if ns.itl_target_ms is not None and fixed:
        raise ValueError("--itl-target-ms sizes the adaptive budget: it takes no fixed --max-batch-tokens"
                         + (" (the uniform workload's default is fixed: add --max-batch-tokens adaptive)"
                            if ns.workload == "uniform" else ""))
    if ns.workload == "uniform":
        given = [f"--{k.replace('_', '-')}" for k in SERVED_ONLY if getattr(ns, k, None) is not None]
        ranged = [f"--{k.replace('_', '-')}" for k in ("prompt_tokens", "new_tokens")
                  if isinstance(getattr(ns, k), tuple)]
        given += ["--no-stream"] if getattr(ns, "no_stream", False) else []
        if given or ranged:
            raise ValueError(f"{', '.join(given + [f'{r} MIN:MAX' for r in ranged])} need --workload served "
                             "(the uniform workload submits every request at once, all of one length)")
        return ns
    if ns.rate is None:
        raise ValueError("--workload served needs --rate (mean arrivals per second)")
    if ns.no_stream and ns.no_telemetry:
        raise ValueError("--no-stream takes its token times from the timeline: it needs telemetry (no --no-telemetry)")
    ns.arrival = ns.arrival or "poisson"
    if ns.burstiness is not None and ns.arrival != "gamma":
        raise ValueError("--burstiness shapes gamma arrivals: it needs --arrival gamma")
    ns.burstiness = ns.burstiness or 1.0
    ns.max_running = ns.max_running or 64
    for name in ("prompt_tokens", "new_tokens"):
        v = getattr(ns, name)
        setattr(ns, name, v if isinstance(v, tuple) else (v, v))
    return ns
