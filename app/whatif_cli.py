"""`batchscope whatif RECORDING --set KEY=VALUE... [--json FILE] [--verify]`: what another setting would do to a
recorded load (docs/whatif.md). Its parser is argparse only; the prediction (numpy, the engine's scheduler, torch)
loads when the command runs. Exit 0: done; 2: bad input (one line on stderr)."""
from __future__ import annotations

import argparse
import json
import os
import sys


def add_parser(sub) -> None:
    w = sub.add_parser("whatif", help="predict what another setting (budget, running requests, KV size, mode, "
                                      "graphs, load) would do to a recorded load; --verify runs it",
                       description="Replay a recording's requests through the engine's own scheduler on a virtual "
                                   "clock, each step timed by a model fitted to the recording's steps, with the "
                                   "settings changed. Keys: mode, max_batch_tokens (N or adaptive), itl_target_ms, "
                                   "max_running, num_blocks, mixed_graphs (on/off), rate (x the recorded arrival "
                                   "rate); a new load: arrival (burst/poisson/gamma), burstiness, requests, "
                                   "prompt_tokens and new_tokens (N or MIN:MAX), seed. docs/whatif.md.")
    w.add_argument("recording", metavar="RECORDING", help="a batchscope.timeline/1 file (.gz or not) of our engine "
                                                          "serving a load")
    w.add_argument("--set", dest="settings", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="a setting to change (several: --set a=1 b=2, or --set again)")
    w.add_argument("--json", metavar="FILE", default=None, help="write the batchscope.whatif/1 result here")
    w.add_argument("--verify", action="store_true",
                   help="then run the changed configuration for real on the same load and score the prediction")
    w.add_argument("--against", metavar="TIMELINE", default=None,
                   help="score the prediction against a run already made of the same load with these settings "
                        "(a bench or server timeline) instead of running it (--verify)")
    w.add_argument("--runs", type=int, default=3, metavar="N",
                   help="simulations per prediction, each drawing its own step-time noise (the interval)")
    w.set_defaults(func=run)


def _say(msg: str) -> None:
    print(f"batchscope: {msg}", file=sys.stderr, flush=True)


def run(args) -> int:
    from batchscope.telemetry.whatif import WhatIfError, open_recording, parse, predict
    from batchscope.telemetry.whatif.measure import add_measured, add_measured_from
    from batchscope.telemetry.whatif.table import text_lines

    try:
        if not 1 <= args.runs <= 100:
            raise WhatIfError(f"--runs must be from 1 to 100, got {args.runs}")
        settings = parse(args.settings)
        if args.verify and args.against:
            raise WhatIfError("--verify runs the configuration, --against reads a run of it: give one")
        if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
            raise WhatIfError(f"--json {args.json}: its folder does not exist")
        result = predict(open_recording(args.recording), settings, runs=args.runs)
        if args.verify:
            _say("running the changed configuration for real (--verify) ...")
            add_measured(open_recording(args.recording), settings, result)
        elif args.against:
            add_measured_from(result, open_recording(args.against))
    except WhatIfError as exc:
        _say(str(exc))
        return 2
    print("\n".join(text_lines(result)))
    if args.json:
        try:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=1)
        except OSError as exc:
            _say(f"cannot write {args.json}: {exc.strerror or exc}")
            return 2
    return 0


if __name__ == "__main__":          # python -m batchscope.app.whatif_cli RECORDING ... (the same command)
    from .help_format import apply_everywhere

    parser = argparse.ArgumentParser(prog="batchscope")
    add_parser(parser.add_subparsers(dest="command", required=True))
    apply_everywhere(parser)
    ns = parser.parse_args(["whatif", *sys.argv[1:]])
    sys.exit(ns.func(ns))
