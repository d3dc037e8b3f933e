"""`batchscope soak`'s options: app/cli.py adds them to its `soak` command, campaign.py parses them when run on its own
(`python -m batchscope.app.soak`)."""
from __future__ import annotations

import argparse
import os

from ..help_format import HelpFormatter

DESCRIPTION = ("`batchscope soak`: a long mixed load against a running server that checks nothing is lost, repeated "
               "or leaked.")


def positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def fraction(text: str) -> float:
    v = float(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {v}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:7860", help="the running server")
    p.add_argument("--requests", type=positive_int, default=200, help="requests to send in all")
    p.add_argument("--concurrency", type=positive_int, default=8, help="requests in flight at once")
    p.add_argument("--flip-every", type=float, default=0.0,
                   help="seconds between POST /api/mode sync<->async switches (0: never)")
    p.add_argument("--cancel-fraction", type=fraction, default=0.1,
                   help="share of streamed requests the client drops after the first chunk or two")
    p.add_argument("--canary-fraction", type=fraction, default=0.2,
                   help="share of requests that repeat a fixed greedy prompt (their answers must all agree)")
    p.add_argument("--viewers", type=int, default=0,
                   help="websocket viewers on /ws/telemetry during the run (one of them never reads)")
    p.add_argument("--max-new-tokens", type=positive_int, default=32,
                   help="output tokens per request: drawn in [max/4, max]; canaries use max")
    p.add_argument("--max-prompt-words", type=positive_int, default=40, help="random words per prompt, at most")
    p.add_argument("--seed", type=int, default=0, help="seeds the request mix (same seed, same requests)")
    p.add_argument("--token", default=os.environ.get("BATCHSCOPE_TOKEN") or None,
                   help="bearer token, when the server was started with --token (default: $BATCHSCOPE_TOKEN)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a request may stay silent")
    p.add_argument("--settle-timeout", type=float, default=30.0,
                   help="seconds to wait after the run for the server to drain and free its KV blocks")
    p.add_argument("--progress-every", type=float, default=10.0, help="seconds between progress lines (0: none)")
    p.add_argument("--sample-every", type=float, default=5.0,
                   help="seconds between GET /api/status samples (RSS, KV, queue) kept in the report (0: none)")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT", help="write the full report here")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="batchscope soak", description=DESCRIPTION,
                                formatter_class=HelpFormatter)
    add_arguments(p)
    return p
