"""/api: load tests — bursts of synthetic requests, the same burst A/B in sync then async, and continuous loads
that run until stopped (or until their bounds)."""
from __future__ import annotations

from fastapi import APIRouter

from ...loadtest.specs import BurstSpec, LoadSpec
from ...loadtest.statuses import ABStatus, BurstList, BurstStatus, LoadStatus
from ..deps import State
from ..schemas import StartedAB, StartedBurst, StartedLoad

router = APIRouter(prefix="/api", tags=["load"])


@router.post("/burst")
def start_burst(spec: BurstSpec, state: State) -> StartedBurst:
    return StartedBurst(burst_id=state.start_burst(spec))


@router.get("/bursts")
def list_bursts(state: State) -> BurstList:
    return state.list_bursts()


@router.get("/bursts/{burst_id}")
def burst_status(burst_id: str, state: State) -> BurstStatus:
    return state.burst_status(burst_id)


@router.post("/ab")
def start_ab(spec: BurstSpec, state: State) -> StartedAB:
    return StartedAB(ab_id=state.start_ab(spec))


@router.get("/ab/{ab_id}")
def ab_status(ab_id: str, state: State) -> ABStatus:
    return state.ab_status(ab_id)


@router.post("/load")
def start_load(spec: LoadSpec, state: State) -> StartedLoad:
    return StartedLoad(load_id=state.start_load(spec))


@router.get("/load/{load_id}")
def load_status(load_id: str, state: State) -> LoadStatus:
    return state.load_status(load_id)


@router.post("/load/{load_id}/stop")
def stop_load(load_id: str, state: State) -> LoadStatus:
    return state.stop_load(load_id)
