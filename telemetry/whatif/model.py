"""The step-time model of one recording: what a step of a given shape costs the device and each host phase, in
each loop, fitted from the recording's own steps (docs/whatif.md).

  device compute   C = c0 + c_prefill x prefill tokens + c_admit x requests starting (their first chunk)
                       + c_decode x decode rows + c_kv x KV tokens
                       + c_mixed + c_mixed_row x decode rows, in a step that carries prompt tokens
                       + c_ctx x prompt chunks' attention (each chunk x its context, in thousands)
                       (+ c_eager on a GPU: a step that replays no CUDA graph)
  schedule         c0 + c x requests in the step          fill     c0 + c x requests + c x tokens
  update           c0 + c x sampled rows                  launch   c0 (+ c_eager on a GPU); on a CPU the step
                                                                   computes inside its launch: launch = C
  the loop's own time between phases, drawn from the recording: launch end -> wait start (sync: the traces'
  delivery), update end -> next schedule start (async: the traces' delivery).
On a GPU the device starts `lead` after the launch starts, and a blocked wait ends `tail` after the device.
KV tokens are the step's allocated KV blocks times the block size (what every step record carries).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from batchscope.engine.budget import step_token_limits
from batchscope.engine.config import MODES, EngineConfig
from batchscope.engine.graphs import graph_buckets, mixed_buckets

from .fit import Fit, fit
from .recording import Recording, WhatIfError

# prefill_ctx: a prompt chunk attends to every token before it, so its cost grows with its context as well as its
# length; without it a 2048-token chunk deep in an 8K prompt came out at half its H200 time (docs/whatif.md)
DEVICE_FEATURES = ("one", "prefill_tokens", "admitted", "decode_rows", "kv_tokens", "prefill_ctx")
# a mixed step (prompt tokens beside decode rows) runs the prefill kernels over its decode rows too: its own fixed
# cost and per-row price, without which decode rows beyond the recorded ones are under-priced in mixed steps.
# Fitted only where both kinds of step ran often enough to tell the two prices apart.
MIXED_FEATURES = ("mixed", "mixed_rows")
MIN_STEPS_OF_EACH_KIND = 30
HOST_FEATURES = {"schedule": ("one", "requests"), "fill": ("one", "requests", "tokens"),
                 "update": ("one", "sampled"), "launch": ("one", "eager")}
GAPS = ("launch_wait", "update_schedule")


def _dur(span) -> float | None:
    return span[1] - span[0] if span and span[0] is not None and span[1] is not None else None


@dataclass(frozen=True)
class Graphs:
    """Which steps replay a CUDA graph, and the shape they are padded to (graphs.py's choice): decode steps to a
    batch-size bucket, steps with prefill to a token bucket up to the largest mixed-step graph; the rest run
    eagerly. A graph computes its whole bucket, so the device's time follows the padded shape."""
    decode: tuple[int, ...] = ()
    mixed: tuple[int, ...] = ()

    @classmethod
    def of(cls, config: EngineConfig, enabled: bool, mixed: list[int] | None = None) -> Graphs:
        if not enabled:
            return cls()
        largest, graphed = step_token_limits(config, "cuda")
        if mixed is None:
            mixed = mixed_buckets(graphed) if config.mixed_graphs else []
        # as StepGraphs captures them: a decode step carries at most the step's token budget of rows
        return cls(tuple(graph_buckets(min(config.max_running, largest))), tuple(sorted(mixed)))

    def pad(self, prefill: int, rows: int) -> tuple[bool, int, int]:
        """(eager, prefill tokens, decode rows) as the device computes them."""
        if not self.decode:
            return True, prefill, rows
        if prefill == 0:
            return False, 0, next((b for b in self.decode if b >= rows), rows)
        bucket = next((t for t in self.mixed if t >= prefill + rows), None)
        return (True, prefill, rows) if bucket is None else (False, bucket - rows, rows)


@dataclass
class StepModel:
    basis: str                                  # "gpu": device events; "host": the step computed on the CPU
    device: Fit
    host: dict[str, dict[str, Fit]]             # mode -> phase -> fit
    gaps: dict[str, dict[str, list[float]]]     # mode -> gap -> recorded µs
    host_from: dict[str, str]                   # mode -> the recorded mode its host figures come from
    lead_us: dict[bool, float] = field(default_factory=dict)    # eager? -> device start after launch start
    tail_us: float = 0.0                        # a blocked wait ends this long after the device's end
    wait_us: float = 0.0                        # a wait that finds the step done takes this long
    cuda_graphs: bool = False

    def as_dict(self) -> dict:
        return {"basis": self.basis, "device_compute": self.device.as_dict(),
                "host": {m: {p: f.as_dict() for p, f in phases.items()} for m, phases in self.host.items()},
                "host_from": dict(self.host_from),
                "loop_gaps_us": {m: {g: _median(v) for g, v in gaps.items()} for m, gaps in self.gaps.items()},
                "lead_us": {("eager" if k else "graphed"): round(v, 3) for k, v in self.lead_us.items()},
                "tail_us": round(self.tail_us, 3), "wait_us": round(self.wait_us, 3)}


def shape_row(graphs: Graphs, basis: str, prefill: int, decode: int, requests: int, sampled: int,
              admitted: int, kv_tokens: int, chunks: list[tuple[int, int]] = ()) -> dict:
    """A step's features: its shape as the device computes it (padded to its graph), and as the host handles it.
    `chunks`: its prompt chunks as (tokens before the chunk, chunk length)."""
    eager, padded_prefill, padded_rows = graphs.pad(prefill, decode)
    mixed = float(prefill > 0)
    return {"prefill_tokens": padded_prefill, "decode_rows": padded_rows, "tokens": prefill + decode,
            "mixed": mixed, "mixed_rows": mixed * padded_rows,
            "prefill_ctx": sum(n * (start + n / 2) for start, n in chunks) / 1000,
            "real_prefill_tokens": prefill, "real_decode_rows": decode,
            "requests": requests, "sampled": sampled, "admitted": admitted, "kv_tokens": kv_tokens,
            "eager": float(basis == "gpu" and eager)}


def step_rows(rec: Recording, steps: list[dict], graphs: Graphs, basis: str) -> list[dict]:
    """One row of shape and durations (µs) per timed step."""
    rows, seen, computed = [], set(), {}
    for s in steps:
        cpu = s.get("cpu") or {}
        requests = int(s.get("num_requests") or 0)
        row = shape_row(graphs, basis, int(s.get("prefill_tokens") or 0), int(s.get("decode_tokens") or 0),
                        requests, int(s.get("sampled", requests) or 0), _admitted(s, seen),
                        int(s.get("kv_blocks_used") or 0) * rec.block_size, _chunks(s, computed))
        row.update(step=s["step"], mode=s["mode"], compute=_dur(s["compute_us"]), compute_us=s["compute_us"])
        cpu_us = s.get("cpu_us") or {}
        for phase in ("schedule", "fill", "launch", "wait", "update"):
            row[phase] = _dur(cpu.get(phase))
            row[phase + "_span"] = cpu.get(phase)
            row[phase + "_cpu"] = cpu_us.get(phase)
        row["empty_queue"] = float((s.get("idle_by_cause_us") or {}).get("empty_queue", 0.0))
        rows.append(row)
    return rows


def _chunks(step: dict, computed: dict) -> list[tuple[int, int]]:
    """The step's prompt chunks as (tokens of its request computed before it, chunk length), from the requests'
    tokens so far (`computed`, kept across the steps: a chunk adds its length, a decode row one, a preemption
    starts the request over). Traces without `prefill_tokens_by_request` give none."""
    by_request = step.get("prefill_tokens_by_request") or {}
    chunks = [(computed.get(rid, 0), int(n)) for rid, n in by_request.items()]
    for rid in step.get("request_ids") or []:
        computed[rid] = computed.get(rid, 0) + int(by_request.get(rid, 1))
    for rid in step.get("preempted") or []:
        computed[rid] = 0
    return chunks


def _admitted(step: dict, seen: set) -> int:
    """Requests whose first step this is (a preempted one's return is not told apart: it is rare)."""
    ids = step.get("request_ids") or []
    new = sum(1 for i in ids if i not in seen)
    seen.update(ids)
    return new


def build(rec: Recording) -> StepModel:
    steps = [s for seg in rec.segments.values() for s in seg.steps]
    bases = {s.get("compute_basis") for s in steps}
    basis = "gpu" if bases & {"gpu", "gpu_wait"} else "host"
    cuda_graphs = bool(rec.info.get("cuda_graphs")) and basis == "gpu"
    rows = step_rows(rec, steps, Graphs.of(rec.config, cuda_graphs, rec.info.get("mixed_graph_tokens") or []),
                     basis)
    if len(rows) < 3:
        raise WhatIfError(f"{rec.name}: fewer than three timed steps while the load ran: no step time to fit")
    names = DEVICE_FEATURES + (("eager",) if basis == "gpu" else ())
    mixed = sum(1 for r in rows if r["mixed"])
    if min(mixed, len(rows) - mixed) >= MIN_STEPS_OF_EACH_KIND:
        names += MIXED_FEATURES
    device = fit(rows, names, "compute")
    host, gaps = {}, {}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        if len(mine) >= 3:
            host[mode] = _host_fits(mine, basis, "")
            gaps[mode] = _gaps(mine)
    if not host:
        raise WhatIfError(f"{rec.name}: no loop ran three timed steps: no host phases to fit")
    host_from = {m: m for m in host}
    for mode in MODES:
        if mode not in host:
            other = next(iter(host))
            mine = [r for r in rows if r["mode"] == other]
            # an async phase's wall time holds waits a sync loop never has (fill waits for its slot to come free,
            # any phase for the GIL while the device computes): sync gets the engine thread's CPU time in each
            # phase, where recorded (H200: fill 0.67 ms wall, 0.32 ms CPU; a sync run's fill idle: 0.30 ms a step)
            cpu = other == "async" and all(r["fill_cpu"] is not None for r in mine)
            host[mode], host_from[mode] = (_host_fits(mine, basis, "_cpu") if cpu else host[other]), other
            gaps[mode] = _moved_gaps(gaps[other], other)
    model = StepModel(basis, device, host, gaps, host_from, cuda_graphs=cuda_graphs)
    if basis == "gpu":
        _device_timing(model, rows)
    else:
        model.wait_us = _median([r["wait"] for r in rows if r["wait"] is not None]) or 0.0
    return model


def _host_fits(rows: list[dict], basis: str, suffix: str) -> dict[str, Fit]:
    """Each host phase's fit on its wall time (suffix "") or its CPU time ("_cpu"); on a CPU the launch is the
    step's compute, fitted as the device."""
    return {p: f for p, names in HOST_FEATURES.items()
            if (p != "launch" or basis == "gpu") and (f := fit(rows, names, p + suffix)) is not None}


def _gaps(rows: list[dict]) -> dict[str, list[float]]:
    """The loop's own time between phases, from the host spans in time order (gaps before an idle engine's next
    step are left out: those waited for a request, not for the loop)."""
    spans = sorted(((r[p + "_span"][0], r[p + "_span"][1], p, r) for r in rows for p in ("schedule", "launch",
                                                                                           "wait", "update")
                    if r.get(p + "_span")), key=lambda t: t[0])
    out: dict[str, list[float]] = {g: [] for g in GAPS}
    for (_s0, e0, p0, _r0), (s1, _e1, p1, r1) in zip(spans, spans[1:]):
        if p0 == "launch" and p1 == "wait":
            out["launch_wait"].append(max(0.0, s1 - e0))
        elif p0 == "update" and p1 == "schedule" and not r1["empty_queue"]:
            out["update_schedule"].append(max(0.0, s1 - e0))
    return {g: v or [0.0] for g, v in out.items()}


def _moved_gaps(gaps: dict[str, list[float]], recorded: str) -> dict[str, list[float]]:
    """The other loop's gaps: the traces' delivery moves from after the launch (sync) to after the update
    (async), the loop's bookkeeping stays after the update (docs/whatif.md)."""
    if recorded == "sync":
        both = [a + b for a, b in zip(gaps["launch_wait"], gaps["update_schedule"])] or [0.0]
        return {"launch_wait": [0.0], "update_schedule": both}
    return {"launch_wait": list(gaps["update_schedule"]), "update_schedule": list(gaps["launch_wait"])}


def _device_timing(model: StepModel, rows: list[dict]) -> None:
    # the lead is launch -> device start on a free device: a step launched while the one before still computed
    # waited in the queue (in async, nearly every step: 4 ms of an H200 decode step), which is not its lead
    free = [r for prev, r in zip([None] + rows, rows) if r.get("launch_span")
            and (prev is None or prev["compute_us"][1] <= r["launch_span"][0])]
    for eager in (False, True):
        leads = [r["compute_us"][0] - r["launch_span"][0] for r in free if bool(r["eager"]) == eager]
        if leads:
            model.lead_us[eager] = max(0.0, _median(leads))
    if model.lead_us:       # a loop that ran only graphed (or only eager) steps lends its lead to the other kind
        for eager in (False, True):
            if eager not in model.lead_us:
                model.lead_us[eager] = model.lead_us[not eager]
    else:
        model.lead_us = {False: 0.0, True: 0.0}
    blocked = [r["wait_span"][1] - r["compute_us"][1] for r in rows
               if r.get("wait_span") and r["wait_span"][0] < r["compute_us"][1] <= r["wait_span"][1]]
    free = [r["wait"] for r in rows if r.get("wait_span") and r["wait_span"][0] >= r["compute_us"][1]]
    model.tail_us = _median(blocked) or 0.0
    # a wait that found its step done: none recorded (every sync wait blocks) -> no longer than a blocked one's tail
    model.wait_us = _median(free) or model.tail_us


def _median(values) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 3) if vals else None
