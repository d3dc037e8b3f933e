"""An idle server stays idle: with nothing to serve, its event loop wakes a few dozen times a second, not a thousand
(Gradio's event queue polls for work every millisecond unless told otherwise)."""
from __future__ import annotations

import time

import psutil

from helpers import tiny_served
from batchscope.app.loadtest.specs import Limits


def thread_cpu_s(native_id: int) -> float:
    return next(t.user_time + t.system_time for t in psutil.Process().threads() if t.id == native_id)


def test_the_idle_servers_event_loop_uses_little_cpu():
    with tiny_served(Limits(), ui=True) as (srv, _):
        tid = srv.thread.native_id
        time.sleep(2.0)                              # start-up done
        cpu0, t0 = thread_cpu_s(tid), time.monotonic()
        time.sleep(5.0)
        share = (thread_cpu_s(tid) - cpu0) / (time.monotonic() - t0)
    print(f"server thread, idle: {100 * share:.1f}% of a core")
    # 6.8% of a core on the 2-core development VM with Gradio polling its queue every ms, 1.6% at 20 ms
    assert share < 0.035
