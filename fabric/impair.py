"""Link impairments on a built fabric: lane failures as rate, BER as loss, length as delay.

Applies topologies/physics.py's physics to real kernel state, with the best mechanism this
machine has (fabric.doctor), and records which one ran:

    rate    lanes lost -> HTB class 1:10 rate = nominal x (working / lanes), both ends
            (shaping.set_rate); a technology that fails whole -> both ends admin down,
            and back up (with the node's routes restored) on repair
    loss    netem under class 1:10 where the kernel has it; otherwise an nftables
            `numgen random` drop at the INGRESS of the receiving end of the link (a
            netdev-family table in the receiver's namespace, hook ingress on its port):
            every frame that crosses the link meets it, whatever sent it (forwarded,
            locally sent, or written to an AF_PACKET socket, which bypasses the IP
            hooks and the netdev egress hook; the rules: fabric/nft_loss.py); otherwise
            recorded as not emulated
    delay   ~5 ns per metre of link (x scale_factor, so delay and rate keep the real
            fabric's bandwidth-delay product), where asked (`delay=True`): netem on each
            link; otherwise the agents' delay line (traffic.rx.DelayLine: each path's
            one-way delay, `path_delays_ns`, added where it ends, at the receiver)

No routing protocol runs: when a link goes down only its two ends notice (their ECMP
next hop over it goes dead); nodes further away keep sending towards it, as a real
fabric does until BGP reconverges.

Scheduled failures are played by a process of their own (fabric/failplay.py): the
schedule becomes kernel operations per event (plan), the player does them at t0 + t_s
and reports when each began and landed, and this side keeps the state and the log.

    with Impairments(fab) as imp:         # loss/delay from each link's profile
        imp.fail_lane("leaf0", "spine0", 3)
        runner = imp.prepare_schedule(events)   # player loaded, before the agents run
        runner.start(t0_ns)               # FailureEvents at t0 + t_s (monotonic ns)
        ...
        runner.stop()                     # the job ended: later events are not played
        imp.record()                      # JSON-ready, for metrics.json
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from fabric import doctor
from fabric.failplay import run_ops
from fabric.fds import readable
from fabric.nft_loss import NFT_FAMILY, NFT_MOD, NFT_TABLE, nft_script, nft_threshold, run_nft
from fabric.shaping import add_netem, change_netem, queue_stats
from topologies.physics import (
    ROCE_FRAME_BYTES,
    FailureEvent,
    LaneState,
    Profiles,
    check_topology,
    load_profiles,
    propagation_delay_ns,
)

LOSS_WHERE = {"netem": "netem qdisc on the transmitting port (egress)",
              "nftables": "nftables netdev ingress numgen random drop on the receiving port",
              "none": "no loss emulated"}
NO_NETEM = "kernel has no netem qdisc (testbed doctor)"
PLAYER_EXIT_S = 10.0          # the playback process finishes its step and exits
PLAYER_READY_S = 60.0         # loading it on a busy machine
PLAYER_NICE = -10             # above the agents (0): woken first when its time comes
REPO_ROOT = Path(__file__).resolve().parent.parent   # `python -m fabric.failplay` from here


def loss_mechanism() -> str:
    """"netem", "nftables" or "none": the best way this machine has to drop packets."""
    if doctor.has("netem"):
        return "netem"
    if doctor.has("nftables"):
        return "nftables"
    return "none"


class Impairments:
    """Lane state, loss and delay of every link of a fabric; what ran is recorded."""

    def __init__(self, fab, profiles: Profiles | None = None, *,
                 frame_bytes: int = ROCE_FRAME_BYTES, scale_delay: bool = True,
                 mechanism: str | None = None, delay: bool = True):
        self.fab = fab
        self.topo = fab.topo
        self.profiles = profiles or load_profiles()
        check_topology(self.topo, self.profiles)
        self.frame_bytes = frame_bytes
        self.scale_delay = scale_delay
        self.mechanism = mechanism or loss_mechanism()
        self.delay = delay
        self.path_delays: dict[tuple[str, str], tuple[float, float, float]] = {}
        self.lanes: dict[tuple[str, str], LaneState] = {
            self.key(a, b): LaneState(self.profiles.for_link(self.topo, a, b),
                                      self.profiles.link_lanes(self.topo, a, b))
            for a, b in self.topo.graph.edges()}
        self.down: set[tuple[str, str]] = set()
        self.loss: dict[tuple[str, str], float] = {}      # (tx node, peer) -> rate set
        self.delay_us: dict[tuple[str, str], float] = {}  # (tx node, peer) -> emulated
        self._netem_ports: set[tuple[str, str]] = set()
        self._nft: dict[str, dict[str, float]] = {}       # rx node -> rx port -> loss
        self.log: list[dict] = []
        self.t0 = time.monotonic()     # log t_s from here (a schedule moves it to its start)
        self.runners: list[FailureRunner] = []
        self._node_of_ns = {fab.ns(n): n for n in self.topo.graph.nodes}
        # the nodes whose ports this changes: a fabric's part on one of several machines
        # changes its own ends of each link (the other machine, the far ends)
        self.here = set(getattr(fab, "here", None) or self.topo.graph.nodes)
        self._lock = threading.RLock()

    def __enter__(self) -> Impairments:
        return self.apply()

    def __exit__(self, *exc) -> None:
        self.remove()

    @staticmethod
    def key(a: str, b: str) -> tuple[str, str]:
        return (a, b) if a <= b else (b, a)

    # -- loss and delay ---------------------------------------------------------------
    @property
    def loss_where(self) -> str:
        """Which loss mechanism runs, and where on a link it drops (for the run's log)."""
        return LOSS_WHERE[self.mechanism]

    def delay_for(self, a: str, b: str) -> tuple[float, float]:
        """(real ns, emulated us) of link a:b's propagation delay."""
        real_ns = propagation_delay_ns(self.topo.graph.edges[a, b]["length_m"])
        factor = self.topo.scale_factor if self.scale_delay else 1.0
        return real_ns, real_ns * factor / 1000

    @property
    def delay_mechanism(self) -> str:
        """"netem", "agent delay line" or "off": how propagation delay is emulated."""
        if not self.delay:
            return "off"
        return "netem" if self.mechanism == "netem" else "agent delay line"

    def apply_delay(self) -> Impairments:
        """Every link's delay, both directions, where netem gives it (loss kept as set);
        with the agent delay line the agents take `path_delays_ns` instead."""
        if self.delay_mechanism == "netem":
            for a, b in self.topo.graph.edges():
                for tx, rx in ((a, b), (b, a)):
                    self._set(tx, rx, self.loss.get((tx, rx), 0.0), self.delay_for(a, b)[1])
        return self

    def path_delays_ns(self, pairs) -> dict[tuple[str, str], int]:
        """{(src, dst): one-way delay in whole emulated ns} over the fabric's routes
        (the mean over ECMP paths; min and max kept for record())."""
        from fabric.routing import path_delay_ns

        def link_ns(a: str, b: str) -> float:
            return self.delay_for(a, b)[1] * 1000

        for src, dst in pairs:
            self.path_delays[src, dst] = path_delay_ns(self.fab.routes, link_ns, src, dst)
        return {k: int(round(self.path_delays[k][0])) for k in pairs}

    def apply(self, loss_rate: float | None = None, links=None) -> Impairments:
        """Loss (from each profile's BER at frame_bytes, or `loss_rate` for all) and
        delay on every link (or those in `links`, pairs (a, b)), both directions."""
        touched: set[str] = set()
        for a, b in links or list(self.topo.graph.edges()):
            profile = self.lanes[self.key(a, b)].profile
            loss = profile.packet_loss(self.frame_bytes) if loss_rate is None else loss_rate
            for tx, rx in ((a, b), (b, a)):
                self._set(tx, rx, loss, self.delay_for(a, b)[1])
                touched.update((tx, rx))
        self._sync_nft(touched)
        return self

    def set_loss(self, a: str, b: str, loss_rate: float, both: bool = True) -> None:
        """Drop `loss_rate` of the packets a sends to b (and b to a if `both`)."""
        nft_threshold(loss_rate)  # validates
        pairs = [(a, b), (b, a)] if both else [(a, b)]
        for tx, rx in pairs:
            self._set(tx, rx, loss_rate, self.delay_for(tx, rx)[1])
        self._sync_nft({rx for _, rx in pairs})

    def _set(self, tx: str, rx: str, loss: float, delay_us: float) -> None:
        nft_threshold(loss)
        delay_us = delay_us if self.delay else 0.0
        port = self.fab.plan.port(tx, rx)
        if self.mechanism == "netem" and tx not in self.here:
            self.delay_us[(tx, rx)] = float(int(round(delay_us)))   # the far end's
        elif self.mechanism == "netem":
            if (loss or delay_us) and (tx, rx) not in self._netem_ports:
                with self.fab.ipr(tx) as ipr:
                    index = ipr.link_lookup(ifname=port.ifname)[0]
                    queue = self.topo.graph.edges[tx, rx]["queue_bytes"]
                    add_netem(ipr, index, delay_us, loss, queue)
                self._netem_ports.add((tx, rx))
            elif (tx, rx) in self._netem_ports:
                with self.fab.ipr(tx) as ipr:
                    change_netem(ipr, ipr.link_lookup(ifname=port.ifname)[0], delay_us, loss)
            self.delay_us[(tx, rx)] = float(int(round(delay_us)))
        elif self.mechanism == "nftables" and rx in self.here:   # dropped at the far end
            self._nft.setdefault(rx, {})[self.fab.plan.port(rx, tx).ifname] = loss
        self.loss[(tx, rx)] = loss

    def _sync_nft(self, nodes: set[str]) -> None:
        if self.mechanism != "nftables":
            return
        for node in sorted(nodes):
            if node in self._nft:
                run_nft(self.fab.ns(node), ["-f", "-"], nft_script(self._nft[node]))

    def nft_drops(self, node: str) -> dict[str, int]:
        """Receiving port of `node` -> frames its ingress loss rule dropped (since the
        node's table was last set); {} when none of its ports has loss."""
        if not any(self._nft.get(node, {}).values()):
            return {}
        out = json.loads(run_nft(self.fab.ns(node),
                                 ["-j", "list", "table", NFT_FAMILY, NFT_TABLE]))
        drops = {}
        for item in out["nftables"]:
            rule = item.get("rule")
            if rule and "comment" in rule:
                drops[rule["comment"]] = next(e["counter"]["packets"] for e in rule["expr"]
                                              if "counter" in e)
        return drops

    def link_drops(self, tx: str, rx: str) -> int:
        """Frames tx sent towards rx that the loss dropped: counted by the nftables rule
        at rx's port, or by the netem qdisc on tx's port (before the wire)."""
        if self.mechanism == "netem":
            if (tx, rx) not in self._netem_ports:
                return 0
            with self.fab.ipr(tx) as ipr:
                index = ipr.link_lookup(ifname=self.fab.plan.port(tx, rx).ifname)[0]
                return queue_stats(ipr, index, kind="netem")["drops"]
        return self.nft_drops(rx).get(self.fab.plan.port(rx, tx).ifname, 0)

    def configured_loss(self, tx: str, rx: str) -> float:
        """The loss actually configured (after the mechanism's rounding)."""
        loss = self.loss.get((tx, rx), 0.0)
        if self.mechanism == "nftables":
            return nft_threshold(loss) / NFT_MOD
        return loss if self.mechanism == "netem" else 0.0

    # -- lanes and links ----------------------------------------------------------------
    def rate_mbps(self, a: str, b: str) -> float:
        """The rate link a:b runs at now (0 when down)."""
        nominal = self.topo.graph.edges[a, b]["rate_mbps"]
        return nominal * self.lanes[self.key(a, b)].fraction

    def fail_lane(self, a: str, b: str, lane: int) -> dict:
        return self.apply_event(FailureEvent(0.0, a, b, "fail_lane", lane))

    def repair_lane(self, a: str, b: str, lane: int) -> dict:
        return self.apply_event(FailureEvent(0.0, a, b, "repair_lane", lane))

    def fail_lanes(self, a: str, b: str, count: int) -> dict:
        """Fail the lowest-numbered `count` working lanes of a:b in one rate change."""
        with self._lock:
            st = self.lanes[self.key(a, b)]
            alive = [k for k in range(st.total_lanes) if k not in st.failed]
            if not 0 <= count <= len(alive):
                raise ValueError(f"cannot fail {count} lanes of {a}:{b}: {len(alive)} working")
            st.failed.update(alive[:count])
            return self._update(a, b, "fail_lanes", None, count=count)

    def fail_link(self, a: str, b: str) -> dict:
        return self.apply_event(FailureEvent(0.0, a, b, "fail_link"))

    def repair_link(self, a: str, b: str) -> dict:
        return self.apply_event(FailureEvent(0.0, a, b, "repair_link"))

    def apply_event(self, event: FailureEvent, stamps: tuple[float, float] | None = None,
                    ) -> dict:
        """Change the link's state and the kernel; with `stamps` (began, done: monotonic
        seconds) the kernel was already changed (by the playback process) at those times."""
        with self._lock:
            self._mutate(event)
            return self._update(event.a, event.b, event.action, event.lane, stamps=stamps)

    def _mutate(self, event: FailureEvent) -> None:
        st = self.lanes[self.key(event.a, event.b)]
        if event.action == "fail_lane":
            st.failed.add(st.check_lane(event.lane))
        elif event.action == "repair_lane":
            st.failed.discard(st.check_lane(event.lane))
        elif event.action in ("fail_link", "repair_link"):
            st.link_failed = event.action == "fail_link"
        else:
            raise ValueError(f"unknown failure action {event.action!r}")

    def _update(self, a: str, b: str, action: str, lane: int | None,
                stamps: tuple[float, float] | None = None, **extra) -> dict:
        with self._lock:
            began = time.monotonic()
            key = self.key(a, b)
            st = self.lanes[key]
            rate = self.rate_mbps(a, b)
            ops = self._transition(a, b, rate)
            if stamps is None:
                run_ops(ops, self._ipr)
                stamps = (began, time.monotonic())
            # t_s: when the kernel had the change (both ends); began_s: when it started
            entry = {"t_s": round(stamps[1] - self.t0, 6),
                     "began_s": round(stamps[0] - self.t0, 6), "action": action,
                     "link": f"{a}:{b}", "lane": lane, **extra,
                     "failed_lanes": len(st.failed), "working_lanes": st.working_lanes,
                     "lanes": st.lanes, "spare_lanes": st.profile.spare_lanes,
                     "rate_mbps": rate, "up": rate > 0}
            self.log.append(entry)
            return entry

    def _transition(self, a: str, b: str, rate: float) -> list[dict]:
        """The kernel operations that take link a:b to `rate` (0: down); updates `down`."""
        key = self.key(a, b)
        ops: list[dict] = []
        if rate == 0 and key not in self.down:
            ops += self._port_ops(a, b, op="state", state="down")
            self.down.add(key)
        elif rate > 0:
            if key in self.down:
                ops += [{**op, "neighbour": [port.peer_address, port.peer_mac]}
                        for op, port in zip(self._port_ops(a, b, op="state", state="up"),
                                            self._ports(a, b), strict=True)]
                self.down.discard(key)
                ops += [self._routes_op(node, peer) for node, peer in ((a, b), (b, a))
                        if node in self.here]
            ops += self._port_ops(a, b, op="rate", rate_mbps=rate)
        return [op for op in ops if self._node_of_ns[op["ns"]] in self.here]

    def _ports(self, a: str, b: str) -> list:
        return [self.fab.plan.port(node, peer) for node, peer in ((a, b), (b, a))]

    def _port_ops(self, a: str, b: str, **op) -> list[dict]:
        return [{"ns": self.fab.ns(port.node), "ifname": port.ifname, **op}
                for port in self._ports(a, b)]

    def _routes_op(self, node: str, back: str) -> dict:
        """Routes through `back` that the kernel flushed when the port went down, again
        over every live port (routes not through it were never touched)."""
        dead = {peer for peer in self.topo.graph.adj[node]
                if self.key(node, peer) in self.down}
        routes = []
        for dst, gateways in self.fab.route_entries(node):
            if back not in gateways:
                continue
            hops = [{"gateway": self.fab.plan.port(node, p).peer_address,
                     "ifname": self.fab.plan.port(node, p).ifname}
                    for p in gateways if p not in dead]
            if hops:
                routes.append({"dst": dst, "prefsrc": self.fab.plan.loopback[node],
                               "hops": hops})
        return {"ns": self.fab.ns(node), "op": "routes", "routes": routes}

    @contextlib.contextmanager
    def _ipr(self, op: dict):
        """An IPRoute in op's namespace (fabric nodes only: ns names come from fab.ns)."""
        node = self._node_of_ns[op["ns"]]
        with self.fab.ipr(node) as ipr:
            yield ipr

    def plan(self, events: list[FailureEvent]) -> list[dict]:
        """The kernel operations of each event, in order, from the current state (which
        is left as it was): what the playback process does at each event's time."""
        with self._lock:
            saved = (copy.deepcopy(self.lanes), set(self.down))
            try:
                steps = []
                for ev in sorted(events):
                    self._mutate(ev)
                    steps.append({"t_s": ev.t_s, "ops": self._transition(
                        ev.a, ev.b, self.rate_mbps(ev.a, ev.b))})
                return steps
            finally:
                self.lanes, self.down = saved

    def prepare_schedule(self, events: list[FailureEvent]) -> FailureRunner:
        """Start the playback process for `events` now and wait until it has loaded and
        opened its sockets (do this before the agents load the CPU); runner.start(
        start_ns) later sets the clock running."""
        runner = FailureRunner(self, events)
        self.runners.append(runner)
        return runner

    def run_schedule(self, events: list[FailureEvent],
                     start_ns: int | None = None) -> FailureRunner:
        """Play `events`, each at start + t_s, where start is `start_ns` (a
        time.monotonic_ns() stamp: the workload's agreed start) or now; returns it started."""
        return self.prepare_schedule(events).start(start_ns)

    # -- record and teardown ----------------------------------------------------------
    def record(self) -> dict:
        """What was configured and how, for metrics.json: never claims what did not run."""
        reasons = {"netem": None,
                   "nftables": f"loss by nftables numgen drop at each receiving port's "
                               f"ingress: {NO_NETEM}",
                   "none": f"loss not emulated: {NO_NETEM} and nftables is unavailable"}
        links = []
        for a, b, data in self.topo.graph.edges(data=True):
            st = self.lanes[self.key(a, b)]
            real_ns, emu_us = self.delay_for(a, b)
            links.append({
                "link": f"{a}:{b}", "tech": data["tech"], "profile": st.profile.name,
                "length_m": data["length_m"], "nominal_rate_mbps": data["rate_mbps"],
                "rate_mbps": self.rate_mbps(a, b), "up": self.key(a, b) not in self.down,
                "lanes": st.lanes, "spare_lanes": st.profile.spare_lanes,
                "failed_lanes": sorted(st.failed), "link_failed": st.link_failed,
                "loss_rate": {f"{a}>{b}": self.configured_loss(a, b),
                              f"{b}>{a}": self.configured_loss(b, a)},
                "delay_real_ns": real_ns, "delay_emulated_us": emu_us,
                "delay_applied_us": ({f"{a}>{b}": self.delay_us.get((a, b), 0.0),
                                      f"{b}>{a}": self.delay_us.get((b, a), 0.0)}
                                     if self.mechanism == "netem" else None)})
        delay = self.delay_mechanism
        if delay == "agent delay line" and not self.path_delays:
            delay = "not emulated"          # no agents were given the paths' delays
        delay_notes = {
            "off": "propagation delay off (experiment.delay)",
            "netem": None,
            "not emulated": f"propagation delay not emulated: {NO_NETEM}",
            "agent delay line": f"propagation delay by the agents' delay line ({NO_NETEM}): "
                                "each path's delay is added at its receiver, so switch "
                                "queues and PFC pauses see none of it"}
        one_way = list(self.path_delays.values())
        return {"mechanisms": {
                    "rate": "htb change-class on both ends; link down = both ends admin down",
                    "loss": self.mechanism, "loss_where": LOSS_WHERE[self.mechanism],
                    "delay": delay},
                "not_emulated": [r for r in (reasons[self.mechanism], delay_notes[delay]) if r],
                "path_delay_ms": ({"pairs": len(one_way),
                                   "min": min(v[1] for v in one_way) / 1e6,
                                   "mean": sum(v[0] for v in one_way) / len(one_way) / 1e6,
                                   "max": max(v[2] for v in one_way) / 1e6}
                                  if one_way else None),
                "frame_bytes": self.frame_bytes, "scale_delay": self.scale_delay,
                "profiles": self.profiles.to_data(), "links": links, "events": list(self.log),
                "events_not_played": [e for r in self.runners for e in r.pending],
                "schedule_errors": [e for r in self.runners for e in r.errors]}

    def remove(self) -> None:
        """Schedules stopped, loss rules gone, failed links back up at nominal rates."""
        for runner in self.runners:
            runner.stop()
        for key, st in self.lanes.items():
            if st.failed or st.link_failed:
                st.failed.clear()
                st.link_failed = False
                self._update(*key, "restore", None)
        if self.mechanism == "nftables":
            for node in sorted(self._nft):
                with contextlib.suppress(RuntimeError, FileNotFoundError):
                    run_nft(self.fab.ns(node), ["delete", "table", NFT_FAMILY, NFT_TABLE])
            self._nft.clear()
        for tx, rx in sorted(self._netem_ports):
            with contextlib.suppress(Exception), self.fab.ipr(tx) as ipr:
                change_netem(ipr, ipr.link_lookup(
                    ifname=self.fab.plan.port(tx, rx).ifname)[0], 0, 0.0)
        self.loss.clear()
        self.delay_us.clear()


class FailureRunner:
    """Plays FailureEvents in a process of its own (fabric/failplay.py), each at
    t0 + event.t_s, and brings each change into the Impairments' state and log.

    t0 is a CLOCK_MONOTONIC time (the workload's agreed start, usually a little in the
    future). Each step is timed from t0, never from the previous one, so delays do not
    add up; each entry says when the change began and when the kernel had it. Events
    still ahead when the runner is stopped (the job ended first) are not played and are
    kept in `pending` (the record lists them): a failed link stays failed in the record.
    While a schedule plays, it owns the links it names: do not change them by hand.
    """

    def __init__(self, imp: Impairments, events: list[FailureEvent]):
        self.imp = imp
        self.events = sorted(events)
        self.applied: list[dict] = []
        self.pending: list[dict] = []
        self.errors: list[str] = []
        self.t0 = 0.0
        self.stopped_s: float | None = None
        self._done: set[int] = set()
        self._reader = threading.Thread(target=self._read, name="failures", daemon=True)
        self._proc = self._spawn(imp.plan(self.events)) if self.events else None

    @staticmethod
    def _spawn(steps: list[dict]) -> subprocess.Popen:
        """The playback process, loaded, sockets open, waiting for "go" (it starts
        niced from the first instruction, so its imports are not starved either)."""
        nice = shutil.which("nice")
        argv = [sys.executable, "-m", "fabric.failplay"]
        proc = subprocess.Popen([nice, "-n", str(PLAYER_NICE), *argv] if nice else argv,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                cwd=str(REPO_ROOT))
        proc.stdin.write((json.dumps({"steps": steps}) + "\n").encode())
        proc.stdin.flush()
        ready = readable(proc.stdout.fileno(), PLAYER_READY_S)
        line = proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            proc.kill()
            proc.wait()
            raise RuntimeError(f"failure playback did not start in {PLAYER_READY_S} s: "
                               f"{line!r}")
        return proc

    @property
    def pid(self) -> int | None:
        """The playback process (None: no events to play)."""
        return self._proc.pid if self._proc is not None else None

    def start(self, start_ns: int | None = None) -> FailureRunner:
        """Run the clock from start_ns (default: now); the player is already waiting."""
        start_ns = start_ns if start_ns is not None else time.monotonic_ns()
        self.t0 = start_ns / 1e9
        self.imp.t0 = self.t0            # the log's t_s on the schedule's axis
        if self._proc is not None:
            self._proc.stdin.write(f"go {start_ns}\n".encode())
            self._proc.stdin.flush()
            self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            step = json.loads(line)
            ev = self.events[step["i"]]
            if step["error"]:
                self.errors.append(f"{ev}: {step['error']}")
            stamps = (step["began_ns"] / 1e9, step["done_ns"] / 1e9)
            entry = self.imp.apply_event(ev, stamps=stamps)
            self._done.add(step["i"])
            self.applied.append({**entry, "scheduled_s": ev.t_s, "at_s": entry["t_s"],
                                 "late_ms": round((entry["t_s"] - ev.t_s) * 1e3, 3)})

    def join(self, timeout_s: float | None = None) -> None:
        """Wait until every event has been played (or `timeout_s`)."""
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout_s)
            self._reader.join(timeout_s)

    def stop(self) -> list[dict]:
        """Stop before the remaining events (kept in `pending`); returns those applied."""
        if self.stopped_s is not None:
            return self.applied
        self.stopped_s = round(time.monotonic() - self.t0, 6)
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()     # the player stops before its next step
            try:
                self._proc.wait(PLAYER_EXIT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if self._reader.is_alive() or self._reader.ident is not None:
                self._reader.join()
            self._proc.stdout.close()
        self.pending = [{**ev.to_data(), "link": f"{ev.a}:{ev.b}", "scheduled_s": ev.t_s,
                         "played": False,
                         "reason": f"the runner stopped at {self.stopped_s} s (job ended)"}
                        for i, ev in enumerate(self.events) if i not in self._done]
        return self.applied


def physics_metrics(imp: Impairments, run_s: float, jobs: dict[str, float] | None = None) -> dict:
    """Everything link physics adds to a run's metrics.json: what was impaired and how,
    link energy of the run and of each job (name -> span in seconds), the cost table."""
    from topologies.physics import cost_table, energy_report
    return {"link_physics": imp.record(),
            "link_energy": energy_report(imp.topo, imp.profiles, run_s, jobs),
            "fabric_cost": cost_table(imp.topo, imp.profiles)}
