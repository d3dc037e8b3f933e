"""/api: analysis — what can be compared or asked (the live history, the replay, named recordings), two of them
compared step by step at matched batch shapes (`batchscope compare --json`'s document), what another setting
would do to one (`batchscope whatif --json`'s), and that what-if run for real on this server's engine."""
from __future__ import annotations

from fastapi import APIRouter

from ..analysis_lab import LIVE_KEYS, RESTART_KEYS, AnalysisLabDep
from ..schemas import CompareBody, WhatIfBody

router = APIRouter(prefix="/api", tags=["analysis"])


# plain `def` routes: a comparison or a prediction computes for seconds, in the thread pool, off the event loop
@router.get("/recordings/sources")
def sources(lab: AnalysisLabDep) -> dict:
    """What /api/compare and /api/whatif take as a source: "live", "replay", a named recording."""
    return lab.sources()


@router.post("/compare")
def compare(body: CompareBody, lab: AnalysisLabDep) -> dict:
    """BASE against NEW (batchscope.compare/1, docs/compare.md), as `batchscope compare --json` writes it."""
    return lab.compare(body.base, body.new, body.min_effect_pct, body.fail_above_pct)


@router.get("/whatif/keys")
def whatif_keys() -> dict:
    """The settings a what-if takes, and which of them a verify on this server can run (the others need an engine
    started with them: `batchscope whatif --verify`)."""
    from batchscope.telemetry.whatif import KEYS

    return {"keys": list(KEYS), "verify_on_server": list(LIVE_KEYS), "verify_needs_restart": list(RESTART_KEYS)}


@router.post("/whatif")
def whatif(body: WhatIfBody, lab: AnalysisLabDep) -> dict:
    """The prediction (batchscope.whatif/1, docs/whatif.md), as `batchscope whatif --json` writes it."""
    return lab.whatif(body.recording, body.set, body.runs)


@router.post("/whatif/verify")
def whatif_verify(body: WhatIfBody, lab: AnalysisLabDep) -> dict:
    """Predict, then run the load for real on this engine (a background job): follow GET /api/whatif/verify/{id}."""
    job = lab.start_verify(body.recording, body.set, body.runs)
    return {"verify_id": job.id, "state": job.state}


@router.get("/whatif/verify/{verify_id}")
def whatif_verify_status(verify_id: str, lab: AnalysisLabDep) -> dict:
    """running (phase, progress) -> done (`result` with `measured`, `error_pct`, `within_interval` per mode),
    error or stopped (`error`)."""
    return lab.verify(verify_id)


@router.post("/whatif/verify/{verify_id}/stop")
def whatif_verify_stop(verify_id: str, lab: AnalysisLabDep) -> dict:
    """Stop a verify: what it submitted is cancelled and the mode put back; its status after."""
    return lab.stop_verify(verify_id)
