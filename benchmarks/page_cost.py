"""What the live page costs the machine it runs on: the browser's renderer CPU (all its threads, % of one core) and
the longest gap between two frames, under a continuous load at the 2-minute window and with the engine idle.

The server runs in this process (the engine beside the page, as on a laptop demo), Debian's Chromium through
Playwright draws the page. CPU comes from the renderer processes' own accounting (psutil), frames from
requestAnimationFrame in the page.

    python benchmarks/page_cost.py [--model smollm2-135m|tiny-random] [--seconds 20] [--out page_cost.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import threading
import time
import urllib.request

import psutil

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]

FRAMES_JS = """ms => new Promise(done => {
  let last = performance.now(), worst = 0, n = 0, over50 = 0, over100 = 0;
  const end = last + ms;
  function frame(t) { const gap = t - last; worst = Math.max(worst, gap); over50 += gap > 50; over100 += gap > 100;
                      last = t; n++;
                      if (t < end) requestAnimationFrame(frame);
                      else done({ frames: n, worstGapMs: worst, over50, over100, pictures: window.batchscope.perf.pictures }); }
  window.batchscope.perf.reset();
  requestAnimationFrame(frame);
})"""


def renderers() -> list[psutil.Process]:
    """The renderer processes of the Chromium this script started (its children; Playwright keeps the browser's
    own pid to itself)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "--type=renderer" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            pass
    return out


def cpu_seconds(procs) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def cpu_snapshot() -> tuple:
    """Where the machine's CPU goes: this process by thread name, the browser by process type, and the
    machine's /proc/stat line (Linux), with the clock."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    threads, browser = {}, {}
    for t in psutil.Process().threads():
        name = names.get(t.id, "other")
        threads[name] = threads.get(name, 0.0) + t.user_time + t.system_time
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
            kind = next((k for k in ("renderer", "gpu-process", "utility", "zygote") if f"--type={k}" in cmd), "browser")
            t = p.cpu_times()
            browser[kind] = browser.get(kind, 0.0) + t.user + t.system
        except psutil.Error:
            pass
    try:
        with open("/proc/stat") as f:
            machine = [int(x) for x in f.readline().split()[1:9]]
    except OSError:
        machine = None
    return threads, browser, machine, time.perf_counter()


def cpu_shares(a: tuple, b: tuple) -> dict:
    """% of one core per thread and browser process, and the machine's time by state (% of all its cores): a
    renderer that waits while cores sit idle was not waiting for our engine (steal: the hypervisor had the core)."""
    dt = b[3] - a[3]

    def share(new, old):
        return {k: round(100 * (v - old.get(k, 0.0)) / dt, 1) for k, v in new.items()
                if v - old.get(k, 0.0) >= 0.001 * dt}
    out = {"threads_pct_of_a_core": share(b[0], a[0]), "browser_pct_of_a_core": share(b[1], a[1])}
    if a[2] and b[2]:
        ticks = [y - x for x, y in zip(a[2], b[2])]
        out["machine_pct"] = {k: round(100 * v / max(1, sum(ticks)), 1) for k, v in
                              zip(("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"), ticks)}
    return out


def measure(page, procs, seconds: float) -> dict:
    """Renderer CPU over `seconds` with nothing but the page running, then the worst gap between frames over
    as long again (requestAnimationFrame asks for every frame, which costs the renderer by itself: the CPU
    figure is taken without it)."""
    page.evaluate("window.batchscope.perf.reset()")
    c0, t0, before = cpu_seconds(procs), time.perf_counter(), cpu_snapshot()
    time.sleep(seconds)
    c1, t1, after = cpu_seconds(procs), time.perf_counter(), cpu_snapshot()
    pictures = page.evaluate("window.batchscope.perf.pictures")
    drawing = page.evaluate("(p => ({picture_ms: p.pictureCostMs, max_task_ms: p.maxTaskMs, by_task: p.maxById}))"
                            "(window.batchscope.perf)")
    frames = page.evaluate(FRAMES_JS, seconds * 1000)
    return {"renderer_cpu_pct": round(100 * (c1 - c0) / (t1 - t0), 1), "pictures": pictures,
            # what the page's own drawing took (its tasks, ms): the smoothed cost of a picture, the longest task
            # and the longest of each kind, over the CPU window
            "picture_ms": round(drawing["picture_ms"], 1), "max_task_ms": round(drawing["max_task_ms"], 1),
            "longest_task_ms": {k: round(v, 1) for k, v in drawing["by_task"].items()},
            "worst_frame_gap_ms": round(frames["worstGapMs"], 1), "frames": frames["frames"],
            "frame_gaps_over_50_ms": frames["over50"], "frame_gaps_over_100_ms": frames["over100"],
            "cpu": cpu_shares(before, after),
            "seconds": round(t1 - t0, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--cpu-threads", type=int, default=None,
                    help="the engine's math threads (default: what `batchscope serve` picks with the page on this machine)")
    ap.add_argument("--nice", type=int, default=None,
                    help="the engine's niceness (default: what `batchscope serve` picks with the page on this machine)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from playwright.sync_api import sync_playwright

    from batchscope.app.cli import share_with_page
    from batchscope.app.loadtest.specs import Limits
    from batchscope.app.server import ServerThread, create_app
    from batchscope.app.server.state import AppState
    from batchscope.engine import EngineConfig

    threads, nice = share_with_page("cpu", "127.0.0.1", args.cpu_threads, args.nice)
    state = AppState.load(EngineConfig(model=args.model, device="cpu", dtype="float32", mode="async",
                                       num_blocks=512, max_batch_tokens=512, max_running=32,
                                       cpu_threads=threads, nice=nice), Limits())
    srv = ServerThread(create_app(state)).start()
    result = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "command": shlex.join(["python", "benchmarks/page_cost.py", *sys.argv[1:]]),
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "model": args.model,
              "engine_cpu_threads": state.engine.info["cpu_threads"], "engine_nice": state.engine.info["nice"]}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_context(viewport={"width": 1600, "height": 2000}).new_page()
            page.goto(srv.url + "/")
            page.wait_for_selector("#bs-gantt .main-svg", timeout=120_000)
            procs = renderers()
            time.sleep(3)
            result["idle"] = measure(page, procs, args.seconds)
            req = urllib.request.Request(srv.url + "/api/load", json.dumps(
                {"kind": "concurrency", "concurrency": args.concurrency, "duration_s": 600}).encode(),
                {"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=30).read()
            page.click("#bs-window button[data-span='120']")
            time.sleep(max(10.0, args.seconds / 2))     # the window fills with steps
            result["under_load_2min_window"] = measure(page, procs, args.seconds)
            result["steps_kept"] = int(page.get_attribute("#bs-scope", "data-steps") or 0)
            browser.close()
    finally:
        srv.stop()
        state.close()
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
