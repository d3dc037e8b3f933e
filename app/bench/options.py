"""`batchscope bench`'s options: argparse only, so that `batchscope --help` lists them without loading torch.
app/cli.py adds them to its `bench` command; run.py parses them when run on its own (`python -m
batchscope.app.bench`) and fills in what another parser left out (`complete`).
"""
from __future__ import annotations

import argparse

from batchscope.engine.config import DTYPES, MODES

DESCRIPTION = ("`batchscope bench`: batchscope's sync and async loops (and transformers' own continuous batching) "
               "on one fixed workload, each set against the memory-bandwidth floor of a decode step.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m",
                   help="preset (smollm2-135m, tiny-random, llama3-8b-random), HF folder or hub id")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument("--tensor-parallel-size", "-tp", type=positive_int, default=1,
                   help="split the model over N GPUs (the transformers baseline is then skipped)")
    p.add_argument("--requests", type=positive_int, default=32)
    p.add_argument("--prompt-tokens", type=positive_int, default=256, help="random token ids per prompt")
    p.add_argument("--new-tokens", type=positive_int, default=512, help="generated per request, EOS ignored")
    p.add_argument("--modes", type=_modes, default=list(MODES), help="comma-separated, e.g. sync,async")
    p.add_argument("--baseline", default="none", choices=["none", "transformers"],
                   help="also time transformers' continuous batching (generate_batch, async off and on)")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="timed rounds; the order reverses every other round; the table shows medians")
    p.add_argument("--seed", type=int, default=0, help="seeds the prompts and the random presets' weights")
    p.add_argument("--warmup-tokens", type=positive_int, default=8, help="new tokens of the untimed warm-up")
    p.add_argument("--max-batch-tokens", type=positive_int, default=None,
                   help="per-step token budget, for both systems (default: enough to prefill all prompts at "
                        "once, between 2048 and 8192)")
    p.add_argument("--num-blocks", type=positive_int, default=None,
                   help="batchscope KV blocks (default: exactly enough for the workload, plus one per request)")
    p.add_argument("--bandwidth-mib", type=positive_int, default=None,
                   help="size of the copy that measures bandwidth (default: 1024 on CUDA, 128 on CPU)")
    p.add_argument("--no-telemetry", action="store_true",
                   help="run batchscope with no observer attached: wall and tokens/s only, no timelines")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--out", default="bench.json", help="results JSON; timelines go next to it")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="batchscope bench", description=DESCRIPTION,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p)
    return p


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


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
    return ns
