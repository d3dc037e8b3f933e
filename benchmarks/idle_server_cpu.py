"""What an idle batchscope server costs the machine: CPU per thread with one page open and nothing to serve.

    python benchmarks/idle_server_cpu.py --json out/idle.json                  # as shipped (Gradio polls at 20 ms)
    python benchmarks/idle_server_cpu.py --queue-poll-ms 1 --json out/idle_1ms.json   # Gradio's own 1 ms

The server runs in this process (tiny-random on the CPU, the page mounted), Debian's Chromium opens the page
headless, and after a settling pause each thread's CPU time is read from /proc over the window.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchscope.app.loadtest.specs import Limits  # noqa: E402
from batchscope.app.server import ServerThread, create_app  # noqa: E402
from batchscope.app.server import app as server_app  # noqa: E402
from batchscope.app.server.state import AppState  # noqa: E402
from batchscope.engine import EngineConfig  # noqa: E402

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def cpu_s(native_id: int) -> float | None:
    """The thread's user + system CPU seconds; None once it has ended (a short-lived worker)."""
    try:
        fields = open(f"/proc/self/task/{native_id}/stat").read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queue-poll-ms", type=float, default=None, help="Gradio's queue poll (default: batchscope's)")
    p.add_argument("--window-s", type=float, default=20.0)
    p.add_argument("--settle-s", type=float, default=10.0)
    p.add_argument("--json", type=Path, required=True)
    a = p.parse_args(argv)
    if a.queue_poll_ms is not None:
        server_app.QUEUE_POLL_S = a.queue_poll_ms / 1000.0
        server_app.PROGRESS_POLL_S = min(server_app.PROGRESS_POLL_S, a.queue_poll_ms / 100.0)
    from playwright.sync_api import sync_playwright

    state = AppState.load(EngineConfig(model="tiny-random", device="cpu", dtype="float32", mode="async",
                                       num_blocks=256, max_batch_tokens=256, max_running=16), Limits())
    srv = ServerThread(create_app(state, ui=True)).start()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.goto(srv.url + "/")
            time.sleep(a.settle_s)
            threads = {t.native_id: t.name for t in threading.enumerate() if t.native_id}
            before, t0 = {tid: cpu_s(tid) for tid in threads}, time.monotonic()
            time.sleep(a.window_s)
            after, dt = {tid: cpu_s(tid) for tid in threads}, time.monotonic() - t0
            browser.close()
    finally:
        srv.stop()
        state.close()
    per_thread = {}
    for tid, name in threads.items():
        if before[tid] is None or after[tid] is None:
            continue
        per_thread[name] = round(per_thread.get(name, 0.0) + 100.0 * (after[tid] - before[tid]) / dt, 2)
    res = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "window_s": round(dt, 1),
           "queue_poll_s": server_app.QUEUE_POLL_S, "cpu_pct_of_a_core_by_thread": dict(
               sorted(per_thread.items(), key=lambda kv: -kv[1])),
           "cpu_pct_of_a_core_total": round(sum(per_thread.values()), 2), "cores": os.cpu_count()}
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
