"""The tensor-parallel scaling figure: decode step time and per-GPU busy % against the tensor-parallel size, sync
and async, from `batchscope bench` JSON files (one per size; `gpu_checks.sh tp-bench tp-scale4 tp-scale8` writes
them). Each point is a file's median; the per-GPU floor is drawn beside the step time, and busy % is the least
busy GPU of the run.

    python3 benchmarks/tp_scaling_figure.py results/bench_tp_llama3-70b_tp*.json --requests 32 \\
        --out docs/tp_scaling.png

Needs matplotlib (a plotting tool for this figure only, not a batchscope dependency).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def points(files: list[str], requests: int | None) -> dict:
    """{model: {tp: {"floor": ms, "sync": (ms, busy), "async": (ms, busy)}}} from the files given."""
    out: dict = {}
    for name in files:
        d = json.loads(Path(name).read_text())
        if requests is not None and d["workload"]["requests"] != requests:
            continue
        tp = d["engine_config"].get("tensor_parallel_size", 1)
        row = out.setdefault(d["engine_info"]["model"], {}).setdefault(tp, {"floor": d["floor"]["ms_per_step"]})
        for mode in ("sync", "async"):
            r = d["results"].get(mode)
            if r is None:
                continue
            # the least busy GPU of each run (its median over repeats); one-GPU runs have their own busy %
            least = [min(x["busy_pct"] for x in m["ranks"]) for m in d["runs"] if m["label"] == mode and m.get("ranks")]
            row[mode] = (r["decode_ms_per_step"], statistics.median(least) if least else r.get("gpu_busy_pct"))
    return out


def draw(data: dict, out: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"sync": "#e8590c", "async": "#1c7ed6"}
    styles = ["o-", "s:", "^-.", "D--"]                       # one per model
    every = sorted({t for rows in data.values() for t in rows})
    for (model, rows), style in zip(sorted(data.items()), styles):
        sizes = sorted(rows)
        for mode, color in colors.items():
            have = [t for t in sizes if mode in rows[t]]
            left.plot(have, [rows[t][mode][0] for t in have], style, color=color, label=f"{model} {mode}")
            right.plot(have, [rows[t][mode][1] for t in have], style, color=color, label=f"{model} {mode}")
        left.plot(sizes, [rows[t]["floor"] for t in sizes], style[0] + "--", color="0.3", fillstyle="none",
                  label=f"{model} per-GPU floor")
    for ax, label in ((left, "decode ms / step"), (right, "least busy GPU, % (CUDA events)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(every, [str(t) for t in every])
        ax.set_xlabel("tensor-parallel size (GPUs)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    right.set_ylim(top=100.5)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=130)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="batchscope bench JSON files, one per tensor-parallel size")
    ap.add_argument("--requests", type=int, default=None, help="only runs with this many requests")
    ap.add_argument("--title", default="Tensor-parallel scaling: step time and busy % per mode")
    ap.add_argument("--out", default="tp_scaling.png")
    args = ap.parse_args()
    data = points(args.files, args.requests)
    if not data:
        raise SystemExit("no bench JSON matched")
    draw(data, args.out, args.title)
    for model, rows in data.items():
        for tp in sorted(rows):
            print(model, f"TP={tp}", rows[tp])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
