"""What an idle batchscope server costs the machine: CPU per thread with one page open and nothing to serve.

    python benchmarks/idle_server_cpu.py --json out/idle.json                  # as shipped (Gradio polls at 20 ms)
    python benchmarks/idle_server_cpu.py --queue-poll-ms 1 --json out/idle_1ms.json   # Gradio's own 1 ms

The server runs in this process (tiny-random on the CPU, the page mounted), Debian's Chromium opens the page
headless, and after a settling pause the CPU is read over the window (page_cost.py's breakdown: this process by
thread, the browser by process type, the machine by state).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from batchscope.app.loadtest.specs import Limits  # noqa: E402
from batchscope.app.server import ServerThread, create_app  # noqa: E402
from batchscope.app.server import app as server_app  # noqa: E402
from batchscope.app.server.state import AppState  # noqa: E402
from batchscope.engine import EngineConfig  # noqa: E402
from page_cost import ARGS, CHROMIUM, cpu_shares, cpu_snapshot  # noqa: E402


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
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page()
            page.goto(srv.url + "/")
            time.sleep(a.settle_s)
            before = cpu_snapshot()
            time.sleep(a.window_s)
            after = cpu_snapshot()
            browser.close()
    finally:
        srv.stop()
        state.close()
    res = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "window_s": round(after[3] - before[3], 1),
           "queue_poll_s": server_app.QUEUE_POLL_S, "cores": os.cpu_count(), **cpu_shares(before, after)}
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
