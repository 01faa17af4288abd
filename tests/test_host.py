"""Tests for traffic.host (one process serving several agents) and how traffic.launch
deals agents over processes. The loop runs here on fake agents with real sockets; real
agents on real fabrics: tests/test_transport.py (test_ring_allreduce_on_four_ranks)."""

from __future__ import annotations

import socket
from collections import deque
from types import SimpleNamespace

from traffic.host import Host
from traffic.packets import now_ns


def test_agents_are_dealt_over_processes(monkeypatch):
    from traffic.launch import deal, process_count
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert process_count(None, 16) == process_count(0, 16) == 2    # one per core
    assert process_count(16, 16) == process_count(99, 16) == 16     # one per rank at most
    assert process_count(None, 1) == 1
    nodes = [f"n{i}" for i in range(5)]
    assert deal(nodes, 2) == [["n0", "n2", "n4"], ["n1", "n3"]]     # ring neighbours apart
    assert deal(nodes, 5) == [[n] for n in nodes]
    assert sorted(n for g in deal(nodes, 3) for n in g) == nodes


class FakeAgent:
    """What Host.loop uses of an agent: a receive socket, its wake time, turn()."""

    def __init__(self, node: str, script):
        self.cfg = SimpleNamespace(node=node, coalesce_ns=0, start_at_ns=0)
        self.sock, self.peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.rx = SimpleNamespace(fd=self.sock.fileno())
        self.script = script          # turn number -> what turn() does
        self.calls: list[tuple[int, int]] = []     # (time, datagrams read)
        self.wait_socks: list = []
        self.timer_lag_ns: deque = deque()
        self.wakeups = self.turns = 0   # the host counts both

    def turn(self):
        got = 0
        while True:
            try:
                self.sock.recv(100)
                got += 1
            except BlockingIOError:
                break
        self.calls.append((now_ns(), got))
        return self.script(self, len(self.calls))

    def leave(self, now):
        pass


def test_host_serves_each_agent_on_its_timer_or_its_traffic_until_done():
    t0 = now_ns()

    def sleeper(agent, k):          # wants to be woken 30 ms after it starts, then done
        return t0 + 30_000_000 if k == 1 else None

    def listener(agent, k):         # nothing timed: only traffic wakes it; done on it
        if k == 1:
            agent.peer.send(b"x")   # as if a peer sent a datagram
            return t0 + 10_000_000_000
        return None

    def failing(agent, k):
        raise ValueError("broken")

    agents = [FakeAgent("a", sleeper), FakeAgent("b", listener), FakeAgent("c", failing)]
    host = Host(agents)
    for a in agents:
        a.wake_ns = t0
    host.loop(list(agents))
    a, b, c = agents
    assert len(a.calls) == 2 and a.calls[1][0] - t0 >= 30_000_000   # its timer, not before
    assert len(b.calls) == 2 and b.calls[1][1] == 1                  # woken by the datagram
    assert b.calls[1][0] - t0 < 1_000_000_000                         # not by its far timer
    assert host.errors == {"a": None, "b": None, "c": "ValueError: broken"}   # only its own
    assert len(c.calls) == 1 and [x.turns for x in agents] == [2, 2, 1]
    assert host.wakeups >= 1 and a.timer_lag_ns        # the timed wake-up's lateness kept
    for x in agents:
        x.sock.close()
        x.peer.close()


def test_host_interrupt_moderation_batches_a_wake_up():
    """With coalesce_ns, a wake-up comes no sooner than coalesce_ns after the last one,
    however early the traffic: the datagrams sent meanwhile are read in one turn."""
    sent = []

    def chatty(agent, k):
        if k <= 3:
            agent.peer.send(b"x")
            sent.append(now_ns())
            return now_ns() + 10_000_000_000
        return None

    agent = FakeAgent("a", chatty)
    agent.cfg.coalesce_ns = 20_000_000
    host = Host([agent])
    agent.wake_ns = start = now_ns()
    host.loop([agent])
    # turn k+1 comes no sooner than the host's wake-up k + 20 ms, and that no sooner
    # than the loop's start + k x 20 ms: however the scheduler delays any of them
    assert [got for _, got in agent.calls] == [0, 1, 1, 1]
    assert agent.calls[-1][0] - start >= 3 * 20_000_000
    assert (now_ns() - start) / 1e9 < 5
    agent.sock.close()
    agent.peer.close()
