"""Checks before swapping faster code into a transformers model: only where the model's code is, op for op, the
code the replacement reproduces."""
from __future__ import annotations

import dis


def same_code(fn, reference) -> bool:
    """Same instructions on the same names and constants (docstrings aside): the same math."""
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return False

    def ops(c):
        return [(i.opname, i.argval) for i in dis.get_instructions(c)], c.co_varnames
    return ops(code) == ops(reference.__code__)
