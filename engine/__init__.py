"""batchscope's continuous-batching engine: paged KV cache, a sync loop and an async loop, a live switch."""
from .config import ConfigError, EngineConfig, EngineUnavailable, SamplingParams
from .request import RequestHandle, RequestOutput, TokenDelta
from .trace import GPU_PHASES, HOST_PHASES, ModeChange, StepTrace

__all__ = ["Engine", "EngineConfig", "SamplingParams", "ConfigError", "EngineUnavailable", "RequestHandle",
           "RequestOutput", "TokenDelta", "StepTrace", "ModeChange", "HOST_PHASES", "GPU_PHASES"]


def __getattr__(name):
    # Engine pulls in torch and transformers; import it lazily so config-only users stay light.
    if name == "Engine":
        from .engine import Engine
        return Engine
    raise AttributeError(name)
