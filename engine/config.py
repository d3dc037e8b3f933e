"""Engine and sampling configuration: plain dataclasses, validated once at the edge (fields only: whether a model
folder loads is model.loading.preflight's question). The one module every part of the engine may import."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

MODES = ("sync", "async")
DTYPES = ("auto", "float32", "bfloat16", "float16")
# The model presets' names (model/presets.py builds them): here, torch-free, so that `--help` can list them all
PRESETS = ("smollm2-135m", "tiny-random", "llama3-8b-random", "qwen3-30b-a3b-random", "llama3-70b-random",
           "llama3-405b-random")
MAX_TOP_LOGPROBS = 20               # OpenAI's top_logprobs limit: every logprobs step computes this many alternatives


class ConfigError(ValueError):
    """A configuration or request parameter is invalid; the message says which and why."""


class EngineUnavailable(RuntimeError):
    """The engine takes no more work: it is closed, or a tensor-parallel rank it needs is gone."""


@dataclass
class EngineConfig:
    model: str = "smollm2-135m"
    device: str = "auto"            # "auto" | "cpu" | "cuda" | "cuda:N"
    dtype: str = "auto"             # "auto": bfloat16 on CUDA, float32 on CPU
    mode: str = "async"             # "sync" | "async"
    block_size: int = 16
    num_blocks: int | None = None   # None: from kv_memory_fraction of free GPU memory (512 on CPU)
    kv_memory_fraction: float = 0.5
    max_batch_tokens: int | None = None  # per-step token budget (prefill chunks + decodes). None: adaptive, chosen
                                    # each step from measured step times (budget.py, docs/budget.md); N: fixed N
    itl_target_ms: float | None = None  # adaptive budget: a step carrying prefill stays within this many ms
                                    # (None: 2x the current decode step)
    budget_max_tokens: int | None = None  # adaptive budget: the most one step carries (None: 8192 on CUDA, 2048 on
                                    # CPU); buffers are sized for it
    max_running: int = 64
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    seed: int = 0
    attention: str = "auto"         # "auto" | "torch" | "triton"
    cuda_graphs: bool = True        # steps replay CUDA graphs where the attention path allows it (graphs.py)
    mixed_graphs: bool = True       # steps with prefill too, not only decode (one rank; budgets to 2048 tokens)
    fused_kernels: bool = True      # batchscope's kernels in the model (model/speedups.py): on CUDA with Triton,
                                    # fused norms, rotary, SiLU*up, few-row GEMMs; on CPU, oneDNN-packed linears
    merge_projections: bool = True  # one GEMM for q/k/v and one for gate/up per layer (kernels/projections.py)
    tensor_parallel_size: int = 1   # ranks (one process and one GPU each) the model's layers are split over
    cpu_threads: int | None = None  # a CPU engine's math threads, its ranks together (None: torch's default)
    nice: int = 0                   # the engine's steps at a lower CPU priority (Linux niceness, 0-19): a CPU
                                    # engine gives way to a browser drawing its page on the same cores

    def validate(self) -> "EngineConfig":
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.attention not in ("auto", "torch", "triton"):
            raise ConfigError(f"attention must be auto, torch or triton, got {self.attention!r}")
        for name in ("block_size", "max_batch_tokens", "max_running", "tensor_parallel_size", "budget_max_tokens"):
            value = getattr(self, name)
            if name in ("max_batch_tokens", "budget_max_tokens") and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.itl_target_ms is not None and (not _is_number(self.itl_target_ms)
                                               or not 0 < float(self.itl_target_ms) < float("inf")):
            raise ConfigError(f"itl_target_ms must be a positive number of milliseconds, got {self.itl_target_ms!r}")
        if self.max_batch_tokens is not None and (self.itl_target_ms is not None
                                                  or self.budget_max_tokens is not None):
            raise ConfigError("itl_target_ms and budget_max_tokens size the adaptive budget; a fixed "
                              "max_batch_tokens takes neither (leave max_batch_tokens unset for the adaptive one)")
        if self.cpu_threads is not None and (isinstance(self.cpu_threads, bool) or not isinstance(self.cpu_threads, int)
                                             or self.cpu_threads < 1):
            raise ConfigError(f"cpu_threads must be a positive integer, got {self.cpu_threads!r}")
        if isinstance(self.nice, bool) or not isinstance(self.nice, int) or not 0 <= self.nice <= 19:
            raise ConfigError(f"nice must be an integer from 0 to 19, got {self.nice!r}")
        if self.num_blocks is not None and (not isinstance(self.num_blocks, int) or self.num_blocks < 2):
            raise ConfigError(f"num_blocks must be an integer >= 2, got {self.num_blocks!r}")
        if not 0.0 < self.kv_memory_fraction < 1.0:
            raise ConfigError(f"kv_memory_fraction must be in (0, 1), got {self.kv_memory_fraction!r}")
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError(f"model must be a preset name, a checkpoint folder or a hub id, got {self.model!r}")
        return self


@dataclass
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 0.0        # 0: greedy
    top_p: float = 1.0
    top_k: int = 0                  # 0: off
    seed: int | None = None         # None: drawn from the engine's own generator at submit
    ignore_eos: bool = False
    stop: tuple[str, ...] = field(default_factory=tuple)
    # None: no logprobs; 0: the chosen token's only; k in 1..20: also the k most likely tokens (OpenAI's
    # top_logprobs). Log-softmax of the model's own logits, before penalties and temperature (vLLM's raw_logprobs).
    logprobs: int | None = None
    presence_penalty: float = 0.0   # OpenAI/vLLM: minus this from every token the output holds at least once
    frequency_penalty: float = 0.0  # OpenAI/vLLM: minus this times how often the output holds the token
    repetition_penalty: float = 1.0  # HF/vLLM: tokens in the prompt or the output: positive logits divided by it,
                                     # negative ones multiplied; 1.0: off

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def validate(self) -> "SamplingParams":
        def bad(msg: str) -> ConfigError:
            return ConfigError(f"invalid sampling parameters: {msg}")

        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise bad(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or not (0.0 <= float(self.temperature) <= 100.0):
            raise bad(f"temperature must be a number in [0, 100], got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < float(self.top_p) <= 1.0):
            raise bad(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise bad(f"seed must be a non-negative integer or None, got {self.seed!r}")
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop)
        if not all(isinstance(s, str) and s for s in self.stop):
            raise bad("stop must be a sequence of non-empty strings")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise bad(f"logprobs must be None or an integer in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2.0 <= float(value) <= 2.0:
                raise bad(f"{name} must be a number in [-2, 2], got {value!r}")
        if not _is_number(self.repetition_penalty) or not (math.isfinite(self.repetition_penalty)
                                                           and self.repetition_penalty > 0.0):
            raise bad(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty!r}")
        return self


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
