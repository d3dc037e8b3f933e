"""The suite's hooks and the fixtures every folder shares: tiny models, the transformers reference they are
checked against, and the synthetic sync-then-async story. Plain helpers live in helpers.py.

The folders say what a test needs: unit/ (nothing: no model, server or browser), importers/ (trace files only),
engine/ (an engine on a tiny model), server/ (a running server), browser/ (a server and Chromium).
`make test-fast` runs unit/ and importers/."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from batchscope.engine import EngineConfig  # noqa: E402
from batchscope.engine.model.loading import load_model  # noqa: E402
from helpers import _sync_then_async  # noqa: E402

CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not CUDA:
            item.add_marker(skip_gpu)


# CI sets BATCHSCOPE_NO_CPU_SKIPS=1: on a CPU machine only `gpu` tests may skip. A browser test skipped because
# Chromium is missing, or a module skipped because a package did not install, fails the run instead.
_cpu_skips: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped and "gpu" not in report.keywords:
        _cpu_skips.append(report.nodeid)


def pytest_collectreport(report):
    if report.skipped:
        _cpu_skips.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("BATCHSCOPE_NO_CPU_SKIPS") == "1" and _cpu_skips and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if os.environ.get("BATCHSCOPE_NO_CPU_SKIPS") == "1" and _cpu_skips:
        terminalreporter.write_line(f"{len(_cpu_skips)} test(s) that must run on a CPU machine were skipped "
                                    f"(BATCHSCOPE_NO_CPU_SKIPS=1):", red=True)
        for nodeid in _cpu_skips:
            terminalreporter.write_line(f"  {nodeid}", red=True)


@pytest.fixture(scope="session")
def tiny_reference():
    """The tiny-random preset's weights under transformers' own attention."""
    return load_model(EngineConfig(model="tiny-random", device="cpu", dtype="float32", seed=0)).model




@pytest.fixture
def sync_then_async():
    """Factory for the shared sync-then-async story, for a test to read it or carry it on:
    `sync_then_async(gpu, requests=, prompt_tokens=, max_new_tokens=, seed=...)` -> (engine, telemetry).
    The telemetries it made are closed when the test ends (closing twice is harmless)."""
    made = []

    def make(gpu: bool, **story):
        eng, tel = _sync_then_async(gpu, **story)
        made.append(tel)
        return eng, tel

    yield make
    for tel in made:
        tel.close()


@pytest.fixture(scope="session")
def switched_timeline():
    """Factory: the shared story's timeline, through JSON as a file would carry it, with a few NVML (or host
    CPU) samples as the sampler thread would add them. `switched_timeline(gpu=True)` -> dict."""
    import json

    def make(gpu: bool = True) -> dict:
        _, tel = _sync_then_async(gpu, seed=3, requests=5, prompt_tokens=24, max_new_tokens=6)
        try:
            for _ in range(3):
                tel.sampler.sample_once()
            return json.loads(json.dumps(tel.timeline()))
        finally:
            tel.close()
    return make
