"""The `model` an OpenAI request names must be the one this server serves, as vLLM checks it: anything else is a
404 with code `model_not_found` (a client pointed at the wrong server learns so, rather than getting another
model's text). A request without `model` gets the served one. The names accepted are those GET /v1/models
lists: its `id`, and its `root` (where the tokenizer lives, which `vllm bench serve` may send as the model)."""
from __future__ import annotations

from starlette.requests import Request

from .errors import ModelNotFound


def served_names(state) -> set[str]:
    engine = state.engine
    if engine is None:
        return set()
    root = getattr(getattr(engine, "tokenizer", None), "name_or_path", None)
    return {name for name in (state.model_name, root and str(root)) if name}


async def check_model(request: Request) -> None:
    """A dependency of the /v1 routes (app.py). FastAPI has parsed the body before it runs, and this request
    keeps the parsed JSON: nothing is parsed twice."""
    if request.method != "POST":
        return
    try:
        body = await request.json()
    except ValueError:                  # the route's own parsing says what is wrong with it
        return
    asked = body.get("model") if isinstance(body, dict) else None
    state = request.app.state.batchscope
    names = served_names(state)
    if not isinstance(asked, str) or not asked or not names or asked in names:
        return                          # no engine: the route refuses it (409) with its own reason
    raise ModelNotFound(f"The model `{asked}` does not exist: this server serves `{state.model_name}` "
                        "(GET /v1/models)")
