"""The private names batchscope reads from torch, transformers, kernels and Gradio (engine/compat.py) are all there
on the installed versions; where one is gone, its fallback is taken and said. A new release that drops one fails
here, by name, instead of silently somewhere else."""
from __future__ import annotations

import ast
import pathlib

import pytest

from batchscope.engine import compat

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("entry", compat.PRIVATE_NAMES, ids=lambda e: e.name.split(" ")[0])
def test_private_name_is_present_on_the_installed_versions(entry):
    pytest.importorskip(entry.package, reason=f"{entry.package} is not installed here")
    assert entry.probe(), (f"{entry.name} ({entry.package}) is gone from the installed version: batchscope "
                           f"{entry.if_missing}. Check {entry.used_in} and update engine/compat.py.")


def test_every_entry_says_where_and_what_happens_without_it():
    for entry in compat.PRIVATE_NAMES:
        assert entry.used_in and entry.checked and entry.if_missing and entry.package
        for path in entry.used_in.split(" (")[0].split(", "):
            assert (ROOT / path).is_file(), path


def test_a_missing_name_is_reported_not_raised():
    def broken():
        raise AttributeError("gone")
    entries = (compat.PrivateName("x._y", "x", "engine/compat.py", "never", "nothing", lambda: False),
               compat.PrivateName("x._z", "x", "engine/compat.py", "never", "nothing", broken),
               compat.PrivateName("x._w", "x", "engine/compat.py", "never", "nothing", lambda: True))
    assert [e.name for e in compat.missing(entries)] == ["x._y", "x._z"]


def _private_attributes(path: pathlib.Path) -> set[str]:
    """`torch._x`-style reads, private names imported from torch or transformers, and getattr/hasattr with a
    private name (of anything: our own objects' private names are read through `self`, not getattr)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = ast.unparse(node.value)
            if base.split(".")[0] in ("torch", "transformers", "gr", "gradio", "kernels", "moe"):
                found.add(node.attr)
        if (isinstance(node, ast.Call) and ast.unparse(node.func) in ("getattr", "hasattr") and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant) and str(node.args[1].value).startswith("_")
                and not str(node.args[1].value).startswith("__")):
            found.add(node.args[1].value)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("torch", "transformers"):
            found.update(a.name for a in node.names if a.name.startswith("_"))
    return found


def test_the_list_names_every_private_torch_or_transformers_name_the_code_reads():
    listed = " ".join(e.name for e in compat.PRIVATE_NAMES)
    for folder in ("engine", "telemetry", "app"):
        for path in (ROOT / folder).rglob("*.py"):
            for name in _private_attributes(path):
                assert name in listed, f"{path.relative_to(ROOT)} reads {name}: list it in engine/compat.py"
