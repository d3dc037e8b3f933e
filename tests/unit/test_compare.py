"""`batchscope compare` on synthetic recordings whose truth is known: a slowdown of a known size is found and
sized, two runs of the same build are never called different, bad input gets one line and exit 2, and the
transformers H200 fixtures (sync vs async, imported traces) say where the time moved."""
from __future__ import annotations

import gzip
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from batchscope.app.cli import main
from batchscope.telemetry import validate_timeline
from batchscope.telemetry.comparison import CompareInputError, Recording, compare, markdown

FIXTURES = Path(__file__).parents[1] / "fixtures"
DECODE_SIZES = (8, 16, 32)


def synthetic(seed: int, steps: int = 600, compute_scale: float = 1.0, fill_extra_us: float = 0.0,
              run_scale: float = 1.0, mode: str = "sync", model: str = "tiny-random", gpu: str = "NVIDIA H200",
              decode_sizes=DECODE_SIZES, host_scale: float = 1.0, basis: str = "gpu") -> dict:
    """A valid timeline: decode steps in three batch sizes (KV growing), compute 2-4 ms with 5% lognormal noise
    and rare 3x stalls, host phases laid out as the sync loop's, idle booked to schedule/fill/launch."""
    rng = random.Random(seed)
    t, out, prev_end = 1000.0, [], None
    for i in range(steps):
        decode = decode_sizes[i * len(decode_sizes) // steps]
        compute = (2000 + 60 * decode) * compute_scale * run_scale * math.exp(rng.gauss(0, 0.05))
        if rng.random() < 0.01:
            compute *= 3
        sched, fill = 40 * host_scale * rng.uniform(0.8, 1.2), (90 + fill_extra_us) * host_scale
        launch, update = 150 * rng.uniform(0.8, 1.2), 30 * host_scale * rng.uniform(0.8, 1.2)
        c0 = t + sched + fill + launch
        rec = {"step": i, "rank": 0, "mode": mode, "slot": i % 2, "num_requests": decode, "prefill_tokens": 0,
               "decode_tokens": decode, "request_ids": [f"r{k}" for k in range(decode)],
               "kv_blocks_used": 40 + (i % (steps // len(decode_sizes))) // 4, "kv_blocks_total": 4096,
               "queue_depth": 0, "running": decode, "sampled": decode, "carried": 0, "tokens_out": decode,
               "cpu": {"schedule": [t, t + sched], "fill": [t + sched, t + sched + fill],
                       "launch": [t + sched + fill, c0], "wait": [c0, c0 + compute + 10],
                       "update": [c0 + compute + 10, c0 + compute + 10 + update]},
               "compute_us": [c0, c0 + compute], "compute_basis": basis,
               "gpu_idle_before_us": None if prev_end is None else round(c0 - prev_end, 1),
               "idle_cause": "launch", "built_during_step": None, "consumed_at_launch": None,
               "gpu": {"h2d": [c0 - 20, c0 - 5], "compute": [c0, c0 + compute],
                       "d2h": [c0 + compute, c0 + compute + 5]}}
        if prev_end is not None:
            gap = c0 - prev_end
            rec["idle_by_cause_us"] = {"schedule": sched, "fill": fill, "launch": max(0.0, gap - sched - fill)}
        else:
            rec["idle_by_cause_us"] = {}
        out.append(rec)
        if basis == "host":
            del rec["gpu"]
        prev_end, t = c0 + compute, c0 + compute + 10 + update
    meta = {"model": model, "device": "cuda:0", "gpu": gpu, "dtype": "bfloat16", "created": "2026-12-04T00:00:00+00:00",
            "config": {"model": model, "mode": mode, "block_size": 16, "max_batch_tokens": 256}}
    tl = {"schema": "batchscope.timeline/1", "meta": meta, "steps": out, "requests": [], "nvml": [],
          "mode_changes": [], "summary": {"tokens_per_s": 1000.0 / compute_scale}}
    return validate_timeline(tl)


def rec(name: str, tl: dict) -> list[Recording]:
    return [Recording(name, tl, "timeline")]


def true_ratio(scale: float) -> float:
    """NEW/BASE device step time when only compute is scaled: compute plus the unchanged host gap."""
    return (2000 + 60 * 18.67) * scale + 280, (2000 + 60 * 18.67) + 280


def test_a_ten_percent_slower_compute_is_found_and_sized():
    result = compare(rec("base", synthetic(1)), rec("new", synthetic(2, compute_scale=1.10)))
    ratio = result["step_time_ratio"]
    assert result["verdict"] == "slower" and result["figures"]["compute"]["verdict"] == "slower"
    assert ratio["low"] < ratio["value"] < ratio["high"]
    new, base = true_ratio(1.10)
    assert ratio["low"] <= new / base <= ratio["high"] + 0.01
    assert 1.05 < ratio["value"] < 1.12
    assert result["figures"]["idle"]["verdict"] == "same"          # the host did not change
    assert result["schema"] == "batchscope.compare/1" and len(result["buckets"]) >= 3
    bucket_verdicts = {b["verdict"] for b in result["buckets"]}
    assert "slower" in bucket_verdicts and bucket_verdicts <= {"slower", "inconclusive"}


def test_the_same_build_twice_is_never_called_different():
    verdicts = [compare(rec("a", synthetic(seed)), rec("b", synthetic(seed + 100)))["verdict"]
                for seed in range(10)]
    assert not {"slower", "faster"} & set(verdicts), verdicts
    assert "same" in verdicts


def test_several_recordings_a_side_measure_the_run_spread():
    # runs of one build that differ by +-4% as a whole: one a side could cry wolf, three a side must not
    scales = (0.96, 1.04, 1.0)
    base = [Recording(f"a{i}", synthetic(i, steps=300, run_scale=s), "timeline") for i, s in enumerate(scales)]
    same = [Recording(f"b{i}", synthetic(10 + i, steps=300, run_scale=s), "timeline")
            for i, s in enumerate(scales[::-1])]
    result = compare(base, same)
    assert result["noise"]["run_spread"] and result["noise"]["min_effect"] == pytest.approx(0.01)
    assert result["verdict"] in ("same", "inconclusive")
    slower = [Recording(f"c{i}", synthetic(20 + i, steps=300, run_scale=s, compute_scale=1.3), "timeline")
              for i, s in enumerate(scales)]
    assert compare(base, slower)["verdict"] == "slower"


def test_a_cpu_machine_that_ran_slower_as_a_whole_gets_no_verdict_from_one_run_a_side():
    # another process's load stretches everything on a CPU: the model's compute and the engine's bookkeeping alike
    busy = compare(rec("a", synthetic(1, basis="host")),
                   rec("b", synthetic(2, basis="host", compute_scale=1.6, host_scale=1.6)))
    assert busy["verdict"] == "inconclusive" and busy["noise"]["machine_speed_ratio"] > 1.4
    assert busy["verdict_reason"] == "machine_speed"
    assert busy["warnings"] and "bookkeeping" in busy["warnings"][0]
    # a slower model leaves the bookkeeping alone: found, with the CPU's larger minimum effect
    model = compare(rec("a", synthetic(1, basis="host")), rec("b", synthetic(2, basis="host", compute_scale=1.6)))
    assert model["verdict"] == "slower" and model["noise"]["min_effect"] == pytest.approx(0.10)
    assert model["noise"]["machine_speed_ratio"] is None and not model["warnings"]


def test_where_the_time_moved_is_named():
    result = compare(rec("base", synthetic(3)), rec("new", synthetic(4, fill_extra_us=800)))
    moved = {m["figure"]: m for m in result["moved"]}
    assert moved["cause.fill"]["grew"] and moved["host.fill"]["grew"]
    assert 0.7 < moved["cause.fill"]["delta_ms"]["value"] < 0.9
    assert result["figures"]["compute"]["verdict"] == "same" and result["verdict"] == "slower"


def test_a_mode_change_is_compared_by_shape_alone_and_unmatched_shapes_are_said():
    result = compare(rec("sync", synthetic(5)), rec("async", synthetic(6, mode="async", decode_sizes=(8, 16, 64))))
    assert not result["matching"]["mode_in_key"]
    only_new = result["unmatched"]["new_only"]
    assert only_new and all("decode 64" in u["bucket"] for u in only_new)
    assert 0.2 < result["unmatched"]["new_time_share"] < 0.6
    assert result["settings_changed"]["mode"] == ["sync", "async"]


def test_matched_steps_holding_little_of_a_runs_time_give_no_overall_verdict():
    # NEW ran two of its three shapes where BASE never went: its matched third cannot speak for it
    result = compare(rec("a", synthetic(5)), rec("b", synthetic(6, compute_scale=1.5, decode_sizes=(8, 64, 128))))
    assert result["unmatched"]["new_time_share"] > 0.5
    assert result["verdict"] == "inconclusive" and "cannot speak for the run" in result["warnings"][-1]
    assert result["verdict_reason"] == "coverage"
    assert result["buckets"] and result["buckets"][0]["verdict"] == "slower"     # the matched shape still says


def test_no_common_shapes_and_empty_recordings_give_no_verdict():
    with pytest.raises(CompareInputError, match="no shape ran on both sides"):
        compare(rec("a", synthetic(1, decode_sizes=(4,))), rec("b", synthetic(2, decode_sizes=(64,))))
    empty = synthetic(1, steps=6)
    empty["steps"] = []
    with pytest.raises(CompareInputError, match="empty recording"):
        compare(rec("a", synthetic(1)), rec("empty", empty))


def _write(path: Path, tl: dict) -> str:
    path.write_text(json.dumps(tl))
    return str(path)


def test_the_command_exit_codes_json_and_markdown(tmp_path, capsys):
    base = _write(tmp_path / "base.json", synthetic(1))
    slow = tmp_path / "slow.json.gz"
    slow.write_bytes(gzip.compress(json.dumps(synthetic(2, compute_scale=1.3)).encode()))
    out, md = tmp_path / "c.json", tmp_path / "c.md"
    assert main(["compare", base, str(slow), "--json", str(out), "--markdown", str(md), "--fail-above", "5"]) == 1
    result = json.loads(out.read_text())
    assert result["verdict"] == "slower" and set(result["step_time_ratio"]) == {"value", "low", "high"}
    text = md.read_text()
    assert "### batchscope compare: **slower**" in text and "| device step time |" in text
    assert main(["compare", base, str(slow), "--fail-above", "50"]) == 0       # slower, but within 50%
    assert main(["compare", base, str(slow)]) == 0                             # no threshold: never 1
    capsys.readouterr()
    # several a side with -- between them; options may follow NEW's recordings
    again = _write(tmp_path / "again.json", synthetic(7))
    assert main(["compare", base, again, "--", str(slow), str(slow), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["new"]["recordings"] == [str(slow)] * 2


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    good = _write(tmp_path / "good.json", synthetic(1))
    other = _write(tmp_path / "other.json", synthetic(2, model="llama3-8b-random", gpu="NVIDIA H100",
                                                        decode_sizes=(64,)))
    (tmp_path / "junk.json").write_text("{not json")
    trace = str(FIXTURES / "transformers-h200-sync.pt.trace.json.gz")
    cases = [([good, str(tmp_path / "missing.json")], "cannot read"),
             ([good, str(tmp_path / "junk.json")], "not a timeline"),
             ([good, good, good], "3 recordings given"),
             ([good, trace], "a profiler trace"),
             ([good, good, "--fail-above", "-5"], "a percentage of 0 or more"),
             ([good, other], "no shape ran on both sides")]
    for args, said in cases:
        capsys.readouterr()
        assert main(["compare", *args]) == 2
        captured = capsys.readouterr()
        assert said in captured.err and "Traceback" not in captured.err
        assert "verdict" not in captured.out
    assert captured.out.startswith("warning: different model")            # said first, even when refused


def test_a_bench_result_gives_its_runs_by_label(tmp_path):
    runs = []
    for label, scale in (("sync", 1.0), ("async", 0.8)):
        _write(tmp_path / f"bench.{label}.timeline.json", synthetic(3, compute_scale=scale))
        runs.append({"label": label, "repeat": 0, "timeline": f"/elsewhere/bench.{label}.timeline.json"})
    bench = _write(tmp_path / "bench.json", {"schema": "batchscope.bench/1", "runs": runs})
    assert main(["compare", f"{bench}#sync", f"{bench}#async", "--json", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["verdict"] == "faster"
    assert main(["compare", bench, f"{bench}#async"]) == 2          # two labels: one must be named


def test_transformers_sync_vs_async_on_the_h200_fixtures():
    result = compare(*(rec_of(FIXTURES / f"transformers-h200-{m}.pt.trace.json.gz") for m in ("sync", "async")))
    ratio = result["step_time_ratio"]
    assert result["verdict"] == "faster" and 0.78 < ratio["value"] < 0.9      # 39.5 -> 33.0 ms per step
    figures = result["figures"]
    assert figures["idle"]["delta_ms"]["value"] < -1.0                       # the gap before each step closed
    assert figures["idle_inside"]["delta_ms"]["value"] < -4.0                 # and the host waits inside it
    assert {"idle", "idle_inside"} <= {m["figure"] for m in result["moved"]}
    assert result["base"]["kind"] == "trace" and result["buckets"][0]["decode_batch"] == "?"


def rec_of(path: Path) -> list[Recording]:
    from batchscope.telemetry.comparison import open_recordings

    return open_recordings(str(path))


def test_the_cli_loads_the_compare_only_when_it_runs():
    code = "import sys, batchscope.app.cli; print('batchscope.telemetry.comparison' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_markdown_says_what_was_not_matched():
    result = compare(rec("a", synthetic(5)), rec("b", synthetic(6, decode_sizes=(8, 16, 64))))
    text = markdown(result)
    assert "shapes only NEW ran" in text and "batch mix" in text


def test_a_running_servers_history_is_read_from_its_address(tmp_path):
    import functools
    import http.server
    import threading

    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "timeline.json").write_text(json.dumps(synthetic(8)))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        base = _write(tmp_path / "base.json", synthetic(9))
        assert main(["compare", base, url, "--json", str(tmp_path / "c.json")]) == 0
        result = json.loads((tmp_path / "c.json").read_text())
        assert result["new"]["recordings"] == [url] and result["verdict"] in ("same", "inconclusive")
        assert main(["compare", base, url + "/missing.json"]) == 2            # the server's 404, one line
    finally:
        server.shutdown()


def test_every_size_falls_in_one_bucket_that_holds_it():
    from batchscope.telemetry.comparison.shapes import decode_bucket, kv_bucket, prefill_bucket

    for bucket in (decode_bucket, prefill_bucket, kv_bucket):
        seen = {}
        for n in range(1, 5000):
            label = bucket(n)
            low, _, high = label.partition("-")
            assert int(low) <= n <= int(high or low), (bucket.__name__, n, label)
            seen.setdefault(label, []).append(n)
        for sizes in seen.values():          # a bucket is one unbroken range of sizes
            assert sizes == list(range(sizes[0], sizes[-1] + 1))
    assert decode_bucket(16) == "16" and decode_bucket(17) == "16-19" and decode_bucket(40) == "40-47"
    assert prefill_bucket(0) == "0" and prefill_bucket(300) == "256-511"
