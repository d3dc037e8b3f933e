"""Programmatic dependent launch: each of batchscope's kernels may start while the kernel before it on the stream
is still finishing.

A decode step is a chain of about 350 short kernels. Launched the ordinary way, each waits for the one before it
to drain completely; then its programs are placed on the SMs, set up, and only then issue their first loads: about
a microsecond of idle HBM at every boundary, and more for a GEMM whose first weight tiles must arrive before its
pipeline runs. With the launch attribute (Hopper and later), the next kernel's programs are placed as soon as every
program of the current one has started (`gdc_launch_dependents`), and they wait on the device (`gdc_wait`) for
the current kernel's completion and memory before touching anything it may write.

The rule every kernel here keeps: `enter(PDL)` comes before its first memory access. (Reading weights before it
would be safe, as no kernel writes them; an L2 prefetch of a GEMM's first weight tiles there measured no faster.)
Waiting on the kernel before also covers every kernel before that one: that kernel itself finished only after its
own wait. Kernels launched without the attribute (cuBLAS, torch's own) are ordered as always.
Captured into a CUDA graph the launches become programmatic edges, so the graphs keep the overlap.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .common import interpreted


@triton.jit
def enter(PDL: tl.constexpr):
    """Wait for the kernel before (its completion and its writes), then let the kernel after be placed."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


def supported(device: torch.device) -> bool:
    """The griddepcontrol instructions and the launch attribute exist from compute capability 9.0 (Hopper);
    `BATCHSCOPE_DEPENDENT_LAUNCH=0` turns them off (to measure what they bring)."""
    if interpreted() or device.type != "cuda" or torch.version.hip is not None:
        return False
    if os.environ.get("BATCHSCOPE_DEPENDENT_LAUNCH", "1") == "0":
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) >= 9


_CAPABILITY: dict[int, int] = {}


def _capability(index: int) -> int:
    if index not in _CAPABILITY:
        _CAPABILITY[index] = torch.cuda.get_device_capability(index)[0]
    return _CAPABILITY[index]


def launch_options(device: torch.device) -> dict:
    """Keyword arguments for a kernel launch: the kernel's PDL constexpr, and Triton's launch attribute with it."""
    return {"PDL": True, "launch_pdl": True} if supported(device) else {"PDL": False}
