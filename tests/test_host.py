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
        self.host_lags, self.host_lags_end = None, 0    # the host's, when it is done
        self.wakeups = self.turns = 0   # the host counts both
        self.room: list = []            # what writable() was told had room

    def writable(self, socks, now):
        self.room.append(set(socks))

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
    # the timed wake-up's lateness kept, for every agent served meanwhile
    assert host.wakeups >= 1 and len(a.host_lags[:a.host_lags_end]) >= 1
    # the process's wake-ups while each ran: a ran to the end, b ended on its datagram,
    # c failed at once
    assert a.wakeups == host.wakeups and 1 <= b.wakeups <= a.wakeups and c.wakeups == 0
    for x in agents:
        x.sock.close()
        x.peer.close()


def test_a_process_busy_share_spans_its_workload_to_the_last_agent_done():
    """CPU from the start to the last agent's workload done, over that wall time; None
    until every agent of the process is done (lingering is left out)."""
    a = SimpleNamespace(done_wall_ns=None, done_cpu_s=None)
    b = SimpleNamespace(done_wall_ns=None, done_cpu_s=None)
    host = Host.__new__(Host)
    host.agents, host.cpu_start_s, host.start_ns = [a, b], 10.0, 1_000_000_000
    a.done_wall_ns, a.done_cpu_s = 1_500_000_000, 10.3
    assert host.busy_fraction() is None                  # b is still at work
    b.done_wall_ns, b.done_cpu_s = 2_000_000_000, 10.8
    assert host.busy_fraction() == 0.8                   # 0.8 s of CPU in 1 s
    host.cpu_start_s = None
    assert host.busy_fraction() is None                  # never started


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


def test_a_blocked_port_is_served_when_it_has_room_and_only_then():
    """A socket the agent could not send on (wait_socks) is watched for room: the agent
    is served, told which socket, once the peer has drained it; the other agents of the
    process, with nothing due, are not served meanwhile."""
    import threading
    full_r, full_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    full_w.setblocking(False)
    full_r.setblocking(False)
    while True:                         # no room for another datagram
        try:
            full_w.send(b"x" * 1024)
        except BlockingIOError:
            break

    def drain():
        while True:
            try:
                full_r.recv(2048)
            except BlockingIOError:
                return

    t0 = now_ns()

    def sender(agent, k):
        if k == 1:
            agent.wait_socks = [full_w]
            threading.Timer(0.05, drain).start()
            return t0 + 10_000_000_000
        agent.wait_socks = []
        return None

    def idle(agent, k):
        return t0 + 1_000_000_000 if k == 1 else None

    a = FakeAgent("a", sender)
    others = [FakeAgent(f"o{i}", idle) for i in range(20)]
    host = Host([a, *others])
    for x in (a, *others):
        x.wake_ns = t0
    host.loop([a, *others])
    assert a.room == [{full_w}] and len(a.calls) == 2
    assert 40_000_000 <= a.calls[1][0] - t0 < 1_000_000_000     # on room, not its timer
    assert all(len(x.calls) == 2 and x.calls[1][0] - t0 >= 1_000_000_000 for x in others)
    for x in (a, *others):
        x.sock.close()
        x.peer.close()
    full_r.close()
    full_w.close()


def test_a_float_wake_up_time_is_napped_to_and_its_lateness_kept():
    """DCQCN's timers are floats: a nap to one (moderation) still records how late it
    ended, in whole nanoseconds."""
    def soon(agent, k):
        return now_ns() + 5e6 if k == 1 else None

    agent = FakeAgent("a", soon)
    agent.cfg.coalesce_ns = 20_000_000
    host = Host([agent])
    agent.wake_ns = now_ns()
    host.loop([agent])
    assert len(agent.calls) == 2 and len(agent.host_lags[:agent.host_lags_end]) == 1
    agent.sock.close()
    agent.peer.close()
