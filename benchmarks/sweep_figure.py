"""The Sweep tab's two charts for a saved sweep (batchscope.sweep/1, plain or .gz), as one HTML page and, with
--png, a screenshot of it: the same figures the page draws (app/ui/sweep_figures.py), so a sweep run on a GPU
box without a browser can be shown later.

    python benchmarks/sweep_figure.py benchmarks/results/2026-12-02-h200-sweep/sweep_rates.json.gz \
        --title "llama3-8b-random on an H200" --png assets/screenshot-sweep-h200.png

The PNG needs Chromium (/usr/bin/chromium) and Playwright's Python package, as the browser tests do.
"""
from __future__ import annotations

import argparse
import gzip
import html
import json
import sys
import tempfile
from pathlib import Path

import plotly.io as pio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchscope.app.ui.sweep_figures import curves_figure, engine_figure, series_of  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def read_sweep(path: Path) -> dict:
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    if doc.get("schema") != "batchscope.sweep/1":
        raise SystemExit(f"{path}: not a batchscope.sweep/1 file (schema {doc.get('schema')!r})")
    return doc


def _rate(p: dict) -> str:
    served = f"{p['requests_per_s']:.1f} req/s served"
    return f"{round(p['offered_rate'], 1):g} req/s offered ({served})" if p.get("offered_rate") else f"{p['kind']}, {served}"


def page(doc: dict, title: str, x_key: str) -> str:
    series = series_of(doc)
    slo = doc.get("slo") or {}
    curves, engine = curves_figure(series, slo, x_key), engine_figure(series, slo.get("target"), x_key)
    spec = doc.get("spec") or {}
    limits = ", ".join(f"{k.split('_')[0].upper()} {v:g} ms" for k, v in slo.items() if k.endswith("_ms") and v)
    lines = [f"<b>{html.escape(title)}</b>",
             f"prompts {spec.get('prompt_tokens')}, outputs {spec.get('max_new_tokens')} tokens, "
             f"{spec.get('arrival')} arrivals, " + (f"{spec['duration_s']:g} s" if spec.get("duration_s") else
                                                   f"{spec.get('requests')} requests") + " a point; "
             f"SLOs {limits}, target {slo.get('target', 0):.0%} attainment"]
    for mode, curve in doc["modes"].items():
        s = curve.get("summary") or {}
        ok, out = s.get("slo_max"), s.get("slo_exit")
        said = f"meets the SLOs up to {_rate(ok)}" if ok else "meets the SLOs at no point"
        if out:
            said += f", leaves them at {_rate(out)}"
        lines.append(f"{mode}: {said}")
    head = "<br>".join(lines)
    plots = [pio.to_html(f, include_plotlyjs=i == 0, full_html=False, config={"displayModeBar": False})
             for i, f in enumerate((curves, engine))]
    return ("<!doctype html><meta charset=utf-8><body style='margin:12px;font:13px Inter,system-ui,sans-serif'>"
            f"<div style='margin-bottom:6px'>{head}</div>"
            "<div style='display:grid;grid-template-columns:3fr 2fr;gap:12px;align-items:start'>"
            f"<div>{plots[0]}</div><div>{plots[1]}</div></div></body>")


def screenshot(html_path: Path, png: Path, width: int, height: int) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        tab = browser.new_page(viewport={"width": width, "height": height})
        tab.goto(html_path.as_uri())
        tab.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 2")
        tab.screenshot(path=str(png), full_page=True)
        browser.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", type=Path)
    p.add_argument("--title", default="batchscope sweep")
    p.add_argument("--x", choices=("requests_per_s", "output_tokens_per_s"), default="requests_per_s")
    p.add_argument("--html", type=Path, default=None, help="where to write the page (default: a temporary file)")
    p.add_argument("--png", type=Path, default=None)
    p.add_argument("--size", default="1600x860", help="the screenshot's viewport, WIDTHxHEIGHT")
    a = p.parse_args(argv)
    text = page(read_sweep(a.sweep), a.title, a.x)
    out = a.html or Path(tempfile.mkdtemp()) / "sweep.html"
    out.write_text(text)
    print(f"wrote {out}")
    if a.png:
        w, h = (int(v) for v in a.size.split("x"))
        screenshot(out.resolve(), a.png, w, h)
        print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
