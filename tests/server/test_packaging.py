"""batchscope installs like a Python package: one `batchscope` namespace with its browser files inside, nothing
generic at the top of site-packages, and a user's own `app` or `engine` package beside it changes nothing."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx
import pytest

import batchscope

ROOT = Path(__file__).resolve().parents[2]

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel built from this checkout, installed (not editable, no dependencies) into a fresh venv."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp / "dist"), str(ROOT)], check=True, cwd=tmp)
    wheel = next((tmp / "dist").glob("batchscope-*.whl"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--disable-pip-version-check", str(wheel)], check=True, cwd=tmp)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    return venv, site, tmp


def _env_with_dependencies() -> dict:
    # The fresh venv holds batchscope alone; its dependencies come from this interpreter's site-packages, which
    # has no `batchscope` folder of its own (the development install is a finder, not files).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]
    return env


def test_site_packages_holds_batchscope_and_its_dist_info_only(installed):
    _venv, site, _tmp = installed
    names = sorted(p.name for p in site.iterdir() if p.name != "__pycache__")
    assert names == ["batchscope", f"batchscope-{batchscope.__version__}.dist-info"], names
    pkg = site / "batchscope"
    assert {"app", "engine", "telemetry", "assets"} <= {p.name for p in pkg.iterdir()}
    assert (pkg / "assets" / "js" / "main.js").is_file() and (pkg / "assets" / "style.css").is_file()
    assert not list((pkg / "assets").glob("*.png"))             # README pictures are not shipped


def test_the_installed_command_serves_the_page_and_its_files(installed):
    venv, site, tmp = installed
    version = subprocess.run([str(venv / "bin" / "batchscope"), "--version"], capture_output=True, text=True,
                             env=_env_with_dependencies(), cwd=tmp)
    assert version.returncode == 0 and version.stdout.strip() == f"batchscope {batchscope.__version__}"
    port = _free_port()
    proc = subprocess.Popen([str(venv / "bin" / "batchscope"), "serve", "--model", "tiny-random", "--device", "cpu",
                             "--dtype", "float32", "--port", str(port)], cwd=tmp, env=_env_with_dependencies(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                health = httpx.get(url + "/api/health", timeout=2)
                if health.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"the installed batchscope did not come up:\n{proc.stdout.read()}")
            time.sleep(0.3)
        assert health.json()["status"] == "ok" and health.json()["model"] == "tiny-random"
        page = httpx.get(url + "/", timeout=30)
        assert page.status_code == 200 and "/batchscope-static/js/main.js" in page.text
        for name, kind in (("js/main.js", "javascript"), ("style.css", "css"), ("plotly.min.js", "javascript")):
            r = httpx.get(f"{url}/batchscope-static/{name}", timeout=30)
            assert r.status_code == 200 and kind in r.headers["content-type"] and len(r.content) > 1000, name
        # the served script is the one inside the installed package
        shipped = (site / "batchscope" / "assets" / "js" / "main.js").read_bytes()
        assert httpx.get(url + "/batchscope-static/js/main.js", timeout=30).content == shipped
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_users_own_app_and_engine_packages_do_not_shadow_ours(tmp_path):
    for name in ("app", "engine", "telemetry"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"MINE = {name!r}\n")
    code = ("import app, engine, telemetry; "
            "from batchscope import EngineConfig, SamplingParams, Engine; "
            "from batchscope.app.server import create_app; from batchscope.telemetry import Telemetry; "
            "import batchscope.engine.engine as e; "
            "assert (app.MINE, engine.MINE, telemetry.MINE) == ('app', 'engine', 'telemetry'); "
            "assert Engine is e.Engine and EngineConfig(model='tiny-random').model == 'tiny-random'; "
            "print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_version_and_the_module_entry_point():
    proc = subprocess.run([sys.executable, "-m", "batchscope", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == f"batchscope {batchscope.__version__}"
    assert batchscope.__version__ != "0+unknown"
