"""/api: load tests — bursts of synthetic requests, the same burst A/B in sync then async, and continuous loads
that run until stopped (or until their bounds)."""
from __future__ import annotations

from fastapi import APIRouter

from ...loadtest.specs import BurstSpec, LoadSpec
from ...loadtest.statuses import ABStatus, BurstList, BurstStatus, LoadStatus
from ..load_lab import LoadLabDep
from ..schemas import StartedAB, StartedBurst, StartedLoad

router = APIRouter(prefix="/api", tags=["load"])


@router.post("/burst")
def start_burst(spec: BurstSpec, lab: LoadLabDep) -> StartedBurst:
    return StartedBurst(burst_id=lab.start_burst(spec))


@router.get("/bursts")
def list_bursts(lab: LoadLabDep) -> BurstList:
    return lab.list()


@router.get("/bursts/{burst_id}")
def burst_status(burst_id: str, lab: LoadLabDep) -> BurstStatus:
    return lab.burst(burst_id)


@router.post("/ab")
def start_ab(spec: BurstSpec, lab: LoadLabDep) -> StartedAB:
    return StartedAB(ab_id=lab.start_ab(spec))


@router.get("/ab/{ab_id}")
def ab_status(ab_id: str, lab: LoadLabDep) -> ABStatus:
    return lab.ab(ab_id)


@router.post("/load")
def start_load(spec: LoadSpec, lab: LoadLabDep) -> StartedLoad:
    return StartedLoad(load_id=lab.start_load(spec))


@router.get("/load/{load_id}")
def load_status(load_id: str, lab: LoadLabDep) -> LoadStatus:
    return lab.load(load_id)


@router.post("/load/{load_id}/stop")
def stop_load(load_id: str, lab: LoadLabDep) -> LoadStatus:
    return lab.stop_load(load_id)
