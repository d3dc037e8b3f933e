"""A step plan turned into flat tensors inside an IO slot (pinned host buffers + their device twins).

Everything a step needs crosses to the device in three copies (int64, int32, float32 packs). The host fills a
slot only after the device has finished reading it (the runner guards that with the slot's events).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .parallel import wire
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
    num_sampled: int                 # rows whose token the host reads back (padding rows excluded)
    graph_bucket: int | None = None  # set when the step replays a captured decode graph

    def to_message(self) -> bytes:
        """This step as bytes for the other tensor-parallel ranks (parallel/wire.py; `from_message` reads it)."""
        n64, n32, nf = self.sizes
        lay, s = self.layout, self.slot
        header = {"step": self.plan.step, "slot": s.index, "T": lay.T, "B": lay.B, "S": lay.S,
                  "max_blocks": lay.max_blocks, "n64": n64, "n32": n32, "nf": nf,
                  "graph_bucket": -1 if self.graph_bucket is None else self.graph_bucket,
                  "any_random": self.any_random, "any_filter": self.any_filter, "num_carried": self.num_carried,
                  "num_sampled": self.num_sampled, "max_query_len": self.max_query_len,
                  "max_seq_len": self.max_seq_len}
        return wire.encode(header, s.np64[:n64], s.np32[:n32], s.npf[:nf])

    def view(self, name: str) -> torch.Tensor:
        for layout, buf in ((self.layout.i64(), self.slot.dev64), (self.layout.i32(), self.slot.dev32),
                            (self.layout.f32(), self.slot.devf)):
            if name in layout:
                a, b = layout[name]
                return buf[a:b]
        raise KeyError(name)


def fill_slot(plan: StepPlan, slot: IoSlot, block_size: int, pad_to: int | None = None,
              table_width: int | None = None, scratch_block: int = 0) -> Batch:
    """Write the plan's tokens, positions, cache slots and sampling rows into the slot's pinned host buffers.

    With `pad_to` (a CUDA-graph decode bucket) the layout is fixed: `pad_to` one-token rows and a block table
    `table_width` wide, so every field sits at the address the graph was captured with. Padding rows decode a
    dummy token greedily into `scratch_block`, which no request ever owns."""
    seqs = plan.seqs
    ids, pos, slots, carry, qsl, lens = [], [], [], [], [0], []
    sample_idx, seeds, sample_pos, top_k, temp, top_p = [], [], [], [], [], []
    for s in seqs:
        req, start, n = s.req, s.start, s.num_tokens
        blocks = req.blocks
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
    any_random = any(t > 0 for t in temp)
    any_filter = any(k > 0 or p < 1.0 for k, p in zip(top_k, top_p))
    real_rows = len(seqs)
    width = table_width or max(len(s.req.blocks) for s in seqs)
    if pad_to is not None:
        for row in range(real_rows, pad_to):
            ids.append(0); pos.append(0); slots.append(scratch_block * block_size); carry.append(-1)
            qsl.append(qsl[-1] + 1); lens.append(1)
            sample_idx.append(row); seeds.append(0); sample_pos.append(0)
            top_k.append(0); temp.append(0.0); top_p.append(1.0)
    B = len(lens)
    tables = np.full((B, width), scratch_block, dtype=np.int32)
    for b, s in enumerate(seqs):
        tables[b, :len(s.req.blocks)] = s.req.blocks
    layout = PackLayout(len(ids), B, len(sample_idx), width)
    o64, o32, of = layout.i64(), layout.i32(), layout.f32()
    np64, np32, npf = slot.np64, slot.np32, slot.npf
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
    return Batch(plan, slot, layout, sizes, qsl, lens, max(q1 - q0 for q0, q1 in zip(qsl, qsl[1:])), max(lens),
                 any_random, any_filter, sum(1 for s in seqs if s.carry_row >= 0), len(plan.sampled))


# -- the same step on the other tensor-parallel ranks ----------------------------------------------------------
# Rank 0 fills its slot from the plan; the other ranks get the filled packs (parallel/wire.py) and run the same step.
def from_message(data: bytes, slot: IoSlot) -> Batch:
    """Write a message into this rank's own slot (the caller has waited for it to be free)."""
    h, p64, p32, pf = wire.decode(data)
    n64, n32, nf = h["n64"], h["n32"], h["nf"]
    slot.np64[:n64], slot.np32[:n32], slot.npf[:nf] = p64, p32, pf
    layout = PackLayout(h["T"], h["B"], h["S"], h["max_blocks"])
    a, b = layout.i32()["query_start_loc"]
    qsl = slot.np32[a:b].tolist()
    a, b = layout.i32()["seq_lens"]
    lens = slot.np32[a:b].tolist()
    return Batch(_Relayed(h["step"]), slot, layout, (n64, n32, nf), qsl, lens, h["max_query_len"],
                 h["max_seq_len"], bool(h["any_random"]), bool(h["any_filter"]), h["num_carried"],
                 h["num_sampled"], None if h["graph_bucket"] < 0 else h["graph_bucket"])


@dataclass
class _Relayed:
    """The plan of a step received from rank 0: only its number travels."""
    step: int
