"""Score today's model against runs already made: each `--verify` JSON holds the settings and the measured
figures of a real run of the recording's load; predict those settings again and print the errors beside the ones
the JSON was written with.

    python benchmarks/whatif_rescore.py RECORDING VERIFY.json... [--json FILE]
"""
from __future__ import annotations

import json
import sys

from batchscope.telemetry.whatif import open_recording, parse, predict

FIGURES = (("output_tokens_per_s", None), ("ttft_ms", "p50"), ("ttft_ms", "p99"), ("itl_ms", "p50"),
           ("itl_ms", "p99"), ("tpot_ms", "p50"), ("e2e_ms", "p50"), ("e2e_ms", "p99"))


def error(pred: dict, meas: dict, key: str, q: str | None) -> float | None:
    p, m = (pred.get(key), meas.get(key)) if q is None else ((pred.get(key) or {}).get(q), (meas.get(key) or {}).get(q))
    return None if p is None or not m else round(100 * (p / m - 1), 1)


def main(argv: list[str]) -> dict:
    json_out = None
    if "--json" in argv:
        i = argv.index("--json")
        json_out, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    recording, *verified = argv
    rec = open_recording(recording)
    out = {"recording": recording, "settings": {}}
    for path in verified:
        doc = json.load(open(path))
        pairs = [f"{k}={v}" for k, v in doc["settings"]["asked"].items()]
        now = predict(rec, parse(pairs), runs=1)
        for mode, entry in doc["modes"].items():
            meas = entry.get("measured")
            if not meas:
                continue
            pred = now["modes"][mode]["predicted"]
            row = {f"{k}{'_' + q if q else ''}": {"then": error(entry["predicted"], meas, k, q),
                                                  "now": error(pred, meas, k, q)} for k, q in FIGURES}
            out["settings"][" ".join(pairs)] = row
            print(f"{' '.join(pairs):<24} " + "  ".join(f"{name} {v['then']:+.1f}->{v['now']:+.1f}"
                                                          for name, v in row.items() if v["now"] is not None))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
