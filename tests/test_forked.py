"""fabric.forked: a loop in a forked process (or a thread), messages in, state back."""

from __future__ import annotations

import os

import pytest

from fabric.forked import End, Worker, WorkerError


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

    from fabric import fds
    seen = []
    monkeypatch.setattr(fds.select, "select",
                        lambda r, w, x, timeout: seen.append(timeout) or ([], [], []))
    _, b = multiprocessing.Pipe()
    assert End(b, own_process=False).wait(0.0002) == [] and seen == [0.0002]


@pytest.mark.parametrize("high", [False, True], ids=["select", "poll past FD_SETSIZE"])
def test_readable_waits_on_any_fd(high):
    """A worker forked from a run over a big fabric inherits fds past 1024, where
    select(2) raises "filedescriptor out of range": poll(2) serves those."""
    import os
    import resource
    import socket

    from fabric.fds import FD_SETSIZE, readable
    a, b = socket.socketpair()
    fd = a.fileno()
    try:
        if high:
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            if hard != resource.RLIM_INFINITY and hard <= FD_SETSIZE + 10:
                pytest.skip(f"RLIMIT_NOFILE hard limit {hard}: no fd past {FD_SETSIZE}")
            if soft != resource.RLIM_INFINITY and soft <= FD_SETSIZE + 10:
                resource.setrlimit(resource.RLIMIT_NOFILE, (FD_SETSIZE + 64, hard))
            fd = os.dup2(a.fileno(), FD_SETSIZE + 7)
        assert not readable(fd, 0.01)
        b.send(b"x")
        assert readable(fd, 1.0)
    finally:
        if high:
            os.close(fd)
        a.close()
        b.close()
