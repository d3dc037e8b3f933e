"""`--help` reads the same on every subcommand: each one runs, uses the one formatter, and shows every option's
default the same way, "(default: X)"; the flag names the contracts rely on are all still there."""
from __future__ import annotations

import argparse
import re

import pytest

from batchscope.app.bench import flags as bench_options
from batchscope.app.cli import build_parser
from batchscope.app.help_format import HelpFormatter
from batchscope.app.soak import arguments as soak_options

PARSER = build_parser()
SUBCOMMANDS = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices
# the flags DESIGN.md and the docs name (extend, never rename)
CONTRACT_FLAGS = {
    "serve": {"--model", "--device", "--mode", "--num-blocks", "--port", "--host", "--token", "--no-ui"},
    "replay": {"--port"},
    "import": {"-o", "--output", "--kernels", "--workers", "--partial"},
    "compare": {"--json", "--markdown", "--fail-above"},
    "whatif": {"--set", "--json", "--verify"},
    "sweep": {"--url", "--modes", "--points", "--duration", "--slo-ttft-ms", "--slo-itl-ms", "--out"},
    "bench": {"--model", "--modes", "--requests", "--out"},
    "soak": {"--url", "--requests", "--json"},
}


def help_of(parser: argparse.ArgumentParser, capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as done:
        parser.parse_args([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def option_entries(raw: str) -> dict[str, str]:
    """Each option's entry in the options list, unwrapped, by its first flag (an entry starts at a line
    indented two spaces with a dash; its help goes on at a deeper indent)."""
    entries: dict[str, str] = {}
    current = None
    for line in raw.split("options:", 1)[1].splitlines():
        if re.match(r"^  -", line):
            current = line.split()[0].rstrip(",")
            entries[current] = line.strip()
        elif current and line.startswith("   "):
            entries[current] += " " + line.strip()
    return entries


def shown_default(action: argparse.Action) -> bool:
    d = action.default
    return action.option_strings and d is not None and d is not False and d not in ("", []) and \
        action.help != argparse.SUPPRESS and not isinstance(action, (argparse._HelpAction, argparse._VersionAction))


def test_every_subcommand_is_covered():
    assert set(SUBCOMMANDS) == set(CONTRACT_FLAGS)


@pytest.mark.parametrize("name", sorted(CONTRACT_FLAGS))
def test_each_subcommands_help_runs_and_shows_its_defaults(name, capsys):
    sub = SUBCOMMANDS[name]
    assert sub.formatter_class is HelpFormatter
    assert sub.description, f"{name} --help has no description"
    raw = help_of(PARSER, capsys, [name])
    text = " ".join(raw.split())                                    # unwrapped
    flags = {s for a in sub._actions for s in a.option_strings}
    assert CONTRACT_FLAGS[name] <= flags
    entries = option_entries(raw)
    for action in sub._actions:
        if shown_default(action):
            entry = entries[action.option_strings[0]]
            assert "default" in entry.lower(), f"{name} {action.option_strings}: its default is not shown: {entry!r}"
    # one spelling for defaults: "(default: X)" or "default: X", never "(default X)" nor a Python list
    assert not re.search(r"\(default [^:]", text), text
    assert "default: [" not in text and "default: None" not in text and "default: False" not in text


def test_the_tools_own_entry_points_read_the_same(capsys):
    for parser in (bench_options.build_parser(), soak_options.build_parser()):
        assert parser.formatter_class is HelpFormatter
        assert "(default: " in help_of(parser, capsys, [])


def test_import_and_replay_say_folders_and_traces(capsys):
    text = " ".join(help_of(PARSER, capsys, ["import"]).split())
    assert "a trace file or a folder of them; several: the ranks of one run" in text
    text = " ".join(help_of(PARSER, capsys, ["replay"]).split())
    assert "folder" in text and "profiler trace" in text


def test_sweep_says_which_servers_it_can_drive(capsys):
    text = " ".join(help_of(PARSER, capsys, ["sweep"]).split())
    assert "batchscope serve" in text and "vLLM" in text


def test_serve_and_bench_list_every_model_preset(capsys):
    from batchscope.engine.config import PRESETS

    for argv in (["serve"], ["bench"]):
        text = " ".join(help_of(PARSER, capsys, argv).split())
        assert all(name in text for name in PRESETS), (argv, text)


def test_the_engine_flags_are_one_declaration_that_builds_the_config():
    # serve and bench take the same engine flags, of one type each; one function turns them into the EngineConfig
    from batchscope.app.engine_flags import ENGINE_FLAGS, engine_config_from

    serve, bench = (SUBCOMMANDS[name] for name in ("serve", "bench"))
    for flag in ENGINE_FLAGS:
        for sub in (serve, bench):
            action = next((a for a in sub._actions if a.dest == flag.dest), None)
            if action is not None:
                assert tuple(action.option_strings) == flag.names
                assert action.type is flag.options.get("type", action.type)
    args = PARSER.parse_args(["serve", "--model", "tiny-random", "--max-running", "8", "--max-batch-tokens", "96",
                              "--no-mixed-graphs", "-tp", "2"])
    config = engine_config_from(args)
    assert (config.model, config.max_running, config.max_batch_tokens, config.mixed_graphs,
            config.tensor_parallel_size) == ("tiny-random", 8, 96, False, 2)
    adaptive = engine_config_from(PARSER.parse_args(["bench", "--max-batch-tokens", "adaptive"]), mode="sync")
    assert adaptive.max_batch_tokens is None and adaptive.mode == "sync"


def test_batchscope_help_loads_no_torch():
    import subprocess
    import sys

    code = ("import sys, contextlib, io; from batchscope.app.cli import build_parser; p = build_parser(); "
            "out = io.StringIO()\n"
            "for argv in ([], ['serve'], ['bench'], ['soak']):\n"
            "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(out): p.parse_args([*argv, '--help'])\n"
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_gil_switch_interval_is_a_positive_number_of_milliseconds(capsys):
    assert PARSER.parse_args(["serve", "--switch-interval-ms", "0.5"]).switch_interval_ms == 0.5
    assert PARSER.parse_args(["serve"]).switch_interval_ms is None        # Python's own, untouched
    for bad in ("0", "-1", "fast"):
        with pytest.raises(SystemExit):
            PARSER.parse_args(["serve", "--switch-interval-ms", bad])
    assert "--switch-interval-ms" in capsys.readouterr().err


def test_a_gpu_server_gives_the_gil_back_sooner_than_python_does():
    from batchscope.app.cli import GPU_SWITCH_INTERVAL_MS, switch_interval_ms

    assert switch_interval_ms(None, "cuda:0") == GPU_SWITCH_INTERVAL_MS < 5.0
    assert switch_interval_ms(None, "cpu") is None and switch_interval_ms(None, None) is None   # Python's 5 ms
    assert switch_interval_ms(2.0, "cuda:0") == 2.0 and switch_interval_ms(0.25, "cpu") == 0.25
