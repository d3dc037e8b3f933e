"""A step plan turned into flat tensors inside an IO slot (pinned host buffers + their device twins).

Everything a step needs crosses to the device in three copies (int64, int32, float32 packs), and everything it
gives back crosses to the host in one (the output pack). The host fills a slot only after the device has finished
reading it (the runner guards that with the slot's events).

A step where some request has penalties or asks for logprobs is an `extras` step: its packs hold the penalty
fields too, and its output pack a logprobs record per sampled row. Every other step's packs, copies and kernels
are what they were before either existed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from .config import MAX_TOP_LOGPROBS
from .parallel import wire
from .scheduler import ScheduledSeq, StepPlan

# A sampled row's logprobs record in the output pack, in 32-bit words: its token's logprob, the top logprobs, the
# top token ids (int32), one word of padding so that records stay int64-aligned.
RECORD_WORDS = 2 * MAX_TOP_LOGPROBS + 2
_RECORD_INT64 = RECORD_WORDS // 2


def read_record(record: np.ndarray, k: int) -> tuple[float, list[tuple[int, float]]]:
    """One sampled row's logprobs from its host record: its token's, and the `k` most likely (id, logprob)."""
    ids = record[1 + MAX_TOP_LOGPROBS:1 + MAX_TOP_LOGPROBS + k].view(np.int32)
    return float(record[0]), list(zip(ids.tolist(), record[1:1 + k].tolist()))


class GraphShape(NamedTuple):
    """A step's padded layout, fixed so that a CUDA graph can replay it (graphs.py): `tokens` token rows over
    `rows` requests. decode: one sampled token per row (tokens == rows); mixed: any split of the tokens, the rows
    being all of the slot's, every row sampling."""
    kind: str
    tokens: int
    rows: int


GRAPH_KINDS = (None, "decode", "mixed")     # their codes on the wire to the other ranks


@dataclass
class PackLayout:
    """Offsets of each field inside the packs of one step (they depend on T tokens, B seqs, S samples)."""
    T: int
    B: int
    S: int
    max_blocks: int
    extras: bool = False    # the penalty fields follow the others (so the others keep their offsets)

    # int64 pack: input_ids[T] positions[T] slot_mapping[T] carry_rows[T] sample_idx[S] seeds[S] sample_pos[S]
    #   extras: prompt_rows[T] output_rows[T] reset_rows[B] penalty_rows[S] (penalties.py says what they mean)
    def i64(self) -> dict[str, tuple[int, int]]:
        T, S = self.T, self.S
        fields = [("input_ids", T), ("positions", T), ("slot_mapping", T), ("carry_rows", T),
                  ("sample_idx", S), ("seeds", S), ("sample_pos", S)]
        if self.extras:
            fields += [("prompt_rows", T), ("output_rows", T), ("reset_rows", self.B), ("penalty_rows", S)]
        return _offsets(fields)

    # int32 pack: query_start_loc[B+1] seq_lens[B] top_k[S] block_tables[B*max_blocks]
    def i32(self) -> dict[str, tuple[int, int]]:
        return _offsets([("query_start_loc", self.B + 1), ("seq_lens", self.B), ("top_k", self.S),
                         ("block_tables", self.B * self.max_blocks)])

    # float32 pack: temperature[S] top_p[S]; extras: repetition[S] frequency[S] presence[S]
    def f32(self) -> dict[str, tuple[int, int]]:
        fields = [("temperature", self.S), ("top_p", self.S)]
        if self.extras:
            fields += [("repetition", self.S), ("frequency", self.S), ("presence", self.S)]
        return _offsets(fields)


def _offsets(fields):
    out, at = {}, 0
    for name, n in fields:
        out[name] = (at, at + n)
        at += n
    return out


class IoSlot:
    """One of the two alternating input/output buffers sets. `index` is 0 or 1.

    It is sized for `max_batch_tokens` tokens over `max_running` requests. The output pack (`out` on the device,
    `host_out` pinned) holds the sampled tokens at [0, max_running) and, for an extras step, one logprobs record
    per sampled row after them: one copy brings both back."""

    def __init__(self, index: int, max_batch_tokens: int, max_running: int, max_blocks: int, device: torch.device):
        self.index = index
        self.max_running = max_running  # also the penalty scratch row: rows 0..max_running-1 belong to requests
        pin = device.type == "cuda"
        n64 = 6 * max_batch_tokens + 5 * max_running
        n32 = 2 * max_running + 1 + max_running + max_running * max_blocks
        n_f = 5 * max_running
        n_out = max_running * (1 + _RECORD_INT64)
        self.host64 = torch.zeros(n64, dtype=torch.int64, pin_memory=pin)
        self.host32 = torch.zeros(n32, dtype=torch.int32, pin_memory=pin)
        self.hostf = torch.zeros(n_f, dtype=torch.float32, pin_memory=pin)
        self.host_out = torch.zeros(n_out, dtype=torch.int64, pin_memory=pin)
        self.np64, self.np32, self.npf = self.host64.numpy(), self.host32.numpy(), self.hostf.numpy()
        if device.type == "cuda":
            self.dev64 = torch.zeros(n64, dtype=torch.int64, device=device)
            self.dev32 = torch.zeros(n32, dtype=torch.int32, device=device)
            self.devf = torch.zeros(n_f, dtype=torch.float32, device=device)
        else:  # on CPU the "device" buffers are the host buffers themselves
            self.dev64, self.dev32, self.devf = self.host64, self.host32, self.hostf
        self.out = torch.zeros(n_out, dtype=torch.int64, device=device)
        self.out_tokens = self.out[:max_running]

    def out_size(self, num_sampled: int, extras: bool) -> int:
        """Elements of the output pack a step fills: its tokens, and its records after all token places."""
        return self.max_running + num_sampled * _RECORD_INT64 if extras and num_sampled else num_sampled

    def records(self, num_sampled: int) -> torch.Tensor:
        """The device's logprobs records of a step, [S, RECORD_WORDS] float32 (the ids through .view(int32))."""
        return self.out[self.max_running:self.max_running + num_sampled * _RECORD_INT64].view(torch.float32).view(
            num_sampled, RECORD_WORDS)

    def host_records(self, num_sampled: int) -> np.ndarray:
        """The same records in pinned host memory, once the step's copy is complete."""
        words = self.host_out[self.max_running:self.max_running + num_sampled * _RECORD_INT64].numpy()
        return words.view(np.float32).reshape(num_sampled, RECORD_WORDS)


def carry_source(slots: list[IoSlot], slot: IoSlot) -> torch.Tensor:
    """The device tensor a step on `slot` gathers its carried tokens from: the other slot's output. A step carries
    only from the step in flight while it was built, numbered one before it, and step numbers alternate slots. The
    step graphs are captured reading this same tensor."""
    return slots[1 - slot.index].out_tokens


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
    graph: GraphShape | None = None  # the padded layout, when the step may replay a captured graph
    extras: bool = False             # penalties and logprobs run in this step (see the module's docstring)

    def to_message(self) -> bytes:
        """This step as bytes for the other tensor-parallel ranks (parallel/wire.py; `from_message` reads it)."""
        n64, n32, nf = self.sizes
        lay, s = self.layout, self.slot
        header = {"step": self.plan.step, "slot": s.index, "T": lay.T, "B": lay.B, "S": lay.S,
                  "max_blocks": lay.max_blocks, "n64": n64, "n32": n32, "nf": nf,
                  "graph_kind": GRAPH_KINDS.index(self.graph.kind if self.graph else None),
                  "graph_tokens": self.graph.tokens if self.graph else 0,
                  "graph_rows": self.graph.rows if self.graph else 0,
                  "any_random": self.any_random, "any_filter": self.any_filter, "num_carried": self.num_carried,
                  "num_sampled": self.num_sampled, "max_query_len": self.max_query_len,
                  "max_seq_len": self.max_seq_len, "extras": self.extras}
        return wire.encode(header, s.np64[:n64], s.np32[:n32], s.npf[:nf])

    def view(self, name: str) -> torch.Tensor:
        for layout, buf in ((self.layout.i64(), self.slot.dev64), (self.layout.i32(), self.slot.dev32),
                            (self.layout.f32(), self.slot.devf)):
            if name in layout:
                a, b = layout[name]
                return buf[a:b]
        raise KeyError(name)


def fill_slot(plan: StepPlan, slot: IoSlot, block_size: int, shape: GraphShape | None = None,
              table_width: int | None = None, scratch_block: int = 0, extras: bool | None = None) -> Batch:
    """Write the plan's tokens, positions, cache slots and sampling rows into the slot's pinned host buffers.

    With a `shape` (a CUDA graph's) the layout is fixed, and a block table `table_width` wide, so every field sits
    at the address the graph was captured with. A decode shape's padding rows decode a dummy token greedily into
    `scratch_block`, which no request ever owns; a mixed shape's padding tokens belong to no row and write only
    `scratch_block`, its padding rows hold no token and sample greedily from token 0. `extras` None: from the plan
    (a capture forces it)."""
    seqs = plan.seqs
    if extras is None:
        extras = any(s.req.wants_extras for s in seqs)
    fields = _seq_fields(seqs, block_size)
    if extras:
        fields.update(_penalty_fields(seqs, scratch_row=slot.max_running))
    any_random = any(t > 0 for t in fields["temperature"])
    any_filter = any(k > 0 or p < 1.0 for k, p in zip(fields["top_k"], fields["top_p"]))
    if shape is not None and shape.kind == "decode":
        _pad(fields, len(seqs), shape.rows, scratch_block * block_size, slot.max_running)
    elif shape is not None:
        _pad_mixed(fields, len(seqs), shape, scratch_block * block_size, slot.max_running)
    lens = fields["seq_lens"]
    B = len(lens)
    width = table_width or max(len(s.req.blocks) for s in seqs)
    tables = np.full((B, width), scratch_block, dtype=np.int32)
    for b, s in enumerate(seqs):
        tables[b, :len(s.req.blocks)] = s.req.blocks
    fields["block_tables"] = tables.reshape(-1)
    layout = PackLayout(len(fields["input_ids"]), B, len(fields["sample_idx"]), width, extras)
    packs = ((layout.i64(), slot.np64), (layout.i32(), slot.np32), (layout.f32(), slot.npf))
    for offsets, buf in packs:
        for name, (a, b) in offsets.items():
            buf[a:b] = fields[name]
    sizes = tuple(max((e for _, e in offsets.values()), default=0) for offsets, _ in packs)
    qsl = fields["query_start_loc"]
    return Batch(plan, slot, layout, sizes, qsl, lens, max(q1 - q0 for q0, q1 in zip(qsl, qsl[1:])), max(lens),
                 any_random, any_filter, sum(1 for s in seqs if s.carry_row >= 0), len(plan.sampled),
                 graph=shape, extras=extras)


def _seq_fields(seqs: list[ScheduledSeq], block_size: int) -> dict[str, list]:
    """Every step's fields, per token, per seq and per sampled row, for the plan's own seqs (local lists: this
    loop runs for every row of every step)."""
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
    return {"input_ids": ids, "positions": pos, "slot_mapping": slots, "carry_rows": carry, "query_start_loc": qsl,
            "seq_lens": lens, "sample_idx": sample_idx, "seeds": seeds, "sample_pos": sample_pos, "top_k": top_k,
            "temperature": temp, "top_p": top_p}


def _penalty_fields(seqs: list[ScheduledSeq], scratch_row: int) -> dict[str, list]:
    """An extras step's penalty fields (penalties.py): which row each input token counts in, as a prompt token
    or as an output token, which rows start from zero (a chunk at position 0: a new request, or a recompute
    after preemption), and each sampled row's counts and penalties. Requests without penalties use the scratch
    row, with neutral penalties."""
    f = {name: [] for name in ("prompt_rows", "output_rows", "reset_rows", "penalty_rows", "repetition",
                               "frequency", "presence")}
    for s in seqs:
        req, start, n = s.req, s.start, s.num_tokens
        row = req.penalty_row if req.penalty_row >= 0 else scratch_row
        in_prompt = max(0, min(start + n, len(req.prompt_ids)) - start)   # the chunk's tokens inside the prompt
        f["prompt_rows"].extend([row] * in_prompt + [scratch_row] * (n - in_prompt))
        f["output_rows"].extend([scratch_row] * in_prompt + [row] * (n - in_prompt))
        f["reset_rows"].append(row if start == 0 else scratch_row)
        if s.sample:
            p = req.params
            f["penalty_rows"].append(row)
            f["repetition"].append(p.repetition_penalty)
            f["frequency"].append(p.frequency_penalty)
            f["presence"].append(p.presence_penalty)
    return f


def _pad(f: dict[str, list], real_rows: int, pad_to: int, scratch_slot: int, scratch_row: int) -> None:
    """Padding rows up to a graph bucket: a dummy token decoded greedily into the scratch block, counted (in an
    extras step) in the scratch row with neutral penalties."""
    n = pad_to - real_rows
    for name, value in (("input_ids", 0), ("positions", 0), ("slot_mapping", scratch_slot), ("carry_rows", -1),
                        ("seq_lens", 1), ("seeds", 0), ("sample_pos", 0), ("top_k", 0), ("temperature", 0.0),
                        ("top_p", 1.0)):
        f[name].extend([value] * n)
    f["sample_idx"].extend(range(real_rows, pad_to))
    qsl = f["query_start_loc"]
    qsl.extend(range(qsl[-1] + 1, qsl[-1] + 1 + n))
    if "penalty_rows" in f:
        for name, value in (("prompt_rows", scratch_row), ("output_rows", scratch_row), ("reset_rows", scratch_row),
                            ("penalty_rows", scratch_row), ("repetition", 1.0), ("frequency", 0.0),
                            ("presence", 0.0)):
            f[name].extend([value] * n)


def _pad_mixed(f: dict[str, list], real_rows: int, shape: GraphShape, scratch_slot: int, scratch_row: int) -> None:
    """Padding up to a mixed shape. Tokens: a dummy at position 0 into the scratch block, in no row (past the
    last query start: the attention kernel gives them no program, and every other op works token by token).
    Rows: no tokens and no context (the kernel skips them). Sampled rows: greedy, from token 0, never read back.
    In an extras step all of it counts in the scratch row with neutral penalties."""
    tokens = shape.tokens - len(f["input_ids"])
    rows = shape.rows - real_rows
    sampled = shape.rows - len(f["sample_idx"])
    for name, value in (("input_ids", 0), ("positions", 0), ("slot_mapping", scratch_slot), ("carry_rows", -1)):
        f[name].extend([value] * tokens)
    f["seq_lens"].extend([0] * rows)
    f["query_start_loc"].extend([f["query_start_loc"][-1]] * rows)
    for name, value in (("sample_idx", 0), ("seeds", 0), ("sample_pos", 0), ("top_k", 0), ("temperature", 0.0),
                        ("top_p", 1.0)):
        f[name].extend([value] * sampled)
    if "penalty_rows" in f:
        for name, n in (("prompt_rows", tokens), ("output_rows", tokens), ("reset_rows", rows),
                        ("penalty_rows", sampled)):
            f[name].extend([scratch_row] * n)
        for name, value in (("repetition", 1.0), ("frequency", 0.0), ("presence", 0.0)):
            f[name].extend([value] * sampled)


# -- the same step on the other tensor-parallel ranks ----------------------------------------------------------
# Rank 0 fills its slot from the plan; the other ranks get the filled packs (parallel/wire.py) and run the same step.
def from_message(data: bytes, slot: IoSlot) -> Batch:
    """Write a message into this rank's own slot (the caller has waited for it to be free)."""
    h, p64, p32, pf = wire.decode(data)
    n64, n32, nf = h["n64"], h["n32"], h["nf"]
    slot.np64[:n64], slot.np32[:n32], slot.npf[:nf] = p64, p32, pf
    layout = PackLayout(h["T"], h["B"], h["S"], h["max_blocks"], bool(h["extras"]))
    a, b = layout.i32()["query_start_loc"]
    qsl = slot.np32[a:b].tolist()
    a, b = layout.i32()["seq_lens"]
    lens = slot.np32[a:b].tolist()
    kind = GRAPH_KINDS[h["graph_kind"]]
    graph = GraphShape(kind, h["graph_tokens"], h["graph_rows"]) if kind else None
    return Batch(_Relayed(h["step"]), slot, layout, (n64, n32, nf), qsl, lens, h["max_query_len"],
                 h["max_seq_len"], bool(h["any_random"]), bool(h["any_filter"]), h["num_carried"],
                 h["num_sampled"], graph, bool(h["extras"]))


@dataclass
class _Relayed:
    """The plan of a step received from rank 0: only its number travels."""
    step: int
