"""Profiler traces from the command line and the page: `batchscope import TRACE` writes a timeline and sums it up
(a one-line error and exit 2 for a bad file), `batchscope replay TRACE` serves it, and the replay upload
(POST /api/replay, the page's "load replay") takes a trace as it takes a timeline, under the same 64 MiB cap."""
from __future__ import annotations

import gzip
import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from batchscope.app.cli import main as cli_main
from batchscope.app.server import MAX_REPLAY_BYTES, create_app
from batchscope.app.server.state import AppState
from batchscope.telemetry import load_timeline
from helpers import free_port
from kineto_builder import KinetoTrace

FIXTURES = Path(__file__).parents[1] / "fixtures"
SYNC_TRACE = FIXTURES / "batchscope-cpu-sync.pt.trace.json.gz"
OWN_TIMELINE = FIXTURES / "batchscope-cpu-async.timeline.json.gz"


def vllm_trace() -> KinetoTrace:
    """Four vLLM steps on a GPU (its execute_* annotations), each two kernels with a launch-bound stretch between
    them and a blocking sync after: idle both before and inside every step."""
    tr = KinetoTrace()
    for k in range(4):
        t = 300 * k
        tr.annotation("execute_context_1(8)_generation_0(0)" if k == 0 else "execute_context_0(0)_generation_2(2)",
                      t, 150)
        tr.launch(t + 10, 5, kernel_at=t + 20, kernel_dur=40)
        tr.launch(t + 100, 5, kernel_at=t + 110, kernel_dur=30)
        tr.sync(t + 150, 20)
    return tr


def cpu_only_trace() -> KinetoTrace:
    tr = KinetoTrace()
    tr.annotation("ProfilerStep#1", 0, 100)
    tr.cpu_op("aten::mm", 10, 50)
    return tr


def import_cli(capsys, *args) -> tuple[int, str, str]:
    rc = cli_main(["import", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------------------------------ batchscope import

def test_import_writes_the_timeline_beside_the_trace_and_sums_it_up(tmp_path, capsys):
    trace = tmp_path / SYNC_TRACE.name
    shutil.copy(SYNC_TRACE, trace)
    rc, out, err = import_cli(capsys, trace)
    assert rc == 0 and err == ""                       # no bar off a terminal, nothing else on stderr
    written = tmp_path / "batchscope-cpu-sync.timeline.json"
    tl = load_timeline(written)
    assert len(tl["steps"]) == 10 and tl["meta"]["source"]["engine"] == "batchscope"
    assert out.startswith(f"wrote {written} (")
    assert "source: batchscope (its step markers), 1 file, 6,950 events" in out
    assert "steps: 10 (16-25, 10 sync)" in out
    assert f"busy: {tl['summary']['busy_pct']:.1f}%" in out
    top = max(tl["summary"]["idle_us_by_cause"].items(), key=lambda kv: kv[1])
    assert f"idle between steps: {tl['summary']['idle_us_total'] / 1e3:.2f} ms: {top[0]} {top[1] / 1e3:.2f} ms" in out
    assert "not in the trace: request_ids, kv_blocks_used" in out and "inferred: tokens_out" in out


def test_import_keeps_kernels_and_writes_a_gzipped_output(tmp_path, capsys):
    trace = vllm_trace().write(tmp_path / "dp0_rank0.pt.trace.json.gz")
    out_path = tmp_path / "out" / "vllm.timeline.json.gz"
    rc, out, err = import_cli(capsys, trace, "-o", out_path, "--kernels", "--workers", "1")
    assert rc == 0, err
    tl = load_timeline(gzip.decompress(out_path.read_bytes()))
    assert tl["meta"]["source"]["engine"] == "vllm" and len(tl["steps"]) == 4
    assert tl["kernels"][0]["ops"]                     # --kernels kept the device ops
    assert "source: vLLM" in out and "kernels kept: 8 device ops" in out
    inside = tl["summary"]["idle_inside_us_total"]
    assert inside > 0 and f"idle inside steps: {inside / 1e3:.2f} ms: " in out
    summary = tl["summary"]                            # the device's figure leads, the steps' one beside it
    assert summary["busy_basis"] == "device_ops" and summary["busy_pct"] == summary["busy_pct_device_ops"]
    assert f"busy: {summary['busy_pct']:.1f}% (device ops" in out
    assert f"{summary['busy_pct_steps']:.1f}% by the steps' compute spans (they see idle between steps only)" in out
    assert not (tmp_path / "dp0_rank0.timeline.json").exists()   # -o, not the default name


def _cut(tmp_path: Path) -> Path:
    p = tmp_path / "cut.pt.trace.json.gz"
    data = SYNC_TRACE.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    return p


BAD_FILES = {
    "not JSON": (lambda tmp: _write(tmp / "notes.json", b"hello, trace"), "not valid JSON"),
    "empty": (lambda tmp: _write(tmp / "empty.json", b""), "empty file"),
    "no traceEvents": (lambda tmp: _write(tmp / "other.json", b'{"schemaVersion": 1}'), "no traceEvents"),
    "truncated .gz": (_cut, "truncated: the gzip stream ends"),
    "no GPU events": (lambda tmp: cpu_only_trace().write(tmp / "cpu.json.gz"), "no device activity"),
    "missing": (lambda tmp: tmp / "missing.pt.trace.json.gz", "no such file"),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_a_bad_trace_is_exit_2_with_one_line(tmp_path, capsys, kind):
    make, reason = BAD_FILES[kind]
    path = make(tmp_path)
    rc, out, err = import_cli(capsys, path)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"batchscope: cannot import: {path}: ") and reason in err, err
    assert "Traceback" not in err
    assert not list(tmp_path.glob("*timeline*"))       # nothing half written


def test_a_truncated_trace_points_at_partial_which_imports_what_was_written(tmp_path, capsys):
    tr = KinetoTrace()
    for k in range(400):
        tr.annotation(f"ProfilerStep#{k}", 100 * k, 100)
        tr.launch(100 * k + 5, 3, kernel_at=100 * k + 20, kernel_dur=50)
    data = gzip.compress(json.dumps(tr.to_dict()).encode())
    path = tmp_path / "cut.pt.trace.json.gz"
    path.write_bytes(data[: len(data) // 2])
    rc, _, err = import_cli(capsys, path)
    assert rc == 2 and "(--partial imports what was written)" in err
    rc, out, _ = import_cli(capsys, path, "--partial")
    assert rc == 0 and "note: " in out and "ends early" in out
    assert load_timeline(tmp_path / "cut.timeline.json")["steps"]


def test_the_output_never_overwrites_the_trace(tmp_path, capsys):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(vllm_trace().to_dict()))
    before = trace.read_bytes()
    rc, _, err = import_cli(capsys, trace, "-o", trace)
    assert rc == 2 and "overwrite the trace" in err and trace.read_bytes() == before


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_shows_on_a_terminal_only(tmp_path, monkeypatch, capsys):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert cli_main(["import", str(SYNC_TRACE), "-o", str(tmp_path / "a.timeline.json")]) == 0
    bar = terminal.getvalue()
    assert "importing batchscope-cpu-sync.pt.trace.json.gz" in bar and "100%" in bar
    assert "wrote " in capsys.readouterr().out        # the summary stays on stdout


def test_help_is_fast_and_loads_neither_torch_nor_the_importer():
    code = ("import sys, time\n"
            "from batchscope.app.cli import main\n"
            "for argv in (['--help'], ['import', '--help']):\n"
            "    try:\n"
            "        main(argv)\n"
            "    except SystemExit as e:\n"
            "        assert e.code == 0\n"
            "heavy = [m for m in ('torch', 'numpy', 'ijson', 'batchscope.telemetry.importers') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "import" in r.stdout and "--kernels" in r.stdout and "--workers N" in r.stdout
    assert time.monotonic() - t0 < 30                  # torch alone takes longer than this on a busy box


# ------------------------------------------------------------------------------------------ batchscope replay

def test_replay_serves_a_trace_converted_on_the_fly(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "batchscope.app.cli", "replay", str(SYNC_TRACE), "--no-ui",
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(url + "/api/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"batchscope replay did not come up:\n{proc.stdout.read() if proc.poll() else ''}")
            time.sleep(0.2)
        replay = httpx.get(url + "/api/replay.json", timeout=60).json()
        assert len(replay["steps"]) == 10 and replay["meta"]["source"]["engine"] == "batchscope"
        assert replay["summary"]["board"]                 # the scoreboard, as for any replay
    finally:
        proc.terminate()
        proc.wait(30)
    assert "(a profiler trace, imported): 10 steps" in proc.stdout.read()


def test_replay_refuses_a_bad_trace_in_one_line(tmp_path, capsys):
    cut = _cut(tmp_path)
    assert cli_main(["replay", str(cut), "--no-ui"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot replay {cut}: " in err and "truncated" in err, err


# ------------------------------------------------------------------------------------------ the replay upload

@pytest.fixture(scope="module")
def own_timeline() -> dict:
    return json.loads(gzip.decompress(OWN_TIMELINE.read_bytes()))


@pytest.fixture
def upload(own_timeline):
    """A replay-only server showing batchscope's own recording; its replay upload."""
    with TestClient(create_app(AppState(replay=load_timeline(own_timeline)), ui=False)) as c:
        yield c


def test_an_uploaded_trace_is_imported_and_replayed(upload, tmp_path):
    gz = SYNC_TRACE.read_bytes()
    r = upload.post("/api/replay", content=gz, params={"name": SYNC_TRACE.name},
                    headers={"content-type": "application/octet-stream"})
    assert r.status_code == 200, r.text
    assert r.json()["steps"] == 10 and r.json()["meta"]["source"]["engine"] == "batchscope"
    replay = upload.get("/api/replay.json").json()
    assert len(replay["steps"]) == 10 and replay["summary"]["board"]
    # named as the uploader named it; the server's temporary file is nowhere
    assert [f["name"] for f in replay["meta"]["source"]["files"]] == [SYNC_TRACE.name]
    assert "path" not in replay["meta"]["source"]["files"][0]
    # the same trace as plain JSON, as the page sends a chosen file (no name: still imported)
    r = upload.post("/api/replay", content=gzip.decompress(gz))
    assert r.status_code == 200 and r.json()["steps"] == 10


def test_a_gzipped_timeline_uploads_too(upload, own_timeline):
    r = upload.post("/api/replay", content=OWN_TIMELINE.read_bytes())
    assert r.status_code == 200 and r.json()["steps"] == len(own_timeline["steps"])
    assert "source" not in upload.get("/api/replay.json").json()["meta"]      # a timeline, not imported


@pytest.mark.parametrize("body, name, reason", [
    (None, "cut.pt.trace.json.gz", "cut.pt.trace.json.gz: truncated: the gzip stream ends"),
    (b'{"traceEvents": []}', "empty.json", "empty.json: a trace with no events"),
    (gzip.compress(json.dumps(cpu_only_trace().to_dict()).encode()), "../../cpu.json.gz",
     "cpu.json.gz: no device activity"),
])
def test_a_bad_trace_upload_is_400_and_the_server_keeps_serving(upload, own_timeline, body, name, reason):
    if body is None:
        data = SYNC_TRACE.read_bytes()
        body = data[: len(data) // 2]
    r = upload.post("/api/replay", content=body, params={"name": name})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error.startswith(reason) and "\n" not in error and "batchscope-upload-" not in error, error
    assert upload.get("/api/health").status_code == 200
    assert upload.get("/api/replay.json").json()["steps"] == own_timeline["steps"]   # the old replay stays


def test_the_upload_cap_holds_for_traces_and_gzipped_timelines(upload):
    over = b"\x1f\x8b" + b"\0" * MAX_REPLAY_BYTES       # a gzip's first bytes, one past the cap
    r = upload.post("/api/replay", content=over)
    assert r.status_code == 413 and "64 MiB" in r.json()["error"]
    # a small gzip that unpacks past the cap is refused before it is parsed
    bomb = gzip.compress(b'{"schema": "batchscope.timeline/1", "pad": "' + b" " * MAX_REPLAY_BYTES + b'"}')
    assert len(bomb) < 1 << 20
    r = upload.post("/api/replay", content=bomb)
    assert r.status_code == 400 and "unpacks to over the replay limit of 64 MiB" in r.json()["error"]
    assert upload.get("/api/health").status_code == 200
