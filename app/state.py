"""AppState: what the HTTP routes, the websocket and the Gradio UI share — the engine, its telemetry, the
load generator, the limits and a loaded replay — behind a small set of methods that validate their inputs.

Errors speak for themselves: ValueError (bad input or over a cap, 400), BusyError (at capacity, 429),
NotFoundError (404), NoEngineError (replay-only, 409), telemetry.TimelineError (a malformed timeline, 400).
"""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Iterator

from batchscope.engine.config import MODES, EngineConfig, SamplingParams
from batchscope.telemetry.nvml import BUSY_NOTE

from .loadgen import BurstManager, BusyError, Limits

__all__ = ["AppState", "Limits", "BusyError", "NotFoundError", "NoEngineError"]

DEFAULT_NEW_TOKENS = 128           # when a caller does not say (capped by the limit)
RECORDING_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class NotFoundError(KeyError):
    """No such burst, A/B run or recording."""

    def __str__(self) -> str:           # KeyError quotes its message; a reason should read plainly
        return str(self.args[0]) if self.args else ""


class NoEngineError(RuntimeError):
    """The server runs replay-only: nothing can be generated."""


class AppState:
    def __init__(self, engine=None, telemetry=None, limits: Limits | None = None, replay: dict | None = None):
        self.engine = engine
        self.telemetry = telemetry
        self.limits = limits or Limits()
        self.replay: dict | None = replay
        self.started = time.time()
        self._lock = threading.Lock()
        self._recording: str | None = None
        self._closed = False
        self.bursts: BurstManager | None = None
        if engine is not None:
            self.bursts = BurstManager(engine, self.limits, self.vocab_size, telemetry=telemetry)

    # ------------------------------------------------------------------------------------------------ lifecycle
    @classmethod
    def load(cls, config: EngineConfig, limits: Limits | None = None, nvml_hz: float = 20.0) -> "AppState":
        """Load the model, start the engine and its telemetry."""
        from batchscope.engine import Engine
        from batchscope.telemetry import Telemetry

        engine = Engine(config)
        try:
            # ten seconds of history in the hello message: a new viewer fills its default window at once
            telemetry = Telemetry(engine, nvml_hz=nvml_hz, recent_s=10.0)
        except Exception:
            engine.close()
            raise
        return cls(engine, telemetry, limits)

    @classmethod
    def from_replay_file(cls, path: str | Path, limits: Limits | None = None) -> "AppState":
        """Replay-only: no model, the UI shows a recorded timeline. Raises TimelineError if the file is bad."""
        from batchscope.telemetry import load_timeline

        return cls(limits=limits, replay=load_timeline(path))

    def close(self) -> None:
        """Stop bursts, telemetry and the engine (in that order). Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.bursts is not None:
            self.bursts.close()
        if self.telemetry is not None:
            self.telemetry.close()
        if self.engine is not None:
            self.engine.close()

    @property
    def replay_only(self) -> bool:
        return self.engine is None

    def _need_engine(self):
        if self.engine is None:
            raise NoEngineError("this server is replaying a recorded timeline; no model is loaded")
        return self.engine

    # ---------------------------------------------------------------------------------------------- about it
    @property
    def model_name(self) -> str | None:
        if self.engine is not None:
            return self.engine.info.get("model")
        return (self.replay or {}).get("meta", {}).get("model")

    @property
    def vocab_size(self) -> int:
        eng = self._need_engine()
        return int(eng.info.get("vocab_size") or len(eng.tokenizer))

    def health(self) -> dict:
        if self.engine is None:
            meta = (self.replay or {}).get("meta", {})
            return {"status": "ok", "model": meta.get("model"), "device": meta.get("device"), "mode": None,
                    "replay_only": True}
        return {"status": "ok", "model": self.model_name, "device": self.engine.info.get("device"),
                "mode": self.engine.mode, "replay_only": False}

    def status(self) -> dict:
        out = {**self.health(), "busy_note": BUSY_NOTE, "limits": vars(self.limits).copy(),
               "uptime_s": time.time() - self.started, "replay_loaded": self.replay is not None}
        if self.engine is None:
            meta = (self.replay or {}).get("meta", {})
            out.update(gpu_name=meta.get("gpu"), dtype=meta.get("dtype"), nvml_available=False,
                       nvml_reason="replay-only: nothing is sampled")
            return out
        info, stats = self.engine.info, self.engine.stats()
        total = stats.get("kv_blocks_total") or 0
        out.update(
            dtype=info.get("dtype"), gpu_name=info.get("gpu_name"), info=info,
            queue=stats.get("waiting"), running=stats.get("running"), steps=stats.get("steps"),
            kv_blocks_used=stats.get("kv_blocks_used"), kv_blocks_total=total,
            kv_usage=(stats.get("kv_blocks_used", 0) / total) if total else None,
            bursts_running=self.bursts.running() if self.bursts else 0,
            recording=self._recording,
        )
        tel = self.telemetry.status() if self.telemetry is not None else {}
        out["telemetry"] = tel
        out["nvml_available"] = bool(tel.get("nvml"))
        out["nvml_reason"] = tel.get("nvml_reason")
        out["busy_note"] = tel.get("busy_note") or BUSY_NOTE
        out["gpu_name"] = out["gpu_name"] or tel.get("gpu_name")
        return out

    def set_mode(self, mode: str) -> dict:
        eng = self._need_engine()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        previous = eng.mode
        eng.set_mode(mode)
        return {"mode": mode, "previous": previous}

    # ------------------------------------------------------------------------------------------- generating
    def encode(self, prompt: str | list[int], chat: bool | None = False) -> list[int]:
        """Token ids of a prompt, checked against the limits. chat=True wraps it as one user message through the
        chat template; chat=None does so for text when the model has a template (an instruct model given raw
        text often ends its answer at once), and never for token ids."""
        eng = self._need_engine()
        if prompt == "":
            raise ValueError("prompt is empty")
        if chat is None:
            chat = isinstance(prompt, str) and bool(getattr(eng.tokenizer, "chat_template", None))
        if chat:
            if not isinstance(prompt, str):
                raise ValueError("a chat prompt must be text")
            return self.encode_messages([{"role": "user", "content": prompt}])
        if isinstance(prompt, str):
            self._check_chars(prompt)
            ids = eng.tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
            if any(t < 0 or t >= self.vocab_size for t in ids):
                raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
        else:
            raise ValueError("a prompt is a string or a list of token ids")
        return self._check_prompt(ids)

    def encode_messages(self, messages: list[dict]) -> list[int]:
        """Token ids of a chat through the model's chat template."""
        eng = self._need_engine()
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or not isinstance(m.get("role"), str):
                raise ValueError("each message needs a string role and string content")
            self._check_chars(m["content"])
        if not getattr(eng.tokenizer, "chat_template", None):
            raise ValueError(f"the model {self.model_name!r} has no chat template: use /v1/completions")
        try:
            text = eng.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as e:          # template errors are about the messages (e.g. roles out of order)
            raise ValueError(f"chat template rejected the messages: {e}") from None
        return self._check_prompt(eng.tokenizer.encode(text, add_special_tokens=False))

    def _check_chars(self, text: str) -> None:
        # refuse absurd inputs before paying for their tokenization; no token is shorter than a character
        limit = self.limits.max_prompt_tokens * 32
        if len(text) > limit:
            raise ValueError(f"prompt has {len(text)} characters, over the limit of {limit}")

    def _check_prompt(self, ids: list[int]) -> list[int]:
        if not ids:
            raise ValueError("prompt is empty")
        if len(ids) > self.limits.max_prompt_tokens:
            raise ValueError(f"prompt has {len(ids)} tokens, over the limit of {self.limits.max_prompt_tokens}")
        return ids

    def sampling(self, prompt_len: int, max_new_tokens: int | None = None, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int | None = None, ignore_eos: bool = False, stop=()) -> SamplingParams:
        """SamplingParams checked against the limits and the model's context length."""
        eng = self._need_engine()
        if max_new_tokens is None:
            max_new_tokens = min(DEFAULT_NEW_TOKENS, self.limits.max_new_tokens)
        if isinstance(max_new_tokens, int) and max_new_tokens > self.limits.max_new_tokens:
            raise ValueError(f"max_new_tokens {max_new_tokens} is over the limit of {self.limits.max_new_tokens}")
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                seed=seed, ignore_eos=ignore_eos, stop=tuple(stop or ())).validate()
        max_len = eng.info.get("max_model_len")
        if max_len and prompt_len + params.max_new_tokens > max_len:
            raise ValueError(f"prompt ({prompt_len} tokens) plus max_new_tokens ({params.max_new_tokens}) exceeds "
                             f"the model's context of {max_len} tokens")
        return params

    def submit(self, ids: list[int], params: SamplingParams):
        """Queue one request (refused with 429 when the engine's queue is already deep)."""
        eng = self._need_engine()
        waiting = eng.stats().get("waiting", 0)
        if waiting >= self.limits.max_waiting_requests:
            raise BusyError(f"{waiting} requests already waiting (limit {self.limits.max_waiting_requests}); "
                             "retry later")
        return eng.submit(ids, params)

    def generate_stream(self, prompt: str, max_new_tokens: int | None = None, temperature: float = 0.0, top_p: float = 1.0,
                        top_k: int = 0, seed: int | None = None, ignore_eos: bool = False,
                        chat: bool = True) -> Iterator[str]:
        """Yields the accumulated text so far. Bad input raises ValueError before the first yield; an engine
        error raises RuntimeError. Closing the generator early cancels the request."""
        ids = self.encode(prompt, chat=chat)
        handle = self.submit(ids, self.sampling(len(ids), max_new_tokens, temperature, top_p, top_k, seed,
                                                ignore_eos))
        return self._accumulate(handle)

    @staticmethod
    def _accumulate(handle) -> Iterator[str]:
        text, finished = "", False
        try:
            for d in handle:
                text += d.text
                if d.finished:
                    finished = True
                    if d.error or d.finish_reason == "error":
                        raise RuntimeError(f"generation failed: {d.error or 'engine error'}")
                yield text
        finally:
            if not finished:
                handle.cancel()

    # --------------------------------------------------------------------------------------------- load tests
    def start_burst(self, spec: dict) -> str:
        self._need_engine()
        return self.bursts.start_burst(self._check_context(spec))

    def burst_status(self, burst_id: str) -> dict:
        self._need_engine()
        try:
            return self.bursts.burst(burst_id)
        except KeyError as e:
            raise NotFoundError(e.args[0]) from None

    def start_ab(self, spec: dict) -> str:
        self._need_engine()
        return self.bursts.start_ab(self._check_context(spec))

    def ab_status(self, ab_id: str) -> dict:
        self._need_engine()
        try:
            return self.bursts.ab(ab_id)
        except KeyError as e:
            raise NotFoundError(e.args[0]) from None

    def _check_context(self, spec: dict):
        from .loadgen import BurstSpec

        s = BurstSpec.from_dict(spec, self.limits)
        max_len = self.engine.info.get("max_model_len")
        if max_len and s.prompt_tokens[1] + s.max_new_tokens[1] > max_len:
            raise ValueError(f"prompt_tokens max plus max_new_tokens max ({s.prompt_tokens[1] + s.max_new_tokens[1]}"
                             f") exceeds the model's context of {max_len} tokens")
        return s

    # ------------------------------------------------------------------------------------ timelines and replay
    def timeline(self, recording: str | None = None) -> dict:
        if self.telemetry is None:
            if recording is not None:
                raise NotFoundError(f"no recording {recording!r}: this server is replay-only")
            if self.replay is None:
                raise NotFoundError("no timeline: nothing recorded or loaded")
            return self.replay
        if recording is not None and recording not in self._recording_names():
            raise NotFoundError(f"no recording named {recording!r}")
        return self.telemetry.timeline(recording=recording)

    def perfetto(self, recording: str | None = None) -> dict:
        from batchscope.telemetry import to_perfetto

        return to_perfetto(self.timeline(recording))

    def start_recording(self, name: str | None = None) -> dict:
        tel = self._need_telemetry()
        if not name:
            name = base = time.strftime("rec-%Y%m%d-%H%M%S")
            n, taken = 1, self._recording_names()
            while name in taken:
                n += 1
                name = f"{base}-{n}"
        elif name in self._recording_names():
            raise ValueError(f"a recording named {name!r} exists already; choose another name")
        if not isinstance(name, str) or not RECORDING_NAME.match(name):
            raise ValueError("recording name must be 1-64 letters, digits, '.', '_' or '-', starting with a letter "
                             f"or digit; got {name!r}")
        with self._lock:
            if self._recording is not None:
                raise ValueError(f"recording {self._recording!r} is already running; stop it first")
            result = tel.start_recording(name)
            self._recording = name
        return {"recording": name, "state": "recording", **(result if isinstance(result, dict) else {})}

    def stop_recording(self) -> dict:
        tel = self._need_telemetry()
        with self._lock:
            if self._recording is None:
                raise ValueError("no recording is running")
            name, self._recording = self._recording, None
            summary = tel.stop_recording()
        return {"recording": name, "state": "stopped", "summary": summary}

    def recordings(self) -> dict:
        if self.telemetry is None:
            return {"recordings": [], "active": None}
        return {"recordings": self.telemetry.recordings(), "active": self._recording}

    def _recording_names(self) -> set[str]:
        return set(self.telemetry.recordings())

    def _need_telemetry(self):
        self._need_engine()
        return self.telemetry

    def load_replay(self, obj) -> dict:
        """Validate a timeline and keep it for the UI's replay view. `obj`: a dict, JSON bytes, or a str (JSON
        text or a file path, e.g. a Gradio upload). Raises telemetry.TimelineError saying where and why."""
        from batchscope.telemetry import load_timeline

        self.replay = load_timeline(obj)
        return {"loaded": True, "steps": len(self.replay.get("steps", [])),
                "requests": len(self.replay.get("requests", [])), "meta": self.replay.get("meta", {})}
