"""What another setting would do to a recorded load, predicted by replaying it through the engine's own scheduler
on a virtual clock with a step-time model fitted to the recording (docs/whatif.md); `measure` runs it for real."""
from .predict import SCHEMA_ID, predict
from .recording import Recording, WhatIfError, open_recording
from .settings import KEYS, parse

__all__ = ["SCHEMA_ID", "predict", "Recording", "WhatIfError", "open_recording", "KEYS", "parse"]
