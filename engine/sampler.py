"""Sampling on the device: greedy, temperature, top-k, top-p, with per-request counter-based randomness; and the
logprobs of what was sampled.

Each sampled token uses Gumbel-max noise hashed from (seed, position, vocab id), so a seeded request's tokens
depend only on its seed, its logits and its position: never on its batch-mates, the step it lands in, or the
mode. No torch.Generator state, no host round trip.
"""
from __future__ import annotations

import torch

from .config import MAX_TOP_LOGPROBS

_MASK32 = 0xFFFFFFFF

# The code paths a step's sampling can take, named by the host facts it branches on: (any_random, any_filter,
# extras). A CUDA graph holds one path, so the runner captures one decode graph per path. An extras step (some
# request has penalties or asks for logprobs, batch.py) has one path only, the one that serves every row: filtered
# sampling (greedy rows take the argmax, rows without a filter keep every token), penalties (neutral for rows
# without), logprobs (read back for the rows that asked). A fourth path rather than a variant of each keeps the
# captures at start-up at 4/3 of what they were, and the three paths without extras exactly as they were.
SAMPLE_PATHS = {"greedy": (False, False, False), "random": (True, False, False), "filtered": (True, True, False),
                "extras": (True, True, True)}


def sample_path(any_random: bool, any_filter: bool, extras: bool = False) -> str:
    """The path a batch's sampling takes. Without randomness top-k/top-p change nothing (argmax survives any
    filter), so such a batch is greedy: keying its graph as filtered would replay argmax for later sampled ones."""
    if extras:
        return "extras"
    if not any_random:
        return "greedy"
    return "filtered" if any_filter else "random"


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer on int64 tensors (values kept in [0, 2^32))."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    x = x ^ (x >> 16)
    return x


def uniform_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """[S] seeds x [S] positions -> [S, vocab] uniforms in (0, 1), a pure function of its inputs."""
    ids = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    row = _hash32(_hash32(seeds) ^ ((positions * 0x9E3779B1) & _MASK32))
    bits = _hash32(row[:, None] ^ ((ids[None, :] * 0x85EBCA77) & _MASK32))
    return (bits.to(torch.float32) + 0.5) / 4294967296.0


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
           seeds: torch.Tensor, positions: torch.Tensor, any_random: bool, any_filter: bool) -> torch.Tensor:
    """logits [S, V] -> token ids [S]. `any_random`/`any_filter` are host facts about the batch that let
    all-greedy batches skip the noise and sort entirely."""
    greedy = logits.argmax(dim=-1)     # on the model's dtype: widening to fp32 keeps the order and the ties
    if not any_random:
        return greedy
    logits = logits.float()
    scaled = logits / temperature.clamp(min=1e-6)[:, None]
    if any_filter:
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # keep the smallest prefix whose mass reaches top_p (the top token always survives)
        drop = (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
        ranks = torch.arange(logits.shape[-1], device=logits.device)[None, :]
        drop |= (top_k[:, None] > 0) & (ranks >= top_k[:, None])
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = torch.empty_like(scaled).scatter_(-1, order, sorted_logits)
    gumbel = -torch.log(-torch.log(uniform_noise(seeds, positions, logits.shape[-1])))
    sampled = (scaled + gumbel).argmax(dim=-1)
    return torch.where(temperature > 0, sampled, greedy)


def write_logprobs(logits: torch.Tensor, tokens: torch.Tensor, records: torch.Tensor) -> None:
    """Each sampled row's logprobs record (batch.py's RECORD_WORDS): the log-softmax in float32 of the logits the
    model produced for the row (after its own epilogue: soft-capping, scaling), before penalties, temperature and
    filtering, which is what vLLM returns by default (its logprobs mode "raw_logprobs"). The chosen token's logprob,
    then the MAX_TOP_LOGPROBS most likely tokens' for every row (one shape for a graph to hold: the host keeps what
    each request asked for)."""
    logprobs = logits.log_softmax(dim=-1, dtype=torch.float32)
    k = min(MAX_TOP_LOGPROBS, logprobs.shape[-1])
    top = logprobs.topk(k, dim=-1)
    records[:, 0] = logprobs.gather(1, tokens[:, None])[:, 0]
    records[:, 1:1 + k] = top.values
    records.view(torch.int32)[:, 1 + MAX_TOP_LOGPROBS:1 + MAX_TOP_LOGPROBS + k] = top.indices.to(torch.int32)
