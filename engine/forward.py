"""One step's device work, the same whether it runs eagerly or is captured into a CUDA graph: the start kernel,
the carry-over gather, the model forward, penalties and sampling, the tokens (and logprobs records) written into the
slot's output pack. The runner (runner.py) calls it for eager steps; the step graphs (graphs.py) capture it.
"""
from __future__ import annotations

import torch

from .batch import Batch
from .kv_cache import KVCache
from .model.attention import AttentionMetadata, use_metadata
from .model.source import embeds_only, logits_epilogue
from .penalties import PenaltyState
from .sampler import sample, write_logprobs


class StepForward:
    """The model's step, tensors in (a filled slot, the previous step's tokens) and tokens out (the slot's output
    pack). It owns what every step of the model shares: the decoder, its lookup and head, the penalty counts and
    the start kernel's one-element tensor."""

    def __init__(self, model: torch.nn.Module, kv: KVCache, device: torch.device, attention: str,
                 max_running: int):
        self.model, self.kv, self.device, self.attention = model, kv, device, attention
        self.base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        # Where the decoder only looks its ids up, the step does the lookup itself (see __call__)
        self.embed = self.base.embed_tokens if embeds_only(self.base) else None
        self.lm_head = model.get_output_embeddings()
        # what the model's own forward does to the logits after its lm_head (final soft-capping, scaling)
        self.logits_steps = logits_epilogue(model)
        # the token counts of requests with penalties (penalties.py): one row per request that may run at once,
        # as wide as any id that can be fed (the embedding's) or sampled (the logits')
        head_width = getattr(self.lm_head, "out_features", None) or self.lm_head.weight.shape[0]
        vocab = max(head_width, model.get_input_embeddings().weight.shape[0])
        self.penalties = PenaltyState(max_running, vocab, device)
        # What a step's compute span starts with (see mark_start): one int32 the step's first kernel writes
        self.started = torch.zeros(1, dtype=torch.int32, device=device)

    def mark_start(self, before, after) -> None:
        """A step's first kernel, one element written, between two events, so that a compute span starts with a
        kernel, as a trace's does. An event on an idle stream completes when the stream reaches it, which can be
        before the step's first kernel arrives (an eager step's launch on its way): the step began at `before`,
        or one start kernel's run before `after` when that is later (engine/trace.py, head_start_ms). A graph
        runs its first node as soon as it starts, and a launch can hold the rest back (under torch.profiler,
        ~0.35 ms on an idle device): with a timing event as that node the span began before any kernel; with the
        start kernel it begins with one, and the hold-up is idle inside the step, where a trace shows it."""
        before.record()
        self.started.fill_(1)
        after.record()

    def __call__(self, batch: Batch, prev_out: torch.Tensor, marks: tuple | None = None) -> None:
        """Carry-over gather first, then the model forward and sampling. The host-side set-up (views, metadata)
        comes before the start kernel (`marks`: the events around it, None for none), so the device is not counted
        busy while the host prepares."""
        input_ids = batch.view("input_ids")
        carry = batch.num_carried or batch.graph is not None
        rows = batch.view("carry_rows") if carry else None
        positions = batch.view("positions")[None]
        B = batch.layout.B
        meta = AttentionMetadata(
            slot_mapping=batch.view("slot_mapping"),
            query_start_loc=batch.view("query_start_loc"),
            seq_lens=batch.view("seq_lens"),
            block_tables=batch.view("block_tables").view(B, batch.layout.max_blocks),
            query_start_host=batch.query_start_host,
            seq_lens_host=batch.seq_lens_host,
            max_query_len=batch.max_query_len,
            max_seq_len=batch.max_seq_len,
            kv_caches=self.kv.layers,
            backend=self.attention,
        )
        counting = (tuple(batch.view(name) for name in ("reset_rows", "prompt_rows", "output_rows"))
                    if batch.extras else None)
        with torch.inference_mode():
            if marks is not None:
                self.mark_start(*marks)
            if carry:
                # Placeholders become the tokens sampled by the previous step, still on the device.
                input_ids = torch.where(rows >= 0, prev_out[rows.clamp(min=0)], input_ids)
            if counting is not None:
                # penalties count what is fed, real tokens only: the carried ones are in place by now
                self.penalties.count_inputs(input_ids, *counting)
            # Looking the embedding up here puts the model's first kernel right after the start kernel; inside
            # the decoder it would follow its own Python (~0.3 ms for an eager 8B prefill). That Python still
            # runs on an idle device, inside the span: a span cannot see the host gaps between an eager step's
            # kernels.
            ids = input_ids[None]
            inputs = {"inputs_embeds": self.embed(ids)} if self.embed is not None else {"input_ids": ids}
            with use_metadata(meta):
                hidden = self.base(**inputs, position_ids=positions, use_cache=False).last_hidden_state[0]
            if batch.layout.S:
                logits = self.lm_head(hidden.index_select(0, batch.view("sample_idx")))
                for step in self.logits_steps:
                    logits = step(logits)
                self._sample(batch, logits)

    def _sample(self, batch: Batch, logits: torch.Tensor) -> None:
        """The step's tokens into its output pack; for an extras step, penalized first and followed by the
        logprobs records (of the raw logits: sampler.write_logprobs)."""
        S = batch.layout.S
        scores = logits
        if batch.extras:
            scores = self.penalties.apply(logits, batch.view("penalty_rows"), batch.view("repetition"),
                                          batch.view("frequency"), batch.view("presence"))
        tokens = sample(scores, batch.view("temperature"), batch.view("top_p"), batch.view("top_k"),
                        batch.view("seeds"), batch.view("sample_pos"), batch.any_random, batch.any_filter)
        batch.slot.out_tokens[:S].copy_(tokens)
        if batch.extras:
            write_logprobs(logits, tokens, batch.slot.records(S))
