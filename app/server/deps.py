"""The root of the routes' dependencies (FastAPI's "bigger applications" pattern): `app_state`, the AppState the
app was built with. Each room of the state offers its own dependency from its own module:

    state.py         State            the whole state: the engine, telemetry, limits, requests in flight
    load_lab.py      LoadLabDep       bursts, A/B comparisons, continuous loads, the guarded mode switch
    sweep_lab.py     SweepLabDep      sweeps and the foreign reports laid over them
    timelines.py     TimelinesDep     timelines, named recordings, the replay
    profiler.py      ProfilerDep      torch.profiler windows and their traces
    analysis_lab.py  AnalysisLabDep   compare, what-if and the what-if's verify job

A room raises its own errors (NoEngineError, NotFoundError, ShuttingDownError ...) when a route calls it, not
while FastAPI resolves the dependency: a malformed request is told so first, as before the rooms existed.
Nothing here imports the state (not even for type hints), so the rooms can import this module and the state its
rooms without any two modules importing each other.
"""
from __future__ import annotations

from starlette.requests import HTTPConnection


def app_state(conn: HTTPConnection):
    """The AppState (state.py) the app was built with (create_app keeps it as app.state.batchscope)."""
    return conn.app.state.batchscope
