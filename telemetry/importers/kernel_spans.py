"""The optional kernel-level part of an imported timeline (`kernels=True`, the CLI's `--kernels`): every device op
and every named idle stretch of one device, compactly, for the Perfetto export to draw under the steps.

One entry per device: `{"rank", "device", "names": [...], "kinds": [...], "causes": [...],
"ops": [[start_us, end_us, stream, name, kind, step], ...], "idle": [[start_us, end_us, cause, step, inside], ...]}`
where name/kind/cause index their lists and step is -1 for work of no step.
"""
from __future__ import annotations

from . import names as N


def kernel_spans(fa, lane_index: int, shift: float, rank: int) -> dict:
    t, lane = fa.tables, fa.lanes[lane_index]
    rows = lane.busy.rows
    local: dict[int, int] = {}
    names: list[str] = []
    ops = []
    numbers = [p.number for p in fa.plans]
    owner = fa.owner
    for row in rows.tolist():
        nid = int(t.dev.name[row])
        if nid not in local:
            local[nid] = len(names)
            names.append(t.names[nid])
        k = int(owner[row]) if owner is not None else -1
        ops.append([round(float(t.dev.start[row]) + shift, 3), round(float(t.dev.end[row]) + shift, 3),
                    int(t.dev.stream[row]), local[nid], int(t.dev.kind[row]), numbers[k] if k >= 0 else -1])
    causes: list[str] = []
    idle = []
    for k, plan in enumerate(fa.plans):
        for gap in (lane.between[k], lane.inside[k]):
            if gap is None:
                continue
            for a, b, cause in gap.stretches:
                cause = cause or "host_other"
                if cause not in causes:
                    causes.append(cause)
                idle.append([round(a + shift, 3), round(b + shift, 3), causes.index(cause), plan.number,
                             int(gap.inside)])
    return {"rank": rank, "device": lane.device, "names": names, "kinds": list(N.OP_KINDS), "causes": causes,
            "ops": ops, "idle": idle}
