"""The page names and colours every idle cause an imported trace can carry, read from the JS files' text (no
browser): the words in assets/js/names.js, the colours in assets/js/plot.js, each far enough from every other to
tell apart on the Gantt's idle lane, and idle inside a step labelled as inside it."""
from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest

from batchscope.telemetry import IDLE_CAUSES
from batchscope.telemetry.importers import gaps, import_trace, kernel_spans, phases
from kineto_builder import KinetoTrace

JS = Path(__file__).resolve().parents[2] / "assets" / "js"
MIN_DELTA_E = 15.0          # CIE76 distance between any two causes' colours (the closest pair before imports: 19)


def js_object(text: str, name: str) -> dict:
    """`const NAME = { key: "value", ... };` as a dict (string values only, comments ignored)."""
    m = re.search(rf"const {name} = \{{(.*?)\n\}};", text, re.DOTALL)
    assert m, f"no object {name}"
    body = re.sub(r"//[^\n]*", "", m.group(1))
    return dict(re.findall(r"(\w+)\s*:\s*\"([^\"]*)\"", body))


def js_array(text: str, name: str) -> list:
    m = re.search(rf"const {name} = \[(.*?)\];", text, re.DOTALL)
    assert m, f"no array {name}"
    return re.findall(r"\"(\w+)\"", m.group(1))


def page_cause_colours() -> dict:
    """Each cause's colour as causeColor() picks it: a host phase's own colour, else CAUSE_COLOR's."""
    plot = (JS / "plot.js").read_text()
    colour, cause_colour, host = js_object(plot, "COLOR"), js_object(plot, "CAUSE_COLOR"), js_array(plot, "HOST")
    return {**cause_colour, **{k: colour[k] for k in host}}


def importer_causes() -> set:
    """The causes the importer's code can write: the device's busy kinds, the host's labels (a blocking call named
    `wait` or `host_sync`), and every cause gaps.py and kernel_spans.py name in place."""
    causes = {c for _, c in gaps._BUSY_CAUSE} | {label for label in phases.LABELS if label != "blocking"}
    for module in (gaps, kernel_spans):
        tree = ast.parse(Path(module.__file__).read_text())
        for node in ast.walk(tree):
            named = (isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("_stretch", "add")) or \
                isinstance(node, ast.IfExp) or isinstance(node, ast.BoolOp)
            if named:
                causes |= {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)
                           and isinstance(n.value, str) and re.fullmatch(r"[a-z_]+", n.value)}
    return causes


def test_the_importer_writes_only_causes_of_the_timeline_format():
    causes = importer_causes()
    # the ones only a trace tells apart, and the host's: the parse above found the importer's words
    assert {"host_sync", "wait", "stream_wait", "unattributed", "collective", "copy", "other_work", "host_op",
            "host_other", "telemetry", "launch"} <= causes, causes
    assert causes <= set(IDLE_CAUSES), causes - set(IDLE_CAUSES)


@pytest.mark.parametrize("cause", IDLE_CAUSES)
def test_every_cause_has_words_and_a_colour_of_its_own(cause):
    names = (JS / "names.js").read_text()
    label, hint = js_object(names, "CAUSE_LABEL"), js_object(names, "CAUSE_HINT")
    colours = page_cause_colours()
    assert label.get(cause), f"names.js CAUSE_LABEL has no words for {cause!r}"
    assert label[cause] != cause.replace("_", " ") and hint.get(cause), cause     # words, not the code
    assert re.fullmatch(r"#[0-9a-f]{6}", colours.get(cause, "")), f"plot.js has no colour for {cause!r}"


def test_the_causes_words_and_colours_are_all_different():
    names = (JS / "names.js").read_text()
    label = js_object(names, "CAUSE_LABEL")
    words = [label[c] for c in IDLE_CAUSES]
    assert len(set(words)) == len(words), words
    colours = page_cause_colours()
    close = [(round(delta_e(colours[a], colours[b]), 1), a, b) for a, b in itertools.combinations(IDLE_CAUSES, 2)
             if delta_e(colours[a], colours[b]) < MIN_DELTA_E]
    assert not close, f"colours too alike to tell apart: {close}"


def test_idle_inside_a_step_is_labelled_as_inside_it():
    hover = (JS / "gantt_hover.js").read_text()
    assert re.search(r"s\.gpu_idle_inside_us > 0\s*\? `<br>GPU idle inside the step: ", hover)
    assert "s.idle_inside_by_cause_us" in hover and "causeLabel(c)" in hover
    gantt = (JS / "gantt.js").read_text() + (JS / "gantt_inside.js").read_text()
    assert 'id="bs-legend-inside"' in gantt and "<b>GPU idle inside steps</b>" in gantt
    assert "s.idle_inside_by_cause_us" in gantt and "setInsideLegend(g.ink.inside)" in gantt
    assert "GPU idle before a step, by cause" in gantt      # the lane's own legend says which idle it draws


def test_an_imported_gpu_trace_uses_only_causes_the_page_names(tmp_path):
    """The step records the page reads (idle_cause, idle_by_cause_us, idle_inside_by_cause_us) of a trace with
    idle of many kinds: a blocking call inside a step, another stream's event, work launched before the window."""
    tr = KinetoTrace()
    tr.kernel("launched_before_the_window", 0, 10, corr=None)
    for k in range(3):
        t = 400 * k + 50
        tr.annotation(f"ProfilerStep#{k}", t, 300)
        tr.launch(t + 5, 5, kernel_at=t + 15, kernel_dur=40)
        tr.sync(t + 60, 30)                             # an .item() mid-step: the device idles on the host
        tr.cpu_op("aten::index", t + 95, 20)
        tr.launch(t + 120, 5, kernel_at=t + 130, kernel_dur=60)
    tl = import_trace(tr.write(tmp_path / "mixed.pt.trace.json.gz"))
    seen = set()
    for s in tl["steps"]:
        seen |= set(s["idle_by_cause_us"]) | set(s.get("idle_inside_by_cause_us", {})) | {s["idle_cause"] or "none"}
    assert "host_sync" in seen and "host_op" in seen, seen
    names = (JS / "names.js").read_text()
    assert seen <= set(js_object(names, "CAUSE_LABEL")) and seen - {"none"} <= set(page_cause_colours())


def delta_e(a: str, b: str) -> float:
    return sum((x - y) ** 2 for x, y in zip(_lab(a), _lab(b))) ** 0.5


def _lab(colour: str) -> tuple:
    """sRGB hex -> CIE L*a*b* (D65)."""
    def linear(c):
        return ((c + 0.055) / 1.055) ** 2.4 if c > 0.04045 else c / 12.92

    r, g, b = (linear(int(colour[i:i + 2], 16) / 255) for i in (1, 3, 5))
    xyz = ((0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b,
           (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883)
    f = [v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116 for v in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])
