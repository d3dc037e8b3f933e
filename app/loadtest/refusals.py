"""Why a load test is refused, in words a caller can act on: the server is at capacity (BusyError), the mode is
locked by an A/B run (ModeLocked), or its spec is invalid (`validation_reason` puts pydantic's errors in one line).

They live here, below app/server and app/ui, because both raise or show them: the server maps them to HTTP
statuses (app/server/errors.py: 429, 409 (ModeLocked, EngineTaken), 400, and `validation_reason` for every body it
refuses) and the page's load-test panel says them in its own words.
"""
from __future__ import annotations

from pydantic import ValidationError


class BusyError(ValueError):
    """The request is fine but the server is at capacity right now (too many bursts, a deep queue): retry later
    (429). An input over a configured cap is a plain ValueError (400)."""


class ModeLocked(RuntimeError):
    """A mode switch asked for while an A/B or a sweep runs (409): it would spoil the comparison."""


class EngineTaken(RuntimeError):
    """A run that needs the engine to itself (a sweep) asked for while another run goes on, or any run asked for
    while a sweep goes on (409): the request is fine, the moment is not, and waiting will not be enough until
    that run ends or is stopped."""


def validation_reason(exc: ValidationError) -> str:
    """One line that names each bad field and why: for the API's 400s (FastAPI's RequestValidationError has the
    same `errors()`) and for the page's load-test panel."""
    parts = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            return f"body is not valid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}"
        if err.get("type") == "model_attributes_type" and tuple(err.get("loc", ())) == ("body",):
            return "the body must be a JSON object (sent as Content-Type: application/json)"
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        if err.get("type") == "literal_error":
            parts.append(f"{loc} must be {err['ctx']['expected']}, got {err.get('input')!r}")
            continue
        msg = str(err.get("msg")).removeprefix("Value error, ")      # our own validators' reasons read plainly
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or "invalid request"
