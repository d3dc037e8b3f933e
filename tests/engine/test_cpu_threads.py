"""A CPU engine beside a browser on the same machine: the threads and the priority `serve` gives its steps, and
that the engine applies them."""
import os
import sys

import pytest
import torch

from batchscope.app.cli import build_parser, share_with_page
from batchscope.engine import ConfigError, Engine, EngineConfig, SamplingParams


@pytest.mark.parametrize("threads", [0, -1, True, 1.5, "2"])
def test_bad_cpu_threads_are_config_errors(threads):
    with pytest.raises(ConfigError, match="cpu_threads"):
        EngineConfig(cpu_threads=threads).validate()


@pytest.mark.parametrize("nice", [-1, 20, True, 2.0, "5"])
def test_bad_niceness_is_a_config_error(nice):
    with pytest.raises(ConfigError, match="nice must be an integer from 0 to 19"):
        EngineConfig(nice=nice).validate()


def test_serving_this_machines_browser_leaves_it_a_core_and_the_first_turn(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert share_with_page("cpu", "127.0.0.1") == (1, 10)
    assert share_with_page("auto", "::1") == ((None, 0) if torch.cuda.is_available() else (1, 10))
    # torch's default already leaves cores free (a machine with hyperthreads): the threads stay
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    assert share_with_page("cpu", "localhost") == (8, 10)
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert share_with_page("cpu", "127.0.0.1") == (None, 10)     # no core to spare: the priority still helps


def test_a_page_drawn_elsewhere_or_what_was_asked_is_kept(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert share_with_page("cpu", "0.0.0.0") == (None, 0)             # the browser is on another machine
    assert share_with_page("cpu", "0.0.0.0", 2, 5) == (2, 5)
    assert share_with_page("cpu", "127.0.0.1", 2, 0) == (2, 0)        # --cpu-threads 2 --nice 0


def test_serve_takes_threads_and_niceness_and_refuses_bad_ones(capsys):
    parser = build_parser()
    args = parser.parse_args(["serve", "--cpu-threads", "3", "--nice", "7"])
    assert (args.cpu_threads, args.nice) == (3, 7)
    args = parser.parse_args(["serve"])
    assert (args.cpu_threads, args.nice) == (None, None)
    for bad in (["--cpu-threads", "0"], ["--nice", "20"], ["--nice", "x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", *bad])
        assert bad[0] in capsys.readouterr().err


def test_the_engine_computes_on_the_threads_and_at_the_priority_it_was_given():
    before, own = torch.get_num_threads(), os.getpriority(os.PRIO_PROCESS, 0)
    try:
        eng = Engine(EngineConfig(model="tiny-random", device="cpu", dtype="float32", num_blocks=64, cpu_threads=1,
                                  nice=5))
        try:
            out = eng.generate([[4, 5, 6]], SamplingParams(max_new_tokens=3, ignore_eos=True))[0]
            assert len(out.token_ids) == 3
            assert torch.get_num_threads() == 1 and eng.info["cpu_threads"] == 1 and eng.info["nice"] == 5
            if sys.platform.startswith("linux"):
                # only the engine's thread: the server and the rest of the process keep theirs
                assert os.getpriority(os.PRIO_PROCESS, eng._thread.native_id) == max(5, own)
                assert os.getpriority(os.PRIO_PROCESS, 0) == own
        finally:
            eng.close()
    finally:
        torch.set_num_threads(before)
