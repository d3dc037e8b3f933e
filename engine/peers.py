"""The other tensor-parallel ranks: processes the engine starts itself, each running the steps rank 0 plans.

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
`python -m batchscope.engine.peers` (not multiprocessing's spawn, which re-runs the user's main script) and
connect back over a private socket with a random key.
"""
from __future__ import annotations

import gc
import os
import pickle
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from datetime import timedelta
from multiprocessing.connection import Client, Listener

import torch
import torch.distributed as dist

from .batch import fill_from_message, message_slot, message_step, step_message
from .config import ConfigError, EngineConfig
from .tensor_parallel import nvls_off_env

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


class Peers:
    """Rank 0's side: starts ranks 1..N-1, relays steps to them, gathers their GPU spans."""

    def __init__(self, config: EngineConfig):
        for key, value in nvls_off_env().items():
            os.environ.setdefault(key, value)
        self.size = config.tensor_parallel_size
        self.port = _free_port()
        self._dir = tempfile.mkdtemp(prefix="batchscope-tp-")
        key = secrets.token_bytes(16)
        listener = Listener(os.path.join(self._dir, "sock"), family="AF_UNIX", authkey=key)
        env = {**os.environ, "BATCHSCOPE_PEER_KEY": key.hex()}
        self.procs = [subprocess.Popen([sys.executable, "-m", "batchscope.engine.peers", listener.address,
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
        self.spans: deque = deque()         # (rank, step, {phase: (start_ns, end_ns)}) not yet handed over
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
                    print(f"batchscope: {self.lost}; the engine cannot run steps any more", file=sys.stderr,
                          flush=True)
                return
            if msg[0] == "spans":
                self.spans.extend(msg[1])
            elif msg[0] == "error":
                last = msg[1].strip().splitlines()[-1] if msg[1].strip() else "?"
                self.lost = self.lost or f"tensor-parallel rank {rank} failed ({last})"
                print(f"batchscope: tensor-parallel rank {rank} failed:\n{msg[1]}", file=sys.stderr, flush=True)

    # -- serving (engine thread) --------------------------------------------------------------------------------
    def send_step(self, batch) -> None:
        """Relay a step to every other rank; raises (the step fails, nothing is launched) once a rank is gone,
        rather than launch collectives nobody will meet."""
        if self.lost:
            raise RuntimeError(f"{self.lost}: restart the engine")
        data = STEP + step_message(batch)
        try:
            for conn in self.ctrl:
                conn.send_bytes(data)
        except OSError as exc:
            self.lost = self.lost or f"a tensor-parallel rank stopped taking steps ({exc})"
            raise RuntimeError(f"{self.lost}: restart the engine") from None
        self._pending_flush = True

    def flush(self) -> None:
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
        import shutil
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


# -------------------------------------------------------------------------------------------------------------
# A peer process
# -------------------------------------------------------------------------------------------------------------
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
        from .rank import blocks_that_fit, load_rank, make_runner, rank_device

        device = rank_device(config, rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:   # the ranks share the CPU's cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.tensor_parallel_size))
        # said before the rendezvous: rank 0 enters it only once every rank got this far (a rank that fails
        # earlier, importing or picking its device, is reported instead of leaving rank 0 waiting there)
        reports.send(("joining", rank))
        init_group(rank, config.tensor_parallel_size, port, device)
        rm = load_rank(config, rank)
        reports.send(("blocks", blocks_that_fit(rm, config)))
        kind, num_blocks = ctrl.recv()
        _kv, runner = make_runner(rm, config, num_blocks)
        reports.send(("ready", {"rank": rank, "device": str(device), "cuda_graphs": runner.use_graphs}))
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
    os._exit(0)      # no destroy_process_group: with NCCL it can hang at exit (see Peers.close)


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
            _report(reports, rank, done)
            continue
        slot = runner.slots[message_slot(body)]
        if slot.index in pending:
            _report(reports, rank, [pending.pop(slot.index)])
        runner.wait_slot_free(slot)
        batch = fill_from_message(body, slot)
        t0 = time.perf_counter_ns()
        launched = runner.launch(batch)
        pending[slot.index] = (message_step(body), launched, (t0, time.perf_counter_ns()))


def _report(reports, rank: int, done: list) -> None:
    spans = []
    for step, launched, host in done:
        ev = launched.events
        if ev is None:              # CPU: the step ran inside launch
            spans.append((rank, step, {"compute": host}))
            continue
        ev.d2h_end.synchronize()
        anchor, anchor_ns = launched.anchor
        spans.append((rank, step, {phase: (anchor_ns + anchor.elapsed_time(a) * 1e6,
                                           anchor_ns + anchor.elapsed_time(b) * 1e6)
                                   for phase, (a, b) in ev.spans().items()}))
    if spans:
        reports.send(("spans", spans))


if __name__ == "__main__":
    peer_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
