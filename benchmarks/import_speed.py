"""How fast a huge trace imports: a synthetic ~1 GiB Kineto trace with a serving engine's event mix, imported in a
child process whose wall time and peak RSS are measured (resource.getrusage of the child).

    python benchmarks/import_speed.py                        # 1 GiB plain JSON, then its import
    python benchmarks/import_speed.py --gib 0.1 --gzip       # smaller, gzipped

The trace is shaped like torch.profiler's output of an eager engine with `with_stack=True` (vLLM's default), in
Kineto's own layout (one key per line group, metadata rows at the end): per step a vLLM `execute_context_*`
annotation; per layer a stack of Python function rows, CPU ops, runtime calls (cudaLaunchKernel,
cudaMemcpyAsync), their kernels and copies on two streams with full CUPTI args, and the `ac2g` flow pairs; a
blocking cudaStreamSynchronize and a D2H copy closing each step. The event mix (about 55% Python rows, 15% CPU
ops, 9% runtime calls, 9% device ops, 12% flows) and bytes per event (~300) follow the real vLLM and transformers
traces the importer was checked on. Targets: at most 60 s and 2 GiB RSS on the 2-core development machine.
Imports the one trace --repeats times (3) and writes import_speed.json (figures, machine, command) under --out:
per run the wall time by stage (read, analyse, build), the CPU seconds of the import and its workers (which other
load on the machine does not change), the peak RSS of the importing process and of its largest worker, and the
load average around it; the median run as `import`.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAYERS = 16
BASE_TS = 5_311_380_000_000.0
PID, TID = 1801, 1801
KERNELS = ["void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
           "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)",
           "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
           "_kernel__5x_cublas",
           "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
           "cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t> >, false, true, false>"
           "(flash::Flash_fwd_params)",
           "void vllm::rms_norm_kernel<c10::BFloat16, 8, 4>(c10::BFloat16*, c10::BFloat16 const*, long, long, "
           "c10::BFloat16 const*, float, int, int)"]
PY = ["vllm/model_executor/models/llama.py(315): forward", "torch/nn/modules/module.py(1773): _call_impl",
      "torch/nn/modules/module.py(1762): _wrapped_call_impl", "vllm/model_executor/layers/linear.py(512): forward",
      "<built-in method apply of type object at 0x7f2c3f4e1140>", "vllm/attention/layer.py(288): forward"]


def _x(cat: str, name: str, pid, tid, ts: float, dur: float, args: str) -> str:
    return (f'  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {pid}, "tid": {tid},\n'
            f'    "ts": {ts:.3f}, "dur": {dur:.3f},\n    "args": {{\n      {args}\n    }}\n  }}')


def _flows(corr: int, ts: float, dev_ts: float, stream: int) -> list[str]:
    return [f'  {{\n    "ph": "s", "id": {corr}, "pid": {PID}, "tid": {TID}, "ts": {ts:.3f},\n'
            f'    "cat": "ac2g", "name": "ac2g"\n  }}',
            f'  {{\n    "ph": "f", "id": {corr}, "pid": 0, "tid": {stream}, "ts": {dev_ts:.3f},\n'
            f'    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  }}']


class StepWriter:
    """Writes one engine step after another, each about 2,200 events."""

    def __init__(self):
        self.t = BASE_TS
        self.dev_free = BASE_TS
        self.corr = 100
        self.ext = 1000
        self.py_id = 1

    def _launch(self, out: list, name: str, at: float, dur: float, stream: int = 7) -> float:
        self.corr += 1
        self.ext += 1
        out.append(_x("cuda_runtime", "cudaLaunchKernel", PID, TID, at, 4.2,
                      f'"External id": {self.ext}, "cbid": 211, "correlation": {self.corr}'))
        start = max(at + 6.0, self.dev_free + 1.1)
        self.dev_free = start + dur
        out.append(_x("kernel", name.replace('"', "'"), 0, stream, start, dur,
                      f'"External id": {self.ext}, "queued": 0, "device": 0, "context": 1, "stream": {stream}, '
                      f'"correlation": {self.corr}, "registers per thread": 128, "shared memory": 49152, '
                      f'"blocks per SM": 1.212121, "warps per SM": 4.848485, "grid": [132, 1, 1], '
                      f'"block": [128, 1, 1], "est. achieved occupancy %": 6'))
        out.extend(_flows(self.corr, at, start, stream))
        return at + 4.2

    def _python(self, out: list, name: str, at: float, dur: float) -> None:
        self.py_id += 1
        out.append(_x("python_function", name, PID, TID, at, dur,
                      f'"Python parent id": {self.py_id - 1}, "Python id": {self.py_id}, "Ev Idx": {self.py_id}'))

    def _cpu_op(self, out: list, name: str, at: float, dur: float) -> None:
        self.ext += 1
        out.append(_x("cpu_op", name, PID, TID, at, dur,
                      f'"External id": {self.ext}, "Record function id": 0, "Sequence number": {self.ext}, '
                      f'"Fwd thread id": 0, "Ev Idx": {self.ext}'))

    def step(self, k: int) -> list[str]:
        out: list[str] = []
        t0 = self.t
        decode = 32 if k % 8 else 0
        prefill = 0 if k % 8 else 2048
        for layer in range(LAYERS):
            base = t0 + 40.0 + layer * 260.0
            for depth, name in enumerate(PY):
                self._python(out, name, base + depth * 2.0, 250.0 - depth * 4.0)
            for j in range(8):                                  # 8 ops per layer, each with a child op
                at = base + 14.0 + j * 29.0
                self._cpu_op(out, "aten::linear" if j % 2 else "aten::add", at, 22.0)
                self._cpu_op(out, "aten::addmm" if j % 2 else "aten::empty", at + 3.0, 14.0)
                for m in range(4):                              # Python builtins the stack records under an op
                    self._python(out, "<built-in method size of Tensor object at 0x7f2c0838bb40>", at + 1 + m * 5, 1.5)
                self._launch(out, KERNELS[j % len(KERNELS)], at + 10.0, 9.0 + (j % 3) * 6.0 + prefill / 400)
        end = t0 + 40.0 + LAYERS * 260.0
        out.insert(0, _x("user_annotation", f"execute_context_{1 if prefill else 0}({prefill})_generation_"
                         f"{decode}({decode})", PID, TID, t0, end - t0 + 60.0,
                         f'"External id": {self.ext}, "Record function id": 0, "Ev Idx": 0'))
        self.corr += 1
        copy_at = max(self.dev_free + 2.0, end + 8.0)
        out.append(_x("cuda_runtime", "cudaMemcpyAsync", PID, TID, end, 3.5, f'"cbid": 41, "correlation": {self.corr}'))
        out.append(_x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 0, 13, copy_at, 2.1,
                      f'"device": 0, "context": 1, "stream": 13, "correlation": {self.corr}, "bytes": 256, '
                      f'"memory bandwidth (GB/s)": 0.12'))
        out.extend(_flows(self.corr, end, copy_at, 13))
        self.corr += 1
        out.append(_x("cuda_runtime", "cudaStreamSynchronize", PID, TID, end + 4.0, copy_at + 2.1 - end,
                      f'"cbid": 131, "correlation": {self.corr}'))
        self.t = copy_at + 2.1 + 180.0                         # the host's work between steps
        return out


def _metadata() -> str:
    rows = [{"name": "process_name", "ph": "M", "ts": BASE_TS, "pid": PID, "tid": 0, "args": {"name": "VLLM::EngineCore"}},
            {"name": "process_labels", "ph": "M", "ts": BASE_TS, "pid": PID, "tid": 0, "args": {"labels": "CPU"}},
            {"name": "process_labels", "ph": "M", "ts": BASE_TS, "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
            {"name": "thread_name", "ph": "M", "ts": BASE_TS, "pid": PID, "tid": TID,
             "args": {"name": f"thread {TID} (VLLM::EngineCore)"}}]
    return ",\n".join("  " + json.dumps(r) for r in rows)


def generate(path: Path, target_bytes: int, use_gzip: bool) -> dict:
    head = ('{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {"id": 0, "name": "NVIDIA H200", '
            '"totalGlobalMem": 150109880320, "computeMajor": 9, "computeMinor": 0, "numSms": 132}\n  ],\n'
            '  "with_stack": 1,\n  "cupti_version": 130001,\n  "cuda_runtime_version": 13000,\n'
            '  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": 1790857026000000000,\n  "traceEvents": [\n')
    raw = open(path, "wb")
    out = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) if use_gzip else raw
    writer, steps, events, written = StepWriter(), 0, 0, len(head)
    out.write(head.encode())
    while written < target_bytes:
        chunk = ",\n".join(writer.step(steps)) + ",\n"
        events += chunk.count('"ph"')
        data = chunk.encode()
        out.write(data)
        written += len(data)
        steps += 1
        if steps % 200 == 0:
            print(f"  generating: {written / 2**30:.2f} GiB, {steps} steps", flush=True)
    tail = _metadata() + '\n  ],\n  "traceName": "/tmp/synthetic.json"\n}\n'
    out.write(tail.encode())
    out.close()
    if use_gzip:
        raw.close()
    return {"steps": steps, "events": events + 4, "text_bytes": written + len(tail), "file_bytes": path.stat().st_size}


_CHILD = """
import json, resource, sys, time
from batchscope.telemetry.importers import import_trace
from batchscope.telemetry.importers.file_analysis import analyse
from batchscope.telemetry.importers.reading import read_trace
from batchscope.telemetry.importers.to_timeline import build
from batchscope.telemetry import validate_timeline
path, workers = sys.argv[1], int(sys.argv[2]) or None
t0, c0 = time.perf_counter(), time.process_time()
tables = read_trace(path, workers=workers)                # import_trace's own steps, timed one by one
t1, c1 = time.perf_counter(), time.process_time()
fa = analyse(tables)
t2, c2 = time.perf_counter(), time.process_time()
tl = validate_timeline(build([fa], [0]))
t3, c3 = time.perf_counter(), time.process_time()
s = tl["summary"]
print(json.dumps({"wall_s": round(t3 - t0, 2), "read_s": round(t1 - t0, 2), "analyse_s": round(t2 - t1, 2),
                  "build_s": round(t3 - t2, 2), "read_cpu_s_this_process": round(c1 - c0, 2),
                  "analyse_cpu_s": round(c2 - c1, 2), "build_cpu_s": round(c3 - c2, 2),
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  "workers_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
                  "steps": len(tl["steps"]), "timeline_bytes": len(json.dumps(tl)), "busy_pct": s["busy_pct"],
                  "busy_pct_device_ops": s.get("busy_pct_device_ops"), "idle_us_total": s["idle_us_total"],
                  "idle_inside_us_total": s.get("idle_inside_us_total"), "engine": tl["meta"]["source"]["engine"]}))
"""


def _import_once(path: Path, workers: int | None) -> dict | None:
    """One import in a child process: its own figures, its CPU seconds with its workers', the load around it."""
    root = Path(__file__).resolve().parents[1]
    load_before = os.getloadavg()
    used_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(workers or 0)], capture_output=True,
                           text=True, cwd=root)
    if child.returncode:
        print(child.stderr[-3000:])
        return None
    got = json.loads(child.stdout.strip().splitlines()[-1])
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the import and its parsing workers: what the machine's other load cannot change
    got["cpu_s"] = round(used.ru_utime - used_before.ru_utime + used.ru_stime - used_before.ru_stime, 1)
    got["load_avg_before"], got["load_avg_after"] = load_before, os.getloadavg()
    print(f"  import: {got['wall_s']} s wall, {got['cpu_s']} s CPU, {got['peak_rss_mib']} MiB, "
          f"load {load_before[0]:.1f} -> {got['load_avg_after'][0]:.1f}", flush=True)
    return got


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="size of the trace's JSON text")
    p.add_argument("--gzip", action="store_true", help="write it gzipped (the import then decompresses too)")
    p.add_argument("--trace", default=None, help="where to write the trace (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the trace file afterwards")
    p.add_argument("--reuse", action="store_true", help="import a trace --keep left at --trace, not a new one")
    p.add_argument("--workers", type=int, default=None, help="parsing processes (default: one per core)")
    p.add_argument("--repeats", type=int, default=3, help="imports of the one trace (the median is reported)")
    p.add_argument("--out", default=os.environ.get("OUT") or "out/import_speed")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = Path(args.trace or f"/tmp/import_speed.{args.gib:g}gib.pt.trace.json{'.gz' if args.gzip else ''}")
    t0 = time.perf_counter()
    made_file = path.with_name(path.name + ".made.json")
    if args.reuse and path.exists() and made_file.exists():
        made = json.loads(made_file.read_text())
    else:
        made = generate(path, int(args.gib * 2**30), args.gzip)
        made_file.write_text(json.dumps(made))
        print(f"generated {path} ({made['file_bytes']:,} B on disk, {made['events']:,} events, "
              f"{made['steps']} steps) in {time.perf_counter() - t0:.0f} s", flush=True)
    runs = [_import_once(path, args.workers) for _ in range(args.repeats)]
    if any(r is None for r in runs):
        return 1
    median = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]
    doc = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(["python", *sys.argv]),
           "machine": {"cpus": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
                       "python": platform.python_version()},
           "trace": {**made, "gzip": args.gzip}, "import": median, "runs": runs,
           "targets": {"wall_s": 60, "peak_rss_mib": 2048},
           "met": {"wall": median["wall_s"] <= 60, "rss": max(r["peak_rss_mib"] for r in runs) <= 2048}}
    (out / "import_speed.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))
    if not args.keep:
        path.unlink()
        made_file.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
