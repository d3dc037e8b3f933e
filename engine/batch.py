"""A step plan turned into flat tensors inside an IO slot (pinned host buffers + their device twins).

Everything a step needs crosses to the device in three copies (int64, int32, float32 packs). The host fills a
slot only after the device has finished reading it (the runner guards that with the slot's events).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .scheduler import StepPlan


@dataclass
class PackLayout:
    """Offsets of each field inside the packs of one step (they depend on T tokens, B seqs, S samples)."""
    T: int
    B: int
    S: int
    max_blocks: int

    # int64 pack: input_ids[T] positions[T] slot_mapping[T] carry_rows[T] sample_idx[S] seeds[S] sample_pos[S]
    def i64(self) -> dict[str, tuple[int, int]]:
        T, S = self.T, self.S
        return _offsets([("input_ids", T), ("positions", T), ("slot_mapping", T), ("carry_rows", T),
                         ("sample_idx", S), ("seeds", S), ("sample_pos", S)])

    # int32 pack: query_start_loc[B+1] seq_lens[B] top_k[S] block_tables[B*max_blocks]
    def i32(self) -> dict[str, tuple[int, int]]:
        return _offsets([("query_start_loc", self.B + 1), ("seq_lens", self.B), ("top_k", self.S),
                         ("block_tables", self.B * self.max_blocks)])

    # float32 pack: temperature[S] top_p[S]
    def f32(self) -> dict[str, tuple[int, int]]:
        return _offsets([("temperature", self.S), ("top_p", self.S)])


def _offsets(fields):
    out, at = {}, 0
    for name, n in fields:
        out[name] = (at, at + n)
        at += n
    return out


class IoSlot:
    """One of the two alternating input/output buffers sets. `index` is 0 or 1."""

    def __init__(self, index: int, max_tokens: int, max_seqs: int, max_blocks: int, device: torch.device):
        self.index = index
        pin = device.type == "cuda"
        n64 = 4 * max_tokens + 3 * max_seqs
        n32 = 2 * max_seqs + 1 + max_seqs + max_seqs * max_blocks
        n_f = 2 * max_seqs
        self.host64 = torch.zeros(n64, dtype=torch.int64, pin_memory=pin)
        self.host32 = torch.zeros(n32, dtype=torch.int32, pin_memory=pin)
        self.hostf = torch.zeros(n_f, dtype=torch.float32, pin_memory=pin)
        self.np64, self.np32, self.npf = self.host64.numpy(), self.host32.numpy(), self.hostf.numpy()
        if device.type == "cuda":
            self.dev64 = torch.zeros(n64, dtype=torch.int64, device=device)
            self.dev32 = torch.zeros(n32, dtype=torch.int32, device=device)
            self.devf = torch.zeros(n_f, dtype=torch.float32, device=device)
            self.host_out = torch.zeros(max_seqs, dtype=torch.int64, pin_memory=True)
        else:  # on CPU the "device" buffers are the host buffers themselves
            self.dev64, self.dev32, self.devf = self.host64, self.host32, self.hostf
            self.host_out = torch.zeros(max_seqs, dtype=torch.int64)
        self.out_tokens = torch.zeros(max_seqs, dtype=torch.int64, device=device)


@dataclass
class Batch:
    """A filled slot for one step: sizes, host facts, and device views into the slot's packs."""
    plan: StepPlan
    slot: IoSlot
    layout: PackLayout
    sizes: tuple[int, int, int]      # element counts used in the int64/int32/float32 packs
    query_start_host: list[int]
    seq_lens_host: list[int]
    max_query_len: int
    max_seq_len: int
    any_random: bool
    any_filter: bool
    num_carried: int

    def view(self, name: str) -> torch.Tensor:
        for layout, buf in ((self.layout.i64(), self.slot.dev64), (self.layout.i32(), self.slot.dev32),
                            (self.layout.f32(), self.slot.devf)):
            if name in layout:
                a, b = layout[name]
                return buf[a:b]
        raise KeyError(name)


def fill_slot(plan: StepPlan, slot: IoSlot, block_size: int) -> Batch:
    """Write the plan's tokens, positions, cache slots and sampling rows into the slot's pinned host buffers."""
    seqs = plan.seqs
    sampled = [s for s in seqs if s.sample]
    T, B, S = plan.num_tokens, len(seqs), len(sampled)
    max_blocks = max(len(s.req.blocks) for s in seqs)
    layout = PackLayout(T, B, S, max_blocks)
    o64, o32, of = layout.i64(), layout.i32(), layout.f32()
    np64, np32, npf = slot.np64, slot.np32, slot.npf

    ids, pos, slots, carry, qsl, lens = [], [], [], [], [0], []
    sample_idx, seeds, sample_pos, top_k, temp, top_p = [], [], [], [], [], []
    tables = np.zeros((B, max_blocks), dtype=np.int32)
    for b, s in enumerate(seqs):
        req, start, n = s.req, s.start, s.num_tokens
        blocks = req.blocks
        tables[b, :len(blocks)] = blocks
        if s.carry_row >= 0:
            ids.append(0)                   # placeholder: the device gathers the real token first thing
            carry.append(s.carry_row)
        else:
            ids.extend(req.token_at(p) for p in range(start, start + n))
            carry.extend([-1] * n)
        rng = range(start, start + n)
        pos.extend(rng)
        slots.extend(blocks[p // block_size] * block_size + p % block_size for p in rng)
        qsl.append(qsl[-1] + n)
        lens.append(start + n)
        if s.sample:
            p = req.params
            sample_idx.append(qsl[-1] - 1)
            seeds.append(req.seed)
            sample_pos.append(start + n)     # position of the token being sampled
            top_k.append(p.top_k)
            temp.append(p.temperature)
            top_p.append(p.top_p)

    for name, values in (("input_ids", ids), ("positions", pos), ("slot_mapping", slots), ("carry_rows", carry),
                         ("sample_idx", sample_idx), ("seeds", seeds), ("sample_pos", sample_pos)):
        a, b = o64[name]
        np64[a:b] = values
    for name, values in (("query_start_loc", qsl), ("seq_lens", lens), ("top_k", top_k)):
        a, b = o32[name]
        np32[a:b] = values
    a, b = o32["block_tables"]
    np32[a:b] = tables.reshape(-1)
    for name, values in (("temperature", temp), ("top_p", top_p)):
        a, b = of[name]
        npf[a:b] = values

    sizes = (max(e for _, e in o64.values()), max(e for _, e in o32.values()), max(e for _, e in of.values()))
    return Batch(plan, slot, layout, sizes, qsl, lens, max(s.num_tokens for s in seqs), max(lens),
                 any(t > 0 for t in temp), any(k > 0 or p < 1.0 for k, p in zip(top_k, top_p)),
                 sum(1 for s in seqs if s.carry_row >= 0))
