"""/api: sweeps — a synchronous run, a throughput run and rising rates in each mode, their progress and results,
their export (batchscope.sweep/1 JSON, CSV), and other tools' reports uploaded to overlay on them."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from ...loadtest.sweep.files import to_csv
from ...loadtest.sweep.spec import SLO, SweepSpec
from ...loadtest.sweep.progress import SweepList, SweepStarted, SweepStatus
from ..sweep_lab import SweepLabDep
from ..replay import MAX_JSON_DEPTH, json_depth_over
from ..uploads import read_upload

router = APIRouter(prefix="/api", tags=["sweep"])
CONFLICT = {409: {"description": "another sweep, an A/B, a load or a burst is running"}}


@router.post("/sweep", responses=CONFLICT)
def start_sweep(spec: SweepSpec, sweeps: SweepLabDep) -> SweepStarted:
    return sweeps.start(spec)


@router.get("/sweeps")
def list_sweeps(sweeps: SweepLabDep) -> SweepList:
    return sweeps.list()


def _attachment(filename: str, download: bool) -> dict:
    return {"Content-Disposition": f'attachment; filename="{filename}"'} if download else {}


# the exports first: "/sweep/{sweep_id}" would also match "sweep-x.json"
@router.get("/sweep/{sweep_id}.json")
def sweep_json(sweep_id: str, sweeps: SweepLabDep, download: bool = False):
    doc = sweeps.run(sweep_id).document()
    return JSONResponse(doc, headers=_attachment(f"batchscope-{sweep_id}.json", download))


@router.get("/sweep/{sweep_id}.csv")
def sweep_csv(sweep_id: str, sweeps: SweepLabDep, download: bool = False):
    text = to_csv(sweeps.run(sweep_id).document())
    return Response(text, media_type="text/csv", headers=_attachment(f"batchscope-{sweep_id}.csv", download))


@router.get("/sweep/{sweep_id}")
def sweep_status(sweep_id: str, sweeps: SweepLabDep) -> SweepStatus:
    return sweeps.status(sweep_id)


@router.post("/sweep/{sweep_id}/stop")
def stop_sweep(sweep_id: str, sweeps: SweepLabDep) -> SweepStatus:
    """Cut the point running now short (its requests in flight are cancelled and counted) and keep the rest."""
    return sweeps.stop(sweep_id)


@router.post("/sweep/import")
async def import_report(request: Request, sweeps: SweepLabDep, slo_ttft_ms: float | None = None,
                        slo_itl_ms: float | None = None, slo_e2e_ms: float | None = None) -> dict:
    """A GuideLLM JSON report, a `vllm bench serve` result (or JSON lines of them) or a batchscope.sweep/1 file as
    the body (raw, or as a form's one file field); kept to overlay. The SLO (query) judges its per-request values,
    where it has them."""
    raw, _ = await read_upload(request, "a GuideLLM or vllm bench serve JSON report")
    depth = await run_in_threadpool(json_depth_over, raw, MAX_JSON_DEPTH)
    if depth is not None:
        raise ValueError(f"report JSON is nested {depth} levels deep, over the limit of {MAX_JSON_DEPTH}")
    given = {k: v for k, v in (("ttft_ms", slo_ttft_ms), ("itl_ms", slo_itl_ms), ("e2e_ms", slo_e2e_ms))
             if v is not None}
    report = await run_in_threadpool(sweeps.import_report, raw, SLO(**given))
    return _import_summary(report)


@router.get("/sweep/imports/{import_id}")
def imported_report(import_id: str, sweeps: SweepLabDep) -> dict:
    return sweeps.imported(import_id)


def _import_summary(report: dict) -> dict:
    return {"import_id": report["id"], "tool": report["tool"], "format": report["format"], "label": report["label"],
            "notes": report["notes"], "series": {name: len(c["points"]) for name, c in report["modes"].items()}}
