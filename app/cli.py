"""`batchscope serve | replay | import | compare | whatif | bench | soak | sweep`: the command line.

It imports nothing heavy until a command runs: `batchscope --help` and `--version` load neither torch nor the web
server. Each command imports what it needs inside its function (the server, the engine, the bench's runners).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time

from batchscope import __version__
from .bench import flags as bench_options
from .engine_flags import add_engine_flags, engine_config_from, positive_float, positive_int
from .help_format import apply_everywhere
from .loadtest.sweep import remote as sweep_client
from .soak import arguments as soak_options
from .whatif_cli import add_parser as add_whatif_parser

DEFAULT_PORT = 7860


def main(argv: list[str] | None = None) -> int:
    _log_to_stderr()
    parser = build_parser()
    args = parser.parse_args(compare_sides(sys.argv[1:] if argv is None else list(argv)))
    rc = args.func(args)
    if "torch" in sys.modules:     # a tensor-parallel run on CUDA exits without tearing its NCCL group down
        from batchscope.engine.parallel.ranks import leave
        rc = leave(rc)
    return rc


def _log_to_stderr() -> None:
    """The library logs under "batchscope" (the engine's notes, a failed rank, a bug it survived); the command
    line shows them on stderr as it shows its own messages."""
    log = logging.getLogger("batchscope")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("batchscope: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="batchscope", description="An oscilloscope for LLM continuous batching.")
    p.add_argument("--version", action="version", version=f"batchscope {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="load a model and serve the UI, the JSON and OpenAI routes and the telemetry")
    add_engine_flags(s)
    s.add_argument("--cpu-threads", type=positive_int, default=None, metavar="N",
                   help="a CPU engine's math threads (default: every core but one when serving this machine's "
                        "own browser, which draws the page from the same cores; else torch's default)")
    s.add_argument("--nice", type=niceness, default=None, metavar="N",
                   help="a CPU engine's steps at Linux niceness N, 0-19 (default: 10 when serving this machine's "
                        "own browser, so the page is drawn first; else 0)")
    s.add_argument("--profile-steps", type=int, default=None, metavar="N",
                   help="run torch.profiler over the first N steps after start-up (GET /api/profile for the trace)")
    _limit_args(s)
    _server_args(s)
    s.set_defaults(func=cmd_serve)

    r = sub.add_parser("replay", help="open the UI on a recorded timeline or a profiler trace, without loading a model")
    r.add_argument("file", help="a batchscope.timeline/1 JSON file (GET /api/timeline.json saves one), a profiler "
                                "trace (vLLM, SGLang, transformers or torch.profiler Kineto JSON, .gz or not), or a "
                                "folder of a run's traces (one per rank): traces are imported on the fly")
    _server_args(r)
    r.set_defaults(func=cmd_replay)

    _add_import_parser(sub)
    _add_compare_parser(sub)
    add_whatif_parser(sub)

    # the tools' options are defined once, in their own flags.py and arguments.py (argparse only); the engine's
    # flags, shared by serve and bench, in engine_flags.py
    b = sub.add_parser("bench", help="time sync vs async (and a transformers baseline) on one workload")
    bench_options.add_arguments(b)
    b.set_defaults(func=cmd_bench)

    k = sub.add_parser("soak", help="a long mixed load against a running server: checks nothing is lost, "
                                    "repeated or leaked")
    soak_options.add_arguments(k)
    k.set_defaults(func=cmd_soak)

    w = sub.add_parser("sweep", help="sweep offered load on a running server, in each mode: synchronous, "
                                     "throughput, then rates between; writes batchscope.sweep/1 JSON")
    sweep_client.add_arguments(w)
    w.set_defaults(func=cmd_sweep)
    return apply_everywhere(p)        # one formatter and one way of saying defaults, for every subcommand


# On a GPU the engine thread lets go of the GIL in each CUDA call (event record, graph replay, synchronize) and
# must take it back from the server's event loop, which holds it up to the switch interval: with Python's 5 ms,
# on an H200 at 60 req/s the engine waited 0.57 s in a 25 s run (busy 93.5%, engine token gap p99 20.7 ms);
# with 0.5 ms, 0.14 s (97.8%, 13.1 ms), the clients' ITL no worse (docs/BENCHMARKS.md (x)). Unmeasured on a
# CPU engine, whose steps compute in torch with the GIL released: Python's own there.
GPU_SWITCH_INTERVAL_MS = 0.5


def switch_interval_ms(asked: float | None, device: str | None) -> float | None:
    """The GIL switch interval a server runs with: the one asked for, else the GPU default, else None (Python's)."""
    if asked:
        return asked
    return GPU_SWITCH_INTERVAL_MS if device and device.startswith("cuda") else None


def _server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="bind address; anything but loopback needs --token")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="the port to serve on")
    p.add_argument("--token", default=os.environ.get("BATCHSCOPE_TOKEN") or None,
                   help="require this bearer token on every request (default: $BATCHSCOPE_TOKEN)")
    p.add_argument("--no-ui", action="store_true", help="serve the API and websocket only (no Gradio)")
    p.add_argument("--open", action="store_true", help="open the UI in a browser once the server is up")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                   help="the web server's log level")
    p.add_argument("--switch-interval-ms", type=positive_float, default=None,
                   help="how long a Python thread may hold the GIL while another waits for it (default: "
                        f"{GPU_SWITCH_INTERVAL_MS} on a GPU, else Python's 5 ms); a smaller one returns it to the "
                        "engine thread sooner after each call into CUDA")


def _limit_args(p: argparse.ArgumentParser) -> None:
    from .loadtest.specs import Limits

    d = Limits()
    p.add_argument("--max-prompt-tokens", type=positive_int, default=d.max_prompt_tokens,
                   help="refuse a request with a longer prompt (400)")
    p.add_argument("--max-new-tokens", type=positive_int, default=d.max_new_tokens,
                   help="refuse a request asking for more tokens (400)")
    p.add_argument("--max-burst-requests", type=positive_int, default=d.max_burst_requests,
                   help="requests in one burst (and prompts in one completions request) at most")
    p.add_argument("--max-concurrent-bursts", type=positive_int, default=d.max_concurrent_bursts,
                   help="bursts running at once at most")
    p.add_argument("--max-waiting-requests", type=positive_int, default=d.max_waiting_requests,
                   help="requests waiting for the engine at most; more is a 429")


def _say(msg: str) -> None:
    print(f"batchscope: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------- commands

def cmd_serve(args) -> int:
    from batchscope.engine.model.loading import preflight

    from .loadtest.specs import Limits
    from .server import check_bind
    from .server.state import AppState

    try:
        check_bind(args.host, args.token)
        _check_profile_steps(args.profile_steps)
        config = engine_config_from(args)
        config.cpu_threads, config.nice = share_with_page(config.device, args.host, args.cpu_threads, args.nice)
        preflight(config.model)       # a broken or refused checkpoint folder: one line, before "loading ..."
    except ValueError as e:
        _say(str(e))
        return 2
    limits = Limits(max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens,
                    max_burst_requests=args.max_burst_requests, max_concurrent_bursts=args.max_concurrent_bursts,
                    max_waiting_requests=args.max_waiting_requests)
    try:
        with _Ticker(f"loading {args.model} on {args.device}"):
            state = AppState.load(config, limits)
    except ValueError as e:          # ConfigError: a model refused at load, or a broken checkpoint folder
        _say(str(e))
        return 2
    info = state.engine.info
    threads = f", {info['cpu_threads']} of {os.cpu_count()} cores" if info.get("cpu_threads") else ""
    threads += f", nice {info['nice']}" if info.get("nice") else ""
    _say(f"loaded {info.get('model')} on {info.get('device')} ({info.get('dtype')}{threads}), mode {state.engine.mode}")
    if args.profile_steps:
        state.profiler.start(args.profile_steps)
        _say(f"profiling the first {args.profile_steps} steps: GET /api/profile, then its trace_url")
    return _serve(state, args)


def share_with_page(device: str, host: str, threads: int | None = None,
                    nice: int | None = None) -> tuple[int | None, int]:
    """A CPU engine's (math threads, niceness) for `serve`: what was asked, or, when the page is drawn on this
    machine (a loopback bind) and the engine computes on its CPU, every core but one and niceness 10. torch takes
    every core and the browser then waits for one: on a 2-core machine a chart's 40 ms redraw stretched past 100 ms,
    a visible stall; with a core left and the steps at a lower priority the worst frame gap was 50 ms
    (docs/BENCHMARKS.md (q)). A page drawn elsewhere or a GPU engine: torch's threads, niceness 0."""
    import torch

    from batchscope.engine.model.loading import resolve_device

    from .server.app import is_loopback

    if not is_loopback(host) or resolve_device(device).type != "cpu":
        return threads, nice or 0
    cores = os.cpu_count() or 1
    if threads is None and cores >= 2:
        threads = min(torch.get_num_threads(), cores - 1)
    return threads, 10 if nice is None else nice


def niceness(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 19:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to 19, got {text!r}")
    return value


def _check_profile_steps(steps: int | None) -> None:
    if steps is None:
        return
    from batchscope.engine.profiling import MAX_WINDOW_STEPS

    if not 1 <= steps <= MAX_WINDOW_STEPS:
        raise ValueError(f"--profile-steps must be from 1 to {MAX_WINDOW_STEPS}, got {steps}")


def cmd_replay(args) -> int:
    from batchscope.telemetry import TimelineError

    from .server import check_bind
    from .server.state import AppState

    try:
        check_bind(args.host, args.token)
    except ValueError as e:
        _say(str(e))
        return 2
    from .trace_import import progress_bar

    try:
        with progress_bar(f"importing {os.path.basename(args.file)}") as progress:   # shown only for a trace
            state = AppState.from_replay_file(args.file, progress=progress)
    except (TimelineError, ValueError, OSError) as e:
        _say(f"cannot replay {args.file}: {e}")
        return 2
    imported = " (a profiler trace, imported)" if state.replay["meta"].get("source") else ""
    _say(f"replaying {args.file}{imported}: {len(state.replay.get('steps', []))} steps, no model loaded")
    return _serve(state, args)


def _add_import_parser(sub) -> None:
    i = sub.add_parser("import", help="turn profiler traces (vLLM, SGLang, transformers, torch.profiler) into a "
                                      "timeline", description="Import Kineto / torch.profiler traces (JSON, .gz or "
                                      "not) as a batchscope.timeline/1 file; docs/import.md.")
    i.add_argument("traces", nargs="+", metavar="TRACE",
                   help="a trace file or a folder of them; several: the ranks of one run")
    i.add_argument("-o", "--output", metavar="OUT", default=None,
                   help="the timeline to write (.gz: gzipped; default: beside the first trace, NAME.timeline.json)")
    i.add_argument("--kernels", action="store_true", help="also keep every device op, for the Perfetto export")
    i.add_argument("--workers", type=positive_int, default=None, metavar="N",
                   help="processes parsing a large file (default: one per core; 1: this process only)")
    i.add_argument("--partial", action="store_true",
                   help="import the part of a truncated trace that was written, instead of refusing it")
    i.set_defaults(func=cmd_import)


def cmd_import(args) -> int:
    from .trace_import import run          # numpy and the importer load here

    return run(args.traces, args.output, args.kernels, args.workers, args.partial)


def _add_compare_parser(sub) -> None:
    c = sub.add_parser("compare", help="which change made it slower: two sets of recordings compared step by step "
                                       "at matched batch shapes, with a verdict that knows its noise",
                       usage="batchscope compare BASE... [-- NEW...] [--json FILE] [--markdown FILE] "
                             "[--fail-above PCT] [--min-effect PCT]",
                       description="Compare BASE and NEW recordings (timeline JSON, .gz or not; a bench result, "
                                   "BENCH.json#LABEL for one label's runs; a profiler trace; a server's URL). One "
                                   "a side: compare BASE NEW; several: compare B1 B2 -- N1 N2. Exit 0: nothing "
                                   "regressed beyond --fail-above; 1: it did; 2: bad input. docs/compare.md.")
    c.add_argument("recordings", nargs="+", metavar="BASE", help="BASE's recordings (and NEW's, with no --)")
    c.add_argument("--new", nargs="*", default=None, metavar="NEW", help=argparse.SUPPRESS)   # what -- becomes
    c.add_argument("--json", metavar="FILE", default=None, help="write the batchscope.compare/1 result here")
    c.add_argument("--markdown", metavar="FILE", default=None, help="write a Markdown report (a PR comment) here")
    c.add_argument("--fail-above", type=float, default=None, metavar="PCT",
                   help="exit 1 when the device step time is `slower` by more than PCT percent")
    c.add_argument("--min-effect", type=float, default=None, metavar="PCT",
                   help="the smallest change called a change (default: 3%% on a GPU, 10%% on a CPU with one "
                        "recording a side; 1%% / 3%% with several)")
    c.set_defaults(func=cmd_compare)


def compare_sides(argv: list[str]) -> list[str]:
    """`compare A1 A2 -- B1 B2`: the `--` between the sides becomes the hidden --new option, since argparse
    would otherwise drop it and merge the sides."""
    if argv[:1] == ["compare"] and "--" in argv:
        cut = argv.index("--")
        return argv[:cut] + ["--new"] + argv[cut + 1:]
    return argv


def cmd_compare(args) -> int:
    from batchscope.telemetry.comparison.compare_command import run       # numpy loads here

    return run(args.recordings, args.new, args.json, args.markdown, args.fail_above, args.min_effect)


def cmd_bench(args) -> int:
    from .bench import command          # torch and transformers load here

    return command.main(args) or 0


def cmd_soak(args) -> int:
    from .soak import campaign

    return campaign.main(args)


def cmd_sweep(args) -> int:
    return sweep_client.main(args)        # an HTTP client of the server: no torch, no engine here


def _serve(state, args) -> int:
    import uvicorn

    from .server import create_app, uvicorn_config

    interval = switch_interval_ms(args.switch_interval_ms, (state.engine.info if state.engine else {}).get("device"))
    if interval:
        sys.setswitchinterval(interval / 1000)
    try:
        if not args.no_ui:
            _say("building the UI")
        app = create_app(state, token=args.token, ui=not args.no_ui, close_state=True)
        server = uvicorn.Server(uvicorn_config(app, args.host, args.port, args.log_level))
    except Exception:
        state.close()
        raise
    host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{host}:{args.port}/" + (f"?token={args.token}" if args.token else "")
    threading.Thread(target=_announce, args=(server, url, args.open), daemon=True).start()
    try:
        server.run()                    # the lifespan closes the engine on shutdown
    except KeyboardInterrupt:
        pass                            # uvicorn shut down cleanly, then re-raised Ctrl-C for the default handler
    finally:
        state.close()                   # no-op when the lifespan already did it; needed if start-up failed
    return 0 if server.started else 1


def _announce(server, url: str, open_browser: bool) -> None:
    while not server.started and not server.should_exit:
        time.sleep(0.05)
    if server.started:
        _say(f"serving on {url}")
        if open_browser:
            import webbrowser
            webbrowser.open(url)


class _Ticker:
    """Says what is slow while it runs: the first start converts the embedded model, which takes a while."""

    def __init__(self, what: str, every: float = 5.0):
        self.what, self.every = what, every
        self.done = threading.Event()

    def __enter__(self):
        self.t0 = time.monotonic()
        _say(f"{self.what} ...")
        threading.Thread(target=self._tick, daemon=True).start()
        return self

    def _tick(self):
        while not self.done.wait(self.every):
            _say(f"{self.what} ... {time.monotonic() - self.t0:.0f} s")

    def __exit__(self, exc_type, exc, tb):
        self.done.set()
        if exc_type is None:
            _say(f"{self.what}: done in {time.monotonic() - self.t0:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
