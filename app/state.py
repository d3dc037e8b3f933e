"""AppState: what the HTTP routes, the websocket and the Gradio UI share — the engine, its telemetry, the
load generator, the limits and a loaded replay — behind a small set of methods that validate their inputs.

Errors speak for themselves: ValueError (bad input or over a cap, 400), BusyError (at capacity, 429),
NotFoundError (404), NoEngineError (replay-only, 409), ShuttingDownError (503), telemetry.TimelineError (a
malformed timeline, 400).
"""
from __future__ import annotations

import itertools
import os
import re
import threading
import time
from pathlib import Path
from typing import Iterator

from batchscope.engine.config import MODES, EngineConfig, SamplingParams
from batchscope.telemetry.nvml import BUSY_NOTE

from .loadgen import BurstManager, BusyError, Limits

__all__ = ["AppState", "Limits", "BusyError", "NotFoundError", "NoEngineError", "ShuttingDownError",
           "MAX_REPLAY_BYTES", "MAX_JSON_DEPTH", "json_depth_over"]

DEFAULT_NEW_TOKENS = 128           # when a caller does not say (capped by the limit)
RECORDING_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# An uploaded timeline: twice the largest recording this server keeps (telemetry.recorder.MAX_RECORDING_BYTES)
# and above the live ring's export (~30-40 MiB at 20,000 steps), so whatever it exports it can replay. Parsing
# and validating 64 MiB takes ~350 MB and ~20 s of one core; one replay is loaded at a time.
MAX_REPLAY_BYTES = 64 << 20
# JSON nesting accepted in any body: timelines and API bodies need under 10 levels; parsers recurse per level
MAX_JSON_DEPTH = 64


class ShuttingDownError(RuntimeError):
    """The server is shutting down: no new work is taken (503)."""


# ------------------------------------------------------------------------------------------------ JSON depth

_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = [0] * 256
for _b in b"[{":
    _DEPTH_STEP[_b] = 1
for _b in b"]}":
    _DEPTH_STEP[_b] = -1


def json_depth_over(raw: bytes | str, limit: int = MAX_JSON_DEPTH) -> int | None:
    """The nesting depth of a JSON text when it is over `limit`, else None; without parsing it, so that a
    recursive parser never meets it. Works at C speed: strings are cut out, then the brackets are counted."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return None                     # the common case: too few brackets to nest that deep
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    depth = max(itertools.accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)
    return depth if depth > limit else None


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
        self._shutting_down = False
        self._inflight: set = set()    # handles submitted through this state and not finished yet
        self._inflight_lock = threading.Lock()
        self._replay_lock = threading.Lock()
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
        """Replay-only: no model, the UI shows a recorded timeline. Raises TimelineError if the file is bad. A
        local file has no size limit (that is the way to replay one over MAX_REPLAY_BYTES)."""
        from batchscope.telemetry import TimelineError

        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise TimelineError(f"{path}: cannot read: {exc}") from exc
        return cls(limits=limits, replay=_parse_timeline(raw, str(path)))

    def begin_shutdown(self) -> None:
        """The server is going down: refuse new work, cancel bursts and every request in flight, so that open
        streams end now (finish_reason "cancelled") instead of holding the shutdown up. Waits for nothing
        (the server calls it from its event loop when a shutdown signal arrives)."""
        self._shutting_down = True
        if self.bursts is not None:
            self.bursts.cancel_all()
        with self._inflight_lock:
            handles = list(self._inflight)
        for h in handles:
            h.cancel()

    def close(self) -> None:
        """Stop bursts, telemetry and the engine (in that order). Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.begin_shutdown()
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
               "uptime_s": time.time() - self.started, "replay_loaded": self.replay is not None,
               "rss_mb": rss_mb(), "shutting_down": self._shutting_down,
               "max_replay_bytes": MAX_REPLAY_BYTES, "max_json_depth": MAX_JSON_DEPTH}
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
            bursts=self.bursts.status() if self.bursts else None,
            recording=self._recording,
            inflight=self._inflight_count(), max_inflight=self.max_inflight,
        )
        tel = self.telemetry.status() if self.telemetry is not None else {}
        out["telemetry"] = tel
        out["recordings"] = tel.get("recordings")
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

    @property
    def max_inflight(self) -> int:
        """Requests submitted here and not finished: the queue limit plus what the engine runs at once. The
        engine's own count misses submissions it has not picked up yet, so a flood could pass it."""
        running = (self.engine.info.get("max_running") or 0) if self.engine is not None else 0
        return self.limits.max_waiting_requests + running

    def _inflight_count(self) -> int:
        with self._inflight_lock:
            self._inflight = {h for h in self._inflight if not h.done}
            return len(self._inflight)

    def submit(self, ids: list[int], params: SamplingParams):
        """Queue one request (refused with 429 when the engine's queue is already deep)."""
        eng = self._need_engine()
        if self._shutting_down:
            raise ShuttingDownError("the server is shutting down")
        waiting = eng.stats().get("waiting", 0)
        if waiting >= self.limits.max_waiting_requests:
            raise BusyError(f"{waiting} requests already waiting (limit {self.limits.max_waiting_requests}); "
                             "retry later")
        with self._inflight_lock:
            self._inflight = {h for h in self._inflight if not h.done}
            if len(self._inflight) >= self.max_inflight:
                raise BusyError(f"{len(self._inflight)} requests in flight (limit {self.max_inflight}); retry later")
            handle = eng.submit(ids, params)
            self._inflight.add(handle)
        if self._shutting_down:          # begin_shutdown ran while we submitted: it may have missed this one
            handle.cancel()
        return handle

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
        if self._shutting_down:
            raise ShuttingDownError("the server is shutting down")
        return self.bursts.start_burst(self._check_context(spec))

    def burst_status(self, burst_id: str) -> dict:
        self._need_engine()
        try:
            return self.bursts.burst(burst_id)
        except KeyError as e:
            raise NotFoundError(e.args[0]) from None

    def start_ab(self, spec: dict) -> str:
        self._need_engine()
        if self._shutting_down:
            raise ShuttingDownError("the server is shutting down")
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
        # `dropped_recordings`: the oldest recordings forgotten to keep the count and byte caps
        return {"recording": name, "state": "recording", **(result if isinstance(result, dict) else {})}

    def stop_recording(self) -> dict:
        tel = self._need_telemetry()
        with self._lock:
            if self._recording is None:
                raise ValueError("no recording is running")
            name, self._recording = self._recording, None
            summary = tel.stop_recording()
        # `stored` says whether it hit its caps (truncated) and what it dropped
        return {"recording": name, "state": "stopped", "summary": summary, "stored": tel.recording_info(name)}

    def recordings(self) -> dict:
        if self.telemetry is None:
            return {"recordings": [], "active": None, "details": [], "limits": None}
        status = self.telemetry.status()["recordings"]
        details = []
        for name in self.telemetry.recordings():
            try:
                details.append(self.telemetry.recording_info(name))
            except KeyError:            # dropped meanwhile
                pass
        return {"recordings": [d["name"] for d in details], "active": self._recording, "details": details,
                "limits": status}

    def _recording_names(self) -> set[str]:
        return set(self.telemetry.recordings())

    def _need_telemetry(self):
        self._need_engine()
        return self.telemetry

    def load_replay(self, obj) -> dict:
        """Validate a timeline and keep it for the UI's replay view. `obj`: a dict, JSON bytes, or a str (JSON
        text or a file path, e.g. a Gradio upload), at most MAX_REPLAY_BYTES and MAX_JSON_DEPTH deep. Raises
        telemetry.TimelineError saying where and why, BusyError while another replay is being loaded."""
        from batchscope.telemetry import TimelineError, validate_timeline

        # one at a time: each holds its text and parsed records (~5x the text) until it is done
        if not self._replay_lock.acquire(blocking=False):
            raise BusyError("another timeline is being loaded for replay; retry when it is done")
        try:
            if isinstance(obj, dict):
                try:
                    replay = validate_timeline(obj)
                except RecursionError:  # a dict built in Python can nest as deep as it likes
                    raise TimelineError("timeline: nested too deeply to validate") from None
            else:
                raw = obj
                if isinstance(obj, Path) or (isinstance(obj, str) and not obj.lstrip().startswith(("{", "["))):
                    size = _file_size(obj)
                    if size > MAX_REPLAY_BYTES:
                        raise ValueError(f"timeline file is {size >> 20} MiB, over the replay limit of "
                                         f"{MAX_REPLAY_BYTES >> 20} MiB")
                    raw = Path(obj).read_bytes()
                elif len(obj) > MAX_REPLAY_BYTES:
                    raise ValueError(f"timeline is {len(obj) >> 20} MiB, over the replay limit of "
                                     f"{MAX_REPLAY_BYTES >> 20} MiB")
                replay = _parse_timeline(raw)
            self.replay = replay
        finally:
            self._replay_lock.release()
        return {"loaded": True, "steps": len(self.replay.get("steps", [])),
                "requests": len(self.replay.get("requests", [])), "meta": self.replay.get("meta", {})}


def _file_size(path) -> int:
    from batchscope.telemetry import TimelineError

    try:
        return os.stat(path).st_size
    except OSError as exc:
        raise TimelineError(f"{path}: cannot read: {exc}") from exc


def _parse_timeline(raw: bytes | str, name: str = "timeline") -> dict:
    """load_timeline on JSON text, refusing nesting deeper than MAX_JSON_DEPTH before any parser recurses."""
    from batchscope.telemetry import TimelineError, load_timeline

    depth = json_depth_over(raw)
    if depth is not None:
        raise TimelineError(f"{name}: JSON nested {depth} levels deep, over the limit of {MAX_JSON_DEPTH}")
    try:
        return load_timeline(raw)
    except RecursionError:              # cannot happen within the depth limit; a 500 would be worse
        raise TimelineError(f"{name}: JSON nested too deeply to parse") from None


def rss_mb() -> float | None:
    """This process's resident memory in MiB (None where psutil cannot tell)."""
    try:
        import psutil

        return round(psutil.Process().memory_info().rss / (1 << 20), 1)
    except Exception:
        return None
