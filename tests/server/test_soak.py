"""`batchscope soak`: a short soak against a real `batchscope serve` (tiny KV cache, so requests get preempted,
while the mode flips and viewers watch) must come back clean; against a fake server that loses, repeats, cuts or
crosses answers, or leaks KV blocks, the same tool must say so and exit non-zero."""
import json
import socket
import subprocess
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from helpers import serve_subprocess

from batchscope.app import cli
from batchscope.app.soak import campaign as soak


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    # 12 blocks of 16 tokens hold two or three requests: eight in flight get preempted all the time
    with serve_subprocess("--num-blocks", "12", "--max-batch-tokens", "256") as url:
        yield url


def test_short_soak_against_a_real_server_is_clean(server, tmp_path):
    out = tmp_path / "soak.json"
    cmd = [sys.executable, "-m", "batchscope.app.soak", "--url", server, "--requests", "60", "--concurrency", "8",
           "--flip-every", "0.1", "--viewers", "3", "--max-new-tokens", "16", "--max-prompt-words", "20",
           "--cancel-fraction", "0.25", "--seed", "3", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "result     OK" in proc.stdout
    res = json.loads(out.read_text())
    r = res["requests"]
    assert r["sent"] == r["planned"] == 60
    assert r["completed"] + r["cancelled"] == 60 and r["cancelled"] >= 1, r
    assert (r["errors"], r["lost"], r["duplicated"], r["wrong_length"], r["canary_mismatches"]) == (0, 0, 0, 0, 0)
    assert r["canaries"] >= 5
    assert res["errors_total"] == 0, res["errors_by_kind"]
    assert res["kv"]["leak"] is False and res["kv"]["blocks_used_end"] == res["kv"]["blocks_used_start"]
    assert res["kv"]["queue_end"] == 0 and res["kv"]["running_end"] == 0
    assert res["mode_flips"]["done"] >= 2 and res["mode_flips"]["errors"] == 0
    v = res["viewers"]
    assert v["started"] == 3 and not v["errors"] and v["messages_min"] > 0, v
    assert v["preempted_requests_seen"] > 0, "the small KV cache was meant to force preemptions"
    assert res["latency_ms"]["e2e"]["n"] == r["completed"] and res["latency_ms"]["e2e"]["p99"] > 0
    assert res["latency_ms"]["ttft_stream"]["n"] > 0
    rss = res["server_rss_mb"]
    assert rss["growth"] is None or rss["growth"] == pytest.approx(rss["end"] - rss["start"], abs=0.2)
    # the server is still fine and back in the mode it started in
    assert httpx.get(server + "/api/health").json()["mode"] == "async"


# ------------------------------------------------------------------------------------------- a faulty server

class FakeServer:
    """Speaks batchscope's routes with fixed-length answers; `fault` breaks every third request one way."""

    def __init__(self, fault: str = "none", token: str | None = None):
        self.fault, self.token = fault, token
        self.kv_used, self.rss, self.mode = 0, 100.0, "async"
        self.lock = threading.Lock()
        self.count = 0
        self.auth_failures = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"       # streams end when the connection closes

            def log_message(self, *args):
                pass

            def do_GET(self):
                if not fake.authorised(self):
                    return
                if self.path == "/api/health":
                    return self.json({"status": "ok", "model": "fake", "device": "cpu", "mode": fake.mode})
                if self.path == "/api/status":
                    return self.json({"status": "ok", "mode": fake.mode, "queue": 0, "running": 0,
                                      "kv_blocks_used": fake.kv_used, "kv_blocks_total": 16, "rss_mb": fake.rss})
                self.json({"error": "not found"}, 404)

            def do_POST(self):
                if not fake.authorised(self):
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/api/mode":
                    if fake.fault == "mode":
                        return self.json({"error": "boom"}, 500)
                    fake.mode = body["mode"]
                    return self.json({"mode": body["mode"]})
                with fake.lock:
                    k = fake.count
                    fake.count += 1
                    fake.rss += 0.5
                    if fake.fault == "leak":
                        fake.kv_used = 1            # a block that never comes back
                fake.answer(self, body, k, faulty=fake.fault != "none" and k % 3 == 1)

            def json(self, obj, status=200):
                raw = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def events(self, events):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                try:
                    for ev in events:
                        self.wfile.write(f"data: {ev if isinstance(ev, str) else json.dumps(ev)}\n\n".encode())
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass                            # the client dropped the stream on purpose

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def authorised(self, handler) -> bool:
        if self.token and handler.headers.get("Authorization") != f"Bearer {self.token}":
            self.auth_failures += 1
            handler.json({"error": "token"}, 401)
            return False
        return True

    def answer(self, h, body: dict, k: int, faulty: bool) -> None:
        f = self.fault if faulty else "none"
        if f == "drop":
            h.close_connection = True               # hang up without a word
            return
        if f == "500":
            return h.json({"error": "engine exploded"}, 500)
        route = h.path
        prompt = body.get("prompt") or body.get("messages", [{}])[0].get("content", "")
        n = body.get("max_new_tokens") or body.get("max_tokens")
        n = n - 1 if f == "short" else n
        base = zlib.crc32(json.dumps(prompt).encode()) % 40000
        ids = [base + i + (7 if f == "canary" else 0) for i in range(n)]
        rid = "same-id" if f == "crossed" else f"req-{k}"
        if route == "/api/generate":
            if not body.get("stream"):
                return h.json({"id": rid, "text": "", "token_ids": ids, "finish_reason": "length", "error": None,
                               "output_tokens": len(ids)})
            evs = [{"id": rid, "delta": f" t{t}", "token_ids": [t], "finished": False} for t in ids]
            evs[-1].update(finished=True, finish_reason="length", error=None, output_tokens=n)
            if f == "repeat":
                evs.insert(1, dict(evs[0]))         # one token delivered twice
        else:
            chat = route == "/v1/chat/completions"
            text = "".join(f" t{t}" for t in ids)
            usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
            if not body.get("stream"):
                choice = {"index": 0, "finish_reason": "length",
                          **({"message": {"role": "assistant", "content": text}} if chat else {"text": text})}
                choices = [choice, choice] if f == "repeat" else [choice]
                return h.json({"id": rid, "choices": choices, "usage": usage})

            def piece(t, finish=None):
                c = {"index": 0, "finish_reason": finish}
                c.update({"delta": {"content": t}} if chat else {"text": t})
                return {"id": rid, "choices": [c]}
            evs = ([{"id": rid, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "finish_reason": None}]}] if chat else [])
            evs += [piece(f" t{t}") for t in ids[:-1]] + [piece(f" t{ids[-1]}", "length")]
            if f == "repeat":
                evs.append(piece(f" t{ids[-1]}", "length"))     # the finish delivered twice
            evs.append({"id": rid, "choices": [], "usage": usage})
        if f == "cut":
            evs = evs[:max(1, len(evs) // 2)]
        else:
            evs.append("[DONE]")
        h.events(evs)

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def run_against(fake: FakeServer, tmp_path, *extra) -> tuple[int, dict]:
    out = tmp_path / f"{fake.fault}.json"
    rc = soak.main(["--url", fake.url, "--requests", "60", "--concurrency", "4", "--flip-every", "0.05",
                    "--max-new-tokens", "6", "--cancel-fraction", "0.2", "--canary-fraction", "0.5",
                    "--settle-timeout", "0.5", "--progress-every", "0", "--json", str(out), *extra])
    return rc, json.loads(out.read_text())


def test_a_correct_fake_server_passes_through_the_cli(tmp_path):
    # the checks do not cry wolf: a server that answers everything right gets a clean report (and the token)
    with FakeServer(token="s3cret-token") as fake:
        out = tmp_path / "clean.json"
        rc = cli.main(["soak", "--url", fake.url, "--token", "s3cret-token", "--requests", "60", "--concurrency",
                       "4", "--flip-every", "0.05", "--max-new-tokens", "6", "--canary-fraction", "0.5",
                       "--cancel-fraction", "0.2", "--progress-every", "0", "--json", str(out)])
        res = json.loads(out.read_text())
    assert rc == 0 and res["ok"], res
    assert fake.auth_failures == 0
    r = res["requests"]
    assert r["completed"] + r["cancelled"] == 60 and r["cancelled"] >= 1
    assert res["server_rss_mb"]["growth"] == pytest.approx(res["server_rss_mb"]["end"] - 100.0)
    assert res["mode_flips"]["done"] >= 1


@pytest.mark.parametrize("fault, field", [
    ("drop", "lost"), ("cut", "lost"), ("500", "errors"), ("repeat", "duplicated"), ("crossed", "duplicated"),
    ("short", "wrong_length"), ("canary", "canary_mismatches"),
])
def test_the_soak_reports_a_faulty_server(tmp_path, fault, field):
    with FakeServer(fault) as fake:
        rc, res = run_against(fake, tmp_path)
    assert rc == 1 and res["ok"] is False
    assert res["requests"][field] > 0, res["requests"]
    assert res["requests"]["completed"] > 0         # only every third request was broken


def test_the_soak_reports_a_kv_leak_and_failed_mode_flips(tmp_path):
    with FakeServer("leak") as fake:
        rc, res = run_against(fake, tmp_path)
    assert rc == 1 and res["kv"]["leak"] is True and res["kv"]["blocks_used_end"] == 1
    assert res["requests"]["errors"] == 0 and res["requests"]["lost"] == 0
    with FakeServer("mode") as fake:
        rc, res = run_against(fake, tmp_path)
    assert rc == 1 and res["errors_by_kind"].get("mode_flip", 0) > 0 and res["mode_flips"]["done"] == 0


def test_an_unreachable_server_exits_2():
    assert soak.main(["--url", f"http://127.0.0.1:{free_port()}", "--requests", "1"]) == 2
