"""batchscope telemetry: every engine step timed (CUDA events + host clocks), NVML sampled, recorded, streamed to
live viewers and exported (batchscope.timeline/1 JSON, Perfetto). Imports run app -> telemetry -> engine."""
from .export import TimelineError, build_timeline, load_timeline, validate_timeline
from .hub import Hub, Subscription, SubscriptionClosed
from .perfetto import to_perfetto
from .records import IDLE_CAUSES, SCHEMA_ID
from .schema import SCHEMA
from .session import Telemetry
from .summary import compare, percentiles, request_metrics, summarize

__all__ = ["Telemetry", "TimelineError", "load_timeline", "validate_timeline", "build_timeline", "to_perfetto",
           "SCHEMA_ID", "SCHEMA", "IDLE_CAUSES", "Hub", "Subscription", "SubscriptionClosed", "summarize",
           "compare", "percentiles", "request_metrics"]
