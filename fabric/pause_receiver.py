"""The upstream's side of a PFC pause that comes from another machine.

On one machine the PFC controller (fabric.switch_control) sends a pause frame out of a switch port
and holds the upstream's lossless class itself. When the fabric is spread over several
machines (testbed.spread) and the upstream is on another one, that controller can only
send the frame: it crosses the VXLAN link as the 802.1Qbb frame it is. This receiver,
on the upstream's machine, is the MAC that obeys it:

    pause frame (01:80:C2:00:00:01, 0x8808, opcode 0x0101) arrives on a port whose peer
    is on another machine ─▶ its class-enable vector names the lossless priority:
      quanta > 0: the port's lossless class held (tbf 13:, as the controller holds it)
                  until quanta x 512 bit times at the port's rate, or a refresh
      quanta = 0: released at once, and the port's qdisc kicked to send again

It runs in a process of its own (fabric.forked, as the controller does), one raw socket
per such port (ETH_P 0x8808) and one epoll over them, and counts per port the frames,
XOFFs, XONs, expiries, the time held and how long each hold took after its frame.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time

from fabric import netns
from fabric.forked import End, Worker, realtime, take_state
from fabric.inspect import dev_counters
from fabric.lossless import KICK_PRIORITY, LOSSLESS_HANDLE, SwitchSettings, hold_message, kick_frame
from fabric.qdisc_poller import QdiscPoller
from fabric.shaping import handle_int
from fabric.switch_ports import ControllerTuning
from fabric.wire import ETHERTYPE_MAC_CONTROL, pause_quanta, quanta_s

STATE = ("ports", "errors", "wall_s")
FAR_LINKS = ("eBPF counters count a queue's bytes out at the link's far end, and some "
             "links here end on other machines")


def far_ports(fab) -> list[tuple[str, str, str]]:
    """(node, ifname, peer) of this machine's ports whose peer is a PFC switch (a node
    that forwards) on another machine."""
    g = fab.topo.graph
    here = set(fab.here)
    return [(n, p.ifname, p.peer) for n in fab.here for p in fab.plan.ports[n]
            if p.peer not in here and g.nodes[p.peer].get("forwards")]


def has_far_links(fab, index: dict) -> bool:
    """Does a port of this machine's nodes end on another machine (its peer not in
    `index`, node -> ifname -> ifindex of the nodes here)?"""
    return any(p.peer not in index for n in fab.here for p in fab.plan.ports[n])


class PauseReceiver:
    """start()/stop(); `ports` afterwards: "node:ifname" -> counters (module doc)."""

    def __init__(self, fab, settings: SwitchSettings):
        self.fab = fab
        self.settings = settings
        self.where = far_ports(fab)
        self.ports: dict[str, dict] = {}
        self.errors: list[str] = []
        self.wall_s = 0.0
        self._worker: Worker | None = None

    def start(self) -> PauseReceiver:
        self._worker = Worker(self._run, "pfc-rx").start()
        return self

    def stop(self) -> None:
        take_state(self._worker, self, "the PFC receiver")

    @property
    def pid(self) -> int | None:
        return self._worker.pid if self._worker is not None else None

    def report(self) -> dict:
        totals = {k: sum(p[k] for p in self.ports.values())
                  for k in ("frames_received", "xoff_frames", "xon_frames", "expired")}
        lags = sorted(x for p in self.ports.values() for x in p["lags_ms"])
        totals["paused_s"] = round(sum(p["paused_s"] for p in self.ports.values()), 4)
        ports = {k: {f: v for f, v in p.items() if f != "lags_ms"}
                 for k, p in self.ports.items()}
        return {"ports": ports, "totals": totals, "errors": self.errors,
                "hold_after_frame_ms": {
                    "count": len(lags),
                    "p50": round(lags[len(lags) // 2], 3) if lags else None,
                    "max": round(lags[-1], 3) if lags else None}}

    # -- in the receiver's process ---------------------------------------------------------
    def _run(self, end: End) -> None:
        end.detach()
        prio = self.settings.traffic_class.priority
        g = self.fab.topo.graph
        socks, pollers, held = {}, {}, {}
        ep = select.epoll()
        try:
            for node, ifname, peer in self.where:
                with netns.entered(self.fab.ns(node)):
                    if node not in pollers:
                        pollers[node] = QdiscPoller(handle_int(LOSSLESS_HANDLE))
                    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW,
                                         socket.htons(ETHERTYPE_MAC_CONTROL))
                    index = socket.if_nametoindex(ifname)
                sock.bind((ifname, ETHERTYPE_MAC_CONTROL))
                sock.setblocking(False)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, KICK_PRIORITY)
                edge = g.edges[node, peer]
                socks[sock.fileno()] = (sock, node, ifname, edge["rate_mbps"])
                held[(node, ifname)] = {
                    "msgs": tuple(hold_message(index, edge["rate_mbps"], edge["queue_bytes"],
                                               h) for h in (False, True)),
                    "until": None, "since": 0.0}
                self.ports[f"{node}:{ifname}"] = {"peer": peer, "frames_received": 0,
                                                  "xoff_frames": 0, "xon_frames": 0,
                                                  "expired": 0, "paused_s": 0.0,
                                                  "lags_ms": []}
                ep.register(sock.fileno(), select.EPOLLIN)
        except BaseException as exc:
            for sock, *_ in socks.values():
                sock.close()
            end.failed(exc)
            return
        kick = kick_frame()
        why = realtime(ControllerTuning().rt_priority)     # as the controller runs
        if why:
            self.errors.append(f"{why}; holds may come late")
        end.ready()
        t0 = time.monotonic()

        def release(node: str, ifname: str, now: float, sock) -> None:
            h = held[(node, ifname)]
            pollers[node].request(h["msgs"][0])
            with contextlib.suppress(OSError):    # run the port's qdisc again
                sock.send(kick)
            self.ports[f"{node}:{ifname}"]["paused_s"] += now - h["since"]
            h["until"] = None

        try:
            while not end.stopping:
                now = time.monotonic()
                due = [h["until"] for h in held.values() if h["until"] is not None]
                end.wait(max(0.0, min(due) - now) if due else 0.05, also=ep.fileno())
                for fd, _ in ep.poll(0):
                    sock, node, ifname, rate = socks[fd]
                    while True:
                        try:
                            frame = sock.recv(128)
                        except BlockingIOError:
                            break
                        got = time.monotonic()
                        quanta = pause_quanta(frame, prio)
                        if quanta is None:
                            continue
                        c = self.ports[f"{node}:{ifname}"]
                        c["frames_received"] += 1
                        h = held[(node, ifname)]
                        if quanta:
                            c["xoff_frames"] += 1
                            if h["until"] is None:
                                pollers[node].request(h["msgs"][1])
                                h["since"] = got
                                c["lags_ms"].append((time.monotonic() - got) * 1e3)
                            h["until"] = got + quanta_s(quanta, rate)
                        else:
                            c["xon_frames"] += 1
                            if h["until"] is not None:
                                release(node, ifname, got, sock)
                now = time.monotonic()
                for sock, node, ifname, _ in socks.values():
                    h = held[(node, ifname)]
                    if h["until"] is not None and now >= h["until"]:
                        self.ports[f"{node}:{ifname}"]["expired"] += 1
                        release(node, ifname, now, sock)
        except BaseException as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            now = time.monotonic()
            for sock, node, ifname, _ in socks.values():   # nothing stays held
                if held[(node, ifname)]["until"] is not None:
                    with contextlib.suppress(Exception):
                        release(node, ifname, now, sock)
                sock.close()
            for p in pollers.values():
                p.close()
            ep.close()
            self.wall_s = time.monotonic() - t0
            for c in self.ports.values():
                c["paused_s"] = round(c["paused_s"], 4)
        end.finish({name: getattr(self, name) for name in STATE})


class FarShares:
    """The shares of a switch's ingress ports whose upstreams are on other machines, for
    the controller's netlink path (fabric.switch_ports.charge_occupancy): the bytes the port
    received, read from its namespace's /proc/net/dev, stand for what the upstream sent
    (the upstream's lossless queue is on its own machine). Every class counts, so ACKs and
    lossy traffic are in the share too."""

    def __init__(self, fab, ingress: list):
        self.ingress = [i for i in ingress if i.remote]
        self.fds: dict[str, int] = {}
        for switch in {i.switch for i in self.ingress}:
            with netns.entered(fab.ns(switch)):
                self.fds[switch] = os.open("/proc/thread-self/net/dev", os.O_RDONLY)

    def update(self, dt_s: float | None) -> None:
        got = {s: dev_counters(os.pread(fd, 1 << 20, 0)) for s, fd in self.fds.items()}
        for ing in self.ingress:
            counters = got[ing.switch].get(ing.ifname)
            if counters is not None:
                ing.update_weight(counters[0], dt_s)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


@contextlib.contextmanager
def receiving(fab, settings: SwitchSettings):
    """A PauseReceiver over the block, where this machine has such ports."""
    rx = PauseReceiver(fab, settings)
    if rx.where:
        rx.start()
    try:
        yield rx
    finally:
        rx.stop()
