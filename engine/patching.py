"""Checks before swapping faster code into a transformers model: only where the model's code is, op for op, the
code the replacement reproduces."""
from __future__ import annotations

import ast
import dis
import inspect
import textwrap

import torch


def same_code(fn, reference) -> bool:
    """Same instructions on the same names and constants (docstrings aside): the same math."""
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return False

    def ops(c):
        return [(i.opname, i.argval) for i in dis.get_instructions(c)], c.co_varnames
    return ops(code) == ops(reference.__code__)


def embeds_only(decoder) -> bool:
    """Whether `decoder.forward` uses `input_ids` for nothing but `inputs_embeds = self.embed_tokens(input_ids)`
    (and checks against None), so that passing embeddings the caller looked up with `decoder.embed_tokens`
    computes the same thing. Models that scale the lookup or derive more from the ids (per-layer inputs) do not."""
    if not isinstance(getattr(decoder, "embed_tokens", None), torch.nn.Module):
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(type(decoder).forward)))
    except (OSError, TypeError, SyntaxError):
        return False
    fn = tree.body[0]
    if not isinstance(fn, ast.FunctionDef):
        return False
    allowed: set[int] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Compare) and len(node.comparators) == 1 and \
                isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value is None:
            allowed.add(id(node.left))
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords and \
                ast.unparse(value.func) == "self.embed_tokens" and \
                [ast.unparse(t) for t in targets if t is not None] == ["inputs_embeds"]:
            allowed.add(id(value.args[0]))
    uses = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == "input_ids"]
    return bool(uses) and all(id(n) in allowed for n in uses)
