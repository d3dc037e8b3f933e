"""Presence, frequency and repetition penalties as vLLM applies them, over token counts kept on the device.

Why on the device: in async mode step N+1 is built before the host knows step N's tokens, so counts the host built
from `output_ids` would miss the token in flight, or count its placeholder (the hazard that bit vLLM twice, #27878
and #52461). Instead a request with penalties holds a row of two device tensors while it runs:
    prompt_seen[row, v]     1 where token v is in its prompt
    output_counts[row, v]   how many times its output holds v
and every extras step (batch.py) counts the tokens it feeds to the model, on the device, right after the carried
ones were gathered: a token at a position inside the prompt marks prompt_seen, one past it adds to output_counts.
When a step samples position P, every position before P has been fed (P - 1 in that same step at the latest), so
the counts hold exactly the prompt and the output so far, in either loop and across switches.

- A row starts from zero in the step that feeds the request's position 0: its first prefill chunk, or the first
  chunk of a recompute after preemption (the host knows every token by then and feeds them all again). So a
  preempted request gives its row back, and takes one again when it is re-admitted (the scheduler does both).
- A token that is sampled but never fed (the extra token of a request whose end the host learns a step late) is
  never counted. A row given back is zeroed by its next holder in a later step, which the device runs after every
  step that still read the old holder's counts (one compute stream, in order).
- Sampled rows without penalties, and padding rows, point at the scratch row with neutral penalties (1, 0, 0),
  which leave the logits bit for bit as they were.

The arithmetic is vLLM's (model_executor/layers/utils.py apply_penalties and the repetition op's torch version):
repetition on tokens in the prompt or the output, then frequency times the output count, then presence, in
float32, before temperature and filtering (sampler.py).
"""
from __future__ import annotations

import torch


class PenaltyRows:
    """Which request holds which row of the counts: plain Python, kept by the scheduler beside the KV blocks. There
    are as many rows as requests may run at once, so a running request never waits for one."""

    def __init__(self, num_rows: int):
        self.num_rows = num_rows
        self._free = list(range(num_rows - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def take(self, req) -> None:
        """On admission: a request with penalties that holds no row gets one."""
        if req.params.has_penalties and req.penalty_row < 0:
            req.penalty_row = self._free.pop()

    def give_back(self, req) -> None:
        """On preemption and when it finishes (safe to call twice)."""
        if req.penalty_row >= 0:
            self._free.append(req.penalty_row)
            req.penalty_row = -1


class PenaltyState:
    """The device side: the counts of every row, plus the scratch row (`scratch`), and the two operations on them."""

    def __init__(self, num_rows: int, vocab: int, device: torch.device):
        self.scratch = num_rows
        self.vocab = vocab                  # ids counted and logits penalized: [0, vocab)
        self.prompt_seen = torch.zeros(num_rows + 1, vocab, dtype=torch.uint8, device=device)
        self.output_counts = torch.zeros(num_rows + 1, vocab, dtype=torch.int32, device=device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.prompt_seen, self.output_counts))

    def count_inputs(self, input_ids: torch.Tensor, reset_rows: torch.Tensor, prompt_rows: torch.Tensor,
                     output_rows: torch.Tensor) -> None:
        """Zero the rows that start in this step, then count its input tokens (the real ones: after the carried
        tokens were gathered). Each token goes to its request's row as a prompt token or an output token, and to
        the scratch row as the other kind, so no two writes of different values meet in one place."""
        self.prompt_seen.index_fill_(0, reset_rows, 0)
        self.output_counts.index_fill_(0, reset_rows, 0)
        self.prompt_seen.view(-1).scatter_(0, prompt_rows * self.vocab + input_ids, 1)
        self.output_counts.view(-1).scatter_add_(0, output_rows * self.vocab + input_ids,
                                                 torch.ones_like(input_ids, dtype=torch.int32))

    def apply(self, logits: torch.Tensor, rows: torch.Tensor, repetition: torch.Tensor, frequency: torch.Tensor,
              presence: torch.Tensor) -> torch.Tensor:
        """The penalized logits [S, V] in float32, a new tensor (the raw ones stay for logprobs). `rows`: each
        sampled row's counts; the penalties [S] are its request's."""
        width = logits.shape[-1]
        counts = self.output_counts.index_select(0, rows)[:, :width]
        in_output = counts > 0
        seen = in_output | self.prompt_seen.index_select(0, rows)[:, :width].bool()
        penalty = torch.where(seen, repetition[:, None], 1.0)
        logits = logits.float()
        logits = logits * torch.where(logits > 0, 1.0 / penalty, penalty)
        logits = logits - frequency[:, None] * counts
        return logits - presence[:, None] * in_output
