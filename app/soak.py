"""`batchscope soak`: a long mixed load against a running server that checks nothing is lost, repeated or leaked.

    batchscope soak --url http://127.0.0.1:7860 --requests 2000 --concurrency 32 --flip-every 0.5 --viewers 20

Worker threads send POST /api/generate, /v1/completions and /v1/chat/completions (streamed and not, fixed output
lengths through `ignore_eos`), a share of the streams is dropped by the client after a chunk or two, another thread
flips the loop between sync and async, and websocket viewers watch /ws/telemetry (one of them never reads). Every
answer is checked: its length, its usage, one finish per request, server ids never shared between requests, and
"canary" prompts (greedy, repeated) must answer the same tokens whatever the mode, batch or preemptions. At the end
the server must be idle again with its KV blocks back to where they started.

The client side is the standard library only (http.client and threads; `websockets` for viewers when importable),
so that it runs on a GPU box with nothing but the server installed. Exit status: 0 when every check passed, 1
when one failed, 2 when the server could not be reached.
"""
from __future__ import annotations

import argparse
import collections
import http.client
import json
import math
import os
import random
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

ROUTES = {"generate": "/api/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}
# a small fixed vocabulary: prompts stay printable and tokenize the same on any tokenizer
WORDS = ("apple river stone cloud engine batch token window garden silver quiet north copper lamp orbit "
         "paper signal harbor maple violet thunder pixel candle meadow falcon ember glacier lantern").split()
CANARY_PROMPTS = ("The quick brown fox jumps over the lazy dog, again and again,",
                  "Once upon a time in a small harbor town there lived",
                  "List the planets of the solar system in order:")
MAX_FAILURES_KEPT = 50              # detailed examples in the report; the counts cover everything


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
    p = argparse.ArgumentParser(prog="batchscope soak", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p)
    return p


def _say(msg: str) -> None:
    print(f"soak: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ the plan

@dataclass
class Plan:
    n: int
    marker: str                     # unique per request: in the prompt, and as `user` on the OpenAI routes
                                    # (canaries share their prompt on purpose)
    route: str
    stream: bool
    max_new_tokens: int
    prompt: str
    chat: bool                      # /api/generate only: through the chat template or raw
    temperature: float
    seed: int
    canary: int | None = None       # index into CANARY_PROMPTS
    cancel_after: int = 0           # > 0: drop the connection after this many output chunks


def make_plans(args) -> list[Plan]:
    rng = random.Random(args.seed)
    run = f"{args.seed:x}{rng.randrange(16 ** 6):06x}"
    plans = []
    for n in range(args.requests):
        route = rng.choice(tuple(ROUTES))
        stream = rng.random() < 0.5
        marker = f"soak-{run}-{n:06d}"
        canary = rng.randrange(len(CANARY_PROMPTS)) if rng.random() < args.canary_fraction else None
        if canary is not None:
            prompt, length, temperature = CANARY_PROMPTS[canary], args.max_new_tokens, 0.0
        else:
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, args.max_prompt_words)))
            prompt = f"[{marker}] {words}"
            length = rng.randint(max(1, args.max_new_tokens // 4), args.max_new_tokens)
            temperature = rng.choice((0.0, 0.7))
        cancel = stream and rng.random() < args.cancel_fraction
        plans.append(Plan(n, marker, route, stream, length, prompt, chat=rng.random() < 0.5,
                          temperature=temperature, seed=rng.randrange(2 ** 31), canary=canary,
                          cancel_after=rng.randint(1, 2) if cancel else 0))
    return plans


def payload(plan: Plan) -> dict:
    if plan.route == "generate":
        # canaries go raw: all answers to one canary on this route share one prompt
        return {"prompt": plan.prompt, "max_new_tokens": plan.max_new_tokens, "ignore_eos": True,
                "temperature": plan.temperature, "seed": plan.seed, "stream": plan.stream,
                "chat": plan.chat and plan.canary is None}
    body = {"max_tokens": plan.max_new_tokens, "ignore_eos": True, "temperature": plan.temperature,
            "seed": plan.seed, "stream": plan.stream, "user": plan.marker}
    if plan.stream:
        body["stream_options"] = {"include_usage": True}
    if plan.route == "chat":
        body["messages"] = [{"role": "user", "content": plan.prompt}]
    else:
        body["prompt"] = plan.prompt
    return body


# ------------------------------------------------------------------------------------------------ outcomes

@dataclass
class Outcome:
    n: int
    route: str
    stream: bool
    status: str = "lost"            # completed | cancelled | error | lost
    kind: str | None = None         # why, for error and lost
    detail: str | None = None
    sent: bool = False
    duplicated: bool = False
    wrong_length: bool = False
    output_tokens: int | None = None
    expected_tokens: int = 0
    e2e_s: float | None = None
    ttft_s: float | None = None
    server_id: str | None = None
    answer: list | str | None = None    # token ids (generate) or text, kept for canaries

    @property
    def bad(self) -> bool:
        return self.status in ("error", "lost") or self.duplicated or self.wrong_length


class Client:
    """One fresh HTTP/1.1 connection per request: closing it is how a stream is dropped mid-way."""

    def __init__(self, url: str, token: str | None, timeout: float):
        u = urlsplit(url if "://" in url else f"http://{url}")
        if u.scheme not in ("http", "https"):
            raise ValueError(f"--url must be http:// or https://, got {url!r}")
        self.https = u.scheme == "https"
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json", "Accept": "*/*"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.ws_url = ("wss" if self.https else "ws") + f"://{u.netloc}{self.prefix}/ws/telemetry"

    def connection(self, timeout: float | None = None) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout or self.timeout)

    def call(self, method: str, path: str, body: dict | None = None, timeout: float = 30.0) -> tuple[int, object]:
        conn = self.connection(timeout)
        try:
            conn.request(method, self.prefix + path, body=None if body is None else json.dumps(body),
                         headers=self.headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw.decode("utf-8", "replace")


def sse_events(resp):
    """The `data:` payloads of a server-sent-event stream (bytes), until the server closes it."""
    data: list[bytes] = []
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.rstrip(b"\r\n")
        if not line:
            if data:
                yield b"\n".join(data)
                data = []
        elif line.startswith(b"data:"):
            data.append(line[5:].lstrip())


def run_one(client: Client, plan: Plan) -> Outcome:
    out = Outcome(plan.n, plan.route, plan.stream, expected_tokens=plan.max_new_tokens)
    conn = client.connection()
    t0 = time.perf_counter()
    try:
        try:
            conn.request("POST", client.prefix + ROUTES[plan.route], body=json.dumps(payload(plan)),
                         headers=client.headers)
            out.sent = True
            resp = conn.getresponse()
        except (TimeoutError, socket.timeout):
            return _fail(out, "lost", "timeout", "no response headers within --timeout")
        except (OSError, http.client.HTTPException) as e:
            kind = "connect" if not out.sent else "no_response"
            return _fail(out, "error" if kind == "connect" else "lost", kind, repr(e))
        if resp.status != 200:
            body = resp.read()[:500].decode("utf-8", "replace")
            return _fail(out, "error", f"http_{resp.status}", body)
        try:
            if plan.stream:
                _read_stream(plan, resp, out, t0, conn)
            else:
                _read_whole(plan, resp, out)
        except (TimeoutError, socket.timeout):
            _fail(out, "lost", "timeout", "silent for --timeout in the middle of the answer")
        except (OSError, http.client.HTTPException) as e:
            _fail(out, "lost", "cut_off", repr(e))
        if out.status in ("completed", "cancelled") and out.e2e_s is None:
            out.e2e_s = time.perf_counter() - t0
        return out
    finally:
        conn.close()


def _fail(out: Outcome, status: str, kind: str, detail: str) -> Outcome:
    out.status, out.kind, out.detail = status, kind, detail[:500]
    return out


def _read_whole(plan: Plan, resp, out: Outcome) -> None:
    raw = resp.read()
    try:
        body = json.loads(raw)
    except ValueError:
        _fail(out, "lost", "bad_json", raw[:300].decode("utf-8", "replace"))
        return
    if plan.route == "generate":
        out.server_id = body.get("id")
        ids = body.get("token_ids") or []
        out.output_tokens, out.answer = body.get("output_tokens"), ids
        finish = body.get("finish_reason")
        if body.get("error") or finish == "error":
            _fail(out, "error", "engine_error", str(body.get("error")))
            return
        if len(ids) != out.output_tokens:
            _note(out, "wrong_length", f"{len(ids)} token ids but output_tokens {out.output_tokens}")
    else:
        out.server_id = body.get("id")
        choices = body.get("choices") or []
        usage = body.get("usage") or {}
        out.output_tokens = usage.get("completion_tokens")
        if len(choices) != 1:
            out.status = "completed"            # answered, but not with exactly one choice
            _note(out, "duplicated" if len(choices) > 1 else "wrong_length", f"{len(choices)} choices")
            return
        c = choices[0]
        out.answer = c.get("text") if plan.route == "completions" else (c.get("message") or {}).get("content")
        finish = c.get("finish_reason")
    if not out.wrong_length and out.output_tokens != plan.max_new_tokens:
        _note(out, "wrong_length", f"{out.output_tokens} tokens, asked for {plan.max_new_tokens} with ignore_eos")
    elif finish != "length":
        _note(out, "wrong_length", f"finish_reason {finish!r}, expected 'length'")
    out.status = "completed"


def _note(out: Outcome, what: str, detail: str) -> None:
    setattr(out, what, True)
    out.detail = (f"{out.detail}; " if out.detail else "") + detail


def _read_stream(plan: Plan, resp, out: Outcome, t0: float, conn) -> None:
    """Follows one SSE answer. Counts output chunks (for TTFT and the cancel point), finishes, usage and ids."""
    chunks = finishes = 0
    after_finish = 0                # events past the finish other than the usage chunk
    streamed_ids: list[int] = []
    text: list[str] = []
    usage = final_tokens = finish = None
    ids_seen: set[str] = set()
    done = False
    for raw in sse_events(resp):
        if raw == b"[DONE]":
            done = True
            break
        try:
            ev = json.loads(raw)
        except ValueError:
            _fail(out, "error", "bad_event", raw[:300].decode("utf-8", "replace"))
            return
        if ev.get("error") is not None:        # the finish of /api/generate carries "error": null
            _fail(out, "error", "stream_error", json.dumps(ev)[:500])
            return
        if ev.get("id") is not None:
            ids_seen.add(ev["id"])
        output = is_finish = False
        if plan.route == "generate":
            tok = ev.get("token_ids") or []
            output = bool(tok) or bool(ev.get("delta"))
            if finishes:
                after_finish += 1
            streamed_ids += tok
            text.append(ev.get("delta") or "")
            if ev.get("finished"):
                is_finish, finish, final_tokens = True, ev.get("finish_reason"), ev.get("output_tokens")
        else:
            if ev.get("usage") is not None:
                if usage is not None:
                    _note(out, "duplicated", "two usage chunks")
                usage = ev["usage"]
            for c in ev.get("choices") or []:
                piece = c.get("text") if plan.route == "completions" else (c.get("delta") or {}).get("content")
                if finishes:
                    after_finish += 1
                if piece:
                    output = True
                    text.append(piece)
                if c.get("finish_reason") is not None:
                    is_finish, finish = True, c["finish_reason"]
        if output:
            chunks += 1
            if out.ttft_s is None:
                out.ttft_s = time.perf_counter() - t0
        finishes += is_finish
        if plan.cancel_after and chunks >= plan.cancel_after and not finishes:
            # hang up mid-stream: the server must cancel the request and free its blocks
            out.e2e_s = time.perf_counter() - t0
            out.status = "cancelled"
            out.server_id = next(iter(ids_seen), None)
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except (OSError, AttributeError):
                pass
            resp.close()
            return
    out.server_id = next(iter(ids_seen), None)
    if not done:
        if finishes:
            _fail(out, "lost", "no_done", "the stream ended after its finish but without [DONE]")
        else:
            _fail(out, "lost", "cut_off", f"the stream ended after {chunks} output chunks, with no finish")
        return
    out.e2e_s = time.perf_counter() - t0
    out.status = "completed"
    if len(ids_seen) > 1:
        _note(out, "duplicated", f"one stream carried several ids: {sorted(ids_seen)[:4]}")
    if finishes != 1:
        _note(out, "duplicated" if finishes > 1 else "wrong_length", f"{finishes} finish events")
    if after_finish:
        _note(out, "duplicated", f"{after_finish} output events after the finish")
    if plan.route == "generate":
        out.output_tokens, out.answer = len(streamed_ids), streamed_ids
        if final_tokens is not None and len(streamed_ids) > final_tokens:
            _note(out, "duplicated", f"{len(streamed_ids)} token ids streamed, the finish says {final_tokens}")
        elif final_tokens != len(streamed_ids):
            _note(out, "wrong_length", f"{len(streamed_ids)} token ids streamed, the finish says {final_tokens}")
    else:
        out.answer = "".join(text)
        if usage is None:
            _note(out, "wrong_length", "no usage chunk although include_usage was asked for")
            return
        out.output_tokens = usage.get("completion_tokens")
    if out.output_tokens != plan.max_new_tokens:
        _note(out, "wrong_length", f"{out.output_tokens} tokens, asked for {plan.max_new_tokens} with ignore_eos")
    elif finish != "length":
        _note(out, "wrong_length", f"finish_reason {finish!r}, expected 'length'")


# ------------------------------------------------------------------------------------------- the side threads

class Flipper(threading.Thread):
    """POST /api/mode every `every` seconds, alternating sync and async."""

    def __init__(self, client: Client, every: float, start_mode: str, stop: threading.Event):
        super().__init__(name="soak-flipper", daemon=True)
        self.client, self.every, self.mode, self.stop = client, every, start_mode, stop
        self.done = 0
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop.wait(self.every):
            target = "sync" if self.mode == "async" else "async"
            try:
                status, body = self.client.call("POST", "/api/mode", {"mode": target})
            except OSError as e:
                self.errors.append(f"POST /api/mode {target}: {e!r}")
                continue
            if status == 200 and isinstance(body, dict) and body.get("mode") == target:
                self.mode = target
                self.done += 1
            else:
                self.errors.append(f"POST /api/mode {target}: {status} {str(body)[:200]}")


class Viewer(threading.Thread):
    """A websocket viewer. A reader checks every message is JSON with a type, hello first; a stalled viewer
    connects and never reads (a tiny receive buffer, so the server sees it stall soon)."""

    def __init__(self, i: int, client: Client, token: str | None, stalled: bool, stop: threading.Event):
        super().__init__(name=f"soak-viewer-{i}", daemon=True)
        self.i, self.client, self.token, self.stalled, self.stop = i, client, token, stalled, stop
        self.messages: collections.Counter = collections.Counter()
        self.dropped_frames = 0
        self.preempted: set[str] = set()
        self.modes_seen = 0
        self.error: str | None = None
        self.closed_by_server: str | None = None
        self.connected = threading.Event()

    def _connect(self):
        from websockets.sync.client import connect

        kw = {"max_size": None, "compression": None, "open_timeout": 30, "ping_interval": None}
        if "proxy" in connect.__code__.co_varnames:
            kw["proxy"] = None          # loopback only: never through a proxy from the environment
        if self.token:
            kw["additional_headers"] = {"Authorization": f"Bearer {self.token}"}
        if self.stalled:
            sock = socket.socket(socket.AF_INET6 if ":" in self.client.host else socket.AF_INET)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect((self.client.host, self.client.port))
            # its closing handshake cannot get through the unread backlog: do not wait long for it
            kw["sock"], kw["max_queue"], kw["close_timeout"] = sock, 1, 1
        return connect(self.client.ws_url, **kw)

    def run(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            ws = self._connect()
        except Exception as e:          # noqa: BLE001 - any failure to connect is reported, not raised
            self.error = f"connect: {e!r}"
            self.connected.set()
            return
        self.connected.set()
        with ws:
            try:
                if self.stalled:
                    self.stop.wait()
                    return
                self._read(ws)
            except ConnectionClosed as e:
                if self.stalled:
                    self.closed_by_server = repr(e)
                else:
                    self.error = f"closed during the run: {e!r}"
            except Exception as e:      # noqa: BLE001 - bad JSON or anything else ends this viewer, reported
                self.error = f"{e!r}"

    def _read(self, ws) -> None:
        first = True
        while not self.stop.is_set():
            try:
                raw = ws.recv(timeout=0.5)
            except TimeoutError:
                continue
            msg = json.loads(raw)
            kind = msg.get("type")
            if first and kind != "hello":
                self.error = f"first message was {kind!r}, not hello"
            first = False
            self.messages[kind] += 1
            if kind == "dropped":
                self.dropped_frames += int(msg.get("frames") or 0)
            elif kind == "mode":
                self.modes_seen += 1
            elif kind == "steps":
                for s in msg.get("steps") or []:
                    self.preempted.update(s.get("preempted") or ())


# --------------------------------------------------------------------------------------------------- the run

def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _ms_stats(xs: list[float]) -> dict:
    return {"n": len(xs), **{f"p{q}": None if percentile(xs, q) is None else round(percentile(xs, q) * 1e3, 2)
                             for q in (50, 90, 99)}, "max": round(max(xs) * 1e3, 2) if xs else None}


def _status(client: Client) -> dict:
    code, body = client.call("GET", "/api/status")
    if code != 200 or not isinstance(body, dict):
        raise RuntimeError(f"GET /api/status answered {code}: {str(body)[:300]}")
    return body


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


def run_soak(args) -> dict:
    client = Client(args.url, args.token, args.timeout)
    try:
        code, health = client.call("GET", "/api/health", timeout=10)
    except OSError as e:
        raise ConnectionError(f"cannot reach {args.url}: {e!r}") from None
    if code != 200 or not isinstance(health, dict) or health.get("status") != "ok":
        raise ConnectionError(f"GET /api/health on {args.url} answered {code}: {str(health)[:300]}")
    if health.get("replay_only"):
        raise ConnectionError(f"{args.url} is replay-only: no model to load")
    st0 = _status(client)
    plans = make_plans(args)
    start_mode = health.get("mode") or "async"

    stop = threading.Event()
    viewers: list[Viewer] = []
    viewer_note = None
    if args.viewers > 0:
        try:
            import websockets.sync.client  # noqa: F401
        except ImportError:
            viewer_note = "websockets is not installed: no viewers were started"
            _say(viewer_note)
        else:
            viewers = [Viewer(i, client, args.token, stalled=(i == 0), stop=stop) for i in range(args.viewers)]
            for v in viewers:
                v.start()
            for v in viewers:
                v.connected.wait(60)

    outcomes: list[Outcome | None] = [None] * len(plans)
    lock = threading.Lock()
    next_i = [0]

    def worker():
        while True:
            with lock:
                i = next_i[0]
                if i >= len(plans):
                    return
                next_i[0] += 1
            try:
                outcomes[i] = run_one(client, plans[i])
            except Exception as e:      # noqa: BLE001 - a client-side bug must show up as a failure, not hang
                outcomes[i] = _fail(Outcome(i, plans[i].route, plans[i].stream), "error", "client_exception",
                                    repr(e))

    flipper = Flipper(client, args.flip_every, start_mode, stop) if args.flip_every > 0 else None
    t0 = time.perf_counter()
    if flipper:
        flipper.start()
    workers = [threading.Thread(target=worker, name=f"soak-worker-{k}", daemon=True)
               for k in range(min(args.concurrency, len(plans)))]
    for w in workers:
        w.start()
    samples: list[dict] = []
    status_errors: list[str] = []

    def sample() -> dict:
        done = sum(o is not None for o in outcomes)
        try:
            st = _status(client)
        except (OSError, RuntimeError) as e:
            status_errors.append(repr(e))
            return {}
        hub = (st.get("telemetry") or {}).get("hub") or {}
        samples.append({"t_s": round(time.perf_counter() - t0, 1), "done": done, "rss_mb": st.get("rss_mb"),
                        "kv_blocks_used": st.get("kv_blocks_used"), "queue": st.get("queue"),
                        "running": st.get("running"), "inflight": st.get("inflight"), "mode": st.get("mode"),
                        "viewers": hub.get("subscribers"), "hub_dropped_frames": hub.get("dropped_frames")})
        return samples[-1]

    last_progress = last_sample = time.monotonic()
    while any(w.is_alive() for w in workers):
        time.sleep(0.2)
        now = time.monotonic()
        if args.sample_every and now - last_sample >= args.sample_every:
            last_sample = now
            sample()
        if args.progress_every and now - last_progress >= args.progress_every:
            last_progress = now
            done = [o for o in outcomes if o is not None]
            rss = samples[-1].get("rss_mb") if samples else None
            _say(f"{len(done)}/{len(plans)} done, {sum(o.bad for o in done)} failed, "
                 f"{flipper.done if flipper else 0} flips, {time.perf_counter() - t0:.0f} s"
                 + (f", server RSS {rss} MB" if rss is not None else ""))
    wall = time.perf_counter() - t0
    at_end = sample() if viewers else {}        # how many viewers the server still counts, before they leave
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
    st1, settled = settle(client, st0.get("kv_blocks_used"), args.settle_timeout)
    return report(args, plans, [o for o in outcomes if o is not None], wall, st0, st1, settled, health,
                  flipper, viewers, viewer_note, samples, status_errors, at_end)


def _canary_mismatches(plans: list[Plan], outcomes: list[Outcome]) -> tuple[int, list[dict]]:
    """Greedy answers to one fixed prompt must agree across modes, batches and preemptions: count the answers
    that differ from the most common one of their group (route family x prompt)."""
    groups: dict[tuple, list[Outcome]] = collections.defaultdict(list)
    for o in outcomes:
        p = plans[o.n]
        if p.canary is not None and o.status == "completed" and not o.wrong_length and o.answer is not None:
            groups[(p.route, p.canary)].append(o)
    bad, examples = 0, []
    for key, group in groups.items():
        counts = collections.Counter(json.dumps(o.answer) for o in group)
        ref, _ = counts.most_common(1)[0]
        for o in group:
            if json.dumps(o.answer) != ref:
                bad += 1
                if len(examples) < 10:
                    examples.append({"n": o.n, "route": o.route, "stream": o.stream, "canary": key[1],
                                     "answer": o.answer, "majority": json.loads(ref)})
    return bad, examples


def report(args, plans, outcomes, wall, st0, st1, settled, health, flipper, viewers, viewer_note,
           samples=(), status_errors=(), at_end=None) -> dict:
    by = collections.Counter(o.status for o in outcomes)
    errors = collections.Counter(o.kind for o in outcomes if o.status == "error")
    lost = collections.Counter(o.kind for o in outcomes if o.status == "lost")
    # a server id handed to two different requests means answers got crossed or repeated
    owners: dict[str, set[int]] = collections.defaultdict(set)
    for o in outcomes:
        if o.server_id:
            owners[o.server_id].add(o.n)
    for sid, ns in owners.items():
        if len(ns) > 1:
            for o in outcomes:
                if o.n in ns:
                    _note(o, "duplicated", f"server id {sid} also answered requests {sorted(ns - {o.n})[:5]}")
    missing = len(plans) - len(outcomes)
    duplicated = sum(o.duplicated for o in outcomes)
    wrong_length = sum(o.wrong_length and not o.duplicated for o in outcomes)
    canary_bad, canary_examples = _canary_mismatches(plans, outcomes)
    flip_errors = flipper.errors if flipper else []
    viewer_errors = [f"viewer {v.i}: {v.error}" for v in viewers if v.error]
    all_errors = dict(errors, **({"mode_flip": len(flip_errors)} if flip_errors else {}),
                      **({"viewer": len(viewer_errors)} if viewer_errors else {}),
                      **({"status": len(status_errors)} if status_errors else {}))

    completed = [o for o in outcomes if o.status == "completed"]
    tokens = sum(o.output_tokens or 0 for o in completed)
    rss0, rss1 = st0.get("rss_mb"), st1.get("rss_mb")
    kv0, kv1 = st0.get("kv_blocks_used"), st1.get("kv_blocks_used")
    leak = not settled
    # RSS at half-way: warm-up (allocator pools, bounded rings filling) is over by then, a leak keeps growing
    mid = next((x["rss_mb"] for x in samples if x.get("rss_mb") is not None and x["done"] >= len(plans) / 2),
               None)
    preempted = set().union(*(v.preempted for v in viewers)) if viewers else set()
    stalled = [v for v in viewers if v.stalled]
    failures = [dict(asdict(o), answer=None) for o in outcomes if o.bad][:MAX_FAILURES_KEPT]
    for f in failures:
        f["payload"] = payload(plans[f["n"]])

    result = {
        "tool": "batchscope soak",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() - wall)),
        "config": {k: v for k, v in vars(args).items() if k not in ("token", "func")},
        "server": {k: health.get(k) for k in ("model", "device", "mode")},
        "requests": {
            "planned": len(plans), "sent": sum(o.sent for o in outcomes), "completed": by["completed"],
            "cancelled": by["cancelled"], "errors": by["error"], "lost": by["lost"] + missing,
            "duplicated": duplicated, "wrong_length": wrong_length, "canary_mismatches": canary_bad,
            "canaries": sum(1 for p in plans if p.canary is not None),
            "by_route": {f"{r}{'/stream' if s else ''}": sum(1 for o in outcomes if o.route == r and o.stream == s)
                         for r in ROUTES for s in (False, True)},
        },
        "errors_total": sum(all_errors.values()),
        "errors_by_kind": all_errors,
        "lost_by_kind": dict(lost, **({"never_answered": missing} if missing else {})),
        "latency_ms": {"e2e": _ms_stats([o.e2e_s for o in completed if o.e2e_s is not None]),
                       "ttft_stream": _ms_stats([o.ttft_s for o in completed if o.stream and o.ttft_s is not None])},
        "throughput": {"wall_s": round(wall, 2), "requests_per_s": round(len(completed) / wall, 2) if wall else None,
                       "output_tokens": tokens, "output_tokens_per_s": round(tokens / wall, 1) if wall else None},
        "mode_flips": {"done": flipper.done if flipper else 0, "errors": len(flip_errors),
                       "error_examples": flip_errors[:5], "every_s": args.flip_every},
        "viewers": {
            "started": len(viewers), "note": viewer_note, "errors": viewer_errors[:10],
            "messages_min": min((sum(v.messages.values()) for v in viewers if not v.stalled), default=None),
            "messages_total": sum(sum(v.messages.values()) for v in viewers),
            "dropped_frames_total": sum(v.dropped_frames for v in viewers),
            "mode_changes_seen_max": max((v.modes_seen for v in viewers), default=None),
            "preempted_requests_seen": len(preempted),
            "stalled_viewer": None if not stalled else
            ("disconnected by the server" if stalled[0].closed_by_server else "never read a message"),
            "server_count_at_end": (at_end or {}).get("viewers"),
            "server_dropped_frames": _delta((at_end or {}).get("hub_dropped_frames"),
                                            ((st0.get("telemetry") or {}).get("hub") or {}).get("dropped_frames")),
        },
        "server_rss_mb": {"start": rss0, "end": rss1,
                          "growth": _delta(rss1, rss0),
                          "half_way": mid, "growth_second_half": _delta(rss1, mid)},
        "kv": {"blocks_used_start": kv0, "blocks_used_end": kv1, "blocks_total": st1.get("kv_blocks_total"),
               "queue_end": st1.get("queue"), "running_end": st1.get("running"),
               "inflight_end": st1.get("inflight"), "leak": leak,
               "settle_timeout_s": args.settle_timeout},
        "status_errors": list(status_errors)[:10],
        "samples": list(samples),
        "failures": failures,
        "canary_mismatch_examples": canary_examples,
    }
    r = result["requests"]
    result["ok"] = not (result["errors_total"] or r["lost"] or r["duplicated"] or r["wrong_length"]
                        or r["canary_mismatches"] or leak)
    return result


def _delta(end, start):
    return round(end - start, 1) if isinstance(end, (int, float)) and isinstance(start, (int, float)) else None


def format_report(res: dict) -> str:
    r, lat, thr, rss, kv, v = (res["requests"], res["latency_ms"], res["throughput"], res["server_rss_mb"],
                               res["kv"], res["viewers"])

    def kinds(d: dict) -> str:
        return " (" + ", ".join(f"{k} {n}" for k, n in sorted(d.items())) + ")" if d else ""

    def mb(x) -> str:
        return "n/a" if x is None else f"{x:.1f} MB"

    lines = [
        f"requests   sent {r['sent']}/{r['planned']}, completed {r['completed']}, cancelled {r['cancelled']}",
        f"errors     {res['errors_total']}{kinds(res['errors_by_kind'])}",
        f"lost       {r['lost']}{kinds(res['lost_by_kind'])}",
        f"duplicated {r['duplicated']}   wrong length {r['wrong_length']}   "
        f"canary mismatches {r['canary_mismatches']} (of {r['canaries']} canaries)",
        f"latency    e2e p50 {lat['e2e']['p50']} ms, p99 {lat['e2e']['p99']} ms; "
        f"TTFT (streamed) p50 {lat['ttft_stream']['p50']} ms, p99 {lat['ttft_stream']['p99']} ms",
        f"throughput {thr['requests_per_s']} req/s, {thr['output_tokens_per_s']} output tokens/s "
        f"over {thr['wall_s']} s",
        f"mode flips {res['mode_flips']['done']} (every {res['mode_flips']['every_s']} s, "
        f"{res['mode_flips']['errors']} failed)",
        f"viewers    {v['started']}" + (f" ({v['note']})" if v["note"] else "") +
        (f": min {v['messages_min']} messages per reader, {v['dropped_frames_total']} frames dropped, the "
         f"stalled one {v['stalled_viewer']}, server counted {v['server_count_at_end']} at the end; "
         f"{v['preempted_requests_seen']} preempted requests seen" if v["started"] else ""),
        f"server RSS start {mb(rss['start'])}, end {mb(rss['end'])}, growth "
        + ("n/a" if rss["growth"] is None else f"{rss['growth']:+.1f} MB")
        + ("" if rss["growth_second_half"] is None else
           f" ({rss['growth_second_half']:+.1f} MB over the second half of the requests)"),
        f"KV blocks  used {kv['blocks_used_start']} at start, {kv['blocks_used_end']} at end "
        f"(of {kv['blocks_total']}); queue {kv['queue_end']}, running {kv['running_end']}: "
        + ("LEAK" if kv["leak"] else "no leak"),
        "result     " + ("OK" if res["ok"] else "FAILED"),
    ]
    for f in res["failures"][:5]:
        lines.append(f"  failure: #{f['n']} {f['route']}{'/stream' if f['stream'] else ''} {f['status']} "
                     f"{f['kind'] or ''} {f['detail'] or ''}")
    return "\n".join(lines)


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


if __name__ == "__main__":
    sys.exit(main())
