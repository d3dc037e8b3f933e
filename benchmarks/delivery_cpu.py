"""Streamed delivery on a CPU server: what a client of /v1/completions sees between tokens, beside what the engine
made and when the server wrote each chunk (issue #41).

Serve first, then drive it from 1..P client processes (Poisson arrivals, streamed /v1/completions):

    .venv/bin/batchscope serve --model tiny-random --device cpu --no-ui --port 8765 &
    .venv/bin/python benchmarks/delivery_cpu.py --url http://127.0.0.1:8765 --rate 8 --requests 120 \
        --procs 2 --prompt-tokens 16,64 --new-tokens 32,96 --json out.json

Or, with no server, the hand-off alone (engine thread -> event loop), per token vs per step:

    .venv/bin/python benchmarks/delivery_cpu.py --handoff 64 --rounds 5

Prints, in ms (p50 / p99 over every gap): the client's inter-chunk gaps (vLLM bench serve's ITL), the engine's
token gaps (requests[].token_us), the server's write gaps (requests[].sent_us), the engine's step period (between
consecutive steps' update ends) and step span, the delivery delay (sent_us - token_us) per token, and the
engine thread's time off its CPU in the schedule/fill/update phases (wall minus StepRecord.cpu_us).
The clients' clock is their own process's; only gaps are compared across processes, never stamps.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import random
import socket
import statistics
import threading
import time

import httpx


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


async def one(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], max_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    t0 = time.perf_counter()
    arrivals: list[float] = []
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                arrivals.append(time.perf_counter())
    return {"start": t0, "chunks": arrivals}


async def drive(url: str, model: str, rate: float, n: int, prompt_range, new_range, seed: int) -> list[dict]:
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        tasks, t = [], time.perf_counter()
        for _ in range(n):
            t += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, t - time.perf_counter()))
            prompt = [rng.randrange(5, 200) for _ in range(rng.randint(*prompt_range))]
            tasks.append(asyncio.create_task(one(client, url, model, prompt, rng.randint(*new_range))))
        return await asyncio.gather(*tasks)


def _proc(args, seed, out):
    w0, c0 = time.perf_counter(), time.process_time()
    results = asyncio.run(drive(args.url, args.model, args.rate / args.procs, args.requests // args.procs,
                                args.prompt, args.new, seed))
    # the client's own CPU share: near 100% would make it, not the server, the bottleneck
    results[0]["client_cpu_pct"] = 100 * (time.process_time() - c0) / max(1e-9, time.perf_counter() - w0)
    out.put(results)


def handoff(n_streams: int, steps: int, batched: bool, coalesce: bool, fill_us: int = 800,
            gpu_ms: float = 4.0) -> dict:
    """In-process, no model: an engine thread that holds the GIL for `fill_us` of Python a step, releases it for
    `gpu_ms` (the device's share), then hands a token to each of `n_streams` readers on an event loop thread,
    one call_soon_threadsafe a delta (`batched` False, as before issue #41's fix) or one a step (StepDeliveries);
    the readers json-encode each delta and write it to a socket. Reports the engine thread's CPU time a step in
    the hand-off (thread_time: robust to other work on the machine), its off-CPU time in the fill (GIL waits) and
    the delivery delay."""
    from batchscope.engine.request import RequestHandle, StepDeliveries, TokenDelta   # the clients stay light
    loop = asyncio.new_event_loop()
    a, b = socket.socketpair()
    a.setblocking(False)
    def drain():
        try:
            while b.recv(1 << 20):
                pass
        except OSError:
            return
    threading.Thread(target=drain, daemon=True).start()
    handles = [RequestHandle(f"r{i}", None, detokenize=lambda ids: "ab" * len(ids)) for i in range(n_streams)]
    delays, ready = [], threading.Event()
    async def reader(h):
        async for d in h.astream(coalesce=coalesce):
            now = time.perf_counter_ns()
            for made in d.logprobs or []:
                delays.append(now - made)
            payload = json.dumps({"id": "cmpl-x", "object": "text_completion",
                                  "choices": [{"index": 0, "text": d.text, "logprobs": None, "finish_reason": None}]},
                                 separators=(",", ":"))
            try:
                a.send(f"data: {payload}\n\n".encode())
            except BlockingIOError:
                pass
            await asyncio.sleep(0)
    async def main():
        tasks = [asyncio.ensure_future(reader(h)) for h in handles]
        await asyncio.sleep(0.01)
        ready.set()
        await asyncio.gather(*tasks)
    t = threading.Thread(target=lambda: loop.run_until_complete(main()))
    t.start()
    ready.wait()
    off, deliver_cpu = [], []
    for s in range(steps):
        # fill: fixed Python work holding the GIL; wall minus thread CPU is time spent waiting for it
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        end = c0 + fill_us * 1000
        while time.thread_time_ns() < end:
            pass
        off.append((time.perf_counter_ns() - w0) - (time.thread_time_ns() - c0))
        time.sleep(gpu_ms / 1000)                   # the device computes, the GIL is free
        c1 = time.thread_time_ns()
        batch = StepDeliveries() if batched else None
        last = s == steps - 1
        for i, h in enumerate(handles):
            # the delta's logprobs slot carries its making time, for the delay
            h.deliver(TokenDelta([s], "", last, "length" if last else None, logprobs=[time.perf_counter_ns()]),
                      batch=batch)
        if batch:
            batch.flush()
        deliver_cpu.append(time.thread_time_ns() - c1)
    t.join()
    a.close()
    b.close()
    return {"fill_off_cpu_us_p50": pct(off, 50) / 1e3, "fill_off_cpu_us_p99": pct(off, 99) / 1e3,
            "fill_off_cpu_us_mean": statistics.fmean(off) / 1e3, "deliver_cpu_us_p50": pct(deliver_cpu, 50) / 1e3,
            "delay_us_p50": pct(delays, 50) / 1e3, "delay_us_p99": pct(delays, 99) / 1e3}


def pair(s: str) -> tuple[int, int]:
    a, b = s.split(",")
    return int(a), int(b)


def summarise(results: list[dict], tl: dict, t_start_us: float) -> dict:
    client_gaps = [(b - a) * 1e3 for r in results for a, b in zip(r["chunks"], r["chunks"][1:])]
    reqs = [r for r in tl["requests"] if (r.get("arrival_us") or 0) >= t_start_us and r.get("sent_us")]
    made_gaps = [(b - a) / 1e3 for r in reqs for a, b in zip(r["token_us"], r["token_us"][1:])]
    sent_gaps = [(b - a) / 1e3 for r in reqs for a, b in zip(r["sent_us"], r["sent_us"][1:])]
    delay = [(s - t) / 1e3 for r in reqs for t, s in zip(r["token_us"], r["sent_us"])]
    steps = [s for s in tl["steps"] if s["cpu"]["schedule"][0] >= t_start_us]
    ends = sorted(s["cpu"]["update"][1] for s in steps)
    period = [(b - a) / 1e3 for a, b in zip(ends, ends[1:])]
    span = [(s["cpu"]["update"][1] - s["cpu"]["schedule"][0]) / 1e3 for s in steps]
    tokens = [s.get("tokens_out", 0) for s in steps]
    computed = sum(s["compute_us"][1] - s["compute_us"][0] for s in steps if s.get("compute_us"))
    idle_busy = sum(v for s in steps for c, v in (s.get("idle_by_cause_us") or {}).items() if c != "empty_queue")
    idle: dict[str, float] = {}
    for s in steps:
        for cause, v in (s.get("idle_by_cause_us") or {}).items():
            idle[cause] = idle.get(cause, 0.0) + v
    # host phases' wall time the engine thread spent off its CPU (waiting for the GIL or a core), per step
    off = [sum((s["cpu"][k][1] - s["cpu"][k][0]) - s["cpu_us"][k] for k in ("schedule", "fill", "update"))
           / 1e3 for s in steps if s.get("cpu_us")]
    f = lambda xs: {"p50": round(pct(xs, 50), 3), "p99": round(pct(xs, 99), 3), "n": len(xs)}  # noqa: E731
    return {"client_itl_ms": f(client_gaps), "engine_token_gap_ms": f(made_gaps), "server_write_gap_ms": f(sent_gaps),
            "step_period_ms": f(period), "step_span_ms": f(span), "delivery_delay_ms": f(delay),
            "tokens_per_step_mean": round(statistics.fmean(tokens), 2) if tokens else None,
            "host_off_cpu_ms_per_step": f(off),
            # the engine thread's own CPU time in its update phase (where it hands deltas over), per token made
            "update_cpu_us_per_token": round(sum(s["cpu_us"]["update"] for s in steps if s.get("cpu_us"))
                                             / max(1, sum(tokens)), 2), "idle_ms_by_cause": {k: round(v / 1e3, 1) for k, v in idle.items()},
            "busy_pct_excl_empty_queue": round(100 * computed / max(1.0, computed + idle_busy), 2),
            "client_cpu_pct": [round(r["client_cpu_pct"], 1) for r in results if "client_cpu_pct" in r],
            "client_chunks": sum(len(r["chunks"]) for r in results), "requests_joined": len(reqs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8765")
    ap.add_argument("--rate", type=float, default=8.0, help="requests/s over all client processes (Poisson)")
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--procs", type=int, default=2, help="client processes")
    ap.add_argument("--prompt", type=pair, default=(16, 64), metavar="MIN,MAX")
    ap.add_argument("--new", type=pair, default=(32, 96), metavar="MIN,MAX")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("--handoff", type=int, metavar="STREAMS",
                    help="no server: the in-process hand-off micro-benchmark with this many streams, per token vs "
                         "per step vs per step + coalescing, alternated --rounds times")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args()
    if args.handoff:
        kinds = {"per_token": (False, False), "per_step": (True, False), "per_step+coalesce": (True, True)}
        res: dict[str, list] = {k: [] for k in kinds}
        for _ in range(args.rounds):
            for k, (batched, coalesce) in kinds.items():
                res[k].append(handoff(args.handoff, args.steps, batched, coalesce))
        out = {k: {m: {"median": round(statistics.median(r[m] for r in rs), 1),
                       "min": round(min(r[m] for r in rs), 1), "max": round(max(r[m] for r in rs), 1)}
                   for m in rs[0]} for k, rs in res.items()}
        print(json.dumps(out))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(out, fh, indent=1)
        return
    args.model = httpx.get(args.url + "/v1/models", timeout=30).json()["data"][0]["id"]
    tl0 = httpx.get(args.url + "/api/timeline.json", timeout=60).json()
    t_start_us = max([s["cpu"]["update"][1] for s in tl0["steps"]] or [0.0])
    q: mp.Queue = mp.Queue()
    procs = [mp.Process(target=_proc, args=(args, args.seed + i, q)) for i in range(args.procs)]
    for p in procs:
        p.start()
    results = [r for _ in procs for r in q.get()]
    for p in procs:
        p.join()
    time.sleep(1.0)         # the recorder joins write times once it sees each request finish
    tl = httpx.get(args.url + "/api/timeline.json", timeout=60).json()
    out = summarise(results, tl, t_start_us)
    out["args"] = {k: v for k, v in vars(args).items() if k != "json"}
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
