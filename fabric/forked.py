"""A loop that runs in a process of its own, forked from the run, with a pipe between them.

    run (parent)                              worker (forked child)
      w = Worker(body).start()  ── fork ──▶    body(end): set up, end.ready(), loop:
                                ◀── ready ──       for msg in end.wait(delay): ...
      w.send(("pause", ...))    ── msg ───▶        (select(2): precise to microseconds)
      state = w.stop()          ── stop ──▶    end.finish(state)
                                ◀── state ──

Why a process: a thread of the run shares its GIL, and while a sampler parses a netlink
dump the thread waits up to the 5 ms switch interval for it (the PFC controller's polls
came 5-60 ms late). The child ignores Ctrl-C (the run stops it) and is killed if the run
dies (PR_SET_PDEATHSIG). `own_process=False` runs the same body as a thread, for
benchmarks that measure the difference.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import pickle
import signal
import threading
from collections.abc import Callable

from fabric.fds import ready

PR_SET_PDEATHSIG = 1
STOP = ("stop",)


class WorkerError(RuntimeError):
    """The worker failed to start, or ended without sending its state."""


class End:
    """The worker's end of the pipe."""

    def __init__(self, conn, own_process: bool):
        self.conn = conn
        self.own_process = own_process
        self.stopping = False

    def detach(self) -> None:
        """In a forked child: ignore Ctrl-C (the run stops us) and die with the run."""
        if not self.own_process:
            return
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    def ready(self) -> None:
        self.conn.send(("ready", None))

    def failed(self, exc: BaseException) -> None:
        self.conn.send(("error", _picklable(exc)))

    def wait(self, timeout: float, also: int | None = None) -> list[tuple]:
        """Messages from the run, waiting up to `timeout` s for the first one; a stop
        (or the run going away) sets `stopping` instead. select(2), not Connection.poll:
        poll(2) would round a 0.2 ms wait up to 1 ms (readable()). The wait also ends
        when the fd `also` becomes readable."""
        fd, out = self.conn.fileno(), []
        fds = [fd] if also is None else [fd, also]
        try:
            while fd in ready(fds, timeout):
                msg = self.conn.recv()
                if msg == STOP:
                    self.stopping = True
                else:
                    out.append(msg)
                timeout = 0
        except (EOFError, OSError):
            self.stopping = True
        return out

    def finish(self, state: dict) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(("state", state))


class Worker:
    """`body(end)` in a forked process (or a thread); see the module doc."""

    def __init__(self, body: Callable[[End], None], name: str, own_process: bool = True):
        self.body = body
        self.name = name
        self.own_process = own_process
        self.conn = None
        self.proc: multiprocessing.Process | threading.Thread | None = None

    def start(self, timeout_s: float = 60.0) -> Worker:
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        end = End(child, self.own_process)
        kind = ctx.Process if self.own_process else threading.Thread
        self.proc = kind(target=self.body, args=(end,), name=self.name, daemon=True)
        self.proc.start()
        if self.own_process:
            child.close()
        if not self.conn.poll(timeout_s):
            self._end(kill=True)
            raise WorkerError(f"{self.name} did not start within {timeout_s:g} s")
        kind, got = self._recv()
        if kind != "ready":
            self._end()
            raise got if isinstance(got, BaseException) else WorkerError(str(got))
        return self

    def send(self, msg: tuple) -> None:
        self.conn.send(msg)

    def stop(self, timeout_s: float = 30.0) -> dict:
        """Ask the worker to stop; its state (raises WorkerError if it sent none)."""
        if self.proc is None:
            raise WorkerError(f"{self.name} is not running")
        with contextlib.suppress(OSError):
            self.conn.send(STOP)
        try:
            if not self.conn.poll(timeout_s):
                raise WorkerError(f"{self.name} did not stop within {timeout_s:g} s")
            kind, got = self._recv()
            if kind != "state":
                raise WorkerError(f"{self.name} failed: {got}")
            return got
        finally:
            self._end()

    @property
    def running(self) -> bool:
        return self.proc is not None

    @property
    def pid(self) -> int | None:
        """The worker's process (None: not running, or a thread)."""
        return None if isinstance(self.proc, threading.Thread | None) else self.proc.pid

    def _recv(self) -> tuple[str, object]:
        try:
            return self.conn.recv()
        except (EOFError, OSError) as exc:
            return "error", f"the process ended ({exc!r})"

    def _end(self, kill: bool = False) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.join(0 if kill else 10)
        if proc.is_alive() and isinstance(proc, multiprocessing.Process):
            proc.kill()
            proc.join(5)
        self.conn.close()


def take_state(worker: Worker | None, owner, what: str) -> None:
    """Stop `worker` if it runs and set each name of the state it sends back on `owner`;
    a worker that fails instead is one line in `owner.errors` naming `what`."""
    if worker is None or not worker.running:
        return
    try:
        state = worker.stop()
    except WorkerError as exc:
        owner.errors.append(f"{what}: {exc}")
        return
    for name, value in state.items():
        setattr(owner, name, value)


def realtime(priority: int | None) -> str | None:
    """Run the calling thread SCHED_FIFO at `priority` (None: leave it); None if done (or
    not asked), else why not. The kernel's RT throttling still leaves others 5 %."""
    if priority is None:
        return None
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError as exc:
        return f"SCHED_FIFO not available ({exc})"
    return None


def _picklable(exc: BaseException) -> BaseException:
    """`exc` if it crosses the pipe, else a WorkerError that says what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return WorkerError(f"{type(exc).__name__}: {exc}")
    return exc
