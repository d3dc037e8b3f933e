"""The group of tensor-parallel ranks, as rank 0 (the engine's process) sees it: one interface, `RankGroup`, for
the runner and the engine, with `OneRank` (tensor parallel size 1: nothing to relay) and `Peers` (ranks 1..N-1 in
processes the engine starts itself, each running the steps rank 0 plans; their side is engine/peer.py).

Rank 0 (the engine's process) owns the scheduler, the server and telemetry. Ranks 1..N-1 hold their share of the
model on their own GPU and replay every step rank 0 launches: rank 0 sends each filled IO slot (batch.py's
step_message, a few KB) down a pipe just before launching it itself; a peer copies it into its own slot and
launches the same H2D / forward / sample / D2H on its own streams. The all-reduces inside the forward (NCCL on
CUDA, gloo on CPU: torch.distributed) are what keep the ranks in step; nothing else waits on another rank. Every
rank samples the same tokens from the same gathered logits, so carried inputs stay on each device.

A peer times its steps with its own CUDA events and an anchor on its own host clock (perf_counter is the one
monotonic clock of the machine), and sends the spans back on a second pipe once they are complete: no rank waits
for telemetry. Rank 0 asks for the last ones when it goes idle ("flush").

A peer exits when rank 0 closes its pipe or exits: a watchdog thread checks its parent every half second, so
killing rank 0 (even with SIGKILL, mid-collective) leaves no process holding a GPU. Peers are started as
`python -m batchscope.engine.peer` (not multiprocessing's spawn, which re-runs the user's main script) and
connect back over a private socket with a random key.

A peer's GPU spans travel as its anchor's host time and the offsets of its events from that anchor; telemetry maps
them to host time as it maps rank 0's own (telemetry/clock.py), so there is one clock mapping.
"""
from __future__ import annotations

import logging
import os
import pickle
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from datetime import timedelta
from multiprocessing.connection import Listener

import torch
import torch.distributed as dist

from ..config import ConfigError

log = logging.getLogger(__name__)

STEP, FLUSH, STOP = b"S", b"F", b"Q"
START_TIMEOUT_S = 1800          # loading a 70B share and the first NCCL start on a fresh machine take minutes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_group(rank: int, size: int, port: int, device: torch.device) -> None:
    if dist.is_initialized():
        raise ConfigError("this process already runs a tensor-parallel engine; one per process")
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=START_TIMEOUT_S), **kwargs)
    # The first collective sets the communicators up (and may synchronise): here, not in a graph capture.
    probe = torch.ones(1, device=device)
    dist.all_reduce(probe)
    if int(probe.item()) != size:
        raise RuntimeError(f"tensor-parallel start-up: all-reduce gave {probe.item()}, expected {size}")


def nvls_off_env() -> dict[str, str]:
    """NVLink multicast (NVLS) off in every process: it misbehaves on the shared multi-GPU machines."""
    return {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class RankGroup:
    """The ranks of an engine, as rank 0 calls on them. This base is the group of one (no tensor parallelism):
    nothing to relay or gather, every method a no-op; `Peers` is the group of several."""
    size = 1
    lost: str | None = None

    def join(self, device: torch.device) -> None:
        """Start-up: the process group (none here)."""

    def agree_blocks(self, num_blocks: int) -> int:
        """Start-up: the KV blocks every rank can hold."""
        return num_blocks

    def ready(self) -> list:
        """Start-up: the other ranks' descriptions, once their runners are built."""
        return []

    def serve(self) -> None:
        """Start-up is over."""

    def send_step(self, batch) -> None:
        """Serving: launch the same step on the other ranks (before rank 0 launches it)."""

    def went_idle(self) -> None:
        """Serving: rank 0 has no step to run; the others may report their last spans."""

    def take_spans(self) -> list:
        """Serving: the other ranks' GPU spans reported since the last call."""
        return []

    def close(self) -> None:
        pass


def start_ranks(config) -> RankGroup:
    """The RankGroup for an EngineConfig: ranks 1..N-1 start loading their shares now, while rank 0 loads its own."""
    return Peers(config) if config.tensor_parallel_size > 1 else RankGroup()


class Peers(RankGroup):
    """Rank 0's side: starts ranks 1..N-1, relays steps to them, gathers their GPU spans."""

    def __init__(self, config):
        for key, value in nvls_off_env().items():
            os.environ.setdefault(key, value)
        self.size = config.tensor_parallel_size
        self.port = _free_port()
        self._dir = tempfile.mkdtemp(prefix="batchscope-tp-")
        key = secrets.token_bytes(16)
        listener = Listener(os.path.join(self._dir, "sock"), family="AF_UNIX", authkey=key)
        env = {**os.environ, "BATCHSCOPE_PEER_KEY": key.hex()}
        self.procs = [subprocess.Popen([sys.executable, "-m", "batchscope.engine.peer", listener.address,
                                        str(rank), str(self.port), str(os.getpid())], env=env)
                      for rank in range(1, self.size)]
        self.ctrl, self.reports = [None] * (self.size - 1), [None] * (self.size - 1)
        try:
            for _ in range(2 * (self.size - 1)):     # each peer connects twice: steps in, reports out
                conn = _accept(listener, self.procs)
                rank, role = conn.recv()
                (self.ctrl if role == "ctrl" else self.reports)[rank - 1] = conn
            for conn in self.ctrl:
                conn.send_bytes(pickle.dumps(config))
        except BaseException:
            self._kill()
            raise
        finally:
            listener.close()
        self.spans: deque = deque()         # (rank, step, anchor_ns, {phase: (start, end) ms after it}) not yet taken
        self._pending_flush = False
        self.closed = False
        self.lost: str | None = None        # why a rank is gone while serving: no step can run without it

    # -- start-up (the engine thread is not running yet) --------------------------------------------------------
    def expect(self, kind: str) -> list:
        """One start-up message of `kind` from every peer; a peer that failed or died raises its reason."""
        out = []
        for rank, conn in enumerate(self.reports, start=1):
            deadline = time.monotonic() + START_TIMEOUT_S
            while not conn.poll(0.2):
                if self.procs[rank - 1].poll() is not None:
                    raise RuntimeError(f"tensor-parallel rank {rank} exited during start-up "
                                       f"(code {self.procs[rank - 1].returncode})")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"tensor-parallel rank {rank} did not start in {START_TIMEOUT_S} s")
            msg = conn.recv()
            if msg[0] == "error":
                raise _peer_error(rank, msg[1])
            if msg[0] != kind:
                raise RuntimeError(f"tensor-parallel rank {rank}: expected {kind!r}, got {msg[0]!r}")
            out.append(msg[1])
        return out

    def send(self, *msg) -> None:
        for conn in self.ctrl:
            conn.send(msg)

    def join(self, device: torch.device) -> None:
        self.expect("joining")
        init_group(0, self.size, self.port, device)

    def agree_blocks(self, num_blocks: int) -> int:
        """One block table for all ranks: the smallest cache that fits all."""
        num_blocks = min([num_blocks, *self.expect("blocks")])
        self.send("blocks", num_blocks)
        return num_blocks

    def ready(self) -> list:
        return self.expect("ready")

    def serve(self) -> None:
        """Start-up done: collect span reports in the background from now on."""
        for rank, conn in enumerate(self.reports, start=1):
            threading.Thread(target=self._collect, args=(rank, conn), name=f"batchscope-rank{rank}-spans",
                             daemon=True).start()

    def _collect(self, rank: int, conn) -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                if not self.closed:
                    code = self.procs[rank - 1].poll()
                    self.lost = self.lost or f"tensor-parallel rank {rank} exited (code {code})"
                    log.error("%s; the engine cannot run steps any more", self.lost)
                return
            if msg[0] == "spans":
                self.spans.extend(msg[1])
            elif msg[0] == "error":
                last = msg[1].strip().splitlines()[-1] if msg[1].strip() else "?"
                self.lost = self.lost or f"tensor-parallel rank {rank} failed ({last})"
                log.error("tensor-parallel rank %d failed:\n%s", rank, msg[1])

    # -- serving (engine thread) --------------------------------------------------------------------------------
    def send_step(self, batch) -> None:
        """Relay a step to every other rank; raises (the step fails, nothing is launched) once a rank is gone,
        rather than launch collectives nobody will meet."""
        if self.lost:
            raise RuntimeError(f"{self.lost}: restart the engine")
        data = STEP + batch.to_message()
        try:
            for conn in self.ctrl:
                conn.send_bytes(data)
        except OSError as exc:
            self.lost = self.lost or f"a tensor-parallel rank stopped taking steps ({exc})"
            raise RuntimeError(f"{self.lost}: restart the engine") from None
        self._pending_flush = True

    def went_idle(self) -> None:
        """Rank 0 went idle: the peers report their last steps' spans (they wait for them; rank 0 does not)."""
        if self._pending_flush:
            self._pending_flush = False
            for conn in self.ctrl:
                conn.send_bytes(FLUSH)

    def take_spans(self) -> list:
        out = []
        while self.spans:
            out.append(self.spans.popleft())
        return out

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for conn in self.ctrl:
            try:
                conn.send_bytes(STOP)
                conn.close()
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        self._kill()
        if dist.is_initialized() and dist.get_backend() == "gloo":
            dist.destroy_process_group()
        # NCCL: destroy_process_group can hang at exit after all work finished; the process group dies with
        # the process instead, and a second tensor-parallel engine in this process is refused (init_group).


    def _kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(self._dir, ignore_errors=True)


def _accept(listener: Listener, procs: list):
    """Accept one connection, giving up when a peer died before connecting."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(listener.accept()), daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while thread.is_alive():
        thread.join(0.2)
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"a tensor-parallel rank exited during start-up (code {dead[0].returncode})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the tensor-parallel ranks did not connect in {START_TIMEOUT_S} s")
    return result[0]


def leave(rc: int) -> int:
    """A command's last call: a process that ran an NCCL group exits right away, without the interpreter's
    teardown, where the group's destruction can hang after all work has finished."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


def _peer_error(rank: int, text: str) -> Exception:
    last = text.strip().splitlines()[-1] if text.strip() else text
    if last.startswith("batchscope.engine.config.ConfigError: "):
        return ConfigError(f"tensor-parallel rank {rank}: {last.split(': ', 1)[1]}")
    return RuntimeError(f"tensor-parallel rank {rank} failed at start-up: {last}")
