"""/v1: OpenAI-compatible completions and chat completions (SSE with `stream: true`), and the model list, so that
the `openai` client, `vllm bench serve` or GuideLLM can drive the engine.

The bodies declare the fields that are served; any other field goes through openai_fields.py, which accepts it
only where it asks for nothing (or only says who is asking) and refuses it with a 400 otherwise: nothing a client
sends is ignored silently. Serving a new field is declaring it here (and honouring it).
"""
from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool
from starlette.concurrency import run_in_threadpool

from batchscope.engine.config import MAX_TOP_LOGPROBS

from ..errors import EngineFailure
from ..openai_fields import check_fields, check_message, check_part, check_stream_options
from ..openai_logprobs import CompletionLogprobs, chat_logprobs
from ..state import AppState, State
from ..streaming import delivery_sink, final_outputs, sse_stream

router = APIRouter(prefix="/v1", tags=["openai"])

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "abort", "error": "error"}
CHAT_DEFAULT_MAX_TOKENS = 1024      # OpenAI's "until the context ends" is unbounded on random-weight models
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


class OpenAIBody(BaseModel):
    model_config = ConfigDict(extra="allow")      # the rest is checked by openai_fields.check_fields
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None                      # vLLM extension; -1 or 0 means off
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None
    ignore_eos: bool = False                      # vLLM extension, used by benchmark clients
    presence_penalty: float | None = None         # -2 to 2; unset: 0, none
    frequency_penalty: float | None = None        # -2 to 2; unset: 0, none
    repetition_penalty: float | None = None       # vLLM extension, > 0; unset: 1, none


class CompletionBody(OpenAIBody):
    prompt: str | list[str] | list[int] | list[list[int]]
    # the legacy form: how many alternatives besides the chosen token, 0 to MAX_TOP_LOGPROBS; false or null: none
    logprobs: StrictBool | int | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None


class ChatBody(OpenAIBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None               # 0 to MAX_TOP_LOGPROBS, with logprobs: true


def _unsupported(body: OpenAIBody) -> None:
    """A 400 (ValueError) for any field, stream option or message part that is not served as asked."""
    check_fields(body.model_extra or {})
    check_stream_options(body.stream, body.stream_options)
    for m in getattr(body, "messages", ()):
        check_message(m.model_extra or {})
        for part in m.content if isinstance(m.content, list) else ():
            if part.type == "text":         # other kinds are refused with the text itself (_message_text)
                check_part(part.model_extra or {})


def _sampling(state: AppState, body: OpenAIBody, prompt_len: int, max_tokens: int | None, logprobs: int | None):
    stop = [body.stop] if isinstance(body.stop, str) else (body.stop or [])
    top_k = body.top_k if body.top_k and body.top_k > 0 else 0
    return state.sampling(prompt_len, max_tokens, 1.0 if body.temperature is None else body.temperature,
                          1.0 if body.top_p is None else body.top_p, top_k, body.seed, body.ignore_eos, stop,
                          logprobs=logprobs, presence_penalty=_unset_is(body.presence_penalty, 0.0),
                          frequency_penalty=_unset_is(body.frequency_penalty, 0.0),
                          repetition_penalty=_unset_is(body.repetition_penalty, 1.0))


def _unset_is(value, default):
    return default if value is None else value


def _alternatives(name: str, value) -> int:
    if isinstance(value, bool) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise ValueError(f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}], got {value!r}")
    return value


def _completion_logprobs(body: CompletionBody) -> int | None:
    """The engine's logprobs count for /v1/completions' `logprobs: k` (None: none asked)."""
    if body.logprobs is True:
        raise ValueError(f"logprobs on /v1/completions is how many alternatives to return, 0 to {MAX_TOP_LOGPROBS} "
                         "(logprobs: true is the chat completions form)")
    if body.logprobs is None or body.logprobs is False:       # not `in (None, False)`: 0 == False
        return None
    return _alternatives("logprobs", body.logprobs)


def _chat_logprobs(body: ChatBody) -> int | None:
    """The engine's logprobs count for chat's `logprobs: true` and `top_logprobs: k` (None: none asked)."""
    if not body.logprobs:
        if body.top_logprobs:           # 0 or null asks for nothing, as before logprobs were served
            raise ValueError("top_logprobs needs logprobs: true")
        return None
    return _alternatives("top_logprobs", body.top_logprobs or 0)


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _usage_event(body: OpenAIBody, chunk, prompt_tokens: int):
    """The closing usage chunk of a stream, when the client asked for it."""
    if not (body.stream_options or {}).get("include_usage"):
        return None
    return lambda produced: chunk([], usage=_usage(prompt_tokens, produced))


def _continuous_usage(body: OpenAIBody) -> bool:
    """stream_options.continuous_usage_stats (vLLM's): usage so far in every chunk, with include_usage."""
    options = body.stream_options or {}
    return bool(options.get("include_usage") and options.get("continuous_usage_stats"))


def _error_event(d) -> dict:
    return {"error": {"message": d.error or "engine error", "type": "server_error", "code": 500}}


def _finish(d) -> str | None:
    return FINISH.get(d.finish_reason) if d.finished else None


def _submit_all(state: AppState, ids: list[list[int]], params: list) -> list:
    handles = []
    try:
        for x, p in zip(ids, params):
            handles.append(state.submit(x, p))
    except Exception:
        for h in handles:               # all or nothing: do not leave half a request running
            h.cancel()
        raise
    return handles


def _raise_engine_error(outs) -> None:
    for o in outs:
        if o.finish_reason == "error":
            raise EngineFailure(o.error or "engine error")


def _message_text(m: ChatMessage) -> dict:
    if m.content is None or isinstance(m.content, str):
        return {"role": m.role, "content": m.content or ""}
    texts = []
    for part in m.content:
        if part.type != "text" or part.text is None:
            raise ValueError(f"message content of type {part.type!r} is not supported (text only)")
        texts.append(part.text)
    return {"role": m.role, "content": "".join(texts)}


@router.get("/models")
def models(state: State) -> dict:
    """The served model. `root` is where its tokenizer lives on the server (`vllm bench serve` reads it as the model
    id and its default tokenizer), `max_model_len` its context."""
    eng = state.engine
    root = getattr(getattr(eng, "tokenizer", None), "name_or_path", None) if eng is not None else None
    card = {"id": state.model_name, "object": "model", "created": int(state.started), "owned_by": "batchscope",
            "root": root or state.model_name, "parent": None,
            "max_model_len": eng.info.get("max_model_len") if eng is not None else None}
    return {"object": "list", "data": [card]}


@router.post("/completions")
async def completions(body: CompletionBody, state: State, request: Request):
    _unsupported(body)
    alternatives = _completion_logprobs(body)
    one = isinstance(body.prompt, str) or (body.prompt and isinstance(body.prompt[0], int))
    prompts = [body.prompt] if one else list(body.prompt)
    if not prompts:
        raise ValueError("prompt is empty")
    if len(prompts) > state.limits.max_burst_requests:
        raise ValueError(f"{len(prompts)} prompts in one request, over the limit of {state.limits.max_burst_requests}")
    ids = [await run_in_threadpool(state.encode, p) for p in prompts]
    max_tokens = COMPLETION_DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    handles = _submit_all(state, ids, [_sampling(state, body, len(x), max_tokens, alternatives) for x in ids])
    cid, created, name = f"cmpl-{uuid.uuid4().hex}", int(time.time()), state.model_name

    def chunk(choices: list, **extra) -> dict:
        return {"id": cid, "object": "text_completion", "created": created, "model": name, "choices": choices,
                **extra}

    prompt_tokens = sum(map(len, ids))
    if body.stream:
        produced = [0] * len(ids)
        continuous = _continuous_usage(body)
        columns = [CompletionLogprobs(state.token_strings) for _ in ids] if alternatives is not None else None

        def event(i, d, _) -> dict | None:
            produced[i] += len(d.token_ids)
            # with logprobs, a delta whose text the detokenizer holds back (half a character) is a chunk too: each
            # token's logprob comes with the delta that carried the token
            if d.text or d.finished or (columns and d.token_ids):
                extra = {"usage": _usage(len(ids[i]), produced[i])} if continuous else {}
                logprobs = columns[i].piece(d.token_ids, d.logprobs, d.top_logprobs) if columns else None
                return chunk([{"index": i, "text": d.text, "logprobs": logprobs, "finish_reason": _finish(d)}],
                             **extra)
            return None
        return sse_stream(handles, event, last=_usage_event(body, chunk, prompt_tokens), on_error=_error_event,
                          on_sent=delivery_sink(state))
    outs = await final_outputs(handles, request)
    _raise_engine_error(outs)
    choices = [{"index": i, "text": o.text,
                "logprobs": None if alternatives is None else
                CompletionLogprobs(state.token_strings).piece(o.token_ids, o.logprobs, o.top_logprobs),
                "finish_reason": FINISH.get(o.finish_reason)} for i, o in enumerate(outs)]
    return chunk(choices, usage=_usage(prompt_tokens, sum(len(o.token_ids) for o in outs)))


@router.post("/chat/completions")
async def chat_completions(body: ChatBody, state: State, request: Request):
    _unsupported(body)
    alternatives = _chat_logprobs(body)
    messages = [_message_text(m) for m in body.messages]
    ids = await run_in_threadpool(state.encode_messages, messages)
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is None:
        room = (state.engine.info.get("max_model_len") or 10**9) - len(ids)
        max_tokens = max(1, min(CHAT_DEFAULT_MAX_TOKENS, state.limits.max_new_tokens, room))
    handle = state.submit(ids, _sampling(state, body, len(ids), max_tokens, alternatives))
    cid, created, name = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), state.model_name

    def chunk(choices: list, **extra) -> dict:
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                "choices": choices, **extra}

    if body.stream:
        continuous = _continuous_usage(body)

        def event(_, d, produced: int) -> dict | None:
            if d.text or d.finished or (alternatives is not None and d.token_ids):     # as in completions
                extra = {"usage": _usage(len(ids), produced)} if continuous else {}
                logprobs = (None if alternatives is None else
                            chat_logprobs(state.token_strings, d.token_ids, d.logprobs, d.top_logprobs))
                return chunk([{"index": 0, "delta": {"content": d.text} if d.text else {}, "logprobs": logprobs,
                               "finish_reason": _finish(d)}], **extra)
            return None
        role = chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                       "finish_reason": None}], **({"usage": _usage(len(ids), 0)} if continuous else {}))
        return sse_stream([handle], event, first=role, last=_usage_event(body, chunk, len(ids)),
                          on_error=_error_event, on_sent=delivery_sink(state))
    (out,) = await final_outputs([handle], request)
    _raise_engine_error([out])
    return {"id": cid, "object": "chat.completion", "created": created, "model": name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": out.text},
                         "logprobs": None if alternatives is None else
                         chat_logprobs(state.token_strings, out.token_ids, out.logprobs, out.top_logprobs),
                         "finish_reason": FINISH.get(out.finish_reason)}],
            "usage": _usage(len(ids), len(out.token_ids))}
