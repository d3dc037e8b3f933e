"""A local checkpoint folder's files, checked cheaply and without reading a weight: a config that names its model
type, weights that are all there (safetensors headers against file sizes, index shards present) and tokenizer
files that parse. Loading runs these before transformers sees the folder, so a broken download gets one clear line."""
from __future__ import annotations

import json
import struct
from pathlib import Path

from ..config import ConfigError


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


# Files that say a folder ships a tokenizer; one of the last four holds its vocabulary.
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer.model",
                   "vocab.json", "vocab.txt")


def read_config(path: str | Path) -> dict:
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
    data = read_config(folder)
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
