"""`batchscope compare` on real CPU recordings of tiny-random, made on this (busy, shared) machine.

Two engines are recorded side by side in one process, 20 short bursts each, alternating (BASE, NEW, NEW, BASE,
...), so that load from other processes falls on both sides alike: the design the compare's noise model assumes
of two runs meant to be compared (it resamples each burst whole). The real slowdown is a model with six times the
layers (12 instead of 2, the same shapes otherwise): every decode step computes six times the layers, which no
background load on this machine imitates. Bounds are loose on purpose: the test must hold on a busy 2-core machine.
"""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from batchscope import Engine, EngineConfig, SamplingParams  # noqa: E402
from batchscope.app.cli import main  # noqa: E402
from batchscope.telemetry import Telemetry  # noqa: E402
from batchscope.telemetry.comparison import Recording, compare  # noqa: E402

BURSTS, REQUESTS, PROMPT, NEW_TOKENS = 20, 8, 24, 24


def _deeper_tiny_random(folder, layers: int) -> str:
    """tiny-random's shapes with more layers, saved as a checkpoint folder (token-id prompts only)."""
    from transformers import LlamaForCausalLM

    from batchscope.engine.model.presets import random_preset_config

    cfg = random_preset_config("tiny-random", 49152)
    cfg.num_hidden_layers = layers
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return str(folder)


def _alternating(models: dict) -> dict:
    """One timeline per named model, its bursts alternating with the others' in one process."""
    sides = {}
    try:
        for name, model in models.items():
            eng = Engine(EngineConfig(model=model, device="cpu", dtype="float32", mode="sync", num_blocks=256,
                                      max_batch_tokens=256, max_running=32, seed=0))
            tel = Telemetry(eng, nvml_hz=0)
            sides[name] = (eng, tel)
            eng.generate([[5] * 8], SamplingParams(max_new_tokens=4, ignore_eos=True))       # warm up
            tel.start_recording("compare")
        prompts = [[(7 * i + j) % 1000 + 3 for j in range(PROMPT)] for i in range(REQUESTS)]
        params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
        for burst in range(BURSTS):
            for name in (list(sides) if burst % 2 == 0 else list(sides)[::-1]):
                sides[name][0].generate(prompts, params)
        out = {}
        for name, (_, tel) in sides.items():
            tel.stop_recording()
            out[name] = json.loads(json.dumps(tel.timeline("compare")))      # as a file would carry it
        return out
    finally:
        for eng, tel in sides.values():
            tel.close()
            eng.close()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    deeper = _deeper_tiny_random(tmp_path_factory.mktemp("deeper"), layers=12)
    return _alternating({"base": "tiny-random", "again": "tiny-random", "deeper": deeper})


def _one(name: str, timeline: dict) -> list[Recording]:
    return [Recording(name, timeline, "timeline")]


def test_the_same_build_recorded_twice_gets_no_verdict(recorded):
    for a, b in (("base", "again"), ("again", "base")):
        result = compare(_one(a, recorded[a]), _one(b, recorded[b]))
        assert result["verdict"] in ("same", "inconclusive"), result["step_time_ratio"]
        assert result["noise"]["basis"] == "host" and result["noise"]["min_effect"] == pytest.approx(0.10)
        assert all(b["verdict"] not in ("slower", "faster") for b in result["buckets"])


def test_six_times_the_layers_is_found_slower_and_sized(recorded, tmp_path):
    result = compare(_one("base", recorded["base"]), _one("deeper", recorded["deeper"]))
    ratio = result["step_time_ratio"]
    assert result["verdict"] == "slower", ratio
    assert 1.5 < ratio["value"] < 12.0 and ratio["low"] > 1.2
    assert result["figures"]["compute"]["verdict"] == "slower"      # the forward, not the host, grew
    assert result["warnings"] and "different model" in result["warnings"][0]
    # the same through the command: a warning first, then the verdict; --fail-above decides the exit code
    base, new = tmp_path / "base.json", tmp_path / "deeper.json"
    base.write_text(json.dumps(recorded["base"]))
    new.write_text(json.dumps(recorded["deeper"]))
    assert main(["compare", str(base), str(new), "--fail-above", "10", "--json", str(tmp_path / "c.json")]) == 1
    assert json.loads((tmp_path / "c.json").read_text())["verdict"] == "slower"
    assert main(["compare", str(base), str(new), "--fail-above", "1000"]) == 0
