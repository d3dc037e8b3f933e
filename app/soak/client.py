"""The soak test's requests: what to send (a seeded plan), how to send it (one HTTP/1.1 connection each, the
standard library only), and how each answer is checked (length, usage, one finish, ids never shared)."""
from __future__ import annotations

import http.client
import json
import random
import socket
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

ROUTES = {"generate": "/api/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}
# a small fixed vocabulary: prompts stay printable and tokenize the same on any tokenizer
WORDS = ("apple river stone cloud engine batch token window garden silver quiet north copper lamp orbit "
         "paper signal harbor maple violet thunder pixel candle meadow falcon ember glacier lantern").split()
CANARY_PROMPTS = ("The quick brown fox jumps over the lazy dog, again and again,",
                  "Once upon a time in a small harbor town there lived",
                  "List the planets of the solar system in order:")


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
            return fail_outcome(out, "lost", "timeout", "no response headers within --timeout")
        except (OSError, http.client.HTTPException) as e:
            kind = "connect" if not out.sent else "no_response"
            return fail_outcome(out, "error" if kind == "connect" else "lost", kind, repr(e))
        if resp.status != 200:
            body = resp.read()[:500].decode("utf-8", "replace")
            return fail_outcome(out, "error", f"http_{resp.status}", body)
        try:
            if plan.stream:
                _read_stream(plan, resp, out, t0, conn)
            else:
                _read_whole(plan, resp, out)
        except (TimeoutError, socket.timeout):
            fail_outcome(out, "lost", "timeout", "silent for --timeout in the middle of the answer")
        except (OSError, http.client.HTTPException) as e:
            fail_outcome(out, "lost", "cut_off", repr(e))
        if out.status in ("completed", "cancelled") and out.e2e_s is None:
            out.e2e_s = time.perf_counter() - t0
        return out
    finally:
        conn.close()


def fail_outcome(out: Outcome, status: str, kind: str, detail: str) -> Outcome:
    out.status, out.kind, out.detail = status, kind, detail[:500]
    return out


def _read_whole(plan: Plan, resp, out: Outcome) -> None:
    raw = resp.read()
    try:
        body = json.loads(raw)
    except ValueError:
        fail_outcome(out, "lost", "bad_json", raw[:300].decode("utf-8", "replace"))
        return
    if plan.route == "generate":
        out.server_id = body.get("id")
        ids = body.get("token_ids") or []
        out.output_tokens, out.answer = body.get("output_tokens"), ids
        finish = body.get("finish_reason")
        if body.get("error") or finish == "error":
            fail_outcome(out, "error", "engine_error", str(body.get("error")))
            return
        if len(ids) != out.output_tokens:
            flag_outcome(out, "wrong_length", f"{len(ids)} token ids but output_tokens {out.output_tokens}")
    else:
        out.server_id = body.get("id")
        choices = body.get("choices") or []
        usage = body.get("usage") or {}
        out.output_tokens = usage.get("completion_tokens")
        if len(choices) != 1:
            out.status = "completed"            # answered, but not with exactly one choice
            flag_outcome(out, "duplicated" if len(choices) > 1 else "wrong_length", f"{len(choices)} choices")
            return
        c = choices[0]
        out.answer = c.get("text") if plan.route == "completions" else (c.get("message") or {}).get("content")
        finish = c.get("finish_reason")
    if not out.wrong_length and out.output_tokens != plan.max_new_tokens:
        flag_outcome(out, "wrong_length",
                     f"{out.output_tokens} tokens, asked for {plan.max_new_tokens} with ignore_eos")
    elif finish != "length":
        flag_outcome(out, "wrong_length", f"finish_reason {finish!r}, expected 'length'")
    out.status = "completed"


def flag_outcome(out: Outcome, what: str, detail: str) -> None:
    setattr(out, what, True)
    out.detail = (f"{out.detail}; " if out.detail else "") + detail


@dataclass
class StreamSeen:
    """What one streamed answer has carried so far."""
    chunks: int = 0                 # events with output in them
    finishes: int = 0
    after_finish: int = 0           # output events past the finish (the usage chunk aside)
    token_ids: list[int] = field(default_factory=list)     # /api/generate streams its ids
    text: list[str] = field(default_factory=list)
    usage: dict | None = None
    final_tokens: int | None = None     # what /api/generate's finish says it produced
    finish: str | None = None
    server_ids: set[str] = field(default_factory=set)

    def take(self, route: str, ev: dict, out: Outcome) -> bool:
        """Count one event; True when it carried output."""
        if ev.get("id") is not None:
            self.server_ids.add(ev["id"])
        output = finished = False
        if route == "generate":
            tok = ev.get("token_ids") or []
            output = bool(tok) or bool(ev.get("delta"))
            self.after_finish += bool(self.finishes)
            self.token_ids += tok
            self.text.append(ev.get("delta") or "")
            if ev.get("finished"):
                finished, self.finish, self.final_tokens = True, ev.get("finish_reason"), ev.get("output_tokens")
        else:
            if ev.get("usage") is not None:
                if self.usage is not None:
                    flag_outcome(out, "duplicated", "two usage chunks")
                self.usage = ev["usage"]
            for c in ev.get("choices") or []:
                piece = c.get("text") if route == "completions" else (c.get("delta") or {}).get("content")
                self.after_finish += bool(self.finishes)
                if piece:
                    output = True
                    self.text.append(piece)
                if c.get("finish_reason") is not None:
                    finished, self.finish = True, c["finish_reason"]
        self.chunks += output
        self.finishes += finished
        return output


def _read_stream(plan: Plan, resp, out: Outcome, t0: float, conn) -> None:
    """Follows one SSE answer: output chunks (for TTFT and the cancel point), finishes, usage and ids."""
    seen = StreamSeen()
    done = False
    for raw in sse_events(resp):
        if raw == b"[DONE]":
            done = True
            break
        try:
            ev = json.loads(raw)
        except ValueError:
            fail_outcome(out, "error", "bad_event", raw[:300].decode("utf-8", "replace"))
            return
        if ev.get("error") is not None:        # the finish of /api/generate carries "error": null
            fail_outcome(out, "error", "stream_error", json.dumps(ev)[:500])
            return
        if seen.take(plan.route, ev, out) and out.ttft_s is None:
            out.ttft_s = time.perf_counter() - t0
        if plan.cancel_after and seen.chunks >= plan.cancel_after and not seen.finishes:
            # hang up mid-stream: the server must cancel the request and free its blocks
            out.e2e_s = time.perf_counter() - t0
            out.status = "cancelled"
            out.server_id = next(iter(seen.server_ids), None)
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except (OSError, AttributeError):
                pass
            resp.close()
            return
    out.server_id = next(iter(seen.server_ids), None)
    if not done:
        if seen.finishes:
            fail_outcome(out, "lost", "no_done", "the stream ended after its finish but without [DONE]")
        else:
            fail_outcome(out, "lost", "cut_off", f"the stream ended after {seen.chunks} output chunks, with no finish")
        return
    out.e2e_s = time.perf_counter() - t0
    out.status = "completed"
    _check_stream(plan, seen, out)


def _check_stream(plan: Plan, seen: StreamSeen, out: Outcome) -> None:
    """A stream that ended with [DONE]: one id, one finish, nothing after it, and the length asked for."""
    if len(seen.server_ids) > 1:
        flag_outcome(out, "duplicated", f"one stream carried several ids: {sorted(seen.server_ids)[:4]}")
    if seen.finishes != 1:
        flag_outcome(out, "duplicated" if seen.finishes > 1 else "wrong_length", f"{seen.finishes} finish events")
    if seen.after_finish:
        flag_outcome(out, "duplicated", f"{seen.after_finish} output events after the finish")
    if plan.route == "generate":
        streamed = len(seen.token_ids)
        out.output_tokens, out.answer = streamed, seen.token_ids
        if seen.final_tokens is not None and streamed > seen.final_tokens:
            flag_outcome(out, "duplicated", f"{streamed} token ids streamed, the finish says {seen.final_tokens}")
        elif seen.final_tokens != streamed:
            flag_outcome(out, "wrong_length", f"{streamed} token ids streamed, the finish says {seen.final_tokens}")
    else:
        out.answer = "".join(seen.text)
        if seen.usage is None:
            flag_outcome(out, "wrong_length", "no usage chunk although include_usage was asked for")
            return
        out.output_tokens = seen.usage.get("completion_tokens")
    if out.output_tokens != plan.max_new_tokens:
        flag_outcome(out, "wrong_length",
                     f"{out.output_tokens} tokens, asked for {plan.max_new_tokens} with ignore_eos")
    elif seen.finish != "length":
        flag_outcome(out, "wrong_length", f"finish_reason {seen.finish!r}, expected 'length'")
