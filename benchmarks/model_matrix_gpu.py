"""The model-support matrix on a GPU: every family of tests/engine/test_model_matrix.py as a tiny random checkpoint,
loaded with device="cuda", dtype float32 and the engine's defaults (Triton attention, fused kernels, CUDA graphs),
greedy tokens compared with transformers' generate in sync, async and with live switches; refused families must be
refused with their reason; two checks that an uncapturable decode falls back to eager without a crash.

Each family runs in its own subprocess (a crash or a hung capture costs that row only), several at a time.

    python benchmarks/model_matrix_gpu.py --out out/model_matrix.json            # all, ~2-3 min on an H200
    python benchmarks/model_matrix_gpu.py --families gemma2,qwen3_moe --out x.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ("capture-fallback-sync", "capture-fallback-midway")


def _make_importable() -> None:
    """A GPU box without this project installed: map the `batchscope` packages onto the source folders the way
    pyproject.toml's package-dir does, so the script runs from a bare checkout (nothing to install there)."""
    try:
        import batchscope.engine  # noqa: F401
        return
    except ImportError:
        pass
    import importlib.abc
    import importlib.util
    import tomllib

    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]

    class SourceTree(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name in dirs:
                folder = ROOT / dirs[name]
                return importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                              submodule_search_locations=[str(folder)])
            return None
    sys.meta_path.insert(0, SourceTree())


def _matrix():
    _make_importable()
    sys.path.insert(0, str(ROOT / "tests"))
    import test_model_matrix as mm
    return mm


def run_one(name: str, device: str) -> dict:
    """In the child: one family (or check), returned as a JSON-able dict."""
    import torch

    mm = _matrix()
    from batchscope.engine import ConfigError, Engine, EngineConfig

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if name in mm.REFUSED:
            path = mm.build_checkpoint(name, Path(tmp) / name)
            reason = mm.REFUSED[name][2]
            try:
                Engine(EngineConfig(model=path, device=device, dtype="float32")).close()
                return {"kind": "refused", "ok": False, "detail": "loaded, but should have been refused"}
            except ConfigError as exc:
                msg = str(exc)
                ok = f"model type {name!r}" in msg and reason in msg
                return {"kind": "refused", "ok": ok, "detail": msg.split(". Supported:")[0],
                        "seconds": round(time.perf_counter() - t0, 1)}
        if name in CHECKS:
            return _fallback_check(name, mm, Path(tmp), device, t0)
        path = mm.build_checkpoint(name, Path(tmp) / name)
        res = mm.run_matrix_family(path, device)
    info = res["info"]
    ok = all(r["exact"] for r in res["modes"].values())
    return {"kind": "supported", "ok": ok, "modes": res["modes"], "cuda_graphs": info.get("cuda_graphs"),
            "graphs_note": res["graphs_note"], "graph_experts": res["graph_experts"],
            "attention": info.get("attention"), "fused_kernels": info.get("fused_kernels"),
            "merged_projections": info.get("merged_projections"), "preempted": res["preempted"],
            "chunked": res["chunked"], "seconds": round(time.perf_counter() - t0, 1),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def _fallback_check(name: str, mm, tmp: Path, device: str, t0: float) -> dict:
    """A llama whose MLP syncs with the host always (the warm-up catches it) or only while a capture runs (the
    capture itself fails and must be undone): both must run eagerly, exact, and a fresh engine must capture."""
    import torch
    from transformers.models.llama import modeling_llama

    path = mm.build_checkpoint("llama", tmp / "llama")
    original = modeling_llama.LlamaMLP.forward
    always = name == "capture-fallback-sync"

    def forward(self, x):
        out = original(self, x)
        if always or torch.cuda.is_current_stream_capturing():
            out.sum().item()
        return out
    modeling_llama.LlamaMLP.forward = forward
    try:
        res = mm.run_matrix_family(path, device, modes=("sync", "async"))
    finally:
        modeling_llama.LlamaMLP.forward = original
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    again = mm.run_matrix_family(path, device, modes=("async",))
    ok = (not res["use_graphs"] and bool(res["graphs_note"]) and all(r["exact"] for r in res["modes"].values())
          and again["use_graphs"] and again["modes"]["async"]["exact"])
    return {"kind": "check", "ok": ok, "modes": res["modes"], "cuda_graphs": res["info"].get("cuda_graphs"),
            "graphs_note": res["graphs_note"], "after": {"cuda_graphs": again["use_graphs"],
                                                         "exact": again["modes"]["async"]["exact"]},
            "seconds": round(time.perf_counter() - t0, 1)}


def _child(name: str, device: str, timeout: float) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
           "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONPATH": os.pathsep.join(
               [str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--device", device], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-1500:]
        return {"ok": False, "kind": "?", "error": f"timed out after {timeout:.0f} s",
                "stderr": tail.decode(errors="replace") if isinstance(tail, bytes) else tail}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                row = json.loads(line)
                row["wall_s"] = round(time.perf_counter() - t0, 1)
                return row
            except ValueError:
                break
    return {"ok": False, "kind": "?", "error": f"exit code {proc.returncode}", "stderr": proc.stderr[-1500:]}


def _table(rows: dict) -> str:
    lines = [f"{'family':<24}{'result':<8}{'graphs':<8}{'experts':<11}{'sync':<6}{'async':<6}{'switch':<7}"
             f"{'s':>6}  note"]
    for name, r in rows.items():
        modes = r.get("modes") or {}
        cell = {m: ("ok" if modes[m]["exact"] else "DIFF") if m in modes else "-" for m in ("sync", "async",
                                                                                             "switch")}
        note = r.get("error") or r.get("detail") or r.get("graphs_note") or ""
        lines.append(f"{name:<24}{'PASS' if r.get('ok') else 'FAIL':<8}{str(r.get('cuda_graphs', '-')):<8}"
                     f"{str(r.get('graph_experts') or '-'):<11}{cell['sync']:<6}{cell['async']:<6}"
                     f"{cell['switch']:<7}{r.get('wall_s', 0):>6}  {note[:110]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--device", default="cuda")
    p.add_argument("--families", default="", help="comma-separated subset (default: all families and checks)")
    p.add_argument("--jobs", type=int, default=6, help="families run at the same time, each in its own process")
    p.add_argument("--timeout", type=float, default=200, help="seconds before a family's process is killed")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        try:
            row = run_one(args.one, args.device)
        except Exception as exc:       # reported as the row's result, never a crash of the whole matrix
            row = {"ok": False, "kind": "?", "error": f"{type(exc).__name__}: {exc}",
                   "stderr": traceback.format_exc()[-1500:]}
        print(json.dumps(row, default=str), flush=True)
        return 0

    mm = _matrix()
    names = [n for n in args.families.split(",") if n] or [*mm.FAMILIES, *mm.REFUSED, *CHECKS]
    unknown = [n for n in names if n not in mm.FAMILIES and n not in mm.REFUSED and n not in CHECKS]
    if unknown:
        p.error(f"unknown families {unknown}")
    import torch
    import transformers
    import triton

    meta = {"torch": torch.__version__, "transformers": transformers.__version__, "triton": triton.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None, "device": args.device,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    print(" ".join(f"{k}={v}" for k, v in meta.items()), flush=True)
    t0 = time.perf_counter()
    rows: dict = {}
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {name: pool.submit(_child, name, args.device, args.timeout) for name in names}
        for name in names:
            rows[name] = futures[name].result()
            r = rows[name]
            print(f"  {name}: {'PASS' if r.get('ok') else 'FAIL'} ({r.get('wall_s', '?')} s)", flush=True)
    print(_table(rows))
    passed = sum(1 for r in rows.values() if r.get("ok"))
    print(f"{passed} passed, {len(rows) - passed} failed in {time.perf_counter() - t0:.0f} s")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"meta": meta, "results": rows}, indent=1, default=str))
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
