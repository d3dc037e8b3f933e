"""`batchscope sweep`: run a sweep on a running batchscope server through its routes (POST /api/sweep, then
GET /api/sweep/{id} until it ends, then GET /api/sweep/{id}.json) and write the batchscope.sweep/1 file, with
other tools' reports (`--compare`) carried beside it to overlay.

Exit status: 0 when the sweep completed, 1 when it failed or was stopped (the file is written with what it has),
2 for bad input, a report that is not what it claims, or a server that cannot be reached or refuses the sweep.
The standard library only, and nothing heavy: `batchscope sweep` never loads torch.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from .spec import DEFAULT_RATE_POINTS, DEFAULT_TARGET, SLO_ITL_FACTOR, SLO_TTFT_FACTOR

POLL_S = 0.5


class ClientError(Exception):
    """Anything that ends the command with status 2, with the reason to print."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True,
                   help="a running `batchscope serve`, e.g. http://127.0.0.1:7860: the sweep runs inside it "
                        "(POST /api/sweep), so a vLLM or SGLang URL is not one; sweep those with GuideLLM or "
                        "`vllm bench serve` and bring the report in with --compare")
    p.add_argument("--out", required=True, help="where to write the batchscope.sweep/1 JSON")
    p.add_argument("--modes", default="sync,async", help="the engine modes to sweep, in this order")
    p.add_argument("--points", type=int, default=None,
                   help=f"rates between the synchronous and the throughput run, in each mode "
                        f"(default: {DEFAULT_RATE_POINTS})")
    p.add_argument("--rates", default=None, help="or these offered rates (req/s, comma-separated), in every mode")
    p.add_argument("--duration", type=float, default=None, help="seconds per point (default: 10, unless --requests)")
    p.add_argument("--requests", type=int, default=None, help="requests per point")
    p.add_argument("--slo-ttft-ms", type=float, default=None,
                   help=f"held against each request's TTFT (default: {SLO_TTFT_FACTOR:g}x the synchronous run's p99)")
    p.add_argument("--slo-itl-ms", type=float, default=None,
                   help=f"held against each request's mean gap between tokens (its TPOT) (default: "
                        f"{SLO_ITL_FACTOR:g}x the synchronous run's p99)")
    p.add_argument("--slo-e2e-ms", type=float, default=None,
                   help="held against each request's end-to-end latency (default: none)")
    p.add_argument("--target", type=float, default=DEFAULT_TARGET, help="SLO attainment a rate must reach (0-1)")
    p.add_argument("--prompt-tokens", default=None, help="N or MIN,MAX (default: the server's)")
    p.add_argument("--output-tokens", default=None, help="N or MIN,MAX (default: the server's)")
    p.add_argument("--max-concurrency", type=int, default=None, help="the throughput run's requests in flight")
    p.add_argument("--arrival", choices=["constant", "poisson"], default="constant",
                   help="how requests arrive at a point's rate")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the prompts (each mode gets the same) and the poisson arrivals")
    p.add_argument("--no-warm-up", action="store_true", help="skip the few requests sent in each mode first")
    p.add_argument("--compare", action="append", default=[], metavar="REPORT",
                   help="a GuideLLM, vllm bench serve or batchscope.sweep/1 JSON report to carry in the file "
                        "(repeatable)")
    p.add_argument("--csv", default=None, help="also write one CSV row per point here")
    p.add_argument("--token", default=None, help="the server's token (default: $BATCHSCOPE_TOKEN)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def _lengths(text: str | None, name: str):
    if text is None:
        return None
    try:
        parts = [int(x) for x in text.split(",")]
    except ValueError:
        raise ClientError(f"--{name} takes N or MIN,MAX, got {text!r}") from None
    if len(parts) not in (1, 2):
        raise ClientError(f"--{name} takes N or MIN,MAX, got {text!r}")
    return parts[0] if len(parts) == 1 else parts


def sweep_body(args) -> dict:
    """The POST /api/sweep body the options ask for; the server checks it (a 400 names the field)."""
    # a TTFT or ITL SLO left out is the model's own, from the sweep's synchronous run
    slo = {"e2e_ms": args.slo_e2e_ms, "target": args.target}
    slo.update({k: v for k, v in (("ttft_ms", args.slo_ttft_ms), ("itl_ms", args.slo_itl_ms)) if v is not None})
    body = {"modes": [m.strip() for m in args.modes.split(",") if m.strip()], "seed": args.seed,
            "arrival": args.arrival, "slo": slo, "warm_up": not args.no_warm_up}
    if args.rates:
        try:
            body["rates"] = [float(r) for r in args.rates.split(",")]
        except ValueError:
            raise ClientError(f"--rates takes numbers separated by commas, got {args.rates!r}") from None
    for key, value in (("points", args.points), ("duration_s", args.duration), ("requests", args.requests),
                       ("max_concurrency", args.max_concurrency),
                       ("prompt_tokens", _lengths(args.prompt_tokens, "prompt-tokens")),
                       ("max_new_tokens", _lengths(args.output_tokens, "output-tokens"))):
        if value is not None:
            body[key] = value
    return body


class Server:
    def __init__(self, url: str, token: str | None):
        self.url, self.token = url.rstrip("/"), token

    def call(self, method: str, path: str, body: dict | None = None, timeout: float = 30.0):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            try:
                reason = json.load(e).get("error")
            except Exception:
                reason = e.reason
            raise ClientError(f"{method} {path}: {e.code} {reason}") from None
        except (urllib.error.URLError, OSError) as e:
            raise ClientError(f"cannot reach {self.url}: {getattr(e, 'reason', e)}") from None


def read_compared(paths: list[str], body: dict) -> list[dict]:
    """Each --compare report read now, before the sweep starts: a bad one fails fast."""
    from ..foreign.reports import ReportError, read_report
    from .spec import SLO

    reports = []
    for path in paths:
        try:
            raw = Path(path).read_bytes()
            slo = SLO(**body["slo"])
            reports.append({**read_report(raw, slo), "source": Path(path).name})
        except OSError as e:
            raise ClientError(f"--compare {path}: cannot read: {e}") from None
        except (ReportError, ValueError) as e:
            raise ClientError(f"--compare {path}: {e}") from None
    return reports


def _progress_line(st: dict) -> str:
    cur = st.get("current")
    head = f"{st['points_done']}/{st['points_total']} points"
    if st["state"] != "running":
        return f"{head}, {st.get('stop_reason') or st['state']}"
    if not cur:
        return f"{head}, {st.get('mode') or 'warming up'}"
    rate = f" @ {cur['offered_rate']:.2f} req/s" if cur.get("offered_rate") else ""
    tail = "draining" if cur["draining"] else f"{cur['elapsed_s']:.0f} s"
    return (f"{head}: {cur['mode']} {cur['kind']}{rate}, {cur['sent']} sent, {cur['finished']} finished, "
            f"{cur['in_flight']} in flight ({tail})")


def follow(server: Server, sweep_id: str, quiet: bool) -> dict:
    last = None
    while True:
        st = server.call("GET", f"/api/sweep/{sweep_id}")
        line = _progress_line(st)
        if not quiet and line != last:
            print(f"batchscope sweep: {line}", file=sys.stderr, flush=True)
            last = line
        if st["state"] != "running":
            return st
        time.sleep(POLL_S)


def summary_lines(doc: dict) -> list[str]:
    lines = []
    for mode, curve in doc["modes"].items():
        s = curve.get("summary") or {}
        best, leaves = s.get("slo_max"), s.get("slo_exit")
        meets = f"up to {best['requests_per_s']:.2f} req/s ({best['kind']})" if best else (
            f"at no point: {s['slo_none_why']}" if s.get("slo_none_why") else "at no point")
        exits = f"{leaves['requests_per_s']:.2f} req/s" if leaves else "not within the sweep"
        knee = ((s.get("knees") or {}).get("ttft_ms") or {}).get("p99")
        bend = f"TTFT p99 knee at {knee['requests_per_s']:.2f} req/s" if knee else "no TTFT p99 knee"
        lines.append(f"{mode}: meets the SLOs {meets}; leaves them at {exits}; {bend}")
    return lines


def main(args) -> int:
    import os

    server = Server(args.url, args.token or os.environ.get("BATCHSCOPE_TOKEN"))
    try:
        body = sweep_body(args)
        compared = read_compared(args.compare, body)
        health = server.call("GET", "/api/health")
        if health.get("replay_only"):
            raise ClientError(f"{args.url} is replaying a recording: no engine to sweep")
        started = server.call("POST", "/api/sweep", body)
    except ClientError as e:
        print(f"batchscope sweep: {e}", file=sys.stderr)
        return 2
    sweep_id = started["sweep_id"]
    try:
        st = follow(server, sweep_id, args.quiet)
    except KeyboardInterrupt:
        print("batchscope sweep: stopping", file=sys.stderr)
        st = server.call("POST", f"/api/sweep/{sweep_id}/stop")
    except ClientError as e:
        print(f"batchscope sweep: {e}", file=sys.stderr)
        return 2
    doc = server.call("GET", f"/api/sweep/{sweep_id}.json")
    if compared:
        doc["foreign"] = compared
    write(doc, args)
    if not args.quiet:
        for line in summary_lines(doc):
            print(f"batchscope sweep: {line}", file=sys.stderr)
    if st["state"] != "done" or st.get("stop_reason"):
        why = st.get("error") or st.get("stop_reason") or st["state"]
        print(f"batchscope sweep: the sweep did not complete: {why}", file=sys.stderr)
        return 1
    return 0


def write(doc: dict, args) -> None:
    from .files import to_csv

    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if args.csv:
        Path(args.csv).write_text(to_csv(doc), encoding="utf-8")
    print(f"batchscope sweep: wrote {args.out}" + (f" and {args.csv}" if args.csv else ""), file=sys.stderr)
