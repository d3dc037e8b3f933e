"""GET /metrics: Prometheus' text format (telemetry/prometheus.py), vLLM's serving names plus batchscope_*.

Served as text format 0.0.4 whatever the scraper's Accept header asks: with OpenMetrics negotiation,
prometheus-client would escape the colons of `vllm:` names into underscores for Prometheus 2.x. The token, when
the server has one, is checked in front of every route (middleware.py): a scrape without it gets a 401.
"""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from batchscope.telemetry.prometheus import CONTENT_TYPE

from ..state import State

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE: {}}}})
def metrics(state: State) -> Response:
    # a plain `def`: the collector runs in the thread pool, never on the event loop
    return Response(state.metrics(), media_type=CONTENT_TYPE)
