"""Prompts and sampling parameters as the server accepts them: within its limits (loadtest.specs.Limits) and the
model's context, with errors a caller can act on. The engine checks the token ids again when they are submitted."""
from __future__ import annotations

from batchscope.engine.config import SamplingParams

from ..loadtest.specs import Limits

DEFAULT_NEW_TOKENS = 128           # when a caller does not say (capped by the limit)
CHARS_PER_TOKEN_LIMIT = 32         # no token is shorter than a character; this leaves room for any tokenizer


def prompt_ids(tokenizer, prompt: str | list[int], limits: Limits, chat: bool | None, model_name) -> list[int]:
    """chat=True wraps the prompt as one user message through the chat template; chat=None does so for text when
    the model has a template (an instruct model given raw text often ends its answer at once), never for ids."""
    if prompt == "":                # said here: the chat template would wrap it into a non-empty prompt
        raise ValueError("prompt is empty")
    if chat is None:
        chat = isinstance(prompt, str) and bool(getattr(tokenizer, "chat_template", None))
    if chat:
        if not isinstance(prompt, str):
            raise ValueError("a chat prompt must be text")
        return chat_ids(tokenizer, [{"role": "user", "content": prompt}], limits, model_name)
    if isinstance(prompt, str):
        _check_chars(prompt, limits)
        return _check_length(tokenizer.encode(prompt, add_special_tokens=False), limits)
    return _check_length(list(prompt), limits)


def chat_ids(tokenizer, messages: list[dict], limits: Limits, model_name) -> list[int]:
    """Token ids of a chat (a non-empty list of {role, content} strings) through the model's chat template."""
    for m in messages:
        _check_chars(m["content"], limits)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"the model {model_name!r} has no chat template: use /v1/completions")
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as e:          # template errors are about the messages (e.g. roles out of order)
        raise ValueError(f"chat template rejected the messages: {e}") from None
    return _check_length(tokenizer.encode(text, add_special_tokens=False), limits)


def sampling_params(limits: Limits, max_model_len: int | None, prompt_len: int, max_new_tokens: int | None = None,
                    temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                    ignore_eos: bool = False, stop=(), *, logprobs: int | None = None,
                    presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                    repetition_penalty: float = 1.0) -> SamplingParams:
    """SamplingParams checked against the limits and the model's context length."""
    if max_new_tokens is None:
        max_new_tokens = min(DEFAULT_NEW_TOKENS, limits.max_new_tokens)
    if isinstance(max_new_tokens, int) and max_new_tokens > limits.max_new_tokens:
        raise ValueError(f"max_new_tokens {max_new_tokens} is over the limit of {limits.max_new_tokens}")
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                            seed=seed, ignore_eos=ignore_eos, stop=tuple(stop or ()), logprobs=logprobs,
                            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                            repetition_penalty=repetition_penalty).validate()
    if max_model_len and prompt_len + params.max_new_tokens > max_model_len:
        raise ValueError(f"prompt ({prompt_len} tokens) plus max_new_tokens ({params.max_new_tokens}) exceeds "
                         f"the model's context of {max_model_len} tokens")
    return params


def _check_chars(text: str, limits: Limits) -> None:
    # refuse absurd inputs before paying for their tokenization
    limit = limits.max_prompt_tokens * CHARS_PER_TOKEN_LIMIT
    if len(text) > limit:
        raise ValueError(f"prompt has {len(text)} characters, over the limit of {limit}")


def _check_length(ids: list[int], limits: Limits) -> list[int]:
    if len(ids) > limits.max_prompt_tokens:
        raise ValueError(f"prompt has {len(ids)} tokens, over the limit of {limits.max_prompt_tokens}")
    return ids
