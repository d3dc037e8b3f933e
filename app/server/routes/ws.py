"""WS /ws/telemetry: the live feed. Sends hello, then whatever the telemetry hub hands this viewer."""
from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from batchscope.telemetry.hub import SubscriptionClosed, TooManySubscribers

from ..state import State

router = APIRouter(tags=["telemetry"])

WS_SEND_TIMEOUT_S = 60.0            # a viewer that takes no frame for this long is disconnected


@router.websocket("/ws/telemetry")
async def telemetry_ws(ws: WebSocket, state: State):
    """The hub coalesces and, for a viewer that falls behind, drops frames and says so; this loop only
    forwards, so a stuck viewer stalls only itself."""
    await ws.accept()
    closed = asyncio.create_task(_until_disconnect(ws))
    sub = None
    try:
        if state.telemetry is None:
            meta = (state.replay or {}).get("meta", {})
            await ws.send_text(json.dumps({"type": "hello", "replay_only": True, "meta": meta}))
            await closed
            return
        try:
            sub = state.telemetry.hub.subscribe()
        except TooManySubscribers as exc:
            await ws.send_text(json.dumps({"type": "error", "error": str(exc)}))
            await ws.close(code=1013, reason="too many viewers")        # 1013: try again later
            return
        await ws.send_text(json.dumps({**state.telemetry.hello(), "replay_only": False}))
        while True:
            batch = asyncio.ensure_future(sub.get_text())     # frames arrive JSON-encoded once for all viewers
            await asyncio.wait({batch, closed}, return_when=asyncio.FIRST_COMPLETED)
            if closed.done():
                batch.cancel()
                return
            for text in batch.result():
                await asyncio.wait_for(ws.send_text(text), WS_SEND_TIMEOUT_S)
    except (WebSocketDisconnect, asyncio.TimeoutError, RuntimeError, SubscriptionClosed):
        pass                            # the viewer left or stalled, or the hub closed: drop our subscription
    finally:
        closed.cancel()
        if sub is not None:
            sub.close()


async def _until_disconnect(ws: WebSocket) -> None:
    # viewers have nothing to say; reading keeps ping/close handling alive and tells us when they go
    try:
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
    except (WebSocketDisconnect, RuntimeError):
        return
