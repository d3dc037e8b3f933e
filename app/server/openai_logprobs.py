"""The engine's logprobs (each token's, and its position's most likely tokens as (id, logprob) pairs) in the two
shapes OpenAI's routes return them: /v1/completions' legacy columns and /v1/chat/completions' list of entries.

A token's string is that token decoded alone, special tokens included (what vLLM returns): the same string wherever
the token appears, chosen or as an alternative, streamed or not. A character split over several tokens decodes to
U+FFFD in each of them; `bytes` (chat) are the token's own bytes, so those join up into the character again.
"""
from __future__ import annotations

import json

# JSON has no -Infinity: a token the model rules out entirely gets vLLM's stand-in
LOWEST_LOGPROB = -9999.0


def _finite(logprob: float) -> float:
    return logprob if logprob > LOWEST_LOGPROB else LOWEST_LOGPROB


def _byte_level_decoder(tokenizer) -> dict[str, int] | None:
    """For a byte-level BPE tokenizer (GPT-2, Llama 3, Qwen, SmolLM): the character each byte is written as in its
    vocabulary, inverted; None for any other kind, whose tokens' bytes are their strings' UTF-8."""
    try:
        decoder = json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder") or {}
    except Exception:               # a slow tokenizer has no backend to ask
        return None
    kinds = [d.get("type") for d in decoder.get("decoders", [decoder])]
    if "ByteLevel" not in kinds:
        return None
    # GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for 256 + n
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenStrings:
    """Each token id's string and bytes, decoded once (a top-20 request asks for 21 tokens a position)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._byte_chars = _byte_level_decoder(tokenizer) if tokenizer is not None else None
        self._added = set(getattr(tokenizer, "added_tokens_decoder", None) or ())
        self._text: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}

    def text(self, token_id: int) -> str:
        text = self._text.get(token_id)
        if text is None:
            if self.tokenizer is None:  # vLLM's spelling of a token it cannot decode
                text = f"token_id:{token_id}"
            else:
                text = self.tokenizer.decode([token_id], skip_special_tokens=False,
                                             clean_up_tokenization_spaces=False)
            self._text[token_id] = text
        return text

    def bytes(self, token_id: int) -> list[int]:
        raw = self._bytes.get(token_id)
        if raw is None:
            if self._byte_chars is not None and token_id not in self._added:
                piece = self.tokenizer.convert_ids_to_tokens(token_id)
                if piece is not None and all(c in self._byte_chars for c in piece):
                    raw = [self._byte_chars[c] for c in piece]
            if raw is None:             # added tokens are stored as text, not as byte characters
                raw = list(self.text(token_id).encode("utf-8"))
            self._bytes[token_id] = raw
        return raw


class CompletionLogprobs:
    """One choice's `logprobs` for /v1/completions, a piece at a time (a stream's chunks, or the whole answer at
    once: the same columns either way). `text_offset` is where each token's string starts, counting the strings of
    the tokens before it; `top_logprobs` holds the k most likely tokens and the chosen one (k + 1 entries at most,
    as OpenAI's legacy completions return them), most likely first."""

    def __init__(self, strings: TokenStrings):
        self.strings = strings
        self.offset = 0

    def piece(self, token_ids: list[int], logprobs: list[float] | None,
              top: list[list[tuple[int, float]]] | None) -> dict:
        tokens, offsets, tops = [], [], []
        for token_id, logprob, alternatives in zip(token_ids, logprobs or [], top or [[]] * len(token_ids)):
            text = self.strings.text(token_id)
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
            candidates = list(alternatives)
            if all(alt != token_id for alt, _ in candidates):
                candidates.append((token_id, logprob))
            ranked: dict[str, float] = {}
            for alt, value in sorted(candidates, key=lambda c: -c[1]):
                ranked.setdefault(self.strings.text(alt), _finite(value))   # two ids, one string: the likelier
            tops.append(ranked)
        return {"tokens": tokens, "token_logprobs": [_finite(v) for v in logprobs or []], "top_logprobs": tops,
                "text_offset": offsets}


def chat_logprobs(strings: TokenStrings, token_ids: list[int], logprobs: list[float] | None,
                  top: list[list[tuple[int, float]]] | None) -> dict:
    """`choices[i].logprobs` of /v1/chat/completions (or of one chunk of its stream): an entry per token with its k
    most likely tokens (exactly k, OpenAI's top_logprobs), most likely first."""
    def entry(token_id: int, logprob: float) -> dict:
        return {"token": strings.text(token_id), "logprob": _finite(logprob), "bytes": strings.bytes(token_id)}

    return {"content": [{**entry(t, v), "top_logprobs": [entry(a, av) for a, av in alternatives]}
                        for t, v, alternatives in zip(token_ids, logprobs or [], top or [[]] * len(token_ids))]}
