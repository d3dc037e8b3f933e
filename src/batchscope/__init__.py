"""batchscope: an oscilloscope for LLM continuous batching.

    from batchscope import Engine, EngineConfig, SamplingParams

The engine, its telemetry and the dashboard install as `batchscope.engine`, `batchscope.telemetry` and
`batchscope.app`; imports run app -> telemetry -> engine.
"""
from importlib.metadata import PackageNotFoundError, version

from batchscope.engine import ConfigError, EngineConfig, RequestOutput, SamplingParams

try:
    __version__ = version("batchscope")
except PackageNotFoundError:        # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["Engine", "EngineConfig", "SamplingParams", "ConfigError", "RequestOutput", "__version__"]


def __getattr__(name):
    # Engine pulls in torch and transformers: import it on first use, so `batchscope --help` stays quick.
    if name == "Engine":
        from batchscope.engine import Engine
        return Engine
    raise AttributeError(name)
