"""Tensor parallelism: each rank holds a slice of every attention and MLP layer, and the partial sums meet in an
all-reduce on the compute stream (inside the decode CUDA graphs too). torch.distributed carries it: NCCL on CUDA,
gloo on CPU.

Per decoder layer, for ranks r of N:
- attention: q_proj keeps the rows of query heads [r*H/N, (r+1)*H/N); k_proj/v_proj the rows of the KV heads
  those queries read: a slice when the KV heads split evenly, the one KV head of the group when there are fewer
  KV heads than ranks (replicated). o_proj keeps the matching columns and all-reduces its output.
- MLP: gate/up keep rows [r*I/N, (r+1)*I/N), down_proj the matching columns, then an all-reduce. Experts stored
  as 3D tensors (Qwen3-MoE, Mixtral) are cut the same way inside every expert; the router stays whole.
- a bias on an all-reduced projection stays on rank 0 only, so that the sum adds it once.
- the embedding and the norms are replicated; the lm_head is split by vocabulary and its logits all-gathered, so
  every rank samples the same tokens from the same logits (the next step's carried inputs live on every rank).
Every output element is the same dot product as at N=1, summed in a different order: float32 tokens equal N=1.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..config import ConfigError

# Families whose layers are built from the projections above (checked per layer at load, too).
TP_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gemma", "gemma2", "gemma3_text",
               "granite", "cohere", "smollm3")


@dataclass(frozen=True)
class TPLayout:
    """How one rank's share of the attention heads and MLP columns is cut."""
    rank: int
    size: int
    heads: int          # query heads on every rank
    kv_heads: int       # KV heads on every rank (1 when replicated)
    head_dim: int
    kv_replicated: bool

    def q_range(self) -> range:
        return range(self.rank * self.heads, (self.rank + 1) * self.heads)

    def kv_range(self, total_kv: int) -> range:
        if self.kv_replicated:   # the group of ranks sharing one KV head: the one its query heads read
            head = self.rank * total_kv // self.size
            return range(head, head + 1)
        return range(self.rank * self.kv_heads, (self.rank + 1) * self.kv_heads)

    def kv_share(self, full):
        """This rank's share of a model's KV layout (model/kv_layout.py): its KV heads, the same widths."""
        return dataclasses.replace(full, kv_heads=self.kv_heads)


def plan_layout(model_config, rank: int, size: int) -> TPLayout:
    """Check that the model splits over `size` ranks; ConfigError says what does not."""
    model_type = getattr(model_config, "model_type", "?")
    if model_type not in TP_FAMILIES:
        raise ConfigError(f"tensor parallel does not support model type {model_type!r}: its layers are not "
                          f"built from q/k/v/o and gate/up/down projections batchscope knows how to split. "
                          f"Supported at tensor_parallel_size > 1: {', '.join(TP_FAMILIES)}")
    heads = model_config.num_attention_heads
    kv = getattr(model_config, "num_key_value_heads", None) or heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // heads
    if heads % size:
        raise ConfigError(f"tensor_parallel_size {size} does not divide the {heads} attention heads of "
                          f"{model_type}")
    if kv % size and size % kv:
        raise ConfigError(f"tensor_parallel_size {size} neither divides the {kv} KV heads of {model_type} nor is "
                          f"a multiple of them (then each KV head would be replicated)")
    for name in ("intermediate_size", "moe_intermediate_size"):
        width = getattr(model_config, name, None)
        if isinstance(width, int) and width % size:
            raise ConfigError(f"tensor_parallel_size {size} does not divide {name} {width} of {model_type}")
    replicated = kv < size
    return TPLayout(rank, size, heads // size, 1 if replicated else kv // size, head_dim, replicated)


def sharded_config(model_config, layout: TPLayout):
    """A copy of the config that builds one rank's share directly (random presets too large to build whole)."""
    cfg = model_config.__class__.from_dict(model_config.to_dict())
    cfg.head_dim = layout.head_dim
    cfg.num_attention_heads = layout.heads
    cfg.num_key_value_heads = layout.kv_heads
    for name in ("intermediate_size", "moe_intermediate_size"):
        if isinstance(getattr(cfg, name, None), int):
            setattr(cfg, name, getattr(cfg, name) // layout.size)
    return cfg


# ---------------------------------------------------------------------------------------------------------------
# Collectives: on the current stream, so on the compute stream and inside the graphs captured there.
# ---------------------------------------------------------------------------------------------------------------
def _all_reduced(module: nn.Module, inputs, output):
    dist.all_reduce(output)
    return output


class GatheredHead(nn.Module):
    """The lm_head split by vocabulary: each rank computes its rows' logits, all ranks gather them all."""

    def __init__(self, weight: torch.Tensor, size: int):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.size = size
        self.out_features = weight.shape[0] * size                 # the logits' width once gathered

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        part = F.linear(hidden, self.weight)                       # [rows, vocab / N]
        parts = [torch.empty_like(part) for _ in range(self.size)]
        dist.all_gather(parts, part)
        return torch.cat(parts, dim=-1)


def _rows(linear: nn.Linear, index: torch.Tensor | None) -> None:
    if index is None:               # already built at this rank's shape
        return
    linear.weight = nn.Parameter(linear.weight.detach().index_select(0, index).contiguous(), requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.detach().index_select(0, index).contiguous(), requires_grad=False)
    linear.out_features = linear.weight.shape[0]


def _columns(linear: nn.Linear, index: torch.Tensor | None, rank: int) -> None:
    if index is not None:
        linear.weight = nn.Parameter(linear.weight.detach().index_select(1, index).contiguous(),
                                     requires_grad=False)
    if linear.bias is not None and rank != 0:
        linear.bias = nn.Parameter(torch.zeros_like(linear.bias), requires_grad=False)   # added once, by rank 0
    linear.in_features = linear.weight.shape[1]
    linear.register_forward_hook(_all_reduced)


def _head_rows(heads: range, head_dim: int) -> torch.Tensor:
    return torch.arange(heads.start * head_dim, heads.stop * head_dim)


def _split_attention(attn: nn.Module, layout: TPLayout, total_kv: int, where: str, cut: bool) -> None:
    projs = [getattr(attn, p, None) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    if not all(type(p) is nn.Linear for p in projs):
        raise ConfigError(f"tensor parallel: {where} has no plain q_proj/k_proj/v_proj/o_proj linears to split")
    q, k, v, o = projs
    q_rows = _head_rows(layout.q_range(), layout.head_dim).to(q.weight.device) if cut else None
    kv_rows = _head_rows(layout.kv_range(total_kv), layout.head_dim).to(q.weight.device) if cut else None
    for norm_name in ("q_norm", "k_norm"):
        norm = getattr(attn, norm_name, None)
        weight = getattr(norm, "weight", None)
        if weight is None:
            continue
        if weight.dim() == 1 and weight.shape[0] == layout.head_dim:
            continue                                     # per-head norm (Qwen3, Gemma 3): nothing to cut
        # a norm over all heads at once (OLMo 2) mixes heads that now live on different ranks
        raise ConfigError(f"tensor parallel: {where}.{norm_name} normalises across heads ({tuple(weight.shape)}), "
                          f"which a split by heads cannot reproduce")
    _rows(q, q_rows)
    _rows(k, kv_rows)
    _rows(v, kv_rows)
    _columns(o, q_rows, layout.rank)
    for attr, value in (("num_heads", layout.heads), ("num_key_value_heads", layout.kv_heads),
                        ("num_key_value_groups", layout.heads // layout.kv_heads)):
        if isinstance(getattr(attn, attr, None), int):
            setattr(attn, attr, value)


def _split_mlp(mlp: nn.Module, layout: TPLayout, cut: bool) -> bool:
    gate, up, down = (getattr(mlp, p, None) for p in ("gate_proj", "up_proj", "down_proj"))
    if all(type(p) is nn.Linear for p in (gate, up, down)):
        width = gate.out_features // layout.size
        cols = torch.arange(layout.rank * width, (layout.rank + 1) * width, device=gate.weight.device) if cut \
            else None
        _rows(gate, cols)
        _rows(up, cols)
        _columns(down, cols, layout.rank)
        return True
    gate_up, down = getattr(mlp, "gate_up_proj", None), getattr(mlp, "down_proj", None)
    if isinstance(gate_up, nn.Parameter) and isinstance(down, nn.Parameter) and gate_up.dim() == 3:
        if not cut:
            mlp.register_forward_hook(_all_reduced)
            return True
        # experts as 3D tensors: gate_up [E, 2I, H] (gate rows then up rows), down [E, H, I]
        full = down.shape[2]
        width = full // layout.size
        lo, hi = layout.rank * width, (layout.rank + 1) * width
        gu = gate_up.detach()
        mlp.gate_up_proj = nn.Parameter(torch.cat([gu[:, lo:hi], gu[:, full + lo:full + hi]], 1).contiguous(),
                                        requires_grad=False)
        mlp.down_proj = nn.Parameter(down.detach()[:, :, lo:hi].contiguous(), requires_grad=False)
        if isinstance(getattr(mlp, "intermediate_dim", None), int):
            mlp.intermediate_dim = width
        mlp.register_forward_hook(_all_reduced)
        return True
    return False


def shard_model(model: nn.Module, layout: TPLayout, cut: bool = True) -> list[str]:
    """Cut a whole model (loaded on every rank alike) down to this rank's share, in place; with `cut` False the
    layers were built at the share's shapes already and only get their all-reduces (and bias rule). The lm_head
    is split either way. Returns the layers done."""
    cfg = model.config
    total_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    done = []
    for i, layer in enumerate(decoder.layers):
        where = f"{type(model).__name__} layer {i}"
        attn = getattr(layer, "self_attn", None)
        if attn is None:
            raise ConfigError(f"tensor parallel: {where} has no self_attn to split")
        _split_attention(attn, layout, total_kv, where, cut)
        mlp = getattr(layer, "mlp", None) or getattr(layer, "block_sparse_moe", None)
        if mlp is None:
            raise ConfigError(f"tensor parallel: {where} has no MLP to split")
        split = _split_mlp(mlp, layout, cut)
        for part in ("experts", "shared_expert"):
            child = getattr(mlp, part, None)
            if child is not None:
                split = _split_mlp(child, layout, cut) or split
        if not split:
            raise ConfigError(f"tensor parallel: {where}'s MLP ({type(mlp).__name__}) has no gate/up/down "
                              f"projections or 3D experts to split")
        done.append(where)
    share_head(model, layout)
    return done


def share_head(model: nn.Module, layout: TPLayout) -> None:
    """Split the lm_head by vocabulary (a tied one gets its own copy of the rows); left whole when the
    vocabulary does not divide evenly, where every rank computes all logits itself."""
    head = model.get_output_embeddings()
    vocab = head.weight.shape[0]
    if vocab % layout.size or head.bias is not None:
        return
    part = vocab // layout.size
    rows = head.weight.detach()[layout.rank * part:(layout.rank + 1) * part].clone()
    model.set_output_embeddings(GatheredHead(rows, layout.size))
    model.config.tie_word_embeddings = False


def measure_allreduce(hidden: int, dtype: torch.dtype, device: torch.device, rows=(1, 8, 32, 64, 128, 256),
                      repeat: int = 20) -> dict[int, float]:
    """Microseconds one all-reduce of [rows, hidden] takes here, as decode runs it: inside a CUDA graph on CUDA
    (eagerly on CPU), after a warm-up: the median of three graph replays on CUDA, the least of the calls on CPU.
    Every rank must call it at the same point (it is collective). Start-up only: it syncs."""
    out: dict[int, float] = {}
    for n in rows:
        x = torch.zeros(n, hidden, dtype=dtype, device=device)
        if device.type != "cuda":
            for _ in range(3):
                dist.all_reduce(x)
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter_ns()
                dist.all_reduce(x)
                times.append((time.perf_counter_ns() - t0) / 1e3)
            # the least: on a CPU the ranks share cores, and the rest is waiting for the other rank to be scheduled
            out[n] = round(min(times), 2)
            continue
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            dist.all_reduce(x)                      # warm, outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(repeat):
                    dist.all_reduce(x)
            graph.replay()
            times = []
            for _ in range(3):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3 / repeat)
        out[n] = round(statistics.median(times), 2)
        del graph
    return out
