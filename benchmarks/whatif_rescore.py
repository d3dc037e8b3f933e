"""Score today's model against runs already made: each `--verify` JSON holds the settings and the measured
figures of a real run of the recording's load; predict those settings again, score the new prediction against the
same measurement (the scoring --verify uses) and print its errors beside the ones the JSON was written with.

    python benchmarks/whatif_rescore.py RECORDING VERIFY.json... [--json FILE]
"""
from __future__ import annotations

import json
import sys

from batchscope.telemetry.whatif import open_recording, parse, predict
from batchscope.telemetry.whatif.measure import score

FIGURES = (("output_tokens_per_s", None), ("ttft_ms", "p50"), ("ttft_ms", "p99"), ("itl_ms", "p50"),
           ("itl_ms", "p99"), ("tpot_ms", "p50"), ("e2e_ms", "p50"), ("e2e_ms", "p99"))


def pick(errors: dict, key: str, q: str | None) -> float | None:
    v = errors.get(key)
    return v if q is None else (v or {}).get(q)


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
            if not entry.get("measured"):
                continue
            rescored = score(now["modes"][mode], entry["measured"])
            row = {f"{k}{'_' + q if q else ''}": {"then": pick(entry["error_pct"], k, q),
                                                  "now": pick(rescored["error_pct"], k, q)} for k, q in FIGURES}
            out["settings"][" ".join(pairs)] = row
            print(f"{' '.join(pairs):<24} " + "  ".join(f"{name} {v['then']:+.1f}->{v['now']:+.1f}"
                                                          for name, v in row.items() if v["now"] is not None))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
