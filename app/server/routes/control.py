"""/api: the engine itself — health, status, the live mode switch, and one generation."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ...loadtest.refusals import ModeLocked
from ..errors import Conflict
from ..load_lab import LoadLabDep
from ..schemas import GenerateBody, Health, ModeBody, ModeChanged, ModeLock, Status
from ..state import State
from ..streaming import delivery_sink, final_outputs, sse_stream

router = APIRouter(prefix="/api", tags=["control"])


@router.get("/health")
def health(state: State) -> Health:
    return state.health()


@router.get("/status")
def status(state: State) -> Status:
    return state.status()


@router.post("/mode", responses={409: {"description": "an A/B comparison is running: the mode is locked"}})
def set_mode(body: ModeBody, lab: LoadLabDep) -> ModeChanged:
    try:
        return lab.set_mode(body.mode)
    except ModeLocked as e:     # the request is fine, the moment is not: a conflict, with the reason
        raise Conflict(str(e)) from None


@router.get("/mode")
def mode(lab: LoadLabDep) -> ModeLock:
    """The mode, and whether a switch would be refused now and why (the page greys its toggle out)."""
    return lab.mode_lock()


@router.post("/generate")
async def generate(body: GenerateBody, state: State, request: Request):
    """One request: its whole answer, or with `stream` its text deltas as server-sent events."""
    ids = await run_in_threadpool(state.encode, body.prompt, body.chat)
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    params = state.sampling(len(ids), body.max_new_tokens, body.temperature, body.top_p, body.top_k, body.seed,
                            body.ignore_eos, stop)
    handle = state.submit(ids, params)
    if body.stream:
        def event(_, d, produced: int) -> dict:
            ev = {"id": handle.id, "delta": d.text, "token_ids": d.token_ids, "finished": d.finished}
            if d.finished:
                ev.update(finish_reason=d.finish_reason, error=d.error, output_tokens=produced,
                          prompt_tokens=len(ids))
            return ev
        return sse_stream([handle], event, on_sent=delivery_sink(state))
    (out,) = await final_outputs([handle], request)
    result = {"id": out.id, "text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
              "error": out.error, "prompt_tokens": len(out.prompt_token_ids), "output_tokens": len(out.token_ids),
              "ttft_ms": _ms(out.arrival_ns, out.first_token_ns), "e2e_ms": _ms(out.arrival_ns, out.finish_ns)}
    return JSONResponse(result, status_code=500 if out.finish_reason == "error" else 200)


def _ms(t0: int | None, t1: int | None) -> float | None:
    return None if t0 is None or t1 is None else (t1 - t0) / 1e6
