"""The house rules a contributor is held to (CONTRIBUTING.md), checked on the tree rather than remembered: imports
run app -> telemetry -> engine and never back, no two modules import each other, no module over 400 lines (kernels
500; the page's JS modules 400 too) or function over 80, no two modules of the package share a file name, and ruff
finds nothing."""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROOMS = {"app": "batchscope.app", "engine": "batchscope.engine", "telemetry": "batchscope.telemetry",
         "src/batchscope": "batchscope"}
ORDER = ["batchscope.engine", "batchscope.telemetry", "batchscope.app"]     # a room may import only those before it


def modules() -> dict[str, Path]:
    out = {}
    for folder, package in ROOMS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def imports(name: str, path: Path) -> set[str]:
    """Every batchscope module `name` imports, at its top or inside a function (a lazy import still ties rooms)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("batchscope")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("batchscope"):
                found.add(target)
                found |= {f"{target}.{a.name}" for a in node.names}   # `from pkg import module`
    return found


def room(name: str) -> int | None:
    return next((i for i, r in enumerate(ORDER) if name == r or name.startswith(r + ".")), None)


def test_imports_run_app_telemetry_engine_and_no_two_modules_import_each_other():
    mods = modules()
    edges = {name: {t for t in imports(name, path) if t in mods and t != name} for name, path in mods.items()}
    upward = [f"{a} -> {b}" for a, targets in edges.items() for b in targets
              if room(a) is not None and room(b) is not None and room(b) > room(a)]
    assert not upward, upward
    pairs = sorted({tuple(sorted((a, b))) for a, targets in edges.items() for b in targets
                    if a in edges.get(b, ()) and not (a.startswith(b + ".") or b.startswith(a + "."))})
    assert not pairs, pairs


def test_no_module_or_function_outgrows_the_house():
    long_modules, long_functions = [], []
    for name, path in modules().items():
        text = path.read_text()
        cap = 500 if ".kernels." in name else 400
        if len(text.splitlines()) > cap:
            long_modules.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines (cap {cap})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    for path in sorted((ROOT / "assets" / "js").glob("*.js")):      # the page's modules keep the same cap
        lines = len(path.read_text().splitlines())
        if lines > 400:
            long_modules.append(f"{path.relative_to(ROOT)}: {lines} lines (cap 400)")
    assert not long_modules and not long_functions, long_modules + long_functions


def test_the_pages_js_modules_import_no_circle():
    """An import circle among ES modules runs one of them before what it imports is defined: a chart module that
    must call the controls listens for an event instead (plot.js's VIEW_CHANGED)."""
    js = ROOT / "assets" / "js"
    graph = {p.name: set(re.findall(r'^import\s[^;]*?\sfrom\s+"\./([\w.]+)"', p.read_text(), re.M))
             for p in js.glob("*.js")}
    assert sum(map(len, graph.values())) > 40             # the pattern reads the imports

    def reach(start: str) -> set[str]:
        seen, todo = set(), list(graph.get(start, ()))
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(graph.get(name, ()))
        return seen
    circles = sorted(name for name in graph if name in reach(name))
    assert not circles, f"modules on an import circle: {circles}"


def test_no_two_modules_of_the_package_share_a_file_name():
    names = Counter(p.name for p in modules().values() if p.name not in ("__init__.py", "__main__.py"))
    assert not [n for n, k in names.items() if k > 1], [n for n, k in names.items() if k > 1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it is in the test extras: pip install -e '.[test]')")
    out = subprocess.run([ruff, "check", "--output-format", "concise", "."], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-1000:]
