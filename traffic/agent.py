"""Endpoint agent: one per endpoint, its sockets opened inside the endpoint's namespace;
traffic.host serves one or several of them from one process and event loop.

    config (traffic.agent_config) ─▶ AgentFlows (traffic.flows: flows, steps, templates)
        ─▶ turn() (traffic.host calls it: traffic, timers, its own wake-up time):
        UDP socket (loopback, 4791)  ── data ──▶ receiver state ──▶ ACK / NAK / SACK out
                                     ── ACKs ──▶ sender state (window, go-back-N / SACK)
        Port per egress (traffic.port) ◀── patched frames, flows interleaved round-robin
    ─▶ results (flows, iterations, one-way latency samples, CPU seconds, drops)

One-way latency (every `latency_sample_every`-th data packet to arrive for a flow,
resends and duplicates included: each carries its own send stamp) runs from the
sender's stamp in the payload to the kernel's receive timestamp of the datagram (taken
when the frame entered this namespace; traffic.rx), so neither the agent's own
scheduling nor its interrupt moderation (`coalesce_frames`) is counted as network time.

The hot path never calls scapy: a data packet is one template patch (PSN, UDP source
port, stamp, ICRC) and one send(2); a received datagram is one recv_into(2) (compiled:
a share of one recvmmsg(2)), one struct unpack and one state-machine call. Ports are
non-blocking and keep what they cannot send yet (traffic.port), so no frame is dropped
at the sender.

What a busy machine must not turn into loss: the receive socket's buffer holds every
window of every peer at once (`AgentConfig.rcvbuf_bytes`), so it cannot overflow however long the
agent is descheduled (its kernel drop count is reported apart: `rx_socket_drops`,
host-side, never fabric loss); and retransmission timers run only once the queued
datagrams are read, so a descheduled sender does not take its own unread ACKs for loss.

Once everything is done the agent lingers (`linger_ms`, extended while data still
arrives) to re-ACK resends whose ACK was lost; then its turn says it is done.
"""

from __future__ import annotations

import struct
from collections import deque
from contextlib import nullcontext

from fabric import netns
from fabric.wire import TRIMMED_UDP_PAYLOAD
from traffic.agent_config import (
    MSN_MASK,
    AgentConfig,
    cpu_seconds,
    udp_counters,
)
from traffic.cc import agent_results as dcqcn_results
from traffic.cc import held_cnps
from traffic.flows import AgentFlows, RecvFlow
from traffic.nscc import agent_results as nscc_results
from traffic.packets import (
    BTH_BYTES,
    ICRC_BYTES,
    PSN_MASK,
    QPN_MASK,
    Opcode,
    now_ns,
)
from traffic.port import OFFSET_MASK, Port, any_blocked, any_pending, nic_ports
from traffic.rx import DelayLine, RxSocket
from traffic.transport import NO_ACTION, make_receiver
from traffic.transport_settings import STAMP_BYTES

RX_BATCH = 256                      # datagrams per drain before sending again
PUMP_BATCH = 64                     # data frames per pump before receiving again
TIMER_MAX_NS = 5_000_000            # reading may hold due timers up this long at most
TIMER_IDLE_NS = 50_000_000          # timers are looked at least this often (a safety net:
                                    # every deadline also sets the timer when it arises)
LAG_SAMPLES_MAX = 20_000            # timer-lag samples kept (the latest)
RX_ALLOWANCE_NS = 100_000           # a wake-up's own cost: a datagram later than
                                    # moderation plus this waited on the emulator
LAG_SAMPLES_REPORTED = 2_000        # ... and reported, evenly spread over those
DATA_MIN = BTH_BYTES + STAMP_BYTES + ICRC_BYTES
ACK_BYTES, SACK_ACK_BYTES = 20, 32
OP_ACK = int(Opcode.RC_ACK)
OP_CNP = int(Opcode.CNP)
CNP_HEAD = struct.Struct(">4xI")          # the BTH's destination QP word
DATA_HEAD = struct.Struct(">xB6xIQII")    # flags, PSN word, stamp (ts_ns, msg_id, offset)
ACK_HEAD = struct.Struct(">8xII")         # PSN word, AETH
SACK_HEAD = struct.Struct(">8xIIIQ")      # PSN word, AETH, SACK base word, bitmap


def used_ports(f) -> list[Port]:
    """The ports a sending flow's frames take: the one its fixed entropy hashes to (an
    ECMP flow on a host with a port per plane), else all of them (spraying, flowlets).
    Only those wait on the agent when the flow could send: marking the others counted
    their idle wire as starvation (22 % of a 4-rank ring on 2 planes)."""
    ports, fixed = f.ports, f.entropy.fixed
    return ports if fixed is None or len(ports) == 1 else [ports[fixed % len(ports)]]


class Agent:
    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.params = cfg.params
        self.ports: dict[str, Port] = {}
        self.rx: RxSocket | None = None
        self.plan: AgentFlows | None = None
        self.latency: list[list] = []
        self.unknown_packets = 0
        self.bad_packets = 0
        self.udp_before: dict[str, int] = {}
        self.started_ns = 0
        self.wakeups = 0                # of its process (traffic.host), while it ran
        self.wakeups_until_done: int | None = None
        self.done_cpu_s: float | None = None     # its process's CPU and clock when
        self.done_wall_ns: int | None = None     # its workload was done
        self.turns = 0                  # turn() calls: its own share of those wake-ups
        # How late the agent woke against when it meant to: timed naps and timeouts, and
        # datagrams the kernel held longer than moderation allows (rx_allowance_ns).
        self.timer_lag_ns: deque[int] = deque(maxlen=LAG_SAMPLES_MAX)
        self.host_lags = None             # its process's naps and timed wake-ups (how
        self.host_lags_end = 0            # late, ns): traffic.host's, while it ran
        self.rx_allowance_ns = cfg.coalesce_ns + RX_ALLOWANCE_NS
        # (step, ns) from the datagram that completed a step's receives (its kernel
        # stamp), or the wire's last frame if later, to the next step's start: the
        # emulator's reaction on the critical path (_steps_started)
        self.step_lag_ns: list[tuple[int, int]] = []
        # (step, ns) the wire time its ports were starved from a step's start to the
        # next one's: the most starved rank's, step by step, is the job's delay
        self.step_starved_ns: list[tuple[int, int]] = []
        self._step_mark = (0, 0.0)      # the current step, the ports' starved_ns then
        self.rx_empty = True            # the last drain emptied the receive queue
        self.line: DelayLine | None = None   # propagation delay, where netem is missing
        # CE marks read from each datagram's TOS byte: DCQCN answers them with CNPs
        # (traffic.cc), NSCC echoes them in ACKs (traffic.nscc), if the switches mark
        self.read_tos = cfg.cc == "dcqcn" or (cfg.cc == "nscc" and bool(cfg.nscc["ecn"]))
        self.ce_packets = self.cnps_sent = self.cnps_received = self.cnps_unknown = 0
        self.timer_due = False          # a CNP started a QP's timers: run them soon
        self.pace_ns: int | None = None     # when a paced QP may send again
        # a turn's budgets: traffic.host shares them out where it serves several agents
        self.rx_batch, self.pump_batch = RX_BATCH, PUMP_BATCH

    # -- setup -------------------------------------------------------------------------
    def inside(self):
        """This agent's namespace entered (`namespace`: its path; "": the process's own)."""
        return netns.entered_path(self.cfg.namespace) if self.cfg.namespace else nullcontext()

    def open(self) -> None:
        """Sockets, inside the agent's namespace (they stay there), and templates."""
        cfg = self.cfg
        with self.inside():
            # a delay line takes each datagram with its sender (RxSocket.hold_all): no batches
            self.rx = RxSocket(cfg.loopback, cfg.rcvbuf_bytes,
                               batched=not any(cfg.rx_delay_ns.values()))
            if self.read_tos:
                self.rx.read_tos()
            self.ports = nic_ports(cfg)
            self.udp_before = udp_counters()
        self.port_list = list(self.ports.values())
        self.plan = AgentFlows(cfg, self.ports)
        if any(cfg.rx_delay_ns.values()):
            self.line = DelayLine({cfg.peers[p]: ns for p, ns in cfg.rx_delay_ns.items()})

    def close(self) -> None:
        for port in self.ports.values():
            port.close()
        if self.rx is not None:
            self.rx.close()

    # -- the hot paths -----------------------------------------------------------------
    # _drain_rx, _pump and run are long on purpose: each binds what it uses per packet
    # to locals once and handles a packet inline, since a Python call per packet (a
    # helper per opcode, per port) costs several percent of the agent's CPU on 2 cores.
    def _drain_rx(self) -> bool:
        """Handle queued datagrams (up to `rx_batch`); True if any data arrived."""
        rxs = self.rx
        plan = self.plan
        recv_by_msg, send_by_msn = plan.recv_by_msg, plan.send_by_msn
        unpack_data, unpack_ack, unpack_sack = (DATA_HEAD.unpack_from, ACK_HEAD.unpack_from,
                                                SACK_HEAD.unpack_from)
        clock = now_ns
        now = clock()
        payload = self.cfg.payload_bytes
        sample_every = self.cfg.latency_sample_every
        got_data = False
        self.rx_empty = False
        line = self.line
        if line is not None:
            self._hold(now)
        fresh = self.cfg.cc == "nscc"   # its RTT samples: each ACK's own time, not the drain's
        ce = False
        first = True
        # the constants as locals: compiled, C integers (traffic/agent.pxd)
        psn_mask, offset_mask, msn_mask, no_action = PSN_MASK, OFFSET_MASK, MSN_MASK, NO_ACTION
        op_ack, op_cnp, data_min, trimmed_bytes = OP_ACK, OP_CNP, DATA_MIN, TRIMMED_UDP_PAYLOAD
        ack_bytes, sack_bytes, framing = ACK_BYTES, SACK_ACK_BYTES, BTH_BYTES + ICRC_BYTES
        left = self.rx_batch
        got = i = 0
        while left > 0:
            left -= 1
            if line is None:
                if i == got:    # the last read is handled: read what waits (a batch)
                    got = rxs.read(left + 1)
                    i = 0
                    if not got:
                        self.rx_empty = True
                        break
                rbuf = rxs.datagram(i)
                i += 1
                n = rxs.length
                ce = rxs.ce_mark
                if rxs.truncated:
                    self.bad_packets += 1
                    continue
                if first:   # the oldest datagram waiting: how late is the agent to it?
                    first = False
                    self.timer_lag_ns.append(now - rxs.arrival_ns() - self.rx_allowance_ns)
            else:           # what the delay line releases, as if it arrived just now
                item = line.pop(now)
                if item is None:
                    self.rx_empty = True
                    break
                due, rbuf, ce = item
                n = len(rbuf)
            op = rbuf[0]
            if op == op_ack:
                if n >= sack_bytes:
                    psnw, aeth, basew, bitmap = unpack_sack(rbuf)
                elif n >= ack_bytes:
                    psnw, aeth = unpack_ack(rbuf)
                    basew = bitmap = 0
                else:
                    self.bad_packets += 1
                    continue
                sf = send_by_msn.get(aeth & msn_mask)
                if sf is None or sf.end_ns is not None:
                    continue
                tx = sf.tx
                tx.on_ack(clock() if fresh else now, aeth >> 24, psnw & psn_mask,
                          basew & psn_mask, bitmap, basew >> 24)   # CE marks echoed (nscc)
                if tx.done:
                    plan.active.remove(sf)
                    self._flow_done(sf, None if line is None else due)
                continue
            if op == op_cnp:
                cc = plan.cc_by_qpn.get(CNP_HEAD.unpack_from(rbuf)[0] & QPN_MASK)
                if cc is None:
                    self.cnps_unknown += 1
                    continue
                self.cnps_received += 1
                cc.on_cnp(now)
                self.timer_due = True
                continue
            if n < data_min:
                if n != trimmed_bytes or not self._trimmed(rbuf, now):
                    self.bad_packets += 1
                continue
            flags, psnw, ts, msg, offset = unpack_data(rbuf)
            f = recv_by_msg.get(msg)
            if f is None:
                self.unknown_packets += 1
                continue
            got_data = True
            psn = psnw & psn_mask
            wire = n - framing - ((flags >> 4) & 3)
            if offset != (psn * payload) & offset_mask or wire != (
                    f.last_wire if psn == f.npackets - 1 else payload):
                self.bad_packets += 1
                continue
            rx = f.rx or self._receiver(f, now)
            f.last_ns = now
            if ce:
                rx.ce_marks += 1     # a UET ACK echoes them (cc = nscc)
            action = rx.on_data(psn, psnw >> 31, ts)
            f.samples += 1
            if f.samples % sample_every == 0:
                self.latency.append([f.tag, f.iteration,
                                     (rxs.arrival_ns() if line is None else due) - ts])
            if action != no_action:
                self._send_ack(f, rx, action, now)
            if ce:
                self.ce_packets += 1
                if f.gate is not None and f.gate.on_ce(now):
                    self._send_cnp(f, now)
            if rx.complete and f.end_ns is None:
                self._flow_done(f, None if line is None else due)
        if got_data:    # an ACK may be owed from now: the delayed-ACK timer must see it
            due = now + self.params.ack_delay_ns
            if due < self.timer_ns:
                self.timer_ns = due
        return got_data

    def _flow_done(self, f, due: int | None) -> None:
        """`f` is done with the datagram just read (`due`: its delay line's release,
        None: its kernel stamp): the steps it gated start (_steps_started)."""
        plan = self.plan
        first = len(plan.active)
        plan.flow_done(f, now_ns())
        if len(plan.active) > first:
            self._steps_started(first, self.rx.arrival_ns() if due is None else due)

    def _steps_started(self, first: int, at: int) -> None:
        """A datagram that arrived `at` (the kernel's stamp) completed what gated the
        flows from plan.active[first:] on: their ports have had demand since then, so
        the wire idle between `at` and the agent's first frame of them counts as
        starvation (Port), and the reaction time is recorded (`step_lag_ns`). Without
        this a ring whose every step waits on a late agent looked faithful at 1.5x
        ideal: its ports stood idle only between steps, when no flow was ready. The lag
        counts from the later of `at` and the ports' last frame leaving (their wire
        clock): while they still send the last step, the agent's delay costs nothing."""
        step = self.plan.next_step - 1
        ports = [p for f in self.plan.active[first:] for p in used_ports(f)]
        ready = max([at] + [p.wire.drain_at for p in ports])
        self.step_lag_ns.append((step, now_ns() - ready))
        self._mark_step(step)
        for p in ports:
            p.waiting(at, ready=True)

    def _mark_step(self, step: int | None) -> None:
        """The starvation since the last step started is that step's; `step` starts."""
        last, then = self._step_mark
        starved = sum(p.starved_ns for p in self.port_list)
        self.step_starved_ns.append((last, int(starved - then)))
        self._step_mark = (step, starved)

    def _receiver(self, f: RecvFlow, now: int):
        """The receiver state of `f`, made at its first packet."""
        f.rx = make_receiver(self.cfg.transport, f.size_bytes, self.cfg.payload_bytes,
                             self.params)
        f.start_ns = now
        self.plan.receiving.append(f)
        return f.rx

    def _trimmed(self, rbuf: bytearray, now: int) -> bool:
        """A UET data packet a switch cut to its headers (fabric.trimming): NAK its PSN
        at once. False if it is no such packet."""
        _, psnw, _, msg, offset = DATA_HEAD.unpack_from(rbuf)
        f = self.plan.recv_by_msg.get(msg)
        psn = psnw & PSN_MASK
        if (f is None or self.cfg.transport != "uet"
                or offset != (psn * self.cfg.payload_bytes) & OFFSET_MASK):
            return False
        rx = f.rx or self._receiver(f, now)
        f.last_ns = now
        action = rx.on_trimmed(psn)
        if action != NO_ACTION:
            self._send_ack(f, rx, action, now)
        return True

    def _hold(self, now: int) -> None:
        """Move every queued datagram into the delay line, stamped with its arrival."""
        first = self.rx.hold_all(self.line)
        if first is not None:
            self.timer_lag_ns.append(now - first - self.rx_allowance_ns)

    def _send_ack(self, f: RecvFlow, rx, action: int, now: int) -> None:
        syndrome, psn, base, bitmap = rx.ack_fields(action)
        ent = f.entropy
        sport = ent.port(now)
        k = sport % len(f.ports) if len(f.ports) > 1 else 0
        patch = f.acks[k]
        patch(psn & PSN_MASK, sport, syndrome, f.msg & MSN_MASK, base, bitmap)
        port = f.ports[k]
        port.push(patch.buf, now, f.path_ns)

    def _send_cnp(self, f: RecvFlow, now: int) -> None:
        """A CNP to the QP of `f`'s sender (its rate limit passed: CnpGate)."""
        sport = f.entropy.port(now)
        k = sport % len(f.ports) if len(f.ports) > 1 else 0
        buf, patch = f.cnps[k]
        patch(0, sport)
        f.ports[k].push(buf, now, f.path_ns)
        self.cnps_sent += 1
        self.timer_due = True       # the gate's interval ends: a held CNP may go then

    def _pump(self, now: int) -> bool:
        """Send data, one packet per active flow per round; True if the budget ran out."""
        active = self.plan.active
        self.pace_ns = None
        if not active:
            return False
        clock = now_ns
        payload = self.cfg.payload_bytes
        every = self.cfg.ack_every
        budget = self.pump_batch
        offset_mask = OFFSET_MASK
        while True:
            sent = 0
            last = None
            for f in active:
                ports = f.ports
                if ports[0].blocked or (len(ports) > 1 and any_blocked(ports)):
                    continue
                cc = f.cc
                if cc is not None and cc.active and cc.next_ns > now:   # DCQCN paces it
                    if self.pace_ns is None or cc.next_ns < self.pace_ns:
                        self.pace_ns = cc.next_ns
                    continue
                tx = f.tx
                psn = tx.take(now)
                if psn < 0:
                    continue
                ent = f.entropy
                sport = ent.fixed if ent.fixed is not None else ent.port(clock())
                k = sport % len(ports) if len(ports) > 1 else 0
                slots = f.slots[k]
                if psn == 0:
                    buf, patch = slots[0]
                elif psn == f.npackets - 1:
                    buf, patch = slots[3]
                elif (psn + 1) % every == 0:
                    buf, patch = slots[2]
                else:
                    buf, patch = slots[1]
                patch.write(psn, sport, clock(), f.msg, (psn * payload) & offset_mask)
                last = ports[k]
                last.push(buf, now, f.path_ns)
                if cc is not None:
                    cc.on_sent(now, len(buf))
                if ent.flowlet:
                    ent.on_wire_until(last.wire_until(len(buf)))
                sent += 1
            budget -= sent
            if not sent:
                return False
            if budget <= 0:   # flows could still send: the ports wait on the agent now
                for f in active:
                    for p in used_ports(f):
                        if not p.blocked:
                            p.waiting(clock(), ready=f.tx.ready())
                return True

    def _timers(self, now: int) -> int:
        """Fire due retransmission and delayed-ACK timers; return when to look again."""
        nxt = now + TIMER_IDLE_NS
        plan = self.plan
        for f in plan.active:
            f.tx.on_timer(now)
            d = f.tx.deadline_ns()
            if d is not None and d < nxt:
                nxt = d
        for cc in plan.cc_by_qpn.values():
            d = cc.tick(now)
            if d is not None and d < nxt:
                nxt = d
        due, nxt = held_cnps(plan.gates.values(), now, nxt)   # CNPs held to an interval's end
        for gate in due:
            self._send_cnp(gate.flow, now)
        delay = self.params.ack_delay_ns
        if any(f.rx.complete for f in plan.receiving):
            plan.receiving = [f for f in plan.receiving if not f.rx.complete]
        for f in plan.receiving:
            rx = f.rx
            if rx.since_ack:
                due = f.last_ns + delay
                if now >= due:
                    self._send_ack(f, rx, rx.delayed_ack(), now)
                elif due < nxt:
                    nxt = due
        return nxt

    # -- the loop: traffic.host drives it, for one agent or many in one process ---------
    def begin(self, now: int) -> None:
        """The workload starts at `now` (the same instant for every agent of a run)."""
        self.started_ns = self.timer_ns = self.wake_ns = now
        self.deadline_ns = now + int(self.cfg.timeout_s * 1e9)
        self.linger_until = None
        self.wait_socks = []
        self.plan.advance(now)

    def turn(self) -> int | None:
        """Handle what arrived, fire due timers, send what may go; return when to be
        called again at the latest (now: it has more to send; it is also called as soon
        as its socket has data or a blocked port has room), or None once it is done.
        Raises TimeoutError past its `timeout_s`."""
        got = self._drain_rx()
        now = now_ns()
        plan, ports = self.plan, self.port_list
        linger_until = self.linger_until
        if plan.done_ns is not None:
            if linger_until is None:
                self.wakeups_until_done = self.wakeups
                self.done_cpu_s, self.done_wall_ns = cpu_seconds(), now
            if linger_until is None or got:
                linger_until = self.linger_until = max(linger_until or 0,
                                                       now + self.cfg.linger_ns)
            if now >= linger_until and not any_pending(ports) and not (
                    self.line and self.line.held):
                return None
        if now >= self.deadline_ns:
            raise TimeoutError(plan.missing(self.cfg.timeout_s))
        if self.timer_due:      # a CNP: its QP's timers start now
            self.timer_due = False
            self.timer_ns = now
        # ACKs first (see the docstring), unless reading has held timers up too long
        if now >= self.timer_ns and (self.rx_empty or now >= self.timer_ns + TIMER_MAX_NS):
            self.timer_ns = self._timers(now)
        retry = [p for p in ports if p.retry_ns]
        for p in retry:
            if now >= p.retry_ns:
                p.flush(now)
        if plan.wake_ns is not None and now >= plan.wake_ns:    # a computation ended
            plan.advance(now)
        more = self._pump(now)
        if plan.active:     # a flow that just began sending runs its RTO from now
            due = now + self.params.rto_ns
            if due < self.timer_ns:
                self.timer_ns = due
        # ports the socket buffer refused (not a full queue: those retry on a timer)
        self.wait_socks = [p.sock for p in ports if p.blocked and not p.retry_ns]
        if more:
            return now          # the send budget ran out: receive, then send more
        wake = min(self.timer_ns, self.deadline_ns, linger_until or self.deadline_ns)
        if self.pace_ns is not None and self.pace_ns < wake:
            wake = self.pace_ns
        if plan.wake_ns is not None and plan.wake_ns < wake:
            wake = plan.wake_ns
        due = self.line.next_due() if self.line else None
        if due is not None and due < wake:
            wake = due
        for p in retry:
            if p.retry_ns and p.retry_ns < wake:
                wake = p.retry_ns
        return wake

    def leave(self, now: int) -> None:
        """The loop stops serving this agent until `wake_ns` or traffic: from `now` on,
        frames its ports hold wait on the emulator, not the network."""
        for p in self.port_list:
            if p.pending:
                p.waiting(now)

    def writable(self, socks: set, now: int) -> None:
        """Send what blocked ports hold, those among `socks` (select found room)."""
        for p in self.port_list:
            if p.sock in socks:
                p.flush(now)

    # -- results -----------------------------------------------------------------------
    def results(self, error: str | None) -> dict:
        """What it did (traffic.host adds its share of the process's CPU)."""
        cfg, plan = self.cfg, self.plan
        with self.inside():
            udp_after = udp_counters()
            drops = self.rx.drops() if self.rx is not None else None
        return {
            "node": cfg.node, "ok": error is None, "error": error,
            "transport": cfg.transport, "entropy": cfg.entropy,
            "iterations": plan.iterations() if plan else [],     # completed ones, in order
            "iterations_started": sum(s is not None for s in plan.iter_start) if plan else 0,
            "steps": plan.step_records() if plan else [],     # a job's: traffic.job
            "flows": ([f.results() for f in plan.sends] + [f.results() for f in plan.recvs]
                      if plan else []),
            "latency_ns": self.latency,
            "started_ns": self.started_ns or None,
            "start_late_ns": (max(0, self.started_ns - cfg.start_at_ns)
                              if self.started_ns and cfg.start_at_ns else None),
            "done_ns": plan.done_ns if plan else None,
            "ports": {p.name: p.counters() for p in self.ports.values()},
            "wakeups": self.wakeups, "wakeups_until_done": self.wakeups_until_done,
            "turns": self.turns,
            "coalesce_us": cfg.coalesce_ns / 1000,
            "latency_clock": ("kernel receive timestamp" if self.rx is None
                              or self.rx.kernel_stamps else "agent read time"),
            "unknown_packets": self.unknown_packets, "bad_packets": self.bad_packets,
            # host-side drops (this namespace's UDP receive buffers), never fabric loss
            "udp_rcvbuf_errors": (udp_after.get("RcvbufErrors", 0)
                                  - self.udp_before.get("RcvbufErrors", 0)),
            "rx_socket_drops": drops,
            "fidelity": self.fidelity(),
            # congestion control (None: off): DCQCN's CE marks and CNPs both ways and each
            # QP's rate (traffic.cc), or NSCC's windows per peer (traffic.nscc)
            "cc": None if cfg.cc == "none" or plan is None else (
                nscc_results(plan.sends, self.ce_packets, cfg.nscc) if cfg.cc == "nscc"
                else dcqcn_results(plan.sends, plan.gates, self.ce_packets, self.cnps_sent,
                                   self.cnps_received, self.cnps_unknown)),
        }

    def fidelity(self) -> dict:
        """What this agent measured of its own pace (testbed.fidelity grades it): wire
        time its ports were starved of frames it held (in all, and step by step), their
        busy time, how late its timed wake-ups came and how long a step took to start
        once the datagram that opened its gate had arrived (us)."""
        if self.started_ns and self._step_mark[0] is not None:   # the last step's
            self._mark_step(None)
        lags = list(self.timer_lag_ns)
        if self.host_lags is not None:
            lags += self.host_lags[:self.host_lags_end][-LAG_SAMPLES_MAX:]
        step = max(1, len(lags) // LAG_SAMPLES_REPORTED)
        ports = self.ports.values()
        return {"starved_ns": int(sum(p.starved_ns for p in ports)),
                "busy_ns": int(sum(p.busy_ns for p in ports)),
                "timer_lag_us": [round(max(0, x) / 1e3, 1) for x in lags[::step]],
                "timer_lag_samples": len(lags),
                "step_lag_us": [[k, round(max(0, x) / 1e3, 1)] for k, x in self.step_lag_ns],
                "step_starved_us": [[k, round(x / 1e3, 1)] for k, x in self.step_starved_ns
                                    if x]}
