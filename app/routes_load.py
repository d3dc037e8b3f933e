"""/api: load tests — bursts of synthetic requests, and the same burst A/B in sync then async."""
from __future__ import annotations

from fastapi import APIRouter

from .deps import State
from .schemas import ABStatus, BurstList, BurstSpec, BurstStatus, StartedAB, StartedBurst

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
