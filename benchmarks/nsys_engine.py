"""batchscope's engine for Nsight Systems to record: sync then async on a wave workload, inside
torch.cuda.profiler.start()/stop() (for `--capture-range=cudaProfilerApi`), with batchscope's own telemetry recording
the same steps ({mode}.timeline.json.gz under OUT_DIR).

    BATCHSCOPE_ANNOTATE=1 nsys profile -t cuda,nvtx --cuda-graph-trace=node --capture-range=cudaProfilerApi \
        --capture-range-end=stop -o bs python benchmarks/nsys_engine.py OUT_DIR [MODEL]
    nsys export --type sqlite -o bs.sqlite bs.nsys-rep && batchscope import bs.sqlite
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_ground_truth import parse_args, workload, submit_in_waves, write_gz, log  # noqa: E402
import json  # noqa: E402

import torch  # noqa: E402
from batchscope.engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from batchscope.telemetry import Telemetry  # noqa: E402

out = sys.argv[1]
model = sys.argv[2] if len(sys.argv) > 2 else "llama3-8b-random"
args = parse_args(["--steps", "100", "--requests", "24", "--out", out, "--model", model])
log(f"loading {args.model}")
eng = Engine(EngineConfig(model=args.model, device="cuda", dtype="bfloat16", mode="sync", num_blocks=args.num_blocks,
                          max_batch_tokens=args.max_batch_tokens, max_running=32, seed=0))
tel = Telemetry(eng, nvml_hz=20)
for mode in ("sync", "async"):
    eng.set_mode(mode)
    eng.generate([[5, 6, 7, 8] * 4] * 4, SamplingParams(max_new_tokens=8, ignore_eos=True))
torch.cuda.synchronize()
torch.cuda.profiler.start()
for i, mode in enumerate(("sync", "async")):
    eng.set_mode(mode)
    torch.cuda.nvtx.range_push(f"batchscope recording {mode}")
    tel.start_recording(mode)
    handles, waves = submit_in_waves(eng, workload(args, i), 100)
    waves.join()
    for h in handles:
        h.result()
    tel.stop_recording()
    torch.cuda.nvtx.range_pop()
    own = json.loads(json.dumps(tel.timeline(mode)))
    write_gz(Path(out) / f"{mode}.timeline.json.gz", own)
    log(f"{mode}: {len(own.get('steps', []))} steps")
torch.cuda.synchronize()
torch.cuda.profiler.stop()
tel.close()
eng.close()
log("done")
