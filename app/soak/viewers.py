"""The soak test's side threads: a flipper that switches sync/async while the requests run, and websocket
viewers on /ws/telemetry (one of them never reads, so the server has a stalled viewer to cope with). The viewers
use the `websockets` package, imported when one starts; the flipper, like the requests, the standard library."""
from __future__ import annotations

import collections
import json
import socket
import threading

from .client import Client


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
            elif kind in ("steps", "catch_up"):     # a catch-up (after a skip) carries the newest steps
                for s in msg.get("steps") or []:
                    self.preempted.update(s.get("preempted") or ())
