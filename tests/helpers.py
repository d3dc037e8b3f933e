"""What the tests share besides fixtures: the transformers reference, tiny servers, HTTP helpers and the
synthetic sync-then-async story. Tests import it as `helpers` (pytest puts tests/ on the path)."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from batchscope.engine import EngineConfig  # noqa: E402

CUDA = torch.cuda.is_available()


def reference_generate(model, prompt_ids: list[int], max_new_tokens: int, eos_token_id: int | None) -> list[int]:
    """transformers' own greedy generate for one prompt (no padding), generated tokens only."""
    ids = torch.tensor([prompt_ids], device=model.device)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=eos_token_id if eos_token_id is not None else -1,
                             pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def reference_penalized_generate(model, prompt_ids: list[int], max_new_tokens: int, presence: float = 0.0,
                                 frequency: float = 0.0, repetition: float = 1.0,
                                 eos_token_id: int | None = None) -> list[int]:
    """transformers' own greedy generate with vLLM's penalties applied to its float32 logits at every step (a
    logits processor): repetition on tokens in the prompt or the output so far (positive logits divided, the
    others multiplied), then frequency times each token's count in the output, then presence for each token in it."""
    from transformers import LogitsProcessor, LogitsProcessorList

    prompt_len = len(prompt_ids)

    class VllmPenalties(LogitsProcessor):
        def __call__(self, input_ids, scores):
            width = scores.shape[-1]
            in_prompt = torch.zeros(width, dtype=torch.bool, device=scores.device)
            in_prompt[input_ids[0, :prompt_len]] = True
            counts = torch.bincount(input_ids[0, prompt_len:], minlength=width)
            penalty = torch.where(in_prompt | (counts > 0), repetition, 1.0)
            logits = scores[0].float()
            logits = logits * torch.where(logits > 0, 1.0 / penalty, penalty)
            logits = logits - frequency * counts
            return (logits - presence * (counts > 0))[None]

    ids = torch.tensor([prompt_ids], device=model.device)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=eos_token_id if eos_token_id is not None else -1,
                             pad_token_id=0, logits_processor=LogitsProcessorList([VllmPenalties()]))
    return out[0, prompt_len:].tolist()


def reference_logprobs(model, prompt_ids: list[int], token_ids: list[int]) -> torch.Tensor:
    """[len(token_ids), vocab]: float32 log-softmax of transformers' own logits at each generated token's position."""
    ids = torch.tensor([prompt_ids + token_ids[:-1]], device=model.device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1:]
    return torch.log_softmax(logits.float(), dim=-1)


def random_prompts(n: int, vocab: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def generate_in_mode(engine, prompts, params, mode: str):
    """`engine.generate` in "sync", in "async", or ("switch") with the mode flipped from another thread every
    three engine steps while it runs."""
    if mode != "switch":
        engine.set_mode(mode)
        return engine.generate(prompts, params)
    stop = threading.Event()

    def flip():
        last = 0
        while not stop.is_set():
            steps = engine.stats()["steps"]
            if steps - last >= 3:
                engine.set_mode("sync" if engine.mode == "async" else "async")
                last = steps
            stop.wait(0.0003)
    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    try:
        return engine.generate(prompts, params)
    finally:
        stop.set()
        flipper.join()


def compile_for_hopper(script: str) -> str:
    """Run a kernel-compiling script in a fresh interpreter (no TRITON_INTERPRET, so Triton really compiles for
    sm_90 with the ptxas it ships) and return its output; skips where this Triton build has no ptxas."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    if proc.returncode and "ptxas" in proc.stderr and "not found" in proc.stderr:
        pytest.skip("this triton build has no ptxas")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# ------------------------------------------------------------------------ telemetry's synthetic engine, switched

def _sync_then_async(gpu: bool, requests: int, prompt_tokens: int, max_new_tokens: int, sync_steps: int = 3,
                     **engine_options):
    """A SyntheticEngine (CUDA-like events on a virtual clock, or CPU spans) with Telemetry attached, after the
    story the telemetry tests share: a burst that starts in sync and is switched live to async after
    `sync_steps` steps, run to its end. `engine_options` go to the engine (seed, compute_us, ...).
    Returns (engine, telemetry)."""
    from batchscope.telemetry import Telemetry
    from synthetic import SyntheticEngine

    eng = SyntheticEngine(gpu=gpu, mode="sync", **engine_options)
    tel = Telemetry(eng, nvml_hz=0)
    eng.submit(requests, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens)
    eng.run(max_steps=sync_steps)
    eng.set_mode("async")
    eng.run()
    return eng, tel


@contextlib.contextmanager
def tiny_served(limits, ui: bool = True, model: str = "tiny-random", num_blocks: int = 512,
                max_batch_tokens: int = 512):
    """The app on the tiny-random preset (or another: the embedded smollm2-135m has steps of hundreds of ms on a
    small CPU, which millisecond steps hide bugs from), served from a thread of this process: (server, state)."""
    from batchscope.app.server import ServerThread, create_app
    from batchscope.app.server.state import AppState

    state = AppState.load(EngineConfig(model=model, device="cpu", dtype="float32", mode="async",
                                       num_blocks=num_blocks, max_batch_tokens=max_batch_tokens, max_running=32),
                          limits)
    srv = ServerThread(create_app(state, ui=ui)).start()
    try:
        yield srv, state
    finally:
        srv.stop()
        state.close()


@contextlib.contextmanager
def tiny_app_server(limits, ui: bool = True, model: str = "tiny-random"):
    """tiny_served's server alone."""
    with tiny_served(limits, ui, model) as (srv, _):
        yield srv


def get_json(url: str, path: str, timeout: float = 60) -> dict:
    """GET url + path, its JSON body."""
    import json
    import urllib.request

    with urllib.request.urlopen(url + path, timeout=timeout) as r:
        return json.load(r)


def post_json(url: str, path: str, body: dict, timeout: float = 60) -> dict:
    """POST a JSON body to url + path, the JSON answer."""
    import json
    import urllib.request

    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def until(cond, timeout=120.0, every=0.05):
    """cond()'s first truthy value, polled every `every` s; fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_subprocess(*args: str, ui: bool = False, start_s: float = 180):
    """`batchscope serve --model tiny-random --device cpu --dtype float32 [--no-ui] ARGS` in its own process;
    yields its URL once /api/health answers, terminates it after."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "batchscope.app.cli", "serve", "--model", "tiny-random", "--device", "cpu",
           "--dtype", "float32", *([] if ui else ["--no-ui"]), *args, "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + start_s
    while True:
        try:
            if httpx.get(url + "/api/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"batchscope serve {' '.join(args)} did not come up:\n{proc.stdout.read()}")
        time.sleep(0.2)
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def whatif_predict(page, source: str, key: str, value: str, timeout_ms: int) -> None:
    """Ask the page's What-if panel (already open) one setting of `source` with one simulation run, and press
    Predict; the caller waits for the table it expects."""
    page.wait_for_selector("#bs-whatif-key-max_batch_tokens", timeout=timeout_ms)
    page.wait_for_function("document.querySelectorAll('#bs-whatif-source option').length >= 1", timeout=timeout_ms)
    page.select_option("#bs-whatif-source", source)
    page.fill(f"#bs-whatif-key-{key}", value)
    page.fill("#bs-whatif-runs", "1")
    page.click("#bs-whatif-predict")
