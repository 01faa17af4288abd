"""testbed.forked: a loop in a forked process (or a thread), messages in, state back."""

from __future__ import annotations

import os

import pytest

from testbed.forked import End, Worker, WorkerError


def echo(end: End) -> None:
    """Collects what the run sends until stopped; its state says where it ran."""
    end.detach()
    got = []
    end.ready()
    while not end.stopping:
        got.extend(end.wait(0.01))
    end.finish({"got": got, "pid": os.getpid()})


def refuse(end: End) -> None:
    end.failed(ValueError("no such port: leaf9-eth0"))


@pytest.mark.parametrize("own_process", [True, False])
def test_messages_in_state_back(own_process):
    w = Worker(echo, "echo", own_process).start()
    w.send(("pause", "leaf0", "leaf0-eth1", True))
    state = w.stop()
    assert state["got"] == [("pause", "leaf0", "leaf0-eth1", True)]
    assert (state["pid"] != os.getpid()) == own_process
    assert not w.running
    with pytest.raises(WorkerError, match="not running"):
        w.stop()


def test_a_failed_start_raises_the_workers_error():
    with pytest.raises(ValueError, match="leaf9-eth0"):
        Worker(refuse, "refuse").start()


def test_wait_hands_select_the_exact_timeout(monkeypatch):
    """poll(2) (Connection.poll) rounds 0.2 ms up to 1 ms, which made every PFC poll
    late; End.wait must give select(2) the timeout as it is."""
    import multiprocessing

    from testbed import forked
    seen = []
    monkeypatch.setattr(forked.select, "select",
                        lambda r, w, x, timeout: seen.append(timeout) or ([], [], []))
    _, b = multiprocessing.Pipe()
    assert End(b, own_process=False).wait(0.0002) == [] and seen == [0.0002]
