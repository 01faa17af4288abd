"""The switch controller: PFC (802.1Qbb) XOFF/XON per ingress port, ECN, DLB, trimming.

What is real and what is emulated:

    switch S, egress port e (lossless queue: tbf 13: under htb class 1:13, fabric.lossless)
      │  bytes into e's queue (by the port they came in by) and out of it, counted by
      │  eBPF programs at tc clsact in the kernel, read from memory every poll_ms
      │  (0.5 ms; fabric.switch_occupancy; fallback: a netlink dump per switch, >= 1 ms)
      ▼
    each ingress port i of S holds the bytes it put into S's queues (FIFO order gives
    whose bytes are still queued); on netlink, a queue's backlog is charged to the
    ingress ports by their upstreams' shares instead
      │  passes XOFF
      ▼
    a real PFC frame (fabric.wire.pfc_frame) leaves S's port i on the wire, through
    the port's qdisc in its control class (served before data; a capture sees it)
      │  U's kernel has no 802.1Qbb MAC: the controller emulates its reaction
      ▼
    U's port toward S holds its lossless class (tbf 13: to a trickle rate); the lossy
    class 1:10 keeps sending. A host's agent then blocks on its socket: the NIC stops.
      │  occupancy falls under XON: a frame with pause time 0, U's class reopens
      ▼  (a refresh frame every half pause; an unrefreshed pause expires with its quanta)

The controller is a process of its own (forked by start(), SCHED_FIFO): as a thread of
the run it waited for the GIL while the samplers parsed netlink dumps (polls 5-60 ms
late). XOFF + headroom must fit per ingress port (fabric.lossless.thresholds_for); every
reaction is measured and the report says when the buffer cannot cover it. PFC off: the
same layout and polling, no pause, the queues overflow. The watchdog reports a port held
over `watchdog_ms` (a storm); with action "drop" the upstream then ignores pauses on that
link for `watchdog_ms`. Per-port state: fabric.switch_ports; report: fabric.switch_report.
"""

from __future__ import annotations

import contextlib
import socket
import time

from pyroute2 import IPRoute

from fabric import netns
from fabric.forked import End, Worker, realtime, take_state
from fabric.lossless import (
    CONTROL_PRIORITY,
    KICK_PRIORITY,
    LOSSLESS_HANDLE,
    PfcMode,
    SwitchSettings,
    Thresholds,
    WatchdogAction,
    hold_message,
    install,
    kick_frame,
)
from fabric.pause_receiver import FAR_LINKS, FarShares, has_far_links
from fabric.qdisc_poller import QdiscPoller
from fabric.queue_counters import CountersUnavailableError, QueueCounters
from fabric.shaping import handle_int
from fabric.switch_lb import SwitchLb
from fabric.switch_occupancy import KernelSource, NetlinkSource, waker_for
from fabric.switch_ports import (
    ControllerTuning,
    Ingress,
    PollClock,
    PortCounters,
    QdiscStats,
    Reaction,
    assumed_reaction_ms,
    charge_occupancy,
    crossing_time,
    ingress_thresholds,
    switch_ports,
)
from fabric.switch_report import report
from fabric.wire import TRIM_DSCP, pfc_frame

__all__ = ["ControllerTuning", "SwitchController", "install", "controller_running"]

ECN_MECHANISM = ("tc clsact eBPF at each switch egress: bpf_skb_ecn_set_ce on the "
                 "kernel-counted occupancy (RED profile)")
TRIM_MECHANISM = (f"tc clsact eBPF at each switch egress: bpf_skb_change_tail cuts a UET "
                  f"data frame to its headers when the kernel-counted queue would pass "
                  f"{{}} B (the smallest port threshold); DSCP {TRIM_DSCP}, control class")
LB_LOAD_POLLS = 4              # a port's load: the bytes it took in over the last 4 polls


class SwitchController:
    """Polls every switch's lossless queues and pauses upstream ports (see module doc);
    loads the ECN, load-balancing and trimming programs the settings ask for.

    start()/stop(); report() afterwards. The controller runs in a process of its own,
    forked by start(), SCHED_FIFO where allowed, and owns every socket it uses: in a
    thread of the run's process it waited for the GIL whenever a sampler parsed a
    netlink dump (poll gaps of 5-60 ms). stop() brings its state back (STATE).
    """

    STATE = ("ingress", "counters", "reactions", "storms", "timeline", "calibration",
             "errors", "t0", "clock", "cpu_s", "wall_s", "ecn_marks", "lb_steered", "trims",
             "sleeps", "slept_s", "kernel_wakes", "wake_lags")

    def __init__(self, fab, settings: SwitchSettings, tuning: ControllerTuning | None = None):
        if settings.mode is PfcMode.NONE:
            raise ValueError("PFC mode '' has no lossless class to control")
        self.fab = fab
        self.settings = settings
        self.tuning = tuning or ControllerTuning()
        g = fab.topo.graph
        # every forwarding node is PFC-capable: switches, and rail-only's PXN-relaying
        # GPUs (NVLink-switched servers, whose forwarding is flow-controlled too)
        self.switches = [n for n in fab.here if g.nodes[n].get("forwards")]
        self.ingress: list[Ingress] = []
        self.counters: dict[tuple[str, str], PortCounters] = {}
        self.reactions: list[Reaction] = []
        self.storms: list[dict] = []
        self.timeline: list[dict] = []
        self.calibration: dict = {}
        self.errors: list[str] = []
        self.ecn_marks: dict[str, int] = {}            # switch port -> frames marked CE
        self.lb_steered: dict[str, int] = {}           # switch port -> frames steered to
        self.trims: dict[str, int] = {}                # switch port -> frames trimmed
        self.lb: SwitchLb | None = None                # fabric.switch_lb, if not ecmp
        self._stopping = False
        self._worker: Worker | None = None           # the run's side (fabric.forked)
        self._end: End | None = None                 # the controller's side
        self._manual: list[tuple[str, str, bool]] = []
        self.t0 = 0.0
        self.clock = PollClock()
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.waker = None                 # the kernel wakes it from sleep (or None: polls)
        self.sleeps, self.slept_s, self.kernel_wakes = 0, 0.0, 0
        self.wake_lags: list[float] = []  # s from the first byte to the controller awake
        self.pollers: dict[str, QdiscPoller] = {}
        self.frame_socks: dict[tuple[str, str], socket.socket] = {}   # switch ports
        self.kick_socks: dict[tuple[str, str], socket.socket] = {}    # their upstreams
        self.index: dict[str, dict[str, int]] = {}
        self.source: KernelSource | NetlinkSource | None = None   # fabric.switch_occupancy
        self.far: FarShares | None = None  # shares of upstreams on other machines
        self.hot: set[str] = set()        # switches charged or holding a pause
        self.period_s = self.settings.pfc_poll_ms / 1e3

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> SwitchController:
        self._worker = Worker(self._run, "pfc", self.tuning.own_process).start()
        return self

    def stop(self) -> None:
        """End the controller (it releases every pause first) and take back its state."""
        take_state(self._worker, self, "the PFC controller")

    @property
    def pid(self) -> int | None:
        """The controller's process while it runs (None as a thread)."""
        return self._worker.pid if self._worker is not None else None

    def __enter__(self) -> SwitchController:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def pause(self, switch: str, ifname: str, on: bool = True) -> None:
        """Force a pause (on) or its end on one switch ingress port (tests, demos)."""
        self._worker.send(("pause", switch, ifname, on))

    def report(self) -> dict:
        """What ran and what happened (JSON-ready; the timeline is `self.timeline`)."""
        return report(self)

    # -- setup, in the controller's process ------------------------------------------------
    def _run(self, end: End) -> None:
        self._end = end
        end.detach()
        cpu_time = time.process_time if end.own_process else time.thread_time
        try:
            self._open()
        except BaseException as exc:
            self._close()
            end.failed(exc)
            return
        why = realtime(self.tuning.rt_priority)
        self.calibration["realtime"] = why is None and self.tuning.rt_priority is not None
        if why:
            self.errors.append(f"{why}; reaction times suffer")
        self.t0 = time.monotonic()
        end.ready()
        cpu0 = cpu_time()
        try:
            self._loop()
        except BaseException as exc:  # reported, never silent
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            for ing in self.ingress:       # nothing stays held after the run
                if ing.paused:
                    with contextlib.suppress(Exception):
                        self._release(ing, time.monotonic(), frame=True)
            self.cpu_s = cpu_time() - cpu0
            self.wall_s = time.monotonic() - self.t0
            if isinstance(self.source, KernelSource) and self.settings.marking:
                self.ecn_marks = self._per_switch_port(self.source.queues.marks)
            if self.lb is not None:
                self.lb_steered = self._per_switch_port(self.source.queues.steered)
            if isinstance(self.source, KernelSource) and self.source.queues.trim:
                self.trims = self._per_switch_port(self.source.queues.trimmed)
            if self.waker is not None:
                self.kernel_wakes = self.waker.wakes()
            self._close()
        end.finish({name: getattr(self, name) for name in self.STATE})

    def _open(self) -> None:
        """Netlink sockets per node, thresholds and frames per switch port, the sockets
        that send frames (switch side) and kicks (upstream side)."""
        macs: dict[str, dict[str, str]] = {}
        for node in self.fab.here:          # this machine's nodes
            with netns.entered(self.fab.ns(node)):
                self.pollers[node] = QdiscPoller(handle_int(LOSSLESS_HANDLE))
                with IPRoute() as ipr:
                    links = ipr.get_links()
            self.index[node] = {lk.get_attr("IFLA_IFNAME"): lk["index"] for lk in links}
            macs[node] = {lk.get_attr("IFLA_IFNAME"): lk.get_attr("IFLA_ADDRESS")
                          for lk in links}
            for port in self.fab.plan.ports[node]:
                self.counters[(node, port.ifname)] = PortCounters()
        self.source = self._source()
        self.period_s = max(self.settings.pfc_poll_ms, self.source.min_period_ms) / 1e3
        self.calibration["occupancy_from"] = self.source.name
        self.waker, self.calibration["sleep"] = waker_for(self.source, self.lb is not None)
        self._calibrate()
        self.ingress = switch_ports(self.fab, self.switches, self.index, self.settings,
                                    self.tuning, self.calibration["reaction_ms_assumed"])
        prio, quanta = self.settings.traffic_class.priority, self.tuning.quanta
        self.frames = {}
        for ing in self.ingress:
            port, up_port = (ing.switch, ing.ifname), (ing.upstream, ing.up_ifname)
            self.frame_socks[port] = self._packet_socket(*port, CONTROL_PRIORITY)
            if not ing.remote:
                self.kick_socks[up_port] = self._packet_socket(*up_port, KICK_PRIORITY,
                                                               blocking=False)
            mac = macs[ing.switch][ing.ifname]
            self.frames[port] = (pfc_frame(mac, {prio: quanta}), pfc_frame(mac, {prio: 0}))
        self.kick_frame = kick_frame()
        self.far = FarShares(self.fab, self.ingress)     # upstreams on other machines
        self.by_port = {(i.switch, i.ifname): i for i in self.ingress}
        self.by_switch: dict[str, list[Ingress]] = {}
        for ing in self.ingress:
            self.by_switch.setdefault(ing.switch, []).append(ing)

    def _source(self) -> KernelSource | NetlinkSource:
        """The kernel's eBPF counters on every port where they load (switch ports first),
        else a netlink dump per switch each poll."""
        why = "eBPF counters off in the controller tuning"
        if far := has_far_links(self.fab, self.index):
            why = FAR_LINKS
        marking = self.settings.marking
        if self.tuning.kernel_counters and not far:
            plan, graph = self.fab.plan, self.fab.topo.graph
            order = sorted(plan.ports, key=lambda n: n not in self.switches)
            ports = [(n, p.ifname) for n in order for p in plan.ports[n]]
            limits = [graph.edges[n, p.peer]["queue_bytes"] for n in order
                      for p in plan.ports[n]]
            trim = {k: self.settings.trim_at(limit) for k, ((n, _), limit)
                    in enumerate(zip(ports, limits, strict=True)) if n in self.switches}
            try:
                queues = QueueCounters(self.fab, ports, self.settings.traffic_class.dscp,
                                       attribute=frozenset(self.switches), ecn=marking,
                                       trim={k: t for k, t in trim.items() if t},
                                       wake=self.tuning.sleep).attach()
            except CountersUnavailableError as exc:
                why = str(exc)
            else:
                self.calibration["ecn"] = ECN_MECHANISM if marking else "off"
                self.calibration["trimming"] = (TRIM_MECHANISM.format(
                    min(t.threshold_bytes for t in queues.trim.values()))
                    if queues.trim else "off")
                source = KernelSource(queues, self.pollers, self.index, limits)
                self._switch_lb(queues, source)
                return source
        if self.settings.switch_lb != "ecmp":     # never faked either
            self._lb_unavailable(why)
        if self.settings.trimming == "on":
            self.calibration["trimming"] = f"unavailable: {why}"
            self.errors.append(f"packet trimming did not run, full queues dropped: {why}")
        if marking:      # never faked: the run says it did not mark, and why
            self.calibration["ecn"] = f"unavailable: {why}"
            self.errors.append(f"ECN marking did not run: {why}")
        return NetlinkSource(self.pollers, self.switches, why)

    def _packet_socket(self, node: str, ifname: str, priority: int,
                       blocking: bool = True) -> socket.socket:
        """A raw socket on a port whose frames take the class `priority` names: they go
        through the port's qdisc, so a capture on the port sees what it sends."""
        with netns.entered(self.fab.ns(node)):
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, priority)
        sock.bind((ifname, 0))
        sock.setblocking(blocking)
        return sock

    def _close(self) -> None:
        for closable in [*self.pollers.values(), *self.frame_socks.values(),
                         *self.kick_socks.values()]:
            closable.close()
        if self.lb is not None:
            self.lb.close()
        if self.source is not None:
            self.source.close()
        if self.far is not None:
            self.far.close()

    def _switch_lb(self, queues: QueueCounters, source: KernelSource) -> None:
        """The switches' own egress choice (fabric.switch_lb) on the counters' map, and
        the port loads it reads, written at every poll."""
        mode = self.settings.switch_lb
        if mode == "ecmp":
            self.calibration["switch_lb"] = "ecmp: the kernel's multipath hash"
            return
        try:
            self.lb = SwitchLb(self.fab, queues, self.switches, mode,
                               int(self.settings.switch_lb_gap_us * 1000)).attach()
        except OSError as exc:
            self._lb_unavailable(str(exc))
            return
        source.track_load(LB_LOAD_POLLS)
        self.calibration["switch_lb"] = (
            f"{mode}: tc clsact eBPF at every switch ingress picks the least-loaded of "
            f"the equal-cost next hops (queued bytes + bytes sent in the last "
            f"{LB_LOAD_POLLS} polls) and steers the kernel's multipath choice with "
            f"bpf_set_hash; {self.lb.routes} multipath routes")

    def _lb_unavailable(self, why: str) -> None:
        self.calibration["switch_lb"] = f"unavailable: {why}"
        self.errors.append(f"switch load balancing ({self.settings.switch_lb}) did not run, "
                           f"the kernel's ECMP did: {why}")

    def _per_switch_port(self, count) -> dict[str, int]:
        """{"switch:port": count(slot)} for every switch port of the kernel counters."""
        return {f"{sl.node}:{sl.ifname}": count(sl.index)
                for sl in self.source.queues.slots if sl.ingress_ports}

    def _calibrate(self, rounds: int = 20) -> None:
        """Time a poll of every switch and one tc change: the assumed reaction time."""
        sw = self.switches or list(self.pollers)
        cycle = _mean_s(lambda: [self.pollers[s].poll() for s in sw], rounds)
        read = _mean_s(self.source.read, rounds)        # what each poll really reads
        node = sw[0]
        port = self.fab.plan.ports[node][0]
        edge = self.fab.topo.graph.edges[node, port.peer]
        reopen = hold_message(self.index[node][port.ifname], edge["rate_mbps"],
                              edge["queue_bytes"], held=False)   # no change in behaviour
        change = _mean_s(lambda: self.pollers[node].request(reopen), 5)
        # kernel counters: the reaction the buffers were planned for (lossless_plan; a
        # loaded start-up read 1.2 ms, not 0.02); netlink: the slower of the two
        planned = assumed_reaction_ms(self.period_s * 1e3)
        measured = assumed_reaction_ms(self.period_s * 1e3, (read + change) * 1e3)
        assumed = self.tuning.reaction_ms or (planned if self.source.exact
                                              else max(planned, measured))
        self.calibration |= {"poll_ms": round(self.period_s * 1e3, 3),
                            "poll_cycle_ms": round(cycle * 1e3, 3),
                            "read_ms": round(read * 1e3, 3),
                            "tc_change_ms": round(change * 1e3, 3),
                            "reaction_ms_assumed": round(assumed, 3),
                            "reaction_ms_from_start_up": round(measured, 3),
                            "switches_polled": len(sw)}

    # -- the loop --------------------------------------------------------------------------
    def _loop(self) -> None:
        """Each period: every switch's backlog (fabric.switch_occupancy), XOFF/XON decided;
        every port's statistics when the upstream shares (share_ms) or the timeline
        (sample_ms) are due."""
        period = self.period_s
        share_every = self.tuning.share_ms / 1e3
        sample_every = self.tuning.sample_ms / 1e3
        next_share = next_sample = next_poll = time.monotonic()
        if self.source.exact:       # whose bytes they are is counted: no shares needed
            next_share = float("inf")
        last_share = t_prev = None
        while not self._stopping:
            now = time.monotonic()
            queued = self.source.read()
            self._evaluate(queued, now, t_prev)
            self._manual_requests(now)
            if now >= next_share or now >= next_sample:
                stats = self.source.stats()
                if now >= next_share:
                    self._update_shares(stats, now - last_share if last_share else None)
                    last_share, next_share = now, now + share_every
                if now >= next_sample:
                    self._sample(stats, now)
                    next_sample = now + sample_every
            self.clock.note(now, period, self.t0)
            t_prev = now
            if self.waker is not None and not queued and not self.hot and not self._manual:
                woke = self._sleep(min(next_share, next_sample))
                if woke is not None:        # the first byte's time: the last poll saw none
                    t_prev = next_poll = woke
                    continue
            next_poll += period
            delay = next_poll - time.monotonic()
            if delay > 0:
                self._inbox(delay)
            else:
                next_poll = time.monotonic()
                self._inbox(0)
        self._sample(self.source.stats(fresh=True), time.monotonic())

    def _sleep(self, until: float) -> float | None:
        """No switch holds a lossless byte and no pause is held: sleep until one is
        enqueued (the kernel wakes us, fabric.queue_wake), the run asks, or `until` (the
        next timeline sample). When it woke: the first byte's time, else now; the gap
        from the first byte to the next poll is a poll gap like any other. None if a
        byte came in while it armed (it polls on)."""
        if not self.source.arm():
            return None
        t = time.monotonic()
        self._inbox(max(0.0, until - t), also=self.waker.fileno())
        first = self.source.disarm()
        woke = time.monotonic()
        self.sleeps += 1
        self.slept_s += woke - t
        if first is not None:
            self.wake_lags.append(woke - first)
        self.clock.last = first if first is not None else woke
        return self.clock.last

    def _inbox(self, timeout: float, also: int | None = None) -> None:
        """Wait up to `timeout` s for the run's requests (pause; stop ends the loop), or
        until the fd `also` is readable."""
        for msg in self._end.wait(timeout, also):
            if msg[0] == "pause":
                self._manual.append(msg[1:])
        self._stopping = self._end.stopping

    def _update_shares(self, stats: dict[str, dict[int, QdiscStats]],
                       dt: float | None) -> None:
        for ing in self.ingress:
            got = stats.get(ing.upstream, {}).get(ing.up_index)
            if got is not None:
                ing.update_weight(got[2], dt)
        self.far.update(dt)

    def _evaluate(self, queued: dict[str, dict[int, int]], now: float,
                  t_prev: float | None) -> None:
        """Switches with bytes queued, and those still charged or holding a pause
        (`hot`); an idle switch with nothing held has nothing to decide. The source says
        whose bytes they are (exact) or only where they wait (charged by shares)."""
        exact = self.source.exact
        for s in [*queued, *(h for h in self.hot if h not in queued)]:
            ports = self.by_switch.get(s)
            if ports is None:
                continue
            got = queued.get(s, {})
            if exact:
                for i in ports:
                    i.prev_occupancy, i.occupancy = i.occupancy, got.get(i.index, 0)
            else:
                charge_occupancy(ports, got)
            for i in ports:
                i.peak_occupancy = max(i.peak_occupancy, i.occupancy)
            if self.settings.enabled:
                for i in ports:
                    self._step(i, now, t_prev)
            if any(i.paused or i.occupancy for i in ports):
                self.hot.add(s)
            else:
                self.hot.discard(s)

    def _step(self, ing: Ingress, now: float, t_prev: float | None) -> None:
        th, watchdog_ms = ing.thresholds, self.settings.pfc_watchdog_ms
        if now < ing.watchdog_until:
            return
        if not ing.paused:
            if ing.occupancy >= th.xoff_bytes:
                self._xoff(ing, now, t_prev)
            return
        held_s = now - ing.paused_since
        if held_s * 1e3 > watchdog_ms and not ing.storm_reported:
            ing.storm_reported = True
            action = WatchdogAction(self.settings.pfc_watchdog_action)
            self.storms.append({"switch": ing.switch, "ifname": ing.ifname,
                                "upstream": ing.upstream, "up_ifname": ing.up_ifname,
                                "t_s": round(now - self.t0, 4),
                                "paused_ms": round(held_s * 1e3, 1), "action": str(action)})
            if action is WatchdogAction.DROP:
                self._release(ing, now, frame=True)
                ing.watchdog_until = now + watchdog_ms / 1e3
                return
        if ing.occupancy <= th.xon_bytes:
            self._release(ing, now, frame=True)
        elif now - ing.last_frame >= ing.pause_s / 2:
            self._send(ing, xoff=True, now=now)       # refresh before the quanta expire

    def _send(self, ing: Ingress, xoff: bool, now: float, frame: bytes = b"") -> bool:
        port = (ing.switch, ing.ifname)      # `frame`: a VOQ pause, else the port's own
        c = self.counters[port]
        ing.last_frame = now
        try:
            self.frame_socks[port].send(frame or self.frames[port][0 if xoff else 1])
        except OSError as exc:        # the control queue refused it: never on the wire
            c.send_errors += 1
            if c.send_errors == 1:
                self.errors.append(f"{ing.switch}:{ing.ifname}: pause frame not sent: {exc}")
            return False
        c.frames_sent += 1
        c.xoff_frames += xoff
        c.xon_frames += not xoff
        if not ing.remote:      # else its own machine counts it
            self.counters[(ing.upstream, ing.up_ifname)].frames_received += 1
        return True

    def _xoff(self, ing: Ingress, now: float, t_prev: float | None) -> None:
        if ing.remote:       # the frame is on its way; the far machine holds the class
            self._send(ing, xoff=True, now=now)
            ing.paused, ing.paused_since, ing.storm_reported = True, now, False
            return
        # the hold first: a send runs this CPU's pending softirqs (forwarding) here
        self.pollers[ing.upstream].request(ing.hold_msgs[1])
        t_done = time.monotonic()
        self._send(ing, xoff=True, now=now)
        t_frame = time.monotonic()
        ing.paused, ing.paused_since, ing.storm_reported = True, now, False
        if t_prev is not None:
            crossing = crossing_time(ing, t_prev, now)
            self.reactions.append(Reaction(
                ing.switch, ing.ifname, round(now - self.t0, 4),
                (t_done - crossing) * 1e3, (t_done - t_prev) * 1e3,
                (t_frame - crossing) * 1e3))

    def _release(self, ing: Ingress, now: float, frame: bool) -> None:
        if frame:
            self._send(ing, xoff=False, now=now)
        if ing.remote:
            ing.paused = False
            return
        self.pollers[ing.upstream].request(ing.hold_msgs[0])
        with contextlib.suppress(OSError):   # run the upstream's qdisc again
            self.kick_socks[(ing.upstream, ing.up_ifname)].send(self.kick_frame)
        ing.paused = False
        self.counters[(ing.upstream, ing.up_ifname)].paused_s += now - ing.paused_since

    def _manual_requests(self, now: float) -> None:
        todo, self._manual = self._manual, []
        for switch, ifname, on in todo:
            ing = self.by_port.get((switch, ifname))
            if ing is None:
                self.errors.append(f"pause({switch}:{ifname}): not a switch port PFC controls")
                continue
            if on and not ing.paused:
                self._xoff(ing, now, None)
                ing.watchdog_until = 0.0
            elif not on and ing.paused:
                self._release(ing, now, frame=True)
            self.hot.add(switch)
            if on:     # a forced pause stays until pause(..., on=False)
                ing.thresholds = Thresholds(0, -1, ing.thresholds.headroom_bytes,
                                            ing.thresholds.ok, "forced",
                                            ing.thresholds.covers_ms)
            else:
                ing.thresholds = ingress_thresholds(
                    self.fab.topo, ing.switch, ing.upstream, self.settings,
                    self.calibration["reaction_ms_assumed"])

    def _sample(self, stats: dict, now: float) -> None:
        t = round(now - self.t0, 4)
        held = {(i.upstream, i.up_ifname): i for i in self.ingress if i.paused}
        for node, ports in self.fab.plan.ports.items():
            st = stats.get(node)
            if st is None:
                continue
            for port in ports:
                got = st.get(self.index[node].get(port.ifname, -1))
                if got is None:
                    continue
                c = self.counters[(node, port.ifname)]
                c.note_queue(*got)
                ing = held.get((node, port.ifname))
                self.timeline.append(c.row(t, node, port.ifname, paused=ing is not None,
                                           paused_s=c.paused_s + (now - ing.paused_since
                                                                  if ing else 0.0)))


def _mean_s(fn, rounds: int) -> float:
    t0 = time.perf_counter()
    for _ in range(rounds):
        fn()
    return (time.perf_counter() - t0) / rounds


@contextlib.contextmanager
def controller_running(fab, settings: SwitchSettings,
                       tuning: ControllerTuning | None = None, install_layout: bool = True):
    """Install the lossless layout for the settings' traffic class, run the controller for
    the block, stop it."""
    if install_layout:
        install(fab, settings.traffic_class)
    ctl = SwitchController(fab, settings, tuning).start()
    try:
        yield ctl
    finally:
        ctl.stop()
