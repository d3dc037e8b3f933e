"""Dependencies the routes declare: the AppState the app was built with (`state: State` in a route's signature)."""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from .state import AppState


def get_state(conn: HTTPConnection) -> AppState:
    return conn.app.state.batchscope


State = Annotated[AppState, Depends(get_state)]
