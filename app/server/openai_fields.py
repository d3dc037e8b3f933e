"""What the OpenAI routes do with every request field a client may send: each is served, accepted only at the value
that asks for nothing (what a client sends for what it leaves alone: `n: 1`, `tools: []`), or refused with a 400
that names it. None is ignored silently: a field this table does not know is refused too.

Served (routes/openai.py declares them): model, prompt / messages (text, or lists of text parts), max_tokens,
max_completion_tokens (chat), temperature, top_p, top_k, seed, stop, stream, stream_options (include_usage,
continuous_usage_stats), ignore_eos, presence_penalty, frequency_penalty, repetition_penalty, logprobs (a count on
completions; true or false on chat, with top_logprobs). Below: the rest.
"""
from __future__ import annotations

# Fields that describe the caller or how a request is filed, never the answer: accepted, whatever their value.
ABOUT_THE_CALLER = frozenset({"user", "metadata", "safety_identifier", "prompt_cache_key", "request_id"})

_NONE = (None,)
# Fields accepted only at the values that leave the answer as batchscope makes it; anything else is refused,
# saying why. (name -> (values accepted, why any other is refused))
NEUTRAL: dict[str, tuple[tuple, str]] = {
    "n": ((1, None), "n must be 1: batchscope returns one choice per prompt"),
    "best_of": ((1, None), "best_of is not supported"),
    "echo": ((False, None), "echo is not supported"),
    # chat's field (declared there); on /v1/completions, where it means nothing, only what asks for nothing
    "top_logprobs": ((None, 0), "top_logprobs belongs to chat completions: /v1/completions takes logprobs: k"),
    "min_p": ((None, 0, 0.0), "min_p is not supported"),
    "min_tokens": ((None, 0), "min_tokens is not supported"),
    "logit_bias": ((None, {}), "logit_bias is not supported"),
    "suffix": ((None, ""), "suffix is not supported"),
    "stop_token_ids": ((None, []), "stop_token_ids are not supported: use stop strings"),
    "tools": ((None, []), "tools are not supported"),
    "functions": ((None, []), "functions are not supported"),
    "tool_choice": ((None, "none", "auto"), "tool_choice is not supported: batchscope has no tools"),
    "function_call": ((None, "none", "auto"), "function_call is not supported"),
    "parallel_tool_calls": ((None, True, False), ""),   # means nothing without tools, which are refused
    "response_format": ((None, {"type": "text"}),
                        "response_format is not supported: batchscope does not constrain decoding, so the answer "
                        "would not be guaranteed to follow a format; only {\"type\": \"text\"} is accepted"),
    "guided_json": (_NONE, "guided decoding is not supported"),
    "guided_regex": (_NONE, "guided decoding is not supported"),
    "guided_choice": (_NONE, "guided decoding is not supported"),
    "guided_grammar": (_NONE, "guided decoding is not supported"),
    "structured_outputs": (_NONE, "structured outputs are not supported"),
    "modalities": ((None, ["text"]), "only the text modality is served"),
    "audio": (_NONE, "audio output is not supported"),
    "prediction": (_NONE, "predicted outputs are not supported"),
    "reasoning_effort": (_NONE, "reasoning_effort is not supported"),
    "verbosity": (_NONE, "verbosity is not supported"),
    "web_search_options": (_NONE, "web search is not supported"),
    "store": ((None, False), "store is not supported: nothing is stored"),
    "service_tier": ((None, "auto", "default"), "service_tier is not supported: there is one tier"),
    "skip_special_tokens": ((None, True), "skip_special_tokens=false is not supported: special tokens are skipped"),
    "include_stop_str_in_output": ((None, False), "include_stop_str_in_output is not supported: the text ends "
                                                  "before the stop string"),
    "add_generation_prompt": ((None, True), "add_generation_prompt=false is not supported"),
    "continue_final_message": ((None, False), "continue_final_message is not supported"),
    "chat_template": (_NONE, "a request's own chat_template is not supported: the model's is used"),
    "chat_template_kwargs": ((None, {}), "chat_template_kwargs are not supported"),
    "truncate_prompt_tokens": (_NONE, "truncate_prompt_tokens is not supported: a prompt over the limit is "
                                      "refused"),
}
STREAM_OPTIONS = frozenset({"include_usage", "continuous_usage_stats"})
# Fields of a chat message beyond role and content, accepted when null (a client that sends back the assistant
# message it got carries these)
MESSAGE_NULLS = frozenset({"name", "tool_calls", "tool_call_id", "function_call", "refusal", "audio", "annotations",
                           "reasoning_content"})


def _accepted(value, allowed: tuple) -> bool:
    # `True == 1` in Python: a bool is only ever accepted where a bool is listed
    return any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in allowed)


def check_fields(fields: dict) -> None:
    """Raise ValueError for a field that is neither served, about the caller, nor at its neutral value."""
    unknown = []
    for name, value in fields.items():
        if name in ABOUT_THE_CALLER:
            continue
        rule = NEUTRAL.get(name)
        if rule is None:
            unknown.append(name)
        elif not _accepted(value, rule[0]):
            raise ValueError(rule[1])
    if unknown:
        raise ValueError(f"unsupported field{'s' if len(unknown) > 1 else ''}: {', '.join(sorted(unknown))} "
                         "(batchscope refuses what it does not honour)")


def check_stream_options(stream: bool, options: dict | None) -> None:
    if options is None:
        return
    if not stream:
        raise ValueError("stream_options can only be given with stream: true")
    extra = sorted(set(options) - STREAM_OPTIONS)
    if extra:
        raise ValueError(f"stream_options: {', '.join(extra)} not supported (include_usage and "
                         "continuous_usage_stats are)")
    for key in STREAM_OPTIONS & set(options):
        if not isinstance(options[key], bool):
            raise ValueError(f"stream_options.{key} must be true or false")


def check_message(extra: dict) -> None:
    for name, value in extra.items():
        if name not in MESSAGE_NULLS:
            raise ValueError(f"message field {name!r} is not supported")
        if value is not None:
            raise ValueError(f"message field {name!r} is not supported (only null is accepted)")


def check_part(extra: dict) -> None:
    for name, value in extra.items():
        if value is not None:
            raise ValueError(f"content part field {name!r} is not supported")
