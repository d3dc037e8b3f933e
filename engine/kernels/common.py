"""What batchscope's kernels share: where Triton runs (CUDA, or its CPU interpreter in the tests), which tensors a
kernel takes, the device a launch goes to, the SM count, and the check that a transformers function is, op for op,
the code a kernel replaces."""
from __future__ import annotations

import contextlib
import dis
import functools
import os

import torch

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DEFAULT_NUM_SMS = 132  # H200 / H100 SXM: the interpreter's stand-in


@functools.cache
def interpreted() -> bool:
    """Whether the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, the CPU tests), on CPU tensors.
    Read once, when the first kernel module asks: Triton decorates a kernel for the interpreter by the same
    variable at that module's import, and this module may be imported (for `same_code`) well before."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def usable(t: torch.Tensor) -> bool:
    """Whether a kernel can take `t`: on CUDA (or on the CPU under the interpreter), in a dtype the kernels cover."""
    return (t.is_cuda or (interpreted() and t.device.type == "cpu")) and t.dtype in DTYPES


def device_of(t: torch.Tensor):
    """Triton launches on the current CUDA device: make it the tensor's when they differ (a model on cuda:1)."""
    if t.is_cuda and t.device.index is not None and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


@functools.cache
def sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_NUM_SMS


def same_code(fn, reference) -> bool:
    """Same instructions on the same names and constants (docstrings aside): the same math. A kernel replaces a
    transformers function only where this holds against the code the kernel reproduces."""
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return False

    def ops(c):
        return [(i.opname, i.argval) for i in dis.get_instructions(c)], c.co_varnames
    return ops(code) == ops(reference.__code__)
