"""The engine profiles itself: a torch.profiler window over the next N steps, run on the engine thread, whose trace
names every step's host phases; and no range at all, so no cost, while nobody profiles."""
import gzip
import json
import re

import pytest
import torch

from batchscope.engine import Engine, EngineConfig, SamplingParams

LAUNCH = re.compile(r"^batchscope\.launch step=(\d+) mode=(sync|async) prefill=(\d+) decode=(\d+) requests=(\d+)$")


@pytest.fixture(scope="module")
def engine():
    eng = Engine(EngineConfig(model="tiny-random", device="cpu", dtype="float32", num_blocks=64, seed=0))
    yield eng
    eng.close()


def _names(path):
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return events, [e["name"] for e in events if e.get("ph") == "X" and e.get("name", "").startswith("batchscope.")]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_window_records_exactly_the_steps_asked_for_with_their_phases(engine, mode, tmp_path):
    engine.set_mode(mode)
    capture = engine.profile(4, str(tmp_path / "w.pt.trace.json.gz"))
    assert capture.state in ("pending", "running")
    out = engine.generate([[5, 6, 7, 8]], SamplingParams(max_new_tokens=12, ignore_eos=True))[0]
    assert len(out.token_ids) == 12
    assert capture.wait(60), capture.as_dict()
    assert capture.state == "done", capture.error
    assert capture.last_step - capture.first_step + 1 == 4
    events, names = _names(capture.path)
    launches = [LAUNCH.match(n) for n in names if n.startswith("batchscope.launch")]
    assert all(launches), names
    steps = sorted(int(m.group(1)) for m in launches)
    assert steps[:4] == list(range(capture.first_step, capture.first_step + 4))
    assert all(m.group(2) == mode for m in launches)
    first = min(launches, key=lambda m: int(m.group(1)))
    assert (int(first.group(3)), int(first.group(4))) == (4, 0)          # the prompt's prefill, no decode yet
    for phase in ("fill", "wait", "update"):
        assert f"batchscope.{phase} step={capture.first_step}" in names
    assert "batchscope.schedule" in names
    # the engine thread's own ops are in it (a profiler started on another thread would see none)
    assert any(e.get("cat") == "cpu_op" and e["name"].startswith("aten::") for e in events)


def test_no_range_is_made_while_nobody_profiles(engine, monkeypatch):
    made = []
    real = torch.profiler.record_function
    monkeypatch.setattr(torch.profiler, "record_function", lambda name: made.append(name) or real(name))
    engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=6, ignore_eos=True))
    assert made == []


def test_a_profiler_started_elsewhere_gets_the_ranges_when_asked(monkeypatch):
    monkeypatch.setenv("BATCHSCOPE_ANNOTATE", "1")
    made = []
    real = torch.profiler.record_function
    monkeypatch.setattr(torch.profiler, "record_function", lambda name: made.append(name) or real(name))
    with Engine(EngineConfig(model="tiny-random", device="cpu", num_blocks=32)) as eng:
        eng.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3, ignore_eos=True))
    assert any(n.startswith("batchscope.launch step=0 ") for n in made), made


def test_bad_windows_are_refused_and_one_runs_at_a_time(engine, tmp_path):
    for bad in (0, -1, 1001, True, 2.5, "3"):
        with pytest.raises(ValueError, match="steps must be an integer"):
            engine.profile(bad)
    first = engine.profile(2, str(tmp_path / "a.pt.trace.json.gz"))
    with pytest.raises(RuntimeError, match="one at a time"):
        engine.profile(2, str(tmp_path / "b.pt.trace.json.gz"))
    engine.generate([[9, 9, 9]], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert first.wait(60) and first.state == "done"
    second = engine.profile(1, str(tmp_path / "c.pt.trace.json.gz"))     # free again once written
    engine.generate([[9, 9, 9]], SamplingParams(max_new_tokens=2, ignore_eos=True))
    assert second.wait(60) and second.state == "done"
