"""`batchscope soak`: a long mixed load against a running server that checks nothing is lost, repeated or leaked.

    batchscope soak --url http://127.0.0.1:7860 --requests 2000 --concurrency 32 --flip-every 0.5 --viewers 20

Worker threads send POST /api/generate, /v1/completions and /v1/chat/completions (streamed and not, fixed output
lengths through `ignore_eos`), a share of the streams is dropped by the client after a chunk or two, another thread
flips the loop between sync and async, and websocket viewers watch /ws/telemetry (one of them never reads). Every
answer is checked: its length, its usage, one finish per request, server ids never shared between requests, and
"canary" prompts (greedy, repeated) must answer the same tokens whatever the mode, batch or preemptions. At the end
the server must be idle again with its KV blocks back to where they started.

The requests go through the standard library (http.client and threads); the viewers need the `websockets`
package and are left out, with a note in the report, where it is not installed. So it runs on a GPU box with
nothing but the server's install. Here: the run and `main`; arguments.py has the command line, client.py the
requests and their checks, viewers.py the side threads, findings.py the verdict. Exit status: 0 when every check
passed, 1 when one failed, 2 when the server could not be reached.
"""
from __future__ import annotations

import json
import sys
import threading
import time

from .client import Client, Outcome, fail_outcome, make_plans, run_one
from .arguments import build_parser
from .findings import SoakRun, format_report, report
from .viewers import Flipper, Viewer

__all__ = ["main", "run_soak"]


def _say(msg: str) -> None:
    print(f"soak: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------- the run

def _status(client: Client) -> dict:
    code, body = client.call("GET", "/api/status")
    if code != 200 or not isinstance(body, dict):
        raise RuntimeError(f"GET /api/status answered {code}: {str(body)[:300]}")
    return body


def _reach(client: Client, url: str) -> dict:
    """GET /api/health, or ConnectionError saying why this server cannot be soaked."""
    try:
        code, health = client.call("GET", "/api/health", timeout=10)
    except OSError as e:
        raise ConnectionError(f"cannot reach {url}: {e!r}") from None
    if code != 200 or not isinstance(health, dict) or health.get("status") != "ok":
        raise ConnectionError(f"GET /api/health on {url} answered {code}: {str(health)[:300]}")
    if health.get("replay_only"):
        raise ConnectionError(f"{url} is replay-only: no model to load")
    return health


def settle(client: Client, kv_start: int | None, timeout: float) -> tuple[dict, bool]:
    """Wait for nothing running or queued and the KV blocks back at the start value; True when that happened."""
    deadline = time.monotonic() + timeout
    while True:
        st = _status(client)
        # `inflight` (handles the server has not seen finish) is absent on older servers
        idle = not (st.get("queue") or st.get("running") or st.get("bursts_running") or st.get("inflight"))
        if idle and (kv_start is None or st.get("kv_blocks_used") == kv_start):
            return st, True
        if time.monotonic() > deadline:
            return st, False
        time.sleep(0.25)


class RequestWorkers:
    """`concurrency` threads that take the plans in order and run each one; a client-side bug shows up as a
    failed request, never as a hang."""

    def __init__(self, client: Client, plans: list, concurrency: int):
        self.client, self.plans = client, plans
        self.outcomes: list[Outcome | None] = [None] * len(plans)
        self._next = 0
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._work, name=f"soak-worker-{k}", daemon=True)
                        for k in range(min(concurrency, len(plans)))]
        for t in self.threads:
            t.start()

    def _work(self) -> None:
        while True:
            with self._lock:
                i = self._next
                if i >= len(self.plans):
                    return
                self._next += 1
            plan = self.plans[i]
            try:
                self.outcomes[i] = run_one(self.client, plan)
            except Exception as e:      # noqa: BLE001 - reported as this request's failure
                self.outcomes[i] = fail_outcome(Outcome(i, plan.route, plan.stream), "error", "client_exception",
                                                repr(e))

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def done(self) -> list[Outcome]:
        return [o for o in self.outcomes if o is not None]


class StatusSampler:
    """GET /api/status now and then during the run: RSS, KV, queue and the viewers the server counts."""

    def __init__(self, client: Client, t0: float):
        self.client, self.t0 = client, t0
        self.samples: list[dict] = []
        self.errors: list[str] = []

    def take(self, done: int) -> dict:
        try:
            st = _status(self.client)
        except (OSError, RuntimeError) as e:
            self.errors.append(repr(e))
            return {}
        hub = (st.get("telemetry") or {}).get("hub") or {}
        self.samples.append({"t_s": round(time.perf_counter() - self.t0, 1), "done": done,
                             "rss_mb": st.get("rss_mb"), "kv_blocks_used": st.get("kv_blocks_used"),
                             "queue": st.get("queue"), "running": st.get("running"), "inflight": st.get("inflight"),
                             "mode": st.get("mode"), "viewers": hub.get("subscribers"),
                             "hub_dropped_frames": hub.get("dropped_frames"),
                             "hub_queued_bytes": hub.get("queued_bytes")})
        return self.samples[-1]


def _start_viewers(client: Client, args, stop: threading.Event) -> tuple[list[Viewer], str | None]:
    if args.viewers <= 0:
        return [], None
    try:
        import websockets.sync.client  # noqa: F401
    except ImportError:
        note = "websockets is not installed: no viewers were started"
        _say(note)
        return [], note
    viewers = [Viewer(i, client, args.token, stalled=(i == 0), stop=stop) for i in range(args.viewers)]
    for v in viewers:
        v.start()
    for v in viewers:
        v.connected.wait(60)
    return viewers, None


def _watch(workers: RequestWorkers, sampler: StatusSampler, flipper: Flipper | None, args, t0: float) -> None:
    """Until every request has run: status samples and progress lines, at their own intervals."""
    last_progress = last_sample = time.monotonic()
    while workers.alive():
        time.sleep(0.2)
        now = time.monotonic()
        if args.sample_every and now - last_sample >= args.sample_every:
            last_sample = now
            sampler.take(len(workers.done()))
        if args.progress_every and now - last_progress >= args.progress_every:
            last_progress = now
            done = workers.done()
            rss = sampler.samples[-1].get("rss_mb") if sampler.samples else None
            _say(f"{len(done)}/{len(workers.plans)} done, {sum(o.bad for o in done)} failed, "
                 f"{flipper.done if flipper else 0} flips, {time.perf_counter() - t0:.0f} s"
                 + (f", server RSS {rss} MB" if rss is not None else ""))


def run_soak(args) -> dict:
    client = Client(args.url, args.token, args.timeout)
    health = _reach(client, args.url)
    status_start = _status(client)
    plans = make_plans(args)
    start_mode = health.get("mode") or "async"
    stop = threading.Event()
    viewers, viewer_note = _start_viewers(client, args, stop)
    flipper = Flipper(client, args.flip_every, start_mode, stop) if args.flip_every > 0 else None
    t0 = time.perf_counter()
    if flipper:
        flipper.start()
    workers = RequestWorkers(client, plans, args.concurrency)
    sampler = StatusSampler(client, t0)
    _watch(workers, sampler, flipper, args, t0)
    wall = time.perf_counter() - t0
    at_end = sampler.take(len(workers.done())) if viewers else {}   # the viewers the server counts, before they go
    stop.set()
    if flipper:
        flipper.join(30)
    for v in viewers:
        v.join(30)
    if flipper and flipper.mode != start_mode:      # leave the server in the mode we found it in
        try:
            client.call("POST", "/api/mode", {"mode": start_mode})
        except OSError:
            pass
    status_end, settled = settle(client, status_start.get("kv_blocks_used"), args.settle_timeout)
    return report(SoakRun(args=args, plans=plans, outcomes=workers.done(), wall_s=wall, health=health,
                          status_start=status_start, status_end=status_end, settled=settled, flipper=flipper,
                          viewers=viewers, viewer_note=viewer_note, samples=sampler.samples,
                          status_errors=sampler.errors, at_end=at_end))


def main(args=None) -> int:
    """Entry point for `batchscope soak` (app/cli.py passes its Namespace) and `python -m batchscope.app.soak`."""
    if args is None or isinstance(args, (list, tuple)):
        args = build_parser().parse_args(args)
    if args.flip_every < 0:
        _say("--flip-every must be >= 0")
        return 2
    try:
        res = run_soak(args)
    except (ConnectionError, RuntimeError, ValueError) as e:
        _say(str(e))
        return 2
    print(format_report(res), flush=True)
    if args.json_out:
        from pathlib import Path

        path = Path(args.json_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=1) + "\n")
        _say(f"wrote {path}")
    return 0 if res["ok"] else 1
