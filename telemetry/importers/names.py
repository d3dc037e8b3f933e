"""What a name in a trace means: runtime calls that block the host, launch a graph or make a stream wait; copies by
direction; collective (NCCL/RCCL) kernels. CUDA and HIP spellings alike (ROCm traces put HIP calls in the same
categories), with the `_v7000`-style version suffixes Nsight adds stripped."""
from __future__ import annotations

import re

import numpy as np

# device op kinds (after classification)
KERNEL, COPY_H2D, COPY_D2H, COPY_OTHER, MEMSET, COLLECTIVE = range(6)
OP_KINDS = ("kernel", "copy_h2d", "copy_d2h", "copy", "memset", "collective")

# runtime call kinds
RT_OTHER, RT_BLOCKING, RT_GRAPH, RT_STREAM_WAIT, RT_MEMCPY_SYNC = range(5)

_VERSION = re.compile(r"_v\d+$")
_BLOCKING = {
    "cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaThreadSynchronize",
    "cuStreamSynchronize", "cuEventSynchronize", "cuCtxSynchronize",
    "hipStreamSynchronize", "hipEventSynchronize", "hipDeviceSynchronize",
}
_MEMCPY_SYNC = {   # copies the host waits for by their nature (cudaMemcpyAsync of pageable memory is found by timing)
    "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyFromSymbol", "cudaMemcpyToSymbol", "cudaMemcpyPeer",
    "cuMemcpyDtoH", "cuMemcpyHtoD", "cuMemcpy", "hipMemcpy", "hipMemcpyWithStream", "hipMemcpyDtoH",
    "hipMemcpy2D",
}
_GRAPH = {"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"}
_STREAM_WAIT = {"cudaStreamWaitEvent", "cuStreamWaitEvent", "hipStreamWaitEvent"}
_COLLECTIVE = re.compile(r"(^|[^a-z])(nccl|rccl)", re.IGNORECASE)
_H2D = re.compile(r"HtoD|Host ?-?> ?Device|HostToDevice", re.IGNORECASE)
_D2H = re.compile(r"DtoH|Device ?-?> ?(Host|Pinned|Pageable)|DeviceToHost", re.IGNORECASE)


def runtime_kind(name: str) -> int:
    base = _VERSION.sub("", name)
    if base in _BLOCKING:
        return RT_BLOCKING
    if base in _GRAPH:
        return RT_GRAPH
    if base in _STREAM_WAIT:
        return RT_STREAM_WAIT
    if base in _MEMCPY_SYNC:
        return RT_MEMCPY_SYNC
    return RT_OTHER


def op_kind(code: int, name: str) -> int:
    """A device op's kind from the collector's code (0 kernel, 1 copy, 2 memset) and its name."""
    if code == 1:
        if _D2H.search(name):
            return COPY_D2H
        if _H2D.search(name):
            return COPY_H2D
        return COPY_OTHER
    if code == 2:
        return MEMSET
    return COLLECTIVE if _COLLECTIVE.search(name) else KERNEL


def runtime_kinds(names: list[str], ids: np.ndarray) -> np.ndarray:
    table = np.full(len(names), RT_OTHER, dtype=np.int8)
    for nid in np.unique(ids):
        table[nid] = runtime_kind(names[nid])
    return table[ids] if len(ids) else np.zeros(0, dtype=np.int8)


def op_kinds(names: list[str], codes: np.ndarray, ids: np.ndarray) -> np.ndarray:
    out = np.zeros(len(ids), dtype=np.int8)
    if not len(ids):
        return out
    pairs, inverse = np.unique(np.stack([codes.astype(np.int64), ids.astype(np.int64)]), axis=1,
                               return_inverse=True)
    kinds = np.array([op_kind(int(c), names[int(n)]) for c, n in pairs.T], dtype=np.int8)
    return kinds[inverse.reshape(-1)]
