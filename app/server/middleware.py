"""The two ASGI middlewares in front of every route: token auth (when the server has a token) and body limits."""
from __future__ import annotations

import hmac

from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from .errors import error_response
from .replay import MAX_JSON_DEPTH, MAX_REPLAY_BYTES, json_depth_over

TOKEN_COOKIE = "batchscope_token"
# JSON requests: the largest legitimate one, /v1/completions with max_burst_requests prompts of
# max_prompt_tokens ids each (256 x 4096 x ~7 bytes), is about 7 MiB
MAX_BODY_BYTES = 8 << 20
REPLAY_PATH = "/api/replay"         # takes up to MAX_REPLAY_BYTES (replay.py says why that much)
REPORT_PATH = "/api/sweep/import"   # another tool's load-test report, with its per-request lists: as much
LARGE_BODIES = {REPLAY_PATH: MAX_REPLAY_BYTES, REPORT_PATH: MAX_REPLAY_BYTES}    # depth-checked by their route
DEPTH_SCAN_INLINE_BRACKETS = 1 << 16    # a body with more brackets is depth-checked off the event loop


class TokenAuth:
    """With a token, every request needs `Authorization: Bearer TOKEN`, `?token=TOKEN` or the cookie that a
    `?token=` visit sets (so that the page's own fetch and websocket calls carry it)."""

    def __init__(self, app, token: str):
        self.app, self.token = app, token

    @staticmethod
    def _presented(conn: HTTPConnection) -> tuple[str | None, bool]:
        """The token the client sent, and whether it came in the query (then the answer sets the cookie)."""
        auth = conn.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip(), False
        if "token" in conn.query_params:
            return conn.query_params["token"], True
        return conn.cookies.get(TOKEN_COOKIE), False

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        conn = HTTPConnection(scope)
        given, from_query = self._presented(conn)
        if given is None or not hmac.compare_digest(given.encode(), self.token.encode()):
            if scope["type"] == "websocket":
                # closing before accept makes the handshake fail with 403
                await send({"type": "websocket.close", "code": 1008, "reason": "token required"})
                return
            reason = ("missing or wrong token: send 'Authorization: Bearer TOKEN', or open the page once with "
                      "?token=TOKEN")
            return await error_response(conn, 401, reason)(scope, receive, send)
        if not from_query or scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_cookie(message):
            if message["type"] == "http.response.start":
                cookie = f"{TOKEN_COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                message = {**message, "headers": list(message.get("headers", [])) +
                           [(b"set-cookie", cookie.encode("latin-1"))]}
            await send(message)
        return await self.app(scope, receive, send_with_cookie)


class BodyLimit:
    """Reads /api and /v1 request bodies before any route does, and refuses with a JSON reason:
    - 413 over the size limit (MAX_REPLAY_BYTES on /api/replay and /api/sweep/import, MAX_BODY_BYTES elsewhere):
      at once when the Content-Length says so, or, for a chunked body, as soon as the bytes read pass it (no more
      is read);
    - 400 for JSON nested deeper than MAX_JSON_DEPTH (recursive parsers fail on deep nesting); the two large
      bodies are checked in their route's thread instead.
    The route then gets the body whole, and the live channel after it (to notice a client that hangs up).
    Gradio's own routes keep Gradio's limits."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(("/api/", "/v1/")):
            return await self.app(scope, receive, send)
        conn = HTTPConnection(scope)
        limit = LARGE_BODIES.get(path, MAX_BODY_BYTES)

        async def refuse(status: int, reason: str, close: bool = False) -> None:
            response = error_response(conn, status, reason)
            if close:                   # else the server would go on reading (and discarding) the rest
                response.headers["connection"] = "close"
            await response(scope, receive, send)

        over = f"request body over the limit of {limit >> 20} MiB"
        declared = conn.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return await refuse(413, over, close=True)
        body = await self._read(receive, limit)
        if body is None:
            return await refuse(413, over, close=True)
        if body is False:               # the client left mid-body; answering is a no-op
            return await refuse(400, "the client hung up before sending the whole body")
        if path not in LARGE_BODIES and body:
            if body.count(b"[") + body.count(b"{") > DEPTH_SCAN_INLINE_BRACKETS:
                depth = await run_in_threadpool(json_depth_over, body, MAX_JSON_DEPTH)
            else:
                depth = json_depth_over(body, MAX_JSON_DEPTH)
            if depth is not None:
                return await refuse(400, f"body JSON is nested {depth} levels deep, over the limit of "
                                         f"{MAX_JSON_DEPTH}")
        pending = [{"type": "http.request", "body": body, "more_body": False}]
        del body                        # the route's copy is the only one kept

        async def replay_receive():
            if pending:
                return pending.pop()
            return await receive()

        await self.app(scope, replay_receive, send)

    @staticmethod
    async def _read(receive, limit: int) -> bytes | None | bool:
        """The whole body; None as soon as it passes `limit` (the rest is not read), False if the client left."""
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return False
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > limit:
                return None
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
