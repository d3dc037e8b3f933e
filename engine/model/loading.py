"""Loading a model: a preset (presets.py), a local checkpoint folder (checked first, checkpoint.py) or a hub id,
with batchscope's attention set and the support policy run (support.py). What comes back carries the model, its
tokenizer, its EOS ids, its context length and its KV layout."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import PRESETS, ConfigError, EngineConfig
from ..parallel.sharding import sharded_config
from .attention import ATTN_NAME
from .checkpoint import TOKENIZER_FILES, check_checkpoint_folder, first_line, read_config
from .kv_layout import KVLayout
from .presets import check_fits, random_model, random_preset_config, smollm2_checkpoint, smollm2_tokenizer
from .support import check_support, static_support, unsupported

@dataclass
class LoadedModel:
    model: torch.nn.Module          # a transformers *ForCausalLM
    tokenizer: object | None        # None for checkpoints without one (token-id prompts only)
    name: str
    eos_token_ids: tuple[int, ...]
    max_model_len: int
    kv_layout: KVLayout             # what a token stores per layer: seen by the support probe, else the config's
    support: dict = field(default_factory=dict)   # what check_support found (engine.info can show it)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} asked for, but CUDA is not available here")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def _tokenizer_from(path: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path)


def load_model(config: EngineConfig, attn_implementation: str | None = None, device: torch.device | None = None,
               dtype: torch.dtype | None = None, shard=None) -> LoadedModel:
    """Load a preset, a local checkpoint folder or a hub id. With our paged attention as `attn_implementation`
    the support policy runs too (see the module doc): what the engine cannot run exactly raises ConfigError.
    `device`/`dtype` override the config's (a tensor-parallel rank loads whole on the CPU, then cuts).
    `shard` (a parallel.sharding.TPLayout) builds a SHARDED_PRESETS model at one rank's shapes: every rank draws
    the same shares from the seed, and the lm_head whole (each rank keeps its rows of it)."""
    device = device or resolve_device(config.device)
    dtype = dtype or resolve_dtype(config.dtype, device)
    name = config.model
    ours = attn_implementation == ATTN_NAME
    # an engine that computes on this CPU keeps the weights it loads; a rank loaded here to be cut and moved to
    # a GPU (parallel/) copies them on the way anyway
    own = device.type == "cpu" and resolve_device(config.device).type == "cpu"
    if name == "smollm2-135m":
        ckpt = smollm2_checkpoint()
        model, tokenizer = _load_checkpoint(str(ckpt), dtype, device, own)
    elif name in PRESETS:
        tokenizer = _tokenizer_from(smollm2_tokenizer())
        cfg = random_preset_config(name, len(tokenizer))
        if shard is not None:
            cfg = sharded_config(cfg, shard)
        check_fits(name, cfg, dtype, device)
        model = random_model(cfg, config.seed, dtype, device)
    else:
        if Path(name).is_dir():
            if ours:
                static_support(read_config(name))
            check_checkpoint_folder(name)
        model, tokenizer = _load_checkpoint(name, dtype, device, own)
    model.eval().requires_grad_(False)
    support: dict = {}
    layout = KVLayout.from_config(model.config)
    if attn_implementation is not None:
        try:
            model.set_attn_implementation(attn_implementation)
        except (ValueError, ImportError) as exc:
            raise unsupported(model.config.model_type, "no attention-backend support", str(exc)) from None
    if ours:
        support, layout = check_support(model)
    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    if eos is None:
        eos = model.config.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    max_len = config.max_model_len or getattr(model.config, "max_position_embeddings", None) or 4096
    return LoadedModel(model, tokenizer, name, eos_ids, int(max_len), layout, support)


def _load_checkpoint(name_or_path: str, dtype: torch.dtype, device: torch.device, own: bool = False):
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, device_map=str(device))
    except OSError as exc:
        raise ConfigError(f"cannot load model {name_or_path!r}: not a preset {PRESETS}, a local checkpoint "
                          f"folder or a reachable hub id ({exc.__class__.__name__}: {first_line(exc)})") from None
    except Exception as exc:        # corrupt weights, an unknown architecture, a config transformers rejects
        raise ConfigError(f"cannot load model {name_or_path!r} ({exc.__class__.__name__}: "
                          f"{first_line(exc)})") from None
    if own:
        own_weights(model)
    return model, _load_tokenizer(name_or_path)


def own_weights(model: torch.nn.Module) -> None:
    """Copy a CPU model's weights out of the safetensors file they are mapped from, one at a time. transformers
    hands out views of the mapped file, and the mapping lives as long as any of them: once the engine merges
    q/k/v and gate/up into new tensors (kernels/projections.py), the file's pages they came from stayed resident
    beside the merged copies (~270 MB for SmolLM2-135M, docs/memory.md). Bit for bit the same values."""
    for param in model.parameters():        # deduplicated: a tied lm_head is copied once, and stays tied
        param.data = param.data.clone()


def _load_tokenizer(name_or_path: str):
    """The checkpoint's tokenizer; None for a folder that ships none (token-id prompts only). A folder that
    ships one that does not load is an error, not a silent downgrade to token ids."""
    from transformers import AutoTokenizer

    folder = Path(name_or_path)
    ships = not folder.is_dir() or any((folder / f).exists() for f in TOKENIZER_FILES)
    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except Exception as exc:
        if folder.is_dir() and ships:
            raise ConfigError(f"{name_or_path}: the tokenizer does not load ({exc.__class__.__name__}: "
                              f"{first_line(exc)})") from None
        return None


def preflight(name: str) -> None:
    """Before anything starts: a local checkpoint folder's files and the static support policy, so that a
    refused or broken folder is told in one line before any weight is read (EngineConfig.validate checks fields
    only; the Engine and the CLI call this)."""
    if name in PRESETS or not Path(name).is_dir():
        return
    static_support(read_config(name))      # a refused family is told so even when its files are damaged too
    check_checkpoint_folder(name)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step must read: every parameter except the input embedding table (lm_head included)."""
    embed = model.get_input_embeddings().weight
    total = 0
    seen = set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    out = model.get_output_embeddings()
    tied = out is not None and out.weight.data_ptr() == embed.data_ptr()
    # A tied lm_head is read every step even though it shares storage with the embedding.
    return total if tied else total - embed.numel() * embed.element_size()


def model_config(config: EngineConfig):
    """The transformers config of the model, read without loading a weight."""
    name = config.model
    if name in PRESETS and name != "smollm2-135m":
        return random_preset_config(name, 49152)       # vocabulary size aside, the shapes are the preset's
    from transformers import AutoConfig

    path = str(smollm2_checkpoint()) if name == "smollm2-135m" else name
    try:
        return AutoConfig.from_pretrained(path)
    except Exception as exc:
        raise ConfigError(f"cannot read the config of {name!r} ({type(exc).__name__}: {exc})") from None
