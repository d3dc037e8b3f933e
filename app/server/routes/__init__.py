"""The server's routes, one router per concern; app/server/app.py includes them in this order.

    control.py   /api: health, status, the mode switch, one generation
    load.py      /api: bursts, A/B comparisons, continuous loads
    sweep.py     /api: sweeps (sync, throughput, rising rates in each mode), their export, foreign reports
    timeline.py  /api: timelines (JSON, Perfetto), named recordings, replay
    profile.py   /api/profile: a torch.profiler window over the next N steps, its trace
    openai.py    /v1: OpenAI-compatible completions, chat completions and the model list
    metrics.py   /metrics: Prometheus' text format (vLLM's names and batchscope's)
    ws.py        /ws/telemetry: the live feed
"""
from . import control, load, metrics, openai, profile, sweep, timeline, ws

ROUTERS = (control.router, load.router, sweep.router, timeline.router, profile.router, openai.router, metrics.router,
           ws.router)
