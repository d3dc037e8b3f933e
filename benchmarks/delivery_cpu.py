"""Streamed delivery on a CPU server: what a client of /v1/completions sees between tokens, beside what the engine
made and when the server wrote each chunk (issue #41).

Serve first, then drive it from 1..P client processes (Poisson arrivals, streamed /v1/completions):

    .venv/bin/batchscope serve --model tiny-random --device cpu --no-ui --port 8765 &
    .venv/bin/python benchmarks/delivery_cpu.py --url http://127.0.0.1:8765 --rate 8 --requests 120 \
        --procs 2 --prompt-tokens 16,64 --new-tokens 32,96 --json out.json

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
import statistics
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
    out.put(asyncio.run(drive(args.url, args.model, args.rate / args.procs, args.requests // args.procs,
                              args.prompt, args.new, seed)))


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
            "host_off_cpu_ms_per_step": f(off), "idle_ms_by_cause": {k: round(v / 1e3, 1) for k, v in idle.items()},
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
    args = ap.parse_args()
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
