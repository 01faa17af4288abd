"""Signals that stop a run: SIGTERM (and SIGHUP) unwind like Ctrl-C does.

A process manager, `timeout` or `kill` sends SIGTERM; a closed terminal sends SIGHUP.
By default either ends Python at once, with no teardown: namespaces, agents and
captures stay and the results folder does not say FAILED. Inside `stop_on_signals()`
they raise `Terminated` instead, a KeyboardInterrupt, so every `finally`, `with` and
`except KeyboardInterrupt` that takes a fabric down on Ctrl-C does the same for them.

Only the first signal raises: a second one while the teardown runs is ignored (a
`kill -9` still ends everything; `testbed clean` then removes what is left). A signal
whose handler is not the default (ignored under `nohup`, or the caller's own) is left
as it is. Exit codes: 128 + the signal number (SIGTERM 143, SIGHUP 129), as a shell
reports a process the signal ended; Ctrl-C stays 130.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

SIGNALS = (signal.SIGTERM, signal.SIGHUP)
INTERRUPTED_REASON = "interrupted (Ctrl-C)"
CTRL_C_EXIT = 128 + signal.SIGINT


class Terminated(KeyboardInterrupt):
    """A stop signal turned into an exception, so the stack unwinds as on Ctrl-C."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(self.reason)

    @property
    def reason(self) -> str:
        return f"terminated ({signal.Signals(self.signum).name})"

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def failure_reason(exc: BaseException) -> str:
    """The line FAILED carries for an exception that ended a run."""
    if isinstance(exc, Terminated):
        return exc.reason
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED_REASON
    return repr(exc)


def exit_code(exc: KeyboardInterrupt) -> int:
    """130 after Ctrl-C, 128 + signal after a stop signal."""
    return exc.exit_code if isinstance(exc, Terminated) else CTRL_C_EXIT


@contextlib.contextmanager
def stop_on_signals(signals=SIGNALS):
    """Within the block, the first of `signals` raises Terminated in the main thread.

    Nests: an inner block leaves an outer one's handler in place. Outside the main
    thread (where Python cannot set handlers) it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = []
    owner = os.getpid()

    def handler(signum, _frame):
        if os.getpid() != owner:
            # A child forked inside the block (pyroute2 forks to enter namespaces, and
            # stops its children with SIGTERM) inherits this handler and the parent's
            # whole stack: raising here would run the parent's `finally` blocks in the
            # child (removing namespaces, tearing down the fabric). Die as by default.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if not fired:
            fired.append(signum)
            raise Terminated(signum)

    saved = {}
    for sig in signals:
        if signal.getsignal(sig) is signal.SIG_DFL:
            saved[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)
