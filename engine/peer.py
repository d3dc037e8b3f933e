"""A tensor-parallel peer: the process of one rank 1..N-1 (`python -m batchscope.engine.peer`, started by
parallel.ranks.Peers). It builds its share of the model as rank 0 builds its own (build.py), then runs every step
rank 0 sends, in order, on its own streams, and reports the steps' GPU spans back once they are complete."""
from __future__ import annotations

import gc
import os
import pickle
import sys
import threading
import time
import traceback
from multiprocessing.connection import Client

import torch

from .batch import from_message
from .build import blocks_that_fit, load_rank, lower_priority, make_runner, rank_device, use_cpu_threads
from .config import EngineConfig
from .parallel import wire
from .parallel.ranks import FLUSH, STOP, init_group
from .trace import head_start_ms


def _watch_parent(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(1)                     # rank 0 is gone: never hold a GPU for nobody
        time.sleep(0.5)


def peer_main(address: str, rank: int, port: int, parent_pid: int) -> None:
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    key = bytes.fromhex(os.environ.pop("BATCHSCOPE_PEER_KEY"))
    ctrl = Client(address, family="AF_UNIX", authkey=key)
    ctrl.send((rank, "ctrl"))
    reports = Client(address, family="AF_UNIX", authkey=key)
    reports.send((rank, "reports"))
    config: EngineConfig = pickle.loads(ctrl.recv_bytes())
    try:
        device = rank_device(config, rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:   # the ranks share the CPU's cores
            use_cpu_threads(config)
            lower_priority(config)
        # said before the rendezvous: rank 0 enters it only once every rank got this far (a rank that fails
        # earlier, importing or picking its device, is reported instead of leaving rank 0 waiting there)
        reports.send(("joining", rank))
        init_group(rank, config.tensor_parallel_size, port, device)
        rm = load_rank(config, rank)
        reports.send(("blocks", blocks_that_fit(rm, config)))
        kind, num_blocks = ctrl.recv()
        _kv, runner = make_runner(rm, config, num_blocks)
        reports.send(("ready", {"rank": rank, "device": str(device), "cuda_graphs": runner.graphs.enabled}))
        gc.collect()
        gc.freeze()     # as in Engine: a full collection over start-up's objects would stall this rank's steps
    except BaseException:
        reports.send(("error", traceback.format_exc()))
        os._exit(1)
    try:
        with torch.inference_mode(), runner.stream_context():
            follow(runner, ctrl, reports, rank)
    except BaseException:
        try:
            reports.send(("error", traceback.format_exc()))
        except OSError:
            pass
        os._exit(1)
    os._exit(0)      # no destroy_process_group: with NCCL it can hang at exit (see parallel.ranks.Peers.close)


def follow(runner, ctrl, reports, rank: int) -> None:
    """Run every step rank 0 sends, in order, until it stops. A slot's previous step is timed (its events are
    complete, or waited for: a peer's host has nothing else to do) just before the slot is used again."""
    pending: dict[int, tuple] = {}          # slot -> (step, launched, host launch span)
    while True:
        try:
            data = ctrl.recv_bytes()
        except EOFError:
            return
        kind, body = data[:1], data[1:]
        if kind == STOP:
            return
        if kind == FLUSH:
            done = [pending.pop(s) for s in sorted(pending, key=lambda s: pending[s][0])]
            _report(reports, rank, runner, done)
            continue
        slot = runner.slots[wire.peek(body, "slot")]
        if slot.index in pending:
            _report(reports, rank, runner, [pending.pop(slot.index)])
        runner.wait_slot_free(slot)
        batch = from_message(body, slot)
        t0 = time.perf_counter_ns()
        launched = runner.launch(batch)
        pending[slot.index] = (wire.peek(body, "step"), launched, (t0, time.perf_counter_ns()))


def _report(reports, rank: int, runner, done: list) -> None:
    """Send finished steps' spans to rank 0 as (rank, step, anchor_ns, {phase: (start_ms, end_ms)}): the anchor's
    host time and each event's device time after it. Telemetry places them on the host clock (telemetry/clock.py)."""
    spans = []
    for step, launched, host in done:
        ev = launched.events
        if ev is None:              # CPU: the step ran inside launch; its host span is the compute
            spans.append((rank, step, host[0], {"compute": (0.0, (host[1] - host[0]) / 1e6)}))
            continue
        ev.d2h_end.synchronize()
        anchor, anchor_ns = launched.anchor
        phases = {phase: [anchor.elapsed_time(a), anchor.elapsed_time(b)] for phase, (a, b) in ev.spans().items()}
        head = ev.head()
        if head is not None:        # the compute span starts with its first kernel (runner.mark_start)
            phases["compute"][0] += head_start_ms(head[0].elapsed_time(head[1]), runner.start_kernel_ns / 1e6)
        spans.append((rank, step, anchor_ns, {phase: tuple(span) for phase, span in phases.items()}))
    if spans:
        reports.send(("spans", spans))


if __name__ == "__main__":
    peer_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
