"""The server's routes, one router per concern; app/server/app.py includes them in this order. Each route takes
the room it works in as a dependency (right column; State is the AppState itself).

    control.py   /api: health, status, the mode switch, one generation           State, LoadLabDep (the mode)
    load.py      /api: bursts, A/B comparisons, continuous loads                 LoadLabDep
    sweep.py     /api: sweeps (sync, throughput, rising rates in each mode),     SweepLabDep
                 their export, foreign reports
    timeline.py  /api: timelines (JSON, Perfetto), named recordings, replay      TimelinesDep
    profile.py   /api/profile: a torch.profiler window over the next N steps     ProfilerDep
    analysis.py  /api: sources, compare, what-if, the what-if verify job         AnalysisLabDep
    openai.py    /v1: OpenAI-compatible completions, chat completions, models    State
    metrics.py   /metrics: Prometheus' text format (vLLM's names and ours)       State
    ws.py        /ws/telemetry: the live feed                                    State
"""
from . import analysis, control, load, metrics, openai, profile, sweep, timeline, ws

ROUTERS = (control.router, load.router, sweep.router, timeline.router, profile.router, analysis.router, openai.router,
           metrics.router, ws.router)
