"""The wire format of a step sent to the other tensor-parallel ranks: a header of named int64 fields, then the used
part of the three packs (int64, int32, float32) of a filled IO slot, as raw bytes. A few KB a step."""
from __future__ import annotations

import numpy as np

HEADER = ("step", "slot", "T", "B", "S", "max_blocks", "n64", "n32", "nf", "graph_kind", "graph_tokens", "graph_rows",
          "any_random", "any_filter", "num_carried", "num_sampled", "max_query_len", "max_seq_len", "extras")


def encode(header: dict, p64: np.ndarray, p32: np.ndarray, pf: np.ndarray) -> bytes:
    head = np.array([int(header[k]) for k in HEADER], dtype=np.int64)
    return b"".join((head.tobytes(), p64.tobytes(), p32.tobytes(), pf.tobytes()))


def peek(data: bytes, field: str) -> int:
    """One header field, without decoding the packs (which slot a message is for, which step)."""
    i = HEADER.index(field)
    return int(np.frombuffer(data, dtype=np.int64, count=i + 1)[i])


def decode(data: bytes) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """(header, int64 pack, int32 pack, float32 pack), the packs as views of `data`."""
    header = dict(zip(HEADER, np.frombuffer(data, dtype=np.int64, count=len(HEADER)).tolist()))
    at = len(HEADER) * 8
    n64, n32, nf = header["n64"], header["n32"], header["nf"]
    p64 = np.frombuffer(data, dtype=np.int64, count=n64, offset=at)
    at += n64 * 8
    p32 = np.frombuffer(data, dtype=np.int32, count=n32, offset=at)
    at += n32 * 4
    pf = np.frombuffer(data, dtype=np.float32, count=nf, offset=at)
    return header, p64, p32, pf
